//! Entry point: decides which program the binary is standing in for, parses
//! its command line the way that program does, and runs it.

use crate::config::ServeConfig;
use crate::engine_cli;
use crate::knobs::{Knobs, ProcessEnv};
use crate::logs::Logger;
use crate::persona::{Engine, Persona};

const TOP_USAGE: &str = "usage: vllm [-h] [-v] {chat,complete,serve,bench,collect-env,run-batch} ...\n\
vllm: error: argument subparser: invalid choice";

/// Runs the simulator with `args` (argv without the program name) and
/// returns the exit code, unless the persona ends the process itself.
pub fn main_with_args(args: &[String]) -> i32 {
    match args.first().map(String::as_str) {
        Some(crate::workers::WORKER_MODE) => crate::workers::worker_main(),
        Some(crate::ray::DAEMON_MODE) => crate::ray::daemon_main(&args[1..]),
        Some("serve") => engine_main(Engine::Vllm, &args[1..]),
        Some("-m") if args.get(1).map(String::as_str) == Some("sglang.launch_server") => {
            engine_main(Engine::Sglang, &args[2..])
        }
        Some("-m") => {
            let module = args.get(1).map(String::as_str).unwrap_or("");
            eprintln!("/usr/bin/python3: No module named {module}");
            1
        }
        Some("start" | "status" | "stop") => crate::ray::cli(args),
        // Version probes a supervisor may run before launching.
        Some("--version" | "-v") => {
            println!("{}", persona_or_current(Engine::Vllm).version_string());
            0
        }
        Some("-c") => version_probe(args.get(1).map(String::as_str).unwrap_or("")),
        Some(other) => {
            eprintln!(
                "{TOP_USAGE}: '{other}' (choose from 'chat', 'complete', 'serve', 'bench', 'collect-env', 'run-batch')\n\n\
                 llmgw-engine-sim stands in for `vllm serve MODEL`, `python -m sglang.launch_server` and `ray start|status|stop`."
            );
            2
        }
        None => {
            eprintln!(
                "llmgw-engine-sim: give a command line of vLLM (`serve MODEL ...`), SGLang (`-m sglang.launch_server ...`) or Ray (`start|status|stop ...`)"
            );
            2
        }
    }
}

/// The persona from the environment alone (no command line to read).
fn persona_or_current(engine: Engine) -> Persona {
    choose_persona(engine, &[]).unwrap_or_else(|_| Persona::current(engine))
}

/// `python -c "import sglang; print(sglang.__version__)"` and the vLLM
/// equivalent: prints the persona's version; other code is not run.
fn version_probe(code: &str) -> i32 {
    let engine = if code.contains("sglang") {
        Engine::Sglang
    } else if code.contains("vllm") {
        Engine::Vllm
    } else {
        eprintln!("llmgw-engine-sim: `-c` runs only version probes of vllm or sglang, not: {code}");
        return 1;
    };
    if code.contains("__version__") {
        println!("{}", persona_or_current(engine).version_string());
    }
    0
}

/// The persona for `engine`: `--sim-persona`, then `LLMGW_SIM_PERSONA`
/// (a comma list such as `vllm=0.11.0,sglang=0.5.10` may name both).
fn choose_persona(
    engine: Engine,
    args: &[String],
) -> Result<Persona, crate::persona::PersonaError> {
    let mut flag = None;
    for (i, a) in args.iter().enumerate() {
        if let Some(v) = a
            .strip_prefix("--sim-persona=")
            .or_else(|| a.strip_prefix("--sim_persona="))
        {
            flag = Some(v.to_string());
        } else if a == "--sim-persona" || a == "--sim_persona" {
            flag = args.get(i + 1).cloned();
        }
    }
    let text = flag.or_else(|| {
        std::env::var("LLMGW_SIM_PERSONA")
            .ok()
            .filter(|s| !s.is_empty())
    });
    let Some(text) = text else {
        return Ok(Persona::current(engine));
    };
    let mut chosen = Persona::current(engine);
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let persona = Persona::parse(item)?;
        if persona.engine == engine {
            chosen = persona;
        }
    }
    Ok(chosen)
}

/// Reads a vLLM `--config` YAML file of `key: value` lines into arguments.
fn config_file_args(path: &str) -> Result<Vec<String>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read config file {path}: {e}"))?;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let (key, value) = line
            .split_once(':')
            .ok_or_else(|| format!("{path}:{}: expected `key: value`, got `{line}`", n + 1))?;
        let value = value.trim().trim_matches(['"', '\'']);
        match value {
            "true" | "True" => out.push(format!("--{}", key.trim())),
            "false" | "False" => {}
            _ => {
                out.push(format!("--{}", key.trim()));
                out.push(value.to_string());
            }
        }
    }
    Ok(out)
}

/// The command line without `--config FILE` (its options are merged in).
fn drop_config_option(args: &[String]) -> Vec<String> {
    let mut out = Vec::with_capacity(args.len());
    let mut i = 0;
    while i < args.len() {
        if args[i] == "--config" {
            i += 2;
            continue;
        }
        out.push(args[i].clone());
        i += 1;
    }
    out
}

fn engine_main(engine: Engine, args: &[String]) -> i32 {
    let persona = match choose_persona(engine, args) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("llmgw-engine-sim: {e}");
            return 2;
        }
    };
    let (sim_flags, engine_args) = engine_cli::split_sim_flags(args);
    let mut parsed = match engine_cli::parse(persona, &engine_args) {
        Ok(p) => p,
        Err(e) => {
            eprint!("{}", e.stderr());
            return 2;
        }
    };
    if parsed.help {
        println!("{}", engine_cli::usage(persona));
        return 0;
    }
    if engine == Engine::Vllm
        && let Some(path) = parsed.str("config").map(str::to_string)
    {
        // Options from the file come first so the command line wins.
        let mut merged = match config_file_args(&path) {
            Ok(a) => a,
            Err(e) => {
                eprintln!("{}: error: {e}", engine_cli::prog(persona));
                return 2;
            }
        };
        merged.extend(engine_args.iter().cloned());
        let without_config = drop_config_option(&merged);
        parsed = match engine_cli::parse(persona, &without_config) {
            Ok(p) => p,
            Err(e) => {
                eprint!("{}", e.stderr());
                return 2;
            }
        };
    }
    let knobs = match Knobs::resolve(&sim_flags, &ProcessEnv) {
        Ok(k) => k,
        Err(errors) => {
            for e in errors {
                eprintln!("llmgw-engine-sim: {e}");
            }
            return 2;
        }
    };
    let cfg = match ServeConfig::resolve(persona, &parsed, knobs, &ProcessEnv) {
        Ok(c) => c,
        Err(e) => {
            eprintln!(
                "{}\n{}: error: {e}",
                engine_cli::usage(persona),
                engine_cli::prog(persona)
            );
            return 2;
        }
    };
    let runtime = match llmgw_runtime::multi_thread_runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("llmgw-engine-sim: cannot start the async runtime: {e}");
            return 1;
        }
    };
    let pid = std::process::id();
    let log = Logger {
        persona,
        api_pid: pid,
        core_pid: pid,
    };
    let ending = runtime.block_on(crate::serve::run(cfg, log));
    crate::sys::finish(ending)
}
