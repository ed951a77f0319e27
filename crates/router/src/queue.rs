//! Requests over a model's `max_requests_per_replica` wait at the router,
//! in arrival order, for a ready replica with room, rather than in one
//! engine's queue. What waits in an engine stays there when a new replica
//! comes up; what waits here goes to the new replica as soon as it is
//! ready, so a scale-up drains the backlog on every replica at once.
//!
//! Each model has one gate: a fair semaphore with `max_requests_per_replica`
//! places for each ready replica, resized whenever the routing table
//! changes. A request takes a place before it is sent and keeps it until
//! the client has read the whole answer. A request is never refused for
//! want of a place: past [`HOLD_FOR_ROOM`], or with more than
//! `max_held_requests` waiting, it is sent at once and queues in an engine
//! as it would without the limit. The limit is each router's own.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::service::Shared;
use crate::table::{EndpointState, RoutedModel, RoutingTable};

/// The longest a request waits for a place before it is sent anyway.
pub const HOLD_FOR_ROOM: Duration = Duration::from_secs(60);

/// Every model's gate, and how many requests wait at them now.
#[derive(Default)]
pub struct Queues {
    gates: Mutex<HashMap<String, Arc<Gate>>>,
    waiting: AtomicUsize,
}

impl Queues {
    fn gate(&self, model: &str) -> Arc<Gate> {
        let mut gates = lock(&self.gates);
        if let Some(gate) = gates.get(model) {
            return Arc::clone(gate);
        }
        let gate = Arc::new(Gate::default());
        gates.insert(model.to_owned(), Arc::clone(&gate));
        gate
    }
}

/// One model's places.
struct Gate {
    places: Arc<Semaphore>,
    size: Mutex<Size>,
}

impl Default for Gate {
    fn default() -> Self {
        Gate {
            places: Arc::new(Semaphore::new(0)),
            size: Mutex::new(Size::default()),
        }
    }
}

#[derive(Debug, Default)]
struct Size {
    /// Places that exist, free or taken.
    issued: u32,
    /// Taken places to retire when they are given back: the gate shrank
    /// below what was taken.
    owed: u32,
}

impl Gate {
    fn resize(&self, wanted: u32) {
        let mut size = lock(&self.size);
        let current = size.issued - size.owed;
        if wanted > current {
            let mut more = wanted - current;
            let repaid = more.min(size.owed);
            size.owed -= repaid;
            more -= repaid;
            if more > 0 {
                self.places.add_permits(more as usize);
                size.issued += more;
            }
        } else if wanted < current {
            let fewer = current - wanted;
            let forgotten = self.places.forget_permits(fewer as usize) as u32;
            size.issued -= forgotten;
            size.owed += fewer - forgotten;
        }
    }

    fn give_back(&self, place: OwnedSemaphorePermit) {
        let mut size = lock(&self.size);
        if size.owed > 0 {
            size.owed -= 1;
            size.issued -= 1;
            place.forget();
        }
    }
}

/// A request's place at its model's gate, given back when dropped.
pub struct Place {
    place: Option<OwnedSemaphorePermit>,
    gate: Arc<Gate>,
}

impl Drop for Place {
    fn drop(&mut self) {
        if let Some(place) = self.place.take() {
            self.gate.give_back(place);
        }
    }
}

/// Places `model` has while `table` is current: its limit for each ready
/// replica, plus the requests still on its draining ones (they hold places
/// taken while those were ready, which must not crowd out the room the
/// ready ones have). None when it sets no limit or has no ready replica
/// (then there is nothing to wait for).
fn places_in(shared: &Shared, table: &RoutingTable, model: &str) -> Option<(String, u32)> {
    let routed: &RoutedModel = table.resolve(model)?;
    let most = routed.max_requests_per_replica?;
    let ready = routed.ready_endpoints().count() as u32;
    if ready == 0 {
        return None;
    }
    let finishing: u32 = routed
        .endpoints
        .iter()
        .filter(|e| e.state == EndpointState::Draining)
        .map(|e| shared.registry.get(&e.url).outstanding())
        .sum();
    Some((routed.name.clone(), most.saturating_mul(ready) + finishing))
}

/// Waits for a place for a request naming `model`, if its model limits
/// what a replica gets. Returns the routing table to send it with (the
/// latest, which may have replicas that were not ready when it arrived)
/// and its place, none when it is sent without one.
pub(crate) async fn wait_for_room(
    shared: &Shared,
    model: &str,
    table: Arc<RoutingTable>,
) -> (Arc<RoutingTable>, Option<Place>) {
    let Some((name, places)) = places_in(shared, &table, model) else {
        return (table, None);
    };
    let gate = shared.queues.gate(&name);
    gate.resize(places);
    if let Ok(place) = Arc::clone(&gate.places).try_acquire_owned() {
        return (table, Some(taken(place, gate)));
    }
    let queues = &shared.queues;
    let waiting = queues.waiting.fetch_add(1, Ordering::Relaxed) + 1;
    let _counted = Waiting(queues);
    if waiting > shared.settings.max_held_requests {
        return (table, None);
    }
    tracing::debug!(
        model = %name,
        waiting,
        "every ready replica has its max_requests_per_replica: the request waits at the router"
    );
    shared.metrics.queued(&name);
    let started = tokio::time::Instant::now();
    let acquire = Arc::clone(&gate.places).acquire_owned();
    tokio::pin!(acquire);
    let deadline = tokio::time::sleep_until(started + HOLD_FOR_ROOM);
    tokio::pin!(deadline);
    let mut watch = shared.table.clone();
    let mut table = table;
    let place = loop {
        tokio::select! {
            place = &mut acquire => break place.ok(),
            () = &mut deadline => break None,
            changed = watch.changed() => {
                if changed.is_err() {
                    break None;
                }
                table = Arc::clone(&watch.borrow_and_update());
                match places_in(shared, &table, model) {
                    Some((_, places)) => gate.resize(places),
                    None => break None,
                }
            }
        }
    };
    shared.metrics.waited_for_room(&name, started.elapsed());
    (table, place.map(|place| taken(place, gate)))
}

fn taken(place: OwnedSemaphorePermit, gate: Arc<Gate>) -> Place {
    Place {
        place: Some(place),
        gate,
    }
}

/// Counts a request out of the waiting ones when it stops waiting.
struct Waiting<'a>(&'a Queues);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::Relaxed);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn free(gate: &Gate) -> usize {
        gate.places.available_permits()
    }

    #[test]
    fn a_gate_grows_and_shrinks_with_its_replicas_even_while_places_are_taken() {
        let gate = Arc::new(Gate::default());
        gate.resize(4);
        let taken: Vec<_> = (0..3)
            .map(|_| Arc::clone(&gate.places).try_acquire_owned().unwrap())
            .collect();
        assert_eq!(free(&gate), 1);
        // Two replicas of four places each become one: three places are
        // taken, so one is free too many until one is given back.
        gate.resize(2);
        assert_eq!(free(&gate), 0);
        let mut taken = taken.into_iter();
        gate.give_back(taken.next().unwrap());
        assert_eq!(free(&gate), 0, "a place given back is retired, not freed");
        drop(taken.next());
        gate.give_back(taken.next().unwrap());
        assert_eq!(free(&gate), 2, "back to two places, none taken");
        gate.resize(6);
        assert_eq!(free(&gate), 6);
    }

    #[test]
    fn growing_while_owed_repays_before_adding() {
        let gate = Arc::new(Gate::default());
        gate.resize(2);
        let first = Arc::clone(&gate.places).try_acquire_owned().unwrap();
        let second = Arc::clone(&gate.places).try_acquire_owned().unwrap();
        gate.resize(0);
        gate.resize(1);
        gate.give_back(first);
        assert_eq!(free(&gate), 0, "one owed place retired");
        drop(second);
        assert_eq!(free(&gate), 1);
    }
}
