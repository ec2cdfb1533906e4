"""Sandbox: one named cove sandbox. Life-cycle calls run the cove command line; commands and
files go straight to the guest agent over the sandbox's vsock socket, which is several times
faster than a `cove exec` process per call (README: the calls-per-second figure)."""
from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
from dataclasses import dataclass
from typing import Iterator

from . import _agent, _cli
from .errors import CoveError, NotFound, StartFailed


@dataclass
class ExecResult:
    """What a command printed and how it ended (exit_code -1 when killed by `signal`)."""
    stdout: bytes
    stderr: bytes
    exit_code: int
    signal: int = 0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def text(self) -> str:
        return self.stdout.decode(errors="replace")


class Files:
    """A sandbox's files, through the agent (regular files up to 1 GiB, absolute paths)."""

    def __init__(self, sbx: "Sandbox") -> None:
        self._sbx = sbx

    def read(self, path: str) -> bytes:
        return self._sbx._agent(_agent.get, path)

    def write(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        if isinstance(data, str):
            data = data.encode()
        self._sbx._agent(_agent.put, path, data, mode)

    def list(self, path: str = "/") -> list[str]:
        r = self._sbx.exec(["ls", "-1A", path])
        if not r.ok:
            raise CoveError(f"list {path}: {r.stderr.decode(errors='replace').strip()}",
                            r.exit_code)
        return [n for n in r.stdout.decode(errors="replace").split("\n") if n]

    def remove(self, path: str) -> None:
        r = self._sbx.exec(["rm", "-rf", "--", path])
        if not r.ok:
            raise CoveError(f"remove {path}: {r.stderr.decode(errors='replace').strip()}",
                            r.exit_code)


class Sandbox:
    """A named sandbox. `Sandbox.create(...)` makes one, `Sandbox.connect(name)` reaches an
    existing one (reconnecting it, stopped or archived, on its first command)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.files = Files(self)

    def __repr__(self) -> str:
        return f"Sandbox({self.name!r})"

    # ---- making and finding sandboxes ----
    @classmethod
    def create(cls, name: str, *, template: str | None = None, image: str | None = None,
               mem: str | None = None, vcpus: int | None = None, policy: str | None = None,
               key: str | None = None, cold: bool = False,
               snapshot_every: str | None = None, rootfs: str | None = None) -> "Sandbox":
        """`cove create NAME`: from `template` (--from), an OCI `image` imported with
        `cove image import`, a `rootfs` ext4 image of the host's, or this host's default
        machine (its implicit template)."""
        args = ["create", name]
        for flag, val in (("--from", template), ("--image", image), ("--rootfs", rootfs),
                          ("--mem", mem),
                          ("--vcpus", vcpus), ("--policy", policy), ("--key", key),
                          ("--snapshot-every", snapshot_every)):
            if val is not None:
                args += [flag, str(val)]
        if cold:
            args.append("--cold")
        _cli.run(*args, timeout=900)
        return cls(name)

    @classmethod
    def connect(cls, name: str) -> "Sandbox":
        """An existing sandbox, brought up now (restored if stopped, unpacked if archived,
        pulled from the store if only the store has it). NotFound, Deleted, HeldElsewhere...
        when it cannot be."""
        _cli.run("start", name, timeout=900)
        return cls(name)

    @staticmethod
    def list() -> list[dict]:
        """`cove ls --json`: one dict per sandbox (name, state, ...)."""
        out = _cli.run("ls", "--json", timeout=60)
        try:
            doc = json.loads(out)
        except ValueError:
            doc = None
        sandboxes = doc.get("sandboxes") if isinstance(doc, dict) else None
        if not isinstance(sandboxes, list) or not all(isinstance(e, dict) for e in sandboxes):
            raise CoveError(f"cove ls --json printed no list of sandboxes: {out[:200]!r}")
        return sandboxes

    # ---- the agent, reconnecting the sandbox when it is not running ----
    def _uds(self) -> str:
        return os.path.join(_cli.dirs()[1], self.name, "vsock.sock")

    def _agent(self, fn, *args):
        try:
            return fn(self._uds(), *args)
        except _agent.NotUp:
            # Not running (stopped, archived, crashed, idle-stopped, only in the store): cove
            # start brings it up as `cove exec` would, or says why not with its exit status.
            # Nothing reached the agent, so nothing runs twice.
            _cli.run("start", self.name, timeout=900)
            try:
                return fn(self._uds(), *args)
            except _agent.NotUp as e:
                raise StartFailed(f"{self.name}: started, but its agent does not answer: {e}",
                                  67) from None

    def sessions(self) -> list[dict]:
        """The agent's exec sessions (id, pid, argv0, running, tty, attached)."""
        return list(self._agent(_agent.status).get("sessions", []))

    # ---- commands ----
    def exec(self, cmd: str | list[str], *, env: dict[str, str] | None = None,
             cwd: str | None = None, user: str | None = None,
             stdin: bytes | str | None = None, timeout: float | None = None,
             on_output=None) -> ExecResult:
        """Runs CMD (a list, or a string for `sh -c`) and waits: its output and exit code.
        `on_output(stream, bytes)` sees output as it comes ("stdout"/"stderr"). Past `timeout`
        seconds the command's process group is killed and Timeout raised; the sandbox goes on.
        """
        argv = ["sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        data = stdin.encode() if isinstance(stdin, str) else stdin
        code, sig, out, err = self._agent(_agent.exec_cmd, argv, env, cwd, user, data, timeout,
                                          on_output)
        return ExecResult(out, err, code, sig)

    def stream(self, cmd: str | list[str], **kw) -> Iterator[tuple[str, bytes]]:
        """Runs CMD and yields ("stdout"|"stderr", bytes) as it prints, then
        ("exit", b"N")."""
        import queue
        import threading
        q: "queue.Queue[tuple[str, bytes] | BaseException | None]" = queue.Queue()

        def run() -> None:
            try:
                r = self.exec(cmd, on_output=lambda s, b: q.put((s, b)), **kw)
                q.put(("exit", str(r.exit_code).encode()))
                q.put(None)
            except BaseException as e:  # noqa: BLE001 - handed to the consumer
                q.put(e)
        threading.Thread(target=run, daemon=True).start()
        while True:
            item = q.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def exec_detached(self, cmd: str | list[str], *, env: dict[str, str] | None = None,
                      cwd: str | None = None, user: str | None = None) -> str:
        """Starts CMD and returns its session id at once; `attach(session)` later."""
        argv = ["sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        return self._agent(_agent.exec_detached, argv, env, cwd, user)

    def attach(self, session: str, *, timeout: float | None = None,
               on_output=None) -> ExecResult:
        """Waits for a detached command: what it printed since it started, and its exit."""
        code, sig, out, err = self._agent(_agent.attach, session, timeout, on_output)
        return ExecResult(out, err, code, sig)

    # ---- ports ----
    @contextlib.contextmanager
    def forward(self, port: int, host_port: int = 0) -> Iterator[int]:
        """`with sbx.forward(8000) as p:` 127.0.0.1:p on the host reaches port 8000 in the
        sandbox until the block ends."""
        self._agent(_agent.status)  # up first: a stopped one is restored now
        p = subprocess.Popen([_cli.cove_binary(), "forward", self.name,
                              f"{host_port}:{port}"], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
        try:
            # "cove forward: 127.0.0.1:P -> guest port N" on stderr once it listens.
            line = p.stderr.readline() if p.stderr else ""
            m = re.search(r"127\.0\.0\.1:(\d+) ->", line)
            if not m:
                p.wait(timeout=10)
                raise _cli.error_for(p.returncode or 1, line)
            yield int(m.group(1))
        finally:
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    # ---- life ----
    def stop(self) -> None:
        _cli.run("stop", self.name, timeout=900)

    def pause(self) -> None:
        _cli.run("pause", self.name, timeout=120)

    def resume(self) -> None:
        _cli.run("resume", self.name, timeout=900)

    def archive(self) -> None:
        _cli.run("archive", self.name, timeout=900)

    def fork(self, *names: str, stopped: bool = False) -> list["Sandbox"]:
        """New sandboxes cloned from this one as it is now (1..16 names)."""
        args = ["fork", self.name, *names, "--json"] + (["--stopped"] if stopped else [])
        _cli.run(*args, timeout=900)
        return [Sandbox(n) for n in names]

    def rm(self) -> None:
        _cli.run("rm", self.name, timeout=300)

    def state(self) -> str:
        """running, paused, stopped, archived, crashed, remote... as `cove ls` says."""
        for e in Sandbox.list():
            if e.get("name") == self.name:
                return str(e.get("state"))
        raise NotFound(f"no sandbox {self.name}", 65)

