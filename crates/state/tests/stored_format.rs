//! The stored format: log entries, snapshots and backups written by an
//! older build load, apply, encode and hash exactly as they did. The
//! fixtures were written by that build (see fixtures/stored-v1/README.md).

use llmgw_state::{Command, FleetState, LinkKind, Outcome};

const V1: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/stored-v1");

fn read(name: &str) -> String {
    std::fs::read_to_string(format!("{V1}/{name}")).unwrap_or_else(|e| panic!("{V1}/{name}: {e}"))
}

fn commands() -> Vec<(String, Command)> {
    read("commands.jsonl")
        .lines()
        .map(|line| {
            let command: Command =
                serde_json::from_str(line).unwrap_or_else(|e| panic!("{line}: {e}"));
            (line.to_owned(), command)
        })
        .collect()
}

#[test]
fn every_stored_command_decodes_and_encodes_to_the_same_bytes() {
    for (line, command) in commands() {
        assert!(!matches!(command, Command::Unknown), "unknown: {line}");
        assert_eq!(serde_json::to_string(&command).unwrap(), line);
    }
}

#[test]
fn the_stored_log_applies_to_the_stored_state_and_hash() {
    let mut fleet = FleetState::default();
    for (line, command) in commands() {
        assert_eq!(fleet.apply(&command), Outcome::Applied, "{line}");
    }
    assert_eq!(serde_json::to_string(&fleet).unwrap(), read("fleet.json"));
    assert_eq!(fleet.hash().to_string(), read("fleet.hash").trim());
}

#[test]
fn a_stored_snapshot_loads_typed_and_keeps_its_bytes_and_hash() {
    let stored = read("fleet.json");
    let fleet: FleetState = serde_json::from_str(&stored).expect("the v1 snapshot loads");
    assert_eq!(serde_json::to_string(&fleet).unwrap(), stored);
    assert_eq!(fleet.hash().to_string(), read("fleet.hash").trim());

    let llama = fleet.models["llama"].spec.model().expect("llama reads");
    assert_eq!(llama.aliases, ["llama-3", "chat"]);
    assert_eq!(llama.managed().expect("managed").profiles.len(), 2);
    let partner = fleet.models["partner"].spec.model().expect("partner reads");
    assert_eq!(partner.static_endpoints(), ["http://10.1.2.3:8000/v1"]);

    let kinds: Vec<LinkKind> = fleet.nodes["gpu-b"]
        .inventory
        .links
        .iter()
        .map(|link| link.kind)
        .collect();
    use LinkKind::*;
    assert_eq!(kinds, [Pix, Pxb, Phb, Node, Sys, Sys]);
}
