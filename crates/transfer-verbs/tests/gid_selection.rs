//! Port and GID selection policy, link speed and configuration overrides.

use transfer_verbs::VerbsConfig;
use transfer_verbs::config::{ENV_DEVICE, ENV_GID_INDEX, ENV_PORT};
use transfer_verbs::devinfo::{
    GidEntry, GidKind, LinkLayer, PortInfo, link_speed_bps, mtu_bytes, parse_gid_type, select_gid,
    select_port,
};

fn gid(index: u32, kind: GidKind, bytes: [u8; 16]) -> GidEntry {
    GidEntry {
        index,
        gid: bytes,
        kind,
    }
}

const LINK_LOCAL: [u8; 16] = [
    0xfe, 0x80, 0, 0, 0, 0, 0, 0, 2, 0x11, 0x22, 0xff, 0xfe, 0x33, 0x44, 0x55,
];
const V4: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1];
const V6: [u8; 16] = [0x20, 0x01, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];

/// A ConnectX-7 RoCE port as `show_gids` lists it.
fn cx7() -> Vec<GidEntry> {
    vec![
        gid(0, GidKind::RoceV1, LINK_LOCAL),
        gid(1, GidKind::RoceV2, LINK_LOCAL),
        gid(2, GidKind::RoceV1, V4),
        gid(3, GidKind::RoceV2, V4),
        gid(4, GidKind::RoceV1, V6),
        gid(5, GidKind::RoceV2, V6),
    ]
}

#[test]
fn roce_prefers_v2_ipv4_mapped() {
    assert_eq!(
        select_gid(LinkLayer::Ethernet, &cx7(), None).unwrap(),
        Some(3)
    );
}

#[test]
fn roce_falls_back_in_order() {
    let mut g = cx7();
    g.retain(|e| e.index != 3);
    assert_eq!(select_gid(LinkLayer::Ethernet, &g, None).unwrap(), Some(5));
    g.retain(|e| e.index != 5);
    assert_eq!(select_gid(LinkLayer::Ethernet, &g, None).unwrap(), Some(1));
    g.retain(|e| e.index != 1);
    assert_eq!(select_gid(LinkLayer::Ethernet, &g, None).unwrap(), Some(2));
}

#[test]
fn rxe_with_untyped_gids_picks_ipv4_mapped() {
    // soft-RoCE on a dummy netdev: index 0 link-local, 1 IPv4-mapped; types unknown.
    let g = vec![
        gid(0, GidKind::Unknown, LINK_LOCAL),
        gid(1, GidKind::Unknown, V4),
    ];
    assert_eq!(select_gid(LinkLayer::Ethernet, &g, None).unwrap(), Some(1));
}

#[test]
fn override_must_name_a_populated_entry() {
    assert_eq!(
        select_gid(LinkLayer::Ethernet, &cx7(), Some(0)).unwrap(),
        Some(0)
    );
    assert!(select_gid(LinkLayer::Ethernet, &cx7(), Some(9)).is_err());
    assert!(
        select_gid(
            LinkLayer::Ethernet,
            &[gid(0, GidKind::RoceV2, [0; 16])],
            Some(0)
        )
        .is_err()
    );
}

#[test]
fn roce_without_gids_is_an_error_infiniband_uses_lid() {
    assert!(select_gid(LinkLayer::Ethernet, &[], None).is_err());
    let ib = vec![gid(
        0,
        GidKind::Ib,
        [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8],
    )];
    assert_eq!(select_gid(LinkLayer::InfiniBand, &ib, None).unwrap(), None);
    assert_eq!(
        select_gid(LinkLayer::InfiniBand, &ib, Some(0)).unwrap(),
        Some(0)
    );
}

fn port(n: u8, active: bool) -> PortInfo {
    PortInfo {
        port: n,
        active,
        link_layer: LinkLayer::Ethernet,
        lid: 0,
        active_mtu: 5,
        max_msg_sz: 1 << 30,
        speed_bps: 0,
        gids: vec![],
    }
}

#[test]
fn port_selection() {
    let ports = vec![port(1, false), port(2, true)];
    assert_eq!(select_port(&ports, None).unwrap().port, 2);
    assert_eq!(select_port(&ports, Some(1)).unwrap().port, 1);
    assert!(select_port(&ports, Some(3)).is_err());
    assert_eq!(select_port(&[port(1, false)], None).unwrap().port, 1);
    assert!(select_port(&[], None).is_err());
}

#[test]
fn speeds_and_mtus() {
    // ConnectX-7 400G: 4x NDR.
    assert_eq!(link_speed_bps(2, 128), 400_000_000_000);
    // 200G HDR 4x.
    assert_eq!(link_speed_bps(2, 64), 200_000_000_000);
    assert_eq!(link_speed_bps(1, 1), 2_500_000_000);
    assert_eq!(link_speed_bps(0, 0), 0);
    assert_eq!(mtu_bytes(5), 4096);
    assert_eq!(mtu_bytes(3), 1024);
    assert_eq!(mtu_bytes(0), 0);
}

#[test]
fn sysfs_gid_types() {
    assert_eq!(parse_gid_type("RoCE v2\n"), GidKind::RoceV2);
    assert_eq!(parse_gid_type("IB/RoCE v1\n"), GidKind::RoceV1);
    assert_eq!(parse_gid_type("IB"), GidKind::Ib);
    assert_eq!(parse_gid_type("?"), GidKind::Unknown);
}

#[test]
fn environment_overrides() {
    let mut c = VerbsConfig::default();
    c.apply_env(|k| match k {
        k if k == ENV_DEVICE => Some("mlx5_3".into()),
        k if k == ENV_PORT => Some("2".into()),
        k if k == ENV_GID_INDEX => Some(" 3 ".into()),
        _ => None,
    });
    assert_eq!(c.device.as_deref(), Some("mlx5_3"));
    assert_eq!(c.port, Some(2));
    assert_eq!(c.gid_index, Some(3));
    let mut d = VerbsConfig::default();
    d.apply_env(|k| (k == ENV_PORT).then(|| "x".into()));
    assert_eq!(d.port, None, "unparsable values are ignored");
    let b = VerbsConfig::default()
        .device("rxe0")
        .port(1)
        .gid_index(1)
        .chain_len(0);
    assert_eq!(
        (b.device.as_deref(), b.port, b.gid_index, b.chain_len),
        (Some("rxe0"), Some(1), Some(1), 1)
    );
}
