//! Opt-in diagnostics: `TRANSFER_VERBS_TRACE=1` prints connection events
//! (handshakes, state changes, error completions) to stderr.

use std::sync::OnceLock;

/// Whether tracing is on (read once from the environment).
pub(crate) fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("TRANSFER_VERBS_TRACE").is_some_and(|v| v != "0"))
}

/// Prints a trace line when tracing is on.
macro_rules! trace {
    ($($arg:tt)*) => {
        if $crate::trace::enabled() {
            eprintln!("[transfer-verbs] {}", format_args!($($arg)*));
        }
    };
}
pub(crate) use trace;
