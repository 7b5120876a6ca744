//! Opening engines and bare domains over the libfabric backend.

use std::time::Duration;

use transfer_core::{IdlePolicy, TransferEngine};
use transfer_efa::{Config, LibfabricDomain, Library, Provider};

use crate::error::Result;

/// Which provider and interface to use.
#[derive(Debug, Clone)]
pub struct BackendOpts {
    /// Provider name (`tcp`, `shm`, `efa`, ...); `None`: `TRANSFER_PROVIDER`,
    /// else EFA when present, else tcp.
    pub provider: Option<String>,
    /// IP address endpoints bind to (IP providers). `None`: loopback.
    pub bind: Option<String>,
    /// NICs (domains) per engine.
    pub nics: usize,
}

impl BackendOpts {
    /// The provider this run uses.
    pub fn provider(&self) -> Result<Provider> {
        Ok(match &self.provider {
            Some(p) => Provider::parse(p),
            None => transfer_efa::default_provider(&Library::load()?),
        })
    }

    /// The libfabric config for this run.
    pub fn config(&self) -> Result<Config> {
        let provider = self.provider()?;
        Ok(match &self.bind {
            Some(ip) if provider.is_ip_based() => Config::new(provider).with_node(ip.clone()),
            Some(_) => Config::new(provider),
            None => Config::loopback(provider),
        })
    }

    /// Opens `self.nics` domains: on EFA the NICs the machine has (up to
    /// `nics`); on single-NIC providers, independent endpoints.
    pub fn domains(&self) -> Result<Vec<LibfabricDomain>> {
        let config = self.config()?;
        if matches!(config.provider, Some(Provider::Efa)) {
            let mut all = transfer_efa::open_domains(&config)?;
            all.truncate(self.nics.max(1));
            return Ok(all);
        }
        Ok(transfer_efa::open_loopback_domains(
            &config,
            self.nics.max(1),
        )?)
    }

    /// Starts an engine with the default idle policy.
    pub fn engine(&self) -> Result<TransferEngine> {
        Ok(TransferEngine::builder()
            .idle_policy(idle_policy())
            .group(self.domains()?)
            .build()?)
    }

    /// One bare domain (no engine), for the raw baseline.
    pub fn bare_domain(&self) -> Result<LibfabricDomain> {
        let mut one = BackendOpts {
            nics: 1,
            ..self.clone()
        }
        .domains()?;
        one.pop()
            .ok_or_else(|| crate::error::BenchError::Usage("the provider offered no domain".into()))
    }
}

/// The idle policy every bench engine uses (the engine's default), reported with the idle cost.
pub fn idle_policy() -> IdlePolicy {
    IdlePolicy::default()
}

/// Failure guard for waits in the bench (never a measurement).
pub const GUARD: Duration = Duration::from_secs(120);
