"""asyncio glue: awaiting transfers without Python on engine threads.

Each event loop gets one `_LoopWaker` (an eventfd watched with
`loop.add_reader`). An engine thread that completes a transfer only pushes
a token and writes the eventfd; the loop thread then resolves the asyncio
future registered under that token.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import TYPE_CHECKING

from ._native import _LoopWaker

if TYPE_CHECKING:
    from ._native import Engine, Transfer


class _Notifier:
    # Holds no reference to its loop (the loop is the weak key of
    # `_notifiers`): once the loop is gone, so are this and its eventfd.
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.waker = _LoopWaker()
        self.futures: dict[int, asyncio.Future[None]] = {}
        self.next = 0
        loop.add_reader(self.waker.fileno(), self._drain)

    def _drain(self) -> None:
        for token in self.waker.drain():
            fut = self.futures.pop(token, None)
            if fut is not None and not fut.done():
                fut.set_result(None)

    def future(self) -> tuple[int, asyncio.Future[None]]:
        self.next += 1
        fut = asyncio.get_running_loop().create_future()
        self.futures[self.next] = fut
        return self.next, fut


_notifiers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Notifier] = (
    weakref.WeakKeyDictionary()
)


def _notifier() -> _Notifier:
    loop = asyncio.get_running_loop()
    n = _notifiers.get(loop)
    if n is None:
        n = _Notifier(loop)
        _notifiers[loop] = n
    return n


async def wait(transfer: Transfer) -> None:
    """Awaits `transfer` (what `await transfer` runs)."""
    if not transfer.done():
        n = _notifier()
        while not transfer.done():
            token, fut = n.future()
            transfer._notify(n.waker, token)
            try:
                await fut
            except asyncio.CancelledError:
                # As asyncio cancels an awaited future: withdraw an
                # immediate expectation (writes cannot be called back).
                transfer.cancel()
                raise
            finally:
                n.futures.pop(token, None)
    transfer.wait(0)


async def recv(engine: Engine) -> bytes:
    """Awaits the next message of the receive pool (`Engine.recv_async`)."""
    n: _Notifier | None = None
    while True:
        msg = engine.try_recv()
        if msg is not None:
            return msg
        if n is None:
            n = _notifier()
        token, fut = n.future()
        engine._notify_recv(n.waker, token)
        try:
            await fut
        finally:
            n.futures.pop(token, None)
            # Woken: the signal dropped it already. Cancelled: withdraw it,
            # or every cancelled receive stays registered until a message.
            engine._forget_recv(n.waker, token)
