"""The Python test library shared by the kvm, e2e, broker and bench tests: check/Failure, cove
on a test guest (Vm), HTTP over a Unix socket, the hybrid vsock CONNECT handshake, framed JSON.

Standard library only: it is also copied into the KVM box beside box_tests.py and the bench
*_in_box.py scripts (tests/e2e/run, bench/lib.sh), which import it from /work.
"""
import http.client
import json
import os
import re
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

SKIP = 77
COVE = os.environ.get("COVE", "build/cli/cove")
# Waits for a guest scale by this (tests/kvm/run sets it in the KVM box, where ring 0 of the
# guest runs under nested SVM in QEMU's software emulator, several times slower than a host's
# /dev/kvm). Only the waits that end in a failure grow; a test's own measurements do not.
TIMEOUT_SCALE = max(1.0, float(os.environ.get("COVE_TEST_TIMEOUT_SCALE", "1") or 1))
GUESTS = os.environ.get("GUESTS", "build/tests/guests")


def guest(name):
    return os.path.join(GUESTS, name)


def sanitized_build():
    """True when COVE is a sanitizer (ASan/UBSan) build: its cove-vmm links libasan. Such a
    build differs on purpose (sandbox/meson.build, COVE_SANITIZED): it is linked dynamically (so
    it maps shared libraries a static plain build does not) and runs without seccomp filters
    (LeakSanitizer needs ptrace and clone at exit). Tests say what they do not check then."""
    vmm = os.path.join(os.path.dirname(os.path.realpath(COVE)), "cove-vmm")
    try:
        with open(vmm, "rb") as f:
            data = f.read()
    except OSError:
        return False
    return b"libasan.so" in data or b"libubsan.so" in data


def require_kvm():
    """Exit 77 (meson: skipped) when this machine has no usable /dev/kvm."""
    if not os.path.exists("/dev/kvm"):
        print("SKIP: /dev/kvm is absent on this machine")
        sys.exit(SKIP)
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        print("SKIP: /dev/kvm exists but is not readable and writable by this user")
        sys.exit(SKIP)


class Failure(Exception):
    pass


class Skip(Exception):
    """A test that cannot run here (something it needs is absent); the message says what."""


def chain_file(d):
    """A chain directory's newest commit (snapshot/DIGEST.md): the highest generation file
    chain.NNNNNNNNNN.json, else chain.json (a VMM under its filter cannot replace chain.json)."""
    gens = sorted(f for f in os.listdir(d) if re.fullmatch(r"chain\.\d{10}\.json", f))
    return os.path.join(d, gens[-1] if gens else "chain.json")


def chain_json(d):
    with open(chain_file(d)) as f:
        return json.load(f)


def tree_digest(path):
    """snapshot/digest.h's "cove-sha256-tree": SHA-256 over the size and each 1 MiB chunk's
    SHA-256 (snapshot/DIGEST.md)."""
    import hashlib
    size = os.path.getsize(path)
    top = hashlib.sha256(b"cove-sha256-tree\0" + struct.pack("<QI", size, 1 << 20))
    with open(path, "rb") as f:
        while True:
            b = f.read(1 << 20)
            if not b:
                break
            top.update(hashlib.sha256(b).digest())
    return top.hexdigest()


def reseal_all(d):
    """What an attacker who can rewrite the chain file too would do: the newest commit records
    every file's digest as it is now, so a tampered file reaches the checks behind the digest
    (an encrypted chain's GCM tags, the state file's format checks)."""
    path = chain_file(d)
    with open(path) as f:
        c = json.load(f)
    if "sha256" not in c:
        return
    for name in c["sha256"]:
        if os.path.exists(os.path.join(d, name)):
            c["sha256"][name] = tree_digest(os.path.join(d, name))
    with open(path, "w") as f:
        json.dump(c, f)


def check(cond, msg):
    if not cond:
        raise Failure(msg)


class Tally:
    """Soft checks for scripts that go on after a failed check: each call prints ok/FAIL and
    remembers what failed; the script exits with status()."""

    def __init__(self):
        self.failures = []

    def __call__(self, cond, what):
        print(("ok   " if cond else "FAIL ") + what, flush=True)
        if not cond:
            self.failures.append(what)

    def status(self):
        return 1 if self.failures else 0


def run_cove(args, timeout=30, stdin=None):
    """Runs cove to completion; returns CompletedProcess with text output."""
    return subprocess.run([COVE] + args, capture_output=True, text=True,
                          timeout=timeout * TIMEOUT_SCALE,
                          stdin=stdin if stdin is not None else subprocess.DEVNULL)


class Vm:
    """A cove process running in the background, with its console on a pipe and an API socket."""

    def __init__(self, kernel, extra=(), api=True, mem=None, restore=None):
        """Runs `cove run --kernel kernel`, or `cove restore DIR` when restore=DIR."""
        self.tmp = tempfile.mkdtemp(prefix="cove-test-")
        self.sock = os.path.join(self.tmp, "api.sock") if api else None
        args = [COVE, "restore", restore] if restore else [COVE, "run", "--kernel", kernel]
        if self.sock:
            args += ["--api-sock", self.sock]
        if mem:
            args += ["--mem", mem]
        args += list(extra)
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
        self.out = b""
        if self.sock:
            self._wait_for(lambda: os.path.exists(self.sock), 10, "API socket to appear")

    def _wait_for(self, pred, timeout, what):
        end = time.monotonic() + timeout * TIMEOUT_SCALE
        while time.monotonic() < end:
            if pred():
                return
            if self.proc.poll() is not None:
                raise Failure(f"cove exited ({self.proc.returncode}) while waiting for {what}: "
                              f"{self.proc.stderr.read().decode(errors='replace')}")
            time.sleep(0.01)
        raise Failure(f"timed out waiting for {what}")

    def read_console(self, timeout):
        """Reads whatever console output arrives within `timeout` seconds."""
        end = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return
            r, _, _ = select.select([fd], [], [], left)
            if not r:
                return
            chunk = os.read(fd, 65536)
            if not chunk:
                return
            self.out += chunk

    def wait_output(self, text, timeout=20):
        end = time.monotonic() + timeout * TIMEOUT_SCALE
        needle = text.encode()
        while needle not in self.out:
            left = end - time.monotonic()
            if left <= 0:
                raise Failure(f"timed out waiting for {text!r}; console so far: {self.out[-400:]!r}")
            self.read_console(min(left, 0.2))
            if self.proc.poll() is not None and needle not in self.out:
                self.read_console(0.1)
                if needle not in self.out:
                    raise Failure(f"cove exited ({self.proc.returncode}) before {text!r}: "
                                  f"{self.proc.stderr.read().decode(errors='replace')}")

    def send_input(self, data):
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def request(self, method, path, body=None, headers=None, timeout=10):
        return http_json(self.sock, method, path, body, headers=headers,
                         timeout=timeout * TIMEOUT_SCALE)

    def snapshot(self, kind, timeout=120):
        """PUT /snapshot/create of `kind` (Full, Diff); the reply's body (200 or Failure)."""
        status, body = self.request("PUT", "/snapshot/create", {"snapshot_type": kind},
                                    timeout=timeout)
        check(status == 200, f"{kind} snapshot: {status} {body}")
        return body

    def pause_at_tick(self):
        """Pauses a counter guest; returns the last tick it printed (the next one comes after
        resume or restore)."""
        check(self.request("PATCH", "/vm", {"state": "Paused"})[0] == 204, "pause")
        self.read_console(0.3)
        return last_tick(self.out)

    def raw(self, data, timeout=5):
        """Sends raw bytes on a fresh connection; returns whatever comes back before close/timeout."""
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout)
        s.connect(self.sock)
        try:
            s.sendall(data)
            try:
                s.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            got = b""
            while True:
                try:
                    chunk = s.recv(65536)
                except socket.timeout:
                    break
                if not chunk:
                    break
                got += chunk
            return got
        finally:
            s.close()

    def alive(self):
        return self.proc.poll() is None

    def stop(self, sig=signal.SIGTERM, timeout=10):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout * TIMEOUT_SCALE)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.read_console(0.05)
        return self.proc.returncode

    def stderr(self):
        return self.proc.stderr.read().decode(errors="replace")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.tmp, ignore_errors=True)


def last_tick(console):
    """The number of the last "tick N" line a counter guest printed (None before the first)."""
    ticks = re.findall(rb"tick (\d+)\n", console)
    return int(ticks[-1]) if ticks else None


def wait_file_bytes(path, needle, timeout):
    """Polls a file (a clone's console) until it holds `needle` or `timeout` passes; returns
    what it held last."""
    end = time.monotonic() + timeout * TIMEOUT_SCALE
    out = b""
    while needle not in out and time.monotonic() < end:
        time.sleep(0.05)
        with open(path, "rb") as f:
            out = f.read()
    return out


# --- HTTP over a Unix socket (cove's API) ---------------------------------------------------

class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout=10):
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        s.connect(self.unix_path)
        self.sock = s


def http_json(sock, method, path, body=None, headers=None, timeout=10):
    """One HTTP request on the Unix socket `sock`; a body that is not bytes or str goes as
    JSON. Returns (status, decoded JSON reply or None)."""
    conn = UnixHTTPConnection(sock, timeout=timeout)
    try:
        hdrs = dict(headers or {})
        if body is not None and not isinstance(body, (bytes, str)):
            body = json.dumps(body)
            hdrs.setdefault("Content-Type", "application/json")
        conn.request(method, path, body=body, headers=hdrs)
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, (json.loads(data) if data else None)
    finally:
        conn.close()


# --- vsock through cove's hybrid Unix socket (Firecracker's protocol) ------------------------

def vsock_handshake(s, port):
    """Sends "CONNECT port" on a connected socket; returns the reply line (b"OK <n>" when the
    guest accepted, anything else or b"" when it did not)."""
    s.sendall(f"CONNECT {port}\n".encode())
    line = b""
    while not line.endswith(b"\n"):
        c = s.recv(1)
        if not c:
            break
        line += c
    return line


def vsock_connect(uds, port, deadline, proc=None, pause=0.2, timeout=30):
    """Connects to guest `port` through cove's socket `uds`, again every `pause` seconds until
    the guest accepts; returns (socket, OK line). Failure when monotonic time passes
    `deadline` or `proc` (cove) exits first."""
    while True:
        check(proc is None or proc.poll() is None, "cove exited before the guest listened")
        check(time.monotonic() < deadline, f"guest port {port} never accepted a connection")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout)
        try:
            s.connect(uds)
            line = vsock_handshake(s, port)
            if line.startswith(b"OK "):
                return s, line.decode().strip()
        except (FileNotFoundError, ConnectionRefusedError, ConnectionResetError, socket.timeout):
            pass
        s.close()
        time.sleep(pause)


# --- framed JSON (4-byte big-endian length, then JSON): cove-init's agent, cove-broker -------

def frame(obj):
    data = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    return struct.pack(">I", len(data)) + data


def recv_exact(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise EOFError(f"closed after {len(buf)} of {n} bytes")
        buf += chunk
    return buf


def recv_msg(s):
    (n,) = struct.unpack(">I", recv_exact(s, 4))
    return json.loads(recv_exact(s, n))


def connect_unix(path, timeout=30):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.connect(path)
    return s


def framed_call(path, obj, timeout=30):
    """One framed request and its reply on a fresh connection to the Unix socket `path`."""
    with connect_unix(path, timeout) as s:
        s.sendall(frame(obj))
        return recv_msg(s)


def open_fds(pid):
    """The targets of a live process's open descriptors. A descriptor closed between listing
    /proc/PID/fd and reading its link (a worker thread's short-lived fd) is left out."""
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            out.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except FileNotFoundError:
            pass
    return out


def smaps_rss(pid):
    """Returns (total Rss KiB, Rss KiB of the guest RAM mapping)."""
    total = guest_rss = 0
    in_guest = False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            parts = line.split()
            if not parts:
                continue
            if "-" in parts[0] and len(parts) >= 5 and ":" not in parts[0]:
                in_guest = "cove-guest-ram" in line
            elif parts[0] == "Rss:":
                kib = int(parts[1])
                total += kib
                if in_guest:
                    guest_rss += kib
    return total, guest_rss


def run_each(tests, prefix):
    """Runs each test(tmpdir) in a fresh temp dir (removed after), printing its time; a
    failure names the test."""
    for t in tests:
        tmp = tempfile.mkdtemp(prefix=prefix)
        try:
            t0 = time.monotonic()
            t(tmp)
            print(f"ok {t.__name__} ({time.monotonic() - t0:.1f}s)", flush=True)
        except Failure as e:
            raise Failure(f"{t.__name__}: {e}")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def main(test):
    """Runs test(); prints PASS/FAIL; exits 0/1 (77 when skipped inside)."""
    require_kvm()
    try:
        test()
    except Failure as e:
        print(f"FAIL: {e}")
        sys.exit(1)
    print("PASS")
    sys.exit(0)


def hosts_add(lines):
    """Names the KVM box resolves (cove-broker resolves on the host), e.g. "127.0.0.1 x.test":
    appended to /etc/hosts once. Only for the throwaway box."""
    with open("/etc/hosts", "a+") as f:
        f.seek(0)
        have = f.read()
        for line in lines:
            if line not in have:
                f.write(line + "\n")
