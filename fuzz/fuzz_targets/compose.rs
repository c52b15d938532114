#![no_main]

libfuzzer_sys::fuzz_target!(init: smtp_once_fuzz::init(), |data: &[u8]| {
    smtp_once_fuzz::glue::compose(data)
});
