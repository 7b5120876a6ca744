//! What API threads hand to a worker: one [`Job`] per request, carrying
//! everything the worker needs (checked ranges, the source region already
//! marked in use, the notification).

use std::sync::Arc;

use crate::callbacks::CallbackQueue;
use crate::completion::Notify;
use crate::domain::Registration;
use crate::error::{Result, TransferError};
use crate::memory::MemorySpan;
use crate::oneshot;
use crate::peer::{Peer, RemoteTarget};
use crate::recv_pool::RecvPool;
use crate::region::RegionInner;
use crate::request::{Pages, Request, ScatterItem};

/// A memory span crossing to the worker thread.
pub(crate) struct SpanJob(pub(crate) MemorySpan);
// SAFETY: the span names memory that the caller keeps alive (see
// `TransferEngine::register_raw`); it is only handed to the NIC.
unsafe impl Send for SpanJob {}

pub(crate) struct WriteJob {
    pub(crate) src: Arc<RegionInner>,
    pub(crate) src_offset: u64,
    pub(crate) len: u64,
    pub(crate) dst: RemoteTarget,
    pub(crate) dst_offset: u64,
    pub(crate) imm: Option<u32>,
    pub(crate) notify: Notify,
}

pub(crate) struct PagedJob {
    pub(crate) src: Arc<RegionInner>,
    pub(crate) src_pages: Pages,
    pub(crate) dst: RemoteTarget,
    pub(crate) dst_pages: Pages,
    pub(crate) page_len: u64,
    pub(crate) imm: Option<u32>,
    pub(crate) notify: Notify,
}

pub(crate) struct ScatterJob {
    pub(crate) src: Arc<RegionInner>,
    pub(crate) items: Vec<ScatterItem>,
    pub(crate) imm: Option<u32>,
    pub(crate) notify: Notify,
}

pub(crate) struct BarrierJob {
    pub(crate) targets: Arc<[RemoteTarget]>,
    pub(crate) imm: u32,
    pub(crate) notify: Notify,
}

/// A request for a worker.
pub(crate) enum Job {
    Register {
        span: SpanJob,
        reply: oneshot::Sender<Result<Vec<Registration>>>,
    },
    Adopt(Arc<RegionInner>),
    Unregister {
        region: Arc<RegionInner>,
        reply: oneshot::Sender<Result<()>>,
    },
    Write(WriteJob),
    Paged(PagedJob),
    Scatter(ScatterJob),
    Barrier(BarrierJob),
    Send {
        peer: Peer,
        data: Vec<u8>,
        notify: Notify,
    },
    StartRecvPool {
        pool: Arc<RecvPool>,
        reply: oneshot::Sender<Result<()>>,
    },
    Repost(u64),
    ForgetPeer(u64),
}

impl Job {
    /// The job of an admitted request, and the domain group (worker) it goes
    /// to: the source region's, or set 0 for barriers and messages.
    pub(crate) fn for_request(request: Request<'_>, notify: Notify) -> (usize, Job) {
        match request {
            Request::Write(r) => (
                r.src.0.group,
                Job::Write(WriteJob {
                    src: r.src.0.clone(),
                    src_offset: r.src_offset,
                    len: r.len,
                    dst: r.dst.clone(),
                    dst_offset: r.dst_offset,
                    imm: r.imm,
                    notify,
                }),
            ),
            Request::Paged(r) => (
                r.src.0.group,
                Job::Paged(PagedJob {
                    src: r.src.0.clone(),
                    src_pages: r.src_pages,
                    dst: r.dst.clone(),
                    dst_pages: r.dst_pages,
                    page_len: r.page_len,
                    imm: r.imm,
                    notify,
                }),
            ),
            Request::Scatter(r) => (
                r.src.0.group,
                Job::Scatter(ScatterJob {
                    src: r.src.0.clone(),
                    items: r.items,
                    imm: r.imm,
                    notify,
                }),
            ),
            Request::Barrier(r) => (
                0,
                Job::Barrier(BarrierJob {
                    targets: r.targets,
                    imm: r.imm,
                    notify,
                }),
            ),
            Request::Send(r) => (
                0,
                Job::Send {
                    peer: r.peer.clone(),
                    data: r.data.to_vec(),
                    notify,
                },
            ),
        }
    }

    /// Fails the job's notification (used when the worker is gone).
    pub(crate) fn fail(self, err: TransferError, callbacks: &CallbackQueue) {
        let notify = match self {
            Job::Write(j) => j.notify,
            Job::Paged(j) => j.notify,
            Job::Scatter(j) => j.notify,
            Job::Barrier(j) => j.notify,
            Job::Send { notify, .. } => notify,
            Job::Register { reply, .. } => return reply.send(Err(err)),
            Job::Unregister { reply, .. } | Job::StartRecvPool { reply, .. } => {
                return reply.send(Err(err));
            }
            Job::Adopt(_) | Job::Repost(_) | Job::ForgetPeer(_) => return,
        };
        callbacks.notify(notify, Err(err));
    }
}
