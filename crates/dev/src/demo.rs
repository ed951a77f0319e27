//! The demo catalog `llmgw dev` seeds: a single-node model and a two-node
//! tensor-parallel model, served by simulated engines through the real
//! vLLM adapter.

/// models.yaml for the demo. `nodes` is how many simulated nodes run: the
/// two-node model needs the two H100 nodes on fabric ib-a.
///
/// From three nodes on (the third is the L40S node, the fourth an A100
/// node) the small model stays off the H100s: placement takes nodes as
/// they register, so it would otherwise land on whichever H100 registered
/// first and leave the two-node model without its sixteen GPUs.
pub fn demo_catalog(nodes: u32) -> String {
    let mut out = String::from(
        "# Written by `llmgw dev`: the demo catalog, seeded when the cluster forms.\n\
         # Change it with `llmgw ctl models put FILE` or PUT /api/v1/models/NAME.\n\
         models:\n\
         \x20 - name: qwen-0.5b\n\
         \x20   aliases: [qwen]\n\
         \x20   source: Qwen/Qwen2.5-0.5B-Instruct\n\
         \x20   replicas: 1\n\
         \x20   profiles:\n\
         \x20     - name: tp1\n\
         \x20       engine: vllm\n\
         \x20       gpus_per_node: 1\n\
         \x20       min_gpu_memory_gb: 16\n",
    );
    if nodes >= 3 {
        out.push_str(
            "        # Off the H100 nodes: both stay whole for llama-70b.\n\
             \x20       gpu_models: [L40S, A100]\n",
        );
    }
    if nodes >= 2 {
        out.push_str(
            "  - name: llama-70b\n\
             \x20   source: meta-llama/Llama-3.1-70B-Instruct\n\
             \x20   replicas: 1\n\
             \x20   profiles:\n\
             \x20     # Two 8-GPU nodes on one InfiniBand fabric.\n\
             \x20     - name: tp8x2\n\
             \x20       engine: vllm\n\
             \x20       nodes: 2\n\
             \x20       gpus_per_node: 8\n\
             \x20       tensor_parallel: 8\n\
             \x20       pipeline_parallel: 2\n\
             \x20       launch_mode: mp\n\
             \x20       min_gpu_memory_gb: 40\n",
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demo_catalog_is_valid() {
        for nodes in [1, 3] {
            let catalog = llmgw_catalog::parse_catalog("demo.yaml", &demo_catalog(nodes))
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(catalog.models.len(), if nodes >= 2 { 2 } else { 1 });
        }
    }

    #[test]
    fn with_the_l40s_node_the_small_model_leaves_the_h100_nodes_whole() {
        for (nodes, wanted) in [
            (1, vec![]),
            (2, vec![]),
            (3, vec!["L40S".to_owned(), "A100".to_owned()]),
        ] {
            let catalog = llmgw_catalog::parse_catalog("demo.yaml", &demo_catalog(nodes))
                .unwrap_or_else(|e| panic!("{e}"));
            let small = &catalog.models[0].managed().expect("managed").profiles[0];
            assert_eq!(small.gpu_models, wanted, "with {nodes} nodes");
            assert_eq!(small.accepts_gpu_model("NVIDIA H100 80GB HBM3"), nodes < 3);
        }
    }
}
