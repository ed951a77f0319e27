//! Builders of evidence for the invariants' unit tests.

use std::collections::BTreeMap;

use super::{Checked, NOT_ENOUGH_EVIDENCE};
use crate::fleet::{FleetSample, Subject, Window};
use crate::load::LeaderSample;

/// A leader sample answered the moment it was asked.
pub(crate) fn at(at_us: u64, peer: u64, term: u64, leader: Option<u64>) -> LeaderSample {
    LeaderSample {
        at_us,
        answered_us: at_us,
        peer,
        epoch: 0,
        term,
        leader,
    }
}

pub(crate) fn replica(id: &str, node: &str, gpus: &[u32], state: &str) -> crate::fleet::ReplicaObs {
    crate::fleet::ReplicaObs {
        id: id.into(),
        model: "qwen".into(),
        state: state.into(),
        replaces: None,
        shards: vec![crate::fleet::ShardObs {
            node: node.into(),
            gpus: gpus.to_vec(),
            state: state.into(),
        }],
    }
}

pub(crate) fn window(subject: Subject, from_us: u64, to_us: u64) -> Window {
    Window {
        subject,
        from_us,
        to_us: Some(to_us),
        data_plane: false,
    }
}

pub(crate) fn fleet(
    at_us: u64,
    replicas: Vec<crate::fleet::ReplicaObs>,
    agents: Vec<(&str, Vec<&str>)>,
) -> FleetSample {
    FleetSample {
        at_us,
        peer: Some(1),
        replicas: Some(replicas),
        nodes: Some(BTreeMap::from([
            ("n1".to_owned(), ("ready".to_owned(), false)),
            ("n2".to_owned(), ("ready".to_owned(), false)),
        ])),
        agents: agents
            .into_iter()
            .map(|(node, shards)| crate::fleet::AgentObs {
                node: node.into(),
                leader_term: 1,
                shards: shards
                    .into_iter()
                    .map(|id| crate::fleet::AgentShard {
                        shard_id: id.into(),
                        term: 1,
                        gpus: vec![0],
                        pgids: vec![],
                    })
                    .collect(),
            })
            .collect(),
    }
}

/// The shortfalls of evidence a check reported.
pub(crate) fn shortfalls(checked: &Checked) -> Vec<&str> {
    checked
        .violations
        .iter()
        .filter(|v| v.starts_with(NOT_ENOUGH_EVIDENCE))
        .map(String::as_str)
        .collect()
}

/// The violations a check found in its evidence, without its shortfalls
/// of evidence: for tests whose fabricated evidence is thin on purpose.
pub(crate) fn found(checked: &Checked) -> Vec<&str> {
    checked
        .violations
        .iter()
        .filter(|v| !v.starts_with(NOT_ENOUGH_EVIDENCE))
        .map(String::as_str)
        .collect()
}
