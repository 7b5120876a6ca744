//! Waking a blocked worker: an eventfd that submitters signal, polled
//! together with the NICs' wait descriptors.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// A non-blocking eventfd.
pub(crate) struct EventFd(OwnedFd);

impl EventFd {
    pub(crate) fn new() -> std::io::Result<Self> {
        // SAFETY: eventfd has no memory preconditions; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor this struct now owns.
        Ok(Self(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Makes the descriptor readable.
    pub(crate) fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to an eventfd; a full
        // counter (EAGAIN) already means "readable", so the result is moot.
        let _ = unsafe { libc::write(self.0.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Resets it.
    pub(crate) fn drain(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads at most 8 bytes into a live u64; EAGAIN when not signalled.
        let _ = unsafe { libc::read(self.0.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
    }

    pub(crate) fn raw(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// Blocks until one of `fds` is readable or `timeout` passes. Returns
/// whether any of `fds[from..]` became readable (a NIC's descriptor, when
/// `from` skips the submit eventfd).
pub(crate) fn wait_readable(fds: &[RawFd], timeout: Duration, from: usize) -> bool {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ms = i32::try_from(timeout.as_millis())
        .unwrap_or(i32::MAX)
        .max(1);
    // SAFETY: pfds is a live array of pollfd of the given length.
    let n = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, ms) };
    n > 0 && pfds.iter().skip(from).any(|p| p.revents != 0)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn readiness_counts_only_the_descriptors_from_the_given_index() {
        let (submit, nic) = (EventFd::new().unwrap(), EventFd::new().unwrap());
        let fds = [submit.raw(), nic.raw()];
        let short = Duration::from_millis(1);
        // Nothing readable: a timeout, no traffic.
        assert!(!wait_readable(&fds, short, 1));
        // Only the submit eventfd: woken, but not by a NIC.
        submit.signal();
        assert!(!wait_readable(&fds, short, 1));
        assert!(wait_readable(&fds, short, 0));
        submit.drain();
        // The NIC's descriptor: traffic.
        nic.signal();
        assert!(wait_readable(&fds, short, 1));
        nic.drain();
        assert!(!wait_readable(&fds, short, 0));
    }
}
