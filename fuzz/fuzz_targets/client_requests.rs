#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| llmgw_fuzz_targets::client_requests(data));
