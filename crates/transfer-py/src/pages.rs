//! Page index lists from Python: any integer buffer (numpy arrays first of
//! all) is copied in one pass, without a Python object per page; plain
//! sequences of ints are accepted too.

use pyo3::buffer::{Element, PyUntypedBuffer};
use pyo3::prelude::*;

use crate::error::invalid;

const CALL: &str = "write_paged";

fn convert<T>(py: Python<'_>, buf: &PyUntypedBuffer, what: &str) -> Option<PyResult<Vec<u32>>>
where
    T: Element + Copy + TryInto<u32> + std::fmt::Display,
{
    let typed = buf.as_typed::<T>().ok()?;
    Some(typed.to_vec(py).and_then(|v| {
        v.into_iter()
            .map(|x| {
                x.try_into().map_err(|_| {
                    invalid(CALL, format!("{what}: page index {x} is outside 0..2**32"))
                })
            })
            .collect()
    }))
}

/// The page indices in `obj` (named `what` in errors).
pub(crate) fn indices(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<u32>> {
    let py = obj.py();
    let Ok(buf) = PyUntypedBuffer::get(obj) else {
        // Not a buffer: a list, tuple, range of ints.
        let v: Vec<i64> = obj.extract().map_err(|_| {
            invalid(
                CALL,
                format!(
                    "{what} must be a buffer of integers (numpy uint32 array) or a sequence of ints"
                ),
            )
        })?;
        return v
            .into_iter()
            .map(|x| {
                u32::try_from(x).map_err(|_| {
                    invalid(CALL, format!("{what}: page index {x} is outside 0..2**32"))
                })
            })
            .collect();
    };
    if buf.dimensions() > 1 {
        return Err(invalid(
            CALL,
            format!(
                "{what} must be one-dimensional, got {} dimensions",
                buf.dimensions()
            ),
        ));
    }
    // The first type the buffer's format matches; uint32 is a plain copy.
    let out = convert::<u32>(py, &buf, what)
        .or_else(|| convert::<i64>(py, &buf, what))
        .or_else(|| convert::<u64>(py, &buf, what))
        .or_else(|| convert::<i32>(py, &buf, what))
        .or_else(|| convert::<u16>(py, &buf, what))
        .or_else(|| convert::<i16>(py, &buf, what))
        .or_else(|| convert::<u8>(py, &buf, what))
        .or_else(|| convert::<i8>(py, &buf, what));
    let format = buf.format().to_string_lossy().into_owned();
    out.unwrap_or_else(|| {
        Err(invalid(
            CALL,
            format!("{what} must hold integers (numpy uint32 preferred), got format {format:?}"),
        ))
    })
}

/// `(src_offset, dst_offset, nbytes)` triples of `Engine.write_batch`: an
/// `(N, 3)` integer buffer (numpy; copied in one pass), a flat buffer of
/// `3 * N` integers, or a sequence of 3-tuples of ints.
pub(crate) fn triples(obj: &Bound<'_, PyAny>) -> PyResult<Vec<(u64, u64, u64)>> {
    const CALL: &str = "write_batch";
    let py = obj.py();
    let Ok(buf) = PyUntypedBuffer::get(obj) else {
        return obj.extract::<Vec<(u64, u64, u64)>>().map_err(|_| {
            invalid(
                CALL,
                "triples must be an (N, 3) integer array or a sequence of (src_offset, dst_offset, nbytes) tuples of non-negative ints",
            )
        });
    };
    let shape = buf.shape();
    let flat_ok = match shape {
        [n] => n % 3 == 0,
        [_, 3] => true,
        _ => false,
    };
    if !flat_ok || !buf.is_c_contiguous() {
        return Err(invalid(
            CALL,
            format!("triples must be a C-contiguous (N, 3) integer array, got shape {shape:?}"),
        ));
    }
    let wide = || -> Option<PyResult<Vec<u64>>> {
        if let Ok(t) = buf.as_typed::<u64>() {
            return Some(t.to_vec(py));
        }
        if let Ok(t) = buf.as_typed::<i64>() {
            return Some(t.to_vec(py).and_then(|v| {
                v.into_iter()
                    .map(|x| {
                        u64::try_from(x)
                            .map_err(|_| invalid(CALL, format!("triples: negative value {x}")))
                    })
                    .collect()
            }));
        }
        if let Ok(t) = buf.as_typed::<u32>() {
            return Some(t.to_vec(py).map(|v| v.into_iter().map(u64::from).collect()));
        }
        if let Ok(t) = buf.as_typed::<i32>() {
            return Some(t.to_vec(py).and_then(|v| {
                v.into_iter()
                    .map(|x| {
                        u64::try_from(x)
                            .map_err(|_| invalid(CALL, format!("triples: negative value {x}")))
                    })
                    .collect()
            }));
        }
        None
    };
    let format = buf.format().to_string_lossy().into_owned();
    let flat = wide().unwrap_or_else(|| {
        Err(invalid(
            CALL,
            format!("triples must hold 32- or 64-bit integers (numpy uint64 preferred), got format {format:?}"),
        ))
    })?;
    Ok(flat.chunks_exact(3).map(|c| (c[0], c[1], c[2])).collect())
}
