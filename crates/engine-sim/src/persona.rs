//! Which engine, at which version, the simulator pretends to be.
//!
//! Flags, log lines, error shapes and shutdown behaviour differ between
//! releases; the persona is the single switch for all of them.

use std::fmt;

/// The engine family, llmgw's one engine type.
pub use llmgw_engine_options::Engine;

/// A persona such as `vllm=0.11.0` or `sglang=0.5.10`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Persona {
    pub engine: Engine,
    pub version: (u32, u32, u32),
}

/// The newest vLLM release the simulator models.
pub const VLLM_CURRENT: (u32, u32, u32) = (0, 34, 0);
/// The newest SGLang release the simulator models.
pub const SGLANG_CURRENT: (u32, u32, u32) = (0, 5, 23);

#[derive(Debug, thiserror::Error)]
#[error(
    "LLMGW_SIM_PERSONA: cannot read '{0}'; expected ENGINE or ENGINE=VERSION with ENGINE vllm or sglang, e.g. vllm=0.11.0, vllm=0.34.0, sglang=0.5.10, sglang=0.5.23"
)]
pub struct PersonaError(pub String);

impl Persona {
    pub fn current(engine: Engine) -> Self {
        let version = match engine {
            Engine::Vllm => VLLM_CURRENT,
            Engine::Sglang => SGLANG_CURRENT,
        };
        Self { engine, version }
    }

    /// Parses `vllm`, `vllm=0.11.0`, `sglang=0.5.10`, `vllm=current`.
    pub fn parse(text: &str) -> Result<Self, PersonaError> {
        let err = || PersonaError(text.to_string());
        let (engine, version) = match text.split_once('=') {
            Some((e, v)) => (e.trim(), Some(v.trim())),
            None => (text.trim(), None),
        };
        let engine: Engine = engine.parse().map_err(|_| err())?;
        let mut persona = Self::current(engine);
        if let Some(v) = version.filter(|v| *v != "current" && !v.is_empty()) {
            // `0.5.10.post1` and `0.11.1rc2` keep their numeric head.
            let mut parts = v.split('.').map(|p| {
                p.chars()
                    .take_while(char::is_ascii_digit)
                    .collect::<String>()
            });
            let mut next = || {
                parts
                    .next()
                    .filter(|p| !p.is_empty())
                    .and_then(|p| p.parse::<u32>().ok())
            };
            let major = next().ok_or_else(err)?;
            let minor = next().ok_or_else(err)?;
            let patch = next().unwrap_or(0);
            persona.version = (major, minor, patch);
        }
        Ok(persona)
    }

    pub fn is_vllm(&self) -> bool {
        self.engine == Engine::Vllm
    }

    pub fn at_least(&self, version: (u32, u32, u32)) -> bool {
        self.version >= version
    }

    /// `--nnodes/-n`, `--node-rank/-r`, `--master-addr/--master-port` shipped in vLLM 0.11.1.
    pub fn has_multinode_mp(&self) -> bool {
        self.is_vllm() && self.at_least((0, 11, 1))
    }

    /// vLLM 0.11.x quietly picks Ray when the world is larger than the node;
    /// later releases refuse with a "World size ... is larger" error.
    pub fn refuses_oversized_world(&self) -> bool {
        self.is_vllm() && self.at_least((0, 12, 0))
    }

    /// `--shutdown-timeout` (drain on SIGTERM) is absent from 0.11.x.
    pub fn has_shutdown_timeout(&self) -> bool {
        self.is_vllm() && self.at_least((0, 12, 0))
    }

    pub fn version_string(&self) -> String {
        let (a, b, c) = self.version;
        format!("{a}.{b}.{c}")
    }
}

impl fmt::Display for Persona {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let engine = match self.engine {
            Engine::Vllm => "vllm",
            Engine::Sglang => "sglang",
        };
        write!(f, "{engine}={}", self.version_string())
    }
}
