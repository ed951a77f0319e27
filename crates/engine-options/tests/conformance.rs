//! Every verdict the real parsers gave, recorded in each embedded data
//! file's `cases`, is the emulator's verdict too: the same exit status, the
//! same error text (usage block included), the same parsed values and the
//! same deprecation warnings in the same order.
//!
//! A few cases depend on what the emulator deliberately leaves out; each
//! such group is named and counted below, and kept small.

use std::collections::BTreeMap;

use llmgw_engine_options::{EngineOptions, Parsed, Parser, embedded_files};
use serde::Deserialize;
use serde_json::Value;

#[derive(Deserialize)]
struct Cases {
    cases: Vec<Case>,
    #[serde(flatten)]
    rest: BTreeMap<String, Value>,
}

#[derive(Deserialize)]
struct Case {
    argv: Vec<String>,
    exit: i32,
    #[serde(default)]
    parsed: Option<BTreeMap<String, Value>>,
    #[serde(default)]
    usage_block: Option<String>,
    #[serde(default)]
    stderr: Option<String>,
    /// Compacted form: stderr was exactly usage, then `prog: error: ` this.
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    stdout: Option<String>,
    #[serde(default)]
    log: Vec<LogRecord>,
}

#[derive(Deserialize)]
struct LogRecord {
    level: String,
    message: String,
}

/// Why a recorded case is not compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Skip {
    /// The engine raised before argparse decided (exit 1): `--model` in
    /// some vLLM releases, a `--config` without a file, an IndexError.
    EngineException,
    /// `--config FILE` reads a YAML file the generator wrote.
    ConfigFile,
    /// vLLM's pydantic models (`--compilation-config`...) refuse values
    /// with pydantic's report, which is not reproduced.
    PydanticVerdict,
}

impl Case {
    fn expected_stderr(&self, data: &BTreeMap<String, Value>, options: &EngineOptions) -> String {
        if let Some(message) = &self.error {
            return format!(
                "usage: {}\n{}: error: {message}\n",
                options.usage, options.prog
            );
        }
        let tail = self.stderr.clone().unwrap_or_default();
        match &self.usage_block {
            Some(block) => {
                let usage = data.get(block).and_then(Value::as_str).unwrap_or_default();
                format!("usage: {usage}\n{tail}")
            }
            None => tail,
        }
    }

    fn warnings(&self) -> Vec<String> {
        self.log
            .iter()
            .filter(|r| r.level == "WARNING")
            .map(|r| r.message.clone())
            .collect()
    }

    fn skip(&self, parser: &Parser<'_>, expected_stderr: &str) -> Option<Skip> {
        if self.exit == 1 {
            return Some(Skip::EngineException);
        }
        if self
            .argv
            .iter()
            .any(|a| a == "--config" || a.starts_with("--config="))
        {
            return Some(Skip::ConfigFile);
        }
        let partial_refusal = parser.actions().iter().any(|a| {
            a.converter.is_partial()
                && !a.arg.flags.is_empty()
                && expected_stderr.contains(&format!("argument {}: ", a.arg.display_name()))
        });
        (self.exit == 2 && partial_refusal).then_some(Skip::PydanticVerdict)
    }
}

/// Dests whose recorded value is a Python object's repr (a pydantic model,
/// vLLM's LoRA module paths): compared by verdict only.
fn opaque(parser: &Parser<'_>, dest: &str, expected: &Value) -> bool {
    let action = parser.actions().iter().find(|a| a.arg.dest == dest);
    let custom = action.is_some_and(|a| {
        a.converter.is_partial() || !a.converter.known || a.arg.action == "LoRAParserAction"
    });
    let repr = expected
        .as_str()
        .is_some_and(|s| s.contains('(') && s.ends_with(')'));
    custom || repr
}

fn compare_parsed(
    parser: &Parser<'_>,
    baseline: &Parsed,
    ours: &Parsed,
    recorded: &BTreeMap<String, Value>,
) -> Result<(), String> {
    for (dest, expected) in recorded {
        if opaque(parser, dest, expected) {
            continue;
        }
        let got = ours.values.get(dest).cloned().unwrap_or(Value::Null);
        if !same(&got, expected) {
            return Err(format!("{dest}: parsed {got}, the engine {expected}"));
        }
    }
    for (dest, value) in &ours.values {
        let before = baseline.values.get(dest).cloned().unwrap_or(Value::Null);
        if !same(value, &before) && !recorded.contains_key(dest) && !opaque(parser, dest, value) {
            return Err(format!(
                "{dest}: changed to {value} here, the engine left it unchanged"
            ));
        }
    }
    Ok(())
}

/// JSON equality where `1.0` and `1.0` read from text are the same float.
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            x.is_f64() == y.is_f64() && x.as_f64() == y.as_f64()
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}

#[test]
fn the_emulator_agrees_with_every_recorded_verdict() {
    let mut report = Vec::new();
    let mut failures = Vec::new();
    for (engine, version, text) in embedded_files() {
        let file: Cases = serde_json::from_str(text).expect("cases parse");
        let options = llmgw_engine_options::options(engine, version).expect("embedded");
        let parser = Parser::new(options);
        let baseline_argv = &file.cases[0].argv;
        let baseline = parser
            .parse(baseline_argv)
            .expect("the baseline case parses");
        let mut checked = 0;
        let mut skipped: BTreeMap<Skip, usize> = BTreeMap::new();
        for case in &file.cases {
            let expected_stderr = case.expected_stderr(&file.rest, options);
            if let Some(why) = case.skip(&parser, &expected_stderr) {
                *skipped.entry(why).or_default() += 1;
                continue;
            }
            checked += 1;
            let outcome = parser.parse(&case.argv);
            let problem = match (&outcome, case.exit) {
                (Ok(parsed), 0) if case.stdout.is_some() => {
                    (!parsed.help).then(|| "the engine printed help; here no help".to_string())
                }
                (Ok(parsed), 0) => {
                    let recorded = case.parsed.clone().unwrap_or_default();
                    compare_parsed(&parser, &baseline, parsed, &recorded)
                        .err()
                        .or_else(|| {
                            (parsed.warnings != case.warnings()).then(|| {
                                format!(
                                    "warnings {:?}, the engine {:?}",
                                    parsed.warnings,
                                    case.warnings()
                                )
                            })
                        })
                }
                (Err(error), 2) => (error.stderr() != expected_stderr).then(|| {
                    format!(
                        "stderr differs:\n  here:   {:?}\n  engine: {:?}",
                        error.stderr().lines().last(),
                        expected_stderr.lines().last()
                    )
                }),
                (Ok(_), exit) => Some(format!(
                    "accepted here, the engine exited {exit}: {:?}",
                    expected_stderr.lines().last()
                )),
                (Err(error), exit) => Some(format!(
                    "refused here ({}), the engine exited {exit}",
                    error.message
                )),
            };
            if let Some(problem) = problem {
                failures.push(format!("{engine} {version} {:?}: {problem}", case.argv));
            }
        }
        report.push(format!(
            "{engine} {version}: {checked} cases checked, skipped {skipped:?}"
        ));
        let skipped_total: usize = skipped.values().sum();
        if skipped_total * 20 > file.cases.len() {
            failures.push(format!(
                "{engine} {version}: {skipped_total} of {} cases skipped; at most 5% may be",
                file.cases.len()
            ));
        }
    }
    println!("{}", report.join("\n"));
    assert!(
        failures.is_empty(),
        "{} disagreements:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
