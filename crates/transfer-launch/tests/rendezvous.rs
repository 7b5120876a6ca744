//! The rendezvous over loopback, in one process (threads as ranks): the
//! happy path, rank 0 late, and every refusal the issue lists.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use transfer_launch::rendezvous::{gather, join};
use transfer_launch::wire::{self, Hello, Limits, Reply};
use transfer_launch::{Endpoint, LaunchError, Options};

fn opts(secs: f64) -> Options {
    Options {
        timeout: Duration::from_secs_f64(secs),
        hello_timeout: Duration::from_millis(300),
        ..Options::default()
    }
}

fn listener() -> (TcpListener, Endpoint) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    (
        l,
        Endpoint {
            host: "127.0.0.1".into(),
            port,
        },
    )
}

fn blob(r: usize) -> Vec<u8> {
    format!("blob of rank {r}").into_bytes()
}

fn spawn_rank(
    ep: &Endpoint,
    token: &'static str,
    world: usize,
    rank: usize,
    secs: f64,
) -> thread::JoinHandle<Result<Vec<Vec<u8>>, LaunchError>> {
    let ep = ep.clone();
    thread::spawn(move || join(&ep, token, world, rank, &blob(rank), &opts(secs)))
}

#[test]
fn every_rank_gets_every_blob_in_rank_order() {
    let (l, ep) = listener();
    let ranks: Vec<_> = (1..5)
        .rev()
        .map(|r| spawn_rank(&ep, "t", 5, r, 10.0))
        .collect();
    let all = gather(&l, "t", 5, &blob(0), &opts(10.0)).unwrap();
    let want: Vec<Vec<u8>> = (0..5).map(blob).collect();
    assert_eq!(all, want);
    for h in ranks {
        assert_eq!(h.join().unwrap().unwrap(), want);
    }
}

#[test]
fn a_world_of_one_needs_no_peer() {
    let (l, _) = listener();
    assert_eq!(
        gather(&l, "t", 1, b"x", &opts(1.0)).unwrap(),
        [b"x".to_vec()]
    );
}

#[test]
fn ranks_retry_until_rank_0_is_up() {
    // A free port nobody listens on yet.
    let (l, ep) = listener();
    drop(l);
    let ranks: Vec<_> = (1..3).map(|r| spawn_rank(&ep, "t", 3, r, 10.0)).collect();
    thread::sleep(Duration::from_millis(700));
    let l = TcpListener::bind(("127.0.0.1", ep.port)).unwrap();
    let all = gather(&l, "t", 3, &blob(0), &opts(10.0)).unwrap();
    for h in ranks {
        assert_eq!(h.join().unwrap().unwrap(), all);
    }
}

#[test]
fn connect_gives_up_at_the_deadline() {
    let (l, ep) = listener();
    drop(l);
    let t = Instant::now();
    let e = join(&ep, "t", 2, 1, b"x", &opts(0.5)).unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(3));
    let msg = e.to_string();
    assert!(
        matches!(e, LaunchError::Timeout { .. }) && msg.contains("connect to rank 0"),
        "{msg}"
    );
}

#[test]
fn a_duplicate_rank_is_refused_and_the_first_kept() {
    let (l, ep) = listener();
    let first = spawn_rank(&ep, "t", 3, 1, 10.0);
    thread::sleep(Duration::from_millis(200));
    let dup = spawn_rank(&ep, "t", 3, 1, 10.0);
    thread::sleep(Duration::from_millis(200));
    let last = spawn_rank(&ep, "t", 3, 2, 10.0);
    let all = gather(&l, "t", 3, &blob(0), &opts(10.0)).unwrap();
    assert_eq!(first.join().unwrap().unwrap(), all);
    assert_eq!(last.join().unwrap().unwrap(), all);
    let e = dup.join().unwrap().unwrap_err().to_string();
    assert!(e.contains("already joined"), "{e}");
}

#[test]
fn another_jobs_rank_is_refused_without_disturbing_this_job() {
    let (l, ep) = listener();
    let stranger = spawn_rank(&ep, "other-job", 2, 1, 10.0);
    thread::sleep(Duration::from_millis(200));
    let ours = spawn_rank(&ep, "ours", 2, 1, 10.0);
    let all = gather(&l, "ours", 2, &blob(0), &opts(10.0)).unwrap();
    assert_eq!(ours.join().unwrap().unwrap(), all);
    let e = stranger.join().unwrap().unwrap_err();
    assert!(matches!(e, LaunchError::Refused(_)), "{e}");
    assert!(e.to_string().contains("job token mismatch"), "{e}");
}

#[test]
fn out_of_range_ranks_are_refused() {
    // join itself will not send one; a hand-made hello reaches rank 0.
    let (l, ep) = listener();
    let addr = format!("127.0.0.1:{}", ep.port);
    let rogue = thread::spawn(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        let h = Hello {
            token: "t".into(),
            world_size: 2,
            rank: 7,
            blob: vec![],
        };
        let body = wire::encode_hello(&h, &Limits::default()).unwrap();
        s.write_all(&wire::frame(&body).unwrap()).unwrap();
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).unwrap();
        wire::decode_reply(&buf[4..], &Limits::default()).unwrap()
    });
    thread::sleep(Duration::from_millis(200));
    let ok = spawn_rank(&ep, "t", 2, 1, 10.0);
    let all = gather(&l, "t", 2, &blob(0), &opts(10.0)).unwrap();
    assert_eq!(ok.join().unwrap().unwrap(), all);
    let Reply::Refused(why) = rogue.join().unwrap() else {
        panic!("rank 7 of 2 was accepted")
    };
    assert!(why.contains("out of range"), "{why}");
    let e = join(&ep, "t", 2, 2, b"", &opts(1.0)).unwrap_err();
    assert!(e.to_string().contains("cannot join as rank 2 of 2"), "{e}");
}

#[test]
fn a_world_size_mismatch_fails_everyone_with_the_reason() {
    let (l, ep) = listener();
    let good = spawn_rank(&ep, "t", 3, 1, 10.0);
    thread::sleep(Duration::from_millis(200));
    let bad = spawn_rank(&ep, "t", 4, 2, 10.0);
    let e = gather(&l, "t", 3, &blob(0), &opts(10.0)).unwrap_err();
    assert!(e.to_string().contains("world size mismatch"), "{e}");
    for h in [good, bad] {
        let e = h.join().unwrap().unwrap_err();
        assert!(e.to_string().contains("world size mismatch"), "{e}");
    }
}

#[test]
fn rank_0_times_out_naming_the_missing_ranks_and_tells_the_joined() {
    let (l, ep) = listener();
    let one = spawn_rank(&ep, "t", 4, 1, 10.0);
    let t = Instant::now();
    let e = gather(&l, "t", 4, &blob(0), &opts(1.0)).unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(3));
    let msg = e.to_string();
    assert!(msg.contains("missing ranks [2, 3]"), "{msg}");
    let e = one.join().unwrap().unwrap_err().to_string();
    assert!(e.contains("timed out waiting for ranks [2, 3]"), "{e}");
}

#[test]
fn mute_and_foreign_connections_do_not_stall_rank_0() {
    let (l, ep) = listener();
    let addr = format!("127.0.0.1:{}", ep.port);
    // Holds its connection open and says nothing.
    let mute = TcpStream::connect(&addr).unwrap();
    // Speaks another protocol; a length of 'GET ' is far over the limit.
    let mut http = TcpStream::connect(&addr).unwrap();
    http.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    let ranks: Vec<_> = (1..3).map(|r| spawn_rank(&ep, "t", 3, r, 10.0)).collect();
    let t = Instant::now();
    let all = gather(&l, "t", 3, &blob(0), &opts(10.0)).unwrap();
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    for h in ranks {
        assert_eq!(h.join().unwrap().unwrap(), all);
    }
    drop(mute);
}

#[test]
fn oversized_blobs_are_refused_before_sending() {
    let (_l, ep) = listener();
    let o = Options {
        limits: Limits {
            max_blob: 8,
            ..Limits::default()
        },
        ..opts(1.0)
    };
    let e = join(&ep, "t", 2, 1, &[0; 9], &o).unwrap_err();
    assert!(matches!(e, LaunchError::Limit { .. }), "{e}");
}
