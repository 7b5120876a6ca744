//! The pipeline lab as command plans (pure functions, unit-tested): the
//! coordinator on namespace host 0, server `s` (1-based) on host `s`, all
//! joined by the switch's bridge. Only the coordinator's link is shaped,
//! in both directions (egress of `eth0` in host 0: coordinator to servers;
//! egress of `port0` on the switch: servers to coordinator), so that it is
//! the bottleneck while server-to-server traffic runs at veth speed.

use crate::netns::{host_ip, ns, shape_with_burst, switch, switch_ns};

use super::args::{Arm, RpcArgs};
use super::delay_proxy::{Route, map_arg};

/// Port every RPC server listens on (each on its own host's address).
pub const SERVER_PORT: u16 = 50052;
/// Port of the link probe's sink.
pub const PROBE_PORT: u16 = 50099;
/// Port of the link probe's echo (round trips), on server host 1.
pub const ECHO_PORT: u16 = 50098;
/// The delay proxy listens on the coordinator's loopback at this port +
/// `s` for server `s`, and at this port for the echo.
pub const PROXY_BASE_PORT: u16 = 51000;

/// `host:port` of server `s` (1-based).
pub fn server_addr(s: usize) -> String {
    format!("{}:{SERVER_PORT}", host_ip(s))
}

/// Where the coordinator reaches server `s` through the delay proxy.
pub fn proxy_addr(s: usize) -> String {
    format!("127.0.0.1:{}", PROXY_BASE_PORT as usize + s)
}

/// The echo of the round-trip check, on server host 1.
pub fn echo_addr() -> String {
    format!("{}:{ECHO_PORT}", host_ip(1))
}

/// The echo through the delay proxy.
pub fn proxied_echo_addr() -> String {
    proxy_addr(0)
}

/// The delay proxy on the coordinator's host (this xtask binary at
/// `xtask`): the echo and every server, each `delay` later each way.
pub fn delay_proxy(xtask: &str, stages: usize, delay: &str) -> Vec<String> {
    let mut routes = vec![Route {
        listen: proxied_echo_addr(),
        target: echo_addr(),
    }];
    routes.extend((1..=stages).map(|s| Route {
        listen: proxy_addr(s),
        target: server_addr(s),
    }));
    vec![
        "ip".into(),
        "netns".into(),
        "exec".into(),
        ns(0),
        xtask.into(),
        "delay-proxy".into(),
        "--delay".into(),
        delay.into(),
        "--map".into(),
        map_arg(&routes),
    ]
}

/// Commands that build the coordinator host and `stages` server hosts,
/// shaping the coordinator's link with `rate` (and `delay` where given).
pub fn setup(
    stages: usize,
    rate: Option<&str>,
    delay: Option<&str>,
    burst: &str,
) -> Vec<Vec<String>> {
    let mut cmds = switch();
    for i in 0..=stages {
        cmds.extend(crate::netns::host_link(i));
    }
    cmds.extend(shape_with_burst(&ns(0), "eth0", rate, delay, burst));
    cmds.extend(shape_with_burst(&switch_ns(), "port0", rate, delay, burst));
    cmds
}

/// How the server binary is told about its engine (flags differ between
/// versions of `transfer-rpc-server`; read from its `--help`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineFlags {
    /// `--engine PROVIDER` exists.
    pub engine: bool,
    /// `--engine-iface IFACE` exists.
    pub iface: bool,
    /// `--engine-domain NAME` exists (the libfabric domain; on tcp the
    /// interface).
    pub domain: bool,
    /// `--engine-node ADDR` exists (the address the endpoints bind to).
    pub node: bool,
    /// `--peer-allow` takes networks and allows nothing by default (its
    /// help mentions `loopback`).
    pub peer_networks: bool,
}

impl EngineFlags {
    /// Reads the flags off the server's `--help` text.
    pub fn from_help(help: &str) -> EngineFlags {
        let has = |flag: &str| {
            help.split(|c: char| c.is_whitespace() || c == ',' || c == '=' || c == '[')
                .any(|w| w == flag)
        };
        EngineFlags {
            engine: has("--engine"),
            iface: has("--engine-iface"),
            domain: has("--engine-domain"),
            node: has("--engine-node"),
            peer_networks: has("--peer-allow") && help.contains("loopback"),
        }
    }
}

/// The command of server `s` (1-based).
pub fn server(bin: &str, s: usize, threads: usize, flags: EngineFlags) -> Vec<String> {
    let mut v: Vec<String> = vec![
        "ip".into(),
        "netns".into(),
        "exec".into(),
        ns(s),
        bin.into(),
        "--host".into(),
        host_ip(s),
        "--port".into(),
        SERVER_PORT.to_string(),
        "--threads".into(),
        threads.to_string(),
        // Direct copies between the lab's hosts (servers allow none unless
        // told; older servers took `--peer-allow` as host:port entries, and
        // an empty list meant any, so they are left as they were).
    ];
    if flags.peer_networks {
        v.extend(["--peer-allow".into(), format!("{}/24", host_ip(0))]);
    }
    if flags.engine {
        v.extend(["--engine".into(), "tcp".into()]);
    }
    if flags.engine && flags.iface {
        v.extend(["--engine-iface".into(), format!("eth{s}")]);
    }
    if flags.engine && flags.domain {
        v.extend(["--engine-domain".into(), format!("eth{s}")]);
    }
    if flags.engine && flags.node {
        v.extend(["--engine-node".into(), host_ip(s)]);
    }
    v
}

/// `make-model` for the bench's model.
pub fn make_model(bin: &str, a: &RpcArgs, out: &str) -> Vec<String> {
    let m = a.model;
    let mut v = vec![
        bin.to_string(),
        "make-model".into(),
        "--out".into(),
        out.into(),
    ];
    for (k, n) in [
        ("--n-embd", m.n_embd as usize),
        ("--n-layer", m.layers_per_stage as usize * a.stages),
        ("--n-head", m.n_head as usize),
        ("--n-head-kv", m.n_head_kv as usize),
        ("--n-ff", m.n_ff as usize),
        ("--n-vocab", m.n_vocab as usize),
        ("--seed", 1),
    ] {
        v.extend([k.to_string(), n.to_string()]);
    }
    v
}

/// One coordinator run on host 0. Not `--quiet`: its summary (with the
/// reason of every fallback) goes to the run's log after the timed part.
/// `proxied`: it connects through the delay proxy, and tells the servers
/// each other's real addresses with `--peer-endpoints`.
pub fn coordinator(
    bin: &str,
    a: &RpcArgs,
    model: &str,
    arm: Arm,
    groups: usize,
    json_out: &str,
    proxied: bool,
) -> Vec<String> {
    let real: Vec<String> = (1..=a.stages).map(server_addr).collect();
    let servers: Vec<String> = if proxied {
        (1..=a.stages).map(proxy_addr).collect()
    } else {
        real.clone()
    };
    let split = vec!["1"; a.stages].join(",");
    let mut v: Vec<String> = vec![
        "ip".into(),
        "netns".into(),
        "exec".into(),
        ns(0),
        bin.into(),
    ];
    for w in [
        "run",
        "--model",
        model,
        "--servers",
        &servers.join(","),
        "--tensor-split",
        &split,
        "--arm",
        arm.name(),
        "--streams",
        &a.streams.to_string(),
        "--prompt-len",
        &a.prompt_len.to_string(),
        "--tokens",
        &a.tokens.to_string(),
        "--groups",
        &groups.to_string(),
        "--json",
        json_out,
    ] {
        v.push(w.to_string());
    }
    if proxied {
        v.extend(["--peer-endpoints".into(), real.join(",")]);
    }
    v
}

/// A TCP connect from host `from` to `addr` (reachability; exits 0 once
/// connected).
pub fn reach(from: usize, addr: &str) -> Vec<String> {
    let (ip, port) = addr.rsplit_once(':').unwrap_or((addr, ""));
    vec![
        "ip".into(),
        "netns".into(),
        "exec".into(),
        ns(from),
        "timeout".into(),
        "3".into(),
        "bash".into(),
        "-c".into(),
        format!("exec 3<>/dev/tcp/{ip}/{port}"),
    ]
}

/// The link probe: a sink on host `to`, and a sender of `bytes` on host
/// `from` (both this xtask binary, `xtask` being its path).
pub fn link_probe(xtask: &str, from: usize, to: usize, bytes: u64) -> (Vec<String>, Vec<String>) {
    let addr = format!("{}:{PROBE_PORT}", host_ip(to));
    let inns = |h: usize| -> Vec<String> {
        vec![
            "ip".into(),
            "netns".into(),
            "exec".into(),
            ns(h),
            xtask.into(),
            "link-probe".into(),
        ]
    };
    let mut sink = inns(to);
    sink.extend(["sink".into(), addr.clone()]);
    let mut send = inns(from);
    send.extend(["send".into(), addr, bytes.to_string()]);
    (sink, send)
}

/// The echo on host 1 and a pinger of `count` round trips from host 0 to
/// `addr` (the echo, directly or through the proxy).
pub fn round_trip_probe(xtask: &str, addr: &str, count: usize) -> (Vec<String>, Vec<String>) {
    let inns = |h: usize| -> Vec<String> {
        vec![
            "ip".into(),
            "netns".into(),
            "exec".into(),
            ns(h),
            xtask.into(),
            "link-probe".into(),
        ]
    };
    let mut echo = inns(1);
    echo.extend(["echo".into(), echo_addr()]);
    let mut ping = inns(0);
    ping.extend(["ping".into(), addr.into(), count.to_string()]);
    (echo, ping)
}

/// Bits per second of a tc rate (`200mbit`, `1gbit`, `500kbit`, `25mbps`,
/// `1000bit`); None when unreadable.
pub fn rate_bits(rate: &str) -> Option<f64> {
    let r = rate.trim().to_ascii_lowercase();
    let split = r.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (n, unit) = r.split_at(split);
    let n: f64 = n.parse().ok()?;
    let m = match unit {
        "bit" => 1.0,
        "kbit" => 1e3,
        "mbit" => 1e6,
        "gbit" => 1e9,
        "bps" => 8.0,
        "kbps" => 8e3,
        "mbps" => 8e6,
        "gbps" => 8e9,
        _ => return None,
    };
    Some(n * m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(cmds: &[Vec<String>]) -> Vec<String> {
        cmds.iter().map(|c| c.join(" ")).collect()
    }

    #[test]
    fn builds_p_plus_one_hosts_and_shapes_only_the_coordinator() {
        let t = text(&setup(4, Some("200mbit"), None, "256kbit"));
        for i in 0..=4 {
            assert!(t.contains(&format!("ip netns add xtb-h{i}")), "{t:?}");
            assert!(t.contains(&format!("ip -n xtb-sw link set port{i} master br0")));
        }
        assert!(!t.iter().any(|c| c.contains("xtb-h5")));
        let tc: Vec<&String> = t.iter().filter(|c| c.contains(" tc ")).collect();
        assert_eq!(
            tc,
            [
                "ip netns exec xtb-h0 tc qdisc add dev eth0 root tbf rate 200mbit burst 256kbit latency 100ms",
                "ip netns exec xtb-sw tc qdisc add dev port0 root tbf rate 200mbit burst 256kbit latency 100ms",
            ]
        );
        let delayed = text(&setup(2, Some("200mbit"), Some("2ms"), "4kb"));
        assert_eq!(
            delayed
                .iter()
                .filter(|c| c.ends_with("netem delay 2ms rate 200mbit"))
                .count(),
            2
        );
        assert!(
            !text(&setup(2, None, None, "4kb"))
                .iter()
                .any(|c| c.contains(" tc "))
        );
        for c in setup(3, Some("1gbit"), None, "4kb") {
            assert!(c.iter().any(|w| w.starts_with("xtb-")), "{c:?}");
        }
    }

    #[test]
    fn servers_listen_on_their_host_with_the_engine_where_supported() {
        let both = EngineFlags::from_help(
            "  -t, --threads <THREADS>\n      --engine <ENGINE>  provider\n      --engine-iface <IFACE>\n",
        );
        assert_eq!(
            both,
            EngineFlags {
                engine: true,
                iface: true,
                domain: false,
                node: false,
                peer_networks: false
            }
        );
        let none = EngineFlags::from_help("  --engines-x\n  --peer-allow <PEER_ALLOW>\n");
        assert_eq!(
            none,
            EngineFlags {
                engine: false,
                iface: false,
                domain: false,
                node: false,
                peer_networks: false
            }
        );
        let nets = EngineFlags::from_help("--peer-allow <P>  host:port, 10.0.0.0/24, loopback");
        assert!(nets.peer_networks && !nets.engine);
        assert_eq!(
            server("/s", 1, 1, nets).join(" "),
            "ip netns exec xtb-h1 /s --host 10.77.0.2 --port 50052 --threads 1 --peer-allow 10.77.0.1/24"
        );
        let node =
            EngineFlags::from_help("--engine <P>\n--engine-node <ADDR>\n--engine-domain=<D>");
        assert!(node.engine && node.node && node.domain && !node.iface);
        assert_eq!(
            server("/s", 3, 1, node).join(" "),
            "ip netns exec xtb-h3 /s --host 10.77.0.4 --port 50052 --threads 1 \
             --engine tcp --engine-domain eth3 --engine-node 10.77.0.4"
        );
        assert_eq!(
            server("/s", 2, 1, both).join(" "),
            "ip netns exec xtb-h2 /s --host 10.77.0.3 --port 50052 --threads 1 --engine tcp --engine-iface eth2"
        );
        assert_eq!(
            server("/s", 1, 2, none).join(" "),
            "ip netns exec xtb-h1 /s --host 10.77.0.2 --port 50052 --threads 2"
        );
    }

    #[test]
    fn coordinator_and_model_commands() {
        let a = RpcArgs::default();
        let c = coordinator("/p", &a, "/m.gguf", Arm::Direct, 3, "/o.json", false).join(" ");
        assert_eq!(
            c,
            "ip netns exec xtb-h0 /p run --model /m.gguf \
             --servers 10.77.0.2:50052,10.77.0.3:50052,10.77.0.4:50052,10.77.0.5:50052 \
             --tensor-split 1,1,1,1 --arm direct --streams 32 --prompt-len 8 --tokens 32 \
             --groups 3 --json /o.json"
        );
        let a3 = RpcArgs {
            stages: 3,
            ..RpcArgs::default()
        };
        let c = coordinator("/p", &a3, "/m.gguf", Arm::Engine, 1, "/o.json", true).join(" ");
        assert_eq!(
            c,
            "ip netns exec xtb-h0 /p run --model /m.gguf \
             --servers 127.0.0.1:51001,127.0.0.1:51002,127.0.0.1:51003 \
             --tensor-split 1,1,1 --arm engine --streams 32 --prompt-len 8 --tokens 32 \
             --groups 1 --json /o.json \
             --peer-endpoints 10.77.0.2:50052,10.77.0.3:50052,10.77.0.4:50052"
        );
        let m = make_model("/p", &a, "/m.gguf").join(" ");
        assert!(
            m.starts_with("/p make-model --out /m.gguf --n-embd 256 --n-layer 4 "),
            "{m}"
        );
        assert!(m.ends_with("--n-vocab 128 --seed 1"), "{m}");
    }

    #[test]
    fn probes_and_rates() {
        assert_eq!(
            reach(0, "10.77.0.2:50052").join(" "),
            "ip netns exec xtb-h0 timeout 3 bash -c exec 3<>/dev/tcp/10.77.0.2/50052"
        );
        let (sink, send) = link_probe("/x", 0, 1, 1000);
        assert_eq!(
            sink.join(" "),
            "ip netns exec xtb-h1 /x link-probe sink 10.77.0.2:50099"
        );
        assert_eq!(
            send.join(" "),
            "ip netns exec xtb-h0 /x link-probe send 10.77.0.2:50099 1000"
        );
        assert_eq!(
            delay_proxy("/x", 2, "2ms").join(" "),
            "ip netns exec xtb-h0 /x delay-proxy --delay 2ms --map \
             127.0.0.1:51000=10.77.0.2:50098,127.0.0.1:51001=10.77.0.2:50052,\
             127.0.0.1:51002=10.77.0.3:50052"
        );
        let (echo, ping) = round_trip_probe("/x", &proxied_echo_addr(), 20);
        assert_eq!(
            echo.join(" "),
            "ip netns exec xtb-h1 /x link-probe echo 10.77.0.2:50098"
        );
        assert_eq!(
            ping.join(" "),
            "ip netns exec xtb-h0 /x link-probe ping 127.0.0.1:51000 20"
        );
        assert_eq!(rate_bits("200mbit"), Some(200e6));
        assert_eq!(rate_bits("1.5Gbit"), Some(1.5e9));
        assert_eq!(rate_bits("25mbps"), Some(200e6));
        assert_eq!(rate_bits("fast"), None);
        assert_eq!(rate_bits("10parsec"), None);
    }
}
