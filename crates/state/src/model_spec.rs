//! A catalog entry as the replicated state holds it.
//!
//! The stored form is the entry exactly as the operator wrote it (JSON in
//! models.yaml's shape, keys sorted), so the log, snapshots, backups and
//! the state hash are the same bytes they were before entries were typed,
//! and an entry carrying fields newer than this build replicates whole.
//! The `Model` it means is decoded once, when the entry is read from the
//! log or a snapshot; every reader asks [`ModelSpec::model`] and meets the
//! same answer, including the same reason when this build cannot read it.

use llmgw_catalog::Model;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

#[derive(Debug, Clone)]
pub struct ModelSpec {
    stored: serde_json::Value,
    decoded: Result<Model, String>,
    launch_fingerprint: String,
}

/// A digest of everything in the entry that reaches an engine, taken over
/// the entry as the operator wrote it with keys sorted, so it is the same
/// for every build of llmgw that stores the entry: a new field in a later
/// build's types changes no fingerprint of an entry that does not use it.
fn launch_fingerprint(stored: &serde_json::Value) -> String {
    let mut canonical = String::new();
    match stored {
        serde_json::Value::Object(fields) => {
            // `autoscale` is the control plane's, except that sleep mode
            // adds a flag to the engine's command line.
            let sleep_mode = (SLEEP_MODE_KEY.to_owned(), serde_json::Value::Bool(true));
            let sleeps = stored
                .pointer("/autoscale/sleep_after")
                .is_some_and(|after| !after.is_null());
            let launched = fields
                .iter()
                .filter(|(key, _)| !ModelSpec::NOT_LAUNCHED.contains(&key.as_str()))
                .chain(sleeps.then_some((&sleep_mode.0, &sleep_mode.1)));
            write_map(&mut canonical, launched);
        }
        other => write_canonical(&mut canonical, other),
    }
    format!("{:016x}", crate::hash::fnv1a(canonical.as_bytes()))
}

/// Stands in the fingerprint for an entry whose engines run in sleep mode:
/// entries without it keep the fingerprint they always had.
const SLEEP_MODE_KEY: &str = "sleep_mode";

fn write_map<'a>(
    out: &mut String,
    fields: impl Iterator<Item = (&'a String, &'a serde_json::Value)>,
) {
    let mut sorted: Vec<_> = fields.collect();
    sorted.sort_by(|a, b| a.0.cmp(b.0));
    out.push('{');
    for (i, (key, value)) in sorted.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&serde_json::Value::String(key.clone()).to_string());
        out.push(':');
        write_canonical(out, value);
    }
    out.push('}');
}

fn write_canonical(out: &mut String, value: &serde_json::Value) {
    match value {
        serde_json::Value::Object(fields) => write_map(out, fields.iter()),
        serde_json::Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(out, item);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

impl ModelSpec {
    /// Top-level fields of an entry that no engine sees: changing them
    /// needs no new replica. `aliases` is among them because a replica
    /// keeps the names it was launched with and the router maps a newer
    /// alias to the model's name itself.
    pub const NOT_LAUNCHED: [&'static str; 6] = [
        "replicas",
        "aliases",
        "rollout",
        "autoscale",
        "priority",
        "price",
    ];

    /// The entry of a validated model.
    pub fn new(model: Model) -> Self {
        // A catalog entry is maps, strings and numbers: it always encodes.
        let stored = serde_json::to_value(&model).expect("a catalog entry encodes as JSON");
        ModelSpec {
            launch_fingerprint: launch_fingerprint(&stored),
            stored,
            decoded: Ok(model),
        }
    }

    /// An entry as stored, decoded now.
    pub fn from_stored(stored: serde_json::Value) -> Self {
        let decoded = Model::deserialize(&stored).map_err(|e| e.to_string());
        ModelSpec {
            launch_fingerprint: launch_fingerprint(&stored),
            stored,
            decoded,
        }
    }

    /// The entry as written, for `GET /api/v1/models`.
    pub fn stored(&self) -> &serde_json::Value {
        &self.stored
    }

    /// The model, or why this build cannot read the entry (a newer peer
    /// wrote a shape it does not know). Such an entry is left as it is:
    /// not routed, its replicas neither placed nor stopped.
    pub fn model(&self) -> Result<&Model, &str> {
        self.decoded.as_ref().map_err(String::as_str)
    }

    /// What engines launched from this entry run, as 16 hex digits: two
    /// entries with the same fingerprint start the same engines, whatever
    /// their replica counts, aliases or rollout settings. A replica
    /// records the fingerprint it was started from; one that differs from
    /// its model's is replaced by a rolling update.
    pub fn launch_fingerprint(&self) -> &str {
        &self.launch_fingerprint
    }

    /// The names an engine launched from this entry serves: the model's
    /// name, then its aliases.
    pub fn served_names(&self, name: &str) -> Vec<String> {
        std::iter::once(name.to_owned())
            .chain(self.aliases().iter().cloned())
            .collect()
    }

    /// The aliases the entry claims; none when it cannot be read.
    pub fn aliases(&self) -> &[String] {
        self.decoded.as_ref().map_or(&[], |model| &model.aliases)
    }
}

/// Entries are equal when they were written the same.
impl PartialEq for ModelSpec {
    fn eq(&self, other: &Self) -> bool {
        self.stored == other.stored
    }
}

impl Eq for ModelSpec {}

impl Serialize for ModelSpec {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.stored.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for ModelSpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        serde_json::Value::deserialize(deserializer).map(ModelSpec::from_stored)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_round_trips_through_its_stored_form() {
        let stored = serde_json::json!({
            "name": "llama",
            "aliases": ["l3"],
            "source": "org/llama",
            "replicas": 2,
            "profiles": [],
        });
        let spec = ModelSpec::from_stored(stored.clone());
        let model = spec.model().expect("decodes");
        assert_eq!(model.name, "llama");
        assert_eq!(spec.aliases(), ["l3".to_owned()]);
        let again = ModelSpec::new(model.clone());
        assert_eq!(again, spec);
        assert_eq!(serde_json::to_value(&again).unwrap(), stored);
    }

    #[test]
    fn the_launch_fingerprint_ignores_what_engines_never_see_and_key_order() {
        let entry = |extra: serde_json::Value| {
            let mut stored = serde_json::json!({
                "name": "llama",
                "source": "org/llama",
                "replicas": 2,
                "profiles": [{"name": "p", "engine": "vllm", "engine_args": ["--a"]}],
            });
            for (key, value) in extra.as_object().unwrap() {
                stored[key] = value.clone();
            }
            ModelSpec::from_stored(stored)
        };
        let base = entry(serde_json::json!({}));
        let scaled = entry(serde_json::json!({"replicas": 7, "aliases": ["l3"],
            "rollout": {"max_surge": 2, "max_unavailable": 0, "rollback_after_failures": 1}}));
        assert_eq!(base.launch_fingerprint(), scaled.launch_fingerprint());
        let reordered = ModelSpec::from_stored(
            serde_json::from_str(
                r#"{"profiles": [{"engine_args": ["--a"], "engine": "vllm", "name": "p"}],
                    "replicas": 2, "source": "org/llama", "name": "llama"}"#,
            )
            .unwrap(),
        );
        assert_eq!(base.launch_fingerprint(), reordered.launch_fingerprint());
        let changed = entry(serde_json::json!({
            "profiles": [{"name": "p", "engine": "vllm", "engine_args": ["--b"]}]}));
        assert_ne!(base.launch_fingerprint(), changed.launch_fingerprint());
        let moved = entry(serde_json::json!({"source": "org/llama-v2"}));
        assert_ne!(base.launch_fingerprint(), moved.launch_fingerprint());
        // Autoscaling is the control plane's, except sleep mode: its
        // engines are launched with another flag. How long they wait before
        // sleeping is the control plane's again.
        let autoscaled = entry(serde_json::json!({"autoscale": {"min_replicas": 0,
            "max_replicas": 2, "scale_down_window": "10m"}}));
        assert_eq!(base.launch_fingerprint(), autoscaled.launch_fingerprint());
        let sleepy = |after: &str| {
            entry(
                serde_json::json!({"autoscale": {"min_replicas": 0, "max_replicas": 2,
                "scale_down_window": "10m", "sleep_after": after}}),
            )
        };
        assert_ne!(base.launch_fingerprint(), sleepy("1m").launch_fingerprint());
        assert_eq!(
            sleepy("1m").launch_fingerprint(),
            sleepy("5m").launch_fingerprint()
        );
    }

    /// The fingerprint is a stored fact's digest: a later build must give
    /// the same digest for the same entry, or every replica it adopts
    /// would look outdated and roll.
    #[test]
    fn the_launch_fingerprint_of_a_fixed_entry_never_changes() {
        let spec = ModelSpec::from_stored(serde_json::json!({
            "name": "llama",
            "source": "org/llama",
            "replicas": 1,
            "profiles": [{"name": "p", "engine": "vllm", "gpus_per_node": 1,
                          "env": {"A": "1"}, "engine_args": ["--max-model-len", "4096"]}],
        }));
        assert_eq!(spec.launch_fingerprint(), PINNED_FINGERPRINT);
    }

    const PINNED_FINGERPRINT: &str = "07fed55fbbde7863";

    #[test]
    fn an_entry_this_build_cannot_read_keeps_its_bytes_and_says_why() {
        let stored =
            serde_json::json!({"name": "future", "aliases": ["f"], "serving": {"kind": "new"}});
        let spec: ModelSpec = serde_json::from_value(stored.clone()).expect("any JSON is stored");
        let why = spec.model().expect_err("not a model this build knows");
        assert!(!why.is_empty());
        assert!(spec.aliases().is_empty());
        assert_eq!(serde_json::to_value(&spec).unwrap(), stored);
    }
}
