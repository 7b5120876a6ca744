//! Planning: turning one request into per-NIC batches of [`WriteOp`]s.
//!
//! No thread, no queue, no domain: the only outside call is the peer
//! resolver, passed in as a closure, so every rule below is unit-tested
//! with plain values (quinn-proto style). The arithmetic itself (shard
//! sizes, page blocks, write pieces) is in [`crate::shard`]; this module
//! binds it to registrations, remote keys and immediates:
//!
//! - local NIC `i` posts with the source's registration on NIC `i` and the
//!   remote key of the destination's NIC `i`;
//! - a piece longer than the NICs' write limit is posted as several writes;
//! - an in-order domain group carries the immediate on the last write of each
//!   NIC's share only (it lands last); an unordered one on every write (each
//!   immediate is the only sign that its write landed). Receivers count the
//!   same numbers with [`crate::shard::expected_imms`].

use crate::domain::{DomainMr, PeerId, WriteOp};
use crate::error::{Result, TransferError};
use crate::memory::RemoteNicRegion;
use crate::peer::{Peer, RemoteTarget};
use crate::request::Pages;
use crate::shard::{ShardPolicy, shard_single_write, split_pages, split_write};

/// What planning needs to know about the local domain group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    /// Number of local NICs.
    pub(crate) nics: usize,
    /// How single writes are split.
    pub(crate) policy: ShardPolicy,
    /// Whether every NIC delivers in order.
    pub(crate) ordered: bool,
    /// Largest write every NIC accepts (0: no limit).
    pub(crate) max_write: u64,
}

/// The local side of a planned write: the first byte and its registration
/// on each local NIC (in NIC order).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Source<'a> {
    pub(crate) ptr: *const u8,
    pub(crate) mrs: &'a [DomainMr],
}

/// `len` bytes from `src_offset` of the source to `dst` at `dst_offset`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Piece<'a> {
    pub(crate) src_offset: u64,
    pub(crate) dst: &'a RemoteTarget,
    pub(crate) dst_offset: u64,
    pub(crate) len: u64,
}

/// A paged write: `src[i]` to `dst[i]`, `page_len` bytes each.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PagedPiece<'a> {
    pub(crate) src_pages: &'a Pages,
    pub(crate) dst: &'a RemoteTarget,
    pub(crate) dst_pages: &'a Pages,
    pub(crate) page_len: u64,
}

/// Resolves `(peer, its domain group index, NIC)` to the id the local NIC of
/// that index knows the peer's NIC by.
pub(crate) trait Resolve {
    fn resolve(&mut self, peer: &Peer, peer_domain_group: u32, nic: usize) -> Result<PeerId>;
}

impl<F: FnMut(&Peer, u32, usize) -> Result<PeerId>> Resolve for F {
    fn resolve(&mut self, peer: &Peer, peer_domain_group: u32, nic: usize) -> Result<PeerId> {
        self(peer, peer_domain_group, nic)
    }
}

/// The per-NIC batches of one logical operation, reused between operations.
#[derive(Debug)]
pub(crate) struct Plan {
    layout: Layout,
    batches: Vec<Vec<WriteOp>>,
}

/// One NIC's share of an operation: where its writes come from and go to.
struct Lane {
    nic: usize,
    local_mr: DomainMr,
    local: *const u8,
    peer: PeerId,
    remote: RemoteNicRegion,
}

impl Plan {
    pub(crate) fn new(layout: Layout) -> Self {
        Self {
            layout,
            batches: Vec::new(),
        }
    }

    /// Empties every batch for a new operation.
    pub(crate) fn begin(&mut self) {
        self.batches.resize_with(self.layout.nics, Vec::new);
        for b in &mut self.batches {
            b.clear();
        }
    }

    /// The non-empty batches, with their NIC index.
    pub(crate) fn batches(&self) -> impl Iterator<Item = (usize, &[WriteOp])> {
        self.batches
            .iter()
            .enumerate()
            .filter(|(_, b)| !b.is_empty())
            .map(|(nic, b)| (nic, b.as_slice()))
    }

    /// Binds NIC `nic` of an operation from `src` to `dst`.
    fn lane(
        &self,
        src: Source<'_>,
        dst: &RemoteTarget,
        nic: usize,
        resolve: &mut impl Resolve,
    ) -> Result<Lane> {
        Ok(Lane {
            nic,
            local_mr: *nic_of(src.mrs, nic)?,
            local: src.ptr,
            peer: resolve.resolve(&dst.peer, dst.region.group, nic)?,
            remote: *nic_of(&dst.region.nics, nic)?,
        })
    }

    /// Adds `len` bytes from `local_off` to `remote_off` on `lane`, as
    /// several writes when longer than the NICs' limit. `ends_share`: these
    /// bytes end the lane's share, so in order their last write carries the
    /// immediate.
    fn span(
        &mut self,
        lane: &Lane,
        local_off: u64,
        remote_off: u64,
        len: u64,
        ends_share: bool,
        imm: Option<u32>,
    ) -> Result<()> {
        const CALL: &str = "write";
        let ordered = self.layout.ordered;
        let batch = self
            .batches
            .get_mut(lane.nic)
            .ok_or_else(|| TransferError::invalid(CALL, format!("no local NIC {}", lane.nic)))?;
        for (at, piece_len) in split_write(len, self.layout.max_write) {
            let last = ends_share && at + piece_len == len;
            batch.push(WriteOp {
                local_mr: lane.local_mr,
                local: lane.local.wrapping_add(to_usize(local_off + at)?),
                len: to_usize(piece_len)?,
                peer: lane.peer,
                remote_addr: lane.remote.base.wrapping_add(remote_off + at),
                remote_key: lane.remote.key,
                imm: if ordered && !last { None } else { imm },
            });
        }
        Ok(())
    }

    /// Adds one single write (or scatter item), sharded by bytes over the
    /// NICs both sides have, the first shard on NIC `start % nics`.
    pub(crate) fn single(
        &mut self,
        src: Source<'_>,
        piece: Piece<'_>,
        imm: Option<u32>,
        start: usize,
        resolve: &mut impl Resolve,
    ) -> Result<()> {
        let nics = piece.dst.nics_with(self.layout.nics);
        for shard in shard_single_write(piece.len, nics, start, self.layout.policy) {
            let lane = self.lane(src, piece.dst, shard.nic, resolve)?;
            let (local, remote) = (piece.src_offset, piece.dst_offset);
            let off = shard.offset;
            self.span(&lane, local + off, remote + off, shard.len, true, imm)?;
        }
        Ok(())
    }

    /// Adds a paged write: pages divided evenly over the NICs both sides
    /// have, in blocks starting at NIC `start % nics`.
    pub(crate) fn paged(
        &mut self,
        src: Source<'_>,
        paged: PagedPiece<'_>,
        imm: Option<u32>,
        start: usize,
        resolve: &mut impl Resolve,
    ) -> Result<()> {
        let nics = paged.dst.nics_with(self.layout.nics);
        for block in split_pages(paged.src_pages.indices.len(), nics, start) {
            let lane = self.lane(src, paged.dst, block.nic, resolve)?;
            let end = block.first + block.count;
            for i in block.first..end {
                let (Some(s), Some(d)) = (
                    paged.src_pages.byte_offset(i),
                    paged.dst_pages.byte_offset(i),
                ) else {
                    return Err(TransferError::invalid(
                        "paged write",
                        "page offset overflow",
                    ));
                };
                self.span(&lane, s, d, paged.page_len, i + 1 == end, imm)?;
            }
        }
        Ok(())
    }

    /// Adds one zero-byte write carrying `imm` per target, target `i` on
    /// NIC `(start + i) % nics`. `zero` is a registered local byte (EFA
    /// wants a registered local side even for zero bytes).
    pub(crate) fn barrier(
        &mut self,
        zero: Source<'_>,
        targets: &[RemoteTarget],
        imm: u32,
        start: usize,
        resolve: &mut impl Resolve,
    ) -> Result<()> {
        for (i, t) in targets.iter().enumerate() {
            let nic = (start + i) % t.nics_with(self.layout.nics);
            let lane = self.lane(zero, t, nic, resolve)?;
            self.span(&lane, 0, 0, 0, true, Some(imm))?;
        }
        Ok(())
    }
}

fn nic_of<T>(per_nic: &[T], nic: usize) -> Result<&T> {
    per_nic
        .get(nic)
        .ok_or_else(|| TransferError::invalid("plan", format!("nothing registered on NIC {nic}")))
}

fn to_usize(v: u64) -> Result<usize> {
    usize::try_from(v)
        .map_err(|_| TransferError::invalid("write", "offset or length overflows usize"))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::addr::{BackendKind, EngineAddress, GroupAddress, NicAddress, Ordering};
    use crate::memory::{RemoteKey, RemoteRegion};
    use crate::peer::PeerInner;
    use crate::shard::{WriteShape, expected_imms};

    const KIB: u64 = 1024;

    fn layout(nics: usize, ordered: bool, max_write: u64) -> Layout {
        Layout {
            nics,
            policy: ShardPolicy::default(),
            ordered,
            max_write,
        }
    }

    /// A peer with `nics` NICs and a region at base 0x1000 * (nic + 1), key 100 + nic.
    fn target(nics: usize, len: u64) -> RemoteTarget {
        let group = GroupAddress {
            nics: (0..nics).map(|i| NicAddress(vec![i as u8])).collect(),
            ordering: Ordering::Unordered,
            shard_policy: ShardPolicy::default(),
            max_write_size: 0,
        };
        RemoteTarget {
            peer: Peer(Arc::new(PeerInner {
                id: 9,
                addr: EngineAddress {
                    backend: BackendKind::Test,
                    groups: vec![group],
                },
            })),
            region: Arc::new(RemoteRegion {
                backend: BackendKind::Test,
                group: 0,
                len,
                nics: (0..nics as u64)
                    .map(|i| RemoteNicRegion {
                        base: 0x1000 * (i + 1),
                        key: RemoteKey(100 + i),
                    })
                    .collect(),
            }),
        }
    }

    /// Resolves NIC `i` to PeerId(i).
    fn by_nic(_: &Peer, _: u32, nic: usize) -> Result<PeerId> {
        Ok(PeerId(nic as u64))
    }

    const MRS: [DomainMr; 4] = [DomainMr(10), DomainMr(11), DomainMr(12), DomainMr(13)];

    fn src() -> Source<'static> {
        Source {
            ptr: std::ptr::null(),
            mrs: &MRS,
        }
    }

    /// Plans one single write of `len` bytes from source offset `at` to
    /// destination offset `at * 2`, and returns every write with its NIC.
    fn single(l: Layout, dst: &RemoteTarget, at: u64, len: u64, start: usize) -> Plan {
        let mut plan = Plan::new(l);
        plan.begin();
        let piece = Piece {
            src_offset: at,
            dst,
            dst_offset: at * 2,
            len,
        };
        plan.single(src(), piece, Some(5), start, &mut by_nic)
            .unwrap();
        plan
    }

    fn all(plan: &Plan) -> Vec<(usize, WriteOp)> {
        plan.batches()
            .flat_map(|(nic, b)| b.iter().map(move |w| (nic, *w)))
            .collect()
    }

    fn imms(plan: &Plan) -> u64 {
        all(plan).iter().filter(|(_, w)| w.imm.is_some()).count() as u64
    }

    #[test]
    fn a_large_write_is_sharded_with_each_nics_keys() {
        let ops = all(&single(
            layout(2, false, 0),
            &target(2, 4096 * KIB),
            8,
            1024 * KIB,
            1,
        ));
        assert_eq!(ops.len(), 2);
        // The first shard starts on NIC 1 (start 1) and covers bytes 0..512 KiB.
        let on1 = ops.iter().find(|(n, _)| *n == 1).unwrap().1;
        assert_eq!(on1.local_mr, DomainMr(11));
        assert_eq!(on1.peer, PeerId(1));
        assert_eq!(on1.remote_key, RemoteKey(101));
        assert_eq!(on1.remote_addr, 0x2000 + 16);
        assert_eq!(on1.local as usize, 8);
        assert_eq!(on1.len as u64, 512 * KIB);
        let on0 = ops.iter().find(|(n, _)| *n == 0).unwrap().1;
        assert_eq!(on0.remote_addr, 0x1000 + 16 + 512 * KIB);
        assert_eq!(on0.local as usize, 8 + 512 * KIB as usize);
        assert!(ops.iter().all(|(_, w)| w.imm == Some(5)));
    }

    #[test]
    fn a_small_write_stays_on_its_start_nic_and_in_order_keeps_one_immediate() {
        let ops = all(&single(layout(4, true, 0), &target(4, KIB), 0, 100, 6));
        assert_eq!(ops.len(), 1);
        assert_eq!(ops[0].0, 2);
        assert_eq!(ops[0].1.imm, Some(5));
    }

    #[test]
    fn pieces_above_the_write_limit_carry_the_immediate_as_the_receiver_counts() {
        for ordered in [true, false] {
            let (l, len) = (layout(2, ordered, 100 * KIB), 1024 * KIB);
            let plan = single(l, &target(2, 4096 * KIB), 0, len, 0);
            let ops = all(&plan);
            assert!(ops.iter().all(|(_, w)| w.len as u64 <= 100 * KIB));
            assert_eq!(ops.iter().map(|(_, w)| w.len as u64).sum::<u64>(), len);
            // One immediate per shard in order (on its last piece), one per piece without.
            let want = if ordered { 2 } else { ops.len() as u64 };
            assert_eq!(imms(&plan), want);
            let sender = GroupAddress {
                nics: vec![NicAddress(vec![]); 2],
                ordering: if ordered {
                    Ordering::InOrder
                } else {
                    Ordering::Unordered
                },
                shard_policy: l.policy,
                max_write_size: l.max_write,
            };
            assert_eq!(expected_imms(&sender, 2, WriteShape::Single { len }), want);
        }
    }

    #[test]
    fn a_remote_with_fewer_nics_gets_all_shards_on_shared_ones() {
        let plan = single(
            layout(4, false, 0),
            &target(1, 4096 * KIB),
            0,
            2048 * KIB,
            3,
        );
        assert!(all(&plan).iter().all(|(n, _)| *n == 0));
    }

    #[test]
    fn pages_are_divided_in_blocks_per_nic() {
        let (l, dst) = (layout(2, true, 0), target(2, 1 << 20));
        let pages = |indices: Vec<u32>, offset: u64| Pages {
            indices,
            stride: 4096,
            offset,
        };
        let (src_pages, dst_pages) = (
            pages(vec![0, 1, 2, 3, 4], 0),
            pages(vec![9, 8, 7, 6, 5], 100),
        );
        let mut plan = Plan::new(l);
        plan.begin();
        let paged = PagedPiece {
            src_pages: &src_pages,
            dst: &dst,
            dst_pages: &dst_pages,
            page_len: 4096,
        };
        plan.paged(src(), paged, Some(3), 0, &mut by_nic).unwrap();
        let ops = all(&plan);
        // 3 pages on NIC 0, 2 on NIC 1; in order, one immediate per block.
        assert_eq!(ops.iter().filter(|(n, _)| *n == 0).count(), 3);
        assert_eq!(ops.iter().filter(|(n, _)| *n == 1).count(), 2);
        assert_eq!(imms(&plan), 2);
        assert_eq!(ops[0].1.remote_addr, 0x1000 + 100 + 9 * 4096);
        assert_eq!(ops[3].1.remote_addr, 0x2000 + 100 + 6 * 4096);
        assert_eq!(ops[3].1.local as usize, 3 * 4096);
    }

    #[test]
    fn a_barrier_is_one_zero_byte_immediate_per_target_round_robin() {
        let targets = vec![target(2, 64), target(2, 64), target(1, 64)];
        let mut plan = Plan::new(layout(2, false, 0));
        plan.begin();
        plan.barrier(src(), &targets, 7, 1, &mut by_nic).unwrap();
        let ops = all(&plan);
        // Target 0 on NIC 1, target 1 on NIC 0, target 2 has one NIC only.
        let nics: Vec<usize> = ops.iter().map(|(n, _)| *n).collect();
        assert_eq!(nics, [0, 0, 1]);
        assert!(ops.iter().all(|(_, w)| w.len == 0 && w.imm == Some(7)));
    }

    #[test]
    fn a_resolve_error_ends_planning() {
        let dst = target(1, 64);
        let mut plan = Plan::new(layout(1, false, 0));
        plan.begin();
        let piece = Piece {
            src_offset: 0,
            dst: &dst,
            dst_offset: 0,
            len: 8,
        };
        let mut refuse = |_: &Peer, _: u32, _: usize| -> Result<PeerId> {
            Err(TransferError::invalid("t", "x"))
        };
        assert!(plan.single(src(), piece, None, 0, &mut refuse).is_err());
        // begin() drops what a failed plan left.
        plan.begin();
        assert_eq!(plan.batches().count(), 0);
    }
}
