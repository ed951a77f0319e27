//! Placement: a pure, deterministic function of the fleet and a request.

use std::cmp::Reverse;
use std::collections::BTreeMap;

use llmgw_catalog::Profile;

use crate::explain::{Explanation, FabricShortfall, ProfileExplanation, Reason};
use llmgw_topology::LinkKind;

use crate::fleet::{NodeHealth, NodeView, Placement, Request, ShardPlacement, Strategy};

/// Places one replica: the first profile that fits wins. When none fits,
/// the explanation says, per profile, why each node was passed over.
///
/// Nodes the request avoids (repeated failures) are skipped while anything
/// else fits; a replica is better retried on the same node than left pending.
pub fn place(fleet: &[NodeView], request: &Request<'_>) -> Result<Placement, Explanation> {
    match place_once(fleet, request, true) {
        Ok(p) => Ok(p),
        Err(_) if !request.avoid.is_empty() => place_once(fleet, request, false),
        Err(e) => Err(e),
    }
}

fn place_once(
    fleet: &[NodeView],
    request: &Request<'_>,
    honour_avoid: bool,
) -> Result<Placement, Explanation> {
    let mut profiles = Vec::new();
    for profile in request.profiles {
        match place_profile(fleet, request, profile, honour_avoid) {
            Ok(placement) => return Ok(placement),
            Err(why) => profiles.push(why),
        }
    }
    Err(Explanation { profiles })
}

/// A node that can host one shard, with how many GPUs it could use.
struct Candidate<'f> {
    node: &'f NodeView,
    free: u32,
}

fn place_profile(
    fleet: &[NodeView],
    request: &Request<'_>,
    profile: &Profile,
    honour_avoid: bool,
) -> Result<Placement, ProfileExplanation> {
    let mut reasons: BTreeMap<Reason, u32> = BTreeMap::new();
    let mut candidates = Vec::new();
    for node in fleet {
        let avoided = honour_avoid && request.avoid.contains(&node.id);
        match evaluate(node, profile, avoided) {
            Ok(free) => candidates.push(Candidate { node, free }),
            Err(reason) => *reasons.entry(reason).or_default() += 1,
        }
    }
    let nodes_fit = candidates.len() as u32;
    let explanation = |fabric_shortfall| ProfileExplanation {
        model: request.model.to_string(),
        profile: profile.name.clone(),
        nodes_evaluated: fleet.len() as u32,
        nodes_fit,
        reasons: reasons.clone(),
        fabric_shortfall,
    };

    if !profile.is_multi_node() {
        // One pass for the best node: a fleet of thousands is not sorted
        // for every single-node replica.
        let Some((_, best)) = candidates
            .iter()
            .map(|c| (order_key(c, request), c))
            .min_by(|(ka, a), (kb, b)| ka.cmp(kb).then_with(|| a.node.id.cmp(&b.node.id)))
        else {
            return Err(explanation(None));
        };
        return Ok(placement(profile, None, [best.node]));
    }

    candidates.sort_by(|a, b| node_order(a, b, request));
    // Every node of a multi-node replica on one fabric.
    let mut by_fabric: BTreeMap<&str, Vec<&Candidate<'_>>> = BTreeMap::new();
    for c in &candidates {
        for fabric in &c.node.fabrics {
            let on_fabric = by_fabric.entry(fabric.as_str()).or_default();
            // A fabric listed twice on one node still counts the node once.
            if !on_fabric.last().is_some_and(|last| std::ptr::eq(*last, c)) {
                on_fabric.push(c);
            }
        }
    }
    let sizes = by_fabric.iter().map(|(f, nodes)| (*f, nodes.len()));
    let Some(fabric) = choose_fabric(sizes, profile, request.strategy) else {
        let sizes = by_fabric.iter().map(|(f, nodes)| (*f, nodes.len()));
        return Err(explanation(Some(fabric_shortfall(profile, sizes))));
    };
    let nodes = by_fabric[fabric].iter().map(|c| c.node);
    Ok(placement(
        profile,
        Some(fabric),
        nodes.take(profile.nodes as usize),
    ))
}

/// The fabric a multi-node replica goes to, out of (fabric, nodes that
/// could host a shard): spread takes the roomiest, binpack the tightest
/// that fits; ties go to the first name.
pub(crate) fn choose_fabric<'a>(
    sizes: impl Iterator<Item = (&'a str, usize)>,
    profile: &Profile,
    strategy: Strategy,
) -> Option<&'a str> {
    sizes
        .filter(|(_, nodes)| *nodes >= profile.nodes as usize)
        .min_by_key(|(name, nodes)| match strategy {
            Strategy::Spread => (usize::MAX - nodes, *name),
            Strategy::Binpack => (*nodes, *name),
        })
        .map(|(name, _)| name)
}

pub(crate) fn fabric_shortfall<'a>(
    profile: &Profile,
    sizes: impl Iterator<Item = (&'a str, usize)>,
) -> FabricShortfall {
    FabricShortfall {
        nodes_needed: profile.nodes,
        gpus_per_node: profile.gpus_per_node,
        fitting_nodes_by_fabric: sizes.map(|(f, n)| (f.to_owned(), n as u32)).collect(),
    }
}

/// The replica on `nodes`, rank 0 first, each with its best-connected GPUs.
pub(crate) fn placement<'n>(
    profile: &Profile,
    fabric: Option<&str>,
    nodes: impl IntoIterator<Item = &'n NodeView>,
) -> Placement {
    let shards = nodes
        .into_iter()
        .enumerate()
        .map(|(rank, node)| ShardPlacement {
            node: node.id.clone(),
            rank: rank as u32,
            gpus: best_gpu_set(
                node,
                &eligible_gpus(node, profile),
                profile.gpus_per_node as usize,
            ),
        })
        .collect();
    Placement {
        profile: profile.name.clone(),
        fabric: fabric.map(str::to_owned),
        shards,
    }
}

/// The first reason a node cannot host a shard of `profile`, or how many
/// of its GPUs it could use. `avoided`: the request avoids this node.
///
/// Runs for every node of the fleet for every profile tried, so it makes
/// one pass over the GPUs and allocates nothing.
pub(crate) fn evaluate(node: &NodeView, profile: &Profile, avoided: bool) -> Result<u32, Reason> {
    match node.health {
        NodeHealth::Lost => return Err(Reason::Lost),
        NodeHealth::Unreachable => return Err(Reason::Unreachable),
        NodeHealth::Ready => {}
    }
    if node.draining {
        return Err(Reason::Draining);
    }
    if node.cordoned {
        return Err(Reason::Cordoned);
    }
    if profile.is_multi_node() && node.fabrics.is_empty() {
        return Err(Reason::NoFabric);
    }
    if avoided {
        return Err(Reason::Avoided);
    }
    let min_mib = min_gpu_mib(profile);
    let (mut any_allowed, mut any_big, mut free) = (false, false, 0u32);
    for gpu in &node.gpus {
        if !profile.accepts_gpu_model(&gpu.name) {
            continue;
        }
        any_allowed = true;
        if !big_enough(gpu.memory_mib, min_mib) {
            continue;
        }
        any_big = true;
        if gpu.free {
            free += 1;
        }
    }
    if !any_allowed {
        return Err(Reason::WrongGpuModel);
    }
    if !any_big {
        return Err(Reason::GpuMemoryTooSmall {
            need_gb: profile.min_gpu_memory_gb,
        });
    }
    if free < profile.gpus_per_node {
        return Err(Reason::NotEnoughFreeGpus {
            free,
            need: profile.gpus_per_node,
        });
    }
    Ok(free)
}

/// The free GPUs of a node that `profile` could use.
pub(crate) fn eligible_gpus(node: &NodeView, profile: &Profile) -> Vec<u32> {
    let min_mib = min_gpu_mib(profile);
    node.gpus
        .iter()
        .filter(|g| g.free && profile.accepts_gpu_model(&g.name))
        .filter(|g| big_enough(g.memory_mib, min_mib))
        .map(|g| g.index)
        .collect()
}

fn min_gpu_mib(profile: &Profile) -> u64 {
    u64::from(profile.min_gpu_memory_gb) * 1000 * 1000 * 1000 / (1024 * 1024)
}

/// Vendors quote GPU memory in decimal GB; NVML reports MiB a little under
/// the label (81559 MiB for an "80GB" H100), so allow 5% slack.
fn big_enough(memory_mib: u64, min_mib: u64) -> bool {
    memory_mib * 100 >= min_mib * 95
}

/// What makes a node a better home, smaller first: fewer replicas of the
/// model on it, then in its rack, then room as the strategy wants it.
fn order_key(c: &Candidate<'_>, request: &Request<'_>) -> (u32, u32, u32) {
    let on_node = request.siblings.nodes.get(&c.node.id).copied().unwrap_or(0);
    let in_rack = c
        .node
        .rack()
        .and_then(|r| request.siblings.racks.get(r))
        .copied()
        .unwrap_or(0);
    (on_node, in_rack, room(c.free, request.strategy))
}

/// Free GPUs as the strategy ranks them, smaller first: spread prefers
/// the roomiest node, binpack the fullest.
pub(crate) fn room(free: u32, strategy: Strategy) -> u32 {
    match strategy {
        Strategy::Spread => u32::MAX - free,
        Strategy::Binpack => free,
    }
}

fn node_order(a: &Candidate<'_>, b: &Candidate<'_>, request: &Request<'_>) -> std::cmp::Ordering {
    order_key(a, request)
        .cmp(&order_key(b, request))
        .then_with(|| a.node.id.cmp(&b.node.id))
}

/// Above this many subsets the choice is made greedily.
const MAX_SUBSETS: u64 = 20_000;

/// The best-connected `k` GPUs out of `eligible`: all-NVLink sets first,
/// then the set whose worst path is best, then the most NVLinks; ties go to
/// the lowest indices so the choice is deterministic.
pub fn best_gpu_set(node: &NodeView, eligible: &[u32], k: usize) -> Vec<u32> {
    if k >= eligible.len() {
        return eligible.to_vec();
    }
    let score = |set: &[u32]| {
        let mut non_nvlink = 0u32;
        let mut worst = LinkKind::Nvlink;
        let mut nvlinks = 0u32;
        for (i, a) in set.iter().enumerate() {
            for b in &set[i + 1..] {
                let (kind, n) = node.link(*a, *b);
                if kind != LinkKind::Nvlink {
                    non_nvlink += 1;
                }
                worst = worst.max(kind);
                nvlinks += n;
            }
        }
        (non_nvlink, worst, Reverse(nvlinks))
    };
    if binomial(eligible.len() as u64, k as u64) <= MAX_SUBSETS {
        let mut best: Option<(_, Vec<u32>)> = None;
        for_each_subset(eligible, k, &mut |set| {
            let s = score(set);
            if best.as_ref().is_none_or(|(b, _)| s < *b) {
                best = Some((s, set.to_vec()));
            }
        });
        return best.map(|(_, set)| set).unwrap_or_default();
    }
    // Greedy: grow from each seed by the best-connected next GPU.
    let mut best: Option<(_, Vec<u32>)> = None;
    for &seed in eligible {
        let mut set = vec![seed];
        while set.len() < k {
            let next = eligible
                .iter()
                .filter(|g| !set.contains(g))
                .min_by_key(|g| {
                    let mut trial = set.clone();
                    trial.push(**g);
                    (score(&trial), **g)
                })
                .copied();
            set.extend(next);
        }
        set.sort_unstable();
        let s = score(&set);
        if best.as_ref().is_none_or(|(b, _)| s < *b) {
            best = Some((s, set));
        }
    }
    best.map(|(_, set)| set).unwrap_or_default()
}

fn binomial(n: u64, k: u64) -> u64 {
    let k = k.min(n - k);
    (0..k).fold(1u64, |acc, i| acc.saturating_mul(n - i) / (i + 1))
}

/// Calls `f` with every `k`-subset of `items`, in lexicographic order.
fn for_each_subset(items: &[u32], k: usize, f: &mut impl FnMut(&[u32])) {
    fn go(
        items: &[u32],
        k: usize,
        start: usize,
        current: &mut Vec<u32>,
        f: &mut impl FnMut(&[u32]),
    ) {
        if current.len() == k {
            f(current);
            return;
        }
        for i in start..items.len() {
            if items.len() - i < k - current.len() {
                break;
            }
            current.push(items[i]);
            go(items, k, i + 1, current, f);
            current.pop();
        }
    }
    go(items, k, 0, &mut Vec::with_capacity(k), f);
}
