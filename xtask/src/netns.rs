//! Pieces shared by the benches that run on network-namespace hosts of this
//! machine: names and addresses, running plan commands, and the guards that
//! remove namespaces and stop processes on success, error or Ctrl-C.

use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};

/// Prefix of every namespace this tool creates (and is allowed to delete).
pub const NS_PREFIX: &str = "xtb";

/// The address of namespace host `i`.
pub fn host_ip(i: usize) -> String {
    format!("10.77.0.{}", i + 1)
}

/// The subnet of every host address (`host_ip`).
pub const SUBNET: &str = "10.77.0.0/24";

/// The namespace of host `i`.
pub fn ns(i: usize) -> String {
    format!("{NS_PREFIX}-h{i}")
}

/// The namespace holding the bridge that joins the hosts.
pub fn switch_ns() -> String {
    format!("{NS_PREFIX}-sw")
}

/// Splits a command written as one line into its words.
pub fn words(line: &str) -> Vec<String> {
    line.split_whitespace().map(String::from).collect()
}

/// Commands that create namespace host `i` and join it to the switch's bridge
/// (`eth{i}` in the host, `port{i}` on the bridge). No shaping.
pub fn host_link(i: usize) -> Vec<Vec<String>> {
    let (h, sw) = (ns(i), switch_ns());
    [
        format!("ip netns add {h}"),
        format!("ip -n {h} link set lo up"),
        format!("ip link add eth{i} netns {h} type veth peer name port{i} netns {sw}"),
        format!("ip -n {h} addr add {}/24 dev eth{i}", host_ip(i)),
        format!("ip -n {h} link set eth{i} up"),
        format!("ip -n {sw} link set port{i} master br0"),
        format!("ip -n {sw} link set port{i} up"),
    ]
    .iter()
    .map(|l| words(l))
    .collect()
}

/// Commands that create the switch namespace and its bridge.
pub fn switch() -> Vec<Vec<String>> {
    let sw = switch_ns();
    [
        format!("ip netns add {sw}"),
        format!("ip -n {sw} link set lo up"),
        format!("ip -n {sw} link add br0 type bridge"),
        format!("ip -n {sw} link set br0 up"),
    ]
    .iter()
    .map(|l| words(l))
    .collect()
}

/// The tc command that shapes the egress of `dev` in namespace `namespace`:
/// tbf for a rate alone, netem (which needs the sch_netem kernel module)
/// when there is a delay; none without either.
pub fn shape(
    namespace: &str,
    dev: &str,
    rate: Option<&str>,
    delay: Option<&str>,
) -> Option<Vec<String>> {
    shape_with_burst(namespace, dev, rate, delay, "256kbit")
}

/// [`shape`] with tbf's bucket size `burst` (bytes that may pass at line
/// rate after an idle spell).
pub fn shape_with_burst(
    namespace: &str,
    dev: &str,
    rate: Option<&str>,
    delay: Option<&str>,
    burst: &str,
) -> Option<Vec<String>> {
    let line = match (rate, delay) {
        (Some(r), None) => format!(
            "ip netns exec {namespace} tc qdisc add dev {dev} root tbf rate {r} burst {burst} latency 100ms"
        ),
        (r, Some(d)) => {
            let rate = r.map(|r| format!(" rate {r}")).unwrap_or_default();
            format!("ip netns exec {namespace} tc qdisc add dev {dev} root netem delay {d}{rate}")
        }
        (None, None) => return None,
    };
    Some(words(&line))
}

/// Commands that tell whether this kernel has netem: a throwaway namespace
/// with a veth pair (this kernel may lack dummy) gets a netem qdisc (the last command fails without
/// sch_netem); remove the namespace afterwards with [`cleanup_namespaces`].
pub fn netem_probe() -> Vec<Vec<String>> {
    let p = format!("{NS_PREFIX}-netem-probe");
    [
        format!("ip netns add {p}"),
        format!("ip -n {p} link add probe0 type veth peer name probe1"),
        format!("ip netns exec {p} tc qdisc add dev probe0 root netem delay 1ms"),
    ]
    .iter()
    .map(|l| words(l))
    .collect()
}

/// Commands that remove every namespace of this tool (also stale ones), from
/// the output of `ip netns list`.
pub fn cleanup_plan(existing: &str) -> Vec<Vec<String>> {
    existing
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| name.starts_with(&format!("{NS_PREFIX}-")))
        .map(|name| vec!["ip".into(), "netns".into(), "del".into(), name.to_string()])
        .collect()
}

/// Runs one plan command, failing with its stderr.
pub fn run_cmd(cmd: &[String]) -> Result<(), String> {
    let (prog, args) = cmd.split_first().ok_or("empty command")?;
    let out = Command::new(prog)
        .args(args)
        .output()
        .map_err(|e| format!("{}: {e}", cmd.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`{}` failed: {}",
            cmd.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Removes every namespace of this tool.
pub fn cleanup_namespaces() {
    if let Ok(out) = Command::new("ip").args(["netns", "list"]).output() {
        for cmd in cleanup_plan(&String::from_utf8_lossy(&out.stdout)) {
            let _ = run_cmd(&cmd);
        }
    }
}

/// Deletes the lab's namespaces when dropped (success, error or Ctrl-C).
pub struct Lab;

impl Drop for Lab {
    fn drop(&mut self) {
        cleanup_namespaces();
    }
}

/// Processes killed and reaped when dropped.
#[derive(Default)]
pub struct Children(pub Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            if let Ok(None) = c.try_wait() {
                let _ = c.kill();
            }
            let _ = c.wait();
        }
    }
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: i32) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

unsafe extern "C" {
    fn signal(sig: i32, handler: extern "C" fn(i32)) -> usize;
}

/// Makes Ctrl-C set a flag instead of killing xtask, so that the guards
/// above still run (the children, in the same process group, get the
/// SIGINT themselves and end).
pub fn catch_ctrl_c() {
    // SAFETY: installs a handler that only stores to an atomic.
    unsafe { signal(2, on_sigint) };
}

/// Whether Ctrl-C was pressed since [`catch_ctrl_c`].
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_links_join_the_bridge_and_cleanup_removes_only_ours() {
        let text: Vec<String> = host_link(2).iter().map(|c| c.join(" ")).collect();
        assert!(text.contains(&"ip netns add xtb-h2".to_string()));
        assert!(text.contains(&"ip -n xtb-h2 addr add 10.77.0.3/24 dev eth2".to_string()));
        assert!(text.contains(&"ip -n xtb-sw link set port2 master br0".to_string()));
        assert_eq!(
            shape("xtb-h0", "eth0", Some("1gbit"), None).map(|c| c.join(" ")),
            Some("ip netns exec xtb-h0 tc qdisc add dev eth0 root tbf rate 1gbit burst 256kbit latency 100ms".into())
        );
        assert_eq!(
            shape("xtb-sw", "port0", Some("1gbit"), Some("2ms")).map(|c| c.join(" ")),
            Some(
                "ip netns exec xtb-sw tc qdisc add dev port0 root netem delay 2ms rate 1gbit"
                    .into()
            )
        );
        assert_eq!(shape("xtb-h0", "eth0", None, None), None);
        let probe = netem_probe();
        assert!(
            probe
                .iter()
                .all(|c| c.iter().any(|w| w == "xtb-netem-probe"))
        );
        assert!(
            probe
                .last()
                .is_some_and(|c| c.contains(&"netem".to_string()))
        );
        let cleanup = cleanup_plan("xtb-h0 (id: 3)\nother\nxtb-sw\nxtbfoo\n");
        assert_eq!(
            cleanup,
            vec![words("ip netns del xtb-h0"), words("ip netns del xtb-sw")]
        );
    }
}
