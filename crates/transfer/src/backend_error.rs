//! The one error type of this crate: choosing, opening and starting.

use transfer_core::TransferError;

use crate::selection::{BackendFamily, SelectionError};

/// Failures of [`crate::Backend`].
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// `TRANSFER_BACKEND` or the config names no backend this crate knows.
    #[error("unknown backend {0:?}: expected \"libfabric\" or \"verbs\" ({env})", env = crate::selection::BACKEND_ENV)]
    UnknownBackend(String),
    /// The backend was asked for but this build of `transfer` lacks it.
    #[error(
        "the {family} backend is not compiled in: enable the `{feature}` feature of the `transfer` crate",
        feature = family.feature()
    )]
    NotCompiledIn {
        /// The backend asked for.
        family: BackendFamily,
    },
    /// The backend's native library is not installed.
    #[error(
        "{family} backend: {library} could not be loaded ({reason}); install the Debian/Ubuntu package(s) {packages} (apt-get install {packages})"
    )]
    LibraryMissing {
        /// The backend that needs it.
        family: BackendFamily,
        /// The shared library looked for.
        library: &'static str,
        /// The loader's message.
        reason: String,
        /// Packages that provide it.
        packages: &'static str,
        /// The backend crate's own install command (kept for
        /// [`TransferError::LibraryMissing`] when converted back).
        install_hint: &'static str,
    },
    /// The backend loaded but offered nothing to open.
    #[error("{family} backend: no NIC to open ({detail})")]
    NoDevice {
        /// The backend.
        family: BackendFamily,
        /// What was looked for.
        detail: String,
    },
    /// Opening a domain failed.
    #[error("{family} backend: opening {what} failed: {source}")]
    Open {
        /// The backend.
        family: BackendFamily,
        /// What was being opened (provider, device).
        what: String,
        /// The backend's error.
        #[source]
        source: TransferError,
    },
    /// The engine refused to start.
    #[error("starting the engine failed: {0}")]
    Engine(#[source] TransferError),
}

/// Results of this crate.
pub type BackendResult<T> = std::result::Result<T, BackendError>;

impl From<SelectionError> for BackendError {
    fn from(e: SelectionError) -> Self {
        match e {
            SelectionError::UnknownBackend(name) => Self::UnknownBackend(name),
        }
    }
}

impl BackendError {
    /// Wraps an error of opening `what` on `family`, naming the package to
    /// install when a native library is what is missing.
    pub fn opening(family: BackendFamily, what: impl Into<String>, e: TransferError) -> Self {
        match e {
            TransferError::LibraryMissing {
                library,
                reason,
                install_hint,
            } => Self::LibraryMissing {
                family,
                library,
                reason,
                packages: packages_of(family),
                install_hint,
            },
            source => Self::Open {
                family,
                what: what.into(),
                source,
            },
        }
    }
}

/// For callers whose errors are [`TransferError`]s (the Python package
/// maps those to its exception classes): backend errors come back as they
/// were, choices that cannot be honoured as invalid arguments.
impl From<BackendError> for TransferError {
    fn from(e: BackendError) -> Self {
        const CALL: &str = "transfer::Backend";
        match e {
            BackendError::LibraryMissing {
                library,
                reason,
                install_hint,
                ..
            } => TransferError::LibraryMissing {
                library,
                reason,
                install_hint,
            },
            BackendError::Open { source, .. } | BackendError::Engine(source) => source,
            other @ (BackendError::UnknownBackend(_)
            | BackendError::NotCompiledIn { .. }
            | BackendError::NoDevice { .. }) => TransferError::invalid(CALL, other.to_string()),
        }
    }
}

/// The Debian/Ubuntu packages that provide a backend's native library (and,
/// for verbs, the user-space drivers that make devices visible).
pub fn packages_of(family: BackendFamily) -> &'static str {
    match family {
        BackendFamily::Libfabric => "libfabric1",
        BackendFamily::Verbs => "libibverbs1 ibverbs-providers",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_names_its_package() {
        let e = BackendError::opening(
            BackendFamily::Verbs,
            "rxe0",
            TransferError::LibraryMissing {
                library: "libibverbs.so.1",
                reason: "not found".into(),
                install_hint: "apt-get install libibverbs1",
            },
        );
        let text = e.to_string();
        assert!(text.contains("libibverbs1 ibverbs-providers"), "{text}");
        assert!(text.contains("libibverbs.so.1"), "{text}");
        let back = TransferError::from(e);
        assert!(
            matches!(back, TransferError::LibraryMissing { install_hint, .. } if install_hint == "apt-get install libibverbs1"),
            "converted back as it came: {back}"
        );
        let e = BackendError::NotCompiledIn {
            family: BackendFamily::Verbs,
        };
        assert!(e.to_string().contains("`verbs` feature"), "{e}");
    }
}
