//! What a run leaves behind when it is kept (`history.txt`, `fleet.txt`),
//! and the test-only forgeries that show the checks can fail.

use super::RunReport;
use crate::fleet::{self, FleetSample, Window};
use crate::history::OpRecord;
use crate::load::LeaderSample;

pub(super) fn write_fleet_history(
    dir: &std::path::Path,
    samples: &[FleetSample],
    router_ops: &[fleet::RouterOp],
    windows: &[Window],
) {
    let mut text = String::from("# fault windows\n");
    for w in windows {
        text.push_str(&format!("{w:?}\n"));
    }
    text.push_str("# router requests: peer model invoke_us complete_us result\n");
    for op in router_ops {
        text.push_str(&format!(
            "{} {} {} {} {:?}\n",
            op.peer, op.model, op.invoke_us, op.complete_us, op.result
        ));
    }
    text.push_str("# fleet samples\n");
    for s in samples {
        text.push_str(&format!("{s:?}\n"));
    }
    let _ = std::fs::write(dir.join("fleet.txt"), text);
}

pub(super) fn write_history(
    dir: &std::path::Path,
    ops: &[OpRecord],
    samples: &[LeaderSample],
    report: &RunReport,
) {
    let mut text = String::new();
    text.push_str(&format!(
        "# {} seed {} run {}\n# faults\n",
        report.scenario, report.seed, report.run_id
    ));
    for fault in &report.faults {
        text.push_str(&format!("{fault}\n"));
    }
    text.push_str("# operations: id worker peer key op invoke_us complete_us outcome\n");
    for op in ops {
        text.push_str(&format!(
            "{} {} {} {} {:?} {} {} {:?}\n",
            op.id, op.worker, op.peer, op.key, op.op, op.invoke_us, op.complete_us, op.outcome
        ));
    }
    text.push_str("# leader samples: at_us peer term leader\n");
    for s in samples {
        text.push_str(&format!(
            "{} {} {} {:?}\n",
            s.at_us, s.peer, s.term, s.leader
        ));
    }
    let _ = std::fs::write(dir.join("history.txt"), text);
}

/// The test-only forged sample: right after the newest leadership any
/// peer named, that peer names the term before it, as if its leadership
/// went back.
pub(super) fn forge(samples: &mut Vec<LeaderSample>) {
    let Some(real) = samples
        .iter()
        .filter(|s| s.leader.is_some())
        .max_by_key(|s| (s.term, s.leader, s.at_us))
        .cloned()
    else {
        return;
    };
    samples.push(LeaderSample {
        at_us: real.at_us + 1,
        answered_us: real.answered_us + 1,
        peer: real.peer,
        epoch: real.epoch,
        term: real.term.saturating_sub(1),
        leader: real.leader,
    });
}

/// The test-only forged fleet sample: a second replica claims a GPU that
/// a live shard holds, in the last sample that has one.
pub(super) fn forge_gpu(samples: &mut Vec<FleetSample>) {
    let Some(mut forged) = samples
        .iter()
        .rev()
        .find(|s| {
            s.replicas
                .iter()
                .flatten()
                .any(|r| r.shards.iter().any(|sh| sh.live() && !sh.gpus.is_empty()))
        })
        .cloned()
    else {
        return;
    };
    let replicas = forged.replicas.as_mut().expect("found with replicas");
    let victim = replicas
        .iter()
        .find(|r| r.shards.iter().any(|sh| sh.live() && !sh.gpus.is_empty()))
        .cloned()
        .expect("found with a live shard");
    // One shard on one GPU of the victim's first live shard.
    let mut twin = victim;
    twin.id = format!("{}-forged", twin.id);
    let mut shard = twin
        .shards
        .iter()
        .find(|sh| sh.live() && !sh.gpus.is_empty())
        .cloned()
        .expect("found with a live shard");
    shard.gpus.truncate(1);
    twin.shards = vec![shard];
    replicas.push(twin);
    forged.agents.clear();
    samples.push(forged);
}
