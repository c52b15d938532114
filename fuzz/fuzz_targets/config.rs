#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| smtp_once_fuzz::glue::config(data));
