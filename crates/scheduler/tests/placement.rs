//! Placement on small hand-built fleets, and properties over random ones.

use std::collections::{BTreeMap, BTreeSet};

use llmgw_catalog::{Engine, Profile};
use llmgw_scheduler::{
    GpuView, LinkKind, LinkView, NodeHealth, NodeView, Placement, Placer, Request, Siblings,
    Strategy as Packing, best_gpu_set, place,
};
use proptest::prelude::*;

fn profile(name: &str, nodes: u32, gpus_per_node: u32) -> Profile {
    Profile {
        name: name.into(),
        engine: Engine::Vllm,
        engine_version: None,
        nodes,
        gpus_per_node,
        tensor_parallel: nodes * gpus_per_node,
        pipeline_parallel: 1,
        data_parallel: 1,
        min_gpu_memory_gb: 0,
        gpu_models: vec![],
        launch_mode: None,
        engine_args: vec![],
        env: BTreeMap::new(),
    }
}

/// An 8-GPU NVSwitch node (`nvswitch`) or a 4-GPU PCIe node whose GPUs pair
/// up over NVLink bridges (0-1, 2-3).
fn node(id: &str, gpus: u32, nvswitch: bool, fabrics: &[&str]) -> NodeView {
    let mut links = Vec::new();
    for a in 0..gpus {
        for b in a + 1..gpus {
            let paired = a / 2 == b / 2;
            let (kind, nvlinks) = match (nvswitch, paired) {
                (true, _) => (LinkKind::Nvlink, 18),
                (false, true) => (LinkKind::Nvlink, 4),
                (false, false) => (LinkKind::Sys, 0),
            };
            links.push(LinkView {
                a,
                b,
                kind,
                nvlinks,
            });
        }
    }
    NodeView {
        id: id.into(),
        health: NodeHealth::Ready,
        cordoned: false,
        draining: false,
        labels: BTreeMap::new(),
        gpus: (0..gpus)
            .map(|index| GpuView {
                index,
                name: "NVIDIA H100 80GB HBM3".into(),
                memory_mib: 81559,
                free: true,
            })
            .collect(),
        links,
        fabrics: fabrics.iter().map(|f| f.to_string()).collect(),
    }
}

fn request<'a>(profiles: &'a [Profile]) -> Request<'a> {
    Request {
        model: "llama-70b",
        profiles,
        siblings: Siblings::default(),
        avoid: BTreeSet::new(),
        strategy: Packing::Spread,
    }
}

fn occupy(fleet: &mut [NodeView], placement: &Placement) {
    for shard in &placement.shards {
        let node = fleet.iter_mut().find(|n| n.id == shard.node).unwrap();
        for g in &shard.gpus {
            let gpu = node.gpus.iter_mut().find(|x| x.index == *g).unwrap();
            assert!(gpu.free, "GPU {g} of {} assigned twice", node.id);
            gpu.free = false;
        }
    }
}

#[test]
fn inside_a_node_nvlink_pairs_beat_pcie() {
    let n = node("pcie", 4, false, &[]);
    assert_eq!(best_gpu_set(&n, &[0, 1, 2, 3], 2), vec![0, 1]);
    assert_eq!(
        best_gpu_set(&n, &[1, 2, 3], 2),
        vec![2, 3],
        "the remaining bridged pair"
    );
}

#[test]
fn the_nomad_style_explanation_counts_every_node() {
    let mut fleet = vec![
        node("a", 8, true, &["ib-a"]),
        node("b", 8, true, &["ib-b"]),
        node("c", 8, true, &["ib-a"]),
        node("d", 8, true, &["ib-a"]),
        node("e", 4, false, &[]),
    ];
    fleet[2].health = NodeHealth::Unreachable;
    fleet[3].draining = true;
    fleet[3].cordoned = true;
    for g in fleet[0].gpus.iter_mut().take(4) {
        g.free = false;
    }
    let profiles = [profile("tp8x2", 2, 8)];
    let err = place(&fleet, &request(&profiles)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "0/5 nodes fit llama-70b profile tp8x2: 1 unreachable, 1 draining, 1 on no fabric, \
         1 have 4 free GPUs (need 8), no fabric has 2 nodes with 8 free GPUs (ib-b: 1)"
    );
    let p = &err.profiles[0];
    assert_eq!(p.accounted_nodes(), p.nodes_evaluated);
}

#[test]
fn profiles_are_tried_in_order_and_multi_node_stays_on_one_fabric() {
    let fleet = vec![
        node("a", 8, true, &["ib-a"]),
        node("b", 8, true, &["ib-b"]),
        node("c", 8, true, &["ib-b"]),
    ];
    let profiles = [profile("tp16", 1, 16), profile("tp8x2", 2, 8)];
    let placement = place(&fleet, &request(&profiles)).unwrap();
    assert_eq!(placement.profile, "tp8x2");
    assert_eq!(placement.fabric.as_deref(), Some("ib-b"));
    let nodes: Vec<&str> = placement.shards.iter().map(|s| s.node.as_str()).collect();
    assert_eq!(nodes, ["b", "c"]);
    assert_eq!(placement.shards[1].rank, 1);
}

#[test]
fn replicas_of_a_model_spread_across_racks() {
    let mut fleet = vec![
        node("a", 8, true, &[]),
        node("b", 8, true, &[]),
        node("c", 8, true, &[]),
    ];
    fleet[0].labels.insert("rack".into(), "r1".into());
    fleet[1].labels.insert("rack".into(), "r1".into());
    fleet[2].labels.insert("rack".into(), "r2".into());
    let profiles = [profile("tp1", 1, 1)];
    let mut req = request(&profiles);
    let first = place(&fleet, &req).unwrap();
    assert_eq!(first.shards[0].node, "a");
    req.siblings.add(&fleet[0]);
    let second = place(&fleet, &req).unwrap();
    assert_eq!(
        second.shards[0].node, "c",
        "another rack before another node in the same rack"
    );
}

#[test]
fn binpack_fills_a_node_before_opening_another() {
    let mut fleet = vec![node("a", 8, true, &[]), node("b", 8, true, &[])];
    fleet[1].gpus[0].free = false;
    let profiles = [profile("tp1", 1, 1)];
    let mut req = request(&profiles);
    req.strategy = Packing::Binpack;
    assert_eq!(place(&fleet, &req).unwrap().shards[0].node, "b");
    req.strategy = Packing::Spread;
    assert_eq!(place(&fleet, &req).unwrap().shards[0].node, "a");
}

#[test]
fn gpu_model_and_memory_requirements_are_reasons() {
    let fleet = vec![node("a", 8, true, &[])];
    let mut p = profile("tp1", 1, 1);
    p.gpu_models = vec!["A100".into()];
    let err = place(&fleet, &request(std::slice::from_ref(&p))).unwrap_err();
    assert!(
        err.to_string().ends_with("1 have no allowed GPU model"),
        "{err}"
    );
    p.gpu_models = vec!["H100".into()];
    p.min_gpu_memory_gb = 141;
    let err = place(&fleet, &request(std::slice::from_ref(&p))).unwrap_err();
    assert!(
        err.to_string().ends_with("1 have GPUs under 141 GB"),
        "{err}"
    );
    p.min_gpu_memory_gb = 80;
    assert!(
        place(&fleet, &request(std::slice::from_ref(&p))).is_ok(),
        "an 80GB H100 reports 81559 MiB"
    );
}

#[test]
fn an_avoided_node_is_used_only_when_nothing_else_fits() {
    let fleet = vec![node("a", 8, true, &[]), node("b", 8, true, &[])];
    let profiles = [profile("tp8", 1, 8)];
    let mut req = request(&profiles);
    req.avoid.insert("a".into());
    assert_eq!(place(&fleet, &req).unwrap().shards[0].node, "b");
    req.avoid.insert("b".into());
    assert!(place(&fleet, &req).is_ok());
}

fn arb_node(i: usize) -> impl Strategy<Value = NodeView> {
    (
        prop_oneof![Just(4u32), Just(8u32)],
        any::<bool>(),
        prop::option::of(prop_oneof![Just("ib-a"), Just("ib-b")]),
        0u8..10,
        prop::collection::vec(any::<bool>(), 8),
    )
        .prop_map(move |(gpus, nvswitch, fabric, health, used)| {
            let mut n = node(&format!("n{i:02}"), gpus, nvswitch, fabric.as_slice());
            n.health = match health {
                0 => NodeHealth::Unreachable,
                1 => NodeHealth::Lost,
                _ => NodeHealth::Ready,
            };
            n.cordoned = health == 2;
            for (g, u) in n.gpus.iter_mut().zip(used) {
                g.free = !u;
            }
            n
        })
}

fn arb_fleet() -> impl Strategy<Value = Vec<NodeView>> {
    (1usize..10).prop_flat_map(|n| (0..n).map(arb_node).collect::<Vec<_>>())
}

fn arb_profiles() -> impl Strategy<Value = Vec<Profile>> {
    prop::collection::vec(
        prop_oneof![
            Just(profile("tp1", 1, 1)),
            Just(profile("tp2", 1, 2)),
            Just(profile("tp4", 1, 4)),
            Just(profile("tp8", 1, 8)),
            Just(profile("tp4x2", 2, 4)),
            Just(profile("tp8x2", 2, 8)),
        ],
        1..3,
    )
}

proptest! {
    #[test]
    fn no_gpu_is_ever_assigned_twice_and_multi_node_stays_on_one_fabric(
        mut fleet in arb_fleet(),
        profiles in arb_profiles(),
        replicas in 1usize..6,
    ) {
        for _ in 0..replicas {
            let Ok(p) = place(&fleet, &request(&profiles)) else { break };
            let profile = profiles.iter().find(|x| x.name == p.profile).unwrap();
            prop_assert_eq!(p.shards.len(), profile.nodes as usize);
            let nodes: BTreeSet<&str> = p.shards.iter().map(|s| s.node.as_str()).collect();
            prop_assert_eq!(nodes.len(), p.shards.len(), "a replica's shards are on distinct nodes");
            for s in &p.shards {
                prop_assert_eq!(s.gpus.len(), profile.gpus_per_node as usize);
                let n = fleet.iter().find(|n| n.id == s.node).unwrap();
                prop_assert_eq!(n.health, NodeHealth::Ready);
                if profile.nodes > 1 {
                    let fabric = p.fabric.as_ref().unwrap();
                    prop_assert!(n.fabrics.contains(fabric), "{} is not on {}", n.id, fabric);
                }
            }
            occupy(&mut fleet, &p);
        }
    }

    #[test]
    fn explanation_counts_add_up_to_the_nodes_evaluated(fleet in arb_fleet(), profiles in arb_profiles()) {
        if let Err(explanation) = place(&fleet, &request(&profiles)) {
            for p in &explanation.profiles {
                prop_assert_eq!(p.nodes_evaluated as usize, fleet.len());
                prop_assert_eq!(p.accounted_nodes(), p.nodes_evaluated);
            }
        }
    }

    #[test]
    fn the_same_input_gives_the_same_placement(fleet in arb_fleet(), profiles in arb_profiles()) {
        let first = place(&fleet, &request(&profiles));
        let mut reversed = fleet.clone();
        reversed.reverse();
        let again = place(&fleet, &request(&profiles));
        prop_assert_eq!(&first, &again);
        // The order nodes are listed in does not matter either.
        let shuffled = place(&reversed, &request(&profiles));
        prop_assert_eq!(first.ok().map(|p| p.shards), shuffled.ok().map(|p| p.shards));
    }

    /// The incremental placer is exact: after any sequence of placements of
    /// several models (with and without avoided nodes), it answers what
    /// `place` answers on the fleet with those placements applied,
    /// explanations and their counts included.
    #[test]
    fn a_placer_answers_exactly_as_place_on_the_updated_fleet(
        fleet in arb_racked_fleet(),
        models in prop::collection::vec(arb_profiles(), 1..4),
        steps in prop::collection::vec((0usize..3, prop::collection::vec(0usize..10, 0..3)), 1..16),
        binpack in any::<bool>(),
    ) {
        let strategy = if binpack { Packing::Binpack } else { Packing::Spread };
        let names = ["alpha", "beta", "gamma"];
        let mut now = fleet.clone();
        let mut siblings: Vec<Siblings> = vec![Siblings::default(); models.len()];
        let mut placer = Placer::new(fleet);
        for (model, avoid) in steps {
            let model = model % models.len();
            let request = Request {
                model: names[model],
                profiles: &models[model],
                siblings: siblings[model].clone(),
                avoid: avoid.iter().filter_map(|i| now.get(*i)).map(|n| n.id.clone()).collect(),
                strategy,
            };
            let expected = place(&now, &request);
            prop_assert_eq!(&placer.place(&request), &expected);
            if let Ok(placement) = expected {
                placer.commit(names[model], &placement);
                occupy(&mut now, &placement);
                for shard in &placement.shards {
                    let node = now.iter().find(|n| n.id == shard.node).unwrap();
                    siblings[model].add(node);
                }
            }
        }
    }
}

/// A random fleet whose nodes sit in up to three racks, or none.
fn arb_racked_fleet() -> impl Strategy<Value = Vec<NodeView>> {
    (arb_fleet(), prop::collection::vec(0u8..4, 10)).prop_map(|(mut fleet, racks)| {
        for (node, rack) in fleet.iter_mut().zip(racks) {
            if rack > 0 {
                node.labels.insert("rack".into(), format!("r{rack}"));
            }
        }
        fleet
    })
}
