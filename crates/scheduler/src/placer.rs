//! Many placements on one fleet, each seeing the ones before it, in time
//! that grows with what a placement changed rather than with the fleet.
//!
//! [`place`](crate::place) evaluates every node for every replica: 2,000
//! replicas on 5,000 nodes are ten million evaluations. A [`Placer`]
//! evaluates each node once per (model, profile) and keeps the nodes that
//! fit ordered by the same key `place` uses; committing a placement
//! re-evaluates only the nodes whose GPUs it took and re-keys the nodes of
//! their racks. Its answers, explanations included, are exactly those of
//! `place` on the fleet with every committed placement applied: the
//! property tests compare the two on random fleets.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use llmgw_catalog::Profile;

use crate::explain::{Explanation, FabricShortfall, ProfileExplanation, Reason};
use crate::fleet::{NodeView, Placement, Request, Strategy};
use crate::place::{choose_fabric, evaluate, fabric_shortfall, placement, room};

/// A node's place in a candidate order, smaller first: replicas of the
/// model on the node, then in its rack, then room by strategy, then the
/// node id (as its rank in id order).
type Key = (u32, u32, u32, u32);

/// A replica's fabric (multi-node only) and its nodes, rank 0 first.
type Chosen<'a> = (Option<&'a str>, Vec<usize>);

/// Places replicas one after another; see the module documentation.
pub struct Placer {
    nodes: Vec<NodeView>,
    by_id: HashMap<String, usize>,
    /// Node index -> its rank in node id order, and back.
    id_rank: Vec<u32>,
    by_rank: Vec<usize>,
    rack_of: Vec<Option<usize>>,
    rack_index: HashMap<String, usize>,
    rack_members: Vec<Vec<usize>>,
    models: HashMap<String, ModelIndex>,
}

/// Where one model's replicas are, and its candidate orders.
struct ModelIndex {
    on_node: Vec<u32>,
    in_rack: Vec<u32>,
    profiles: Vec<ProfileIndex>,
}

/// Every node evaluated for one profile of one model.
struct ProfileIndex {
    profile: Profile,
    strategy: Strategy,
    /// The nodes passed over as avoided; `None` when avoidance is off.
    avoid: Option<BTreeSet<String>>,
    /// Per node: free GPUs it could use, or why it cannot host a shard.
    outcome: Vec<Result<u32, Reason>>,
    /// Per node that fits: its key in `fit` and in its fabrics' sets.
    keys: Vec<Option<Key>>,
    reasons: BTreeMap<Reason, u32>,
    fit: BTreeSet<Key>,
    /// Multi-node profiles: the fitting nodes of each fabric.
    by_fabric: BTreeMap<String, BTreeSet<Key>>,
}

impl Placer {
    pub fn new(nodes: Vec<NodeView>) -> Placer {
        let by_id: HashMap<String, usize> = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.id.clone(), i))
            .collect();
        let mut by_rank: Vec<usize> = (0..nodes.len()).collect();
        by_rank.sort_by(|a, b| nodes[*a].id.cmp(&nodes[*b].id));
        let mut id_rank = vec![0; nodes.len()];
        for (rank, node) in by_rank.iter().enumerate() {
            id_rank[*node] = rank as u32;
        }
        let mut rack_index = HashMap::new();
        let mut rack_members: Vec<Vec<usize>> = Vec::new();
        let rack_of = nodes
            .iter()
            .enumerate()
            .map(|(i, node)| {
                let rack = node.rack()?;
                let index = *rack_index.entry(rack.to_owned()).or_insert_with(|| {
                    rack_members.push(Vec::new());
                    rack_members.len() - 1
                });
                rack_members[index].push(i);
                Some(index)
            })
            .collect();
        Placer {
            nodes,
            by_id,
            id_rank,
            by_rank,
            rack_of,
            rack_index,
            rack_members,
            models: HashMap::new(),
        }
    }

    /// The fleet as it stands after the placements committed so far.
    pub fn node(&self, id: &str) -> Option<&NodeView> {
        self.by_id.get(id).map(|i| &self.nodes[*i])
    }

    /// Whether the placer already counts `model`'s replicas itself (from
    /// the siblings of its first request and every commit since).
    pub fn tracks(&self, model: &str) -> bool {
        self.models.contains_key(model)
    }

    /// What [`place`](crate::place) answers for `request` on the fleet
    /// with every committed placement applied. `request.siblings` is read
    /// the first time a model is seen; after that the placer counts them.
    pub fn place(&mut self, request: &Request<'_>) -> Result<Placement, Explanation> {
        match self.place_once(request, true) {
            Ok(p) => Ok(p),
            Err(_) if !request.avoid.is_empty() => self.place_once(request, false),
            Err(e) => Err(e),
        }
    }

    /// Takes the placement's GPUs and counts it as a replica of `model`.
    pub fn commit(&mut self, model: &str, placement: &Placement) {
        for shard in &placement.shards {
            let Some(&node) = self.by_id.get(&shard.node) else {
                continue;
            };
            for gpu in self.nodes[node]
                .gpus
                .iter_mut()
                .filter(|g| shard.gpus.contains(&g.index))
            {
                gpu.free = false;
            }
            let rack = self.rack_of[node];
            if let Some(index) = self.models.get_mut(model) {
                index.on_node[node] += 1;
                if let Some(rack) = rack {
                    index.in_rack[rack] += 1;
                }
            }
            for (name, index) in &mut self.models {
                let rekeyed = match rack {
                    Some(rack) if name == model => &self.rack_members[rack][..],
                    _ => std::slice::from_ref(&node),
                };
                for profile in &mut index.profiles {
                    let fresh = Fresh {
                        nodes: &self.nodes,
                        id_rank: &self.id_rank,
                        on_node: &index.on_node,
                        in_rack: &index.in_rack,
                        rack_of: &self.rack_of,
                    };
                    profile.refresh(node, &fresh);
                    // Its rack-mates only moved down the order.
                    for &other in rekeyed.iter().filter(|other| **other != node) {
                        profile.rekey(other, &fresh);
                    }
                }
            }
        }
    }

    fn place_once(
        &mut self,
        request: &Request<'_>,
        honour_avoid: bool,
    ) -> Result<Placement, Explanation> {
        let mut profiles = Vec::new();
        for profile in request.profiles {
            let index = self.profile_index(request, profile, honour_avoid);
            let index = &self.models[request.model].profiles[index];
            match index.choose(&self.by_rank) {
                Ok((fabric, chosen)) => {
                    let nodes = chosen.into_iter().map(|i| &self.nodes[i]);
                    return Ok(placement(profile, fabric, nodes));
                }
                Err(fabric_shortfall) => profiles.push(ProfileExplanation {
                    model: request.model.to_owned(),
                    profile: profile.name.clone(),
                    nodes_evaluated: self.nodes.len() as u32,
                    nodes_fit: index.fit.len() as u32,
                    reasons: index.reasons.clone(),
                    fabric_shortfall,
                }),
            }
        }
        Err(Explanation { profiles })
    }

    /// The index of `profile` for this request, built on first use.
    fn profile_index(&mut self, request: &Request<'_>, profile: &Profile, honour: bool) -> usize {
        let avoid = honour.then_some(&request.avoid);
        if !self.models.contains_key(request.model) {
            let seeded = self.seed(request);
            self.models.insert(request.model.to_owned(), seeded);
        }
        let model = self.models.get_mut(request.model).expect("inserted above");
        if let Some(found) = model.profiles.iter().position(|p| {
            p.profile == *profile && p.strategy == request.strategy && p.avoid.as_ref() == avoid
        }) {
            return found;
        }
        let mut index = ProfileIndex {
            profile: profile.clone(),
            strategy: request.strategy,
            avoid: avoid.cloned(),
            outcome: Vec::with_capacity(self.nodes.len()),
            keys: vec![None; self.nodes.len()],
            reasons: BTreeMap::new(),
            fit: BTreeSet::new(),
            by_fabric: BTreeMap::new(),
        };
        let fresh = Fresh {
            nodes: &self.nodes,
            id_rank: &self.id_rank,
            on_node: &model.on_node,
            in_rack: &model.in_rack,
            rack_of: &self.rack_of,
        };
        for node in 0..self.nodes.len() {
            index.outcome.push(Err(Reason::Lost));
            index.insert(node, &fresh);
        }
        model.profiles.push(index);
        model.profiles.len() - 1
    }

    fn seed(&self, request: &Request<'_>) -> ModelIndex {
        let mut on_node = vec![0; self.nodes.len()];
        for (id, count) in &request.siblings.nodes {
            if let Some(&i) = self.by_id.get(id) {
                on_node[i] = *count;
            }
        }
        let mut in_rack = vec![0; self.rack_members.len()];
        for (rack, count) in &request.siblings.racks {
            if let Some(&r) = self.rack_index.get(rack) {
                in_rack[r] = *count;
            }
        }
        ModelIndex {
            on_node,
            in_rack,
            profiles: Vec::new(),
        }
    }
}

/// What evaluating and keying a node reads.
struct Fresh<'a> {
    nodes: &'a [NodeView],
    id_rank: &'a [u32],
    on_node: &'a [u32],
    in_rack: &'a [u32],
    rack_of: &'a [Option<usize>],
}

impl ProfileIndex {
    /// The nodes a replica goes to, rank 0 first, and its fabric; or, for
    /// a multi-node profile that fits no fabric, the shortfall.
    fn choose(&self, by_rank: &[usize]) -> Result<Chosen<'_>, Option<FabricShortfall>> {
        let node_of = |key: &Key| by_rank[key.3 as usize];
        if !self.profile.is_multi_node() {
            let best = self.fit.first().ok_or(None)?;
            return Ok((None, vec![node_of(best)]));
        }
        let sizes = || {
            self.by_fabric
                .iter()
                .map(|(f, set)| (f.as_str(), set.len()))
        };
        let Some(fabric) = choose_fabric(sizes(), &self.profile, self.strategy) else {
            return Err(Some(fabric_shortfall(&self.profile, sizes())));
        };
        let nodes = self.by_fabric[fabric]
            .iter()
            .take(self.profile.nodes as usize)
            .map(node_of)
            .collect();
        Ok((Some(fabric), nodes))
    }

    /// Re-evaluates and re-keys one node.
    fn refresh(&mut self, node: usize, fresh: &Fresh<'_>) {
        match std::mem::replace(&mut self.outcome[node], Err(Reason::Lost)) {
            Ok(_) => {
                let key = self.keys[node].take().expect("a fitting node has a key");
                self.fit.remove(&key);
                for fabric in &fresh.nodes[node].fabrics {
                    if let Some(set) = self.by_fabric.get_mut(fabric) {
                        set.remove(&key);
                        if set.is_empty() {
                            self.by_fabric.remove(fabric);
                        }
                    }
                }
            }
            Err(reason) => self.remove_reason(&reason, 1),
        }
        self.insert(node, fresh);
    }

    /// Files a fitting node under its current key; its outcome is as it was.
    fn rekey(&mut self, node: usize, fresh: &Fresh<'_>) {
        let Some(old) = self.keys[node] else {
            return;
        };
        let in_rack = fresh.rack_of[node].map_or(0, |r| fresh.in_rack[r]);
        let key = (fresh.on_node[node], in_rack, old.2, old.3);
        if key == old {
            return;
        }
        self.fit.remove(&old);
        self.fit.insert(key);
        for fabric in &fresh.nodes[node].fabrics {
            if let Some(set) = self.by_fabric.get_mut(fabric) {
                set.remove(&old);
                set.insert(key);
            }
        }
        self.keys[node] = Some(key);
    }

    /// Evaluates `node` and files it under its key or its reason. Its
    /// outcome slot holds a placeholder that no count includes.
    fn insert(&mut self, node: usize, fresh: &Fresh<'_>) {
        let view = &fresh.nodes[node];
        let avoided = self.avoid.as_ref().is_some_and(|a| a.contains(&view.id));
        let outcome = evaluate(view, &self.profile, avoided);
        match &outcome {
            Ok(free) => {
                let in_rack = fresh.rack_of[node].map_or(0, |r| fresh.in_rack[r]);
                let key = (
                    fresh.on_node[node],
                    in_rack,
                    room(*free, self.strategy),
                    fresh.id_rank[node],
                );
                self.fit.insert(key);
                if self.profile.is_multi_node() {
                    for fabric in &view.fabrics {
                        self.by_fabric
                            .entry(fabric.clone())
                            .or_default()
                            .insert(key);
                    }
                }
                self.keys[node] = Some(key);
            }
            Err(reason) => *self.reasons.entry(reason.clone()).or_default() += 1,
        }
        self.outcome[node] = outcome;
    }

    fn remove_reason(&mut self, reason: &Reason, count: u32) {
        if let Some(n) = self.reasons.get_mut(reason) {
            *n -= count;
            if *n == 0 {
                self.reasons.remove(reason);
            }
        }
    }
}
