//! Which way `--delay` is applied, and the check that it is: round trips
//! of one byte between the coordinator's host and a server host must take
//! at least twice the one-way delay. Pure (unit-tested); `mod.rs` runs the
//! probes.

use std::collections::BTreeMap;
use std::time::Duration;

use super::args::DelayMode;
use super::json::Json;
use super::link_probe::RoundTrips;

/// How the delay is applied in this run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    /// netem qdiscs on both ends of the coordinator's link.
    Netem,
    /// The user-space delay proxy; `netem_missing` when chosen because
    /// this kernel has no sch_netem (rather than asked for).
    Proxy {
        /// The netem probe failed.
        netem_missing: bool,
    },
}

impl Applied {
    /// Chooses from the requested mode and whether netem works here
    /// (`netem` is only called where it matters: it builds a namespace).
    pub fn choose(
        mode: DelayMode,
        netem: impl FnOnce() -> Result<(), String>,
    ) -> Result<Applied, String> {
        match mode {
            DelayMode::Netem => netem().map(|()| Applied::Netem),
            DelayMode::Proxy => Ok(Applied::Proxy {
                netem_missing: false,
            }),
            DelayMode::Auto => Ok(match netem() {
                Ok(()) => Applied::Netem,
                Err(_) => Applied::Proxy {
                    netem_missing: true,
                },
            }),
        }
    }

    /// How the output and results.json name it.
    pub fn label(self) -> &'static str {
        match self {
            Applied::Netem => "netem",
            Applied::Proxy {
                netem_missing: true,
            } => "proxy (user space; sch_netem missing)",
            Applied::Proxy {
                netem_missing: false,
            } => "proxy (user space; requested)",
        }
    }

    /// Whether the coordinator connects through the proxy.
    pub fn proxied(self) -> bool {
        matches!(self, Applied::Proxy { .. })
    }
}

/// Timer slack allowed below 2 × delay (netem schedules on the kernel's
/// clock; the proxy never releases early).
const SLACK: f64 = 0.95;

/// Checks the measured round trips: `delayed` (the path the coordinator
/// uses) must take at least 2 × `delay`; `undelayed` (straight to the
/// echo, for the proxy; None for netem, which delays every path) is the
/// link's own round trip. Returns the record for results.json.
pub fn check(
    applied: Applied,
    delay: Duration,
    undelayed: Option<RoundTrips>,
    delayed: RoundTrips,
) -> Result<Json, String> {
    let two_way = 2.0 * delay.as_secs_f64() * 1e3;
    let base = undelayed.map_or(0.0, |u| u.median);
    if delayed.median < SLACK * two_way {
        return Err(format!(
            "the delay is not applied ({}): round trips take {:.3} ms (median), \
             2 x {:.3} ms was expected",
            applied.label(),
            delayed.median,
            two_way / 2.0
        ));
    }
    let mut m = BTreeMap::new();
    m.insert("mode".into(), Json::Str(applied.label().into()));
    m.insert("one_way_delay_ms".into(), Json::Num(two_way / 2.0));
    m.insert("expected_rtt_ms_at_least".into(), Json::Num(base + two_way));
    m.insert("rtt_ms_median".into(), Json::Num(delayed.median));
    m.insert("rtt_ms_min".into(), Json::Num(delayed.min));
    m.insert("rtt_ms_max".into(), Json::Num(delayed.max));
    m.insert(
        "undelayed_rtt_ms_median".into(),
        undelayed.map_or(Json::Null, |u| Json::Num(u.median)),
    );
    Ok(Json::Obj(m))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rt(min: f64, median: f64, max: f64) -> RoundTrips {
        RoundTrips { min, median, max }
    }

    #[test]
    fn auto_prefers_netem_and_falls_back_to_the_proxy() {
        let works = || Ok(());
        let missing = || Err("no sch_netem".to_string());
        assert_eq!(Applied::choose(DelayMode::Auto, works), Ok(Applied::Netem));
        assert_eq!(
            Applied::choose(DelayMode::Auto, missing),
            Ok(Applied::Proxy {
                netem_missing: true
            })
        );
        assert!(Applied::choose(DelayMode::Netem, missing).is_err());
        assert_eq!(
            Applied::choose(DelayMode::Proxy, || Err("not asked".into())),
            Ok(Applied::Proxy {
                netem_missing: false
            })
        );
        assert_eq!(
            Applied::Proxy {
                netem_missing: true
            }
            .label(),
            "proxy (user space; sch_netem missing)"
        );
        assert!(!Applied::Netem.proxied());
    }

    #[test]
    fn round_trips_must_cover_twice_the_delay() -> Result<(), String> {
        let proxy = Applied::Proxy {
            netem_missing: true,
        };
        let d = Duration::from_millis(2);
        let j = check(proxy, d, Some(rt(0.05, 0.08, 0.3)), rt(4.1, 4.2, 5.0))?;
        let expected = j.num("expected_rtt_ms_at_least").unwrap_or(f64::NAN);
        assert!((expected - 4.08).abs() < 1e-9, "{expected}");
        assert_eq!(j.num("rtt_ms_median"), Some(4.2));
        assert_eq!(j.str("mode"), Some("proxy (user space; sch_netem missing)"));
        assert!(check(proxy, d, Some(rt(0.05, 0.08, 0.3)), rt(0.1, 0.2, 9.0)).is_err());
        let n = check(Applied::Netem, d, None, rt(3.9, 4.0, 4.4))?;
        assert_eq!(n.get("undelayed_rtt_ms_median"), Some(&Json::Null));
        assert!(check(Applied::Netem, d, None, rt(1.0, 1.0, 1.0)).is_err());
        Ok(())
    }
}
