//! Device and port discovery: ports, GIDs, link layer, speed; and the pure
//! policy that picks the port and GID index a domain uses.

use std::ffi::CStr;

use transfer_core::{Result, TransferError};

use crate::error::errno_error;
use crate::resources::Context;
use crate::sys::{self, ibv_device_attr, ibv_gid, ibv_gid_entry, ibv_port_attr};

/// Link layer of a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkLayer {
    /// InfiniBand: addressed by LID (GRH optional).
    InfiniBand,
    /// Ethernet (RoCE): addressed by GID, GRH mandatory.
    Ethernet,
    /// Not reported (old providers): treated as InfiniBand.
    Unspecified,
}

impl LinkLayer {
    /// From `ibv_port_attr.link_layer`.
    pub fn from_raw(v: u8) -> Self {
        match v {
            sys::IBV_LINK_LAYER_INFINIBAND => LinkLayer::InfiniBand,
            sys::IBV_LINK_LAYER_ETHERNET => LinkLayer::Ethernet,
            _ => LinkLayer::Unspecified,
        }
    }
}

/// Type of a GID table entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GidKind {
    /// InfiniBand GID.
    Ib,
    /// RoCE v1 (Ethernet L2).
    RoceV1,
    /// RoCE v2 (UDP/IP, routable).
    RoceV2,
    /// Type unknown (neither `_ibv_query_gid_ex` nor sysfs told).
    Unknown,
}

/// One populated GID table entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GidEntry {
    /// Index in the port's GID table.
    pub index: u32,
    /// The GID (16 bytes, network order).
    pub gid: [u8; 16],
    /// Its type.
    pub kind: GidKind,
}

impl GidEntry {
    /// Whether the GID is an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`).
    pub fn is_ipv4_mapped(&self) -> bool {
        self.gid[..10].iter().all(|&b| b == 0) && self.gid[10] == 0xff && self.gid[11] == 0xff
    }

    /// Whether the GID is IPv6 link-local (`fe80::/10`).
    pub fn is_link_local(&self) -> bool {
        self.gid[0] == 0xfe && (self.gid[1] & 0xc0) == 0x80
    }

    /// Whether every byte is zero (an empty slot).
    pub fn is_zero(&self) -> bool {
        self.gid.iter().all(|&b| b == 0)
    }
}

/// What a port reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortInfo {
    /// Port number (1-based).
    pub port: u8,
    /// Whether the port state is ACTIVE.
    pub active: bool,
    /// Link layer.
    pub link_layer: LinkLayer,
    /// LID (InfiniBand).
    pub lid: u16,
    /// Active MTU as `enum ibv_mtu` (1 = 256 .. 5 = 4096).
    pub active_mtu: u8,
    /// Largest message the port accepts.
    pub max_msg_sz: u32,
    /// Link speed in bits per second (0 when unknown).
    pub speed_bps: u64,
    /// Populated GID entries.
    pub gids: Vec<GidEntry>,
}

/// What a device reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Kernel device name (e.g. `mlx5_0`, `rxe0`).
    pub name: String,
    /// Largest work-queue depth.
    pub max_qp_wr: u32,
    /// Largest SRQ depth.
    pub max_srq_wr: u32,
    /// Largest CQ depth.
    pub max_cqe: u32,
    /// Ports, in order.
    pub ports: Vec<PortInfo>,
}

/// Bytes of a port's MTU enum (1 = 256 .. 5 = 4096).
pub fn mtu_bytes(mtu: u8) -> u32 {
    match mtu {
        1..=5 => 128u32 << mtu,
        _ => 0,
    }
}

/// Link speed from `active_width` and `active_speed` (per-lane signalling
/// rate times lanes; 0 when either is unknown).
pub fn link_speed_bps(active_width: u8, active_speed: u8) -> u64 {
    let lanes: u64 = match active_width {
        1 => 1,
        2 => 4,
        4 => 8,
        8 => 12,
        16 => 2,
        _ => 0,
    };
    let lane_mbps: u64 = match active_speed {
        1 => 2_500,
        2 => 5_000,
        4 | 8 => 10_000,
        16 => 14_000,
        32 => 25_000,
        64 => 50_000,
        128 => 100_000,
        _ => 0,
    };
    lanes * lane_mbps * 1_000_000
}

/// Picks the port: the override if given (it must exist), else the first
/// active port, else the first port.
pub fn select_port(ports: &[PortInfo], wanted: Option<u8>) -> Result<&PortInfo> {
    const CALL: &str = "VerbsDomain::open";
    if let Some(p) = wanted {
        return ports.iter().find(|i| i.port == p).ok_or_else(|| {
            TransferError::invalid(CALL, format!("port {p} does not exist on this device"))
        });
    }
    ports
        .iter()
        .find(|p| p.active)
        .or_else(|| ports.first())
        .ok_or_else(|| TransferError::invalid(CALL, "device has no port"))
}

/// Picks the GID index for a port, or `None` when the port is addressed
/// by LID alone (InfiniBand without an override).
///
/// RoCE (Ethernet): an override must name a populated entry; otherwise
/// RoCE v2 with an IPv4-mapped address is preferred (routable, what RDMA
/// CM picks on most clusters), then RoCE v2 with a global IPv6 address,
/// then RoCE v2 link-local, then any RoCE v1 / untyped entry in the same
/// order. InfiniBand: the override if given (used for the GRH), else none.
pub fn select_gid(
    link_layer: LinkLayer,
    gids: &[GidEntry],
    wanted: Option<u32>,
) -> Result<Option<u32>> {
    const CALL: &str = "VerbsDomain::open";
    if let Some(w) = wanted {
        return match gids.iter().find(|g| g.index == w && !g.is_zero()) {
            Some(g) => Ok(Some(g.index)),
            None => Err(TransferError::invalid(
                CALL,
                format!("GID index {w} is not populated on this port"),
            )),
        };
    }
    if link_layer != LinkLayer::Ethernet {
        return Ok(None);
    }
    let rank = |g: &GidEntry| -> u32 {
        let kind = match g.kind {
            GidKind::RoceV2 => 0,
            GidKind::Unknown => 1,
            GidKind::RoceV1 => 2,
            GidKind::Ib => 3,
        };
        let addr = if g.is_ipv4_mapped() {
            0
        } else if !g.is_link_local() {
            1
        } else {
            2
        };
        kind * 3 + addr
    };
    gids.iter()
        .filter(|g| !g.is_zero())
        .min_by_key(|g| (rank(g), g.index))
        .map(|g| Some(g.index))
        .ok_or_else(|| {
            TransferError::invalid(
                CALL,
                "RoCE port has no populated GID (is the netdev up with an IP address?)",
            )
        })
}

/// Names of the verbs devices present.
pub fn list_devices() -> Result<Vec<String>> {
    let v = sys::verbs()?;
    let mut n = 0;
    // SAFETY: ibv_get_device_list writes the count and returns a
    // NULL-terminated array that we free below.
    let list = unsafe { (v.get_device_list)(&mut n) };
    if list.is_null() {
        let errno = crate::error::last_errno();
        // ENOSYS: the kernel has no uverbs support at all: no devices.
        if errno == libc::ENOSYS {
            return Ok(Vec::new());
        }
        return Err(errno_error("ibv_get_device_list", errno));
    }
    let mut names = Vec::new();
    for i in 0..usize::try_from(n).unwrap_or(0) {
        // SAFETY: i < n entries of the array just returned.
        let dev = unsafe { *list.add(i) };
        if dev.is_null() {
            break;
        }
        names.push(device_name(v, dev));
    }
    // SAFETY: `list` came from ibv_get_device_list and is freed once.
    unsafe { (v.free_device_list)(list) };
    Ok(names)
}

pub(crate) fn device_name(v: &sys::Verbs, dev: *mut sys::ibv_device) -> String {
    // SAFETY: dev is a live entry of a device list.
    let p = unsafe { (v.get_device_name)(dev) };
    if p.is_null() {
        return String::new();
    }
    // SAFETY: NUL-terminated name inside the device struct.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// Queries device and port facts of an opened context.
pub(crate) fn query(ctx: &Context) -> Result<DeviceInfo> {
    let v = ctx.verbs();
    // SAFETY: all-zero is a valid ibv_device_attr.
    let mut attr: ibv_device_attr = unsafe { std::mem::zeroed() };
    // SAFETY: live context; attr is a valid out-pointer of the right size.
    let rc = unsafe { (v.query_device)(ctx.as_ptr(), &mut attr) };
    if rc != 0 {
        return Err(errno_error("ibv_query_device", rc));
    }
    let mut ports = Vec::new();
    for port in 1..=attr.phys_port_cnt {
        ports.push(query_port(ctx, port)?);
    }
    Ok(DeviceInfo {
        name: ctx.name().to_string(),
        max_qp_wr: u32::try_from(attr.max_qp_wr).unwrap_or(0),
        max_srq_wr: u32::try_from(attr.max_srq_wr).unwrap_or(0),
        max_cqe: u32::try_from(attr.max_cqe).unwrap_or(0),
        ports,
    })
}

fn query_port(ctx: &Context, port: u8) -> Result<PortInfo> {
    let v = ctx.verbs();
    // SAFETY: all-zero is a valid ibv_port_attr; the buffer is larger than
    // what any libibverbs version writes through the exported symbol.
    let mut pa: ibv_port_attr = unsafe { std::mem::zeroed() };
    // SAFETY: live context, valid out-pointer.
    let rc = unsafe { (v.query_port)(ctx.as_ptr(), port, &mut pa) };
    if rc != 0 {
        return Err(errno_error("ibv_query_port", rc));
    }
    let mut gids = Vec::new();
    for index in 0..u32::try_from(pa.gid_tbl_len).unwrap_or(0).min(256) {
        if let Some(g) = query_gid(ctx, port, index) {
            if !g.is_zero() {
                gids.push(g);
            }
        }
    }
    Ok(PortInfo {
        port,
        active: pa.state == sys::IBV_PORT_ACTIVE,
        link_layer: LinkLayer::from_raw(pa.link_layer),
        lid: pa.lid,
        active_mtu: u8::try_from(pa.active_mtu).unwrap_or(0),
        max_msg_sz: pa.max_msg_sz,
        speed_bps: link_speed_bps(pa.active_width, pa.active_speed),
        gids,
    })
}

fn query_gid(ctx: &Context, port: u8, index: u32) -> Option<GidEntry> {
    let v = ctx.verbs();
    if let Some(ex) = v.query_gid_ex {
        let mut e = ibv_gid_entry::default();
        // SAFETY: live context; `e` is a valid out-pointer of the size passed.
        let rc = unsafe {
            ex(
                ctx.as_ptr(),
                u32::from(port),
                index,
                &mut e,
                0,
                std::mem::size_of::<ibv_gid_entry>(),
            )
        };
        if rc == 0 {
            let kind = match e.gid_type {
                sys::IBV_GID_TYPE_IB => GidKind::Ib,
                sys::IBV_GID_TYPE_ROCE_V1 => GidKind::RoceV1,
                sys::IBV_GID_TYPE_ROCE_V2 => GidKind::RoceV2,
                _ => GidKind::Unknown,
            };
            return Some(GidEntry {
                index,
                gid: e.gid.raw,
                kind,
            });
        }
    }
    let mut gid = ibv_gid::default();
    // SAFETY: live context; valid out-pointer.
    let rc = unsafe { (v.query_gid)(ctx.as_ptr(), port, i32::try_from(index).ok()?, &mut gid) };
    if rc != 0 {
        return None;
    }
    Some(GidEntry {
        index,
        gid: gid.raw,
        kind: gid_kind_from_sysfs(ctx.name(), port, index),
    })
}

/// Parses a sysfs `gid_attrs/types/N` value.
pub fn parse_gid_type(s: &str) -> GidKind {
    let s = s.trim();
    if s.eq_ignore_ascii_case("RoCE v2") {
        GidKind::RoceV2
    } else if s.contains("RoCE v1") {
        GidKind::RoceV1
    } else if s == "IB" {
        GidKind::Ib
    } else {
        GidKind::Unknown
    }
}

fn gid_kind_from_sysfs(dev: &str, port: u8, index: u32) -> GidKind {
    let path = format!("/sys/class/infiniband/{dev}/ports/{port}/gid_attrs/types/{index}");
    std::fs::read_to_string(path).map_or(GidKind::Unknown, |s| parse_gid_type(&s))
}
