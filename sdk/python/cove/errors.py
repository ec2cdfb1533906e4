"""Typed errors, each carrying the exit status cove gave (docs/CLI.md lists them)."""
from __future__ import annotations


class CoveError(Exception):
    """A cove command failed. `status` is its exit status, `message` its one-line reason."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


class InvalidName(CoveError):
    """Exit 64: not a valid sandbox name ([a-z0-9][a-z0-9-]{0,47})."""


class NotFound(CoveError):
    """Exit 65: no such sandbox on this host (nor in the store, when one is configured)."""


class Deleted(CoveError):
    """Exit 66: the sandbox was removed (`cove rm`); its tombstone says when."""


class StartFailed(CoveError):
    """Exit 67: the sandbox exists but could not be started."""


class KeyRefused(StartFailed):
    """Exit 67 because the key provider refused to unwrap the sandbox's data key."""


class AlreadyExists(CoveError):
    """Exit 68: a sandbox a create or fork would make exists already."""


class BadPolicy(CoveError):
    """Exit 69: the broker policy file was refused."""


class HeldElsewhere(CoveError):
    """Exit 75: another host holds the sandbox's lease (or this host's lease is in doubt).
    `detail` is cove's JSON line: error, sandbox, host, expires_ms, epoch."""

    def __init__(self, message: str, status: int | None = None,
                 detail: dict | None = None) -> None:
        super().__init__(message, status)
        self.detail = detail or {}


class Incompatible(CoveError):
    """Exit 76: this host cannot offer a CPU feature the sandbox's guest saw. `detail` is
    cove's JSON line: error ("cpu-incompatible"), sandbox, detail (the features, by name)."""

    def __init__(self, message: str, status: int | None = None,
                 detail: dict | None = None) -> None:
        super().__init__(message, status)
        self.detail = detail or {}


class Timeout(CoveError):
    """A command ran past its timeout: it was killed, the sandbox keeps running. `stdout` and
    `stderr` hold what it printed before."""

    def __init__(self, message: str, stdout: bytes = b"", stderr: bytes = b"") -> None:
        super().__init__(message, None)
        self.stdout = stdout
        self.stderr = stderr


BY_STATUS: dict[int, type[CoveError]] = {
    64: InvalidName, 65: NotFound, 66: Deleted, 67: StartFailed, 68: AlreadyExists,
    69: BadPolicy, 75: HeldElsewhere, 76: Incompatible,
}
