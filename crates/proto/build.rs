//! Compiles `proto/*.proto` with protox (pure Rust), so a build never needs a
//! system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Read at run time, not baked in with env!: a build-script binary that
    // cargo reuses from another checkout sharing the target directory must
    // still find this checkout's protos.
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR")?;
    let root = std::path::Path::new(&manifest_dir).join("../../proto");
    let files = ["agent.proto", "raft.proto"];
    for file in files {
        println!("cargo:rerun-if-changed={}", root.join(file).display());
    }
    let descriptors = protox::compile(files, [&root])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        // The generated `connect` constructor would clash with the agent
        // stream's `Connect` RPC; clients are built from a `Channel` instead.
        .build_transport(false)
        .compile_fds(descriptors)?;
    Ok(())
}
