//! Same-host wake-up for the `shm` provider.
//!
//! libfabric's shm provider moves a write only while the *target's*
//! endpoint makes progress, and its CQ offers no wait descriptor, so an
//! idle engine used to park on a timer (up to 1 ms) and an 8 B write to it
//! took ~1.1 ms (issue 20). Busy polling fixes the latency but burns a
//! core per idle engine. Instead every shm domain of this crate has a
//! doorbell next to its shm endpoint, named after it (so the peer finds it
//! from the address it already resolves, no extra handshake):
//!
//! - `/dev/shm/<name>:trx-bell`: a unix datagram socket; its receiving end
//!   is the domain's [`transfer_core::Domain::wait_fd`], so the sleeping
//!   worker blocks on it like on any NIC's wait descriptor;
//! - `/dev/shm/<name>:trx-idle`: one page holding a sleep counter, odd
//!   while the owner may block. Peers map it read-only.
//!
//! A sender rings (one 1-byte datagram) only when it has work posted to a
//! peer whose counter is odd and it has not rung for that sleep yet: the
//! hot path between awake engines is one load from a shared page.
//! The owner makes the counter odd, then polls its CQ once more before
//! blocking; a sender posts, then reads the counter (both with SeqCst
//! fences), so either the owner's last poll sees the write or the sender
//! sees the owner asleep.
//!
//! Security: both files are created exclusively (`O_EXCL`, a bind that
//! fails on an existing path) with mode 0600 in the sticky `/dev/shm`, and
//! a peer opens them only after checking they are a socket / a regular file
//! of at least a page, owned by this user, not a link. Another local user
//! can at most cause spurious wake-ups (and only where the socket's mode
//! lets them send); the page holds nothing but the counter, and the socket
//! queue is bounded by the kernel (a full queue already means "readable").

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering, fence};

use transfer_core::{Result, TransferError};

/// Where the doorbell files live (the shm provider's own files are there).
const DIR: &str = "/dev/shm";
const BELL: &str = ":trx-bell";
const IDLE: &str = ":trx-idle";
/// Size of the counter's file (one page: nothing else in it).
const IDLE_LEN: usize = 4096;

/// Whether `name` is an shm endpoint name this crate gives
/// (`trx<pid>-<8 hex>-<n>`, see `LibfabricDomain::open`): only those have
/// doorbells, and only those are ever turned into paths.
pub(crate) fn is_our_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("trx") else {
        return false;
    };
    let parts: Vec<&str> = rest.split('-').collect();
    let [pid, salt, n] = parts.as_slice() else {
        return false;
    };
    let digits = |s: &str, max: usize| {
        !s.is_empty() && s.len() <= max && s.bytes().all(|b| b.is_ascii_digit())
    };
    digits(pid, 10)
        && salt.len() == 8
        && salt.bytes().all(|b| b.is_ascii_hexdigit())
        && digits(n, 20)
}

/// The endpoint name inside a raw shm address (`fi_shm://<name>:<i>:<j>`,
/// the provider's indices optional, NUL-terminated), when it is one of ours.
pub(crate) fn name_of_raw(raw: &[u8]) -> Option<&str> {
    let s = std::str::from_utf8(raw.strip_suffix(&[0])?).ok()?;
    let s = s.strip_prefix("fi_shm://").unwrap_or(s);
    let (name, indices) = s.split_once(':').unwrap_or((s, ""));
    let indices_ok = indices.is_empty()
        || indices
            .split(':')
            .all(|i| !i.is_empty() && i.len() <= 10 && i.bytes().all(|b| b.is_ascii_digit()));
    (indices_ok && is_our_name(name)).then_some(name)
}

fn path(name: &str, suffix: &str) -> String {
    format!("{DIR}/{name}{suffix}")
}

fn cpath(p: &str) -> std::io::Result<CString> {
    CString::new(p).map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))
}

fn last_error() -> std::io::Error {
    std::io::Error::last_os_error()
}

/// A shared mapping of the counter page, unmapped on drop.
struct Page {
    ptr: *mut libc::c_void,
}

impl Page {
    /// Maps the first page of `fd` (checked to be at least that long).
    fn map(fd: &OwnedFd, write: bool) -> std::io::Result<Self> {
        let prot = if write {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: maps IDLE_LEN bytes of a file checked (or made) to be that
        // long; the result is checked and owned by the returned value.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                IDLE_LEN,
                prot,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(last_error());
        }
        Ok(Self { ptr })
    }

    fn counter(&self) -> &AtomicU32 {
        // SAFETY: the page is mapped for the lifetime of `self`, page
        // aligned (so aligned for u32), and only ever accessed atomically.
        // A read-only mapping is only loaded from.
        unsafe { &*(self.ptr as *const AtomicU32) }
    }
}

impl Drop for Page {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `map`; no reference
        // from `counter` outlives `self`.
        unsafe { libc::munmap(self.ptr, IDLE_LEN) };
    }
}

/// Opens `p` with `flags` (plus O_CLOEXEC | O_NOFOLLOW).
fn open(p: &str, flags: i32, mode: libc::mode_t) -> std::io::Result<OwnedFd> {
    let c = cpath(p)?;
    // SAFETY: `c` is a NUL-terminated path; the result is checked.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            flags | libc::O_CLOEXEC | libc::O_NOFOLLOW,
            libc::c_uint::from(mode),
        )
    };
    if fd < 0 {
        return Err(last_error());
    }
    // SAFETY: a fresh descriptor, owned from here on.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn datagram_socket() -> std::io::Result<OwnedFd> {
    // SAFETY: no memory preconditions; the result is checked.
    let fd = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(last_error());
    }
    // SAFETY: a fresh descriptor, owned from here on.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn sockaddr(p: &str) -> std::io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: sockaddr_un is plain data; all zeroes is a valid value.
    let mut sa: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    sa.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = p.as_bytes();
    if bytes.len() >= sa.sun_path.len() {
        return Err(std::io::Error::from(std::io::ErrorKind::InvalidInput));
    }
    for (d, s) in sa.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1;
    Ok((sa, len as libc::socklen_t))
}

fn stat_of(fd: &OwnedFd) -> std::io::Result<libc::stat> {
    // SAFETY: stat is plain data; fstat fills it for a live descriptor.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a live, writable stat.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(last_error());
    }
    Ok(st)
}

fn lstat_of(p: &str) -> std::io::Result<libc::stat> {
    let c = cpath(p)?;
    // SAFETY: stat is plain data.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is NUL-terminated, `st` live and writable.
    if unsafe { libc::lstat(c.as_ptr(), &mut st) } != 0 {
        return Err(last_error());
    }
    Ok(st)
}

fn is_mine(st: &libc::stat, kind: libc::mode_t) -> bool {
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    st.st_mode & libc::S_IFMT == kind && st.st_uid == me
}

/// This domain's doorbell: the socket it blocks on and its sleep counter.
pub(crate) struct Doorbell {
    sock: OwnedFd,
    page: Page,
    paths: [String; 2],
}

impl Doorbell {
    /// Creates the doorbell of shm endpoint `name`. Fails when the files
    /// exist already (never reuses what someone else made).
    pub(crate) fn create(name: &str) -> std::io::Result<Self> {
        if !is_our_name(name) {
            return Err(std::io::Error::from(std::io::ErrorKind::InvalidInput));
        }
        let (bell, idle) = (path(name, BELL), path(name, IDLE));
        let file = open(&idle, libc::O_RDWR | libc::O_CREAT | libc::O_EXCL, 0o600)?;
        let made = Self::finish(&file, &bell);
        if made.is_err() {
            let _ = std::fs::remove_file(&idle);
        }
        let (sock, page) = made?;
        Ok(Self {
            sock,
            page,
            paths: [bell, idle],
        })
    }

    fn finish(file: &OwnedFd, bell: &str) -> std::io::Result<(OwnedFd, Page)> {
        // SAFETY: a live descriptor of a fresh regular file.
        if unsafe { libc::ftruncate(file.as_raw_fd(), IDLE_LEN as libc::off_t) } != 0 {
            return Err(last_error());
        }
        let page = Page::map(file, true)?;
        let sock = datagram_socket()?;
        let (sa, len) = sockaddr(bell)?;
        // SAFETY: `sa` is a valid sockaddr_un of `len` bytes. bind fails
        // with EADDRINUSE when the path exists: nothing is reused.
        if unsafe {
            libc::bind(
                sock.as_raw_fd(),
                (&sa as *const libc::sockaddr_un).cast(),
                len,
            )
        } != 0
        {
            return Err(last_error());
        }
        let c = cpath(bell)?;
        // SAFETY: `c` is NUL-terminated. Only this user may ring.
        if unsafe { libc::chmod(c.as_ptr(), 0o600) } != 0 {
            let e = last_error();
            let _ = std::fs::remove_file(bell);
            return Err(e);
        }
        Ok((sock, page))
    }

    /// The descriptor that becomes readable when a peer rings.
    pub(crate) fn fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    /// Tells peers this domain may block from now on. The fence orders the
    /// counter before the CQ poll that follows (the other half is in
    /// [`PeerBell::ring_if_asleep`]).
    pub(crate) fn going_to_sleep(&self) {
        let c = self.page.counter();
        let v = c.load(Ordering::Relaxed);
        if v & 1 == 0 {
            c.store(v.wrapping_add(1), Ordering::SeqCst);
        }
        fence(Ordering::SeqCst);
    }

    /// Tells peers this domain is polling again (no ring needed).
    pub(crate) fn awake(&self) {
        let c = self.page.counter();
        let v = c.load(Ordering::Relaxed);
        if v & 1 == 1 {
            c.store(v.wrapping_add(1), Ordering::Release);
        }
    }

    /// Empties the socket; returns whether anyone rang since the last call.
    pub(crate) fn drain(&self) -> bool {
        let mut rang = false;
        let mut buf = [0u8; 64];
        // Bounded: the kernel's queue is; the cap guards against a peer
        // ringing as fast as this loop reads.
        for _ in 0..256 {
            // SAFETY: reads into a live buffer of its length.
            let n = unsafe {
                libc::recv(
                    self.sock.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n < 0 {
                break;
            }
            rang = true;
        }
        rang
    }
}

impl Drop for Doorbell {
    fn drop(&mut self) {
        for p in &self.paths {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// A peer's doorbell, as a sender sees it.
pub(crate) struct PeerBell {
    sock: OwnedFd,
    page: Page,
    /// The peer's counter value this side last rang for.
    rung: u32,
}

impl PeerBell {
    /// Opens the doorbell of the peer whose shm endpoint is `name` (one of
    /// ours, see [`is_our_name`]). `Ok(None)`: it has none (an older
    /// build, or a peer that is gone): it is reached without wake-ups, as
    /// before. Files that exist but are not what this crate makes, or are
    /// another user's, are refused.
    pub(crate) fn open(name: &str) -> Result<Option<Self>> {
        const CALL: &str = "resolve_peer (shm doorbell)";
        if !is_our_name(name) {
            return Err(TransferError::malformed(CALL, "not an shm endpoint name"));
        }
        let refuse = |what: &str| {
            TransferError::malformed(
                CALL,
                format!("{what} of peer {name} is not this user's doorbell"),
            )
        };
        let (bell, idle) = (path(name, BELL), path(name, IDLE));
        let st = match lstat_of(&bell) {
            Ok(st) => st,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(TransferError::malformed(CALL, e.to_string())),
        };
        if !is_mine(&st, libc::S_IFSOCK) {
            return Err(refuse("the bell"));
        }
        let file = match open(&idle, libc::O_RDONLY | libc::O_NONBLOCK, 0) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(TransferError::malformed(CALL, e.to_string())),
        };
        let st = stat_of(&file).map_err(|e| TransferError::malformed(CALL, e.to_string()))?;
        if !is_mine(&st, libc::S_IFREG) || (st.st_size as u64) < IDLE_LEN as u64 {
            return Err(refuse("the sleep counter"));
        }
        let page =
            Page::map(&file, false).map_err(|e| TransferError::malformed(CALL, e.to_string()))?;
        let sock = datagram_socket().map_err(|e| TransferError::malformed(CALL, e.to_string()))?;
        let (sa, len) =
            sockaddr(&bell).map_err(|e| TransferError::malformed(CALL, e.to_string()))?;
        // SAFETY: `sa` is a valid sockaddr_un of `len` bytes.
        if unsafe {
            libc::connect(
                sock.as_raw_fd(),
                (&sa as *const libc::sockaddr_un).cast(),
                len,
            )
        } != 0
        {
            // Nobody bound there any more (the peer is gone): no doorbell.
            return Ok(None);
        }
        Ok(Some(Self {
            sock,
            page,
            rung: 0,
        }))
    }

    /// Rings when the peer may be blocked and this side has not rung for
    /// that sleep yet. Called after posting work to the peer.
    pub(crate) fn ring_if_asleep(&mut self) {
        fence(Ordering::SeqCst);
        let v = self.page.counter().load(Ordering::SeqCst);
        if v & 1 == 0 || v == self.rung {
            return;
        }
        self.rung = v;
        let one = [1u8];
        // SAFETY: sends one byte from a live buffer on a connected socket.
        // A full queue (EAGAIN) already wakes the peer; a peer that is gone
        // (ECONNREFUSED) is noticed by the provider. MSG_NOSIGNAL: never
        // SIGPIPE.
        let _ = unsafe {
            libc::send(
                self.sock.as_raw_fd(),
                one.as_ptr().cast(),
                1,
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn fresh_name() -> String {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        format!("trx{}-0badbe11-{}", std::process::id(), 1_000_000 + n)
    }

    #[test]
    fn names_are_checked() {
        assert!(is_our_name("trx12-0123abcd-0"));
        for bad in [
            "trx12-0123abcd",
            "trx-0123abcd-0",
            "trx12-0123abc-0",
            "trx12-0123abcg-0",
            "trx12-0123abcd-0-1",
            "trx12-0123abcd-../x",
            "x12-0123abcd-0",
            "",
        ] {
            assert!(!is_our_name(bad), "{bad}");
        }
        assert_eq!(
            name_of_raw(b"fi_shm://trx1-0000000a-2\0"),
            Some("trx1-0000000a-2")
        );
        assert_eq!(name_of_raw(b"trx1-0000000a-2\0"), Some("trx1-0000000a-2"));
        assert_eq!(
            name_of_raw(b"fi_shm://trx1-0000000a-2:0:0\0"),
            Some("trx1-0000000a-2")
        );
        assert_eq!(name_of_raw(b"fi_shm://trx1-0000000a-2:0:x\0"), None);
        assert_eq!(name_of_raw(b"fi_shm://trx1-0000000a-2::\0"), None);
        assert_eq!(name_of_raw(b"fi_shm://trx1-0000000a-2:0/../x\0"), None);
        assert_eq!(name_of_raw(b"fi_shm://trx1-0000000a-2"), None);
        assert_eq!(name_of_raw(b"fi_shm://other\0"), None);
    }

    #[test]
    fn a_ring_wakes_only_a_sleeper_and_once_per_sleep() {
        let name = fresh_name();
        let own = Doorbell::create(&name).unwrap();
        let mut peer = PeerBell::open(&name).unwrap().unwrap();
        // Awake: no ring.
        peer.ring_if_asleep();
        assert!(!own.drain());
        own.going_to_sleep();
        peer.ring_if_asleep();
        peer.ring_if_asleep();
        assert!(own.drain());
        assert!(!own.drain(), "one ring per sleep");
        own.awake();
        peer.ring_if_asleep();
        assert!(!own.drain());
        own.going_to_sleep();
        peer.ring_if_asleep();
        assert!(own.drain(), "a new sleep is rung again");
        // Never created twice.
        assert!(Doorbell::create(&name).is_err());
        drop(own);
        assert!(PeerBell::open(&name).unwrap().is_none());
    }

    #[test]
    fn files_that_are_not_a_doorbell_are_refused() {
        let name = fresh_name();
        // A regular file where the bell socket should be.
        std::fs::write(path(&name, BELL), b"x").unwrap();
        assert!(PeerBell::open(&name).is_err());
        std::fs::remove_file(path(&name, BELL)).unwrap();
        // A short counter file next to a real socket.
        let name = fresh_name();
        let own = Doorbell::create(&name).unwrap();
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(path(&name, IDLE))
            .unwrap();
        f.set_len(16).unwrap();
        assert!(PeerBell::open(&name).is_err());
        // A symlink is not followed.
        let name2 = fresh_name();
        std::os::unix::fs::symlink(path(&name, BELL), path(&name2, BELL)).unwrap();
        assert!(PeerBell::open(&name2).is_err());
        std::fs::remove_file(path(&name2, BELL)).unwrap();
        drop(own);
        assert!(PeerBell::open("../etc/passwd").is_err());
    }
}
