//! Whole sessions driven by untrusted bytes, for fuzzers (cargo fuzz
//! targets in `fuzz/`) and for the short pass CI runs as a test.
//!
//! The bytes are a program: allocate buffers, write them, run graphs, read
//! them back, free them, or send any raw frame. Graphs start from valid
//! templates of every op the compute allowlist serves (built the way
//! ggml's builders lay them out) and are then mutated field by field:
//! shapes, strides, types, op_params, sources, views, addresses. That is
//! where the validator's gaps are: a mutation that passes validation and
//! then aborts or faults inside ggml-cpu kills the fuzzer, which is the
//! finding. Everything goes through [`Session::handle_frame`], the same
//! path a socket's frames take, against whatever compute backend the
//! server was built with.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::protocol::graph::GraphPayload;
use crate::protocol::tensor::RpcTensor;
use crate::protocol::{Command, HelloRequest, Request, Response};
use crate::server::Shared;
use crate::server::session::Session;
use crate::validate::type_info;

/// Reads the program.
struct Bytes<'a> {
    data: &'a [u8],
    at: usize,
}

impl Bytes<'_> {
    fn u8(&mut self) -> Option<u8> {
        let b = *self.data.get(self.at)?;
        self.at += 1;
        Some(b)
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from(self.u8()?) | (u16::from(self.u8()?) << 8))
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from(self.u16()?) | (u32::from(self.u16()?) << 16))
    }
    fn take(&mut self, n: usize) -> &[u8] {
        let end = self.at.saturating_add(n).min(self.data.len());
        let s = self.data.get(self.at..end).unwrap_or_default();
        self.at = end;
        s
    }
}

const F32: u32 = 0;
const F16: u32 = 1;
const Q4_0: u32 = 2;
const I32: u32 = 26;
const I64: u32 = 27;
const COMPUTE: i32 = 16;

/// Ops the templates use (`ggml_op`).
mod op {
    pub const DUP: u32 = 1;
    pub const ADD: u32 = 2;
    pub const SUB: u32 = 6;
    pub const MUL: u32 = 7;
    pub const DIV: u32 = 8;
    pub const NORM: u32 = 24;
    pub const RMS_NORM: u32 = 25;
    pub const MUL_MAT: u32 = 29;
    pub const SCALE: u32 = 32;
    pub const CPY: u32 = 34;
    pub const CONT: u32 = 35;
    pub const RESHAPE: u32 = 36;
    pub const VIEW: u32 = 37;
    pub const PERMUTE: u32 = 38;
    pub const TRANSPOSE: u32 = 39;
    pub const GET_ROWS: u32 = 40;
    pub const SET_ROWS: u32 = 42;
    pub const SOFT_MAX: u32 = 46;
    pub const ROPE: u32 = 48;
    pub const FLASH_ATTN_EXT: u32 = 74;
    pub const UNARY: u32 = 91;
    pub const GLU: u32 = 100;
}

/// Lays out template tensors back to back in one buffer.
struct Layout {
    handle: u64,
    base: u64,
    size: u64,
    next: u64,
    tensors: Vec<RpcTensor>,
}

impl Layout {
    /// A contiguous tensor of `ty` and `ne`; `None` when the buffer is full.
    fn tensor(&mut self, ty: u32, ne: [u32; 4], op: u32, srcs: &[u64]) -> Option<u64> {
        let info = type_info(ty)?;
        let row = u64::from(ne[0]) / info.block_size * info.type_size;
        let nb1 = row;
        let nb2 = nb1 * u64::from(ne[1]);
        let nb3 = nb2 * u64::from(ne[2]);
        let bytes = nb3 * u64::from(ne[3]);
        let at = self.next;
        if at + bytes > self.size {
            return None;
        }
        self.next = (at + bytes).next_multiple_of(64);
        let id = self.tensors.len() as u64 + 1;
        let mut src = [0u64; 10];
        for (d, s) in src.iter_mut().zip(srcs) {
            *d = *s;
        }
        self.tensors.push(RpcTensor {
            id,
            ty,
            buffer: self.handle,
            ne,
            nb: [info.type_size as u32, nb1 as u32, nb2 as u32, nb3 as u32],
            op,
            flags: if op == 0 { 0 } else { COMPUTE },
            src,
            data: self.base + at,
            ..RpcTensor::default()
        });
        Some(id)
    }

    fn params(&mut self, id: u64, params: &[i32]) {
        if let Some(t) = self.tensors.get_mut(id as usize - 1) {
            for (d, s) in t.op_params.iter_mut().zip(params) {
                *d = *s;
            }
        }
    }

    /// A view node of `src` (same memory), with the given shape and strides.
    fn view(&mut self, src: u64, op: u32, ne: [u32; 4], nb: [u32; 4], offs: u64) -> Option<u64> {
        let s = self.tensors.get(src as usize - 1)?.clone();
        let id = self.tensors.len() as u64 + 1;
        let mut srcs = [0u64; 10];
        srcs[0] = src;
        self.tensors.push(RpcTensor {
            id,
            ty: s.ty,
            buffer: s.buffer,
            ne,
            nb,
            op,
            flags: COMPUTE,
            src: srcs,
            view_src: src,
            view_offs: offs,
            data: s.data + offs,
            ..RpcTensor::default()
        });
        Some(id)
    }
}

fn f(x: f32) -> i32 {
    x.to_bits() as i32
}

/// Builds template `which` (of [`TEMPLATES`]); returns the nodes.
fn template(l: &mut Layout, which: u8) -> Option<Vec<u64>> {
    let t = |l: &mut Layout, ty, ne| l.tensor(ty, ne, 0, &[]);
    Some(match which % TEMPLATES {
        0..=3 => {
            let ops = [op::ADD, op::SUB, op::MUL, op::DIV];
            let a = t(l, F32, [16, 4, 2, 1])?;
            let b = t(l, F32, [16, 1, 1, 1])?;
            vec![l.tensor(F32, [16, 4, 2, 1], ops[usize::from(which % 4)], &[a, b])?]
        }
        4 | 5 => {
            let a = t(l, F32, [64, 3, 2, 1])?;
            let o = if which == 4 { op::NORM } else { op::RMS_NORM };
            let n = l.tensor(F32, [64, 3, 2, 1], o, &[a])?;
            l.params(n, &[f(1e-5)]);
            vec![n]
        }
        6 => {
            let a = t(l, F32, [10, 10, 2, 1])?;
            let n = l.tensor(F32, [10, 10, 2, 1], op::SCALE, &[a])?;
            l.params(n, &[f(2.0), f(0.5)]);
            vec![n]
        }
        7 => {
            let a = t(l, F32, [32, 4, 2, 1])?;
            let n = l.tensor(F32, [32, 4, 2, 1], op::UNARY, &[a])?;
            l.params(n, &[10]); // SILU
            vec![n]
        }
        8 => {
            let a = t(l, F32, [64, 3, 2, 1])?;
            let n = l.tensor(F32, [32, 3, 2, 1], op::GLU, &[a])?;
            l.params(n, &[2, 0]); // SWIGLU, not swapped
            vec![n]
        }
        9 => {
            let a = t(l, F32, [32, 3, 2, 1])?;
            let b = t(l, F32, [32, 3, 2, 1])?;
            let n = l.tensor(F32, [32, 3, 2, 1], op::GLU, &[a, b])?;
            l.params(n, &[3, 0, f(1.702), f(7.0)]); // SWIGLU_OAI
            vec![n]
        }
        10 => {
            let a = t(l, F32, [64, 8, 1, 1])?;
            let b = t(l, F32, [64, 3, 1, 1])?;
            vec![l.tensor(F32, [8, 3, 1, 1], op::MUL_MAT, &[a, b])?]
        }
        11 => {
            let a = t(l, Q4_0, [64, 8, 1, 1])?;
            let b = t(l, F32, [64, 3, 1, 1])?;
            vec![l.tensor(F32, [8, 3, 1, 1], op::MUL_MAT, &[a, b])?]
        }
        12 => {
            let a = t(l, F32, [16, 5, 1, 1])?;
            let i = t(l, I32, [3, 1, 1, 1])?;
            vec![l.tensor(F32, [16, 3, 1, 1], op::GET_ROWS, &[a, i])?]
        }
        13 => {
            let dst = t(l, F16, [16, 5, 1, 1])?;
            let src = t(l, F32, [16, 2, 1, 1])?;
            let i = t(l, I64, [2, 1, 1, 1])?;
            let d = l.tensors.get(dst as usize - 1)?.clone();
            let n = l.view(dst, op::SET_ROWS, d.ne, d.nb, 0)?;
            if let Some(node) = l.tensors.last_mut() {
                // ggml_set_rows: a view of the destination, sources (rows, indices).
                node.src = [src, i, 0, 0, 0, 0, 0, 0, 0, 0];
            }
            vec![n]
        }
        14 => {
            let a = t(l, F32, [64, 2, 2, 1])?;
            let b = t(l, F16, [64, 2, 2, 1])?;
            let bt = l.tensors.get(b as usize - 1)?.clone();
            let n = l.view(b, op::CPY, bt.ne, bt.nb, 0)?;
            if let Some(node) = l.tensors.last_mut() {
                node.src = [a, b, 0, 0, 0, 0, 0, 0, 0, 0];
            }
            vec![n]
        }
        15 => {
            let a = t(l, F32, [8, 6, 2, 1])?;
            let at = l.tensors.get(a as usize - 1)?.clone();
            let tr = l.view(
                a,
                op::TRANSPOSE,
                [6, 8, 2, 1],
                [at.nb[1], at.nb[0], at.nb[2], at.nb[3]],
                0,
            )?;
            let c = l.tensor(F32, [6, 8, 2, 1], op::CONT, &[tr])?;
            vec![tr, c]
        }
        16 => {
            let a = t(l, F16, [8, 6, 2, 1])?;
            let at = l.tensors.get(a as usize - 1)?.clone();
            let p = l.view(
                a,
                op::PERMUTE,
                [8, 2, 6, 1],
                [at.nb[0], at.nb[2], at.nb[1], at.nb[3]],
                0,
            )?;
            l.params(p, &[0, 2, 1, 3]);
            let d = l.tensor(F16, [8, 2, 6, 1], op::DUP, &[p])?;
            vec![p, d]
        }
        17 => {
            let a = t(l, F32, [8, 6, 2, 1])?;
            let at = l.tensors.get(a as usize - 1)?.clone();
            let v = l.view(
                a,
                op::VIEW,
                [8, 3, 2, 1],
                [at.nb[0], at.nb[1] * 2, at.nb[2], at.nb[3]],
                0,
            )?;
            let r = l.view(a, op::RESHAPE, [48, 2, 1, 1], [4, 192, 384, 384], 0)?;
            let c = l.tensor(F32, [8, 3, 2, 1], op::CONT, &[v])?;
            let s = l.tensor(F32, [48, 2, 1, 1], op::SCALE, &[r])?;
            l.params(s, &[f(1.0), 0]);
            vec![v, c, r, s]
        }
        18 => {
            let a = t(l, F32, [32, 4, 3, 1])?;
            let pos = t(l, I32, [3, 1, 1, 1])?;
            let n = l.tensor(F32, [32, 4, 3, 1], op::ROPE, &[a, pos])?;
            // n_past, n_dims, mode, n_ctx, n_ctx_orig, freq_base,
            // freq_scale, ext_factor, attn_factor, beta_fast, beta_slow.
            l.params(
                n,
                &[
                    0,
                    32,
                    2,
                    0,
                    4096,
                    f(10000.0),
                    f(1.0),
                    f(0.0),
                    f(1.0),
                    f(32.0),
                    f(1.0),
                ],
            );
            vec![n]
        }
        19 => {
            let a = t(l, F32, [16, 4, 2, 1])?;
            let m = t(l, F16, [16, 4, 1, 1])?;
            let n = l.tensor(F32, [16, 4, 2, 1], op::SOFT_MAX, &[a, m])?;
            l.params(n, &[f(0.125), f(0.0)]);
            vec![n]
        }
        _ => {
            let q = t(l, F32, [64, 2, 4, 1])?;
            let k = t(l, F16, [64, 32, 4, 1])?;
            let v = t(l, F16, [64, 32, 4, 1])?;
            let m = t(l, F16, [32, 64, 1, 1])?;
            let n = l.tensor(F32, [64, 4, 2, 1], op::FLASH_ATTN_EXT, &[q, k, v, m])?;
            l.params(n, &[f(0.125), f(0.0), f(0.0), 0]);
            vec![n]
        }
    })
}

/// Number of graph templates.
const TEMPLATES: u8 = 21;

/// One mutation of a graph's tensor records.
fn mutate(tensors: &mut [RpcTensor], p: &mut Bytes<'_>) -> Option<()> {
    let n = tensors.len();
    if n == 0 {
        return Some(());
    }
    let which = usize::from(p.u8()?) % n;
    let field = p.u8()?;
    let value = p.u32()?;
    let ids: Vec<u64> = tensors.iter().map(|t| t.id).collect();
    let t = tensors.get_mut(which)?;
    let small = value % 9;
    match field % 12 {
        0 => t.ne[usize::from(field / 12) % 4] = if value & 1 == 0 { small } else { value },
        1 => {
            // Strides: small steps around the real ones, or anything.
            let i = usize::from(field / 12) % 4;
            t.nb[i] = match value % 4 {
                0 => t.nb[i].wrapping_add(small * 4),
                1 => t.nb[i].wrapping_sub(small * 4),
                2 => t.nb[(i + 1) % 4],
                _ => value,
            };
        }
        2 => t.op_params[usize::from(field / 12) % 16] = value as i32,
        3 => {
            // op_params as floats: negative, NaN, huge, tiny.
            let fl = [
                -1.0f32,
                f32::NAN,
                1e30,
                0.0,
                -0.0,
                f32::INFINITY,
                1e-30,
                3.0,
            ];
            t.op_params[usize::from(field / 12) % 16] = f(fl[(value % 8) as usize]);
        }
        4 => t.ty = value % 45,
        5 => {
            t.src[usize::from(field / 12) % 10] = ids
                .get(value as usize % (n + 1))
                .copied()
                .unwrap_or(value.into())
        }
        6 => t.view_offs = u64::from(value % 4096),
        7 => t.data = t.data.wrapping_add(u64::from(small) * 4).wrapping_sub(16),
        8 => t.op = value % 102,
        9 => t.flags = value as i32,
        10 => t.view_src = ids.get(value as usize % (n + 1)).copied().unwrap_or(0),
        _ => {
            t.buffer = if value & 1 == 0 {
                0
            } else {
                t.buffer ^ u64::from(value)
            }
        }
    }
    Some(())
}

/// Drives sessions against a server's shared state.
pub struct SessionFuzzer {
    shared: Arc<Shared>,
    next_id: AtomicU64,
}

impl SessionFuzzer {
    /// Fuzzes against `shared` (from [`crate::server::Server::shared`]; the
    /// server need not be running).
    pub fn new(shared: Arc<Shared>) -> Self {
        SessionFuzzer {
            shared,
            next_id: AtomicU64::new(1 << 40),
        }
    }

    /// Runs one program: a fresh session, its commands, its end. Refusals
    /// end the program (a real connection would close); nothing may crash.
    pub fn run(&self, data: &[u8]) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
        self.shared.admission.accepted(id, ip, None);
        let mut s = Session::new(id, ip, Arc::clone(&self.shared));
        let hello = Request::Hello(HelloRequest::default()).encode_payload();
        if s.handle_frame(Command::Hello, &hello).is_ok() {
            let _ = self.program(&mut s, &mut Bytes { data, at: 0 });
        }
        s.close();
        if !s.is_admitted() {
            self.shared.admission.pending_closed(id, ip);
        }
    }

    fn send(&self, s: &mut Session, req: &Request<'_>) -> Result<Option<Response>, ()> {
        s.handle_frame(req.command(), &req.encode_payload())
            .map_err(|_| ())
    }

    fn program(&self, s: &mut Session, p: &mut Bytes<'_>) -> Result<(), ()> {
        let mut buffers: Vec<(u64, u64, u64)> = Vec::new();
        let mut last: Vec<RpcTensor> = Vec::new();
        for _ in 0..64 {
            let Some(action) = p.u8() else {
                return Ok(());
            };
            match action % 8 {
                0 => {
                    let size = u64::from(p.u16().ok_or(())?) * 16 + 64;
                    if let Some(Response::AllocBuffer {
                        remote_ptr,
                        remote_size,
                    }) = self.send(s, &Request::AllocBuffer { device: 0, size })?
                    {
                        if remote_ptr != 0 {
                            let base = match self.send(s, &Request::BufferGetBase { remote_ptr })? {
                                Some(Response::U64(b)) => b,
                                _ => return Err(()),
                            };
                            buffers.push((remote_ptr, base, remote_size));
                        }
                    }
                }
                1 | 2 => {
                    // A template graph, mutated, over a buffer of its own.
                    let which = p.u8().ok_or(())?;
                    let size = 64 << 10;
                    let Some(Response::AllocBuffer { remote_ptr, .. }) =
                        self.send(s, &Request::AllocBuffer { device: 0, size })?
                    else {
                        return Err(());
                    };
                    let Some(Response::U64(base)) =
                        self.send(s, &Request::BufferGetBase { remote_ptr })?
                    else {
                        return Err(());
                    };
                    buffers.push((remote_ptr, base, size));
                    let mut l = Layout {
                        handle: remote_ptr,
                        base,
                        size,
                        next: 0,
                        tensors: Vec::new(),
                    };
                    let nodes = template(&mut l, which).ok_or(())?;
                    // Inputs: bytes from the program (indices mostly small).
                    let fill: Vec<u8> = p.take(256).to_vec();
                    if !fill.is_empty() {
                        let _ = self.send(
                            s,
                            &Request::BufferClear {
                                remote_ptr,
                                value: fill[0] % 3,
                            },
                        )?;
                    }
                    let mutations = if action % 8 == 1 {
                        0
                    } else {
                        p.u8().ok_or(())? % 4 + 1
                    };
                    for _ in 0..mutations {
                        mutate(&mut l.tensors, p).ok_or(())?;
                    }
                    last = l.tensors.clone();
                    let g = GraphPayload {
                        device: 0,
                        nodes,
                        tensors: l.tensors,
                    };
                    self.send(s, &Request::GraphCompute(Box::new(g)))?;
                }
                3 => {
                    self.send(s, &Request::GraphRecompute { device: 0 })?;
                }
                4 => {
                    // Write program bytes into a graph tensor or a buffer.
                    let pick = usize::from(p.u8().ok_or(())?);
                    let len = usize::from(p.u8().unwrap_or(0)) * 4;
                    let data = p.take(len).to_vec();
                    if let Some(t) = last.get(pick % last.len().max(1)) {
                        let _ = self.send(
                            s,
                            &Request::SetTensor {
                                tensor: Box::new(t.clone()),
                                cache_flag: 0,
                                offset: 0,
                                data: &data,
                            },
                        )?;
                    }
                }
                5 => {
                    let pick = usize::from(p.u8().ok_or(())?);
                    if let Some(t) = last.get(pick % last.len().max(1)) {
                        let size = u64::from(p.u16().ok_or(())?);
                        self.send(
                            s,
                            &Request::GetTensor {
                                tensor: Box::new(t.clone()),
                                offset: 0,
                                size,
                            },
                        )?;
                    }
                }
                6 => {
                    let pick = usize::from(p.u8().ok_or(())?);
                    if !buffers.is_empty() {
                        let (h, _, _) = buffers.remove(pick % buffers.len());
                        self.send(s, &Request::FreeBuffer { remote_ptr: h })?;
                    }
                }
                _ => {
                    // Any frame at all.
                    let cmd = p.u8().ok_or(())?;
                    let len = usize::from(p.u16().ok_or(())? % 2048);
                    let payload = p.take(len).to_vec();
                    let Ok(cmd) = Command::from_byte(cmd) else {
                        return Err(());
                    };
                    s.handle_frame(cmd, &payload).map_err(|_| ())?;
                }
            }
        }
        Ok(())
    }
}

/// Every template, unmutated, as programs (seeds for a corpus, and the
/// check that each template is valid and computes).
pub fn template_programs() -> Vec<Vec<u8>> {
    (0..TEMPLATES).map(|t| vec![1, t, 0, 0]).collect()
}
