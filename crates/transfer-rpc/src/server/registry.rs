//! Server-side buffers behind opaque handles.
//!
//! Clients never see a host pointer: a handle is 64 bits from the operating
//! system's CSPRNG (unique among live buffers; one handle tells nothing
//! about any other, so a session cannot reach a buffer it was not given),
//! and each
//! buffer has a base in a virtual remote address space (4 KiB aligned, with
//! a guard gap between buffers). Tensor data addresses are checked against
//! that space, then turned into offsets into owned memory.
//!
//! Access policy: any session presenting a live handle may read and write
//! the buffer (a capability: the direct path writes a destination buffer
//! from the source server's connection); only the owning session may free
//! it, and a session's buffers are freed when it disconnects.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};

use super::host_memory::HostMemory;
use crate::error::{Result, RpcError};
use crate::validate::{BufferLookup, Region};

const PAGE: u64 = 4096;
/// Alignment of every buffer's host memory: a page (ggml needs 32 bytes,
/// AVX-512 64; NIC registrations like pages).
pub const HOST_ALIGN: usize = 4096;

const FIRST_BASE: u64 = 0x0000_1000_0000_0000;

/// One server-side allocation.
#[derive(Debug)]
pub struct Buffer {
    /// Opaque handle given to the client.
    pub handle: u64,
    /// Remote base address.
    pub base: u64,
    /// Size in bytes.
    pub size: u64,
    /// Device it was allocated for.
    pub device: u32,
    /// Session that owns it.
    pub owner: u64,
    /// Bytes charged against the quota: at least a page (see
    /// [`charge_of`]).
    charged: u64,
    /// The lock orders this server's own accesses (copies, compute); the
    /// memory itself is only ever touched through raw pointers.
    data: RwLock<HostMemory>,
}

impl Buffer {
    /// Start and length of the buffer's host memory, to register it with a
    /// NIC. The memory never moves or shrinks while this `Buffer` lives (it
    /// is allocated once and never resized), so the pointer stays valid for
    /// as long as the caller holds an `Arc` of it; writes through it race
    /// with this registry's own accesses unless the caller orders them.
    pub fn host_memory(&self) -> (*mut u8, usize) {
        let mem = self.data.read().unwrap_or_else(PoisonError::into_inner);
        (mem.as_ptr(), mem.len())
    }

    /// A descriptor of the buffer's memfd (for a compute worker to map).
    pub fn share_fd(&self) -> Option<std::os::fd::OwnedFd> {
        self.data
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .share_fd()
    }

    /// Its region in the remote address space.
    pub fn region(&self) -> Region {
        Region {
            handle: self.handle,
            base: self.base,
            size: self.size,
        }
    }
}

#[derive(Debug)]
struct Inner {
    buffers: HashMap<u64, Arc<Buffer>>,
    used: u64,
    next_base: u64,
    /// Live buffers per owning session.
    per_owner: HashMap<u64, usize>,
    /// Buffers removed (freed, or replaced under their handle) so far.
    removals: u64,
}

/// How many buffers may live at once. Every buffer holds a memfd (one
/// descriptor in the server, another in each compute worker that maps it),
/// two mappings and at least a page whatever its size, so the count is
/// bounded apart from the bytes: a session of zero-byte buffers once took
/// every descriptor of the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferLimits {
    /// Most live buffers one session may own.
    pub per_session: usize,
    /// Most live buffers in total.
    pub total: usize,
}

impl Default for BufferLimits {
    fn default() -> Self {
        BufferLimits {
            per_session: usize::MAX,
            total: usize::MAX,
        }
    }
}

/// All live buffers of a server, shared by its sessions.
#[derive(Debug)]
pub struct BufferRegistry {
    inner: Mutex<Inner>,
    quota: u64,
    limits: BufferLimits,
}

/// Bytes a buffer of `size` takes from the quota: its size, but never less
/// than a page (each buffer is its own memfd and mapping, so an empty one
/// still costs a page; charged nothing, they were free to hoard).
pub fn charge_of(size: u64) -> u64 {
    size.max(PAGE)
}

/// 64 bits from the operating system's CSPRNG; `None` if it cannot answer
/// (then nothing is allocated rather than handing out a guessable handle).
fn random_handle() -> Option<u64> {
    let mut b = [0u8; 8];
    getrandom::getrandom(&mut b).ok()?;
    Some(u64::from_le_bytes(b))
}

fn forget_owned(per_owner: &mut HashMap<u64, usize>, owner: u64, n: usize) {
    if let Some(c) = per_owner.get_mut(&owner) {
        *c = c.saturating_sub(n);
        if *c == 0 {
            per_owner.remove(&owner);
        }
    }
}

fn range(call: &'static str, buf: &Buffer, offset: u64, len: u64) -> Result<(usize, usize)> {
    let end = offset
        .checked_add(len)
        .filter(|&e| e <= buf.size)
        .ok_or_else(|| RpcError::refused(call, "range is outside the buffer"))?;
    let s = usize::try_from(offset).map_err(|_| RpcError::refused(call, "offset too large"))?;
    let e = usize::try_from(end).map_err(|_| RpcError::refused(call, "range too large"))?;
    Ok((s, e))
}

impl BufferRegistry {
    /// A registry that allocates at most `quota` bytes in total, with no
    /// bound on the number of buffers (a compute worker's mirror).
    pub fn new(quota: u64) -> Self {
        BufferRegistry::with_limits(quota, BufferLimits::default())
    }

    /// A registry of at most `quota` bytes and `limits` buffers.
    pub fn with_limits(quota: u64, limits: BufferLimits) -> Self {
        BufferRegistry {
            inner: Mutex::new(Inner {
                buffers: HashMap::new(),
                used: 0,
                next_base: FIRST_BASE,
                per_owner: HashMap::new(),
                removals: 0,
            }),
            quota,
            limits,
        }
    }

    /// The bounds on the number of buffers.
    pub fn limits(&self) -> BufferLimits {
        self.limits
    }

    /// Live buffers owned by `owner`.
    pub fn owned_by(&self, owner: u64) -> usize {
        self.lock().per_owner.get(&owner).copied().unwrap_or(0)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Total bytes this registry may allocate.
    pub fn quota(&self) -> u64 {
        self.quota
    }

    /// Bytes currently allocated.
    pub fn used(&self) -> u64 {
        self.lock().used
    }

    /// Number of live buffers.
    pub fn len(&self) -> usize {
        self.lock().buffers.len()
    }

    /// True when no buffer is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Allocates `size` zeroed bytes for `owner`; `None` when refused (see
    /// [`BufferRegistry::alloc_for`]).
    pub fn alloc(&self, owner: u64, device: u32, size: u64) -> Option<Arc<Buffer>> {
        self.alloc_for(owner, device, size).ok()
    }

    /// Why a buffer for `owner` cannot be had now, if it cannot.
    fn refusal(&self, inner: &Inner, owner: u64, charge: u64) -> Option<String> {
        let owned = inner.per_owner.get(&owner).copied().unwrap_or(0);
        if owned >= self.limits.per_session {
            return Some(format!(
                "the session owns {owned} buffers, the most one may (--max-buffers-per-session)"
            ));
        }
        if inner.buffers.len() >= self.limits.total {
            return Some(format!(
                "{} buffers are live, the most the server holds (--max-buffers)",
                inner.buffers.len()
            ));
        }
        if inner
            .used
            .checked_add(charge)
            .is_none_or(|u| u > self.quota)
        {
            return Some(format!(
                "{charge} bytes do not fit the quota ({} of {} bytes used)",
                inner.used, self.quota
            ));
        }
        None
    }

    /// Allocates `size` zeroed bytes for `owner`, charging
    /// [`charge_of`]`(size)` against the quota; the reason when over the
    /// quota or the buffer limits, or out of memory (never aborts).
    pub fn alloc_for(
        &self,
        owner: u64,
        device: u32,
        size: u64,
    ) -> std::result::Result<Arc<Buffer>, String> {
        let len = usize::try_from(size).map_err(|_| format!("{size} bytes"))?;
        let charge = charge_of(size);
        if let Some(why) = self.refusal(&self.lock(), owner, charge) {
            return Err(why);
        }
        let data = HostMemory::zeroed(len)
            .ok_or_else(|| format!("cannot map {size} bytes (memory or descriptors)"))?;
        let mut inner = self.lock();
        if let Some(why) = self.refusal(&inner, owner, charge) {
            return Err(why);
        }
        let span = size
            .max(1)
            .checked_next_multiple_of(PAGE)
            .and_then(|s| s.checked_add(PAGE))
            .ok_or("size")?;
        let base = inner.next_base;
        let next = base
            .checked_add(span)
            .ok_or("the remote address space is used up")?;
        let handle = loop {
            let h = random_handle().ok_or("no randomness from the OS")?;
            if h != 0 && !inner.buffers.contains_key(&h) {
                break h;
            }
        };
        let buf = Arc::new(Buffer {
            handle,
            base,
            size,
            device,
            owner,
            charged: charge,
            data: RwLock::new(data),
        });
        inner.next_base = next;
        inner.used = inner.used.saturating_add(charge);
        *inner.per_owner.entry(owner).or_insert(0) += 1;
        inner.buffers.insert(handle, Arc::clone(&buf));
        Ok(buf)
    }

    /// Adds a buffer whose memory is mapped from elsewhere (a compute
    /// worker mirrors the server's buffers with their handles and bases).
    /// Not counted against the quota.
    pub fn insert_mapped(&self, handle: u64, base: u64, size: u64, memory: HostMemory) {
        let buf = Arc::new(Buffer {
            handle,
            base,
            size,
            device: 0,
            owner: 0,
            charged: 0,
            data: RwLock::new(memory),
        });
        let mut inner = self.lock();
        if inner.buffers.insert(handle, buf).is_some() {
            inner.removals += 1;
        }
    }

    /// Drops a buffer added by [`BufferRegistry::insert_mapped`].
    pub fn remove_mapped(&self, handle: u64) -> bool {
        let mut inner = self.lock();
        let removed = inner.buffers.remove(&handle).is_some();
        inner.removals += u64::from(removed);
        removed
    }

    /// How many buffers were removed so far: while it is unchanged, every
    /// buffer that was live when a graph was validated still is, so the
    /// graph's placements still hold.
    pub fn removals(&self) -> u64 {
        self.lock().removals
    }

    /// The live buffer with this handle.
    pub fn get(&self, handle: u64) -> Option<Arc<Buffer>> {
        self.lock().buffers.get(&handle).cloned()
    }

    /// Frees a buffer; only its owner may.
    pub fn free(&self, owner: u64, handle: u64) -> Result<()> {
        let mut inner = self.lock();
        match inner.buffers.get(&handle) {
            None => Err(RpcError::refused(
                "FREE_BUFFER",
                format!("unknown handle {handle:#x}"),
            )),
            Some(b) if b.owner != owner => Err(RpcError::refused(
                "FREE_BUFFER",
                "buffer belongs to another session",
            )),
            Some(b) => {
                let charged = b.charged;
                inner.buffers.remove(&handle);
                inner.used = inner.used.saturating_sub(charged);
                forget_owned(&mut inner.per_owner, owner, 1);
                inner.removals += 1;
                Ok(())
            }
        }
    }

    /// Frees every buffer of `owner`; returns how many.
    pub fn free_all(&self, owner: u64) -> usize {
        let mut inner = self.lock();
        let before = inner.buffers.len();
        let mut freed = 0u64;
        inner.buffers.retain(|_, b| {
            let keep = b.owner != owner;
            if !keep {
                freed = freed.saturating_add(b.charged);
            }
            keep
        });
        inner.used = inner.used.saturating_sub(freed);
        let n = before - inner.buffers.len();
        forget_owned(&mut inner.per_owner, owner, n);
        inner.removals += n as u64;
        n
    }

    fn buffer(&self, call: &'static str, handle: u64) -> Result<Arc<Buffer>> {
        self.get(handle)
            .ok_or_else(|| RpcError::refused(call, format!("unknown handle {handle:#x}")))
    }

    /// Writes `data` at `offset` of a buffer.
    pub fn write(&self, call: &'static str, handle: u64, offset: u64, data: &[u8]) -> Result<()> {
        let buf = self.buffer(call, handle)?;
        let (s, e) = range(call, &buf, offset, data.len() as u64)?;
        let mem = buf.data.write().unwrap_or_else(PoisonError::into_inner);
        if mem.copy_in(s, data) && e - s == data.len() {
            Ok(())
        } else {
            Err(RpcError::refused(call, "range is outside the buffer"))
        }
    }

    /// Reads `len` bytes at `offset` of a buffer.
    pub fn read_range(
        &self,
        call: &'static str,
        handle: u64,
        offset: u64,
        len: u64,
    ) -> Result<Vec<u8>> {
        let buf = self.buffer(call, handle)?;
        let (s, e) = range(call, &buf, offset, len)?;
        let mut out = crate::io::zeroed(e - s)
            .ok_or_else(|| RpcError::refused(call, format!("cannot allocate {} bytes", e - s)))?;
        let mem = buf.data.read().unwrap_or_else(PoisonError::into_inner);
        if mem.copy_out(s, &mut out) {
            Ok(out)
        } else {
            Err(RpcError::refused(call, "range is outside the buffer"))
        }
    }

    /// Fills `len` bytes at `offset` of a buffer with `value`.
    pub fn fill(
        &self,
        call: &'static str,
        handle: u64,
        offset: u64,
        len: u64,
        value: u8,
    ) -> Result<()> {
        let buf = self.buffer(call, handle)?;
        let (s, e) = range(call, &buf, offset, len)?;
        let mem = buf.data.write().unwrap_or_else(PoisonError::into_inner);
        if mem.fill(s, e - s, value) {
            Ok(())
        } else {
            Err(RpcError::refused(call, "range is outside the buffer"))
        }
    }
}

/// Bytes held against a registry's quota besides its buffers (a retained
/// graph); given back on drop.
#[derive(Debug)]
pub struct Held {
    registry: std::sync::Weak<BufferRegistry>,
    bytes: u64,
}

impl Held {
    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(r) = self.registry.upgrade() {
            let mut inner = r.lock();
            inner.used = inner.used.saturating_sub(self.bytes);
        }
    }
}

impl BufferRegistry {
    /// Charges `bytes` of server memory that is not a buffer against the
    /// quota (GET_DEVICE_MEMORY shows it taken); `None` when it does not fit.
    pub fn hold(self: &Arc<Self>, bytes: u64) -> Option<Held> {
        let mut inner = self.lock();
        inner.used = inner.used.checked_add(bytes).filter(|&u| u <= self.quota)?;
        Some(Held {
            registry: Arc::downgrade(self),
            bytes,
        })
    }
}

/// Host memory of one write-locked buffer, as a compute backend sees it.
#[derive(Debug, Clone, Copy)]
pub struct LockedMemory {
    /// Start of the buffer's host memory ([`HOST_ALIGN`]-aligned).
    pub ptr: *mut u8,
    /// Its length in bytes.
    pub len: usize,
}

impl BufferRegistry {
    /// Write-locks the buffers `handles` (deduplicated, in handle order so
    /// that concurrent callers cannot deadlock) and runs `f` with their host
    /// memory. The pointers are valid, and no other session touches those
    /// buffers, until `f` returns.
    pub fn with_locked<R>(
        &self,
        call: &'static str,
        handles: &[u64],
        f: impl FnOnce(&HashMap<u64, LockedMemory>) -> R,
    ) -> Result<R> {
        let mut hs = handles.to_vec();
        hs.sort_unstable();
        hs.dedup();
        let bufs = hs
            .iter()
            .map(|&h| self.buffer(call, h))
            .collect::<Result<Vec<_>>>()?;
        let guards: Vec<_> = bufs
            .iter()
            .map(|b| b.data.write().unwrap_or_else(PoisonError::into_inner))
            .collect();
        let mut map = HashMap::with_capacity(bufs.len());
        for (b, g) in bufs.iter().zip(guards.iter()) {
            map.insert(
                b.handle,
                LockedMemory {
                    ptr: g.as_ptr(),
                    len: g.len(),
                },
            );
        }
        let out = f(&map);
        drop(guards);
        Ok(out)
    }
}

impl BufferLookup for BufferRegistry {
    fn region(&self, handle: u64) -> Option<Region> {
        self.get(handle).map(|b| b.region())
    }

    fn read(&self, handle: u64, offset: u64, len: u64) -> Option<Vec<u8>> {
        self.read_range("read", handle, offset, len).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_quota_owner_and_bounds() -> std::result::Result<(), Box<dyn std::error::Error>> {
        let r = BufferRegistry::new(10_000);
        let a = r.alloc(1, 0, 4000).ok_or("first allocation refused")?;
        let b = r.alloc(2, 0, 4000).ok_or("second allocation refused")?;
        // 2 x 4096 charged: 1808 bytes left, less than a page.
        assert!(r.alloc(1, 0, 0).is_none(), "an empty buffer costs a page");
        assert!(r.alloc(1, 0, 4000).is_none(), "quota");
        assert_ne!(a.handle, b.handle);
        assert!(b.base >= a.base + 4096 + 4096, "guard gap");
        assert!(r.free(2, a.handle).is_err(), "not the owner");
        r.write("t", a.handle, 3990, &[1; 10])?;
        assert!(r.write("t", a.handle, 3991, &[1; 10]).is_err());
        assert!(r.write("t", a.handle, u64::MAX, &[1]).is_err());
        assert_eq!(r.read_range("t", a.handle, 3995, 5)?, vec![1; 5]);
        assert_eq!(r.free_all(1), 1);
        assert_eq!(r.used(), 4096, "charged a page");
        r.free(2, b.handle)?;
        assert!(r.is_empty());
        assert!(r.alloc(1, 0, u64::MAX).is_none());
        Ok(())
    }

    #[test]
    fn buffers_are_counted_per_session_and_in_total() {
        let r = BufferRegistry::with_limits(
            1 << 30,
            BufferLimits {
                per_session: 3,
                total: 5,
            },
        );
        let mine: Vec<_> = (0..5).filter_map(|_| r.alloc(1, 0, 0)).collect();
        assert_eq!(mine.len(), 3, "per session");
        assert_eq!(r.used(), 3 * 4096);
        assert!(
            r.alloc_for(1, 0, 0)
                .is_err_and(|e| e.contains("per-session"))
        );
        assert_eq!(r.owned_by(1), 3);
        let theirs: Vec<_> = (0..5).filter_map(|_| r.alloc(2, 0, 0)).collect();
        assert_eq!(theirs.len(), 2, "in total");
        assert!(r.free(1, mine[0].handle).is_ok());
        assert_eq!(r.owned_by(1), 2);
        assert!(r.alloc(1, 0, 0).is_some(), "a freed slot is reusable");
        assert_eq!(r.free_all(1), 3);
        assert_eq!(r.owned_by(1), 0);
        assert_eq!(r.used(), 2 * 4096);
    }

    /// Inverse of the splitmix64 finaliser the registry once derived
    /// handles with (`splitmix64(counter ^ key)`).
    fn unsplitmix64(mut z: u64) -> u64 {
        fn unxorshift(x: u64, s: u32) -> u64 {
            let mut r = x;
            for _ in 0..(64 / s) {
                r = x ^ (r >> s);
            }
            r
        }
        fn inverse(a: u64) -> u64 {
            // Newton's iteration for the inverse of an odd number mod 2^64.
            let mut x = a;
            for _ in 0..6 {
                x = x.wrapping_mul(2u64.wrapping_sub(a.wrapping_mul(x)));
            }
            x
        }
        z = unxorshift(z, 31);
        z = z.wrapping_mul(inverse(0x94d0_49bb_1331_11eb));
        z = unxorshift(z, 27);
        z = z.wrapping_mul(inverse(0xbf58_476d_1ce4_e5b9));
        z = unxorshift(z, 30);
        z.wrapping_sub(0x9e37_79b9_7f4a_7c15)
    }

    fn splitmix64(mut z: u64) -> u64 {
        z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// The attack of issue 11: from one handle, recover the key and predict
    /// the next session's handle. With CSPRNG handles no such relation
    /// exists; with the old keyed counter this predicted every handle.
    #[test]
    fn one_handle_does_not_predict_another() -> std::result::Result<(), Box<dyn std::error::Error>>
    {
        assert_eq!(unsplitmix64(splitmix64(12345)), 12345);
        let r = BufferRegistry::new(1 << 20);
        let mine = r.alloc(1, 0, 16).ok_or("alloc")?;
        let theirs: Vec<u64> = (0..64)
            .map(|_| r.alloc(2, 0, 16).map(|b| b.handle).ok_or("alloc"))
            .collect::<std::result::Result<_, _>>()?;
        // Guess the key for every counter value the attacker might assume.
        let x = unsplitmix64(mine.handle);
        for counter in 1..=64u64 {
            let key = x ^ counter;
            for next in counter + 1..=counter + 64 {
                let guess = splitmix64(next ^ key);
                assert!(
                    !theirs.contains(&guess),
                    "handle {guess:#x} was predictable"
                );
            }
        }
        // No two handles share their high or low halves either (a counter
        // would leave one of them nearly constant).
        let mut hi: Vec<u32> = theirs.iter().map(|h| (h >> 32) as u32).collect();
        hi.sort_unstable();
        hi.dedup();
        assert!(hi.len() > 60);
        Ok(())
    }
}
