//! The `llmgw-engine-sim` binary; see the library for what it simulates.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    std::process::exit(llmgw_engine_sim::main_with_args(&args));
}
