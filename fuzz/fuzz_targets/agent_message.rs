#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| llmgw_fuzz_targets::agent_message(data));
