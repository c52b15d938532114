#![no_main]

use std::sync::Once;

static QUIET_CAUGHT_PANICS: Once = Once::new();

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    QUIET_CAUGHT_PANICS.call_once(install_panic_hook);
    smtp_once_fuzz::glue::fingerprint(data);
});

/// cargo-fuzz builds with debug assertions, so mail-parser 0.11.9's
/// `debug_assert!(false, ..)` on malformed MIME fires here (release builds
/// and the crate's dev profile compile it out). The fingerprint catches that
/// panic and hashes raw, but libfuzzer-sys's panic hook aborts before any
/// unwinding, which would report every such input as a crash. This hook
/// does not abort: a panic that escapes the target is still a crash
/// (libfuzzer-sys aborts on it after `catch_unwind`), and only panics raised
/// inside mail-parser are kept off stderr.
fn install_panic_hook() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let in_mail_parser = info
            .location()
            .is_some_and(|l| l.file().contains("mail-parser"));
        if !in_mail_parser {
            default(info);
        }
    }));
}
