//! Required providers: when a test cannot open its provider it skips
//! (prints why and passes) unless [`REQUIRE_ENV`] names that provider;
//! then the skip is a test failure. CI sets it for the providers its
//! machines have (`cargo xtask test`: `tcp,shm` on the host, `verbs` in
//! the soft-RoCE VM), so a provider that stopped opening cannot pass
//! silently; developers without them still get skips.
//!
//! Every test crate calls [`skip_or_fail`]; the variable is parsed here
//! only.

/// Comma-separated providers that must open, e.g. `tcp,shm` or `verbs`.
/// Names are compared as [`canonical`] makes them: case-insensitive,
/// libfabric utility suffixes dropped (`tcp;ofi_rxm` is `tcp`), and `rxe`
/// and `ibverbs` mean `verbs`.
pub const REQUIRE_ENV: &str = "TRANSFER_REQUIRE";

/// The name a provider is required by: lowercase, without a libfabric
/// utility provider (`;ofi_rxm`, `;ofi_rxd`), with `rxe` (soft-RoCE) and
/// `ibverbs` (the native verbs backend) as `verbs`.
pub fn canonical(provider: &str) -> String {
    let name = provider.trim().to_ascii_lowercase();
    let core = name.split(';').next().unwrap_or_default().trim().to_owned();
    match core.as_str() {
        "rxe" | "ibverbs" => "verbs".into(),
        _ => core,
    }
}

/// The providers a [`REQUIRE_ENV`] value names (canonical, empty entries dropped).
pub fn parse(value: &str) -> Vec<String> {
    value
        .split(',')
        .map(canonical)
        .filter(|p| !p.is_empty())
        .collect()
}

/// Whether [`REQUIRE_ENV`] names `provider`.
pub fn is_required(provider: &str) -> bool {
    let Some(value) = std::env::var_os(REQUIRE_ENV) else {
        return false;
    };
    let want = canonical(provider);
    parse(&value.to_string_lossy()).contains(&want)
}

/// Skips a test whose `provider` cannot be used here, printing `reason`;
/// when [`REQUIRE_ENV`] names the provider the test fails instead.
///
/// # Panics
/// When the provider is required: failing the calling test is the point.
#[track_caller]
pub fn skip_or_fail(provider: &str, reason: impl std::fmt::Display) {
    if is_required(provider) {
        // Test support only: the panic is the calling test's failure.
        #[allow(clippy::panic)]
        {
            panic!(
                "provider {provider} is required ({REQUIRE_ENV}={}) but unavailable: {reason}",
                std::env::var(REQUIRE_ENV).unwrap_or_default()
            );
        }
    }
    eprintln!("skipped ({provider}): {reason}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_canonical() {
        assert_eq!(parse("tcp,shm"), ["tcp", "shm"]);
        assert_eq!(
            parse(" TCP;ofi_rxm , ,udp;ofi_rxd,rxe,ibverbs,Verbs,efa"),
            ["tcp", "udp", "verbs", "verbs", "verbs", "efa"]
        );
        assert!(parse("").is_empty());
        assert_eq!(canonical("tcp;ofi_rxm"), "tcp");
    }
}
