//! The handshake endpoint: one UD QP per domain with its own CQ, a ring of
//! registered receive slots and a few registered send slots.

use std::collections::HashMap;

use transfer_core::{HostBuffer, Result};

use crate::error::{errno_error, post_is_backpressure};
use crate::handshake::WireAddress;
use crate::qp::{self, Path};
use crate::resources::{Ah, CompChannel, Context, Cq, Mr, Pd, Qp};
use crate::sys::{self, datapath, ibv_recv_wr, ibv_send_wr, ibv_sge, ibv_wc};

/// Bytes per slot (40-byte GRH + payload).
const SLOT: usize = 512;
/// Size of the GRH that precedes every UD receive.
const GRH: usize = 40;
const RECV_SLOTS: usize = 128;
const SEND_SLOTS: usize = 32;
/// Tag of receive `wr_id`s (send ones are bare slot numbers).
const RECV_TAG: u64 = 1 << 32;

/// UD QP, CQ, buffers. Field order is drop order: QP first.
pub(crate) struct UdEndpoint {
    qp: Qp,
    ahs: HashMap<([u8; 16], u16), Ah>,
    recv_mr: Mr,
    send_mr: Mr,
    cq: Cq,
    recv_buf: HostBuffer,
    send_buf: HostBuffer,
    free_send: Vec<usize>,
    qkey: u32,
    path: Path,
}

// SAFETY: verbs objects may be used from any thread; the endpoint is owned
// by one domain, itself owned by one worker thread.
unsafe impl Send for UdEndpoint {}

impl UdEndpoint {
    /// The CQ reports on `channel` when given, so that a hello from a new
    /// peer wakes a worker sleeping on the domain's wait descriptor.
    pub(crate) fn new(
        ctx: &Context,
        pd: &Pd,
        path: Path,
        qkey: u32,
        psn: u32,
        channel: Option<&CompChannel>,
    ) -> Result<Self> {
        let cq = Cq::create(ctx, (RECV_SLOTS + SEND_SLOTS + 16) as u32, channel)?;
        let qp = Qp::create(
            pd,
            &cq,
            None,
            sys::IBV_QPT_UD,
            SEND_SLOTS as u32,
            RECV_SLOTS as u32,
        )?;
        qp::ud_ready(&qp, &path, qkey, psn)?;
        let recv_buf = HostBuffer::new(SLOT * RECV_SLOTS)?;
        let send_buf = HostBuffer::new(SLOT * SEND_SLOTS)?;
        let recv_mr = Mr::register(pd, recv_buf.as_ptr(), recv_buf.len(), false)?;
        let send_mr = Mr::register(pd, send_buf.as_ptr(), send_buf.len(), false)?;
        let mut ud = Self {
            qp,
            ahs: HashMap::new(),
            recv_mr,
            send_mr,
            cq,
            recv_buf,
            send_buf,
            free_send: (0..SEND_SLOTS).collect(),
            qkey,
            path,
        };
        for i in 0..RECV_SLOTS {
            ud.post_recv(i)?;
        }
        Ok(ud)
    }

    pub(crate) fn qpn(&self) -> u32 {
        self.qp.qpn()
    }

    pub(crate) fn qkey(&self) -> u32 {
        self.qkey
    }

    /// The handshake CQ (armed by the domain before a worker sleeps).
    pub(crate) fn cq(&self) -> &Cq {
        &self.cq
    }

    fn post_recv(&mut self, slot: usize) -> Result<()> {
        let mut sge = ibv_sge {
            addr: self.recv_buf.as_ptr() as u64 + (slot * SLOT) as u64,
            length: SLOT as u32,
            lkey: self.recv_mr.lkey(),
        };
        let mut wr = ibv_recv_wr {
            wr_id: RECV_TAG | slot as u64,
            next: std::ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        let mut bad = std::ptr::null_mut();
        // SAFETY: live QP; wr/sge valid for the call; the slot lies in registered memory.
        let rc = unsafe { datapath::post_recv(self.qp.as_ptr(), &mut wr, &mut bad) };
        if rc != 0 {
            return Err(errno_error("ibv_post_recv(UD)", rc));
        }
        Ok(())
    }

    /// Sends one datagram to `to`'s UD QP. Best effort: a full send ring
    /// drops it (the handshake retransmits).
    pub(crate) fn send(&mut self, pd: &Pd, to: &WireAddress, bytes: &[u8]) -> Result<()> {
        if bytes.len() > SLOT {
            return Err(transfer_core::TransferError::invalid(
                "UD send",
                "datagram too long",
            ));
        }
        let Some(slot) = self.free_send.pop() else {
            return Ok(());
        };
        let key = (to.gid, to.lid);
        if !self.ahs.contains_key(&key) {
            let mut attr = qp::ah_attr(&self.path, to);
            match Ah::create(pd, &mut attr) {
                Ok(ah) => {
                    self.ahs.insert(key, ah);
                }
                Err(e) => {
                    self.free_send.push(slot);
                    return Err(e);
                }
            }
        }
        let Some(ah) = self.ahs.get(&key) else {
            self.free_send.push(slot);
            return Ok(());
        };
        let addr = self.send_buf.as_ptr() as u64 + (slot * SLOT) as u64;
        // SAFETY: the slot lies inside send_buf and is not in flight (free list).
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), addr as *mut u8, bytes.len());
        }
        let mut sge = ibv_sge {
            addr,
            length: bytes.len() as u32,
            lkey: self.send_mr.lkey(),
        };
        let mut wr = ibv_send_wr {
            wr_id: slot as u64,
            sg_list: &mut sge,
            num_sge: 1,
            opcode: sys::IBV_WR_SEND,
            send_flags: sys::IBV_SEND_SIGNALED,
            ..Default::default()
        };
        wr.set_ud(ah.as_ptr(), to.ud_qpn, to.qkey);
        let mut bad = std::ptr::null_mut();
        // SAFETY: live QP and AH; wr/sge valid for the call.
        let rc = unsafe { datapath::post_send(self.qp.as_ptr(), &mut wr, &mut bad) };
        if rc != 0 {
            self.free_send.push(slot);
            if post_is_backpressure(rc) {
                return Ok(());
            }
            return Err(errno_error("ibv_post_send(UD)", rc));
        }
        Ok(())
    }

    /// Reaps completions: received payloads go to `out`, send slots return
    /// to the free list. Receive slots are reposted at once. Returns how
    /// many completions were reaped.
    pub(crate) fn poll(&mut self, out: &mut Vec<Vec<u8>>) -> usize {
        let mut wcs = [ibv_wc::default(); 32];
        let mut reaped = 0;
        loop {
            // SAFETY: live CQ; wcs has room for its length.
            let n = unsafe { datapath::poll_cq(self.cq.as_ptr(), &mut wcs) };
            let Ok(n) = usize::try_from(n) else {
                return reaped;
            };
            let n = n.min(wcs.len());
            reaped += n;
            for wc in &wcs[..n] {
                let slot = (wc.wr_id & 0xffff_ffff) as usize;
                if wc.wr_id & RECV_TAG != 0 && slot < RECV_SLOTS {
                    let len = wc.byte_len as usize;
                    if wc.status == 0 && len > GRH && len <= SLOT {
                        let base = self.recv_buf.as_ptr() as usize + slot * SLOT + GRH;
                        // SAFETY: the slot was filled by the NIC and is ours again.
                        let data =
                            unsafe { std::slice::from_raw_parts(base as *const u8, len - GRH) };
                        out.push(data.to_vec());
                    }
                    // A failed repost only shrinks the ring.
                    let _ = self.post_recv(slot);
                } else if slot < SEND_SLOTS && !self.free_send.contains(&slot) {
                    self.free_send.push(slot);
                }
            }
            if n < wcs.len() {
                return reaped;
            }
        }
    }

    /// Waits (briefly) for outstanding sends, so datagrams posted just
    /// before drop leave the NIC.
    pub(crate) fn drain_sends(&mut self, budget: std::time::Duration) {
        let end = std::time::Instant::now() + budget;
        let mut sink = Vec::new();
        while self.free_send.len() < SEND_SLOTS && std::time::Instant::now() < end {
            self.poll(&mut sink);
            std::thread::yield_now();
        }
    }
}
