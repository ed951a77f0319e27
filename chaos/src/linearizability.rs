//! A Wing–Gong linearizability checker (with the Lowe cache of visited
//! configurations) for register histories.
//!
//! Each model name the load touches is one register: `PUT` writes a value,
//! `DELETE` clears it (and answers "not found" when it was clear), a
//! consistent `GET` reads it. Registers are independent, so each key's
//! history is checked on its own (P-compositionality), which keeps the search
//! small.
//!
//! An operation whose outcome is unknown (timed out, connection dropped after
//! the request left, a 5xx that may follow an append) may have taken effect at
//! any point after its invocation, or never: its response is placed after
//! every other event and any result is accepted for it. Linearizing it at the
//! very end is the same as "it never happened", since nothing observes it. An
//! unknown read constrains nothing and is left out.

use std::collections::{BTreeMap, HashSet};

/// What the client asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegOp {
    Write(String),
    Delete,
    Read,
}

/// What the client was told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegRet {
    /// The write or delete was applied.
    Ok,
    /// The delete found the register empty.
    NotFound,
    /// A read's answer.
    Value(Option<String>),
    /// No answer that says whether it happened.
    Unknown,
}

/// One operation on one register, with its invocation and completion
/// times in any monotonic unit (the harness uses microseconds since the run
/// started). `complete` is ignored for unknown outcomes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegEvent {
    /// Identifies the operation in reports (the harness's op number).
    pub id: u64,
    pub key: String,
    pub op: RegOp,
    pub ret: RegRet,
    pub invoke: u64,
    pub complete: u64,
}

/// A key whose history has no linearization.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub key: String,
    pub message: String,
}

/// The verdict on a whole history.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Verdict {
    pub keys_checked: usize,
    pub ops_checked: usize,
    pub violations: Vec<Violation>,
    /// Keys whose search ran past the state budget, with no verdict.
    pub inconclusive: Vec<String>,
}

/// Visited configurations allowed per key before the search gives up.
pub const STATE_BUDGET: usize = 2_000_000;

/// Checks every key's history.
pub fn check(events: &[RegEvent]) -> Verdict {
    let mut by_key: BTreeMap<&str, Vec<&RegEvent>> = BTreeMap::new();
    for event in events {
        if event.op == RegOp::Read && event.ret == RegRet::Unknown {
            continue;
        }
        by_key.entry(event.key.as_str()).or_default().push(event);
    }
    let mut verdict = Verdict::default();
    for (key, ops) in by_key {
        verdict.keys_checked += 1;
        verdict.ops_checked += ops.len();
        match check_key(&ops, STATE_BUDGET) {
            KeyVerdict::Linearizable => {}
            KeyVerdict::Not(message) => verdict.violations.push(Violation {
                key: key.to_owned(),
                message,
            }),
            KeyVerdict::Inconclusive => verdict.inconclusive.push(key.to_owned()),
        }
    }
    verdict
}

enum KeyVerdict {
    Linearizable,
    Not(String),
    Inconclusive,
}

type State = Option<String>;

/// The register's sequential specification: the state after `op` answered
/// `ret` in `state`, or `None` when that answer is impossible there.
fn step(state: &State, op: &RegOp, ret: &RegRet) -> Option<State> {
    match (op, ret) {
        (RegOp::Write(value), RegRet::Ok | RegRet::Unknown) => Some(Some(value.clone())),
        (RegOp::Delete, RegRet::Ok) => state.is_some().then_some(None),
        (RegOp::Delete, RegRet::NotFound) => state.is_none().then_some(None),
        (RegOp::Delete, RegRet::Unknown) => Some(None),
        (RegOp::Read, RegRet::Value(seen)) => (seen == state).then(|| state.clone()),
        _ => None,
    }
}

const NIL: usize = usize::MAX;

/// One call or return event in the doubly linked event list.
struct Node {
    op: usize,
    is_call: bool,
    /// For a call: its return node.
    partner: usize,
    prev: usize,
    next: usize,
}

struct EventList {
    nodes: Vec<Node>,
}

impl EventList {
    const HEAD: usize = 0;

    fn first(&self) -> usize {
        self.nodes[Self::HEAD].next
    }

    fn unlink(&mut self, n: usize) {
        let (prev, next) = (self.nodes[n].prev, self.nodes[n].next);
        self.nodes[prev].next = next;
        if next != NIL {
            self.nodes[next].prev = prev;
        }
    }

    fn relink(&mut self, n: usize) {
        let (prev, next) = (self.nodes[n].prev, self.nodes[n].next);
        self.nodes[prev].next = n;
        if next != NIL {
            self.nodes[next].prev = n;
        }
    }

    /// Takes a call and its return out of the list.
    fn lift(&mut self, call: usize) {
        let ret = self.nodes[call].partner;
        self.unlink(call);
        self.unlink(ret);
    }

    /// Undoes the last `lift` of `call` (lifts are undone in reverse order).
    fn unlift(&mut self, call: usize) {
        let ret = self.nodes[call].partner;
        self.relink(ret);
        self.relink(call);
    }
}

fn describe(event: &RegEvent) -> String {
    let op = match &event.op {
        RegOp::Write(v) => format!("write {v}"),
        RegOp::Delete => "delete".to_owned(),
        RegOp::Read => "read".to_owned(),
    };
    let ret = match &event.ret {
        RegRet::Ok => "ok".to_owned(),
        RegRet::NotFound => "not found".to_owned(),
        RegRet::Value(Some(v)) => format!("saw {v}"),
        RegRet::Value(None) => "saw nothing".to_owned(),
        RegRet::Unknown => "unknown".to_owned(),
    };
    let complete = if event.ret == RegRet::Unknown {
        "?".to_owned()
    } else {
        event.complete.to_string()
    };
    format!(
        "op {} ({op} -> {ret}, {}..{complete})",
        event.id, event.invoke
    )
}

impl EventList {
    /// Every call and response of `ops` in time order, each call linked to
    /// its response. At equal times calls come first, which makes the
    /// operations concurrent: the permissive reading.
    fn in_time_order(ops: &[&RegEvent]) -> Self {
        let last = ops
            .iter()
            .map(|e| e.complete.max(e.invoke))
            .max()
            .unwrap_or(0);
        let mut events: Vec<(u64, bool, usize)> = Vec::with_capacity(ops.len() * 2);
        for (i, event) in ops.iter().enumerate() {
            events.push((event.invoke, true, i));
            let complete = if event.ret == RegRet::Unknown {
                // After every definite event.
                last.saturating_add(1)
            } else {
                event.complete.max(event.invoke)
            };
            events.push((complete, false, i));
        }
        events.sort_by_key(|&(time, is_call, op)| (time, !is_call, op));

        let mut list = EventList {
            nodes: Vec::with_capacity(events.len() + 1),
        };
        list.nodes.push(Node {
            op: usize::MAX,
            is_call: false,
            partner: NIL,
            prev: NIL,
            next: NIL,
        });
        let mut call_node = vec![NIL; ops.len()];
        for (time_order, &(_, is_call, op)) in events.iter().enumerate() {
            let n = time_order + 1;
            list.nodes.push(Node {
                op,
                is_call,
                partner: NIL,
                prev: n - 1,
                next: if time_order + 1 < events.len() {
                    n + 1
                } else {
                    NIL
                },
            });
            if is_call {
                call_node[op] = n;
            } else {
                list.nodes[call_node[op]].partner = n;
            }
        }
        list.nodes[EventList::HEAD].next = if events.is_empty() { NIL } else { 1 };
        list
    }
}

fn check_key(ops: &[&RegEvent], budget: usize) -> KeyVerdict {
    let mut list = EventList::in_time_order(ops);
    let words = ops.len().div_ceil(64);
    let mut linearized = vec![0u64; words];
    let mut state: State = None;
    let mut cache: HashSet<(Vec<u64>, State)> = HashSet::new();
    let mut stack: Vec<(usize, State)> = Vec::new();
    let mut deepest = 0usize;
    let mut blocked_at = None;
    let mut entry = list.first();
    while list.first() != NIL {
        let node = &list.nodes[entry];
        let op = node.op;
        if node.is_call {
            if let Some(next_state) = step(&state, &ops[op].op, &ops[op].ret) {
                let mut next_linearized = linearized.clone();
                next_linearized[op / 64] |= 1 << (op % 64);
                if cache.insert((next_linearized.clone(), next_state.clone())) {
                    if cache.len() > budget {
                        return KeyVerdict::Inconclusive;
                    }
                    stack.push((entry, std::mem::replace(&mut state, next_state)));
                    linearized = next_linearized;
                    list.lift(entry);
                    if stack.len() > deepest {
                        deepest = stack.len();
                        blocked_at = None;
                    }
                    entry = list.first();
                    continue;
                }
            }
            entry = list.nodes[entry].next;
        } else {
            // The response of an operation not yet linearized: every way
            // of ordering the calls before it has been tried.
            if stack.len() == deepest && blocked_at.is_none() {
                blocked_at = Some((op, state.clone()));
            }
            let Some((call, previous)) = stack.pop() else {
                let (op, state) = blocked_at.unwrap_or((op, None));
                return KeyVerdict::Not(format!(
                    "no order of the {} operations matches what clients saw; at most {deepest} \
                     can be ordered, and then {} cannot take effect (register holds {})",
                    ops.len(),
                    describe(ops[op]),
                    state.as_deref().unwrap_or("nothing"),
                ));
            };
            let undone = list.nodes[call].op;
            linearized[undone / 64] &= !(1 << (undone % 64));
            state = previous;
            list.unlift(call);
            entry = list.nodes[call].next;
        }
    }
    KeyVerdict::Linearizable
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(id: u64, op: RegOp, ret: RegRet, invoke: u64, complete: u64) -> RegEvent {
        RegEvent {
            id,
            key: "k".into(),
            op,
            ret,
            invoke,
            complete,
        }
    }

    fn w(v: &str) -> RegOp {
        RegOp::Write(v.into())
    }

    fn saw(v: Option<&str>) -> RegRet {
        RegRet::Value(v.map(str::to_owned))
    }

    #[test]
    fn a_sequential_history_is_linearizable() {
        let h = vec![
            ev(1, RegOp::Read, saw(None), 0, 1),
            ev(2, w("a"), RegRet::Ok, 2, 3),
            ev(3, RegOp::Read, saw(Some("a")), 4, 5),
            ev(4, RegOp::Delete, RegRet::Ok, 6, 7),
            ev(5, RegOp::Delete, RegRet::NotFound, 8, 9),
            ev(6, RegOp::Read, saw(None), 10, 11),
        ];
        let verdict = check(&h);
        assert_eq!(verdict.violations, vec![]);
        assert_eq!(verdict.ops_checked, 6);
    }

    #[test]
    fn concurrent_writes_may_be_seen_in_either_order() {
        // Two overlapping writes; later reads agree on b then stay on b.
        let h = vec![
            ev(1, w("a"), RegRet::Ok, 0, 10),
            ev(2, w("b"), RegRet::Ok, 1, 9),
            ev(3, RegOp::Read, saw(Some("a")), 2, 3),
            ev(4, RegOp::Read, saw(Some("a")), 11, 12),
        ];
        assert!(check(&h).violations.is_empty());
    }

    #[test]
    fn a_stale_read_after_an_acknowledged_write_is_rejected() {
        let h = vec![
            ev(1, w("a"), RegRet::Ok, 0, 1),
            ev(2, w("b"), RegRet::Ok, 2, 3),
            ev(3, RegOp::Read, saw(Some("a")), 4, 5),
        ];
        let verdict = check(&h);
        assert_eq!(verdict.violations.len(), 1, "{verdict:?}");
        assert_eq!(verdict.violations[0].key, "k");
        assert!(
            verdict.violations[0].message.contains("op 3"),
            "{}",
            verdict.violations[0].message
        );
    }

    #[test]
    fn reads_that_flip_back_are_rejected() {
        // Both writes overlap everything, but once a reader saw b, a later
        // reader cannot see a again (a and b written once each).
        let h = vec![
            ev(1, w("a"), RegRet::Ok, 0, 100),
            ev(2, w("b"), RegRet::Ok, 0, 100),
            ev(3, RegOp::Read, saw(Some("a")), 10, 11),
            ev(4, RegOp::Read, saw(Some("b")), 12, 13),
            ev(5, RegOp::Read, saw(Some("a")), 14, 15),
        ];
        assert_eq!(check(&h).violations.len(), 1);
    }

    #[test]
    fn an_acknowledged_write_that_vanished_is_rejected() {
        let h = vec![
            ev(1, w("a"), RegRet::Ok, 0, 1),
            ev(2, RegOp::Read, saw(None), 2, 3),
        ];
        assert_eq!(check(&h).violations.len(), 1);
    }

    #[test]
    fn a_delete_that_found_nothing_after_a_write_is_rejected() {
        // What a write applied twice, or a lost write, looks like.
        let h = vec![
            ev(1, w("a"), RegRet::Ok, 0, 1),
            ev(2, RegOp::Delete, RegRet::NotFound, 2, 3),
        ];
        assert_eq!(check(&h).violations.len(), 1);
    }

    #[test]
    fn an_unknown_write_may_take_effect_late_or_never() {
        let late = vec![
            ev(1, w("a"), RegRet::Ok, 0, 1),
            ev(2, w("b"), RegRet::Unknown, 2, 3),
            ev(3, RegOp::Read, saw(Some("a")), 4, 5),
            ev(4, RegOp::Read, saw(Some("b")), 50, 51),
        ];
        assert!(check(&late).violations.is_empty());
        let never = vec![
            ev(1, w("a"), RegRet::Ok, 0, 1),
            ev(2, w("b"), RegRet::Unknown, 2, 3),
            ev(3, RegOp::Read, saw(Some("a")), 50, 51),
        ];
        assert!(check(&never).violations.is_empty());
    }

    #[test]
    fn an_unknown_write_cannot_take_effect_before_it_was_sent() {
        let h = vec![
            ev(1, w("a"), RegRet::Ok, 0, 1),
            ev(2, RegOp::Read, saw(Some("b")), 2, 3),
            ev(3, w("b"), RegRet::Unknown, 10, 11),
        ];
        assert_eq!(check(&h).violations.len(), 1);
    }

    #[test]
    fn unknown_reads_are_left_out_and_keys_are_independent() {
        let mut h = vec![
            ev(1, w("a"), RegRet::Ok, 0, 1),
            ev(2, RegOp::Read, RegRet::Unknown, 2, 3),
        ];
        let mut other = ev(3, w("x"), RegRet::Ok, 0, 1);
        other.key = "other".into();
        h.push(other);
        let mut other_read = ev(4, RegOp::Read, saw(None), 5, 6);
        other_read.key = "other".into();
        h.push(other_read);
        let verdict = check(&h);
        assert_eq!(verdict.keys_checked, 2);
        assert_eq!(verdict.ops_checked, 3);
        assert_eq!(verdict.violations.len(), 1);
        assert_eq!(verdict.violations[0].key, "other");
    }

    #[test]
    fn many_concurrent_operations_are_decided_quickly() {
        // 6 clients, 300 operations, every window overlapping its
        // neighbours: a history the search must not blow up on.
        let mut h = Vec::new();
        let mut value = None::<String>;
        for i in 0..300u64 {
            let t = i * 10;
            let op = match i % 3 {
                0 => {
                    value = Some(format!("v{i}"));
                    ev(i, w(&format!("v{i}")), RegRet::Ok, t, t + 25)
                }
                1 => ev(i, RegOp::Read, RegRet::Value(value.clone()), t + 20, t + 30),
                _ => ev(i, w(&format!("u{i}")), RegRet::Unknown, t, t + 5),
            };
            h.push(op);
        }
        let verdict = check(&h);
        assert!(verdict.inconclusive.is_empty());
        assert!(verdict.violations.is_empty(), "{verdict:?}");
    }
}
