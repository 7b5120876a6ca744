//! Opening engines and bare domains: the `transfer` crate's [`Backend`]
//! (libfabric or native verbs) with the bench's defaults (loopback unless
//! `--bind`, the engine's default idle policy).

use std::time::Duration;

use transfer::{AnyDomain, Backend, BackendConfig, BackendFamily, Choice};
use transfer_core::{IdlePolicy, TransferEngine};

use crate::error::Result;

/// Which backend, provider and interface to use.
#[derive(Debug, Clone)]
pub struct BackendOpts {
    /// `libfabric` or `verbs`; `None`: `TRANSFER_BACKEND`, else detected
    /// (EFA, then a verbs device that opens, then tcp).
    pub backend: Option<String>,
    /// libfabric provider name (`tcp`, `shm`, `efa`, ...); `None`:
    /// `TRANSFER_PROVIDER`, else EFA when present, else tcp.
    pub provider: Option<String>,
    /// verbs device (`mlx5_0`, `rxe0`); `None`: `TRANSFER_VERBS_DEVICE`,
    /// else the first with an active port.
    pub verbs_device: Option<String>,
    /// IP address endpoints bind to (IP providers). `None`: loopback.
    pub bind: Option<String>,
    /// NICs (domains) per engine.
    pub nics: usize,
}

impl BackendOpts {
    /// The backend this run uses, resolved (environment and probing
    /// included): server and driver must agree, so both resolve it the
    /// same way.
    pub fn backend(&self) -> Result<Backend> {
        let backend = Backend::from_config(BackendConfig {
            backend: self.backend.clone(),
            provider: self.provider.clone(),
            verbs_device: self.verbs_device.clone(),
            nics: Some(self.nics.max(1)),
            ..BackendConfig::default()
        })?;
        Ok(match &self.bind {
            Some(ip) => backend.bind(ip.clone()),
            None => backend.loopback(),
        })
    }

    /// These options with the detection done once: backend and provider
    /// (or device) explicit, so that every engine and bare domain of the
    /// run, and the server child, open the same thing without probing the
    /// machine again.
    pub fn resolved(&self) -> Result<Self> {
        let backend = self.backend()?;
        let mut out = self.clone();
        out.backend = Some(backend.family().to_string());
        match backend.choice() {
            Choice::Libfabric { provider } => out.provider = Some(provider.clone()),
            Choice::Verbs { device } => out.verbs_device.clone_from(device),
        }
        Ok(out)
    }

    /// The backend family of this run.
    pub fn family(&self) -> Result<BackendFamily> {
        Ok(self.backend()?.family())
    }

    /// The provider name for reports (`tcp;ofi_rxm`, `efa`, `ibverbs rxe0`).
    pub fn provider(&self) -> Result<String> {
        Ok(self.backend()?.name())
    }

    /// Starts an engine with the bench's idle policy.
    pub fn engine(&self) -> Result<TransferEngine> {
        Ok(self
            .backend()?
            .engine_with(|b| b.idle_policy(idle_policy()))?)
    }

    /// One bare domain (no engine), for the raw baseline.
    pub fn bare_domain(&self) -> Result<AnyDomain> {
        Ok(self.backend()?.bare_domain()?)
    }
}

/// The idle policy every bench engine uses (the engine's default), reported with the idle cost.
pub fn idle_policy() -> IdlePolicy {
    IdlePolicy::default()
}

/// Failure guard for waits in the bench (never a measurement).
pub const GUARD: Duration = Duration::from_secs(120);
