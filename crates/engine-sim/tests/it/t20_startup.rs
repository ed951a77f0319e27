//! Startup: refused while loading, the engines' log lines, SGLang's warm-up
//! 503, and real worker processes that die with their parent.

use std::time::Duration;

use crate::common::*;

#[test]
fn connections_are_refused_while_loading_then_health_is_200() {
    for persona in PERSONAS {
        // SGLang's warm-up is a tenth of the load: make it long enough (500 ms)
        // for a poll on a busy machine to land inside it.
        let load = if is_vllm(persona) { "2s" } else { "5s" };
        let mut sim = Sim::start(persona, SMALL, &[], &[("LLMGW_SIM_LOAD_TIME", load)]);
        assert!(wait_until_blocking(Duration::from_secs(10), || sim
            .output()
            .contains("Load")
            || sim.output().contains("load")));
        assert!(
            refused(sim.port),
            "{persona}: port must refuse connections while loading"
        );
        if persona.starts_with("sglang") {
            // SGLang listens, then answers 503 until warm-up has generated.
            let mut first = None;
            assert!(wait_until_blocking(Duration::from_secs(30), || {
                first = get(sim.port, "/health").map(|r| r.status);
                first.is_some()
            }));
            assert_eq!(
                first,
                Some(503),
                "{persona}: first health answer during warm-up"
            );
        }
        sim.wait_healthy();
        let out = sim.output();
        if is_vllm(persona) {
            assert!(
                out.contains("Application startup complete."),
                "{persona}: {out}"
            );
            assert!(
                !out.contains("Uvicorn running on"),
                "{persona}: vLLM never prints it"
            );
            let start = if *persona == "vllm=0.11.0" {
                "Starting vLLM API server 0 on http://"
            } else {
                "Starting vLLM server on http://"
            };
            assert!(out.contains(start), "{persona}: {out}");
            assert!(out.contains("(APIServer pid="), "{persona}");
            assert!(out.contains("(EngineCore_DP0 pid="), "{persona}");
            assert!(out.contains("GPU KV cache size: "), "{persona}");
        } else {
            assert!(wait_until_blocking(Duration::from_secs(5), || sim
                .output()
                .contains("The server is fired up and ready to roll!")));
            assert!(
                out.contains(&format!("Uvicorn running on http://127.0.0.1:{}", sim.port)),
                "{out}"
            );
            assert!(out.contains("TP0] Load weight begin."), "{out}");
        }
    }
}

#[test]
fn workers_are_real_processes_that_die_with_their_parent() {
    let sim = Sim::ready(
        "vllm=0.34.0",
        "meta-llama/Llama-3.1-8B-Instruct",
        &["-tp", "2"],
        &[],
    );
    let kids = children(sim.pid());
    let titles: Vec<&str> = kids
        .iter()
        .map(|(_, c)| c.split(' ').next().unwrap_or(""))
        .collect();
    assert!(titles.contains(&"VLLM::EngineCore_DP0"), "{kids:?}");
    assert!(
        titles.contains(&"VLLM::Worker_TP0") && titles.contains(&"VLLM::Worker_TP1"),
        "{kids:?}"
    );
    // SIGKILL the parent alone: the workers see their pipe close and exit.
    sim.signal("KILL");
    for (pid, _) in &kids {
        assert!(
            wait_until_blocking(Duration::from_secs(10), || !alive(*pid)),
            "worker {pid} outlived its parent"
        );
    }
}

#[test]
fn served_model_names_and_api_keys_follow_each_engine() {
    for persona in PERSONAS {
        let names: &[&str] = if is_vllm(persona) {
            &["--served-model-name", "small", "alias"]
        } else {
            &["--served-model-name", "small"]
        };
        let mut extra = names.to_vec();
        extra.extend(["--api-key", "sekret"]);
        let sim = Sim::ready(persona, SMALL, &extra, &[]);
        let models = request(
            sim.port,
            "GET",
            "/v1/models",
            &[("Authorization", "Bearer sekret")],
            "",
        )
        .unwrap();
        assert_eq!(models.status, 200);
        let json = models.json();
        assert_eq!(json["data"][0]["id"], "small", "{persona}");
        assert_eq!(json["data"][0]["root"], SMALL, "{persona}");
        assert_eq!(
            json["data"][0]["owned_by"],
            if is_vllm(persona) { "vllm" } else { "sglang" }
        );
        let denied = get(sim.port, "/v1/models").unwrap();
        assert_eq!(
            (denied.status, denied.body.as_str()),
            (401, "{\"error\":\"Unauthorized\"}"),
            "{persona}"
        );
        assert_eq!(
            get(sim.port, "/health").unwrap().status,
            200,
            "{persona}: health is open"
        );
        // vLLM guards only /v1; SGLang guards its own routes too.
        let version = get(sim.port, "/version").unwrap().status;
        assert_eq!(
            version,
            if is_vllm(persona) { 200 } else { 401 },
            "{persona}"
        );
        if is_vllm(persona) {
            let reply = request(
                sim.port,
                "POST",
                "/v1/chat/completions",
                &[("Authorization", "Bearer sekret")],
                &chat_body("alias", 2, false, ""),
            )
            .unwrap();
            assert_eq!(reply.status, 200, "every served name is accepted");
            assert_eq!(reply.json()["model"], "alias");
        }
    }
}
