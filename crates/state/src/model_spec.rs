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
}

impl ModelSpec {
    /// The entry of a validated model.
    pub fn new(model: Model) -> Self {
        // A catalog entry is maps, strings and numbers: it always encodes.
        let stored = serde_json::to_value(&model).expect("a catalog entry encodes as JSON");
        ModelSpec {
            stored,
            decoded: Ok(model),
        }
    }

    /// An entry as stored, decoded now.
    pub fn from_stored(stored: serde_json::Value) -> Self {
        let decoded = Model::deserialize(&stored).map_err(|e| e.to_string());
        ModelSpec { stored, decoded }
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
