//! What users submit.

use crate::peer::RemoteTarget;
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
