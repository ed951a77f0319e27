use super::*;
use crate::flags::{sglang_parser, vllm_parser};
use crate::persona::Persona;

fn args(text: &str) -> Vec<String> {
    text.split_whitespace().map(str::to_string).collect()
}

fn vllm(version: &str) -> Parser {
    vllm_parser(Persona::parse(version).unwrap())
}

#[test]
fn vllm_aliases_underscores_and_equals_agree() {
    let p = vllm("vllm=0.34.0");
    for line in [
        "M -tp 4 --pipeline-parallel-size 2",
        "M --tensor_parallel_size 4 -pp 2",
        "M --tensor-parallel-size=4 --pipeline_parallel_size=2",
        "--tensor-parallel-size 4 M -pp=2",
    ] {
        let parsed = p
            .parse(&args(line))
            .unwrap_or_else(|e| panic!("{line}: {e}"));
        assert_eq!(parsed.int("tensor-parallel-size"), Some(4), "{line}");
        assert_eq!(parsed.int("pipeline-parallel-size"), Some(2), "{line}");
        assert_eq!(parsed.positional.as_deref(), Some("M"), "{line}");
    }
}

#[test]
fn nnodes_exists_only_from_0_11_1() {
    let old = vllm("vllm=0.11.0").parse(&args("M -n 2")).unwrap_err();
    assert_eq!(old.message, "unrecognized arguments: -n 2");
    let new = vllm("vllm=0.11.1").parse(&args("M -n 2 -r 1")).unwrap();
    assert_eq!(new.int("nnodes"), Some(2));
    assert_eq!(new.int("node-rank"), Some(1));
}

#[test]
fn unknown_flag_and_bad_choice_read_like_argparse() {
    let err = vllm("vllm").parse(&args("M --foo")).unwrap_err();
    assert_eq!(
        err.to_string(),
        "usage: vllm serve [model_tag] [options]\nvllm serve: error: unrecognized arguments: --foo"
    );
    let err = vllm("vllm").parse(&args("M --dtype int3")).unwrap_err();
    assert!(
        err.message
            .starts_with("argument --dtype: invalid choice: 'int3' (choose from 'auto', 'half'"),
        "{}",
        err.message
    );
    let err = vllm("vllm").parse(&args("M --port abc")).unwrap_err();
    assert_eq!(err.message, "argument --port: invalid int value: 'abc'");
    let err = vllm("vllm").parse(&args("M --port")).unwrap_err();
    assert_eq!(err.message, "argument --port: expected one argument");
}

#[test]
fn sglang_tp_abbreviates_tp_size() {
    let p = sglang_parser(Persona::parse("sglang").unwrap());
    let parsed = p
        .parse(&args(
            "--model-path M --tp 16 --dist-init-addr 10.0.0.1:20000",
        ))
        .unwrap();
    assert_eq!(parsed.int("tensor-parallel-size"), Some(16));
    let parsed = p.parse(&args("--model M --tp=2")).unwrap();
    assert_eq!(parsed.int("tensor-parallel-size"), Some(2));
    let err = p.parse(&args("--tp 2")).unwrap_err();
    assert_eq!(
        err.message,
        "the following arguments are required: --model-path/--model"
    );
}

#[test]
fn boolean_optional_has_a_negative_form() {
    let parsed = vllm("vllm")
        .parse(&args("M --no-enable-prefix-caching"))
        .unwrap();
    assert_eq!(parsed.flag("enable-prefix-caching"), Some(false));
    let err = vllm("vllm")
        .parse(&args("M --enforce-eager=yes"))
        .unwrap_err();
    assert_eq!(
        err.message,
        "argument --enforce-eager/--no-enforce-eager: ignored explicit argument 'yes'"
    );
}

#[test]
fn vllm_optimisation_level_may_be_joined() {
    let parsed = vllm("vllm").parse(&args("M -O3")).unwrap();
    assert_eq!(parsed.str("compilation-config"), Some("3"));
}

#[test]
fn served_model_name_takes_several_names() {
    let parsed = vllm("vllm")
        .parse(&args("M --served-model-name a b --port 1"))
        .unwrap();
    assert_eq!(
        parsed.list("served-model-name").unwrap(),
        &["a".to_string(), "b".to_string()]
    );
}

#[test]
fn disable_log_requests_parses_in_both_releases() {
    assert!(
        vllm("vllm=0.11.0")
            .parse(&args("M --disable-log-requests"))
            .is_ok()
    );
    assert!(
        vllm("vllm=0.34.0")
            .parse(&args("M --disable-log-requests"))
            .is_ok()
    );
    assert!(
        vllm("vllm=0.11.0")
            .parse(&args("M --shutdown-timeout 5"))
            .is_err()
    );
}
