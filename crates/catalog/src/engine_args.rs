//! A profile's `engine_args` checked against the options of the engine
//! release that will run them, so that a flag the engine refuses fails in
//! `llmgw config check`, the admin API and the agent, not minutes into a
//! launch.

use llmgw_engine_options::{self as options, ArgProblem, EngineOptions, Version};

use crate::model::Engine;

/// The release a profile's `engine_version` names, or why it cannot be
/// used (the message lists the releases llmgw has option data for).
pub fn resolve_engine_version(engine: Engine, text: &str) -> Result<Version, String> {
    let known = options::versions(engine);
    let listed: Vec<String> = known.iter().map(Version::to_string).collect();
    let version = Version::parse(text).ok_or_else(|| {
        format!(
            "invalid version {text:?}; write it as e.g. `{}`",
            listed.last().map_or("0.5.10", String::as_str)
        )
    })?;
    if !known.contains(&version) {
        return Err(format!(
            "llmgw has no option data for {engine} {version}; known {engine} versions: {}",
            listed.join(", ")
        ));
    }
    Ok(version)
}

/// The option data `engine_args` are checked against: the profile's
/// release, else the newest one not newer than the engine's default
/// (`None` when llmgw has none that old).
pub fn options_for(engine: Engine, version: Option<Version>) -> Option<&'static EngineOptions> {
    match version {
        Some(v) => options::options(engine, v),
        None => options::newest_up_to(engine, engine.default_version()).map(|(_, data)| data),
    }
}

/// The option data for an installed release: the newest release not newer
/// than it (options are added far more often than removed), or `None`.
pub fn options_up_to(
    engine: Engine,
    version: Version,
) -> Option<(Version, &'static EngineOptions)> {
    options::newest_up_to(engine, version)
}

/// Every problem of `engine_args` for the release, with the item it is in.
/// The agent runs the same check against the release it has installed.
pub fn check_engine_args(data: &EngineOptions, engine_args: &[String]) -> Vec<ArgProblem> {
    options::check_engine_args(data, engine_args)
}
