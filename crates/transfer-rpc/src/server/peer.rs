//! Connections from this server to other servers for COPY_TENSOR_TO.
//!
//! One pool per session: peer connections are cached per destination and
//! closed when the session that asked ends. Every failure is recoverable
//! (the client falls back to the hub), so the pool answers `false` rather
//! than erroring.
//!
//! A client names the destination, so without a policy any client could
//! make the server connect anywhere it can reach. The operator says where
//! copies may go ([`PeerAllow`]); by default nowhere (COPY_TENSOR_TO then
//! answers 0 and the client copies through itself).

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use crate::client::{Client, ClientConfig};
use crate::error::{Result, RpcError};
use crate::protocol::RpcTensor;
use crate::protocol::hello::{FEATURE_PEER_BARRIER, FEATURE_PEER_MARK, HelloResponse};

/// One rule of [`PeerAllow`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerRule {
    /// Every destination (`any`).
    Any,
    /// Exactly this `host:port`, as the client sends it.
    Endpoint(String),
    /// Any port on an address of this network (`10.0.0.0/8`, `::1/128`,
    /// a bare address, or `loopback`). Matches IP-literal endpoints only:
    /// a host name would be resolved again at connect time.
    Net(IpAddr, u8),
}

/// Where COPY_TENSOR_TO may connect. Empty: nowhere.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerAllow(pub Vec<PeerRule>);

fn parse_net(s: &str) -> Option<PeerRule> {
    let (ip, bits) = match s.split_once('/') {
        Some((ip, bits)) => (ip.parse::<IpAddr>().ok()?, Some(bits.parse::<u8>().ok()?)),
        None => (s.parse::<IpAddr>().ok()?, None),
    };
    let max = if ip.is_ipv4() { 32 } else { 128 };
    let bits = bits.unwrap_or(max);
    (bits <= max).then_some(PeerRule::Net(ip, bits))
}

fn in_net(ip: IpAddr, net: IpAddr, bits: u8) -> bool {
    match (ip.to_canonical(), net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(bits)).unwrap_or(0);
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(bits)).unwrap_or(0);
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

impl PeerAllow {
    /// Parses `--peer-allow` entries: `any`, `loopback`, `ADDR[/BITS]`, or
    /// `host:port`.
    pub fn parse(entries: &[String]) -> Result<PeerAllow> {
        let mut rules = Vec::new();
        for e in entries.iter().map(|e| e.trim()) {
            match e {
                "any" | "*" => rules.push(PeerRule::Any),
                "loopback" => {
                    rules.push(PeerRule::Net(IpAddr::from([127, 0, 0, 0]), 8));
                    rules.push(PeerRule::Net(
                        IpAddr::from([0u16, 0, 0, 0, 0, 0, 0, 1]),
                        128,
                    ));
                }
                _ => match parse_net(e) {
                    Some(r) => rules.push(r),
                    None if e
                        .rsplit_once(':')
                        .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok()) =>
                    {
                        rules.push(PeerRule::Endpoint(e.to_owned()))
                    }
                    None => {
                        return Err(RpcError::refused(
                            "--peer-allow",
                            format!("`{e}` is not any, loopback, ADDR[/BITS] or host:port"),
                        ));
                    }
                },
            }
        }
        Ok(PeerAllow(rules))
    }

    /// Whether a rule allows the host `ip` (port `port`, when the address
    /// has one): `any`, a network holding it, or an exact `ip:port`.
    pub fn permits_ip(&self, ip: IpAddr, port: Option<u16>) -> bool {
        self.0.iter().any(|r| match r {
            PeerRule::Any => true,
            PeerRule::Net(net, bits) => in_net(ip, *net, *bits),
            PeerRule::Endpoint(e) => {
                port.is_some_and(|p| e.parse::<SocketAddr>() == Ok(SocketAddr::new(ip, p)))
            }
        })
    }

    /// Whether the rules allow only what `any` allows.
    pub fn permits_any(&self) -> bool {
        self.0.contains(&PeerRule::Any)
    }

    /// What to connect to for `endpoint`, if a rule allows it: the
    /// endpoint itself (`any`, an exact rule) or the checked socket address
    /// (a network rule; connecting to the literal address means nothing is
    /// resolved again after the check).
    pub fn permits(&self, endpoint: &str) -> Option<String> {
        let literal = endpoint.parse::<SocketAddr>().ok();
        self.0.iter().find_map(|r| match r {
            PeerRule::Any => Some(endpoint.to_owned()),
            PeerRule::Endpoint(e) => (e == endpoint).then(|| endpoint.to_owned()),
            PeerRule::Net(net, bits) => literal
                .filter(|a| in_net(a.ip(), *net, *bits))
                .map(|a| a.to_string()),
        })
    }
}

/// Peer connection settings.
#[derive(Debug, Clone)]
pub struct PeerConfig {
    /// Allowed destinations.
    pub allow: PeerAllow,
    /// Connect timeout.
    pub connect_timeout: Duration,
    /// Read/write timeout.
    pub io_timeout: Duration,
    /// Most connections kept open (one more closes the least recently
    /// used); also bounds the destinations remembered as unsupported.
    pub max_connections: usize,
}

/// Cached peer connections of one session.
#[derive(Debug)]
pub struct PeerPool {
    config: PeerConfig,
    conns: HashMap<String, Client>,
    /// Cached endpoints, least recently used first.
    order: VecDeque<String>,
    unsupported: HashSet<String>,
}

impl PeerPool {
    /// An empty pool.
    pub fn new(config: PeerConfig) -> Self {
        PeerPool {
            config,
            conns: HashMap::new(),
            order: VecDeque::new(),
            unsupported: HashSet::new(),
        }
    }

    /// Refuses destinations the operator did not allow.
    pub fn check_allowed(&self, endpoint: &str) -> Result<()> {
        match self.config.allow.permits(endpoint) {
            Some(_) => Ok(()),
            None => Err(RpcError::refused(
                "COPY_TENSOR_TO",
                format!(
                    "destination {endpoint} is not allowed (the server's --peer-allow; none by default)"
                ),
            )),
        }
    }

    fn connect(&self, endpoint: &str) -> Result<Client> {
        let Some(target) = self.config.allow.permits(endpoint) else {
            return Err(RpcError::refused(
                "COPY_TENSOR_TO",
                "destination not allowed",
            ));
        };
        let endpoint = target.as_str();
        // The handshake gets the short timeout: an upstream destination
        // serves one connection at a time and would leave it unanswered.
        let cfg = ClientConfig {
            p2p: false,
            stats: false,
            connect_timeout: Some(self.config.connect_timeout),
            io_timeout: Some(self.config.connect_timeout),
            probe_extensions: false,
            ..ClientConfig::default()
        };
        let mut c = Client::connect_plain(endpoint, cfg)?;
        let ext = c.ext_query()?;
        c.set_io_timeout(Some(self.config.io_timeout))?;
        if !ext.has(FEATURE_PEER_BARRIER) {
            return Err(RpcError::ExtensionUnsupported {
                call: "COPY_TENSOR_TO",
            });
        }
        Ok(c)
    }

    /// Writes `size` bytes into `dst` on `endpoint`, `chunk` bytes at a
    /// time as `read(offset, len)` gives them, and waits for PEER_BARRIER,
    /// or with `mark = Some((key, seq))` for PEER_MARK (the destination's
    /// MARK_WAIT ends with it; served in order, so after the data).
    /// Returns false (with the reason) on any failure; the connection is
    /// dropped so the next attempt starts fresh.
    pub fn copy(
        &mut self,
        endpoint: &str,
        dst: &RpcTensor,
        size: u64,
        chunk: u64,
        mark: Option<(u64, u64)>,
        mut read: impl FnMut(u64, u64) -> std::result::Result<Vec<u8>, String>,
    ) -> std::result::Result<(), String> {
        if self.unsupported.contains(endpoint) {
            return Err(format!("{endpoint} does not support the extension"));
        }
        if !self.conns.contains_key(endpoint) {
            match self.connect(endpoint) {
                Ok(c) => {
                    // A client naming ever new destinations would otherwise
                    // make this session hold a socket (and a session on the
                    // destination) for each.
                    while self.conns.len() >= self.config.max_connections.max(1) {
                        let Some(old) = self.order.pop_front() else {
                            break;
                        };
                        self.conns.remove(&old);
                    }
                    self.conns.insert(endpoint.to_owned(), c);
                }
                Err(e) => {
                    if matches!(
                        e,
                        RpcError::ExtensionUnsupported { .. } | RpcError::Version { .. }
                    ) {
                        if self.unsupported.len() >= 8 * self.config.max_connections.max(1) {
                            self.unsupported.clear();
                        }
                        self.unsupported.insert(endpoint.to_owned());
                    }
                    return Err(e.to_string());
                }
            }
        }
        self.order.retain(|e| e != endpoint);
        self.order.push_back(endpoint.to_owned());
        let Some(conn) = self.conns.get_mut(endpoint) else {
            return Err("peer connection vanished".into());
        };
        if mark.is_some()
            && !conn
                .probe_extensions()
                .is_some_and(|e| e.has(FEATURE_PEER_MARK))
        {
            return Err(format!("{endpoint} does not serve PEER_MARK"));
        }
        let mut done = 0u64;
        let mut result = Ok(true);
        while done < size {
            let n = (size - done).min(chunk.max(1));
            let piece = read(done, n)?;
            if let Err(e) = conn.set_tensor(dst, done, &piece) {
                result = Err(e);
                break;
            }
            done += n;
        }
        let result = result.and_then(|_| match mark {
            Some((key, seq)) => conn.peer_mark(key, seq),
            None => conn.peer_barrier(),
        });
        match result {
            Ok(true) => Ok(()),
            Ok(false) => {
                self.forget(endpoint);
                Err(if mark.is_some() {
                    "the destination holds no such mark key".into()
                } else {
                    "peer barrier failed".into()
                })
            }
            Err(e) => {
                self.forget(endpoint);
                Err(format!("destination rejected or dropped the write: {e}"))
            }
        }
    }

    fn forget(&mut self, endpoint: &str) {
        self.conns.remove(endpoint);
        self.order.retain(|e| e != endpoint);
    }

    /// Number of cached connections.
    pub fn len(&self) -> usize {
        self.conns.len()
    }

    /// True when no connection is cached.
    pub fn is_empty(&self) -> bool {
        self.conns.is_empty()
    }

    /// Version of a cached peer, if connected.
    pub fn peer_version(&self, endpoint: &str) -> Option<HelloResponse> {
        self.conns.get(endpoint).map(Client::server_version)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allow(e: &[&str]) -> PeerAllow {
        PeerAllow::parse(&e.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap_or_default()
    }

    #[test]
    fn nothing_is_allowed_by_default_and_rules_match_what_they_say() {
        assert_eq!(PeerAllow::default().permits("127.0.0.1:50052"), None);
        let lo = allow(&["loopback"]);
        assert_eq!(lo.permits("127.0.0.1:5").as_deref(), Some("127.0.0.1:5"));
        assert_eq!(lo.permits("[::1]:5").as_deref(), Some("[::1]:5"));
        assert_eq!(lo.permits("10.0.0.1:5"), None);
        assert_eq!(lo.permits("localhost:5"), None, "names are not resolved");
        let net = allow(&["10.77.0.0/24", "host.example:7"]);
        assert!(net.permits("10.77.0.9:1").is_some());
        assert!(net.permits("10.77.1.9:1").is_none());
        assert!(net.permits("host.example:7").is_some());
        assert!(net.permits("host.example:8").is_none());
        assert!(allow(&["any"]).permits("anything:1").is_some());
        assert!(allow(&["0.0.0.0/0"]).permits("192.168.1.1:1").is_some());
        let ip = |s: &str| s.parse::<IpAddr>().unwrap_or(IpAddr::from([0, 0, 0, 0]));
        assert!(lo.permits_ip(ip("127.0.0.9"), None));
        assert!(!lo.permits_ip(ip("10.0.0.1"), Some(5)));
        let exact = allow(&["10.1.2.3:7"]);
        assert!(exact.permits_ip(ip("10.1.2.3"), Some(7)));
        assert!(!exact.permits_ip(ip("10.1.2.3"), Some(8)));
        assert!(!exact.permits_ip(ip("10.1.2.3"), None));
        for bad in ["10.0.0.0/33", "nonsense", ":80", "host:99999"] {
            assert!(PeerAllow::parse(&[bad.to_string()]).is_err(), "{bad}");
        }
    }
}
