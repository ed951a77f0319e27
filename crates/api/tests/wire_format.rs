//! The admin API's JSON, pinned: every fixture in `tests/fixtures` decodes
//! into its type and encodes back to the same document, so a field renamed,
//! retyped or dropped on either side fails here before a client of another
//! version meets it.

use std::collections::BTreeSet;

use llmgw_api::keys::{IssuedKey, KeyRequest, KeyView};
use llmgw_api::usage::{UsageDay, UsageReport};
use llmgw_api::{
    AddPeer, BackupSummary, ClusterView, DrainQuery, ErrorBody, Model, ModelExplanation, ModelLoad,
    NodeRecord, NodeView, PeerAdded, PeerRemoved, Readiness, ReplicaView, RolloutView, StateEvent,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");

/// Reads the named fixture and panics with what no longer matches.
type Check = fn(&str);

/// Each fixture with the check that reads it.
const CHECKS: &[(&str, Check)] = &[
    ("cluster.json", round_trips::<ClusterView>),
    ("add-peer.json", round_trips::<AddPeer>),
    ("peer-added.json", round_trips::<PeerAdded>),
    ("peer-removed.json", round_trips::<PeerRemoved>),
    ("nodes.json", round_trips::<Vec<NodeView>>),
    ("node.json", round_trips::<NodeView>),
    ("node-record.json", round_trips::<NodeRecord>),
    ("drain-query.json", round_trips::<DrainQuery>),
    ("replicas.json", round_trips::<Vec<ReplicaView>>),
    ("models.json", round_trips::<Vec<Model>>),
    ("model-explanation.json", round_trips::<ModelExplanation>),
    ("rollout.json", round_trips::<RolloutView>),
    ("model-load.json", round_trips::<ModelLoad>),
    ("readiness.json", round_trips::<Readiness>),
    ("readiness-no-leader.json", round_trips::<Readiness>),
    ("state-event.json", round_trips::<StateEvent>),
    ("error.json", round_trips::<ErrorBody>),
    ("backup.json", summarizes::<BackupSummary>),
    ("keys.json", round_trips::<Vec<KeyView>>),
    ("usage-report.json", round_trips::<UsageReport>),
    ("usage.json", round_trips::<Vec<UsageDay>>),
    ("key-request.json", round_trips::<KeyRequest>),
    ("issued-key.json", round_trips::<IssuedKey>),
];

fn fixture(name: &str) -> Value {
    let path = format!("{FIXTURES}/{name}");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path} is not JSON: {e}"))
}

fn decode<T: DeserializeOwned>(name: &str, document: &Value) -> T {
    T::deserialize(document).unwrap_or_else(|e| {
        panic!(
            "{name} no longer decodes into {}: {e}",
            std::any::type_name::<T>()
        )
    })
}

fn encode<T: Serialize>(value: &T) -> Value {
    serde_json::to_value(value).expect("admin API views encode as JSON")
}

/// The whole document is the type's: decoding and encoding keeps it as it is.
fn round_trips<T: DeserializeOwned + Serialize>(name: &str) {
    let document = fixture(name);
    let encoded = encode(&decode::<T>(name, &document));
    assert_eq!(
        encoded, document,
        "{name}: encoding what was decoded changed the document"
    );
}

/// The type reads part of the document: what it encodes is found in the
/// document unchanged.
fn summarizes<T: DeserializeOwned + Serialize>(name: &str) {
    let document = fixture(name);
    let encoded = encode(&decode::<T>(name, &document));
    assert_found_in(&encoded, &document, name);
}

fn assert_found_in(part: &Value, whole: &Value, at: &str) {
    match (part, whole) {
        (Value::Object(part), Value::Object(whole)) => {
            for (key, value) in part {
                let at = format!("{at}.{key}");
                let found = whole
                    .get(key)
                    .unwrap_or_else(|| panic!("{at} is encoded but not in the document"));
                assert_found_in(value, found, &at);
            }
        }
        _ => assert_eq!(part, whole, "{at} differs from the document"),
    }
}

#[test]
fn every_fixture_decodes_and_encodes_to_the_same_json() {
    for (name, check) in CHECKS {
        check(name);
    }
}

#[test]
fn every_fixture_has_a_check() {
    let on_disk: BTreeSet<String> = std::fs::read_dir(FIXTURES)
        .expect("the fixtures directory")
        .map(|entry| entry.expect("a directory entry").file_name())
        .filter_map(|name| name.into_string().ok())
        .filter(|name| name.ends_with(".json"))
        .collect();
    let checked: BTreeSet<String> = CHECKS.iter().map(|(name, _)| name.to_string()).collect();
    assert_eq!(on_disk, checked);
}

#[test]
fn a_renamed_field_is_caught() {
    let mut document = fixture("state-event.json");
    let term = document["term"].take();
    let object = document.as_object_mut().expect("an object");
    object.remove("term");
    object.insert("current_term".into(), term);
    assert!(serde_json::from_value::<StateEvent>(document.clone()).is_err());

    let mut document = fixture("cluster.json");
    let object = document.as_object_mut().expect("an object");
    let leader = object.remove("leader_id").expect("leader_id");
    object.insert("leader".into(), leader);
    let encoded = encode(&decode::<ClusterView>("cluster.json", &document));
    assert_ne!(
        encoded, document,
        "an optional field renamed reads as absent"
    );
}
