//! The data files compiled into every binary, and finding the one for an
//! engine release.

use std::fmt;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use crate::data::EngineOptions;

/// An engine family: the one engine vocabulary of llmgw, from a catalog
/// profile through option data and launch plans to the simulator's
/// persona. Written as `vllm` or `sglang` everywhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    Vllm,
    Sglang,
}

impl Engine {
    pub const ALL: [Engine; 2] = [Engine::Vllm, Engine::Sglang];

    pub fn as_str(self) -> &'static str {
        match self {
            Engine::Vllm => "vllm",
            Engine::Sglang => "sglang",
        }
    }

    /// The release assumed when nothing names one: what the agent's
    /// `engines.<engine>.version` defaults to, and what a profile without
    /// `engine_version` is checked against.
    pub fn default_version(self) -> Version {
        match self {
            Engine::Vllm => DEFAULT_VLLM_VERSION,
            Engine::Sglang => DEFAULT_SGLANG_VERSION,
        }
    }
}

impl fmt::Display for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The name is not an engine llmgw runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownEngine(pub String);

impl fmt::Display for UnknownEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown engine {:?}; expected one of {}",
            self.0,
            Engine::ALL.map(Engine::as_str).join(", ")
        )
    }
}

impl std::error::Error for UnknownEngine {}

/// As a catalog (`engine:`) or agent.yaml names it.
impl llmgw_yaml::Decode for Engine {
    fn decode(
        node: &llmgw_yaml::Node,
        path: &llmgw_yaml::Path,
        cx: &mut llmgw_yaml::Cx,
    ) -> Option<Self> {
        let text = String::decode(node, path, cx)?;
        text.parse()
            .map_err(|unknown: UnknownEngine| cx.report(node.pos, path, unknown.to_string()))
            .ok()
    }
}

impl std::str::FromStr for Engine {
    type Err = UnknownEngine;

    fn from_str(name: &str) -> Result<Self, UnknownEngine> {
        Engine::ALL
            .into_iter()
            .find(|engine| engine.as_str() == name)
            .ok_or_else(|| UnknownEngine(name.to_owned()))
    }
}

pub const DEFAULT_VLLM_VERSION: Version = Version::new(0, 11, 1);
pub const DEFAULT_SGLANG_VERSION: Version = Version::new(0, 5, 10);

/// A release number, `MAJOR.MINOR.PATCH`; suffixes such as `.post1` or
/// `rc2` are dropped because options do not change in them. The one reading
/// of an engine release everywhere: option data, a profile's
/// `engine_version` and agent.yaml's `engines.*.version`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl Version {
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        Self {
            major,
            minor,
            patch,
        }
    }

    /// Reads `0.5.10`, `0.11`, `0.5.3.post1`, `0.11.1rc2`.
    pub fn parse(text: &str) -> Option<Self> {
        let mut parts = text.trim().split('.').map(|part| {
            let digits: String = part.chars().take_while(char::is_ascii_digit).collect();
            (!digits.is_empty())
                .then(|| digits.parse::<u32>().ok())
                .flatten()
        });
        let major = parts.next()??;
        let minor = parts.next()??;
        let patch = parts.next().flatten().unwrap_or(0);
        Some(Self::new(major, minor, patch))
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// Every data file compiled in. To add a release: run
/// `scripts/engine-options/generate ENGINE=VERSION`, add its line here, run
/// `cargo test -p llmgw-engine-options` (docs/engine-sim.md).
const EMBEDDED: &[(Engine, Version, &str)] = &[
    (
        Engine::Vllm,
        Version::new(0, 11, 0),
        include_str!("../data/vllm-0.11.0.json"),
    ),
    (
        Engine::Vllm,
        Version::new(0, 11, 1),
        include_str!("../data/vllm-0.11.1.json"),
    ),
    (
        Engine::Vllm,
        Version::new(0, 34, 0),
        include_str!("../data/vllm-0.34.0.json"),
    ),
    (
        Engine::Sglang,
        Version::new(0, 5, 10),
        include_str!("../data/sglang-0.5.10.json"),
    ),
    (
        Engine::Sglang,
        Version::new(0, 5, 23),
        include_str!("../data/sglang-0.5.23.json"),
    ),
];

/// Each embedded file, parsed on first use.
fn parsed(index: usize) -> &'static EngineOptions {
    static CACHE: OnceLock<Vec<OnceLock<EngineOptions>>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| EMBEDDED.iter().map(|_| OnceLock::new()).collect());
    cache[index].get_or_init(|| {
        let (engine, version, text) = EMBEDDED[index];
        // The conformance test parses every embedded file, so a file that
        // does not parse never ships.
        serde_json::from_str(text).unwrap_or_else(|e| {
            panic!("embedded data file {engine}-{version}.json does not parse: {e}")
        })
    })
}

/// The releases of `engine` whose options are known, oldest first.
pub fn versions(engine: Engine) -> Vec<Version> {
    let mut found: Vec<Version> = EMBEDDED
        .iter()
        .filter(|(e, _, _)| *e == engine)
        .map(|(_, v, _)| *v)
        .collect();
    found.sort();
    found
}

/// The options of exactly this release, when its data is embedded.
pub fn options(engine: Engine, version: Version) -> Option<&'static EngineOptions> {
    let index = EMBEDDED
        .iter()
        .position(|(e, v, _)| *e == engine && *v == version)?;
    Some(parsed(index))
}

/// The newest embedded release not newer than `version`: options are
/// added far more often than removed, so an older file is the safe guess
/// for a release in between.
pub fn newest_up_to(engine: Engine, version: Version) -> Option<(Version, &'static EngineOptions)> {
    let best = versions(engine).into_iter().rfind(|v| *v <= version)?;
    Some((best, options(engine, best)?))
}

/// The raw text of every embedded file, for tests that read the recorded
/// cases.
pub fn embedded_files() -> impl Iterator<Item = (Engine, Version, &'static str)> {
    EMBEDDED.iter().copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_engine_is_written_read_and_decoded_by_its_one_name() {
        for engine in Engine::ALL {
            let json = serde_json::to_string(&engine).unwrap();
            assert_eq!(json, format!("\"{}\"", engine.as_str()), "stored as before");
            assert_eq!(serde_json::from_str::<Engine>(&json).unwrap(), engine);
            assert_eq!(engine.as_str().parse::<Engine>(), Ok(engine));
        }
        let unknown = "trt".parse::<Engine>().unwrap_err().to_string();
        assert_eq!(
            unknown,
            "unknown engine \"trt\"; expected one of vllm, sglang"
        );
    }

    #[test]
    fn versions_parse_with_suffixes() {
        assert_eq!(Version::parse("0.5.10"), Some(Version::new(0, 5, 10)));
        assert_eq!(Version::parse("0.11"), Some(Version::new(0, 11, 0)));
        assert_eq!(Version::parse("0.5.3.post1"), Some(Version::new(0, 5, 3)));
        assert_eq!(Version::parse("0.11.1rc2"), Some(Version::new(0, 11, 1)));
        assert_eq!(Version::parse("latest"), None);
        assert_eq!(Version::parse("1"), None);
    }

    #[test]
    fn every_embedded_file_matches_its_name() {
        for (engine, version, _) in embedded_files() {
            let data = options(engine, version).unwrap();
            assert_eq!(data.engine, engine.as_str());
            assert_eq!(Version::parse(&data.version), Some(version));
        }
    }
}
