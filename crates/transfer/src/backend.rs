//! [`Backend`]: a chosen backend plus how to open it (NICs, bind address),
//! turned into domains and engines. The one place that maps "provider or
//! device name" to opened domains.

use std::time::Duration;

use transfer_core::{EngineBuilder, TransferEngine};

use crate::backend_error::{BackendError, BackendResult as Result};
use crate::domains::{AnyDomain, Domains};
use crate::probe::SystemProbe;
use crate::selection::{BackendFamily, Choice, Facts, Overrides, choose};

/// Endpoints an engine opens by default on a provider with one NIC per
/// interface: two on tcp (each a connection per peer, a write's bytes
/// sharded over both above 512 KiB, a batch's rows split into one
/// contiguous run per connection), one on shm, udp and sockets.
///
/// Why two on tcp: UCX stripes a NIXL stream over two TCP connections
/// too, and one connection left large writes behind it. Python peers
/// bench over loopback (`cargo xtask bench --peers`, 2 cores, thread mode,
/// 2026-12-04/05, one endpoint vs two vs NIXL caller in the same runs):
/// 1 MiB writes 3.5-4.8 GB/s on one connection, 4.4-5.0 on two, NIXL
/// 4.1-5.3; 16 MiB 3.5-4.4 / 3.8-4.6 / 3.3-4.1; 64 KiB 3.6-4.7 /
/// 4.2-5.0 (after the contiguous runs; round robin had lost 15-25 % there)
/// / 1.8-3.3; 8 B write and echo latency within 1 us, paged and the kv
/// workload within run-to-run noise.
#[cfg(feature = "libfabric")]
fn default_endpoints(provider: &str) -> usize {
    match transfer_efa::Provider::parse(provider) {
        transfer_efa::Provider::Tcp => 2,
        _ => 1,
    }
}

/// What a caller may set; every `None` is detected or defaulted. The
/// environment fills what this leaves unset ([`Backend::from_config`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BackendConfig {
    /// `libfabric` or `verbs` (else `TRANSFER_BACKEND`, else detected).
    pub backend: Option<String>,
    /// libfabric provider (`tcp`, `shm`, `efa`, ...; else `TRANSFER_PROVIDER`).
    pub provider: Option<String>,
    /// verbs device (`mlx5_0`, `rxe0`; else `TRANSFER_VERBS_DEVICE`).
    pub verbs_device: Option<String>,
    /// See [`Backend::nics`].
    pub nics: Option<usize>,
    /// See [`Backend::bind`].
    pub bind: Option<String>,
    /// See [`Backend::domain_name`].
    pub domain_name: Option<String>,
    /// See [`Backend::peer_timeout`].
    pub peer_timeout: Option<Duration>,
}

/// A backend ready to open: which one, on which NICs.
///
/// ```no_run
/// // Whatever this machine has: EFA, else a verbs device, else tcp.
/// let engine = transfer::Backend::detect()?.engine()?;
/// # Ok::<(), transfer::BackendError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backend {
    choice: Choice,
    nics: Option<usize>,
    bind: Option<String>,
    domain_name: Option<String>,
    peer_timeout: Option<Duration>,
}

impl Backend {
    /// Detects the backend: `TRANSFER_BACKEND` / `TRANSFER_PROVIDER` /
    /// `TRANSFER_VERBS_DEVICE` when set, else EFA when libfabric offers it,
    /// else a verbs device that opens (with the `verbs` feature), else
    /// libfabric tcp. See [`crate::selection::choose`].
    pub fn detect() -> Result<Self> {
        Self::from_config(BackendConfig::default())
    }

    /// [`Backend::detect`] with `config` over the environment.
    pub fn from_config(config: BackendConfig) -> Result<Self> {
        Self::from_config_with(config, Overrides::from_env(), &mut SystemProbe)
    }

    /// The selection with the environment and the machine given (tests).
    pub fn from_config_with(
        config: BackendConfig,
        env: Overrides,
        facts: &mut dyn Facts,
    ) -> Result<Self> {
        let asked = Overrides {
            backend: config.backend.clone(),
            provider: config.provider.clone(),
            verbs_device: config.verbs_device.clone(),
        };
        let choice = choose(&asked.or(env), facts)?;
        let backend = Self {
            choice,
            nics: config.nics,
            bind: config.bind,
            domain_name: config.domain_name,
            peer_timeout: config.peer_timeout,
        };
        backend.check_compiled_in()?;
        Ok(backend)
    }

    /// libfabric with `provider` (`tcp`, `shm`, `efa`, `udp`, or a raw
    /// libfabric name), whatever the environment says.
    pub fn libfabric(provider: &str) -> Self {
        Self::of(Choice::Libfabric {
            provider: provider.to_owned(),
        })
    }

    /// Native verbs on `device` (`None`: the first with an active port;
    /// port and GID index still follow `TRANSFER_VERBS_PORT` /
    /// `TRANSFER_VERBS_GID_INDEX`).
    pub fn verbs(device: Option<&str>) -> Self {
        Self::of(Choice::Verbs {
            device: device.map(str::to_owned),
        })
    }

    fn of(choice: Choice) -> Self {
        Self {
            choice,
            nics: None,
            bind: None,
            domain_name: None,
            peer_timeout: None,
        }
    }

    /// How many domains to open. `None` (default): every NIC on EFA (and
    /// other hardware providers named raw), two endpoints on tcp
    /// (measured in this file's `default_endpoints`), one on shm, udp and
    /// sockets. `Some(0)`: every NIC the provider lists. `Some(n)`: on
    /// multi-NIC providers the first n NICs; on single-NIC ones n
    /// independent endpoints on the first NIC, so multi-NIC sharding runs
    /// on one host; on verbs n domains on the device.
    pub fn nics(mut self, nics: usize) -> Self {
        self.nics = Some(nics);
        self
    }

    /// The IP address endpoints of IP-based libfabric providers (tcp, udp,
    /// sockets) bind to, e.g. the interface peers reach this host by.
    /// Ignored by other providers and by verbs (its GID names the port).
    pub fn bind(mut self, ip: impl Into<String>) -> Self {
        self.bind = Some(ip.into());
        self
    }

    /// Binds to `127.0.0.1`: both ends on this host (tests, local benches).
    pub fn loopback(self) -> Self {
        self.bind("127.0.0.1")
    }

    /// libfabric only: open just the domain of this name (tcp: the
    /// interface, e.g. `eth0`; efa: the device, e.g. `rdmap16s27`).
    pub fn domain_name(mut self, name: impl Into<String>) -> Self {
        self.domain_name = Some(name.into());
        self
    }

    /// libfabric only: how long a write may stay incomplete before it fails
    /// and its peer is marked dead (verbs: the RC retry settings decide).
    pub fn peer_timeout(mut self, timeout: Duration) -> Self {
        self.peer_timeout = Some(timeout);
        self
    }

    /// What was chosen.
    pub fn choice(&self) -> &Choice {
        &self.choice
    }

    /// The backend family.
    pub fn family(&self) -> BackendFamily {
        self.choice.family()
    }

    /// A short name for logs and reports: the libfabric provider string
    /// (`tcp;ofi_rxm`, `efa`) or `ibverbs` with the device.
    pub fn name(&self) -> String {
        match &self.choice {
            #[cfg(feature = "libfabric")]
            Choice::Libfabric { provider } => transfer_efa::Provider::parse(provider).to_string(),
            #[cfg(not(feature = "libfabric"))]
            Choice::Libfabric { provider } => provider.clone(),
            Choice::Verbs { device: Some(d) } => format!("ibverbs {d}"),
            Choice::Verbs { device: None } => "ibverbs".into(),
        }
    }

    fn check_compiled_in(&self) -> Result<()> {
        let family = self.family();
        let compiled = match family {
            BackendFamily::Libfabric => cfg!(feature = "libfabric"),
            BackendFamily::Verbs => cfg!(feature = "verbs"),
        };
        if compiled {
            Ok(())
        } else {
            Err(BackendError::NotCompiledIn { family })
        }
    }

    /// Opens the domains (NICs) of one engine group.
    pub fn open_domains(&self) -> Result<Domains> {
        self.check_compiled_in()?;
        let domains = match &self.choice {
            #[cfg(feature = "libfabric")]
            Choice::Libfabric { provider } => Domains::Libfabric(self.open_libfabric(provider)?),
            #[cfg(feature = "verbs")]
            Choice::Verbs { device } => Domains::Verbs(self.open_verbs(device.as_deref())?),
            #[allow(unreachable_patterns)] // reached only without a backend feature
            _ => {
                return Err(BackendError::NotCompiledIn {
                    family: self.family(),
                });
            }
        };
        if domains.is_empty() {
            return Err(BackendError::NoDevice {
                family: self.family(),
                detail: self.name(),
            });
        }
        Ok(domains)
    }

    /// Opens the domains and adds them to `builder` as one group: for
    /// engines whose builder the caller tunes, or with several groups.
    ///
    /// ```no_run
    /// use transfer::{Backend, IdlePolicy, TransferEngine};
    /// let backend = Backend::detect()?;
    /// let builder = backend.add_groups(TransferEngine::builder().queue_capacity(4096))?;
    /// let engine = builder.idle_policy(IdlePolicy::busy_poll()).build()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn add_groups(&self, builder: EngineBuilder) -> Result<EngineBuilder> {
        Ok(self.open_domains()?.add_to(builder))
    }

    /// Opens the domains and starts an engine with the default settings.
    pub fn engine(&self) -> Result<TransferEngine> {
        self.engine_with(|b| b)
    }

    /// Opens the domains and starts an engine whose builder `tune` adjusts
    /// (idle policy, queue capacity, shard policy, ...).
    ///
    /// ```no_run
    /// use transfer::{Backend, IdlePolicy};
    /// let engine = Backend::detect()?.engine_with(|b| b.idle_policy(IdlePolicy::busy_poll()))?;
    /// # Ok::<(), transfer::BackendError>(())
    /// ```
    pub fn engine_with(
        &self,
        tune: impl FnOnce(EngineBuilder) -> EngineBuilder,
    ) -> Result<TransferEngine> {
        tune(self.add_groups(TransferEngine::builder())?)
            .build()
            .map_err(BackendError::Engine)
    }

    /// One bare domain (no engine), for code that drives
    /// [`transfer_core::Domain`] itself.
    pub fn bare_domain(&self) -> Result<AnyDomain> {
        let mut one = self.clone();
        one.nics = Some(1);
        one.open_domains()?
            .into_any()
            .into_iter()
            .next()
            .ok_or_else(|| BackendError::NoDevice {
                family: self.family(),
                detail: self.name(),
            })
    }

    /// The libfabric configuration this backend opens with (`None` on
    /// verbs): for callers that tune it further and open with
    /// `transfer_efa` themselves.
    #[cfg(feature = "libfabric")]
    pub fn libfabric_config(&self) -> Option<transfer_efa::LibfabricConfig> {
        let Choice::Libfabric { provider } = &self.choice else {
            return None;
        };
        let provider = transfer_efa::Provider::parse(provider);
        let mut config = transfer_efa::LibfabricConfig::new(provider.clone());
        if provider.is_ip_based() {
            config.node.clone_from(&self.bind);
        }
        config.domain_name.clone_from(&self.domain_name);
        if let Some(t) = self.peer_timeout {
            config.peer_timeout = t;
        }
        Some(config)
    }

    #[cfg(feature = "libfabric")]
    fn open_libfabric(&self, provider: &str) -> Result<Vec<transfer_efa::LibfabricDomain>> {
        let family = BackendFamily::Libfabric;
        let config = self
            .libfabric_config()
            .ok_or(BackendError::NotCompiledIn { family })?;
        let opening = |e| BackendError::opening(family, format!("provider {provider}"), e);
        // tcp, shm, udp and sockets offer one NIC (per interface); EFA and
        // other hardware providers (`Raw`: libfabric verbs, psm3, cxi, ...)
        // list each NIC as a domain.
        let multi_nic = matches!(
            config.provider,
            Some(transfer_efa::Provider::Efa | transfer_efa::Provider::Raw(_))
        );
        match self.nics {
            // Every NIC the provider lists (EFA by default, anything on 0).
            None if multi_nic => transfer_efa::open_domains(&config).map_err(opening),
            Some(0) => transfer_efa::open_domains(&config).map_err(opening),
            Some(n) if multi_nic => {
                let mut all = transfer_efa::open_domains(&config).map_err(opening)?;
                all.truncate(n);
                Ok(all)
            }
            // Single-NIC providers: n independent endpoints on the first
            // NIC; by default two on tcp, one elsewhere.
            n => transfer_efa::open_loopback_domains(
                &config,
                n.unwrap_or_else(|| default_endpoints(provider)),
            )
            .map_err(opening),
        }
    }

    /// The verbs configuration this backend opens with (`None` on
    /// libfabric): defaults, `TRANSFER_VERBS_*` and the chosen device.
    #[cfg(feature = "verbs")]
    pub fn verbs_config(&self) -> Option<transfer_verbs::VerbsConfig> {
        let Choice::Verbs { device } = &self.choice else {
            return None;
        };
        let mut config = transfer_verbs::VerbsConfig::from_env();
        if device.is_some() {
            config.device.clone_from(device);
        }
        Some(config)
    }

    #[cfg(feature = "verbs")]
    fn open_verbs(&self, device: Option<&str>) -> Result<Vec<transfer_verbs::VerbsDomain>> {
        let family = BackendFamily::Verbs;
        let config = self
            .verbs_config()
            .ok_or(BackendError::NotCompiledIn { family })?;
        let what = format!("device {}", device.unwrap_or("(first with an active port)"));
        let count = self.nics.unwrap_or(1).max(1);
        transfer_verbs::VerbsDomain::open_many(&config, count)
            .map_err(|e| BackendError::opening(family, what, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Bare;

    impl Facts for Bare {
        fn efa_present(&mut self) -> bool {
            false
        }
        fn verbs_device_opens(&mut self, _: Option<&str>) -> bool {
            false
        }
    }

    #[test]
    fn config_wins_over_env_and_keeps_its_options() {
        let config = BackendConfig {
            provider: Some("shm".into()),
            nics: Some(2),
            ..BackendConfig::default()
        };
        let env = Overrides {
            provider: Some("tcp".into()),
            ..Overrides::default()
        };
        let b = Backend::from_config_with(config, env, &mut Bare);
        assert_eq!(
            b.as_ref().map(|b| (b.choice().clone(), b.nics)).ok(),
            Some((
                Choice::Libfabric {
                    provider: "shm".into()
                },
                Some(2)
            ))
        );
    }

    #[test]
    fn a_backend_not_compiled_in_is_an_error_naming_the_feature() {
        let env = Overrides {
            backend: Some("verbs".into()),
            ..Overrides::default()
        };
        let b = Backend::from_config_with(BackendConfig::default(), env, &mut Bare);
        if cfg!(feature = "verbs") {
            assert!(b.is_ok());
        } else {
            assert!(matches!(b, Err(BackendError::NotCompiledIn { .. })));
        }
    }

    #[cfg(feature = "libfabric")]
    #[test]
    fn names_are_the_provider_strings() {
        assert_eq!(Backend::libfabric("tcp").name(), "tcp;ofi_rxm");
        assert_eq!(Backend::verbs(Some("rxe0")).name(), "ibverbs rxe0");
        let config = Backend::libfabric("tcp").loopback().libfabric_config();
        assert_eq!(config.and_then(|c| c.node).as_deref(), Some("127.0.0.1"));
        let shm = Backend::libfabric("shm").loopback().libfabric_config();
        assert_eq!(shm.and_then(|c| c.node), None, "shm takes no IP address");
    }
}
