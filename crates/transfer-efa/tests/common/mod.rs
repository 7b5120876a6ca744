//! Shared helpers for the integration tests.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use transfer_core::{
    Domain, DomainEvent, DomainMr, MemoryLocation, MemorySpan, OpToken, PeerId, RemoteNicRegion,
    Result, WriteOp,
};
use transfer_efa::{LibfabricConfig, LibfabricDomain, Library, Provider, open_loopback_domains};

/// Failure guard only (never a timed assertion).
pub const GUARD: Duration = Duration::from_secs(60);

/// Opens `n` loopback domains, or explains why the test is skipped (a
/// failure instead when `TRANSFER_REQUIRE` names the provider).
pub fn open(provider: Provider, n: usize) -> Option<Vec<LibfabricDomain>> {
    open_with(LibfabricConfig::loopback(provider), n)
}

/// As [`open`] with a config.
pub fn open_with(config: LibfabricConfig, n: usize) -> Option<Vec<LibfabricDomain>> {
    let provider = provider_name(&config);
    match try_open_with(config, n) {
        Ok(d) => Some(d),
        Err(reason) => {
            transfer_core::testing::skip_or_fail(&provider, reason);
            None
        }
    }
}

/// As [`open_with`], for configurations that may legitimately not open
/// (e.g. FI_HMEM asked of a provider without it): the reason, never a failure.
pub fn try_open_with(
    config: LibfabricConfig,
    n: usize,
) -> std::result::Result<Vec<LibfabricDomain>, String> {
    if let Err(e) = Library::load() {
        return Err(format!("libfabric cannot be loaded: {e}"));
    }
    open_loopback_domains(&config, n)
        .map_err(|e| format!("provider {} unavailable: {e}", provider_name(&config)))
}

/// The provider a config asks for, as `TRANSFER_REQUIRE` names it.
fn provider_name(config: &LibfabricConfig) -> String {
    config
        .provider
        .as_ref()
        .map_or_else(|| "any".into(), ToString::to_string)
}

/// A registered host buffer.
pub struct Buf {
    pub mem: Vec<u8>,
    pub mr: DomainMr,
    pub remote: RemoteNicRegion,
}

impl Buf {
    pub fn new(d: &mut LibfabricDomain, len: usize, fill: impl Fn(usize) -> u8) -> Self {
        let mut mem: Vec<u8> = (0..len).map(fill).collect();
        let reg = d
            .register(MemorySpan {
                ptr: mem.as_mut_ptr(),
                len,
                location: MemoryLocation::Host,
                dmabuf_fd: None,
            })
            .unwrap();
        Self {
            mem,
            mr: reg.mr,
            remote: reg.remote,
        }
    }

    /// A write of `len` bytes from `src_off` here to `dst` at `dst_off`.
    pub fn write_to(
        &self,
        src_off: usize,
        len: usize,
        peer: PeerId,
        dst: &Buf,
        dst_off: usize,
        imm: Option<u32>,
    ) -> WriteOp {
        WriteOp {
            local_mr: self.mr,
            local: self.mem[src_off..].as_ptr(),
            len,
            peer,
            remote_addr: dst.remote.base + dst_off as u64,
            remote_key: dst.remote.key,
            imm,
        }
    }
}

/// Everything the two sides reported while waiting.
#[derive(Default, Debug)]
pub struct Seen {
    pub completed: Vec<(OpToken, Result<()>)>,
    pub imms: Vec<u32>,
    pub received: Vec<(u64, usize)>,
}

/// Polls every domain until `done(seen)` or the guard expires (panics then).
pub fn drive(domains: &mut [&mut LibfabricDomain], seen: &mut Seen, done: impl Fn(&Seen) -> bool) {
    let start = Instant::now();
    let mut events = Vec::new();
    while !done(seen) {
        assert!(
            start.elapsed() < GUARD,
            "guard expired; seen so far: {seen:?}"
        );
        for d in domains.iter_mut() {
            d.poll(&mut events);
            for e in events.drain(..) {
                match e {
                    DomainEvent::Completed { op, result } => seen.completed.push((op, result)),
                    DomainEvent::Imm { imm } => seen.imms.push(imm),
                    DomainEvent::Received { token, len } => seen.received.push((token.0, len)),
                }
            }
        }
    }
}

/// Waits for the completion of `op` and returns its result.
pub fn complete(domains: &mut [&mut LibfabricDomain], seen: &mut Seen, op: OpToken) -> Result<()> {
    drive(domains, seen, |s| s.completed.iter().any(|(o, _)| *o == op));
    seen.completed
        .iter()
        .find(|(o, _)| *o == op)
        .map(|(_, r)| r.clone())
        .unwrap()
}

/// Submits `write` again and again after a peer died: every attempt must
/// fail, and within a few attempts (connection errors count as strikes)
/// the domain must declare the peer dead and fail the next submit at once.
pub fn until_dead(a: &mut LibfabricDomain, write: WriteOp, seen: &mut Seen) {
    for tok in 1000..1010u64 {
        a.submit_writes(OpToken(tok), &[write]);
        let r = complete(&mut [&mut *a], seen, OpToken(tok));
        assert!(r.is_err(), "write to a dead peer succeeded");
        if matches!(r, Err(transfer_core::TransferError::PeerUnreachable { .. })) {
            a.submit_writes(OpToken(2000), &[write]);
            let mut events = Vec::new();
            a.poll(&mut events);
            assert!(
                matches!(
                    &events[..],
                    [DomainEvent::Completed {
                        op: OpToken(2000),
                        result: Err(transfer_core::TransferError::PeerUnreachable { .. })
                    }]
                ),
                "{events:?}"
            );
            return;
        }
    }
    panic!("peer never declared dead");
}
