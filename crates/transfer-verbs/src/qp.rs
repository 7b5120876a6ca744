//! Queue-pair state transitions (RESET -> INIT -> RTR -> RTS) for the RC
//! data QPs and the UD handshake QP.

use transfer_core::Result;

use crate::handshake::WireAddress;
use crate::resources::Qp;
use crate::sys::{self, ibv_ah_attr, ibv_qp_attr};

/// Local path facts every transition needs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Path {
    pub(crate) port: u8,
    /// Source GID index; `None` when LID-routed (InfiniBand).
    pub(crate) sgid_index: Option<u8>,
    pub(crate) pkey_index: u16,
    pub(crate) sl: u8,
    pub(crate) traffic_class: u8,
    pub(crate) mtu: u8,
}

/// Address vector towards `remote`.
pub(crate) fn ah_attr(path: &Path, remote: &WireAddress) -> ibv_ah_attr {
    let mut ah = ibv_ah_attr {
        dlid: remote.lid,
        sl: path.sl,
        port_num: path.port,
        ..Default::default()
    };
    if let Some(sgid) = path.sgid_index {
        ah.is_global = 1;
        ah.grh.dgid.raw = remote.gid;
        ah.grh.sgid_index = sgid;
        ah.grh.hop_limit = 64;
        ah.grh.traffic_class = path.traffic_class;
    }
    ah
}

/// RESET -> INIT for an RC QP accepting remote writes.
pub(crate) fn rc_init(qp: &Qp, path: &Path) -> Result<()> {
    let mut a = ibv_qp_attr {
        qp_state: sys::IBV_QPS_INIT,
        pkey_index: path.pkey_index,
        port_num: path.port,
        qp_access_flags: (sys::IBV_ACCESS_REMOTE_WRITE | sys::IBV_ACCESS_LOCAL_WRITE) as u32,
        ..Default::default()
    };
    qp.modify(
        &mut a,
        sys::IBV_QP_STATE | sys::IBV_QP_PKEY_INDEX | sys::IBV_QP_PORT | sys::IBV_QP_ACCESS_FLAGS,
        "ibv_modify_qp(RC INIT)",
    )
}

/// Any state -> RESET -> INIT: lets an unused RC QP be connected afresh.
pub(crate) fn rc_reinit(qp: &Qp, path: &Path) -> Result<()> {
    let mut a = ibv_qp_attr {
        qp_state: sys::IBV_QPS_RESET,
        ..Default::default()
    };
    qp.modify(&mut a, sys::IBV_QP_STATE, "ibv_modify_qp(RESET)")?;
    rc_init(qp, path)
}

/// INIT -> RTR towards the remote QP `dest_qpn` starting at `rq_psn`.
pub(crate) fn rc_rtr(
    qp: &Qp,
    path: &Path,
    remote: &WireAddress,
    dest_qpn: u32,
    rq_psn: u32,
    min_rnr_timer: u8,
) -> Result<()> {
    let mtu = path.mtu.min(remote.mtu).max(1);
    let mut a = ibv_qp_attr {
        qp_state: sys::IBV_QPS_RTR,
        path_mtu: i32::from(mtu),
        dest_qp_num: dest_qpn,
        rq_psn,
        max_dest_rd_atomic: 1,
        min_rnr_timer,
        ah_attr: ah_attr(path, remote),
        ..Default::default()
    };
    qp.modify(
        &mut a,
        sys::IBV_QP_STATE
            | sys::IBV_QP_AV
            | sys::IBV_QP_PATH_MTU
            | sys::IBV_QP_DEST_QPN
            | sys::IBV_QP_RQ_PSN
            | sys::IBV_QP_MAX_DEST_RD_ATOMIC
            | sys::IBV_QP_MIN_RNR_TIMER,
        "ibv_modify_qp(RC RTR)",
    )
}

/// RTR -> RTS with send PSN `sq_psn`.
pub(crate) fn rc_rts(
    qp: &Qp,
    sq_psn: u32,
    timeout: u8,
    retry_cnt: u8,
    rnr_retry: u8,
) -> Result<()> {
    let mut a = ibv_qp_attr {
        qp_state: sys::IBV_QPS_RTS,
        sq_psn,
        timeout,
        retry_cnt,
        rnr_retry,
        max_rd_atomic: 1,
        ..Default::default()
    };
    qp.modify(
        &mut a,
        sys::IBV_QP_STATE
            | sys::IBV_QP_SQ_PSN
            | sys::IBV_QP_TIMEOUT
            | sys::IBV_QP_RETRY_CNT
            | sys::IBV_QP_RNR_RETRY
            | sys::IBV_QP_MAX_QP_RD_ATOMIC,
        "ibv_modify_qp(RC RTS)",
    )
}

/// RESET -> INIT -> RTR -> RTS for the UD handshake QP.
pub(crate) fn ud_ready(qp: &Qp, path: &Path, qkey: u32, sq_psn: u32) -> Result<()> {
    let mut a = ibv_qp_attr {
        qp_state: sys::IBV_QPS_INIT,
        pkey_index: path.pkey_index,
        port_num: path.port,
        qkey,
        ..Default::default()
    };
    qp.modify(
        &mut a,
        sys::IBV_QP_STATE | sys::IBV_QP_PKEY_INDEX | sys::IBV_QP_PORT | sys::IBV_QP_QKEY,
        "ibv_modify_qp(UD INIT)",
    )?;
    let mut a = ibv_qp_attr {
        qp_state: sys::IBV_QPS_RTR,
        ..Default::default()
    };
    qp.modify(&mut a, sys::IBV_QP_STATE, "ibv_modify_qp(UD RTR)")?;
    let mut a = ibv_qp_attr {
        qp_state: sys::IBV_QPS_RTS,
        sq_psn,
        ..Default::default()
    };
    qp.modify(
        &mut a,
        sys::IBV_QP_STATE | sys::IBV_QP_SQ_PSN,
        "ibv_modify_qp(UD RTS)",
    )
}
