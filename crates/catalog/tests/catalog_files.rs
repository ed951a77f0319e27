//! models.yaml files as operators write them, good and broken. Every broken
//! file must be refused with the line, column and field path of the mistake.

use llmgw_catalog::{Engine, parse_catalog, parse_model};

const GOOD: &str = r#"
models:
  - name: llama-3.1-8b
    aliases: [llama3-8b]
    source: meta-llama/Llama-3.1-8B-Instruct
    replicas: 2
    profiles:
      - name: tp1
        engine: vllm
        gpus_per_node: 1
        min_gpu_memory_gb: 24
        gpu_models: [H100, A100]
        engine_args: ["--max-model-len", "8192"]
  - name: llama-3.1-70b
    source: meta-llama/Llama-3.1-70B-Instruct
    profiles:
      - name: tp8x2
        engine: sglang
        nodes: 2
        gpus_per_node: 8
        tensor_parallel: 16
  - name: partner-model
    endpoints: ["http://10.1.2.3:8000"]
"#;

#[test]
fn a_good_catalog_loads_with_defaults() {
    let catalog = parse_catalog("models.yaml", GOOD).unwrap();
    assert_eq!(catalog.models.len(), 3);
    let small = catalog.resolve("llama3-8b").unwrap();
    assert_eq!(small.name, "llama-3.1-8b");
    let profile = &small.managed().unwrap().profiles[0];
    assert_eq!(
        (
            profile.nodes,
            profile.tensor_parallel,
            profile.pipeline_parallel
        ),
        (1, 1, 1)
    );
    let big = catalog.get("llama-3.1-70b").unwrap();
    assert_eq!(big.desired_replicas(), 1);
    assert_eq!(big.managed().unwrap().profiles[0].engine, Engine::Sglang);
    assert_eq!(
        catalog.get("partner-model").unwrap().static_endpoints(),
        ["http://10.1.2.3:8000"]
    );
}

#[test]
fn an_autoscaled_model_starts_at_its_minimum_and_round_trips() {
    let src = "models:\n  - name: a\n    source: x\n    autoscale: {min_replicas: 2, max_replicas: 6, scale_down_window: 10m}\n    profiles: [{name: p, engine: vllm}]\n";
    let catalog = parse_catalog("models.yaml", src).unwrap();
    let model = &catalog.models[0];
    assert_eq!(model.desired_replicas(), 2);
    let autoscale = model.managed().unwrap().autoscale.unwrap();
    assert_eq!(autoscale.target_requests_per_replica, 8);
    assert_eq!(
        autoscale.scale_up_window,
        std::time::Duration::from_secs(30)
    );
    assert_eq!(
        autoscale.scale_down_window,
        std::time::Duration::from_secs(600)
    );
    let json = serde_json::to_value(&catalog).unwrap();
    assert_eq!(json["models"][0]["autoscale"]["scale_down_window"], "10m");
    let back: llmgw_catalog::Catalog = serde_json::from_value(json.clone()).unwrap();
    assert_eq!(back, catalog);
    assert_eq!(
        parse_catalog("models.json", &json.to_string()).unwrap(),
        catalog
    );
}

#[test]
fn latency_targets_round_trip_and_must_be_more_than_zero() {
    let src = "models:\n  - name: a\n    source: x\n    autoscale: {min_replicas: 1, max_replicas: 3, ttft_p90_slo: 500ms}\n    profiles: [{name: p, engine: vllm}]\n";
    let catalog = parse_catalog("models.yaml", src).unwrap();
    let autoscale = catalog.models[0].managed().unwrap().autoscale.unwrap();
    assert_eq!(
        autoscale.ttft_p90_slo,
        Some(std::time::Duration::from_millis(500))
    );
    let json = serde_json::to_value(&catalog).unwrap();
    assert_eq!(json["models"][0]["autoscale"]["ttft_p90_slo"], "500ms");
    assert_eq!(
        parse_catalog("models.json", &json.to_string()).unwrap(),
        catalog
    );
    // Without a target, nothing is written for it.
    let plain = src.replace(", ttft_p90_slo: 500ms", "");
    let json = serde_json::to_value(parse_catalog("models.yaml", &plain).unwrap()).unwrap();
    assert!(json["models"][0]["autoscale"].get("ttft_p90_slo").is_none());
    let zero = src.replace("500ms", "0s");
    let err = parse_catalog("models.yaml", &zero).unwrap_err().to_string();
    assert!(
        err.contains("models[0].autoscale.ttft_p90_slo: must be more than 0"),
        "{err}"
    );
    let queue = src.replace("ttft_p90_slo: 500ms", "queue_p90_slo: 200ms");
    let autoscale = parse_catalog("models.yaml", &queue).unwrap().models[0]
        .managed()
        .unwrap()
        .autoscale
        .unwrap();
    assert_eq!(
        (autoscale.ttft_p90_slo, autoscale.queue_p90_slo),
        (None, Some(std::time::Duration::from_millis(200)))
    );
    assert!(
        autoscale
            .describe()
            .contains("to keep the queue wait (p90) under 200ms"),
        "{}",
        autoscale.describe()
    );
    let kv = src.replace("ttft_p90_slo: 500ms", "kv_cache_usage_percent: 85");
    let autoscale = parse_catalog("models.yaml", &kv).unwrap().models[0]
        .managed()
        .unwrap()
        .autoscale
        .unwrap();
    assert_eq!(autoscale.kv_cache_usage_percent, Some(85));
    assert!(
        autoscale
            .describe()
            .contains("the KV cache usage of the fullest engine under 85%"),
        "{}",
        autoscale.describe()
    );
    let over = src.replace("ttft_p90_slo: 500ms", "kv_cache_usage_percent: 150");
    let err = parse_catalog("models.yaml", &over).unwrap_err().to_string();
    assert!(
        err.contains("models[0].autoscale.kv_cache_usage_percent: must be from 1 to 100"),
        "{err}"
    );
}

#[test]
fn data_parallel_ranks_split_the_gpus_and_stay_out_of_entries_without_them() {
    let yaml = "models:\n  - name: a\n    source: x\n    profiles:\n      - {name: dp4, engine: vllm, gpus_per_node: 8, data_parallel: 4}\n      - {name: tp8, engine: vllm, gpus_per_node: 8}\n";
    let catalog = parse_catalog("models.yaml", yaml).unwrap();
    let profiles = &catalog.get("a").unwrap().managed().unwrap().profiles;
    let shape =
        |p: &llmgw_catalog::Profile| (p.tensor_parallel, p.pipeline_parallel, p.data_parallel);
    assert_eq!(
        shape(&profiles[0]),
        (2, 1, 4),
        "tensor_parallel defaults to the GPUs each rank has"
    );
    assert_eq!(shape(&profiles[1]), (8, 1, 1));
    let json = serde_json::to_string(&profiles[1]).unwrap();
    assert!(!json.contains("data_parallel"), "{json}");
    let json = serde_json::to_string(&profiles[0]).unwrap();
    assert!(json.contains("\"data_parallel\":4"), "{json}");
}

#[test]
fn a_price_reads_as_dollars_per_million_tokens() {
    let yaml = "models:\n  - name: a\n    endpoints: [\"http://10.0.0.1:8000\"]\n    price: {input_per_million: 0.15, output_per_million: 0.6}\n";
    let catalog = parse_catalog("models.yaml", yaml).unwrap();
    let price = catalog.get("a").unwrap().price.expect("a price");
    assert_eq!(price.input_per_million.micros, 150_000);
    assert_eq!(price.output_per_million.micros, 600_000);
    assert_eq!(price.cached_input_per_million, None);
    let json = serde_json::to_value(catalog.get("a").unwrap()).unwrap();
    assert_eq!(json["price"]["input_per_million"], 0.15);
    let bad = "models:\n  - name: a\n    endpoints: [\"http://10.0.0.1:8000\"]\n    price: {input_per_million: -1, output_per_million: 0.6}\n";
    let err = parse_catalog("models.yaml", bad).unwrap_err().to_string();
    assert!(
        err.contains("models[0].price.input_per_million: -1 is not a price"),
        "{err}"
    );
}

#[test]
fn catalog_round_trips_through_json() {
    let catalog = parse_catalog("models.yaml", GOOD).unwrap();
    let json = serde_json::to_string(&catalog).unwrap();
    let back: llmgw_catalog::Catalog = serde_json::from_str(&json).unwrap();
    assert_eq!(back, catalog);
    // The JSON form is itself a valid catalog file.
    assert_eq!(parse_catalog("models.json", &json).unwrap(), catalog);
}

/// (what is wrong, file, expected `line:col: path: message` fragment)
const BROKEN: &[(&str, &str, &str)] = &[
    (
        "unknown top-level key",
        "modles: []\n",
        "1:1: modles: unknown key `modles` (did you mean `models`?)",
    ),
    (
        "unknown model key",
        "models:\n  - name: a\n    sorce: x\n    profiles: [{name: p, engine: vllm}]\n",
        "3:5: models[0].sorce: unknown key `sorce` (did you mean `source`?)",
    ),
    (
        "missing name",
        "models:\n  - source: x\n    profiles: [{name: p, engine: vllm}]\n",
        "2:5: models[0].name: required field is missing",
    ),
    (
        "neither profiles nor endpoints",
        "models:\n  - name: a\n",
        "2:5: models[0]: a model needs `profiles`",
    ),
    (
        "both profiles and endpoints",
        "models:\n  - name: a\n    source: x\n    endpoints: [\"http://h:1\"]\n    profiles: [{name: p, engine: vllm}]\n",
        "4:16: models[0].endpoints: a model has either",
    ),
    (
        "managed model without source",
        "models:\n  - name: a\n    profiles: [{name: p, engine: vllm}]\n",
        "2:5: models[0].source: required field is missing",
    ),
    (
        "replicas not a number",
        "models:\n  - name: a\n    source: x\n    replicas: two\n    profiles: [{name: p, engine: vllm}]\n",
        "4:15: models[0].replicas: expected a number, found \"two\"",
    ),
    (
        "negative replicas",
        "models:\n  - name: a\n    source: x\n    replicas: -1\n    profiles: [{name: p, engine: vllm}]\n",
        "4:15: models[0].replicas: expected a number",
    ),
    (
        "replicas over the limit",
        "models:\n  - name: a\n    source: x\n    replicas: 5000\n    profiles: [{name: p, engine: vllm}]\n",
        "4:15: models[0].replicas: 5000 replicas is above the limit of 1000",
    ),
    (
        "unknown engine",
        "models:\n  - name: a\n    source: x\n    profiles:\n      - name: p\n        engine: tgi\n",
        "6:17: models[0].profiles[0].engine: unknown engine \"tgi\"",
    ),
    (
        "missing engine",
        "models:\n  - name: a\n    source: x\n    profiles:\n      - name: p\n",
        "5:9: models[0].profiles[0].engine: required field is missing",
    ),
    (
        "tp x pp does not match the GPUs",
        "models:\n  - name: a\n    source: x\n    profiles:\n      - name: p\n        engine: vllm\n        gpus_per_node: 4\n        tensor_parallel: 2\n",
        "8:26: models[0].profiles[0].tensor_parallel: tensor_parallel x pipeline_parallel x data_parallel = 2 x 1 x 1 = 2, but nodes x gpus_per_node = 1 x 4 = 4",
    ),
    (
        "tp x pp x dp does not match the GPUs",
        "models:\n  - name: a\n    source: x\n    profiles:\n      - name: p\n        engine: vllm\n        gpus_per_node: 4\n        tensor_parallel: 2\n        data_parallel: 3\n",
        "tensor_parallel x pipeline_parallel x data_parallel = 2 x 1 x 3 = 6, but nodes x gpus_per_node = 1 x 4 = 4",
    ),
    (
        "data parallel across nodes",
        "models:\n  - name: a\n    source: x\n    profiles:\n      - name: p\n        engine: vllm\n        nodes: 2\n        gpus_per_node: 2\n        tensor_parallel: 2\n        data_parallel: 2\n",
        "models[0].profiles[0].data_parallel: data_parallel 2 on 2 nodes: data-parallel ranks run on one node",
    ),
    (
        "data parallel flag in engine_args",
        "models:\n  - name: a\n    source: x\n    profiles:\n      - name: p\n        engine: sglang\n        engine_args: [\"--dp-size\", \"2\"]\n",
        "--dp-size is set by llmgw from the placement; remove it from engine_args and set the profile's `data_parallel` instead",
    ),
    (
        "zero gpus",
        "models:\n  - name: a\n    source: x\n    profiles:\n      - name: p\n        engine: vllm\n        gpus_per_node: 0\n",
        "7:24: models[0].profiles[0].gpus_per_node: must be at least 1",
    ),
    (
        "too many gpus per node",
        "models:\n  - name: a\n    source: x\n    profiles:\n      - name: p\n        engine: vllm\n        gpus_per_node: 32\n",
        "7:24: models[0].profiles[0].gpus_per_node: 32 is above the limit of 16",
    ),
    (
        "managed port flag",
        "models:\n  - name: a\n    source: x\n    profiles:\n      - name: p\n        engine: vllm\n        engine_args: [\"--port\", \"9000\"]\n",
        "7:23: models[0].profiles[0].engine_args[0]: --port is set by llmgw",
    ),
    (
        "managed tp alias for vllm",
        "models:\n  - name: a\n    source: x\n    profiles:\n      - name: p\n        engine: vllm\n        engine_args: [\"-tp\", \"2\"]\n",
        "models[0].profiles[0].engine_args[0]: -tp is set by llmgw from the placement (`-tp` is vllm's spelling of `--tensor-parallel-size`)",
    ),
    (
        "managed sglang abbreviation",
        "models:\n  - name: a\n    source: x\n    profiles:\n      - name: p\n        engine: sglang\n        engine_args: [\"--tp\", \"2\"]\n",
        "models[0].profiles[0].engine_args[0]: --tp is set by llmgw from the placement (`--tp` is sglang's spelling of `--tp-size`)",
    ),
    (
        "managed flag with =value and underscores",
        "models:\n  - name: a\n    source: x\n    profiles:\n      - name: p\n        engine: vllm\n        engine_args: [\"--served_model_name=foo\"]\n",
        "engine_args[0]: --served_model_name is set by llmgw",
    ),
    (
        "flag and value in one item",
        "models:\n  - name: a\n    source: x\n    profiles:\n      - name: p\n        engine: vllm\n        engine_args: [\"--max-model-len 8192\"]\n",
        "engine_args[0]: \"--max-model-len 8192\" holds a space",
    ),
    (
        "a vLLM flag in a SGLang profile",
        "models:\n  - name: a\n    source: x\n    profiles:\n      - name: p\n        engine: sglang\n        engine_args: [\"--max-model-len\", \"8192\"]\n",
        "7:23: models[0].profiles[0].engine_args[0]: --max-model-len is not an option of sglang 0.5.10; did you mean --context-length (vLLM calls it --max-model-len)?",
    ),
    (
        "a value the engine's parser refuses",
        "models:\n  - name: a\n    source: x\n    profiles:\n      - name: p\n        engine: vllm\n        engine_version: \"0.34.0\"\n        engine_args: [--max-model-len, 8k, --dtype, int3]\n",
        "8:44: models[0].profiles[0].engine_args[2]: vllm 0.34.0 refuses it: argument --dtype: invalid choice: 'int3' (choose from",
    ),
    (
        "an engine version without option data",
        "models:\n  - name: a\n    source: x\n    profiles:\n      - name: p\n        engine: sglang\n        engine_version: 0.4.0\n",
        "7:25: models[0].profiles[0].engine_version: llmgw has no option data for sglang 0.4.0; known sglang versions: 0.5.10, 0.5.23",
    ),
    (
        "managed env",
        "models:\n  - name: a\n    source: x\n    profiles:\n      - name: p\n        engine: vllm\n        env: {CUDA_VISIBLE_DEVICES: \"0\"}\n",
        "7:15: models[0].profiles[0].env.CUDA_VISIBLE_DEVICES: CUDA_VISIBLE_DEVICES is set by llmgw",
    ),
    (
        "invalid env name",
        "models:\n  - name: a\n    source: x\n    profiles:\n      - name: p\n        engine: vllm\n        env: {\"1BAD-NAME\": x}\n",
        "env.1BAD-NAME: \"1BAD-NAME\" is not a valid environment variable name",
    ),
    (
        "launch mode on sglang",
        "models:\n  - name: a\n    source: x\n    profiles:\n      - name: p\n        engine: sglang\n        nodes: 2\n        gpus_per_node: 8\n        launch_mode: ray\n",
        "9:22: models[0].profiles[0].launch_mode: launch_mode `ray` applies to vLLM",
    ),
    (
        "unknown launch mode",
        "models:\n  - name: a\n    source: x\n    profiles:\n      - name: p\n        engine: vllm\n        nodes: 2\n        gpus_per_node: 8\n        launch_mode: slurm\n",
        "9:22: models[0].profiles[0].launch_mode: unknown launch mode \"slurm\"",
    ),
    (
        "duplicate profile names",
        "models:\n  - name: a\n    source: x\n    profiles:\n      - {name: p, engine: vllm}\n      - {name: p, engine: sglang}\n",
        "models[0].profiles[1].name: profile name `p` appears twice",
    ),
    (
        "duplicate model names",
        "models:\n  - name: a\n    endpoints: [\"http://h:1\"]\n  - name: a\n    endpoints: [\"http://h:2\"]\n",
        "4:5: models[1].name: the name `a` of model `a` is already used by model `a`",
    ),
    (
        "alias clashes with another model",
        "models:\n  - name: a\n    endpoints: [\"http://h:1\"]\n  - name: b\n    aliases: [a]\n    endpoints: [\"http://h:2\"]\n",
        "4:5: models[1].name: the name `a` of model `b` is already used by model `a`",
    ),
    (
        "endpoint without scheme",
        "models:\n  - name: a\n    endpoints: [\"10.1.2.3:8000\"]\n",
        "3:17: models[0].endpoints[0]: \"10.1.2.3:8000\" is not an http:// or https:// URL",
    ),
    (
        "endpoint with /v1",
        "models:\n  - name: a\n    endpoints: [\"http://h:8000/v1\"]\n",
        "models[0].endpoints[0]: \"http://h:8000/v1\": give the base URL without `/v1`",
    ),
    (
        "replicas on an endpoints model",
        "models:\n  - name: a\n    replicas: 2\n    endpoints: [\"http://h:1\"]\n",
        "3:15: models[0].replicas: `replicas` applies to models llmgw runs",
    ),
    (
        "autoscale bounds reversed",
        "models:\n  - name: a\n    source: x\n    autoscale: {min_replicas: 3, max_replicas: 2}\n    profiles: [{name: p, engine: vllm}]\n",
        "models[0].autoscale.max_replicas: 2 is below min_replicas (3)",
    ),
    (
        "autoscale that never runs",
        "models:\n  - name: a\n    source: x\n    autoscale: {min_replicas: 0, max_replicas: 0}\n    profiles: [{name: p, engine: vllm}]\n",
        "models[0].autoscale.max_replicas: must be at least 1",
    ),
    (
        "replicas outside autoscale's bounds",
        "models:\n  - name: a\n    source: x\n    replicas: 5\n    autoscale: {min_replicas: 1, max_replicas: 2}\n    profiles: [{name: p, engine: vllm}]\n",
        "4:15: models[0].replicas: 5 replicas is outside autoscale's bounds (1 to 2)",
    ),
    (
        "autoscale window without a unit",
        "models:\n  - name: a\n    source: x\n    autoscale: {min_replicas: 1, max_replicas: 2, scale_up_window: 30}\n    profiles: [{name: p, engine: vllm}]\n",
        "models[0].autoscale.scale_up_window: invalid duration \"30\": add a unit",
    ),
    (
        "autoscale on an endpoints model",
        "models:\n  - name: a\n    autoscale: {min_replicas: 1, max_replicas: 2}\n    endpoints: [\"http://h:1\"]\n",
        "models[0].autoscale: `autoscale` applies to models llmgw runs",
    ),
    (
        "bad model name",
        "models:\n  - name: \"llama 3\"\n    endpoints: [\"http://h:1\"]\n",
        "2:11: models[0].name: invalid model name: \"llama 3\" contains ' '",
    ),
    (
        "profiles not a list",
        "models:\n  - name: a\n    source: x\n    profiles: tp1\n",
        "4:15: models[0].profiles: expected a list, found \"tp1\"",
    ),
    (
        "models not a list",
        "models: {a: 1}\n",
        "1:10: models: expected a list, found a mapping",
    ),
    ("not yaml", "models: [\n", "models.yaml:2:1: not valid YAML"),
    (
        "yaml alias",
        "models:\n  - &m {name: a, endpoints: [\"http://h:1\"]}\n  - *m\n",
        "3:5: not valid YAML: YAML aliases",
    ),
];

#[test]
fn every_broken_catalog_names_line_and_field() {
    let mut failures = Vec::new();
    for (what, src, expected) in BROKEN {
        match parse_catalog("models.yaml", src) {
            Ok(_) => failures.push(format!("{what}: accepted, expected `{expected}`")),
            Err(problems) => {
                let shown = problems.to_string();
                if !shown.contains(expected) {
                    failures.push(format!(
                        "{what}:\n  expected: {expected}\n  got:      {shown}"
                    ));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases wrong:\n{}",
        failures.len(),
        BROKEN.len(),
        failures.join("\n")
    );
}

#[test]
fn engine_args_are_checked_against_the_named_release() {
    // SGLang 0.5.23 reads 8k as 8000; the profile's release is kept.
    let profile = |version: &str| {
        format!(
            "models:\n  - name: a\n    source: x\n    profiles:\n      - name: p\n        engine: sglang\n        engine_version: \"{version}\"\n        engine_args: [--context-length, 8k]\n"
        )
    };
    assert!(parse_catalog("models.yaml", &profile("0.5.23")).is_ok());
    let model = parse_catalog("models.yaml", &profile("0.5.23")).unwrap();
    let p = &model.models[0].managed().unwrap().profiles[0];
    assert_eq!(p.engine_version.as_deref(), Some("0.5.23"));
}

#[test]
fn three_independent_mistakes_are_reported_together() {
    let src = "models:\n  - name: a\n    source: x\n    replicas: lots\n    profiles:\n      - name: p\n        engine: tgi\n  - name: b\n    endpoints: [\"ftp://h\"]\n";
    let problems = parse_catalog("models.yaml", src).unwrap_err();
    let lines: Vec<String> = problems.to_string().lines().map(str::to_string).collect();
    assert_eq!(lines.len(), 3, "{lines:#?}");
    assert!(lines[0].starts_with("models.yaml:4:15: models[0].replicas:"));
    assert!(lines[1].starts_with("models.yaml:7:17: models[0].profiles[0].engine:"));
    assert!(lines[2].starts_with("models.yaml:9:17: models[1].endpoints[0]:"));
}

#[test]
fn a_single_model_parses_from_json() {
    let model = parse_model(
        "PUT /api/v1/models/m",
        r#"{"name": "m", "source": "Qwen/Qwen2.5-0.5B-Instruct", "replicas": 3,
            "profiles": [{"name": "tp1", "engine": "vllm"}]}"#,
    )
    .unwrap();
    assert_eq!(model.desired_replicas(), 3);
    let err = parse_model("PUT /api/v1/models/m", r#"{"name": "m", "source": "s", "profiles": [{"name": "p", "engine": "vllm", "nodes": "2"}]}"#)
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("profiles[0].nodes: expected a number, found \"2\""),
        "{err}"
    );
}

#[test]
fn put_refuses_name_clashes() {
    let mut catalog = parse_catalog("models.yaml", GOOD).unwrap();
    let clash = parse_model(
        "req",
        "{name: other, aliases: [llama3-8b], endpoints: [\"http://h:1\"]}",
    )
    .unwrap();
    assert_eq!(
        catalog.check_put(&clash).unwrap_err(),
        "the name `llama3-8b` is already used by model `llama-3.1-8b`"
    );
    let replacement =
        parse_model("req", "{name: partner-model, endpoints: [\"http://h:9\"]}").unwrap();
    catalog.check_put(&replacement).unwrap();
    catalog.put(replacement);
    assert_eq!(catalog.models.len(), 3);
    assert_eq!(
        catalog.get("partner-model").unwrap().static_endpoints(),
        ["http://h:9"]
    );
}

#[test]
fn sleep_after_is_for_single_node_vllm_replicas_that_sleep_before_release() {
    let src = "models:\n  - name: a\n    source: x\n    autoscale: {min_replicas: 0, max_replicas: 2, scale_down_window: 10m, sleep_after: 2m}\n    profiles: [{name: p, engine: vllm}]\n";
    let catalog = parse_catalog("models.yaml", src).unwrap();
    let autoscale = catalog.models[0].managed().unwrap().autoscale.unwrap();
    assert_eq!(
        autoscale.sleep_after,
        Some(std::time::Duration::from_secs(120))
    );
    assert!(
        autoscale
            .describe()
            .contains("asleep (vLLM sleep mode) after 2m without a request"),
        "{}",
        autoscale.describe()
    );
    let json = serde_json::to_value(&catalog).unwrap();
    assert_eq!(json["models"][0]["autoscale"]["sleep_after"], "2m");
    assert_eq!(
        parse_catalog("models.json", &json.to_string()).unwrap(),
        catalog
    );
    for (change, error) in [
        (
            ("engine: vllm", "engine: sglang"),
            "models[0].autoscale: profile p runs sglang: only vLLM has a sleep mode",
        ),
        (
            ("engine: vllm}", "engine: vllm, nodes: 2, gpus_per_node: 8}"),
            "models[0].autoscale: profile p spans 2 nodes: only single-node replicas",
        ),
        (
            ("sleep_after: 2m", "sleep_after: 10m"),
            "models[0].autoscale.sleep_after: 10m is not shorter than scale_down_window (10m)",
        ),
        (
            ("sleep_after: 2m", "sleep_after: 0s"),
            "models[0].autoscale.sleep_after: must be more than 0",
        ),
    ] {
        let broken = src.replace(change.0, change.1);
        let err = parse_catalog("models.yaml", &broken)
            .unwrap_err()
            .to_string();
        assert!(err.contains(error), "{broken}\n{err}");
    }
    // A model that never goes to zero may sleep after as long as it likes.
    let warm = src
        .replace("min_replicas: 0", "min_replicas: 1")
        .replace("sleep_after: 2m", "sleep_after: 1h");
    assert!(parse_catalog("models.yaml", &warm).is_ok());
}

#[test]
fn a_limit_per_replica_round_trips_and_may_not_sit_below_the_target() {
    let src = "models:\n  - name: a\n    source: x\n    autoscale: {min_replicas: 1, max_replicas: 3, target_requests_per_replica: 4, max_requests_per_replica: 6}\n    profiles: [{name: p, engine: vllm}]\n";
    let catalog = parse_catalog("models.yaml", src).unwrap();
    let autoscale = catalog.models[0].managed().unwrap().autoscale.unwrap();
    assert_eq!(autoscale.max_requests_per_replica, Some(6));
    assert!(
        autoscale
            .describe()
            .contains("at most 6 requests a replica from each router"),
        "{}",
        autoscale.describe()
    );
    let json = serde_json::to_value(&catalog).unwrap();
    assert_eq!(
        parse_catalog("models.json", &json.to_string()).unwrap(),
        catalog
    );
    let below = src.replace("max_requests_per_replica: 6", "max_requests_per_replica: 3");
    let err = parse_catalog("models.yaml", &below)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(
            "models[0].autoscale.max_requests_per_replica: 3 is below target_requests_per_replica (4)"
        ),
        "{err}"
    );
}
