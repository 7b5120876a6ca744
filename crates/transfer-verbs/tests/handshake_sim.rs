//! The handshake decision logic (`handshake::decide`) driven by a simulated
//! network that loses, duplicates and reorders datagrams, with QP errors,
//! `remove_peer` and passive-entry removal thrown in: both sides must end
//! connected to each other's current QPs, and a side must only become Ready
//! when the peer's QPs are connected to its current ones.

use proptest::prelude::*;
use transfer_verbs::handshake::{
    ConnView, Hello, HelloAction, Phase, VERSION, WireAddress, decide,
};

#[derive(Clone, Copy, Debug)]
struct Side {
    v: ConnView,
    /// No entry at all (removed passive entry): the next hello creates one.
    absent: bool,
}

struct Sim {
    sides: [Side; 2],
    net: Vec<(usize, Hello)>,
    next_conn: [u64; 2],
    rng: u64,
}

fn addr(i: usize) -> WireAddress {
    WireAddress {
        version: VERSION,
        gid: [i as u8; 16],
        global: true,
        lid: 0,
        ud_qpn: 1 + i as u32,
        qkey: 1,
        mtu: 5,
        nonce: i as u64,
    }
}

impl Sim {
    fn new(seed: u64) -> Self {
        let fresh = |c| Side {
            v: ConnView {
                conn: c,
                remote_conn: None,
                min_remote_conn: 0,
                confirmed: false,
                phase: Phase::Connecting,
            },
            absent: false,
        };
        let mut s = Sim {
            sides: [fresh(100), fresh(1000)],
            net: Vec::new(),
            next_conn: [101, 1001],
            rng: seed | 1,
        };
        // Side 1 has not resolved side 0 yet: its entry appears with the first hello.
        s.sides[1].absent = true;
        s.hello(0, false);
        s
    }

    fn rand(&mut self, n: usize) -> usize {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        (self.rng % n.max(1) as u64) as usize
    }

    fn new_conn(&mut self, i: usize) -> u64 {
        self.next_conn[i] += 1;
        self.next_conn[i]
    }

    fn hello(&mut self, i: usize, bye: bool) {
        let v = self.sides[i].v;
        let h = Hello {
            from: addr(i),
            to_nonce: (1 - i) as u64,
            bye,
            conn: v.conn,
            peer_conn: v.remote_conn,
            confirmed: v.confirmed,
            min_peer_conn: v.min_remote_conn,
            qpns: [1, 2],
            psns: [0, 0],
        };
        self.net.push((1 - i, h));
    }

    /// Rebuild after an error: new QPs, new number (what `reconnect` does).
    fn rebuild(&mut self, i: usize) {
        let c = self.new_conn(i);
        let v = &mut self.sides[i].v;
        if let Some(rc) = v.remote_conn.take() {
            v.min_remote_conn = v.min_remote_conn.max(rc + 1);
        }
        v.conn = c;
        v.confirmed = false;
        v.phase = Phase::Connecting;
    }

    fn deliver(&mut self, to: usize, h: Hello) {
        if self.sides[to].absent {
            if h.bye {
                return;
            }
            let c = self.new_conn(to);
            self.sides[to] = Side {
                v: ConnView {
                    conn: c,
                    remote_conn: None,
                    min_remote_conn: 0,
                    confirmed: false,
                    phase: Phase::Connecting,
                },
                absent: false,
            };
        }
        let a: HelloAction = decide(&self.sides[to].v, &h);
        if a.ignore {
            return;
        }
        if a.close {
            let v = &mut self.sides[to].v;
            if let Some(rc) = v.remote_conn.take() {
                v.min_remote_conn = v.min_remote_conn.max(rc + 1);
            }
            v.confirmed = false;
            v.phase = Phase::Idle;
            // A passive entry nobody uses is dropped by the domain.
            if self.rand(2) == 0 {
                self.sides[to].absent = true;
            }
            return;
        }
        if a.rebuild {
            self.rebuild(to);
        }
        let v = &mut self.sides[to].v;
        if a.repoint {
            v.remote_conn = None;
        }
        if a.connect {
            v.remote_conn = Some(h.conn);
        }
        if a.confirm {
            // Safety: the peer's QPs are connected to our current ones.
            assert_eq!(h.peer_conn, Some(v.conn));
            v.confirmed = true;
            v.phase = Phase::Ready;
        }
        if a.reply {
            self.hello(to, false);
        }
    }

    fn timer(&mut self, i: usize) {
        if !self.sides[i].absent && self.sides[i].v.phase == Phase::Connecting {
            self.hello(i, false);
        }
    }

    fn step(&mut self, chaos: bool) {
        let r = self.rand(100);
        if self.net.is_empty() || r < 8 {
            let i = self.rand(2);
            return self.timer(i);
        }
        if chaos && r < 14 {
            let i = self.rand(self.net.len());
            self.net.swap_remove(i);
            return;
        }
        if chaos && r < 17 {
            let i = self.rand(2);
            if !self.sides[i].absent
                && matches!(self.sides[i].v.phase, Phase::Ready | Phase::Connecting)
            {
                self.rebuild(i);
                self.hello(i, false);
            }
            return;
        }
        if chaos && r < 19 {
            // remove_peer + resolve again: bye for the old connection, a fresh entry.
            let i = self.rand(2);
            if !self.sides[i].absent {
                if self.sides[i].v.remote_conn.is_some() {
                    self.hello(i, true);
                }
                let c = self.new_conn(i);
                self.sides[i].v = ConnView {
                    conn: c,
                    remote_conn: None,
                    min_remote_conn: 0,
                    confirmed: false,
                    phase: Phase::Connecting,
                };
                self.hello(i, false);
            }
            return;
        }
        let k = self.rand(self.net.len());
        let (to, h) = if chaos && r < 30 {
            self.net[k] // duplicate: deliver and keep
        } else {
            self.net.swap_remove(k)
        };
        self.deliver(to, h);
    }

    fn converged(&self) -> bool {
        let [a, b] = self.sides;
        !a.absent
            && !b.absent
            && a.v.phase == Phase::Ready
            && b.v.phase == Phase::Ready
            && a.v.remote_conn == Some(b.v.conn)
            && b.v.remote_conn == Some(a.v.conn)
    }

    /// Nudges an Idle side the way new work would (`enqueue` reconnects).
    fn use_idle(&mut self) {
        for i in 0..2 {
            if !self.sides[i].absent && self.sides[i].v.phase == Phase::Idle {
                self.rebuild(i);
                self.hello(i, false);
            }
        }
    }
}

fn run(seed: u64, chaos_steps: usize) -> Result<usize, String> {
    let mut s = Sim::new(seed);
    for _ in 0..chaos_steps {
        s.step(true);
    }
    s.use_idle();
    // Calm network: only the timers and in-order-ish deliveries.
    for n in 0..20_000 {
        if s.converged() {
            return Ok(n);
        }
        if s.sides
            .iter()
            .all(|x| x.absent || x.v.phase != Phase::Connecting)
            && s.net.is_empty()
        {
            s.use_idle();
            if s.sides[0].absent && s.sides[1].absent {
                return Err("both entries gone".into());
            }
        }
        s.step(false);
    }
    Err(format!("no convergence: {:?} net {}", s.sides, s.net.len()))
}

#[test]
fn clean_network_connects_in_a_few_messages() {
    let n = run(7, 0).unwrap();
    assert!(n < 50, "{n} steps");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]
    #[test]
    fn converges_after_loss_duplication_reordering_and_resets(seed in any::<u64>(), chaos in 0usize..400) {
        if let Err(e) = run(seed, chaos) {
            // Both entries removed (each side forgot the other) is a legal end: nobody wants a connection.
            prop_assert!(e == "both entries gone", "{}", e);
        }
    }
}
/// A deterministic sweep over many schedules (cheap: a few ms per thousand).
#[test]
fn many_seeded_schedules_converge() {
    let mut failures = Vec::new();
    for seed in 1..30_000u64 {
        match run(
            seed.wrapping_mul(0x9E37_79B9_7F4A_7C15),
            (seed % 600) as usize,
        ) {
            Ok(_) => {}
            Err(e) if e == "both entries gone" => {}
            Err(e) => failures.push(format!("seed {seed}: {e}")),
        }
    }
    assert!(
        failures.is_empty(),
        "{} schedules did not converge, e.g. {:?}",
        failures.len(),
        failures.first()
    );
}
