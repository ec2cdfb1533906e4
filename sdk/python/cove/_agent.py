"""The guest agent's protocol (guest/init/AGENT.md) over a sandbox's vsock Unix socket: no
process spawned per call. Messages: a 4-byte big-endian length and one JSON object; exec and
attach then carry typed frames (a type byte, a 4-byte big-endian length, the payload)."""
from __future__ import annotations

import json
import signal
import socket
import struct
import threading
import time
from typing import Callable

from .errors import CoveError, Timeout

AGENT_PORT = 1024
MSG_MAX = 1 << 20
STDIN_CHUNK = 64 << 10

Output = Callable[[str, bytes], None]


class AgentError(CoveError):
    """The agent refused a request ({"ok":false,"error":...}) or the stream broke."""


class NotUp(Exception):
    """The sandbox's vsock socket is not there or did not answer the handshake: its VM does
    not run (stopped, archived, crashed, only in the store). Nothing was sent to the agent."""


class Conn:
    """One connection to the agent: one operation."""

    def __init__(self, uds: str, timeout: float | None = 30.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._handshake(uds, timeout)
        except (OSError, socket.timeout) as e:
            self.sock.close()
            raise NotUp(f"{uds}: {e}") from e

    def _handshake(self, uds: str, timeout: float | None) -> None:
        self.sock.settimeout(timeout)
        self.sock.connect(uds)
        self.sock.sendall(b"CONNECT %d\n" % AGENT_PORT)
        line = b""
        while not line.endswith(b"\n"):
            b = self.sock.recv(1)
            if not b:
                raise ConnectionResetError("the sandbox closed the vsock handshake")
            line += b
            if len(line) > 64:
                raise ConnectionResetError("a vsock handshake line over 64 bytes")
        if not line.startswith(b"OK "):
            raise ConnectionRefusedError(f"vsock handshake: {line.strip()!r}")

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "Conn":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _read(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            b = self.sock.recv(n - len(buf))
            if not b:
                raise AgentError("the agent closed the connection")
            buf += b
        return bytes(buf)

    def send(self, obj: dict) -> None:
        data = json.dumps(obj, separators=(",", ":")).encode()
        self.sock.sendall(struct.pack(">I", len(data)) + data)

    def recv(self) -> dict:
        (n,) = struct.unpack(">I", self._read(4))
        if n > MSG_MAX:
            raise AgentError(f"an agent message of {n} bytes, over {MSG_MAX}")
        try:
            obj = json.loads(self._read(n))
        except ValueError:
            raise AgentError("an agent message that is not JSON") from None
        if not isinstance(obj, dict):
            raise AgentError("an agent message that is not a JSON object")
        return obj

    def request(self, obj: dict) -> dict:
        self.send(obj)
        rep = self.recv()
        if rep.get("ok") is not True:
            raise AgentError(str(rep.get("error", "refused"))[:500])
        return rep

    def send_frame(self, kind: bytes, payload: bytes = b"") -> None:
        self.sock.sendall(kind + struct.pack(">I", len(payload)) + payload)

    def recv_frame(self) -> tuple[bytes, bytes]:
        head = self._read(5)
        (n,) = struct.unpack(">I", head[1:])
        if n > MSG_MAX:
            raise AgentError(f"an exec frame of {n} bytes, over {MSG_MAX}")
        return head[:1], self._read(n)


def _feed(conn: Conn, data: bytes) -> None:
    """stdin in frames, then its end; on a thread, so output keeps flowing meanwhile."""
    try:
        for i in range(0, len(data), STDIN_CHUNK):
            conn.send_frame(b"i", data[i:i + STDIN_CHUNK])
        conn.send_frame(b"c")
    except OSError:
        pass  # the command ended first: its exit frame says how


def frames(conn: Conn, on_output: Output | None, deadline: float | None,
           what: str) -> tuple[int, int, bytes, bytes]:
    """Reads typed frames to the exit frame: (exit_code, signal, stdout, stderr). Past the
    deadline the command's process group gets SIGKILL and Timeout is raised once it ended."""
    out, err = bytearray(), bytearray()
    killed = False
    while True:
        if deadline is not None and not killed:
            left = deadline - time.monotonic()
            if left <= 0:
                conn.send_frame(b"s", struct.pack(">I", signal.SIGKILL))
                killed = True
                conn.sock.settimeout(30)
            else:
                conn.sock.settimeout(left)
        try:
            kind, payload = conn.recv_frame()
        except socket.timeout:
            if killed:
                raise Timeout(f"{what}: killed at its timeout, and it did not end in 30 s",
                              bytes(out), bytes(err)) from None
            continue
        if kind == b"o":
            out += payload
            if on_output:
                on_output("stdout", payload)
        elif kind == b"e":
            err += payload
            if on_output:
                on_output("stderr", payload)
        elif kind == b"x":
            try:
                st = json.loads(payload)
                code, sig = int(st.get("exit_code", -1)), int(st.get("signal", 0))
            except (ValueError, TypeError, AttributeError):
                raise AgentError(f"{what}: an exit frame that is not "
                                 f'{{"exit_code":N,"signal":S}}: {payload[:80]!r}') from None
            if killed:
                raise Timeout(f"{what}: killed at its timeout", bytes(out), bytes(err))
            return code, sig, bytes(out), bytes(err)


def exec_request(argv: list[str], env: dict[str, str] | None, cwd: str | None,
                 user: str | None, stdin: bool, detach: bool) -> dict:
    """The agent's exec request (AGENT.md): no tty; env as KEY=VALUE entries."""
    req: dict = {"op": "exec", "argv": list(argv), "tty": False, "stdin": stdin}
    if detach:
        req["detach"] = True
    if env:
        req["env"] = [f"{k}={v}" for k, v in env.items()]
    if cwd:
        req["cwd"] = cwd
    if user:
        req["user"] = str(user)
    return req


def exec_cmd(uds: str, argv: list[str], env: dict[str, str] | None, cwd: str | None,
             user: str | None, stdin: bytes | None, timeout: float | None,
             on_output: Output | None) -> tuple[int, int, bytes, bytes]:
    deadline = None if timeout is None else time.monotonic() + timeout
    with Conn(uds) as conn:
        conn.request(exec_request(argv, env, cwd, user, stdin is not None, False))
        feeder = None
        if stdin is not None:
            feeder = threading.Thread(target=_feed, args=(conn, stdin), daemon=True)
            feeder.start()
        try:
            return frames(conn, on_output, deadline, " ".join(argv)[:80])
        finally:
            if feeder:
                feeder.join(timeout=5)


def exec_detached(uds: str, argv: list[str], env: dict[str, str] | None, cwd: str | None,
                  user: str | None) -> str:
    with Conn(uds) as conn:
        sid = conn.request(exec_request(argv, env, cwd, user, False, True)).get("session")
        if not isinstance(sid, str) or not sid:
            raise AgentError(f"a detached exec answered without a session id: {sid!r}")
        return sid


def attach(uds: str, session: str, timeout: float | None,
           on_output: Output | None) -> tuple[int, int, bytes, bytes]:
    deadline = None if timeout is None else time.monotonic() + timeout
    with Conn(uds) as conn:
        conn.request({"op": "attach", "session": session})
        return frames(conn, on_output, deadline, f"session {session}")


def put(uds: str, path: str, data: bytes, mode: int) -> None:
    with Conn(uds, timeout=300) as conn:
        conn.request({"op": "put", "path": path, "mode": mode, "size": len(data)})
        conn.sock.sendall(data)
        rep = conn.recv()
        if rep.get("ok") is not True:
            raise AgentError(str(rep.get("error", "refused"))[:500])


def get(uds: str, path: str) -> bytes:
    with Conn(uds, timeout=300) as conn:
        rep = conn.request({"op": "get", "path": path})
        size = rep.get("size")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0 or size > 1 << 30:
            raise AgentError(f"{path}: a size of {size} bytes")
        return conn._read(size)


def status(uds: str) -> dict:
    """{"op":"status"}: the agent's epoch and sessions (a cheap is-it-up call)."""
    with Conn(uds) as conn:
        return conn.request({"op": "status"})
