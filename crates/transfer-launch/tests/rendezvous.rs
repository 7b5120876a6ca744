//! The rendezvous over loopback, in one process (threads as ranks): the
//! happy path, rank 0 late, and every refusal the issue lists.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use transfer_launch::rendezvous::{gather, join};
use transfer_launch::wire::{self, Hello, Limits, Reply};
use transfer_launch::{Endpoint, JobSecret, LaunchError, Options};

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

/// Speaks the protocol by hand: reads the challenge, sends `h` (with a MAC
/// from `secret` when given), returns rank 0's reply.
fn raw_hello(addr: &str, h: &Hello, secret: Option<&JobSecret>) -> Reply {
    let l = Limits::default();
    let mut s = TcpStream::connect(addr).unwrap();
    let mut head = [0u8; 4];
    s.read_exact(&mut head).unwrap();
    let mut body = vec![0; wire::frame_len(head, 1024).unwrap()];
    s.read_exact(&mut body).unwrap();
    let c = wire::decode_challenge(&body).unwrap();
    let mut h = h.clone();
    if let Some(secret) = secret {
        h.mac = secret
            .hello_mac(&c.nonce, &wire::unsigned_hello(&h, &l).unwrap())
            .to_vec();
    }
    let body = wire::encode_hello(&h, &l).unwrap();
    s.write_all(&wire::frame(&body).unwrap()).unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).unwrap();
    wire::decode_reply(&buf[4..], &l).unwrap()
}

fn blob(r: usize) -> Vec<u8> {
    format!("blob of rank {r}").into_bytes()
}

/// Waits (10 s at most) until a joiner thread has its answer: the tests
/// that expect a refusal start the ranks that complete the world only
/// after it, so rank 0 cannot finish before reading the refused hello.
fn wait_finished<T>(h: &thread::JoinHandle<T>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !h.is_finished() {
        assert!(Instant::now() < deadline, "the joiner got no answer");
        thread::sleep(Duration::from_millis(10));
    }
}

fn spawn_rank(
    ep: &Endpoint,
    token: &'static str,
    world: usize,
    rank: usize,
    secs: f64,
) -> thread::JoinHandle<Result<Vec<Vec<u8>>, LaunchError>> {
    let ep = ep.clone();
    thread::spawn(move || join(&ep, token, world, rank, &blob(rank), None, &opts(secs)))
}

#[test]
fn every_rank_gets_every_blob_in_rank_order() {
    let (l, ep) = listener();
    let ranks: Vec<_> = (1..5)
        .rev()
        .map(|r| spawn_rank(&ep, "t", 5, r, 10.0))
        .collect();
    let all = gather(&l, "t", 5, &blob(0), None, &opts(10.0)).unwrap();
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
        gather(&l, "t", 1, b"x", None, &opts(1.0)).unwrap(),
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
    let all = gather(&l, "t", 3, &blob(0), None, &opts(10.0)).unwrap();
    for h in ranks {
        assert_eq!(h.join().unwrap().unwrap(), all);
    }
}

#[test]
fn connect_gives_up_at_the_deadline() {
    let (l, ep) = listener();
    drop(l);
    let t = Instant::now();
    let e = join(&ep, "t", 2, 1, b"x", None, &opts(0.5)).unwrap_err();
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
    let rank0 = thread::spawn(move || gather(&l, "t", 3, &blob(0), None, &opts(10.0)));
    let first = spawn_rank(&ep, "t", 3, 1, 10.0);
    let dup = spawn_rank(&ep, "t", 3, 1, 10.0);
    // Rank 2 starts only once rank 0 has refused one of the two rank-1
    // joiners: started earlier, it can complete the world before rank 0
    // reads the duplicate's hello, which is then closed unanswered (CI saw
    // both that and the later thread's hello read first under load).
    // Rank 0 keeps whichever rank-1 hello it read first, so the test
    // asserts the property, not the order.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !first.is_finished() && !dup.is_finished() {
        assert!(Instant::now() < deadline, "no rank-1 joiner was refused");
        thread::sleep(Duration::from_millis(10));
    }
    let last = spawn_rank(&ep, "t", 3, 2, 10.0);
    let all = rank0.join().unwrap().unwrap();
    assert_eq!(last.join().unwrap().unwrap(), all);
    let outcomes = [first.join().unwrap(), dup.join().unwrap()];
    let kept = outcomes
        .iter()
        .filter(|o| o.as_ref().is_ok_and(|v| *v == all));
    assert_eq!(kept.count(), 1, "{outcomes:?}");
    let refused: Vec<String> = outcomes
        .iter()
        .filter_map(|o| o.as_ref().err().map(|e| e.to_string()))
        .collect();
    assert_eq!(refused.len(), 1, "{outcomes:?}");
    assert!(refused[0].contains("already joined"), "{}", refused[0]);
}

#[test]
fn another_jobs_rank_is_refused_without_disturbing_this_job() {
    let (l, ep) = listener();
    let rank0 = thread::spawn(move || gather(&l, "ours", 2, &blob(0), None, &opts(10.0)));
    let stranger = spawn_rank(&ep, "other-job", 2, 1, 10.0);
    // Our rank starts once the stranger has its answer: started earlier,
    // it can complete the world before rank 0 reads the stranger's hello.
    wait_finished(&stranger);
    let ours = spawn_rank(&ep, "ours", 2, 1, 10.0);
    let all = rank0.join().unwrap().unwrap();
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
        let h = Hello {
            token: "t".into(),
            world_size: 2,
            rank: 7,
            blob: vec![],
            nonce: [0; 32],
            mac: vec![],
        };
        raw_hello(&addr, &h, None)
    });
    let rank0 = thread::spawn(move || gather(&l, "t", 2, &blob(0), None, &opts(10.0)));
    wait_finished(&rogue);
    let ok = spawn_rank(&ep, "t", 2, 1, 10.0);
    let all = rank0.join().unwrap().unwrap();
    assert_eq!(ok.join().unwrap().unwrap(), all);
    let Reply::Refused(why) = rogue.join().unwrap() else {
        panic!("rank 7 of 2 was accepted")
    };
    assert!(why.contains("out of range"), "{why}");
    let e = join(&ep, "t", 2, 2, b"", None, &opts(1.0)).unwrap_err();
    assert!(e.to_string().contains("cannot join as rank 2 of 2"), "{e}");
}

#[test]
fn a_world_size_mismatch_fails_everyone_with_the_reason() {
    let (l, ep) = listener();
    let good = spawn_rank(&ep, "t", 3, 1, 10.0);
    thread::sleep(Duration::from_millis(200));
    let bad = spawn_rank(&ep, "t", 4, 2, 10.0);
    let e = gather(&l, "t", 3, &blob(0), None, &opts(10.0)).unwrap_err();
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
    let e = gather(&l, "t", 4, &blob(0), None, &opts(1.0)).unwrap_err();
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
    let all = gather(&l, "t", 3, &blob(0), None, &opts(10.0)).unwrap();
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
    let e = join(&ep, "t", 2, 1, &[0; 9], None, &o).unwrap_err();
    assert!(matches!(e, LaunchError::Limit { .. }), "{e}");
}

fn secret(s: &str) -> JobSecret {
    JobSecret::new(s).unwrap()
}

const GOOD: &str = "the job's secret, 32 bytes long!";
const WRONG: &str = "a guess at the secret, not it...";

/// Issue 22: rank 0 read one connection at a time, `hello_timeout` (10 s)
/// each, so a dozen mute connections used up the whole deadline.
#[test]
fn a_dozen_silent_and_garbage_connections_do_not_delay_a_3_rank_rendezvous() {
    let (l, ep) = listener();
    let addr = format!("127.0.0.1:{}", ep.port);
    // Every one of these would hold the old rank 0 for the default 10 s
    // hello timeout, twice the whole deadline below.
    let mut junk: Vec<TcpStream> = (0..16)
        .map(|_| TcpStream::connect(&addr).unwrap())
        .collect();
    for bytes in [
        &b"\x00\x00"[..],               // half a frame header
        &b"\x00\x00\x01\x00TLRV"[..],   // a body that never completes
        &b"GET / HTTP/1.1\r\n\r\n"[..], // another protocol (length far over the limit)
        &b"\x00\x00\x00\x03abc"[..],    // a complete, malformed hello
    ] {
        let mut s = TcpStream::connect(&addr).unwrap();
        s.write_all(bytes).unwrap();
        junk.push(s);
    }
    let o = Options {
        timeout: Duration::from_secs(5),
        ..Options::default()
    };
    assert_eq!(o.hello_timeout, Duration::from_secs(10));
    let ranks: Vec<_> = (1..3)
        .map(|r| {
            let (ep, o) = (ep.clone(), o.clone());
            thread::spawn(move || join(&ep, "t", 3, r, &blob(r), None, &o))
        })
        .collect();
    let all = gather(&l, "t", 3, &blob(0), None, &o).unwrap();
    assert_eq!(all, (0..3).map(blob).collect::<Vec<_>>());
    for h in ranks {
        assert_eq!(h.join().unwrap().unwrap(), all);
    }
    drop(junk);
}

#[test]
fn a_full_pending_queue_drops_the_oldest_and_its_rank_connects_again() {
    let (l, ep) = listener();
    let addr = format!("127.0.0.1:{}", ep.port);
    let mut silent: Vec<TcpStream> = (0..12)
        .map(|_| TcpStream::connect(&addr).unwrap())
        .collect();
    let o = Options {
        timeout: Duration::from_secs(5),
        max_pending: 4,
        ..Options::default()
    };
    let ranks: Vec<_> = (1..3)
        .map(|r| {
            let (ep, o) = (ep.clone(), o.clone());
            thread::spawn(move || join(&ep, "t", 3, r, &blob(r), None, &o))
        })
        .collect();
    let all = gather(&l, "t", 3, &blob(0), None, &o).unwrap();
    for h in ranks {
        assert_eq!(h.join().unwrap().unwrap(), all);
    }
    // The first mute connection got its challenge, then was pushed out.
    let mut got = Vec::new();
    silent[0]
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    silent[0].read_to_end(&mut got).unwrap();
    let n = wire::frame_len([got[0], got[1], got[2], got[3]], 1024).unwrap();
    wire::decode_challenge(&got[4..4 + n]).unwrap();
    let rest = &got[4 + n..];
    let Reply::Busy(why) = wire::decode_reply(&rest[4..], &Limits::default()).unwrap() else {
        panic!("the oldest pending connection was not told it was dropped")
    };
    assert!(why.contains("4 connections pending"), "{why}");
    silent.clear();
}

#[test]
fn every_rank_gets_every_blob_with_a_secret() {
    let (l, ep) = listener();
    let ranks: Vec<_> = (1..4)
        .map(|r| {
            let ep = ep.clone();
            thread::spawn(move || join(&ep, "t", 4, r, &blob(r), Some(&secret(GOOD)), &opts(10.0)))
        })
        .collect();
    let all = gather(&l, "t", 4, &blob(0), Some(&secret(GOOD)), &opts(10.0)).unwrap();
    assert_eq!(all, (0..4).map(blob).collect::<Vec<_>>());
    for h in ranks {
        assert_eq!(h.join().unwrap().unwrap(), all);
    }
}

/// Issue 22: with a guessable token, anyone reaching the port could fail
/// the job (a wrong world size) or take a rank (join first). With a secret
/// neither works without it.
#[test]
fn a_wrong_secret_cannot_fail_the_job_or_take_a_rank() {
    let (l, ep) = listener();
    let addr = format!("127.0.0.1:{}", ep.port);
    let attacks = [
        // Would fail the whole job if believed.
        (1, 99, Some(WRONG)),
        // Would take rank 2 before the real one.
        (2, 3, Some(WRONG)),
        // No MAC at all.
        (1, 3, None),
    ];
    let attackers: Vec<_> = attacks
        .into_iter()
        .map(|(rank, world, key)| {
            let addr = addr.clone();
            thread::spawn(move || {
                let h = Hello {
                    token: "t".into(),
                    world_size: world,
                    rank,
                    blob: b"attacker".to_vec(),
                    nonce: [0; 32],
                    mac: vec![],
                };
                raw_hello(&addr, &h, key.map(secret).as_ref())
            })
        })
        .collect();
    // The library's own join with the wrong secret.
    let wrong = {
        let ep = ep.clone();
        thread::spawn(move || {
            join(
                &ep,
                "t",
                3,
                2,
                b"attacker",
                Some(&secret(WRONG)),
                &opts(10.0),
            )
        })
    };
    thread::sleep(Duration::from_millis(300));
    let ranks: Vec<_> = (1..3)
        .map(|r| {
            let ep = ep.clone();
            thread::spawn(move || join(&ep, "t", 3, r, &blob(r), Some(&secret(GOOD)), &opts(10.0)))
        })
        .collect();
    let all = gather(&l, "t", 3, &blob(0), Some(&secret(GOOD)), &opts(10.0)).unwrap();
    assert_eq!(all, (0..3).map(blob).collect::<Vec<_>>());
    for h in ranks {
        assert_eq!(h.join().unwrap().unwrap(), all);
    }
    for a in attackers {
        let Reply::Refused(why) = a.join().unwrap() else {
            panic!("an attacker without the secret was accepted")
        };
        assert!(why.contains("authentication failed"), "{why}");
    }
    let e = wrong.join().unwrap().unwrap_err();
    assert!(
        matches!(&e, LaunchError::Refused(w) if w.contains("authentication failed")),
        "{e}"
    );
}

#[test]
fn a_secret_on_one_side_only_is_a_clear_error_not_a_downgrade() {
    // Rank 0 has a secret, the rank none.
    let (l, ep) = listener();
    let rank = spawn_rank(&ep, "t", 2, 1, 10.0);
    let e = gather(&l, "t", 2, &blob(0), Some(&secret(GOOD)), &opts(1.0)).unwrap_err();
    assert!(matches!(e, LaunchError::Timeout { .. }), "{e}");
    let e = rank.join().unwrap().unwrap_err();
    assert!(
        matches!(&e, LaunchError::Auth(w) if w.contains("requires a job secret")),
        "{e}"
    );
    // The rank has a secret, rank 0 (or an impostor on its port) none.
    let (l, ep) = listener();
    let rank =
        thread::spawn(move || join(&ep, "t", 2, 1, b"mine", Some(&secret(GOOD)), &opts(10.0)));
    let e = gather(&l, "t", 2, &blob(0), None, &opts(1.0)).unwrap_err();
    assert!(matches!(e, LaunchError::Timeout { .. }), "{e}");
    let e = rank.join().unwrap().unwrap_err();
    assert!(
        matches!(&e, LaunchError::Auth(w) if w.contains("not sending")),
        "{e}"
    );
}

/// An impostor on rank 0's port that demands authentication: it sees no
/// secret on the wire, and the list it forges is not believed.
#[test]
fn the_secret_never_travels_and_a_forged_list_is_refused() {
    let (l, ep) = listener();
    let rank =
        thread::spawn(move || join(&ep, "t", 2, 1, b"mine", Some(&secret(GOOD)), &opts(10.0)));
    let (mut s, _) = l.accept().unwrap();
    let c = wire::encode_challenge(&wire::Challenge {
        auth: true,
        nonce: [1; 32],
    });
    s.write_all(&wire::frame(&c).unwrap()).unwrap();
    let mut head = [0u8; 4];
    s.read_exact(&mut head).unwrap();
    let mut body = vec![0; wire::frame_len(head, 1 << 20).unwrap()];
    s.read_exact(&mut body).unwrap();
    assert!(!body.windows(GOOD.len()).any(|w| w == GOOD.as_bytes()));
    let h = wire::decode_hello(&body, &Limits::default()).unwrap();
    assert_eq!(h.mac.len(), 32);
    // A list signed with a guessed secret.
    let blobs = vec![b"impostor".to_vec(), b"mine".to_vec()];
    let l0 = Limits::default();
    let unsigned = wire::encode_reply(&Reply::Accepted(blobs.clone(), vec![]), &l0).unwrap();
    let mac = secret(WRONG).list_mac(&h.nonce, &unsigned).to_vec();
    let reply = wire::encode_reply(&Reply::Accepted(blobs, mac), &l0).unwrap();
    s.write_all(&wire::frame(&reply).unwrap()).unwrap();
    drop(s);
    let e = rank.join().unwrap().unwrap_err();
    assert!(
        matches!(&e, LaunchError::Auth(w) if w.contains("does not carry this job's MAC")),
        "{e}"
    );
}
