"""Type stubs of the native half of `transfer` (import from `transfer`)."""

from collections.abc import Generator, Iterable, Sequence
from typing import Any, Literal, Protocol, final

from typing_extensions import Buffer

class _ArrayLike(Protocol):
    """numpy arrays (whose stubs declare the buffer protocol on 3.12+ only)."""

    @property
    def __array_interface__(self) -> dict[str, Any]: ...

_Bytes = bytes | bytearray | memoryview | Buffer | _ArrayLike
_Pages = Buffer | _ArrayLike | Sequence[int]
_RawMemory = tuple[int, int, str | None]

class _DLPack(Protocol):
    """Objects exporting DLPack (torch tensors, numpy >= 1.22, ...)."""

    def __dlpack__(self) -> Any: ...

@final
class Transfer:
    """One operation in flight: a write, send, barrier or immediate expectation."""

    def done(self) -> bool:
        """Whether it finished (successfully or not); drives one progress
        pass of a caller-driven engine."""
    def wait(self, timeout: float | None = None) -> None:
        """Blocks (GIL released) until done; raises its error, or
        TransferTimeout after `timeout` seconds (the operation goes on)."""
    def exception(self) -> BaseException | None:
        """The error it failed with; None while running or after success."""
    def cancel(self) -> bool:
        """Withdraws an unmet immediate expectation (True); False otherwise."""
    @property
    def cancellable(self) -> bool:
        """Whether this is an immediate expectation (`Engine.expect_imm`)."""
    def __await__(self) -> Generator[Any, None, None]: ...
    def _notify(self, waker: _LoopWaker, token: int) -> None: ...

@final
class Region:
    """Registered memory; keeps the registered object alive."""

    @property
    def descriptor(self) -> bytes:
        """What a peer passes to `Peer.remote` to write here."""
    @property
    def nbytes(self) -> int: ...
    @property
    def ptr(self) -> int: ...
    @property
    def obj(self) -> Any | None:
        """The registered object (or the owner of a raw region)."""
    @property
    def registered(self) -> bool: ...
    def unregister(self) -> None:
        """Unregisters; raises TransferError(kind="region_busy") while
        transfers reading from it are in flight."""
    def __len__(self) -> int: ...
    def __enter__(self) -> Region: ...
    def __exit__(self, *args: object) -> None: ...

@final
class Peer:
    """A peer engine (from `Engine.connect`)."""

    @property
    def address(self) -> bytes: ...
    def remote(self, descriptor: _Bytes) -> RemoteRegion:
        """The peer's region described by `descriptor` (its `Region.descriptor`)."""
    def forget(self) -> None:
        """Drops connection state, so a restarted peer is reached afresh."""

@final
class RemoteRegion:
    """A peer's region: the destination of writes."""

    @property
    def nbytes(self) -> int: ...
    @property
    def peer(self) -> Peer: ...
    @property
    def descriptor(self) -> bytes: ...
    def __len__(self) -> int: ...

@final
class Engine:
    """A TransferEngine over libfabric. Thread-safe; blocking calls release the GIL."""

    def __init__(
        self,
        backend: Literal["auto", "libfabric", "verbs", "ibverbs"] = "auto",
        provider: str | None = None,
        nics: int | None = None,
        *,
        bind: str | None = None,
        peer_timeout: float | None = None,
        busy_poll: bool = False,
        progress: Literal["thread", "caller"] = "thread",
    ) -> None: ...
    @property
    def progress_mode(self) -> Literal["thread", "caller"]: ...
    def progress(self) -> bool:
        """One progress pass of a caller-driven engine (GIL released);
        whether anything happened. False with worker threads."""
    @property
    def address(self) -> bytes:
        """This engine's address, for peers' `Engine.connect`."""
    @property
    def provider(self) -> str: ...
    @property
    def backend(self) -> str: ...
    @property
    def nics(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    def connect(self, address: _Bytes) -> Peer: ...
    def register(self, obj: Buffer | _ArrayLike | _DLPack | _RawMemory, *, owner: object | None = None) -> Region:
        """Registers a writable C-contiguous buffer (numpy, bytearray,
        memoryview), a host-memory `__dlpack__` exporter (torch CPU tensor),
        or `(ptr, nbytes, "cpu")` memory the caller keeps valid."""
    def write(
        self,
        src: Region,
        dst: RemoteRegion,
        *,
        src_offset: int = 0,
        dst_offset: int = 0,
        nbytes: int | None = None,
        imm: int | None = None,
    ) -> Transfer: ...
    def write_paged(
        self,
        src: Region,
        src_pages: _Pages,
        dst: RemoteRegion,
        dst_pages: _Pages,
        page_len: int,
        *,
        src_stride: int | None = None,
        dst_stride: int | None = None,
        src_offset: int = 0,
        dst_offset: int = 0,
        imm: int | None = None,
    ) -> Transfer: ...
    def scatter(
        self,
        src: Region,
        items: Iterable[tuple[RemoteRegion, int, int, int]],
        *,
        imm: int | None = None,
    ) -> Transfer:
        """Items are (dst, src_offset, dst_offset, nbytes)."""
    def write_batch(
        self,
        src: Region | Sequence[Region] | Buffer | _ArrayLike | _DLPack,
        dst: RemoteRegion,
        triples: Buffer | _ArrayLike | Sequence[tuple[int, int, int]] | Sequence[Any],
        *,
        imm: int | None = None,
    ) -> Transfer:
        """Many writes, one call, one completion: rows of (src_offset,
        dst_offset, nbytes) as an (N, 3) integer array; with a sequence of
        regions, one row list per region. An unregistered buffer or
        `__dlpack__` exporter (torch CPU tensor) is registered for this
        call, zero-copy, and kept until the Transfer is dropped."""
    def barrier(self, targets: RemoteRegion | Iterable[RemoteRegion], imm: int) -> Transfer: ...
    def send(self, peer: Peer, data: _Bytes) -> Transfer: ...
    def start_recv_pool(self, count: int = 64, size: int = 65536, *, backlog: int = 65536) -> None: ...
    def recv(self, timeout: float | None = None) -> bytes: ...
    def try_recv(self) -> bytes | None: ...
    def recv_async(self) -> Any:
        """An awaitable of the next message (`await engine.recv_async()`)."""
    @property
    def recv_dropped(self) -> int: ...
    def expect_imm(self, imm: int, count: int = 1) -> Transfer: ...
    def wait_imm(self, imm: int, count: int = 1, timeout: float | None = None) -> None: ...
    def imm_value(self, imm: int) -> int: ...
    def take_imm(self, imm: int, count: int) -> int: ...
    @property
    def imm_dropped(self) -> int: ...
    def expected_imms(
        self,
        sender: Peer | _Bytes,
        *,
        nbytes: int | None = None,
        pages: int | None = None,
        page_len: int | None = None,
        barrier: bool = False,
        sender_group: int = 0,
        my_group: int = 0,
    ) -> int: ...
    def close(self) -> None: ...
    def __enter__(self) -> Engine: ...
    def __exit__(self, *args: object) -> None: ...
    def _notify_recv(self, waker: _LoopWaker, token: int) -> None: ...
    def _forget_recv(self, waker: _LoopWaker, token: int) -> None: ...
    def _recv_notifiers(self) -> int: ...

@final
class _LoopWaker:
    def __init__(self) -> None: ...
    def fileno(self) -> int: ...
    def drain(self) -> list[int]: ...
