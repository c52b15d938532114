//! The fuzz targets' glue lives in `glue.rs` so that the regression replay
//! (`tests/fuzz_regressions.rs` in the main crate) runs the very same code;
//! this file only holds what the libFuzzer process itself needs.

pub mod glue;

/// Called from each target's `init`, before libFuzzer installs its signal
/// handlers.
pub fn init() {
    catch_stack_overflows();
    quiet_caught_mail_parser_panics();
}

/// libFuzzer's `main` is C++, so Rust's runtime never gives the main thread
/// an alternate signal stack. A stack overflow (deep MIME nesting) then
/// faults again inside libFuzzer's SIGSEGV handler and the process dies
/// with no crash artifact. libFuzzer keeps `SA_ONSTACK` when the previous
/// SIGSEGV disposition had it, so give it one: an alternate stack and a
/// default-action disposition flagged `SA_ONSTACK`.
fn catch_stack_overflows() {
    const ALT_STACK: usize = 1 << 20;
    let stack: &'static mut [u8] = Vec::leak(vec![0u8; ALT_STACK]);
    // SAFETY: the alternate stack is leaked, so it outlives the thread; the
    // disposition installed is SIG_DFL (a null handler) with flags only.
    unsafe {
        let ss = libc::stack_t {
            ss_sp: stack.as_mut_ptr().cast(),
            ss_flags: 0,
            ss_size: ALT_STACK,
        };
        assert_eq!(libc::sigaltstack(&ss, std::ptr::null_mut()), 0);
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        action.sa_sigaction = libc::SIG_DFL;
        assert_eq!(
            libc::sigaction(libc::SIGSEGV, &action, std::ptr::null_mut()),
            0
        );
    }
}

/// cargo-fuzz builds with debug assertions, so mail-parser 0.11.9's
/// `debug_assert!(false, ..)` on malformed MIME fires (release builds and
/// the crate's dev profile compile it out). The fingerprint catches that
/// panic and hashes raw, but libfuzzer-sys's panic hook aborts before any
/// unwinding, which would report every such input as a crash. This hook
/// does not abort: a panic that escapes a target is still a crash
/// (libfuzzer-sys aborts after its `catch_unwind`), and only panics raised
/// inside mail-parser stay off stderr.
fn quiet_caught_mail_parser_panics() {
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
