//! `fi_pingpong` (libfabric-bin): the raw provider's own ping-pong figure.

use std::process::{Command, Stdio};
use std::time::Duration;

/// What one fi_pingpong run reported.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PingPong {
    /// Round-trip time in µs (2 x its one-way `usec/xfer`).
    pub rtt_us: f64,
    /// Its `MB/sec` column, in bytes/s.
    pub bytes_per_sec: f64,
}

/// Parses the result line of fi_pingpong's table.
pub fn parse(output: &str) -> Option<PingPong> {
    let mut lines = output
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("bytes"));
    lines.next()?;
    let cols: Vec<&str> = lines.next()?.split_whitespace().collect();
    // bytes #sent #ack total time MB/sec usec/xfer Mxfers/sec
    let mbps: f64 = cols.get(5)?.parse().ok()?;
    let usec: f64 = cols.get(6)?.parse().ok()?;
    Some(PingPong {
        rtt_us: 2.0 * usec,
        bytes_per_sec: mbps * 1e6,
    })
}

/// Runs a local fi_pingpong server and client for `size` bytes, `iters` iterations.
pub fn run(provider: &str, size: usize, iters: usize, port: u16) -> Result<PingPong, String> {
    // The native verbs backend has no libfabric provider to ping: its round
    // trips are compared with perftest's instead (baseline/perftest.rs).
    if provider.starts_with("ibverbs") {
        return Err("not a libfabric provider (verbs runs compare with perftest)".into());
    }
    let prov = provider.split(';').next().unwrap_or(provider).to_string();
    let common = |c: &mut Command| {
        c.args([
            "-p",
            &prov,
            "-e",
            "rdm",
            "-I",
            &iters.to_string(),
            "-S",
            &size.to_string(),
        ]);
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
    };
    let mut server = Command::new("fi_pingpong");
    common(&mut server);
    server.args(["-B", &port.to_string()]);
    let server = server
        .spawn()
        .map_err(|e| format!("fi_pingpong (install libfabric-bin): {e}"))?;
    let mut last = String::new();
    // The client gives up when the server is not listening yet: retry.
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(100));
        let mut client = Command::new("fi_pingpong");
        common(&mut client);
        client.args(["-P", &port.to_string(), "127.0.0.1"]);
        match client.output() {
            Ok(out) if out.status.success() => {
                let _ = server.wait_with_output();
                let text = String::from_utf8_lossy(&out.stdout);
                return parse(&text)
                    .ok_or_else(|| format!("fi_pingpong output not understood: {text}"));
            }
            Ok(out) => last = String::from_utf8_lossy(&out.stderr).into_owned(),
            Err(e) => last = e.to_string(),
        }
    }
    let mut server = server;
    let _ = server.kill();
    let _ = server.wait();
    Err(format!("fi_pingpong client failed: {last}"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_fi_pingpong_output() {
        let out = "bytes   #sent   #ack     total       time     MB/sec    usec/xfer   Mxfers/sec\n64      2k      =2k      250k        0.09s      2.94      21.80       0.05\n";
        let p = super::parse(out);
        assert_eq!(p.map(|p| (p.rtt_us, p.bytes_per_sec)), Some((43.6, 2.94e6)));
        assert_eq!(super::parse("garbage"), None);
        assert_eq!(super::parse("bytes\n1 2 3\n"), None);
    }
}
