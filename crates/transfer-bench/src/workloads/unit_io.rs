//! Writing and checking fill-pattern units in registered memory, in
//! chunks through a scratch buffer (untimed; no aliasing of memory the
//! engine may be writing).

use transfer_core::LocalRegion;

use crate::error::{BenchError, Result};
use crate::workloads::spec::{fill, first_mismatch};

/// Chunk of a unit written or checked at once.
const CHUNK: usize = 1 << 20;

/// Writes unit (`tag`, `it`) of `len` bytes at `offset`.
pub fn write_unit(
    region: &LocalRegion,
    offset: u64,
    len: u64,
    tag: u64,
    it: u64,
    scratch: &mut Vec<u8>,
) -> Result<()> {
    let mut done = 0usize;
    let len = len as usize;
    while done < len {
        let n = (len - done).min(CHUNK);
        scratch.resize(n, 0);
        fill(scratch, tag, it, done);
        region.write_at(offset as usize + done, scratch)?;
        done += n;
    }
    Ok(())
}

/// Checks every byte of unit (`tag`, `it`) of `len` bytes at `offset`,
/// read in chunks into `scratch`; a mismatch is a [`BenchError::Verify`].
pub fn check_unit(
    region: &LocalRegion,
    offset: u64,
    len: u64,
    tag: u64,
    it: u64,
    what: &str,
    scratch: &mut Vec<u8>,
) -> Result<()> {
    let mut done = 0usize;
    let len = len as usize;
    while done < len {
        let n = (len - done).min(CHUNK);
        scratch.resize(n, 0);
        region.read_at(offset as usize + done, scratch)?;
        if let Some((i, want, got)) = first_mismatch(scratch, tag, it, done) {
            return Err(BenchError::Verify {
                sweep: what.into(),
                detail: format!(
                    "unit tag {tag:#x} iteration {it}: byte {i} at region offset {} is {got:#04x}, expected {want:#04x}",
                    offset as usize + i
                ),
            });
        }
        done += n;
    }
    Ok(())
}
