//! Work requests: what one RC QP has to post, the signalling policy, and
//! the chains of WR templates patched per page and posted with one
//! doorbell. Pure (no device): the domain feeds the chains to
//! `ibv_post_send`.

use transfer_core::{OpToken, Result, TransferError};

use crate::sys::{self, ibv_send_wr, ibv_sge};

/// What one work request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkKind {
    /// RDMA WRITE (WITH_IMM when `imm` is set).
    Write {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Immediate (host order).
        imm: Option<u32>,
    },
    /// SEND of a registered buffer; `buf` names the buffer to release.
    Send {
        /// Send-buffer id.
        buf: u64,
    },
}

/// One work request waiting for (or posted on) a QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Work {
    /// The submit call it belongs to.
    pub op: OpToken,
    /// Local address.
    pub local: u64,
    /// Length in bytes (0 allowed: no SGE is posted).
    pub len: u32,
    /// Local key.
    pub lkey: u32,
    /// Write or send.
    pub kind: WorkKind,
    /// Last WR of `op` on this QP: always signalled, completes the op's
    /// share on this QP.
    pub last: bool,
}

/// One write as the engine asked for it, resolved to keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteSpec {
    /// Local source address.
    pub local: u64,
    /// Length in bytes.
    pub len: u64,
    /// Local key of the source registration.
    pub lkey: u32,
    /// Remote address.
    pub remote_addr: u64,
    /// Remote key.
    pub rkey: u32,
    /// Immediate.
    pub imm: Option<u32>,
}

/// Expands the writes of one submit call to one peer into work requests:
/// writes longer than `max_msg` are split (the immediate rides on the last
/// piece only: RC places them in order); the very last WR is marked `last`.
pub fn expand_writes(
    op: OpToken,
    writes: &[WriteSpec],
    max_msg: u32,
    out: &mut Vec<Work>,
) -> Result<()> {
    let max = u64::from(max_msg.max(1));
    let start = out.len();
    for w in writes {
        let mut off = 0u64;
        loop {
            let piece = (w.len - off).min(max);
            let end = off + piece == w.len;
            let len = u32::try_from(piece)
                .map_err(|_| TransferError::invalid("submit_writes", "piece exceeds u32"))?;
            out.push(Work {
                op,
                local: w.local.wrapping_add(off),
                len,
                lkey: w.lkey,
                kind: WorkKind::Write {
                    remote_addr: w.remote_addr.wrapping_add(off),
                    rkey: w.rkey,
                    imm: if end { w.imm } else { None },
                },
                last: false,
            });
            off += piece;
            if end {
                break;
            }
        }
    }
    if let Some(l) = out[start..].last_mut() {
        l.last = true;
    }
    Ok(())
}

/// Whether the next WR must be signalled: the last WR of an op, the end of
/// a run of `interval` unsignalled WRs, or the WR that fills the send
/// queue (otherwise its slots could never be reclaimed).
pub fn must_signal(
    last: bool,
    run: usize,
    interval: usize,
    sq_used_after: usize,
    sq_depth: usize,
) -> bool {
    last || run + 1 >= interval.max(1) || sq_used_after >= sq_depth
}

/// Tags of `wr_id` values: the top two bits say what completed.
pub mod wr_id {
    /// A receive on the message SRQ; low bits are the engine's token.
    pub const RECV_MSG: u64 = 1 << 63;
    /// A zero-length receive on the write-with-immediate SRQ.
    pub const RECV_RMA: u64 = 1 << 62;
    /// Mask of the tags.
    pub const TAGS: u64 = RECV_MSG | RECV_RMA;
}

/// A chain of send WR templates with their SGEs, posted with one doorbell.
/// The arrays never move (boxed), so `next` and `sg_list` pointers stay valid.
pub struct SendChain {
    wrs: Box<[ibv_send_wr]>,
    sges: Box<[ibv_sge]>,
    len: usize,
}

// SAFETY: the raw pointers inside point into the chain's own boxed arrays.
unsafe impl Send for SendChain {}

impl SendChain {
    /// A chain of at most `cap` WRs (at least 1).
    pub fn new(cap: usize) -> Self {
        let cap = cap.max(1);
        let mut c = Self {
            wrs: vec![ibv_send_wr::default(); cap].into_boxed_slice(),
            sges: vec![ibv_sge::default(); cap].into_boxed_slice(),
            len: 0,
        };
        for i in 0..cap {
            let sge: *mut ibv_sge = &mut c.sges[i];
            c.wrs[i].sg_list = sge;
        }
        c
    }

    /// Capacity.
    pub fn capacity(&self) -> usize {
        self.wrs.len()
    }

    /// Number of WRs filled.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is filled.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether no more WRs fit.
    pub fn is_full(&self) -> bool {
        self.len == self.wrs.len()
    }

    /// Empties the chain (templates stay allocated).
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Patches the next template for `w`; returns false when full.
    pub fn push(&mut self, w: &Work, id: u64, signaled: bool) -> bool {
        if self.is_full() {
            return false;
        }
        let i = self.len;
        let sge = &mut self.sges[i];
        sge.addr = w.local;
        sge.length = w.len;
        sge.lkey = w.lkey;
        let sge_ptr: *mut ibv_sge = sge;
        let wr = &mut self.wrs[i];
        wr.wr_id = id;
        wr.sg_list = sge_ptr;
        wr.num_sge = i32::from(w.len > 0);
        wr.send_flags = if signaled { sys::IBV_SEND_SIGNALED } else { 0 };
        wr.next = std::ptr::null_mut();
        match w.kind {
            WorkKind::Write {
                remote_addr,
                rkey,
                imm,
            } => {
                wr.set_rdma(remote_addr, rkey);
                match imm {
                    Some(v) => {
                        wr.opcode = sys::IBV_WR_RDMA_WRITE_WITH_IMM;
                        wr.imm_data = v.to_be();
                    }
                    None => {
                        wr.opcode = sys::IBV_WR_RDMA_WRITE;
                        wr.imm_data = 0;
                    }
                }
            }
            WorkKind::Send { .. } => {
                wr.opcode = sys::IBV_WR_SEND;
                wr.imm_data = 0;
                wr.set_rdma(0, 0);
            }
        }
        if i > 0 {
            let this: *mut ibv_send_wr = &mut self.wrs[i];
            self.wrs[i - 1].next = this;
        }
        self.len += 1;
        true
    }

    /// The filled WRs (for inspection).
    pub fn wrs(&self) -> &[ibv_send_wr] {
        &self.wrs[..self.len]
    }

    /// Head of the linked chain, for `ibv_post_send`.
    pub fn head(&mut self) -> *mut ibv_send_wr {
        self.wrs.as_mut_ptr()
    }

    /// Index of `bad` in the chain (how many WRs were posted before it).
    pub fn index_of(&self, bad: *const ibv_send_wr) -> Option<usize> {
        (0..self.len).find(|&i| std::ptr::eq(&self.wrs[i], bad))
    }
}
