//! Reading models.yaml (or one model as JSON or YAML) and every rule a model
//! must pass. This is the only place catalog rules live.

use std::collections::{BTreeMap, BTreeSet};

use llmgw_yaml::{Cx, Decode, Fields, Node, Path, Problems, Value};

use crate::engine_args::{options_for, resolve_engine_version};
use crate::managed_flags::{MANAGED_ENV, managed_flag};
use crate::model::{
    Autoscale, Catalog, Engine, LaunchMode, Managed, Model, Profile, RolloutPolicy, Serving,
};
use crate::price::{Price, Usd};

/// Upper bounds that catch typos (`replicas: 200` for 20) before they cost a
/// fleet's worth of GPUs. Raise them here if a real fleet needs more.
pub const MAX_REPLICAS: u32 = 1000;
pub const MAX_NODES_PER_REPLICA: u32 = 64;
pub const MAX_GPUS_PER_NODE: u32 = 16;
/// The longest autoscale window: the leader keeps this much load history.
pub const MAX_SCALE_WINDOW: std::time::Duration = std::time::Duration::from_secs(3600);

/// Parses a whole `models.yaml`.
pub fn parse_catalog(file: &str, src: &str) -> Result<Catalog, Problems> {
    llmgw_yaml::load(file, src, decode_catalog)
}

/// Parses a single model entry, as sent to `PUT /api/v1/models/{name}` (JSON
/// or YAML). `source` names the request in problems.
pub fn parse_model(source: &str, src: &str) -> Result<Model, Problems> {
    llmgw_yaml::load(source, src, |node, cx| {
        Model::decode(node, &Path::root(), cx)
    })
}

/// Decodes a catalog from a node: also used by config files that embed one.
pub fn decode_catalog(node: &Node, cx: &mut Cx) -> Option<Catalog> {
    let fields = cx.map(node, &Path::root(), &["models"])?;
    let models: Vec<Model> = fields.or(cx, "models", Vec::new());
    check_unique_names(&fields, &models, cx);
    (!cx.has_problems()).then_some(Catalog { models })
}

/// Names and aliases are one namespace: a client's `model` must resolve to one
/// model only.
fn check_unique_names(fields: &Fields<'_>, models: &[Model], cx: &mut Cx) {
    let Some(Value::Seq(nodes)) = fields.node("models").map(|n| &n.value) else {
        return;
    };
    let mut owner: BTreeMap<&str, &str> = BTreeMap::new();
    for (i, model) in models.iter().enumerate() {
        for name in model.names() {
            if let Some(first) = owner.insert(name, &model.name) {
                let path = Path::root().field("models").index(i).field("name");
                let pos = nodes.get(i).map_or(fields.pos(), |n| n.pos);
                cx.report(
                    pos,
                    &path,
                    format!(
                        "the name `{name}` of model `{}` is already used by model `{first}`",
                        model.name
                    ),
                );
            }
        }
    }
}

impl Catalog {
    /// Whether `model` can be put into this catalog (replacing any model of
    /// the same name) without a name or alias clash.
    pub fn check_put(&self, model: &Model) -> Result<(), String> {
        for other in self.models.iter().filter(|m| m.name != model.name) {
            if let Some(clash) = model.names().find(|n| other.names().any(|o| o == *n)) {
                return Err(format!(
                    "the name `{clash}` is already used by model `{}`",
                    other.name
                ));
            }
        }
        Ok(())
    }

    /// Puts `model` in place of the model with its name, or appends it.
    pub fn put(&mut self, model: Model) {
        match self.models.iter_mut().find(|m| m.name == model.name) {
            Some(slot) => *slot = model,
            None => self.models.push(model),
        }
    }
}

fn valid_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("must not be empty".to_string());
    }
    if name.len() > 128 {
        return Err(format!("is {} characters long; at most 128", name.len()));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "._-/:".contains(*c)))
    {
        return Err(format!(
            "{name:?} contains {bad:?}; use letters, digits and . _ - / : only"
        ));
    }
    Ok(())
}

impl Decode for Model {
    fn decode(node: &Node, path: &Path, cx: &mut Cx) -> Option<Self> {
        let f = cx.map(
            node,
            path,
            &[
                "name",
                "aliases",
                "source",
                "replicas",
                "profiles",
                "endpoints",
                "rollout",
                "autoscale",
                "priority",
                "price",
            ],
        )?;
        let name: Option<String> = f.required(cx, "name");
        if let Some(why) = name.as_deref().and_then(|n| valid_name(n).err()) {
            f.report(cx, "name", format!("invalid model name: {why}"));
        }
        let aliases: Vec<String> = f.or(cx, "aliases", Vec::new());
        for (i, alias) in aliases.iter().enumerate() {
            if let Err(why) = valid_name(alias) {
                cx.report(
                    f.item_pos("aliases", i),
                    &f.path().field("aliases").index(i),
                    format!("invalid alias: {why}"),
                );
            }
            if Some(alias) == name.as_ref() {
                f.report(
                    cx,
                    "aliases",
                    format!("alias `{alias}` repeats the model's own name"),
                );
            }
        }
        let serving = match (f.has("endpoints"), f.has("profiles")) {
            (true, true) => {
                f.report(
                    cx,
                    "endpoints",
                    "a model has either `endpoints` (served elsewhere, routed only) or `profiles` (run by llmgw), not both",
                );
                None
            }
            (true, false) => decode_endpoints(&f, cx),
            (false, true) => decode_managed(&f, cx),
            (false, false) => {
                cx.report(
                    f.pos(),
                    path,
                    "a model needs `profiles` (llmgw runs it) or `endpoints` (llmgw routes to it)",
                );
                None
            }
        };
        let price: Option<Price> = f.optional(cx, "price");
        Some(Model {
            name: name?,
            aliases,
            serving: serving?,
            price,
        })
    }
}

fn decode_endpoints(f: &Fields<'_>, cx: &mut Cx) -> Option<Serving> {
    for key in ["source", "replicas", "rollout", "autoscale", "priority"] {
        if f.has(key) {
            f.report(
                cx,
                key,
                format!("`{key}` applies to models llmgw runs; this one has static `endpoints`"),
            );
        }
    }
    let endpoints: Vec<String> = f.required(cx, "endpoints")?;
    if endpoints.is_empty() {
        f.report(cx, "endpoints", "list at least one endpoint URL");
    }
    let mut ok = true;
    for (i, url) in endpoints.iter().enumerate() {
        if let Err(why) = check_endpoint_url(url) {
            cx.report(
                f.item_pos("endpoints", i),
                &f.path().field("endpoints").index(i),
                why,
            );
            ok = false;
        }
    }
    ok.then_some(Serving::Endpoints { endpoints })
}

/// An endpoint is a base URL such as `http://10.1.2.3:8000` (the router adds
/// `/v1/...`).
pub fn check_endpoint_url(url: &str) -> Result<(), String> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or_else(|| format!("{url:?} is not an http:// or https:// URL"))?;
    let authority = rest.split('/').next().unwrap_or_default();
    if authority.is_empty() {
        return Err(format!("{url:?} has no host"));
    }
    if rest.trim_end_matches('/').ends_with("/v1") {
        return Err(format!(
            "{url:?}: give the base URL without `/v1`; the router adds the OpenAI path"
        ));
    }
    Ok(())
}

fn decode_managed(f: &Fields<'_>, cx: &mut Cx) -> Option<Serving> {
    let source: Option<String> = f.required(cx, "source");
    if source.as_deref() == Some("") {
        f.report(
            cx,
            "source",
            "must name what the engine loads, e.g. a Hugging Face repository",
        );
    }
    let autoscale: Option<Autoscale> = f.optional(cx, "autoscale");
    // With autoscaling, `replicas` is where the model starts.
    let replicas: u32 = f.or(cx, "replicas", autoscale.map_or(1, |a| a.min_replicas));
    if let Some(a) = autoscale
        && a.clamp(replicas) != replicas
    {
        f.report(
            cx,
            "replicas",
            format!(
                "{replicas} replicas is outside autoscale's bounds ({} to {}); leave it out to start at min_replicas",
                a.min_replicas, a.max_replicas
            ),
        );
    }
    if replicas > MAX_REPLICAS {
        f.report(
            cx,
            "replicas",
            format!("{replicas} replicas is above the limit of {MAX_REPLICAS}"),
        );
    }
    let profiles: Vec<Profile> = f.required(cx, "profiles")?;
    if profiles.is_empty() {
        f.report(cx, "profiles", "list at least one profile");
    }
    let mut seen = BTreeSet::new();
    for (i, p) in profiles.iter().enumerate() {
        if !seen.insert(p.name.as_str()) {
            cx.report(
                f.item_pos("profiles", i),
                &f.path().field("profiles").index(i).field("name"),
                format!("profile name `{}` appears twice in this model", p.name),
            );
        }
    }
    if autoscale.is_some_and(|a| a.sleep_after.is_some()) {
        check_sleep_mode(f, cx, &profiles);
    }
    let rollout: RolloutPolicy = f.or(cx, "rollout", RolloutPolicy::DEFAULT);
    Some(Serving::Managed(Managed {
        source: source?,
        replicas,
        profiles,
        rollout,
        autoscale,
        priority: f.or(cx, "priority", 0),
    }))
}

/// Sleep mode is vLLM's, and llmgw puts to sleep only what it can ask:
/// a single-node replica, whose one engine serves the sleep endpoints.
fn check_sleep_mode(f: &Fields<'_>, cx: &mut Cx, profiles: &[Profile]) {
    for profile in profiles {
        let why = if profile.engine != Engine::Vllm {
            format!(
                "profile {} runs {}: only vLLM has a sleep mode; leave sleep_after out",
                profile.name,
                profile.engine.as_str()
            )
        } else if profile.nodes > 1 {
            format!(
                "profile {} spans {} nodes: only single-node replicas are put to sleep",
                profile.name, profile.nodes
            )
        } else {
            continue;
        };
        f.report(cx, "autoscale", why);
    }
}

impl Decode for Price {
    fn decode(node: &Node, path: &Path, cx: &mut Cx) -> Option<Self> {
        let f = cx.map(
            node,
            path,
            &[
                "input_per_million",
                "cached_input_per_million",
                "output_per_million",
            ],
        )?;
        let dollars = |cx: &mut Cx, key: &str, value: f64| {
            let usd = Usd::from_dollars(value);
            if usd.is_none() {
                f.report(
                    cx,
                    key,
                    format!("{value} is not a price: dollars per million tokens, from 0 to 1e12"),
                );
            }
            usd
        };
        let input: f64 = f.required(cx, "input_per_million")?;
        let output: f64 = f.required(cx, "output_per_million")?;
        let cached: Option<f64> = f.optional(cx, "cached_input_per_million");
        let input = dollars(cx, "input_per_million", input);
        let output = dollars(cx, "output_per_million", output);
        let cached = match cached {
            Some(value) => Some(dollars(cx, "cached_input_per_million", value)?),
            None => None,
        };
        Some(Price {
            input_per_million: input?,
            cached_input_per_million: cached,
            output_per_million: output?,
        })
    }
}

impl Decode for Autoscale {
    fn decode(node: &Node, path: &Path, cx: &mut Cx) -> Option<Self> {
        let f = cx.map(
            node,
            path,
            &[
                "min_replicas",
                "max_replicas",
                "target_requests_per_replica",
                "scale_up_window",
                "scale_down_window",
                "ttft_p90_slo",
                "queue_p90_slo",
                "kv_cache_usage_percent",
                "sleep_after",
                "max_requests_per_replica",
            ],
        )?;
        let min_replicas: u32 = f.required(cx, "min_replicas")?;
        let max_replicas: u32 = f.required(cx, "max_replicas")?;
        let autoscale = Autoscale {
            min_replicas,
            max_replicas,
            target_requests_per_replica: f.or(
                cx,
                "target_requests_per_replica",
                Autoscale::DEFAULT_TARGET_REQUESTS,
            ),
            scale_up_window: f.or(cx, "scale_up_window", Autoscale::DEFAULT_SCALE_UP_WINDOW),
            scale_down_window: f.or(
                cx,
                "scale_down_window",
                Autoscale::DEFAULT_SCALE_DOWN_WINDOW,
            ),
            ttft_p90_slo: f.optional(cx, "ttft_p90_slo"),
            queue_p90_slo: f.optional(cx, "queue_p90_slo"),
            kv_cache_usage_percent: f.optional(cx, "kv_cache_usage_percent"),
            sleep_after: f.optional(cx, "sleep_after"),
            max_requests_per_replica: f.optional(cx, "max_requests_per_replica"),
        };
        if let Some(most) = autoscale.max_requests_per_replica
            && most < autoscale.target_requests_per_replica
        {
            f.report(
                cx,
                "max_requests_per_replica",
                format!(
                    "{most} is below target_requests_per_replica ({}): replicas held under \
                     their target never ask for more",
                    autoscale.target_requests_per_replica
                ),
            );
        }
        if let Some(idle) = autoscale.sleep_after {
            if idle.is_zero() {
                f.report(
                    cx,
                    "sleep_after",
                    "must be more than 0: how long without a request before the replicas sleep",
                );
            } else if min_replicas == 0 && idle >= autoscale.scale_down_window {
                f.report(
                    cx,
                    "sleep_after",
                    format!(
                        "{} is not shorter than scale_down_window ({}): with min_replicas 0 the \
                         replicas would be released before they slept",
                        llmgw_yaml::format_duration(idle),
                        llmgw_yaml::format_duration(autoscale.scale_down_window)
                    ),
                );
            }
        }
        if autoscale
            .kv_cache_usage_percent
            .is_some_and(|p| !(1..=100).contains(&p))
        {
            f.report(
                cx,
                "kv_cache_usage_percent",
                "must be from 1 to 100: a percentage of the engine's KV cache",
            );
        }
        for (key, slo) in [
            ("ttft_p90_slo", autoscale.ttft_p90_slo),
            ("queue_p90_slo", autoscale.queue_p90_slo),
        ] {
            if slo.is_some_and(|slo| slo.is_zero()) {
                f.report(cx, key, "must be more than 0: no engine answers in no time");
            }
        }
        if max_replicas == 0 {
            f.report(
                cx,
                "max_replicas",
                "must be at least 1: a model that may never run has no use for autoscale",
            );
        }
        if max_replicas < min_replicas {
            f.report(
                cx,
                "max_replicas",
                format!("{max_replicas} is below min_replicas ({min_replicas})"),
            );
        }
        if max_replicas > MAX_REPLICAS {
            f.report(
                cx,
                "max_replicas",
                format!("{max_replicas} is above the replica limit of {MAX_REPLICAS}"),
            );
        }
        if autoscale.target_requests_per_replica == 0 {
            f.report(
                cx,
                "target_requests_per_replica",
                "must be at least 1 (requests running or waiting per replica)",
            );
        }
        for (key, window) in [
            ("scale_up_window", autoscale.scale_up_window),
            ("scale_down_window", autoscale.scale_down_window),
        ] {
            if window > MAX_SCALE_WINDOW {
                f.report(
                    cx,
                    key,
                    format!(
                        "{} is longer than the {} a leader remembers load for",
                        llmgw_yaml::format_duration(window),
                        llmgw_yaml::format_duration(MAX_SCALE_WINDOW)
                    ),
                );
            }
        }
        Some(autoscale)
    }
}

impl Decode for RolloutPolicy {
    fn decode(node: &Node, path: &Path, cx: &mut Cx) -> Option<Self> {
        let f = cx.map(
            node,
            path,
            &["max_surge", "max_unavailable", "rollback_after_failures"],
        )?;
        let default = RolloutPolicy::DEFAULT;
        let policy = RolloutPolicy {
            max_surge: f.or(cx, "max_surge", default.max_surge),
            max_unavailable: f.or(cx, "max_unavailable", default.max_unavailable),
            rollback_after_failures: f.or(
                cx,
                "rollback_after_failures",
                default.rollback_after_failures,
            ),
        };
        if policy.max_surge == 0 && policy.max_unavailable == 0 {
            f.report(
                cx,
                "max_surge",
                "with max_surge and max_unavailable both 0 a rollout could never replace a \
                 replica; allow a surge (extra GPUs) or some unavailability",
            );
        }
        for (key, value) in [
            ("max_surge", policy.max_surge),
            ("max_unavailable", policy.max_unavailable),
        ] {
            if value > MAX_REPLICAS {
                f.report(
                    cx,
                    key,
                    format!("{value} is above the replica limit of {MAX_REPLICAS}"),
                );
            }
        }
        Some(policy)
    }
}

impl Decode for LaunchMode {
    fn decode(node: &Node, path: &Path, cx: &mut Cx) -> Option<Self> {
        let text = String::decode(node, path, cx)?;
        text.parse()
            .map_err(|why: String| cx.report(node.pos, path, why))
            .ok()
    }
}

impl Decode for Profile {
    fn decode(node: &Node, path: &Path, cx: &mut Cx) -> Option<Self> {
        let f = cx.map(
            node,
            path,
            &[
                "name",
                "engine",
                "engine_version",
                "nodes",
                "gpus_per_node",
                "tensor_parallel",
                "pipeline_parallel",
                "data_parallel",
                "min_gpu_memory_gb",
                "gpu_models",
                "launch_mode",
                "engine_args",
                "env",
            ],
        )?;
        let before = cx.problem_count();
        let name: Option<String> = f.required(cx, "name");
        if let Some(why) = name.as_deref().and_then(|n| valid_name(n).err()) {
            f.report(cx, "name", format!("invalid profile name: {why}"));
        }
        let engine: Option<Engine> = f.required(cx, "engine");
        let engine_version: Option<String> = f.optional(cx, "engine_version");
        let nodes: u32 = f.or(cx, "nodes", 1);
        let gpus_per_node: u32 = f.or(cx, "gpus_per_node", 1);
        let pipeline_parallel: u32 = f.or(cx, "pipeline_parallel", 1);
        let data_parallel: u32 = f.or(cx, "data_parallel", 1);
        let tensor_parallel: u32 = f.or(
            cx,
            "tensor_parallel",
            (nodes * gpus_per_node) / (pipeline_parallel.max(1) * data_parallel.max(1)),
        );
        let min_gpu_memory_gb: u32 = f.or(cx, "min_gpu_memory_gb", 0);
        let gpu_models: Vec<String> = f.or(cx, "gpu_models", Vec::new());
        let launch_mode: Option<LaunchMode> = f.optional(cx, "launch_mode");
        let engine_args: Vec<String> = f.or(cx, "engine_args", Vec::new());
        let env: BTreeMap<String, String> = f.or(cx, "env", BTreeMap::new());

        for (key, value, max) in [
            ("nodes", nodes, MAX_NODES_PER_REPLICA),
            ("gpus_per_node", gpus_per_node, MAX_GPUS_PER_NODE),
            (
                "tensor_parallel",
                tensor_parallel,
                MAX_NODES_PER_REPLICA * MAX_GPUS_PER_NODE,
            ),
            (
                "pipeline_parallel",
                pipeline_parallel,
                MAX_NODES_PER_REPLICA,
            ),
            ("data_parallel", data_parallel, MAX_GPUS_PER_NODE),
        ] {
            if value == 0 {
                f.report(cx, key, "must be at least 1");
            } else if value > max {
                f.report(cx, key, format!("{value} is above the limit of {max}"));
            }
        }
        let world =
            u64::from(tensor_parallel) * u64::from(pipeline_parallel) * u64::from(data_parallel);
        let gpus = u64::from(nodes) * u64::from(gpus_per_node);
        if world != gpus && world > 0 && gpus > 0 {
            f.report(
                cx,
                "tensor_parallel",
                format!(
                    "tensor_parallel x pipeline_parallel x data_parallel = {tensor_parallel} x {pipeline_parallel} x {data_parallel} = {world}, \
                     but nodes x gpus_per_node = {nodes} x {gpus_per_node} = {gpus}; the engine needs one GPU per rank"
                ),
            );
        }
        if data_parallel > 1 && nodes > 1 {
            f.report(
                cx,
                "data_parallel",
                format!(
                    "data_parallel {data_parallel} on {nodes} nodes: data-parallel ranks run on one node; \
                     for more copies across nodes raise the model's replicas instead"
                ),
            );
        }
        if gpu_models.iter().any(|m| m.trim().is_empty()) {
            f.report(cx, "gpu_models", "GPU model names must not be empty");
        }
        if let Some(engine) = engine {
            check_multi_node(&f, cx, engine, nodes, launch_mode);
            check_engine_args(&f, cx, engine, &engine_args);
            check_engine_options(&f, cx, engine, engine_version.as_deref(), &engine_args);
        }
        check_env(&f, cx, &env);

        if cx.problem_count() > before {
            return None;
        }
        Some(Profile {
            name: name?,
            engine: engine?,
            engine_version,
            nodes,
            gpus_per_node,
            tensor_parallel,
            pipeline_parallel,
            data_parallel,
            min_gpu_memory_gb,
            gpu_models,
            launch_mode,
            engine_args,
            env,
        })
    }
}

fn check_multi_node(
    f: &Fields<'_>,
    cx: &mut Cx,
    engine: Engine,
    nodes: u32,
    launch_mode: Option<LaunchMode>,
) {
    match (engine, launch_mode) {
        (Engine::Sglang, Some(mode)) => f.report(
            cx,
            "launch_mode",
            format!(
                "launch_mode `{}` applies to vLLM; SGLang's nodes always rendezvous with --dist-init-addr",
                mode.as_str()
            ),
        ),
        (Engine::Vllm, Some(_)) if nodes == 1 => f.report(
            cx,
            "launch_mode",
            "launch_mode only matters for multi-node replicas (nodes > 1)",
        ),
        _ => {}
    }
}

fn check_engine_args(f: &Fields<'_>, cx: &mut Cx, engine: Engine, args: &[String]) {
    for (i, arg) in args.iter().enumerate() {
        let at = f.item_pos("engine_args", i);
        let path = f.path().field("engine_args").index(i);
        if let Some(flag) = managed_flag(engine, arg) {
            let shown = arg.split_once('=').map_or(arg.as_str(), |(n, _)| n);
            let hint = if shown == flag {
                String::new()
            } else {
                format!(" (`{shown}` is {engine}'s spelling of `{flag}`)")
            };
            let instead = if matches!(flag, "--data-parallel-size" | "--dp-size") {
                " and set the profile's `data_parallel` instead"
            } else {
                ""
            };
            cx.report(
                at,
                &path,
                format!(
                    "{shown} is set by llmgw from the placement{hint}; remove it from engine_args{instead}"
                ),
            );
        }
        if arg.contains(char::is_whitespace) && arg.starts_with("--") && !arg.contains('=') {
            cx.report(
                at,
                &path,
                format!("{arg:?} holds a space: give the flag and its value as two list items"),
            );
        }
    }
}

/// `engine_version` names a release with option data, and `engine_args`
/// are options that release accepts.
fn check_engine_options(
    f: &Fields<'_>,
    cx: &mut Cx,
    engine: Engine,
    engine_version: Option<&str>,
    args: &[String],
) {
    let version = match engine_version.map(|text| resolve_engine_version(engine, text)) {
        None => None,
        Some(Ok(version)) => Some(version),
        Some(Err(why)) => {
            f.report(cx, "engine_version", why);
            return;
        }
    };
    let Some(data) = options_for(engine, version) else {
        return;
    };
    // An item holding a flag and its value is reported above; the engine
    // would read it as a stray argument, which says less.
    if args
        .iter()
        .any(|a| a.starts_with("--") && a.contains(char::is_whitespace) && !a.contains('='))
    {
        return;
    }
    for problem in crate::engine_args::check_engine_args(data, args) {
        cx.report(
            f.item_pos("engine_args", problem.index),
            &f.path().field("engine_args").index(problem.index),
            problem.message,
        );
    }
}

fn check_env(f: &Fields<'_>, cx: &mut Cx, env: &BTreeMap<String, String>) {
    let at = f.node("env").map_or(f.pos(), |n| n.pos);
    for key in env.keys() {
        let path = f.path().field("env").field(key);
        if MANAGED_ENV.contains(&key.as_str()) {
            cx.report(
                at,
                &path,
                format!("{key} is set by llmgw from the placement and the node; remove it"),
            );
        } else if key.is_empty()
            || key.starts_with(|c: char| c.is_ascii_digit())
            || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            cx.report(
                at,
                &path,
                format!("{key:?} is not a valid environment variable name"),
            );
        }
    }
}
