//! What this machine offers, asked of the real libraries: the [`Facts`]
//! that [`crate::selection::choose`] decides on.

use crate::selection::Facts;

/// Probes the installed libraries and devices. A library that does not
/// load counts as "not present" here; opening the chosen backend later
/// reports it with the package to install.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemProbe;

impl Facts for SystemProbe {
    fn efa_present(&mut self) -> bool {
        #[cfg(feature = "libfabric")]
        {
            // Only reached with no provider given (selection checks the
            // overrides first), so default_provider's own look at
            // TRANSFER_PROVIDER finds it unset and this asks libfabric.
            transfer_efa::Library::load().is_ok_and(|lib| {
                transfer_efa::default_provider(&lib) == transfer_efa::Provider::Efa
            })
        }
        #[cfg(not(feature = "libfabric"))]
        {
            false
        }
    }

    fn verbs_device_opens(&mut self, device: Option<&str>) -> bool {
        #[cfg(feature = "verbs")]
        {
            if !transfer_verbs::library_available() {
                return false;
            }
            let mut config = transfer_verbs::VerbsConfig::from_env();
            if let Some(d) = device {
                config.device = Some(d.to_owned());
            }
            // A device that is listed but cannot be opened (no active port,
            // no permission on /dev/infiniband) must not be chosen.
            transfer_verbs::VerbsDomain::open(config).is_ok()
        }
        #[cfg(not(feature = "verbs"))]
        {
            let _ = device;
            false
        }
    }
}
