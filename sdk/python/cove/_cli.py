"""Runs the cove command line: the one place the SDK spawns a process per call."""
from __future__ import annotations

import json
import os
import shutil
import subprocess

from .errors import BY_STATUS, CoveError, HeldElsewhere, Incompatible, KeyRefused, StartFailed


def cove_binary() -> str:
    """$COVE, else `cove` on PATH."""
    path = os.environ.get("COVE") or shutil.which("cove")
    if not path:
        raise CoveError("no cove binary: put cove on PATH or set COVE")
    return path


def error_for(status: int, stderr: str) -> CoveError:
    """The typed error for a cove exit status and its stderr (its last line is the reason)."""
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else f"cove exited {status}"
    cls = BY_STATUS.get(status, CoveError)
    if cls in (HeldElsewhere, Incompatible):
        try:
            detail = json.loads(last)
        except ValueError:
            detail = {}
        return cls(last, status, detail if isinstance(detail, dict) else {})
    if cls is StartFailed and "key" in last.lower() and "refused" in last.lower():
        return KeyRefused(last, status)
    return cls(last, status)


def run(*args: str, timeout: float | None = None, stdin: bytes | None = None) -> str:
    """Runs `cove ARGS...`; its stdout, or the typed error for its exit status."""
    p = subprocess.run([cove_binary(), *args], input=stdin, capture_output=True,
                       timeout=timeout)
    if p.returncode != 0:
        raise error_for(p.returncode, p.stderr.decode(errors="replace"))
    return p.stdout.decode(errors="replace")


def dirs() -> tuple[str, str]:
    """cove's state and runtime roots, as cove picks them."""
    state = os.environ.get("COVE_STATE_DIR") or "/var/lib/cove"
    run_dir = os.environ.get("COVE_RUN_DIR")
    if not run_dir:
        xdg = os.environ.get("XDG_RUNTIME_DIR")
        run_dir = os.path.join(xdg, "cove") if xdg else "/run/cove"
    return state, run_dir
