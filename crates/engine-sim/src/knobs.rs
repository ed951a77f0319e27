//! The simulator's own settings: pace, memory, faults and seed.
//!
//! Each knob comes from a `--sim-*` flag or an `LLMGW_SIM_*` variable (the
//! flag wins), because the agent launches the simulator with the engine's
//! own command line and can only add environment.

use std::collections::HashMap;
use std::time::Duration;

/// Bad knob values, named by the variable or flag that carried them.
#[derive(Debug, thiserror::Error)]
pub enum KnobError {
    #[error(
        "{source_name}: cannot read duration '{value}'; expected a number with a unit: 2s, 20ms, 1.5s, 500us, 1m"
    )]
    Duration { source_name: String, value: String },
    #[error("{source_name}: cannot read number '{value}'")]
    Number { source_name: String, value: String },
    #[error("{source_name}: unknown fault '{value}'; {hint}")]
    Fault {
        source_name: String,
        value: String,
        hint: String,
    },
}

/// A fault to inject (see docs/engine-sim.md for the grammar).
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    /// Fail while loading with the engine's error tail.
    CrashOnLoad(LoadCrash),
    /// Stop logging after a phase and never serve nor exit.
    HangOnLoad(LoadPhase),
    /// Die like a CUDA OOM once this many tokens have been generated.
    OomAfterTokens(u64),
    /// Break every stream after this many content tokens.
    CrashMidStream {
        mode: StreamCrash,
        after_tokens: u64,
    },
    /// Multiply the inter-token latency.
    SlowTokens(f64),
    /// Add to every time to first token.
    TtftSpike(Duration),
    /// Requests stop producing tokens after the first one and never finish.
    Stall,
    /// `/health` answers 503 once serving.
    Unhealthy,
    /// `/metrics` answers 500 (a metrics endpoint that breaks under load
    /// while the engine keeps serving).
    MetricsError,
    /// SIGTERM is ignored by the engine and its workers, from the start
    /// (an engine stuck in a CUDA call), so only SIGKILL ends them.
    IgnoreSigterm,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadCrash {
    KvCache,
    Oom,
    FreeMemory,
    Arch,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadPhase {
    Distributed,
    Weights,
    KvCache,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamCrash {
    /// Close the connection without `[DONE]`.
    Cut,
    /// Send `data: {"error":...}` then `[DONE]`.
    ErrorEvent,
    /// Close the connection once the answer is over (its finish reason
    /// sent), before the usage event and `[DONE]`.
    CutAfterFinish,
}

/// All knobs, resolved.
#[derive(Debug, Clone)]
pub struct Knobs {
    pub load_time: Duration,
    pub ttft: Duration,
    pub itl: Duration,
    pub gpu_memory_gb: f64,
    /// GPUs on this node when `CUDA_VISIBLE_DEVICES` is unset.
    pub node_gpus: u64,
    pub faults: Vec<Fault>,
    pub seed: u64,
    /// Fixed completion length; `None` draws 16..=64 tokens per request.
    pub output_tokens: Option<u64>,
    /// Prefill time per prompt token not found in the prefix cache. One
    /// prefill runs at a time per engine (it is compute-bound), so uncached
    /// prompts queue behind each other as on a real GPU.
    pub prefill_per_token: Duration,
    /// Caps the prefix cache below the KV cache the load sized (to make a
    /// small fleet's cache a small share of a workload).
    pub prefix_cache_tokens: Option<u64>,
    /// vLLM sleep mode: how long `/sleep` takes to offload the weights,
    /// and `/wake_up` to bring them back.
    pub sleep_time: Duration,
    pub wake_time: Duration,
}

/// Defaults, chosen so that tests are fast.
pub const DEFAULT_LOAD_TIME: Duration = Duration::from_secs(2);
pub const DEFAULT_TTFT: Duration = Duration::from_millis(20);
pub const DEFAULT_ITL: Duration = Duration::from_millis(5);
/// About 50,000 prompt tokens a second: a small model on one GPU.
pub const DEFAULT_PREFILL_PER_TOKEN: Duration = Duration::from_micros(20);
/// A small model's weights to CPU memory and back (vLLM reports tenths
/// of a second to a few seconds, against minutes for a cold start).
pub const DEFAULT_SLEEP_TIME: Duration = Duration::from_millis(200);
pub const DEFAULT_WAKE_TIME: Duration = Duration::from_millis(500);
pub const DEFAULT_GPU_MEMORY_GB: f64 = 80.0;
pub const DEFAULT_NODE_GPUS: u64 = 8;

/// Parses `2s`, `20ms`, `1.5s`, `500us`, `1m`, `0`.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    if text == "0" {
        return Some(Duration::ZERO);
    }
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    let seconds = match unit {
        "us" => number / 1e6,
        "ms" => number / 1e3,
        "s" => number,
        "m" => number * 60.0,
        "h" => number * 3600.0,
        _ => return None,
    };
    Duration::try_from_secs_f64(seconds).ok()
}

const FAULT_HINT: &str = "expected a comma-separated list of crash_on_load:{kv_cache|oom|free_memory|arch}, \
hang_on_load[:{distributed|weights|kv_cache}], oom_after_tokens:N, crash_mid_stream:{cut|error_event}[@N], crash_mid_stream:cut_after_finish, \
slow_tokens:Nx, ttft_spike:DURATION, stall, unhealthy, ignore_sigterm";

/// Parses the fault grammar: `name[:arg]` items separated by commas.
pub fn parse_faults(text: &str, source_name: &str) -> Result<Vec<Fault>, KnobError> {
    let mut faults = Vec::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let bad = || KnobError::Fault {
            source_name: source_name.into(),
            value: item.into(),
            hint: FAULT_HINT.into(),
        };
        let (name, arg) = match item.split_once(':') {
            Some((n, a)) => (n, Some(a)),
            None => (item, None),
        };
        let fault = match (name, arg) {
            ("crash_on_load", Some(kind)) => Fault::CrashOnLoad(match kind {
                "kv_cache" => LoadCrash::KvCache,
                "oom" => LoadCrash::Oom,
                "free_memory" => LoadCrash::FreeMemory,
                "arch" => LoadCrash::Arch,
                _ => return Err(bad()),
            }),
            ("hang_on_load", phase) => Fault::HangOnLoad(match phase.unwrap_or("distributed") {
                "distributed" => LoadPhase::Distributed,
                "weights" => LoadPhase::Weights,
                "kv_cache" => LoadPhase::KvCache,
                _ => return Err(bad()),
            }),
            ("oom_after_tokens", Some(n)) => Fault::OomAfterTokens(n.parse().map_err(|_| bad())?),
            ("crash_mid_stream", Some(spec)) => {
                let (mode, after) = match spec.split_once('@') {
                    Some((m, n)) => (m, n.parse().map_err(|_| bad())?),
                    None if spec == "cut_after_finish" => (spec, u64::MAX),
                    None => (spec, 3),
                };
                let mode = match mode {
                    "cut" => StreamCrash::Cut,
                    "error_event" => StreamCrash::ErrorEvent,
                    "cut_after_finish" if after == u64::MAX => StreamCrash::CutAfterFinish,
                    _ => return Err(bad()),
                };
                Fault::CrashMidStream {
                    mode,
                    after_tokens: after,
                }
            }
            ("slow_tokens", Some(factor)) => {
                let factor: f64 = factor.trim_end_matches('x').parse().map_err(|_| bad())?;
                if !(factor.is_finite() && factor > 0.0) {
                    return Err(bad());
                }
                Fault::SlowTokens(factor)
            }
            ("ttft_spike", Some(d)) => Fault::TtftSpike(parse_duration(d).ok_or_else(bad)?),
            ("stall", None) => Fault::Stall,
            ("unhealthy", None) => Fault::Unhealthy,
            ("metrics_error", None) => Fault::MetricsError,
            ("ignore_sigterm", None) => Fault::IgnoreSigterm,
            _ => return Err(bad()),
        };
        faults.push(fault);
    }
    Ok(faults)
}

/// Where knob values come from; tests pass a map instead of the process env.
pub trait Env {
    fn get(&self, key: &str) -> Option<String>;
}

/// The process environment.
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn get(&self, key: &str) -> Option<String> {
        // Empty values are kept: `CUDA_VISIBLE_DEVICES=""` means no GPUs.
        std::env::var(key).ok()
    }
}

impl Env for HashMap<String, String> {
    fn get(&self, key: &str) -> Option<String> {
        HashMap::get(self, key).cloned()
    }
}

impl Knobs {
    /// Resolves every knob, flag first, then environment, then default, and
    /// reports every bad value at once.
    /// `flags` holds the `--sim-*` flags of the command line by name
    /// (`sim-ttft`).
    pub fn resolve(flags: &HashMap<String, String>, env: &dyn Env) -> Result<Self, Vec<KnobError>> {
        let mut errors = Vec::new();
        let lookup = |flag: &str, var: &str| -> Option<(String, String)> {
            flags
                .get(flag)
                .map(|v| (format!("--{flag}"), v.clone()))
                .or_else(|| {
                    env.get(var)
                        .filter(|v| !v.is_empty())
                        .map(|v| (var.to_string(), v))
                })
        };
        let mut duration = |flag: &str, var: &str, default: Duration| match lookup(flag, var) {
            None => default,
            Some((source_name, value)) => parse_duration(&value).unwrap_or_else(|| {
                errors.push(KnobError::Duration { source_name, value });
                default
            }),
        };
        let load_time = duration("sim-load-time", "LLMGW_SIM_LOAD_TIME", DEFAULT_LOAD_TIME);
        let ttft = duration("sim-ttft", "LLMGW_SIM_TTFT", DEFAULT_TTFT);
        let itl = duration("sim-itl", "LLMGW_SIM_ITL", DEFAULT_ITL);
        let prefill_per_token = duration(
            "sim-prefill-per-token",
            "LLMGW_SIM_PREFILL_PER_TOKEN",
            DEFAULT_PREFILL_PER_TOKEN,
        );
        let sleep_time = duration("sim-sleep-time", "LLMGW_SIM_SLEEP_TIME", DEFAULT_SLEEP_TIME);
        let wake_time = duration("sim-wake-time", "LLMGW_SIM_WAKE_TIME", DEFAULT_WAKE_TIME);
        let mut number = |flag: &str, var: &str| -> Option<f64> {
            let (source_name, value) = lookup(flag, var)?;
            match value.trim().parse::<f64>() {
                Ok(n) if n.is_finite() && n >= 0.0 => Some(n),
                _ => {
                    errors.push(KnobError::Number { source_name, value });
                    None
                }
            }
        };
        let gpu_memory_gb =
            number("sim-gpu-memory-gb", "LLMGW_SIM_GPU_MEMORY_GB").unwrap_or(DEFAULT_GPU_MEMORY_GB);
        let node_gpus = number("sim-gpus", "LLMGW_SIM_GPUS")
            .map(|n| n as u64)
            .unwrap_or(DEFAULT_NODE_GPUS);
        let seed = number("sim-seed", "LLMGW_SIM_SEED")
            .map(|n| n as u64)
            .unwrap_or_else(seed_from_clock);
        let output_tokens =
            number("sim-output-tokens", "LLMGW_SIM_OUTPUT_TOKENS").map(|n| n as u64);
        let prefix_cache_tokens =
            number("sim-prefix-cache-tokens", "LLMGW_SIM_PREFIX_CACHE_TOKENS").map(|n| n as u64);
        let faults = match lookup("sim-fault", "LLMGW_SIM_FAULT") {
            None => Vec::new(),
            Some((source_name, value)) => parse_faults(&value, &source_name).unwrap_or_else(|e| {
                errors.push(e);
                Vec::new()
            }),
        };
        if !errors.is_empty() {
            return Err(errors);
        }
        Ok(Self {
            load_time,
            ttft,
            itl,
            gpu_memory_gb,
            node_gpus,
            faults,
            seed,
            output_tokens,
            prefill_per_token,
            prefix_cache_tokens,
            sleep_time,
            wake_time,
        })
    }

    pub fn fault(&self, pick: impl Fn(&Fault) -> bool) -> Option<&Fault> {
        self.faults.iter().find(|f| pick(f))
    }

    pub fn itl_factor(&self) -> f64 {
        self.faults
            .iter()
            .find_map(|f| {
                if let Fault::SlowTokens(x) = f {
                    Some(*x)
                } else {
                    None
                }
            })
            .unwrap_or(1.0)
    }
}

fn seed_from_clock() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    nanos ^ (u64::from(std::process::id()) << 32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_units() {
        assert_eq!(parse_duration("2s"), Some(Duration::from_secs(2)));
        assert_eq!(parse_duration("20ms"), Some(Duration::from_millis(20)));
        assert_eq!(parse_duration("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_duration("0"), Some(Duration::ZERO));
        assert_eq!(parse_duration("2"), None);
        assert_eq!(parse_duration("fast"), None);
    }

    #[test]
    fn fault_grammar_reads_every_form() {
        let faults = parse_faults(
            "crash_mid_stream:cut@5, slow_tokens:10x,stall,hang_on_load,ignore_sigterm",
            "X",
        )
        .unwrap();
        assert_eq!(
            faults,
            vec![
                Fault::CrashMidStream {
                    mode: StreamCrash::Cut,
                    after_tokens: 5
                },
                Fault::SlowTokens(10.0),
                Fault::Stall,
                Fault::HangOnLoad(LoadPhase::Distributed),
                Fault::IgnoreSigterm,
            ]
        );
        let err = parse_faults("crash_on_load:meteor", "LLMGW_SIM_FAULT")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("LLMGW_SIM_FAULT: unknown fault 'crash_on_load:meteor'"),
            "{err}"
        );
        assert_eq!(
            parse_faults("crash_mid_stream:cut_after_finish", "X").unwrap(),
            vec![Fault::CrashMidStream {
                mode: StreamCrash::CutAfterFinish,
                after_tokens: u64::MAX
            }]
        );
        assert!(parse_faults("crash_mid_stream:cut_after_finish@3", "X").is_err());
    }

    #[test]
    fn flag_beats_environment_and_all_errors_are_reported() {
        let env: HashMap<String, String> = [
            ("LLMGW_SIM_TTFT".to_string(), "soon".to_string()),
            ("LLMGW_SIM_ITL".to_string(), "later".to_string()),
        ]
        .into();
        let errors = Knobs::resolve(&HashMap::new(), &env).unwrap_err();
        assert_eq!(errors.len(), 2);
        let flags: HashMap<String, String> = [
            ("sim-ttft".to_string(), "1ms".to_string()),
            ("sim-itl".to_string(), "2ms".to_string()),
        ]
        .into();
        let knobs = Knobs::resolve(&flags, &env).unwrap();
        assert_eq!(knobs.ttft, Duration::from_millis(1));
    }
}
