//! Every surface that takes bytes from outside, as one function of bytes.
//! Each must return without panicking for any input, and the state
//! machine must also stay deterministic. `fuzz/fuzz_targets/` wraps each
//! for libFuzzer (`cargo fuzz run NAME`); `tests/smoke.rs` runs each over
//! its corpus in `fuzz/corpus/NAME/` and a bounded number of seeded
//! mutations in the normal test run. See docs/security.md.

use std::time::Duration;

use llmgw_config::FileKind;
use llmgw_engine_sim::{Engine, Persona};
use llmgw_proto::agent::AgentMessage;
use llmgw_proto::agent::agent_message::Body as Up;
use llmgw_state::{Command, FleetState, Leadership};
use prost::Message;

/// One fuzz target: takes any bytes, never panics.
pub type Target = fn(&[u8]);

/// The targets by name, as `cargo fuzz` knows them.
pub const TARGETS: &[(&str, Target)] = &[
    ("yaml", yaml),
    ("config_check", config_check),
    ("catalog_model", catalog_model),
    ("router_request", router_request),
    ("client_requests", client_requests),
    ("engine_answer", engine_answer),
    ("agent_message", agent_message),
    ("state_apply", state_apply),
    ("engine_sim_args", engine_sim_args),
];

/// The YAML decoder under every config file and API body.
pub fn yaml(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = llmgw_yaml::parse(text);
    }
}

/// `llmgw config check` of each file kind; the first byte picks the kind
/// (or detection from content).
pub fn config_check(data: &[u8]) {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let kind = FileKind::ALL.get(usize::from(pick % 5)).copied();
    let _ = llmgw_config::check_text("fuzz.yaml", text, kind);
}

/// One catalog entry as `PUT /api/v1/models/{name}` takes it.
pub fn catalog_model(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = llmgw_catalog::parse_model("PUT /api/v1/models/fuzz", text);
    }
}

/// The router's request handling up to the upstream call: the body peek,
/// the model lookup (names and aliases) and the affinity prefix.
pub fn router_request(data: &[u8]) {
    let table = llmgw_router::static_table(&router_catalog());
    match llmgw_router::peek(data) {
        Ok(peeked) => {
            let _ = table.resolve(&peeked.model);
            if let Some(prompt) = peeked.prompt {
                for limit in [0, 1, 7, 256] {
                    let _ = llmgw_router::prefix(prompt, limit);
                }
            }
        }
        Err(error) => {
            let _ = error.to_string();
        }
    }
}

/// An engine's answer as the router reads it: the response head, then the
/// body as a resumable event stream (framing, the transcript kept for
/// resumption, continuation events rewritten for the client).
pub fn engine_answer(data: &[u8]) {
    llmgw_router::fuzzing::engine_answer(data);
}

/// What clients send on one connection (the first byte picks the length
/// of each read): request heads and bodies as the router's server side
/// takes them; the requests must not depend on how the reads split.
pub fn client_requests(data: &[u8]) {
    llmgw_router::fuzzing::client_requests(data);
}

fn router_catalog() -> llmgw_catalog::Catalog {
    let text = "models:\n  - name: m\n    aliases: [a]\n    endpoints: [\"http://127.0.0.1:9\"]\n";
    llmgw_catalog::parse_catalog("fuzz-models.yaml", text).expect("the fuzz catalog is valid")
}

/// A message on the agent stream, decoded and converted as the leader
/// converts it.
pub fn agent_message(data: &[u8]) {
    let Ok(message) = AgentMessage::decode(data) else {
        return;
    };
    match message.body {
        Some(Up::Register(register)) => {
            let _ = llmgw_agent_wire::node_facts(&register);
        }
        Some(Up::ShardStatus(status)) => {
            let _ = llmgw_agent_wire::shard_state(status.state);
            let _ = llmgw_agent_wire::failure(&status, status.at_unix_ms);
        }
        _ => {}
    }
}

/// The state machine's apply of arbitrary commands (JSON, as in the Raft
/// log): it never panics, and two replicas applying the same entries
/// reach the same state.
pub fn state_apply(data: &[u8]) {
    let Ok(commands) = serde_json::from_slice::<Vec<Command>>(data) else {
        return;
    };
    let mut one = FleetState::default();
    let mut two = FleetState::default();
    for (i, command) in commands.iter().enumerate() {
        let by = Leadership {
            term: (i as u64) % 3,
            leader: 1 + (i as u64) % 2,
        };
        let a = one.apply_entry(by, command);
        let b = two.apply_entry(by, command);
        assert_eq!(a, b, "the same command applied differently");
    }
    assert_eq!(one.hash(), two.hash(), "replicas diverged");
}

/// The engine simulator's argument parsers (vLLM's and SGLang's flags):
/// arguments separated by NUL bytes.
pub fn engine_sim_args(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let args: Vec<String> = text.split('\0').map(str::to_owned).collect();
    let _ = llmgw_engine_sim::engine_cli::parse(Persona::current(Engine::Vllm), &args);
    let _ = llmgw_engine_sim::engine_cli::parse(Persona::current(Engine::Sglang), &args);
    let _ = llmgw_engine_sim::knobs::parse_duration(text);
}

/// How long the smoke test spends on seeded mutations per target.
pub const SMOKE_BUDGET: Duration = Duration::from_secs(3);
