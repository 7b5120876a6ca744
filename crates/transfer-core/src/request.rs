//! What users submit: one request type per operation, and [`Request`],
//! any one of them, which [`crate::TransferEngine::submit`] takes.
//!
//! A request is checked here (`Request::check`: ranges against the
//! regions, page lists) before anything reaches a worker, so a refused
//! request never costs a queue slot.

use std::sync::Arc;

use crate::error::{Result, TransferError};
use crate::peer::{Peer, PeerGroup, RemoteTarget};
use crate::region::LocalRegion;

/// A single one-sided write.
#[derive(Debug, Clone)]
pub struct WriteRequest<'a> {
    /// Local source region.
    pub src: &'a LocalRegion,
    /// Offset of the first byte in `src`.
    pub src_offset: u64,
    /// Destination region of a peer.
    pub dst: &'a RemoteTarget,
    /// Offset of the first byte in the destination.
    pub dst_offset: u64,
    /// Number of bytes (0 with an immediate is an immediate-only write).
    pub len: u64,
    /// Immediate delivered to the receiver's counters.
    pub imm: Option<u32>,
}

/// A list of equally sized pages: page `i` starts at `offset + indices[i] * stride`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pages {
    /// Page indices.
    pub indices: Vec<u32>,
    /// Bytes between consecutive page indices.
    pub stride: u64,
    /// Byte offset of index 0.
    pub offset: u64,
}

impl Pages {
    /// Byte offset of page `i`, overflow-checked.
    pub(crate) fn byte_offset(&self, i: usize) -> Option<u64> {
        let idx = u64::from(*self.indices.get(i)?);
        idx.checked_mul(self.stride)?.checked_add(self.offset)
    }
}

/// A paged write: `src_pages[i]` goes to `dst_pages[i]`, `page_len` bytes each.
#[derive(Debug, Clone)]
pub struct PagedWriteRequest<'a> {
    /// Local source region.
    pub src: &'a LocalRegion,
    /// Source pages.
    pub src_pages: Pages,
    /// Destination region of a peer.
    pub dst: &'a RemoteTarget,
    /// Destination pages (same count as `src_pages`).
    pub dst_pages: Pages,
    /// Bytes per page.
    pub page_len: u64,
    /// Immediate delivered to the receiver's counters.
    pub imm: Option<u32>,
}

/// One slice of a scatter: `len` bytes from `src_offset` to `dst` at `dst_offset`.
#[derive(Debug, Clone)]
pub struct ScatterItem {
    /// Destination (each item may go to a different peer).
    pub dst: RemoteTarget,
    /// Offset in the local source region.
    pub src_offset: u64,
    /// Offset in the destination region.
    pub dst_offset: u64,
    /// Number of bytes.
    pub len: u64,
}

/// A scatter slice addressed by position in a [`crate::PeerGroup`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slice {
    /// Offset in the local source region.
    pub src_offset: u64,
    /// Offset in the member's region.
    pub dst_offset: u64,
    /// Number of bytes.
    pub len: u64,
}

/// Slices of one local region to an ad-hoc list of targets, each item like
/// a single write (sharded by bytes when large, spread over NICs by item
/// otherwise).
#[derive(Debug, Clone)]
pub struct ScatterRequest<'a> {
    /// Local source region.
    pub src: &'a LocalRegion,
    /// The slices and where each goes.
    pub items: Vec<ScatterItem>,
    /// Immediate every item delivers to its receiver's counters.
    pub imm: Option<u32>,
}

impl<'a> ScatterRequest<'a> {
    /// One slice per member of `peers` (`slices[i]` to member `i`).
    pub fn to_peer_group(
        src: &'a LocalRegion,
        peers: &PeerGroup,
        slices: &[Slice],
        imm: Option<u32>,
    ) -> Result<Self> {
        if slices.len() != peers.len() {
            return Err(TransferError::invalid(
                "scatter",
                format!("{} slices for {} group members", slices.len(), peers.len()),
            ));
        }
        let items = peers
            .members
            .iter()
            .zip(slices)
            .map(|(m, s)| ScatterItem {
                dst: m.clone(),
                src_offset: s.src_offset,
                dst_offset: s.dst_offset,
                len: s.len,
            })
            .collect();
        Ok(Self { src, items, imm })
    }
}

/// An immediate-only (zero-byte) write to every target: each receiver
/// counts exactly one arrival of `imm`. Goes out on domain group 0.
#[derive(Debug, Clone)]
pub struct BarrierRequest {
    /// The targets (shared: a [`PeerGroup`]'s members are not copied).
    pub targets: Arc<[RemoteTarget]>,
    /// The immediate.
    pub imm: u32,
}

impl BarrierRequest {
    /// A barrier to an ad-hoc list of targets.
    pub fn to(targets: &[RemoteTarget], imm: u32) -> Self {
        Self {
            targets: targets.into(),
            imm,
        }
    }

    /// A barrier to every member of a [`PeerGroup`].
    pub fn to_peer_group(peers: &PeerGroup, imm: u32) -> Self {
        Self {
            targets: peers.members.clone(),
            imm,
        }
    }
}

/// A two-sided message: NIC 0 of domain group 0 to the peer's NIC 0 of its NIC
/// set 0. `data` is copied at submit: the caller may reuse it at once.
#[derive(Debug, Clone, Copy)]
pub struct SendRequest<'a> {
    /// The receiver.
    pub peer: &'a Peer,
    /// The message.
    pub data: &'a [u8],
}

/// Any one transfer, as [`crate::TransferEngine::submit`] takes it. Every
/// request type converts into it with `From`.
#[derive(Debug, Clone)]
pub enum Request<'a> {
    /// A single write.
    Write(WriteRequest<'a>),
    /// A paged write.
    Paged(PagedWriteRequest<'a>),
    /// A scatter.
    Scatter(ScatterRequest<'a>),
    /// A barrier.
    Barrier(BarrierRequest),
    /// A message.
    Send(SendRequest<'a>),
}

impl<'a> From<WriteRequest<'a>> for Request<'a> {
    fn from(r: WriteRequest<'a>) -> Self {
        Request::Write(r)
    }
}

impl<'a> From<PagedWriteRequest<'a>> for Request<'a> {
    fn from(r: PagedWriteRequest<'a>) -> Self {
        Request::Paged(r)
    }
}

impl<'a> From<ScatterRequest<'a>> for Request<'a> {
    fn from(r: ScatterRequest<'a>) -> Self {
        Request::Scatter(r)
    }
}

impl From<BarrierRequest> for Request<'_> {
    fn from(r: BarrierRequest) -> Self {
        Request::Barrier(r)
    }
}

impl<'a> From<SendRequest<'a>> for Request<'a> {
    fn from(r: SendRequest<'a>) -> Self {
        Request::Send(r)
    }
}

impl Request<'_> {
    /// The name errors give the operation.
    pub(crate) fn call(&self) -> &'static str {
        match self {
            Request::Write(_) => "write",
            Request::Paged(_) => "paged write",
            Request::Scatter(_) => "scatter",
            Request::Barrier(_) => "barrier",
            Request::Send(_) => "send",
        }
    }

    /// Bytes the transfer moves (saturating; a barrier moves none).
    pub fn bytes(&self) -> u64 {
        match self {
            Request::Write(r) => r.len,
            Request::Paged(r) => (r.src_pages.indices.len() as u64).saturating_mul(r.page_len),
            Request::Scatter(r) => r.items.iter().fold(0u64, |a, i| a.saturating_add(i.len)),
            Request::Barrier(_) => 0,
            Request::Send(r) => r.data.len() as u64,
        }
    }

    /// The local region the transfer reads from, if any: it stays in use
    /// (unregister is refused) until the transfer completes.
    pub(crate) fn source(&self) -> Option<&LocalRegion> {
        match self {
            Request::Write(r) => Some(r.src),
            Request::Paged(r) => Some(r.src),
            Request::Scatter(r) => Some(r.src),
            Request::Barrier(_) | Request::Send(_) => None,
        }
    }

    /// Checks every range against its regions.
    pub(crate) fn check(&self) -> Result<()> {
        let call = self.call();
        match self {
            Request::Write(r) => check_slice(call, r.src, r.src_offset, r.dst, r.dst_offset, r.len),
            Request::Paged(r) => check_paged(call, r),
            Request::Scatter(r) => r.items.iter().try_for_each(|it| {
                check_slice(call, r.src, it.src_offset, &it.dst, it.dst_offset, it.len)
            }),
            Request::Barrier(_) | Request::Send(_) => Ok(()),
        }
    }
}

fn check_slice(
    call: &'static str,
    src: &LocalRegion,
    src_offset: u64,
    dst: &RemoteTarget,
    dst_offset: u64,
    len: u64,
) -> Result<()> {
    src.0.check_range(call, src_offset, len)?;
    dst.region.check_range(call, dst_offset, len)
}

fn check_paged(call: &'static str, req: &PagedWriteRequest<'_>) -> Result<()> {
    let n = req.src_pages.indices.len();
    if n != req.dst_pages.indices.len() {
        return Err(TransferError::invalid(
            call,
            format!(
                "{n} source pages but {} destination pages",
                req.dst_pages.indices.len()
            ),
        ));
    }
    if n == 0 {
        return Err(TransferError::invalid(call, "no pages"));
    }
    for i in 0..n {
        let s = req
            .src_pages
            .byte_offset(i)
            .ok_or_else(|| TransferError::invalid(call, "source page offset overflows"))?;
        let d = req
            .dst_pages
            .byte_offset(i)
            .ok_or_else(|| TransferError::invalid(call, "destination page offset overflows"))?;
        check_slice(call, req.src, s, req.dst, d, req.page_len)?;
    }
    Ok(())
}
