//! Launch plans for every engine and mode, against golden files.
//!
//! A changed command line is a changed contract with the engines: review the
//! diff, then regenerate with `LLMGW_UPDATE_GOLDEN=1 cargo test -p llmgw-engines`.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};

use llmgw_catalog::{Engine, LaunchMode, Profile};
use llmgw_engine_options::Version;
use llmgw_engines::{
    EnginesConfig, FabricAssignment, KvEventSockets, LaunchPlan, NodeContext, PlanError,
    SglangConfig, ShardAssignment, VllmConfig, plan_shard,
};

fn profile(engine: Engine, nodes: u32, gpus_per_node: u32, tp: u32, pp: u32) -> Profile {
    Profile {
        name: format!("p{nodes}x{gpus_per_node}"),
        engine,
        engine_version: None,
        nodes,
        gpus_per_node,
        tensor_parallel: tp,
        pipeline_parallel: pp,
        data_parallel: 1,
        min_gpu_memory_gb: 0,
        gpu_models: vec![],
        launch_mode: None,
        // Each engine's own name for the context length.
        engine_args: match engine {
            Engine::Vllm => vec!["--max-model-len".into(), "8192".into()],
            Engine::Sglang => vec!["--context-length".into(), "8192".into()],
        },
        env: BTreeMap::from([("HF_HUB_OFFLINE".to_string(), "1".to_string())]),
    }
}

fn node(launch_mode: LaunchMode, version: Version) -> NodeContext {
    NodeContext {
        mgmt_addr: "10.0.0.11".into(),
        mgmt_interface: Some("eth0".into()),
        engines: EnginesConfig {
            vllm: Some(VllmConfig {
                bin: "/opt/venvs/vllm/bin/vllm".into(),
                launch_mode,
                ray_bin: Some("/opt/venvs/vllm/bin/ray".into()),
                version,
                env: BTreeMap::new(),
            }),
            sglang: Some(SglangConfig {
                python: "/opt/venvs/sglang/bin/python".into(),
                version: Version::new(0, 5, 10),
                env: BTreeMap::new(),
            }),
        },
    }
}

fn shard(profile: Profile, rank: u32, gpus: Vec<u32>) -> ShardAssignment {
    let multi = profile.nodes > 1;
    ShardAssignment {
        shard_id: format!("r1-s{rank}"),
        replica_id: "r1".into(),
        model: "llama-3.1-70b".into(),
        aliases: vec!["llama3-70b".into()],
        source: "meta-llama/Llama-3.1-70B-Instruct".into(),
        profile,
        rank,
        gpus,
        port: 8100,
        head_addr: "10.0.0.10".into(),
        rendezvous_port: 29501,
        fabric: multi.then(|| FabricAssignment {
            name: "ib-a".into(),
            hcas: vec!["mlx5_0".into(), "mlx5_1".into()],
        }),
        // The head publishes its KV events for the routers.
        kv_events: (rank == 0).then_some(KvEventSockets {
            stream: 8101,
            replay: 8102,
        }),
        sleep_mode: false,
    }
}

fn render(plan: &LaunchPlan) -> String {
    let mut out = String::new();
    for p in &plan.processes {
        writeln!(
            out,
            "[{}]",
            serde_json::to_value(p.role).unwrap().as_str().unwrap()
        )
        .unwrap();
        writeln!(out, "argv: {}", p.command_line()).unwrap();
        for (k, v) in &p.env {
            writeln!(out, "env: {k}={v}").unwrap();
        }
    }
    writeln!(
        out,
        "readiness: {}",
        serde_json::to_string(&plan.readiness).unwrap()
    )
    .unwrap();
    writeln!(out, "port: {:?}", plan.port).unwrap();
    out
}

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

/// The engine's own parser (the option data of the configured release)
/// accepts every engine command line the adapters write.
fn check_engine_accepts(name: &str, plan: &LaunchPlan) {
    use llmgw_engine_options::{Engine as OptionsEngine, Parser, Version, newest_up_to};
    for p in plan
        .processes
        .iter()
        .filter(|p| p.role == llmgw_engines::ProcessRole::Engine)
    {
        let (engine, version, args) = match p.args.first().map(String::as_str) {
            Some("serve") => (OptionsEngine::Vllm, Version::new(0, 11, 1), &p.args[1..]),
            Some("-m") => (OptionsEngine::Sglang, Version::new(0, 5, 10), &p.args[2..]),
            other => panic!("{name}: unexpected engine command {other:?}"),
        };
        let (_, data) = newest_up_to(engine, version).expect("option data for the release");
        if let Err(e) = Parser::new(data).parse(args) {
            panic!("{name}: {engine} {version} refuses the command line:\n{e}");
        }
    }
}

fn check_golden(name: &str, plan: &LaunchPlan) {
    check_engine_accepts(name, plan);
    let path = golden_dir().join(format!("{name}.txt"));
    let actual = render(plan);
    if std::env::var_os("LLMGW_UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, &actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|_| {
        panic!(
            "{} is missing; run with LLMGW_UPDATE_GOLDEN=1",
            path.display()
        )
    });
    assert_eq!(
        actual,
        expected,
        "launch plan {name} differs from {}",
        path.display()
    );
}

const CURRENT: Version = Version::new(0, 11, 1);

#[test]
fn vllm_single_node() {
    let plan = plan_shard(
        &shard(profile(Engine::Vllm, 1, 4, 4, 1), 0, vec![4, 5, 6, 7]),
        &node(LaunchMode::Mp, CURRENT),
    )
    .unwrap();
    check_golden("vllm-single", &plan);
}

/// Sleep mode: one more flag, and the development mode that registers
/// the sleep endpoints, whatever the profile's env says.
#[test]
fn vllm_single_node_in_sleep_mode() {
    let mut profile = profile(Engine::Vllm, 1, 4, 4, 1);
    profile
        .env
        .insert("VLLM_SERVER_DEV_MODE".into(), "0".into());
    let plan = plan_shard(
        &ShardAssignment {
            sleep_mode: true,
            ..shard(profile, 0, vec![4, 5, 6, 7])
        },
        &node(LaunchMode::Mp, CURRENT),
    )
    .unwrap();
    check_golden("vllm-single-sleep", &plan);
}

#[test]
fn data_parallel_ranks_on_one_node() {
    let node = node(LaunchMode::Mp, CURRENT);
    for (engine, name) in [(Engine::Vllm, "vllm-dp2"), (Engine::Sglang, "sglang-dp2")] {
        let mut p = profile(engine, 1, 4, 2, 1);
        p.data_parallel = 2;
        check_golden(
            name,
            &plan_shard(&shard(p, 0, vec![0, 1, 2, 3]), &node).unwrap(),
        );
    }
}

#[test]
fn vllm_multi_node_mp_head_and_headless_rank() {
    let p = profile(Engine::Vllm, 2, 8, 8, 2);
    let node = node(LaunchMode::Mp, CURRENT);
    check_golden(
        "vllm-mp-rank0",
        &plan_shard(&shard(p.clone(), 0, (0..8).collect()), &node).unwrap(),
    );
    check_golden(
        "vllm-mp-rank1",
        &plan_shard(&shard(p, 1, (0..8).collect()), &node).unwrap(),
    );
}

#[test]
fn vllm_multi_node_ray_head_and_worker() {
    let p = profile(Engine::Vllm, 2, 8, 8, 2);
    let node = node(LaunchMode::Ray, Version::new(0, 11, 0));
    check_golden(
        "vllm-ray-rank0",
        &plan_shard(&shard(p.clone(), 0, (0..8).collect()), &node).unwrap(),
    );
    check_golden(
        "vllm-ray-rank1",
        &plan_shard(&shard(p, 1, (0..8).collect()), &node).unwrap(),
    );
}

#[test]
fn sglang_single_and_multi_node() {
    let node = node(LaunchMode::Mp, CURRENT);
    check_golden(
        "sglang-single",
        &plan_shard(
            &shard(profile(Engine::Sglang, 1, 2, 2, 1), 0, vec![0, 1]),
            &node,
        )
        .unwrap(),
    );
    let p = profile(Engine::Sglang, 2, 8, 16, 1);
    check_golden(
        "sglang-multi-rank0",
        &plan_shard(&shard(p.clone(), 0, (0..8).collect()), &node).unwrap(),
    );
    check_golden(
        "sglang-multi-rank1",
        &plan_shard(&shard(p, 1, (0..8).collect()), &node).unwrap(),
    );
}

#[test]
fn a_profile_override_of_launch_mode_wins() {
    let mut p = profile(Engine::Vllm, 2, 8, 8, 2);
    p.launch_mode = Some(LaunchMode::Ray);
    let plan = plan_shard(
        &shard(p, 0, (0..8).collect()),
        &node(LaunchMode::Mp, CURRENT),
    )
    .unwrap();
    assert!(
        plan.processes[1]
            .args
            .windows(2)
            .any(|w| w == ["--distributed-executor-backend", "ray"])
    );
}

#[test]
fn shards_that_cannot_work_are_refused_with_the_reason() {
    let mp_old = node(LaunchMode::Mp, Version::new(0, 11, 0));
    let multi = profile(Engine::Vllm, 2, 8, 8, 2);
    assert_eq!(
        plan_shard(&shard(multi.clone(), 0, (0..8).collect()), &mp_old).unwrap_err(),
        PlanError::MpNeedsNewerVllm(Version::new(0, 11, 0))
    );
    let current = node(LaunchMode::Mp, CURRENT);
    let err = plan_shard(&shard(multi.clone(), 0, vec![0, 1]), &current).unwrap_err();
    assert_eq!(
        err.to_string(),
        "profile `p2x8` needs 8 GPU(s) on this node, but the shard was assigned 2"
    );
    let mut no_fabric = shard(multi.clone(), 1, (0..8).collect());
    no_fabric.fabric = None;
    assert_eq!(
        plan_shard(&no_fabric, &current).unwrap_err(),
        PlanError::NoFabric
    );
    assert!(matches!(
        plan_shard(&shard(multi, 2, (0..8).collect()), &current).unwrap_err(),
        PlanError::RankOutOfRange { rank: 2, nodes: 2 }
    ));
    let mut managed = profile(Engine::Vllm, 1, 1, 1, 1);
    managed.engine_args = vec!["--port=9".into()];
    assert!(matches!(
        plan_shard(&shard(managed, 0, vec![0]), &current).unwrap_err(),
        PlanError::ManagedFlag { flag: "--port", .. }
    ));
    let mut no_sglang = current.clone();
    no_sglang.engines.sglang = None;
    assert_eq!(
        plan_shard(
            &shard(profile(Engine::Sglang, 1, 1, 1, 1), 0, vec![0]),
            &no_sglang
        )
        .unwrap_err()
        .to_string(),
        "this node has no `engines.sglang` section in agent.yaml, so it cannot run a sglang profile"
    );
}
