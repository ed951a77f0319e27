//! The converters against the real ones' recorded probes, and the checks a
//! profile's `engine_args` get.

use llmgw_engine_options::convert::{ConvertError, Converter};
use llmgw_engine_options::{Engine, Version, check_engine_args, embedded_files, options};

#[test]
fn every_known_converter_matches_the_recorded_probes() {
    let mut failures = Vec::new();
    for (engine, version, _) in embedded_files() {
        let data = options(engine, version).unwrap();
        for (name, info) in &data.types {
            let converter = Converter::new(engine, Some(name), Some(info));
            if !converter.known || converter.is_partial() {
                continue;
            }
            for (input, probe) in &info.probes {
                let got = converter.convert(input);
                let agrees = match (&got, probe) {
                    // `"value": null` reads as no value: a probe that
                    // neither failed nor raised gave None.
                    (Ok(value), p)
                        if p.argument_type_error.is_none()
                            && p.invalid.is_none()
                            && p.raises.is_none() =>
                    {
                        p.value.clone().unwrap_or_default() == *value
                    }
                    (Err(ConvertError::Message(m)), p) => {
                        p.argument_type_error.as_deref() == Some(m)
                    }
                    (Err(ConvertError::Invalid), p) => p.invalid.is_some(),
                    _ => false,
                };
                if !agrees {
                    failures.push(format!(
                        "{engine} {version} {name}({input:?}): {got:?}, the engine {probe:?}"
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn args(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

#[test]
fn a_vllm_flag_given_to_sglang_suggests_the_sglang_name() {
    let data = options(Engine::Sglang, Version::new(0, 5, 23)).unwrap();
    let problems = check_engine_args(data, &args(&["--max-model-len", "8192"]));
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(problems[0].index, 0);
    assert_eq!(
        problems[0].message,
        "--max-model-len is not an option of sglang 0.5.23; did you mean --context-length (vLLM calls it --max-model-len)?"
    );
}

#[test]
fn every_problem_is_reported_with_its_item() {
    let data = options(Engine::Vllm, Version::new(0, 34, 0)).unwrap();
    let problems = check_engine_args(
        data,
        &args(&[
            "--max-model-len",
            "8k",
            "--dtype",
            "int3",
            "--enforce-eager",
            "yes",
            "--max-num-seq",
            "8",
            "--gpu-memory-utilisation",
            "0.8",
            "--kv-cache-dtype",
        ]),
    );
    let got: Vec<(usize, &str)> = problems
        .iter()
        .map(|p| (p.index, p.message.as_str()))
        .collect();
    assert_eq!(got.len(), 4, "{got:#?}");
    assert_eq!(got[0].0, 2);
    assert!(
        got[0]
            .1
            .starts_with("vllm 0.34.0 refuses it: argument --dtype: invalid choice: 'int3'"),
        "{}",
        got[0].1
    );
    assert_eq!(
        got[1],
        (
            4,
            "--enforce-eager does not take yes: vllm 0.34.0 refuses it (unrecognized arguments: yes)"
        )
    );
    assert!(got[2].1.starts_with("--gpu-memory-utilisation is not an option of vllm 0.34.0; did you mean --gpu-memory-utilization"), "{}", got[2].1);
    assert_eq!(
        got[3],
        (
            10,
            "vllm 0.34.0 refuses it: argument --kv-cache-dtype: expected one argument"
        )
    );
}

#[test]
fn sglang_refuses_underscores_and_says_which_spelling_it_takes() {
    let data = options(Engine::Sglang, Version::new(0, 5, 23)).unwrap();
    let problems = check_engine_args(
        data,
        &args(&["--max_total_tokens", "8192", "--enable-prefix-caching"]),
    );
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(
        problems[0]
            .message
            .contains("did you mean --max-total-tokens"),
        "{}",
        problems[0].message
    );
    assert!(
        problems[1]
            .message
            .contains("SGLang caches prefixes by default"),
        "{}",
        problems[1].message
    );
}

#[test]
fn good_arguments_pass() {
    let data = options(Engine::Sglang, Version::new(0, 5, 23)).unwrap();
    assert!(
        check_engine_args(
            data,
            &args(&[
                "--context-length",
                "8192",
                "--enable-metrics",
                "--chunked-prefill-size=4096"
            ])
        )
        .is_empty()
    );
    let data = options(Engine::Vllm, Version::new(0, 11, 1)).unwrap();
    assert!(
        check_engine_args(
            data,
            &args(&[
                "--max_model_len=8k",
                "--no-enable-prefix-caching",
                "-O3",
                "--max-num-seqs",
                "64"
            ])
        )
        .is_empty()
    );
}
