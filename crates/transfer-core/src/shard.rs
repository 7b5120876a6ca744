//! Sharding arithmetic: how one logical transfer is split across NICs.
//!
//! Pure functions, no I/O, property-tested (see `tests/shard_props.rs`). Both
//! sides compute the same numbers: the sender to build work requests, the
//! receiver (through [`expected_imms`]) to know how many immediates make one
//! logical transfer. Local NIC `i` always pairs with remote NIC `i`, and each
//! shard carries the NIC it was built for, so keys and domains cannot be
//! mismatched (fabric-lib's round-robin bug).

use serde::{Deserialize, Serialize};

use crate::addr::{GroupAddress, Ordering};

/// How a sender splits single writes; part of its [`GroupAddress`] so that
/// receivers compute the same split.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ShardPolicy {
    /// Writes shorter than `2 * min_shard_bytes` are not split; longer ones
    /// are split in at most `len / min_shard_bytes` shards.
    pub min_shard_bytes: u64,
    /// Shard boundaries are multiples of this (a power of two).
    pub granule: u64,
}

impl Default for ShardPolicy {
    /// 256 KiB minimum shard, 8 KiB granule: below ~256 KiB a second NIC
    /// adds a completion and an immediate but barely any bandwidth
    /// (fabric-lib splits at 8 KiB granularity too).
    fn default() -> Self {
        Self {
            min_shard_bytes: 256 * 1024,
            granule: 8 * 1024,
        }
    }
}

/// A contiguous piece of a single write, bound to one NIC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    /// NIC index (local and remote).
    pub nic: usize,
    /// Offset inside the logical write.
    pub offset: u64,
    /// Length in bytes (0 only for a zero-length write).
    pub len: u64,
}

/// Number of shards a single write of `len` bytes uses over `nics` NICs.
pub fn single_write_shard_count(len: u64, nics: usize, policy: ShardPolicy) -> usize {
    if nics <= 1 || len == 0 {
        return 1;
    }
    let min = policy.min_shard_bytes.max(1);
    let by_size = usize::try_from(len / min).unwrap_or(usize::MAX).max(1);
    let wanted = by_size.min(nics);
    if wanted <= 1 {
        return 1;
    }
    // Rounding shard size up to the granule may leave trailing shards empty.
    let chunk = shard_chunk(len, wanted, policy.granule);
    usize::try_from(len.div_ceil(chunk))
        .unwrap_or(usize::MAX)
        .min(wanted)
}

fn shard_chunk(len: u64, count: usize, granule: u64) -> u64 {
    let g = granule.max(1);
    let raw = len.div_ceil(count as u64);
    raw.div_ceil(g).saturating_mul(g).max(1)
}

/// Splits a single write of `len` bytes over `nics` NICs, starting at NIC
/// `start % nics` (rotating the start spreads small writes over NICs).
/// Every byte is covered exactly once; shards are in offset order.
pub fn shard_single_write(len: u64, nics: usize, start: usize, policy: ShardPolicy) -> Vec<Shard> {
    let nics = nics.max(1);
    let count = single_write_shard_count(len, nics, policy);
    if count == 1 {
        return vec![Shard {
            nic: start % nics,
            offset: 0,
            len,
        }];
    }
    let chunk = shard_chunk(len, count, policy.granule);
    (0..count)
        .map(|i| {
            let offset = chunk * i as u64;
            Shard {
                nic: (start + i) % nics,
                offset,
                len: chunk.min(len - offset),
            }
        })
        .collect()
}

/// The limit a `max_write_size` of 0 stands for: none known.
fn effective_max(max_write_size: u64) -> u64 {
    if max_write_size == 0 {
        u64::MAX
    } else {
        max_write_size
    }
}

/// Number of NIC writes one write of `len` bytes is posted as when a NIC
/// accepts at most `max_write_size` bytes per write (0: no limit); a
/// zero-length write is one.
pub fn write_pieces(len: u64, max_write_size: u64) -> u64 {
    len.div_ceil(effective_max(max_write_size)).max(1)
}

/// The `(offset, len)` pieces, in offset order, that one write of `len`
/// bytes is posted as under `max_write_size` (0: no limit): every byte
/// once, each piece at most the limit, `(0, 0)` for a zero-length write.
pub fn split_write(len: u64, max_write_size: u64) -> impl Iterator<Item = (u64, u64)> {
    let max = effective_max(max_write_size);
    (0..write_pieces(len, max)).map(move |i| {
        // i < ceil(len / max), so i * max < len: no overflow.
        let offset = i * max;
        (offset, (len - offset).min(max))
    })
}

/// A contiguous run of pages `[first, first + count)` of a paged write, bound to one NIC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageBlock {
    /// NIC index (local and remote).
    pub nic: usize,
    /// First page index (into the page lists).
    pub first: usize,
    /// Number of pages.
    pub count: usize,
}

/// Divides `pages` pages evenly over `nics` NICs (block sizes differ by at
/// most one), starting at NIC `start % nics`. Empty blocks are omitted.
pub fn split_pages(pages: usize, nics: usize, start: usize) -> Vec<PageBlock> {
    let nics = nics.max(1);
    let blocks = nics.min(pages);
    if blocks == 0 {
        return Vec::new();
    }
    let base = pages / blocks;
    let extra = pages % blocks;
    let mut first = 0;
    (0..blocks)
        .map(|i| {
            let count = base + usize::from(i < extra);
            let block = PageBlock {
                nic: (start + i) % nics,
                first,
                count,
            };
            first += count;
            block
        })
        .collect()
}

/// The shape of a logical transfer, as the receiver knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteShape {
    /// A single write (or one scatter item) of `len` bytes.
    Single {
        /// Length in bytes.
        len: u64,
    },
    /// A paged write of `pages` pages, each no longer than the sender's
    /// [`GroupAddress::max_write_size`] (every NIC's limit is far above a
    /// page in practice). Use [`WriteShape::PagedSized`] when pages may be
    /// longer: an unordered sender splits such pages and each piece then
    /// carries the immediate.
    Paged {
        /// Number of pages.
        pages: usize,
    },
    /// A paged write of `pages` pages of `page_len` bytes each (any length).
    PagedSized {
        /// Number of pages.
        pages: usize,
        /// Bytes per page.
        page_len: u64,
    },
    /// A barrier (one zero-byte immediate write per peer).
    Barrier,
}

/// How many immediates carrying the same value one logical transfer from
/// `sender` delivers to a receiver group with `receiver_nics` NICs.
///
/// The sender posts every piece of NIC write within its
/// [`GroupAddress::max_write_size`], splitting longer shards and pages.
/// In-order groups put the immediate on the last piece only (it lands
/// last); unordered ones put it on every piece (each piece's immediate is
/// the only sign that piece landed), so the count follows the split.
pub fn expected_imms(sender: &GroupAddress, receiver_nics: usize, shape: WriteShape) -> u64 {
    let nics = sender.nics.len().min(receiver_nics).max(1);
    let max = sender.max_write_size;
    let ordered = sender.ordering == Ordering::InOrder;
    match shape {
        WriteShape::Single { len } => {
            let shards = shard_single_write(len, nics, 0, sender.shard_policy);
            if ordered {
                shards.len() as u64
            } else {
                shards
                    .iter()
                    .map(|s| write_pieces(s.len, max))
                    .fold(0, u64::saturating_add)
            }
        }
        WriteShape::Paged { pages } if ordered => split_pages(pages, nics, 0).len() as u64,
        WriteShape::Paged { pages } => pages as u64,
        WriteShape::PagedSized { pages, .. } if ordered => split_pages(pages, nics, 0).len() as u64,
        WriteShape::PagedSized { pages, page_len } => {
            (pages as u64).saturating_mul(write_pieces(page_len, max))
        }
        WriteShape::Barrier => 1,
    }
}
