//! Which backend to use: the detection order and its overrides, as pure
//! logic over what the machine offers ([`Facts`]), so that the order is
//! tested without NICs. The probing itself lives in `probe.rs`.

/// Environment variable that forces the backend: `libfabric` or `verbs`.
pub const BACKEND_ENV: &str = "TRANSFER_BACKEND";
/// Environment variable naming the libfabric provider (`tcp`, `shm`,
/// `efa`, `udp`, or a raw libfabric name); implies the libfabric backend
/// unless `TRANSFER_BACKEND` says otherwise.
pub const PROVIDER_ENV: &str = "TRANSFER_PROVIDER";
/// Environment variable naming the verbs device (e.g. `mlx5_0`, `rxe0`);
/// implies the verbs backend unless `TRANSFER_BACKEND` says otherwise.
pub const VERBS_DEVICE_ENV: &str = "TRANSFER_VERBS_DEVICE";

/// The backend families this crate can open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BackendFamily {
    /// libfabric (EFA, tcp, shm, ...): crate `transfer-efa`.
    Libfabric,
    /// Native ibverbs (ConnectX, RoCE, soft-RoCE): crate `transfer-verbs`.
    Verbs,
}

impl BackendFamily {
    /// Parses `libfabric` / `verbs` (also `fi`, `ofi`, `ibverbs`, `rdma`).
    pub fn parse(name: &str) -> Option<Self> {
        match name.trim().to_ascii_lowercase().as_str() {
            "libfabric" | "fi" | "ofi" => Some(Self::Libfabric),
            "verbs" | "ibverbs" | "rdma" => Some(Self::Verbs),
            _ => None,
        }
    }

    /// The cargo feature of `transfer` that compiles this backend in.
    pub fn feature(self) -> &'static str {
        match self {
            Self::Libfabric => "libfabric",
            Self::Verbs => "verbs",
        }
    }
}

impl std::fmt::Display for BackendFamily {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.feature())
    }
}

/// What the caller (or the environment) asked for. Every field `None`
/// means: detect.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    /// `libfabric` or `verbs` (config, else [`BACKEND_ENV`]).
    pub backend: Option<String>,
    /// A libfabric provider name (config, else [`PROVIDER_ENV`]).
    pub provider: Option<String>,
    /// A verbs device name (config, else [`VERBS_DEVICE_ENV`]).
    pub verbs_device: Option<String>,
}

impl Overrides {
    /// The overrides the process environment sets.
    pub fn from_env() -> Self {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// The overrides read through `get` (tests pass a map; empty values
    /// count as unset, as a shell's `VAR=` does).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Self {
        let read = |k| {
            get(k)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        Self {
            backend: read(BACKEND_ENV),
            provider: read(PROVIDER_ENV),
            verbs_device: read(VERBS_DEVICE_ENV),
        }
    }

    /// `self`, with what it leaves unset taken from `fallback` (config
    /// over environment).
    pub fn or(self, fallback: Overrides) -> Self {
        Self {
            backend: self.backend.or(fallback.backend),
            provider: self.provider.or(fallback.provider),
            verbs_device: self.verbs_device.or(fallback.verbs_device),
        }
    }
}

/// What the machine offers, asked lazily: detection stops probing at the
/// first backend that fits (opening a verbs device is not free).
pub trait Facts {
    /// Whether libfabric loads and offers its `efa` provider.
    fn efa_present(&mut self) -> bool;
    /// Whether the verbs backend is compiled in, libibverbs loads and a
    /// device (`device`, or the first with an active port) opens.
    fn verbs_device_opens(&mut self, device: Option<&str>) -> bool;
}

/// The backend a selection settled on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    /// libfabric with this provider name (`efa`, `tcp`, `shm`, ...).
    Libfabric {
        /// Provider name as given (parsed by transfer-efa).
        provider: String,
    },
    /// Native verbs on this device (`None`: the first with an active port).
    Verbs {
        /// Device name.
        device: Option<String>,
    },
}

impl Choice {
    /// Its family.
    pub fn family(&self) -> BackendFamily {
        match self {
            Self::Libfabric { .. } => BackendFamily::Libfabric,
            Self::Verbs { .. } => BackendFamily::Verbs,
        }
    }
}

/// Why no backend could be chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SelectionError {
    /// `TRANSFER_BACKEND` (or the config) names no known backend.
    UnknownBackend(String),
}

/// The selection rule:
///
/// 1. an explicit backend wins (`libfabric` with the given provider, else
///    EFA when present, else tcp; `verbs` with the given device);
/// 2. else a provider given implies libfabric, a verbs device given
///    implies verbs (both given: the provider, as `TRANSFER_PROVIDER` was
///    the only switch before verbs existed);
/// 3. else EFA when present, then a verbs device that opens, then tcp.
pub fn choose(o: &Overrides, facts: &mut dyn Facts) -> Result<Choice, SelectionError> {
    let libfabric_default = |facts: &mut dyn Facts| {
        if facts.efa_present() { "efa" } else { "tcp" }
    };
    let family = match &o.backend {
        Some(name) => Some(
            BackendFamily::parse(name)
                .ok_or_else(|| SelectionError::UnknownBackend(name.clone()))?,
        ),
        None if o.provider.is_some() => Some(BackendFamily::Libfabric),
        None if o.verbs_device.is_some() => Some(BackendFamily::Verbs),
        None => None,
    };
    Ok(match family {
        Some(BackendFamily::Libfabric) => Choice::Libfabric {
            provider: match &o.provider {
                Some(p) => p.clone(),
                None => libfabric_default(facts).to_owned(),
            },
        },
        Some(BackendFamily::Verbs) => Choice::Verbs {
            device: o.verbs_device.clone(),
        },
        None if facts.efa_present() => Choice::Libfabric {
            provider: "efa".into(),
        },
        None if facts.verbs_device_opens(None) => Choice::Verbs { device: None },
        None => Choice::Libfabric {
            provider: "tcp".into(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A machine described by two booleans; counts what was probed.
    struct Machine {
        efa: bool,
        verbs: bool,
        probes: Vec<&'static str>,
    }

    impl Machine {
        fn new(efa: bool, verbs: bool) -> Self {
            Self {
                efa,
                verbs,
                probes: Vec::new(),
            }
        }
    }

    impl Facts for Machine {
        fn efa_present(&mut self) -> bool {
            self.probes.push("efa");
            self.efa
        }
        fn verbs_device_opens(&mut self, _device: Option<&str>) -> bool {
            self.probes.push("verbs");
            self.verbs
        }
    }

    fn env(pairs: &[(&str, &str)]) -> Overrides {
        Overrides::from_lookup(|k| {
            pairs
                .iter()
                .find(|(name, _)| *name == k)
                .map(|(_, v)| (*v).to_owned())
        })
    }

    fn lf(p: &str) -> Result<Choice, SelectionError> {
        Ok(Choice::Libfabric { provider: p.into() })
    }

    fn verbs(d: Option<&str>) -> Result<Choice, SelectionError> {
        Ok(Choice::Verbs {
            device: d.map(Into::into),
        })
    }

    #[test]
    fn detection_order_is_efa_then_verbs_then_tcp() {
        let none = Overrides::default();
        assert_eq!(choose(&none, &mut Machine::new(true, true)), lf("efa"));
        assert_eq!(choose(&none, &mut Machine::new(false, true)), verbs(None));
        assert_eq!(choose(&none, &mut Machine::new(false, false)), lf("tcp"));
    }

    #[test]
    fn detection_stops_probing_at_the_first_fit() {
        let mut m = Machine::new(true, true);
        let _ = choose(&Overrides::default(), &mut m);
        assert_eq!(
            m.probes,
            ["efa"],
            "no verbs device opened when EFA is there"
        );
        let mut m = Machine::new(false, false);
        let _ = choose(&env(&[("TRANSFER_PROVIDER", "shm")]), &mut m);
        assert!(m.probes.is_empty(), "an explicit provider probes nothing");
    }

    #[test]
    fn backend_env_wins_over_detection() {
        let m = || Machine::new(true, true);
        let o = env(&[("TRANSFER_BACKEND", "verbs")]);
        assert_eq!(choose(&o, &mut m()), verbs(None));
        let o = env(&[("TRANSFER_BACKEND", "libfabric")]);
        assert_eq!(choose(&o, &mut Machine::new(false, true)), lf("tcp"));
        assert_eq!(choose(&o, &mut m()), lf("efa"));
        let o = env(&[("TRANSFER_BACKEND", " IBVERBS ")]);
        assert_eq!(choose(&o, &mut m()), verbs(None));
    }

    #[test]
    fn provider_and_device_imply_their_backend() {
        let m = || Machine::new(true, true);
        let o = env(&[("TRANSFER_PROVIDER", "shm")]);
        assert_eq!(choose(&o, &mut m()), lf("shm"));
        let o = env(&[("TRANSFER_VERBS_DEVICE", "rxe0")]);
        assert_eq!(choose(&o, &mut m()), verbs(Some("rxe0")));
        let o = env(&[
            ("TRANSFER_VERBS_DEVICE", "rxe0"),
            ("TRANSFER_PROVIDER", "tcp"),
        ]);
        assert_eq!(choose(&o, &mut m()), lf("tcp"));
        let o = env(&[
            ("TRANSFER_VERBS_DEVICE", "mlx5_1"),
            ("TRANSFER_BACKEND", "verbs"),
            ("TRANSFER_PROVIDER", "tcp"),
        ]);
        assert_eq!(choose(&o, &mut m()), verbs(Some("mlx5_1")));
    }

    #[test]
    fn empty_values_count_as_unset_and_config_beats_env() {
        let o = env(&[("TRANSFER_BACKEND", ""), ("TRANSFER_PROVIDER", "  ")]);
        assert_eq!(o, Overrides::default());
        let config = Overrides {
            provider: Some("udp".into()),
            ..Overrides::default()
        };
        let merged = config.or(env(&[
            ("TRANSFER_PROVIDER", "tcp"),
            ("TRANSFER_BACKEND", "libfabric"),
        ]));
        assert_eq!(merged.provider.as_deref(), Some("udp"));
        assert_eq!(merged.backend.as_deref(), Some("libfabric"));
    }

    #[test]
    fn unknown_backend_is_refused() {
        let o = env(&[("TRANSFER_BACKEND", "carrier-pigeon")]);
        assert_eq!(
            choose(&o, &mut Machine::new(true, true)),
            Err(SelectionError::UnknownBackend("carrier-pigeon".into()))
        );
    }
}
