//! perftest (`ib_write_lat`, `ib_write_bw`, `ib_send_lat`; Debian package
//! `perftest`): the verbs stack's own figures, run between two processes
//! on this machine's device in the same session as the engine. Each
//! engine row of `write_bw`, `write_lat`, `imm_pingpong` and `send_recv`
//! gets a companion row with the engine's figure next to perftest's.
//!
//! What is compared: perftest's latency tests are ping-pongs that report
//! half a round trip, so their figure here is 2 x `t_typical` (a round
//! trip), next to the engine's write completion (a write and its ack) or
//! round trip. Its bandwidth is `BW average` (perftest's MB is 2^20 bytes).

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::backend::BackendOpts;
use crate::plan::Plan;
use crate::results::{Figure, Metric, Row};
use transfer::BackendFamily;

/// The perftest programs used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Test {
    /// RDMA write ping-pong latency.
    WriteLat,
    /// RDMA write bandwidth.
    WriteBw,
    /// Send/receive ping-pong latency.
    SendLat,
}

impl Test {
    /// The program's name.
    pub fn program(self) -> &'static str {
        match self {
            Self::WriteLat => "ib_write_lat",
            Self::WriteBw => "ib_write_bw",
            Self::SendLat => "ib_send_lat",
        }
    }
}

/// What a latency test reported.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Lat {
    /// Typical (median) one-way latency in µs.
    pub typical_us: f64,
    /// 99th percentile one-way latency in µs, when printed.
    pub p99_us: Option<f64>,
}

/// The numbers of the first result line after the table header that
/// contains `marker`, with the header's tokens.
fn result_line<'a>(output: &'a str, marker: &str) -> Option<(Vec<&'a str>, Vec<f64>)> {
    let mut lines = output.lines().skip_while(|l| !l.contains(marker));
    let header: Vec<&str> = lines.next()?.split_whitespace().collect();
    let values = lines
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|cols| cols.first().is_some_and(|c| c.parse::<u64>().is_ok()))?
        .iter()
        .map(|c| c.parse::<f64>().ok())
        .collect::<Option<Vec<f64>>>()?;
    Some((header, values))
}

/// Parses `ib_write_lat` / `ib_send_lat` output (`#bytes #iterations t_min
/// t_max t_typical t_avg t_stdev 99% percentile 99.9% percentile`).
pub fn parse_lat(output: &str) -> Option<Lat> {
    let (header, values) = result_line(output, "t_typical")?;
    // Column names before the percentiles are one token each, so a
    // header token's index is its value's index.
    let at = |name: &str| header.iter().position(|h| h.starts_with(name));
    let typical_us = *values.get(at("t_typical")?)?;
    // perftest converts cycles with the CPU frequency it estimated; where
    // it cannot (emulated CPUs) it prints `inf`, which is no figure.
    if !typical_us.is_finite() {
        return None;
    }
    let p99_us = at("99%")
        .and_then(|i| values.get(i).copied())
        .filter(|v| v.is_finite());
    Some(Lat { typical_us, p99_us })
}

/// Parses `ib_write_bw` output (`#bytes #iterations BW peak[MB/sec] BW
/// average[MB/sec] MsgRate[Mpps]`) into bytes per second.
pub fn parse_bw(output: &str) -> Option<f64> {
    let (header, values) = result_line(output, "average[MB/sec]")?;
    // "BW peak[MB/sec]" and "BW average[MB/sec]" are two tokens each.
    let average = header.iter().position(|h| h.starts_with("average"))? - 2;
    Some(values.get(average)? * 1_048_576.0).filter(|v| v.is_finite())
}

/// Runs `test` between a server and a client process on this machine and
/// returns the client's output.
pub fn run(
    test: Test,
    device: Option<&str>,
    size: u64,
    iters: usize,
    port: u16,
) -> Result<String, String> {
    let program = test.program();
    let args = |c: &mut Command| {
        // -F: run even where the CPU frequency cannot be read (VMs);
        // the figures here are times, not cycles.
        c.args(["-F", "-s", &size.to_string(), "-n", &iters.to_string()]);
        c.args(["-p", &port.to_string()]);
        if let Some(d) = device {
            c.args(["-d", d]);
        }
        if let Ok(gid) = std::env::var(transfer::verbs::config::ENV_GID_INDEX) {
            c.args(["-x", gid.trim()]);
        }
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
    };
    let mut server = Command::new(program);
    args(&mut server);
    let mut server = server
        .spawn()
        .map_err(|e| format!("{program} (install perftest): {e}"))?;
    let mut last = String::new();
    // The client gives up when the server is not listening yet: retry.
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(200));
        let mut client = Command::new(program);
        args(&mut client);
        client.arg("127.0.0.1");
        match client.output() {
            Ok(out) if out.status.success() => {
                let _ = server.wait_with_output();
                return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
            }
            Ok(out) => {
                last = format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            Err(e) => last = e.to_string(),
        }
        if let Ok(Some(status)) = server.try_wait() {
            let rest = server.wait_with_output().map_or_else(
                |e| e.to_string(),
                |o| String::from_utf8_lossy(&o.stderr).into_owned(),
            );
            return Err(format!(
                "{program} server exited ({status}): {rest}; client: {last}"
            ));
        }
    }
    let _ = server.kill();
    let _ = server.wait();
    Err(format!("{program} client failed: {last}"))
}

/// A free TCP port for perftest's side channel.
fn free_port() -> Option<u16> {
    Some(
        std::net::TcpListener::bind("127.0.0.1:0")
            .ok()?
            .local_addr()
            .ok()?
            .port(),
    )
}

/// One perftest measurement: program, message size, iterations.
type Key = (Test, u64, usize);

/// Which perftest measurement an engine row is compared with (`None`: no
/// perftest equivalent).
fn key_of(row: &Row, plan: &Plan) -> Option<Key> {
    Some(match row.sweep.as_str() {
        "write_bw" => (Test::WriteBw, row.size, plan.bw_count(row.size)),
        "write_lat" => (Test::WriteLat, row.size.max(1), plan.lat_iters),
        // perftest writes at least one byte; the engine's ping-pong is an
        // immediate with no payload.
        "imm_pingpong" => (Test::WriteLat, 1, plan.pingpong_iters),
        "send_recv" => (Test::SendLat, row.size.max(1), plan.pingpong_iters),
        _ => return None,
    })
}

/// Attempts per measurement: under emulation perftest sometimes misreads
/// the CPU frequency and prints `inf` (seen in the soft-RoCE VM).
const ATTEMPTS: usize = 3;

/// Runs one measurement and names its figure.
fn measure((test, size, iters): Key, device: Option<&str>) -> Result<(String, Figure), String> {
    let mut last = String::new();
    for _ in 0..ATTEMPTS {
        let port = free_port().ok_or("no free port for perftest")?;
        match run(test, device, size, iters, port).and_then(|out| figure(test, &out)) {
            Ok(f) => return Ok(f),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// The figure of one perftest output, named for the report.
fn figure(test: Test, out: &str) -> Result<(String, Figure), String> {
    let parsed = match test {
        Test::WriteBw => parse_bw(out).map(|bps| {
            (
                format!("{} BW average", test.program()),
                Figure {
                    value: bps,
                    latency: None,
                },
            )
        }),
        Test::WriteLat | Test::SendLat => parse_lat(out).map(|l| {
            (
                format!("{} RTT (2 x t_typical)", test.program()),
                Figure {
                    value: 2.0 * l.typical_us,
                    latency: None,
                },
            )
        }),
    };
    parsed.ok_or_else(|| format!("{} output not understood: {out}", test.program()))
}

/// The engine rows with a perftest companion row after each that has one
/// (verbs backend, both processes on this machine), and notes on what
/// could not be measured. Other backends get `rows` back unchanged.
pub fn with_baselines(opts: &BackendOpts, plan: &Plan, rows: Vec<Row>) -> (Vec<Row>, Vec<String>) {
    let verbs = matches!(opts.family(), Ok(BackendFamily::Verbs));
    if !verbs || opts.bind.is_some() {
        return (rows, Vec::new());
    }
    let device = opts.verbs_device.clone().or_else(|| {
        transfer::verbs::devices()
            .ok()
            .and_then(|d| d.into_iter().next())
    });
    let mut out = Vec::with_capacity(rows.len() * 2);
    let mut notes = Vec::new();
    // Rows of different sweeps (queue-driven and caller-driven) share
    // measurements: each runs once.
    let mut measured: HashMap<Key, Result<(String, Figure), String>> = HashMap::new();
    for row in rows {
        let companion = key_of(&row, plan).map(|key| {
            measured
                .entry(key)
                .or_insert_with(|| measure(key, device.as_deref()))
                .clone()
        });
        let label = format!("{} | perftest", row.label);
        let engine = Row::new(&row.sweep, label, row.size, row.metric, row.engine.clone());
        let verified = row.verified;
        out.push(row);
        match companion {
            Some(Ok((name, fig))) => {
                let mut r = engine.with_baseline(&name, fig);
                r.verified = verified;
                if r.metric == Metric::Latency {
                    // Nothing was moved by this row itself: it repeats the
                    // engine's figure next to perftest's.
                    r.moves_data = out.last().is_some_and(|e| e.moves_data);
                }
                out.push(r);
            }
            Some(Err(e)) => {
                let note = format!("perftest baseline unavailable: {e}");
                if !notes.contains(&note) {
                    notes.push(note);
                }
            }
            None => {}
        }
    }
    (out, notes)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAT: &str = "\
---------------------------------------------------------------------------------------
                    RDMA_Write Latency Test
 Dual-port       : OFF		Device         : rxe0
---------------------------------------------------------------------------------------
 #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] 
 8       1000          10.81          215.42       13.12    	       14.43       	5.79   		37.81   		215.42  
---------------------------------------------------------------------------------------
";

    const BW: &str = "\
---------------------------------------------------------------------------------------
 #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]
 65536      1000             312.50             300.00   		   0.004800
---------------------------------------------------------------------------------------
";

    #[test]
    fn parses_latency_tables() {
        let l = parse_lat(LAT);
        assert_eq!(
            l.map(|l| (l.typical_us, l.p99_us)),
            Some((13.12, Some(37.81)))
        );
        assert_eq!(parse_lat("garbage"), None);
        let inf = LAT.replace("13.12", "inf");
        assert_eq!(parse_lat(&inf), None, "an emulated CPU's inf is no figure");
        assert_eq!(parse_lat(" #bytes t_typical[usec]\n---\n"), None);
    }

    #[test]
    fn parses_bandwidth_tables_in_mebibytes() {
        assert_eq!(parse_bw(BW), Some(300.0 * 1_048_576.0));
        assert_eq!(parse_bw(LAT), None);
    }
}
