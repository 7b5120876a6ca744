"""Exception classes; the engine raises them with typed fields set."""

from __future__ import annotations


class TransferError(Exception):
    """An engine error.

    Attributes (set by the engine):
        kind: what went wrong, for branching: "timeout", "peer_unreachable",
            "invalid_argument", "malformed", "backend_mismatch", "shutdown",
            "region_busy", "region_unregistered", "backend",
            "library_missing", "remote_access", "cancelled", "other".
        call: the operation that failed (e.g. "write", "fi_writemsg").
        cause: for "peer_unreachable": "forgotten", "closed",
            "reconnecting" or "dead".
        code: for "backend": the provider's errno-style code.
    """

    kind: str = "other"
    call: str | None = None
    cause: str | None = None
    code: int | None = None


class TransferTimeout(TransferError, TimeoutError):
    """An operation or a wait did not complete in time (kind "timeout")."""


class PeerUnreachable(TransferError, ConnectionError):
    """The peer cannot be reached; `cause` says whether retrying may help."""


class InvalidArgument(TransferError, ValueError):
    """An argument, address or descriptor was refused before anything was sent."""


class EngineShutdown(TransferError):
    """The engine was closed before the operation completed."""
