#!/usr/bin/env python3
"""e2e: cove-init's guest agent (cove exec/attach/cp/forward/ps, identity events) and, with
cove-broker, cove-fetch's credential requests from the guest. Runs in the KVM box beside
box_tests.py (which imports TESTS from here); `python3 agent_tests.py --local` runs the same
checks on a development machine against `cove-init agent --unix PATH` (no VM: no clock or RNG
change, cove-fetch runs on the host) with COVE, COVE_INIT, COVE_FETCH and COVE_BROKER set.
"""
import base64
import hashlib
import http.server
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import box_tests as bt
from covetest import (Failure, check, connect_unix, frame, framed_call, http_json, recv_msg,
                      vsock_handshake)

STATE = os.environ.get("AGENT_TEST_STATE", "/tmp/cove-state")
LOCAL = "--local" in sys.argv
COVE = os.environ.get("COVE", bt.COVE)
BROKER = os.environ.get("COVE_BROKER", "/work/cove-broker")
HELPER = os.environ.get("COVE_CRED_HELPER", "/work/git-credential-pass")
AGENT_WAIT = "240"
ENV = dict(os.environ, COVE_RUN_DIR=STATE)


class Sandbox:
    """A running sandbox registered as STATE/NAME (cove run --vsock-uds STATE/NAME/vsock.sock)."""

    def __init__(self, name, cmd="sleep 1000000", disk=None, extra=()):
        self.name = name
        self.dir = os.path.join(STATE, name)
        os.makedirs(self.dir, exist_ok=True)
        self.uds = os.path.join(self.dir, "vsock.sock")
        if os.path.exists(self.uds):
            os.unlink(self.uds)
        self.out = tempfile.TemporaryFile()
        if LOCAL:
            args = [os.environ["COVE_INIT"], "agent", "--unix", self.uds]
        else:
            args = [COVE, "run", "--kernel", bt.BZIMAGE, "--mem", "256M", "--vcpus", "2",
                    "--vsock-cid", "3", "--vsock-uds", self.uds]
            if disk:
                args += ["--disk", disk, "--cmdline", bt.cmdline_for(cmd, bt.DISK_ROOT)]
            else:
                args += ["--initrd", bt.INITRD, "--cmdline", bt.cmdline_for(cmd)]
            args += list(extra)
        self.p = subprocess.Popen(args, stdout=self.out, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL)
        t0 = time.monotonic()
        try:
            r = self.cove("exec", "--wait", AGENT_WAIT, name, "--", "true", timeout=300)
            check(r.returncode == 0, f"agent never answered: rc={r.returncode} "
                     f"{r.stderr!r}; console {self.console()[-1500:]!r}")
        except BaseException:
            self.p.kill()
            self.p.wait()
            raise
        print(f"    agent answered {time.monotonic() - t0:.1f} s after start")

    def cove(self, *args, input=None, timeout=120, **kw):
        try:
            return subprocess.run([COVE] + list(args), input=input, capture_output=True,
                                  timeout=timeout, env=ENV, **kw)
        except subprocess.TimeoutExpired:
            raise Failure(f"cove {' '.join(args)[:200]} timed out; console "
                             f"{self.console()[-1500:]!r}")

    def sh(self, script, **kw):
        """Runs a shell script in the guest; returns (rc, stdout text, stderr text)."""
        r = self.cove("exec", self.name, "--", "sh", "-c", script, **kw)
        return r.returncode, r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace")

    def console(self):
        self.out.seek(0)
        return self.out.read().decode(errors="replace")

    def close(self):
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait()
        text = self.console()
        # Under build-asan the agent itself is instrumented (test mode): any report fails.
        check("Sanitizer" not in text, f"agent sanitizer report: {text[-3000:]}")
        return text


def agent_call(uds, msg):
    """One request to the agent the raw way (hybrid CONNECT, then a framed JSON message)."""
    with connect_unix(uds, 60) as s:
        line = vsock_handshake(s, 1024)
        check(line.startswith(b"OK "), f"handshake reply {line!r}")
        s.sendall(frame(msg))
        return recv_msg(s)


def identity(uds, epoch, token, time_ns=None, seed=None):
    return agent_call(uds, {"op": "identity", "epoch": epoch, "token": token,
                            "seed_b64": base64.b64encode(seed or os.urandom(32)).decode(),
                            "time_ns": time_ns or time.time_ns()})


def test_agent_exec():
    sb = Sandbox("agentbox")
    try:
        lat = []
        for _ in range(10):
            t = time.monotonic()
            r = sb.cove("exec", sb.name, "--", "true")
            lat.append(time.monotonic() - t)
            check(r.returncode == 0, f"exec true: rc={r.returncode} {r.stderr!r}")
        lat.sort()
        print(f"    cove exec -- true: median {lat[5] * 1000:.0f} ms, max {lat[-1] * 1000:.0f} ms (10 runs)")
        r = sb.cove("exec", sb.name, "--", "sh", "-c", "echo out; echo err >&2; exit 7")
        check((r.returncode, r.stdout, r.stderr) == (7, b"out\n", b"err\n"),
                 f"exit/streams: rc={r.returncode} out={r.stdout!r} err={r.stderr!r}")
        data = os.urandom(1 << 20)
        r = sb.cove("exec", sb.name, "--", "sha256sum", input=data)
        check(r.returncode == 0 and r.stdout.decode().startswith(hashlib.sha256(data).hexdigest()),
                 f"stdin 1 MiB: rc={r.returncode} {r.stdout[:80]!r} {r.stderr!r}")
        rc, out, err = sb.sh("kill -TERM $$")
        check(rc == 143, f"killed by SIGTERM: rc={rc}, want 143")
        r = sb.cove("exec", sb.name, "--", "/no/such/cmd")
        err = r.stderr.decode()
        check(r.returncode == 127 and "exec /no/such/cmd: No such file" in err and
                 err.count("\n") == 1, f"missing command: rc={r.returncode} {err!r}")
        r = sb.cove("exec", sb.name, "--", "/no/such/\x1b]0;owned\x07")
        check(r.returncode == 127 and b"\x1b" not in r.stderr and b"\x07" not in r.stderr and
                 b"\\x1b]0;owned\\x07" in r.stderr, f"exec error with control bytes: {r.stderr!r}")
        r = sb.cove("exec", "--env", "GREETING=hi there", "--cwd", "/tmp", "--user", "1000",
                    sb.name, "--", "sh", "-c", 'echo "$GREETING|$(pwd)|$(id -u)|$HOME"')
        # uid 1000 has no /etc/passwd entry in the guest: HOME=/ (the host's may have one).
        check(re.fullmatch(rb"hi there\|/tmp\|1000\|/.*\n", r.stdout) and
                 (LOCAL or r.stdout.endswith(b"|/\n")), f"env/cwd/user: {r.stdout!r} {r.stderr!r}")
        r = sb.cove("exec", "--tty", sb.name, "--", "sh", "-c", "tty; test -t 0 && echo ISATTY")
        out = r.stdout.decode()
        check(r.returncode == 0 and "/dev/pts/" in out and "ISATTY" in out,
                 f"tty: rc={r.returncode} {out!r} {r.stderr!r}")
        r = sb.cove("exec", "usage-without-command")
        check(r.returncode == 2 and r.stderr.count(b"\n") == 1, f"usage error: {r.stderr!r}")

        # Two at once: the short one finishes while the long one still runs.
        t0 = time.monotonic()
        slow = subprocess.Popen([COVE, "exec", sb.name, "--", "sh", "-c", "sleep 3; echo slow"],
                                stdout=subprocess.PIPE, env=ENV)
        time.sleep(0.5)
        rc, out, _ = sb.sh("echo fast")
        t_fast = time.monotonic() - t0
        check(rc == 0 and out == "fast\n" and slow.poll() is None,
                 f"concurrent exec: fast rc={rc} {out!r} after {t_fast:.1f}s, slow done={slow.poll()}")
        check(slow.wait(60) == 0 and slow.stdout.read() == b"slow\n", "concurrent exec: slow one")
        print(f"    second exec answered in {t_fast:.1f} s while the first ran")

        # Signals reach the command's process group.
        p = subprocess.Popen([COVE, "exec", sb.name, "--", "sh", "-c",
                              'trap "echo got-INT; exit 9" INT; echo ready; '
                              'while :; do sleep 0.2; done'], stdout=subprocess.PIPE, env=ENV)
        check(p.stdout.readline() == b"ready\n", "signal test did not start")
        p.send_signal(signal.SIGINT)
        check(p.wait(60) == 9 and b"got-INT" in p.stdout.read(), f"SIGINT forwarded: rc={p.returncode}")

        # ... also while 200 KB of stdin wait for a command that never reads them.
        p = subprocess.Popen([COVE, "exec", sb.name, "--", "sh", "-c",
                              'trap "echo got-INT; exit 9" INT; echo ready; '
                              'while :; do sleep 0.2; done'], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, env=ENV)
        check(p.stdout.readline() == b"ready\n", "stdin signal test did not start")
        p.stdin.write(os.urandom(200 * 1024))
        p.stdin.flush()
        time.sleep(1)
        p.send_signal(signal.SIGINT)
        check(p.wait(60) == 9 and b"got-INT" in p.stdout.read(),
                 f"SIGINT behind unread stdin: rc={p.returncode}")

        # Detach, then attach: the buffered output and the status arrive.
        r = sb.cove("exec", "--detach", sb.name, "--", "sh", "-c", "echo early; sleep 1; echo late; exit 4")
        sid = r.stdout.decode().strip()
        check(r.returncode == 0 and re.fullmatch(r"s\d+", sid), f"detach: {r.stdout!r} {r.stderr!r}")
        r = sb.cove("ps", sb.name)
        check(sid in r.stdout.decode(), f"cove ps SANDBOX lists {sid}: {r.stdout!r}")
        r = sb.cove("attach", sb.name, sid)
        check(r.returncode == 4 and r.stdout == b"early\nlate\n",
                 f"attach: rc={r.returncode} {r.stdout!r} {r.stderr!r}")

        # A dropped host connection kills nothing: the command goes on, attach picks it up.
        p = subprocess.Popen([COVE, "exec", sb.name, "--", "sh", "-c",
                              "echo one; sleep 2; echo two; exit 6"], stdout=subprocess.PIPE, env=ENV)
        check(p.stdout.readline() == b"one\n", "drop test did not start")
        p.kill()
        p.wait()
        r = sb.cove("ps", sb.name)
        m = re.search(r"^(s\d+)\s+\d+\s+running\s+no\s+sh", r.stdout.decode(), re.M)
        check(m, f"session still running after the host dropped: {r.stdout!r}")
        r = sb.cove("attach", sb.name, m.group(1))
        check(r.returncode == 6 and r.stdout == b"two\n",
                 f"attach after drop: rc={r.returncode} {r.stdout!r} {r.stderr!r}")

        r = sb.cove("ps")
        check(re.search(rf"^{sb.name}\s+\d+\s+running", r.stdout.decode(), re.M),
                 f"cove ps: {r.stdout!r} {r.stderr!r}")
        # A guest-chosen command name cannot drive the host's terminal through cove ps.
        gtmp = sb.sh("mktemp -d")[1].strip()
        evil = f"{gtmp}/sl\x1b]0;owned\x07\x1b[2J\u009b"  # ESC, BEL, OSC, CSI, C1 CSI
        # A script, not a symlink: busybox's `command -v sleep` names the applet, not a path.
        rc, _, err = sb.sh(f"printf '#!/bin/sh\\nexec sleep \"$@\"\\n' > '{evil}' && "
                           f"chmod +x '{evil}'")
        check(rc == 0, f"guest script: {err!r}")
        r = sb.cove("exec", "--detach", sb.name, "--", evil, "30")
        check(r.returncode == 0, f"detach {evil!r}: {r.stderr!r}")
        r = sb.cove("ps", sb.name)
        check(r.returncode == 0 and b"\x1b" not in r.stdout and b"\x07" not in r.stdout and
                 b"\xc2\x9b" not in r.stdout and
                 b"sl\\x1b]0;owned\\x07\\x1b[2J\\u009b" in r.stdout,
                 f"cove ps shows a guest argv0 raw: {r.stdout!r}")
        m = re.search(rb"^s\d+\s+(\d+)\s+running\s+no\s+\S*owned", r.stdout, re.M)
        check(m, f"cove ps: no running session for {evil!r}: {r.stdout!r}")
        sb.sh(f"kill {int(m.group(1))}; rm -rf {gtmp}")
        r = sb.cove("exec", "nosuchbox", "--", "true")
        check(r.returncode == 65 and b"no sandbox 'nosuchbox'" in r.stderr, f"unknown name: {r.stderr!r}")
    finally:
        console = sb.close()
    check("cove-init: ready" in console or LOCAL, f"console: {console[-800:]!r}")


def free_port():
    """In the box the guest is ours alone; on a shared host take a port nobody uses."""
    if not LOCAL:
        return 18080
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_agent_cp_forward():
    gport = free_port()
    sb = Sandbox("agentcp")
    fwd = None
    tmp = tempfile.mkdtemp(prefix="agent-cp-")
    try:
        src = os.path.join(tmp, "in.bin")
        data = os.urandom(3 * 1024 * 1024 + 17)
        with open(src, "wb") as f:
            f.write(data)
        os.chmod(src, 0o640)
        want = hashlib.sha256(data).hexdigest()
        gdir = tmp if LOCAL else "/tmp"
        t0 = time.monotonic()
        r = sb.cove("cp", src, f"{sb.name}:{gdir}/guest.bin")
        dt = time.monotonic() - t0
        check(r.returncode == 0, f"cp in: rc={r.returncode} {r.stderr!r}")
        rc, out, _ = sb.sh(f"sha256sum {gdir}/guest.bin; stat -c %a {gdir}/guest.bin")
        check(out.split()[0] == want and out.split()[2] == "640", f"guest copy: {out!r}")
        back = os.path.join(tmp, "out.bin")
        r = sb.cove("cp", f"{sb.name}:{gdir}/guest.bin", back)
        check(r.returncode == 0, f"cp out: rc={r.returncode} {r.stderr!r}")
        with open(back, "rb") as f:
            check(hashlib.sha256(f.read()).hexdigest() == want, "cp out: sha256 differs")
        print(f"    cp in {len(data) / 1e6:.1f} MB in {dt:.2f} s; sha256 matches both ways")
        # The guest picks the mode of a file copied out: never setuid/setgid/sticky on the host,
        # and the umask applies (here 022: a guest's 6777 becomes 0755).
        rc, out, err = sb.sh(f"echo suid > {gdir}/suid.bin && chmod 6777 {gdir}/suid.bin && "
                             f"stat -c %a {gdir}/suid.bin")
        check(rc == 0 and out.strip() == "6777", f"guest chmod 6777: {out!r} {err!r}")
        for name in ("suid.out", "suid.out2"):
            back2 = os.path.join(tmp, name)
            if name == "suid.out2":  # an existing file is replaced with the same rule
                with open(back2, "w") as f:
                    f.write("old")
                os.chmod(back2, 0o600)
            r = sb.cove("cp", f"{sb.name}:{gdir}/suid.bin", back2, preexec_fn=lambda: os.umask(0o022))
            mode = os.stat(back2).st_mode & 0o7777
            check(r.returncode == 0 and mode == 0o755,
                     f"cp out of a 6777 file: rc={r.returncode} mode {mode:o}, want 755 {r.stderr!r}")
        # Guest and path text in errors reaches the terminal with control bytes made visible.
        r = sb.cove("cp", f"{sb.name}:/no/such/\x1b]0;owned\x07\x1b[2J", back)
        check(r.returncode == 1 and b"\x1b" not in r.stderr and b"\x07" not in r.stderr and
                 b"\\x1b]0;owned\\x07" in r.stderr, f"cp error with control bytes: {r.stderr!r}")
        r = sb.cove("cp", f"{sb.name}:/no/such/file", back)
        check(r.returncode == 1 and b"No such file" in r.stderr and r.stderr.count(b"\n") == 1,
                 f"cp of a missing file: {r.stderr!r}")

        # Port forward: busybox httpd on the guest's loopback, fetched from the host.
        www = os.path.join(gdir, "www")
        # In the background, holding nothing of ours open: the exec returns when sh exits.
        rc, out, err = sb.sh(f"mkdir -p {www} && echo hello-from-guest > {www}/index.html && "
                             f"cp {gdir}/guest.bin {www}/big.bin && "
                             f"(busybox httpd -f -p 127.0.0.1:{gport} -h {www} >/dev/null 2>&1 &"
                             f" echo $! > {gdir}/httpd.pid) && sleep 0.5 && echo started")
        check(rc == 0 and "started" in out, f"httpd: rc={rc} {out!r} {err!r}")
        fwd = subprocess.Popen([COVE, "forward", sb.name, f"0:{gport}"], stderr=subprocess.PIPE,
                               env=ENV)
        line = fwd.stderr.readline().decode()
        m = re.search(rf"127\.0\.0\.1:(\d+) -> guest port {gport}", line)
        check(m, f"forward did not start: {line!r}")
        import urllib.request
        base = f"http://127.0.0.1:{m.group(1)}"
        body = urllib.request.urlopen(base + "/index.html", timeout=60).read()
        check(body == b"hello-from-guest\n", f"forwarded GET: {body!r}")
        t0 = time.monotonic()
        big = urllib.request.urlopen(base + "/big.bin", timeout=120).read()
        dt = time.monotonic() - t0
        check(hashlib.sha256(big).hexdigest() == want, "forwarded 3 MB: sha256 differs")
        # Several connections at once.
        results = []

        def get():
            results.append(urllib.request.urlopen(base + "/index.html", timeout=60).read())
        ths = [threading.Thread(target=get) for _ in range(4)]
        for t in ths:
            t.start()
        for t in ths:
            t.join(120)
        check(results == [b"hello-from-guest\n"] * 4, f"4 parallel GETs: {results!r}")
        print(f"    forwarded HTTP GET of {len(big) / 1e6:.1f} MB in {dt:.2f} s")
    finally:
        if fwd:
            fwd.kill()
            fwd.wait()
        sb.sh(f"kill $(cat {tmp if LOCAL else '/tmp'}/httpd.pid)")
        sb.close()
        shutil.rmtree(tmp, ignore_errors=True)


def test_agent_identity():
    sb = Sandbox("agentid")
    try:
        r = agent_call(sb.uds, {"op": "status"})
        check(r.get("ok") is True and r.get("epoch") == 0, f"status before identity: {r}")
        rc, before, _ = sb.sh("date +%s; head -c 16 /dev/urandom | od -An -tx1")
        target = 2_000_000_000  # 2033-05-18
        r = identity(sb.uds, 5, "ab" * 16, time_ns=target * 10**9)
        check(r == {"ok": True, "new_machine": False}, f"identity reply: {r}")
        rc, after, _ = sb.sh("date +%s")
        got = int(after.split()[0])
        if not LOCAL:
            check(abs(got - target) < 120, f"guest clock after identity: {got}, want ~{target}")
        r = agent_call(sb.uds, {"op": "status"})
        check(r.get("epoch") == 5 and "token" not in r, f"status after identity: {r}")
        for bad, why in (({"seed_b64": base64.b64encode(b"short").decode()}, "seed_b64"),
                         ({"token": "not-hex"}, "token"), ({"epoch": -1}, "epoch"),
                         ({"time_ns": "soon"}, "time_ns"), ({"hostname": "a b"}, "hostname"),
                         ({"hostname": ""}, "hostname"), ({"machine_id": "0" * 32}, "machine_id"),
                         ({"machine_id": "AB" * 16}, "machine_id")):
            msg = {"op": "identity", "epoch": 6, "token": "cd" * 16,
                   "seed_b64": base64.b64encode(os.urandom(32)).decode(), "time_ns": time.time_ns()}
            msg.update(bad)
            r = agent_call(sb.uds, msg)
            check(r.get("ok") is False and why in r.get("error", ""), f"bad identity {bad}: {r}")
        check(agent_call(sb.uds, {"op": "status"}).get("epoch") == 5, "bad identity changed the epoch")
        r = agent_call(sb.uds, {"op": "nope"})
        check(r.get("ok") is False and "unknown op" in r.get("error", ""), f"unknown op: {r}")
        print(f"    guest clock {before.split()[0]} -> {got} (asked {target})")
        if not LOCAL:
            # PID 1 restarts an agent that died; the new one starts without an identity.
            sb.sh("for p in /proc/[0-9]*; do [ \"$(cat $p/comm)\" = cove-agent ] && "
                  "kill -9 ${p#/proc/}; done")
            r = sb.cove("exec", "--wait", "30", sb.name, "--", "echo", "back")
            check(r.returncode == 0 and r.stdout == b"back\n",
                     f"agent not restarted: rc={r.returncode} {r.stderr!r}")
            check(agent_call(sb.uds, {"op": "status"}).get("epoch") == 0,
                     "restarted agent kept an epoch")
    finally:
        console = sb.close()
    if not LOCAL:
        check("identity: epoch 5, clock set, RNG reseeded with 32 bytes" in console,
                 f"no identity line on the console: {console[-800:]!r}")
        check("agent ended (status 137), restarting it" in console,
                 f"no agent restart line on the console: {console[-800:]!r}")


def test_agent_sync_mount():
    """The template build's sync and cove-oci's tmpfs mounts (agent ops sync, mount): a hostile
    mount request (another file system, a relative or '..' target, a bad size) is refused with
    one line and the agent goes on answering; in the guest (not --local: it would mount on this
    host), a tmpfs is made where asked, its directories too."""
    sb = Sandbox("agentmnt")
    try:
        r = agent_call(sb.uds, {"op": "sync"})
        check(r == {"ok": True}, f"sync: {r}")
        for bad, why in (({"type": "nfs", "target": "/mnt/x"}, "only tmpfs"),
                         ({"target": "/mnt/x"}, "only tmpfs"),
                         ({"type": "tmpfs", "target": "mnt/x"}, "target"),
                         ({"type": "tmpfs", "target": "/mnt/../etc"}, "target"),
                         ({"type": "tmpfs", "target": "/mnt/./x"}, "target"),
                         ({"type": "tmpfs", "target": "/mnt/x", "size": "1e9"}, "size"),
                         ({"type": "tmpfs", "target": "/mnt/x", "size": "64m,exec"}, "size")):
            r = agent_call(sb.uds, dict({"op": "mount"}, **bad))
            err = r.get("error", "")
            check(r.get("ok") is False and why in err and "\n" not in err,
                  f"mount {bad}: {r}")
        check(agent_call(sb.uds, {"op": "status"}).get("ok") is True,
              "the agent stopped answering after refused mounts")
        if not LOCAL:
            r = agent_call(sb.uds, {"op": "mount", "type": "tmpfs", "target": "/mnt/oci/run",
                                    "size": "8m"})
            check(r == {"ok": True}, f"mount tmpfs: {r}")
            rc, out, _ = sb.sh("grep ' /mnt/oci/run ' /proc/mounts | cut -d' ' -f3")
            check(rc == 0 and out.strip() == "tmpfs", f"the tmpfs in the guest: {out!r}")
        print("    sync answered; 7 hostile mount requests refused with one line each"
              + ("" if LOCAL else "; a tmpfs made at /mnt/oci/run"))
    finally:
        sb.close()


def test_agent_rlimits_hostname():
    """cove-oci's process.rlimits and hostname (issue 33): `cove exec --rlimit` sets the limits in
    the exec'd process before it starts (as root, so a hard limit may go up); hostile rlimits
    (an unknown type, soft over hard, too many, not an array) and hostname requests (empty, a
    leading '-', a space, 65 bytes, not a string) are refused with one line each while the agent
    goes on answering; in the guest (not --local: it would rename this host) the hostname op
    sets what `hostname` prints."""
    sb = Sandbox("agentrlim")
    try:
        r = sb.cove("exec", "--rlimit", "NOFILE=123:456", "--rlimit", "core=0:unlimited",
                    sb.name, "--", "sh", "-c", "ulimit -n; ulimit -Hn; ulimit -c; ulimit -Hc")
        out = r.stdout.decode(errors="replace").split()
        check(r.returncode == 0 and out == ["123", "456", "0", "unlimited"],
              f"--rlimit: rc={r.returncode} {out!r} {r.stderr!r}")
        for bad, why in ((("BOGUS=1:2",), "unknown resource"),
                         (("NOFILE=9:8",), "soft limit over the hard one"),
                         (("NOFILE=1",), "want NAME=SOFT:HARD"),
                         (("NOFILE=1:2", "--rlimit", "nofile=1:2"), "given twice")):
            r = sb.cove("exec", "--rlimit", *bad, sb.name, "--", "true")
            err = r.stderr.decode(errors="replace").strip()
            check(r.returncode == 2 and why in err and "\n" not in err,
                  f"cove exec --rlimit {bad}: rc={r.returncode} {err!r}")
        nofile = {"type": "RLIMIT_NOFILE", "soft": 1, "hard": 2}
        for rl, why in (({"x": 1}, "rlimits: not an array"),
                        ([dict(nofile, type="RLIMIT_BOGUS")], "rlimits[0].type"),
                        ([dict(nofile, type="NOFILE")], "rlimits[0].type"),
                        ([dict(nofile, soft=3)], "soft limit over the hard one"),
                        ([dict(nofile, soft=-1)], "soft limit over the hard one"),
                        ([dict(nofile, hard="2")], "rlimits[0].hard"),
                        ([nofile, nofile], "there twice"),
                        ([dict(nofile, type="RLIMIT_CPU")] * 33, "at most 32")):
            r = agent_call(sb.uds, {"op": "exec", "argv": ["true"], "rlimits": rl})
            err = r.get("error", "")
            check(r.get("ok") is False and why in err and "\n" not in err,
                  f"exec rlimits {str(rl)[:80]}: {r}")
        for bad, why in (({"name": ""}, "hostname"), ({"name": "-x"}, "hostname"),
                         ({"name": "a b"}, "hostname"), ({"name": "a" * 65}, "hostname"),
                         ({"name": 7}, "hostname"), ({}, "hostname")):
            r = agent_call(sb.uds, dict({"op": "hostname"}, **bad))
            err = r.get("error", "")
            check(r.get("ok") is False and why in err and "\n" not in err,
                  f"hostname {bad}: {r}")
        check(agent_call(sb.uds, {"op": "status"}).get("ok") is True,
              "the agent stopped answering after refused requests")
        extra = ""
        if not LOCAL:
            # Past the guest's nr_open (1048576): the kernel refuses, and cove exec says which.
            r = sb.cove("exec", "--rlimit", "NOFILE=1:2000000", sb.name, "--", "true")
            err = r.stderr.decode(errors="replace").strip()
            check(r.returncode == 1 and "setrlimit RLIMIT_NOFILE" in err and "\n" not in err,
                  f"NOFILE over nr_open: rc={r.returncode} {err!r}")
            r = agent_call(sb.uds, {"op": "hostname", "name": "ctr-1.test"})
            check(r == {"ok": True}, f"hostname: {r}")
            rc, out, _ = sb.sh("hostname; cat /proc/sys/kernel/hostname")
            check(rc == 0 and out.split() == ["ctr-1.test", "ctr-1.test"],
                  f"the guest's hostname: {out!r}")
            extra = "; setrlimit past nr_open named; hostname ctr-1.test set and read back"
        else:
            r = agent_call(sb.uds, {"op": "hostname", "name": "ctr-1.test"})
            check(r == {"ok": True}, f"hostname (test mode, this host's untouched): {r}")
        print("    --rlimit NOFILE=123:456 and core=0:unlimited seen by ulimit; 4 bad --rlimit, "
              "8 hostile rlimits and 6 hostile hostname requests refused with one line each"
              + extra)
    finally:
        sb.close()


def test_agent_refuses_guest_peers():
    """A guest process must not drive the root agent: connecting to its port over vsock loopback
    (CID 1) or to the guest's own CID either fails (the kernel has no loopback transport) or is
    closed by the agent's peer check (only CID 2, the host, is served)."""
    if LOCAL:
        print("    skip in --local: no guest vsock (the peer check has a unit test, agent_wire)")
        return
    sb = Sandbox("agentpeer", extra=("--disk", bt.VSOCK_DISK + ",ro"))
    try:
        rc, out, err = sb.sh("mount -t ext4 -o ro /dev/vda /mnt && "
                             "for cid in 1 3; do /mnt/vsock_guest connect $cid 1024 16 "
                             ">/tmp/peer.$cid; echo CID$cid=$?; "
                             "grep -a 'vsock_guest:' /tmp/peer.$cid; done; umount /mnt")
        check(rc == 0, f"guest script: rc={rc} {err!r}")
        # The agent is still there for the host.
        r = agent_call(sb.uds, {"op": "status"})
        check(r.get("ok") is True, f"agent status after the guest's attempts: {r}")
    finally:
        console = sb.close()
    for cid in (1, 3):
        m = re.search(rf"CID{cid}=(\d+)", out)
        check(m, f"no result for CID {cid}: {out!r}")
        refused_by_kernel = m.group(1) == "5"  # vsock_guest: connect failed
        refused_by_agent = f"agent: refused a connection from vsock CID {cid}" in console
        check(refused_by_kernel or refused_by_agent,
                 f"a guest process reached the agent over vsock CID {cid}: {out!r}; "
                 f"console {console[-800:]!r}")
        print(f"    guest -> CID {cid} port 1024: "
              f"{'connect failed' if refused_by_kernel else 'closed by the agent'}")


# --- cove-broker + cove-fetch ------------------------------------------------------------------

class Recorder(http.server.BaseHTTPRequestHandler):
    seen = []

    def log_message(self, *a):
        pass

    def do_GET(self):
        Recorder.seen.append((self.command, self.path, self.headers.get("Authorization") or ""))
        out = b"hello from the test server\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    do_POST = do_GET


def secret_store(tmp, secret):
    """A real pass store with a throwaway GPG key; returns (helper argv, env, how)."""
    env = dict(ENV, GNUPGHOME=os.path.join(tmp, "gnupg"),
               PASSWORD_STORE_DIR=os.path.join(tmp, "store"))
    os.mkdir(env["GNUPGHOME"], 0o700)

    def run(cmd, **kw):
        return subprocess.run(cmd, env=env, check=True, capture_output=True, timeout=300, **kw)
    run(["gpg", "--batch", "--passphrase", "", "--quick-gen-key",
         "cove agent e2e <agent-e2e@cove.invalid>", "future-default", "default", "never"])
    out = run(["gpg", "--batch", "--with-colons", "--list-secret-keys"]).stdout.decode()
    fpr = [l.split(":")[9] for l in out.splitlines() if l.startswith("fpr:")][0]
    run(["pass", "init", fpr])
    run(["pass", "insert", "-m", "cove/demo"], input=f"{secret}\nusername: bot\n".encode())
    got = run([HELPER, "cove/demo", "get"], input=b"protocol=http\n\n").stdout.decode()
    check(got.startswith(f"password={secret}\n"), "git-credential-pass does not answer")
    return [HELPER, "cove/demo"], env


def test_agent_broker_fetch():
    if not os.path.exists(BROKER):
        raise Failure(f"{BROKER} missing (cove-broker not built?)")
    if LOCAL and not (shutil.which("pass") and shutil.which("gpg")):
        print("    SKIP: pass or gpg missing (apt-get install pass gnupg)")
        return
    secret = "s3cr3t-" + secrets.token_hex(16)
    tmp = tempfile.mkdtemp(prefix="agent-broker-")
    Recorder.seen = []
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    port = httpd.server_address[1]
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    broker = sb = None
    disk = os.path.join(tmp, "root.ext4")
    try:
        t0 = time.monotonic()
        helper, env = secret_store(tmp, secret)
        print(f"    pass store with a throwaway GPG key (ed25519/cv25519) in {time.monotonic() - t0:.1f} s")

        def cred(**over):
            c = {"helper": helper, "helper_input": {"protocol": "http", "host": "127.0.0.1"},
                 "inject": {"header": "Authorization", "template": "Bearer {password}"},
                 "allow": {"schemes": ["http"], "hosts": ["127.0.0.1"], "ports": [port],
                           "path_prefixes": ["/v1/"], "methods": ["GET"]},
                 "allow_private": True}
            c.update(over)
            return c
        policy = {"credentials": {"demo": cred(ttl_s=3600, rate_per_min=100),
                                  "ratey": cred(rate_per_min=1), "short": cred(ttl_s=1)}}
        pol = os.path.join(tmp, "policy.json")
        with open(pol, "w") as f:
            json.dump(policy, f)
        # The guest's disk is a copy of the ext4 rootfs, so it can be searched for the secret.
        if not LOCAL:
            shutil.copyfile(bt.ROOTFS, disk)
        name = "agentbroker"
        os.makedirs(os.path.join(STATE, name), exist_ok=True)
        uds = os.path.join(STATE, name, "vsock.sock")
        ctl = os.path.join(tmp, "ctl.sock")
        audit = os.path.join(tmp, "audit.jsonl")
        errlog = open(os.path.join(tmp, "broker.err"), "w+")
        broker = subprocess.Popen([BROKER, "--policy", pol, "--listen", uds + "_1025", "--ctl", ctl,
                                   "--audit", audit], env=env, stderr=errlog)
        for _ in range(200):
            if os.path.exists(ctl):
                break
            time.sleep(0.05)
        # In the box: the root disk is an overlay over a copy of the rootfs, and the sandbox
        # can be snapshotted, so memory layers and overlay files can be searched too.
        snapdir, api_sock = os.path.join(tmp, "snap"), os.path.join(tmp, "api.sock")
        ovl = os.path.join(tmp, "root.ovl")
        sb = Sandbox(name, disk=None if LOCAL else f"{disk},overlay={ovl}",
                     extra=["--api-sock", api_sock, "--snapshot-dir", snapdir])
        fetch = [os.environ.get("COVE_FETCH", "cove-fetch")]
        fenv = ["--env", f"COVE_BROKER_SOCK={uds}.broker.sock"] if LOCAL else []
        url = f"http://127.0.0.1:{port}/v1/hello"

        times = []

        def fetch_in_guest(*args):
            t = time.monotonic()
            r = sb.cove("exec", *fenv, name, "--", *fetch, *args)
            times.append(time.monotonic() - t)
            return r.returncode, r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace")

        # Before any grant the guest has epoch 0 and no token: refused.
        rc, out, err = fetch_in_guest("--credential", "demo", url)
        check(rc == 1 and "denied: stale epoch" in err, f"before grant: rc={rc} {err!r}")
        g = framed_call(ctl, {"op": "grant"})
        check(g.get("ok") is True, f"grant: {g}")
        check(identity(uds, g["epoch"], g["token"]).get("ok") is True, "identity after grant")
        rc, out, err = fetch_in_guest("--credential", "demo", "-H", "Accept: text/plain", url)
        check(rc == 0 and out == "hello from the test server\n", f"allowed fetch: rc={rc} {out!r} {err!r}")
        check(Recorder.seen and Recorder.seen[-1] == ("GET", "/v1/hello", "Bearer " + secret),
                 f"server saw {Recorder.seen[-1:]!r}")
        print(f"    epoch {g['epoch']}: server saw 'Authorization: Bearer <secret>'")
        n = len(Recorder.seen)
        for args, reason in (
                (["--credential", "demo", f"http://localhost:{port}/v1/x"], "host not allowed"),
                (["--credential", "demo", "-X", "POST", url], "method not allowed"),
                (["--credential", "demo", f"http://127.0.0.1:{port}/admin"], "path not allowed"),
                (["--credential", "nope", url], "unknown credential")):
            rc, out, err = fetch_in_guest(*args)
            check(rc == 1 and f"denied: {reason}" in err and out == "",
                     f"{reason}: rc={rc} {err!r}")
        rc, _, err = fetch_in_guest("--credential", "ratey", url)
        check(rc == 0, f"ratey first: {err!r}")
        rc, _, err = fetch_in_guest("--credential", "ratey", url)
        check(rc == 1 and "denied: over rate" in err, f"over rate: rc={rc} {err!r}")
        time.sleep(1.5)
        rc, _, err = fetch_in_guest("--credential", "short", url)
        check(rc == 1 and "denied: expired" in err, f"expired: rc={rc} {err!r}")
        check(len(Recorder.seen) == n + 1, "a denied request reached the server")
        # Re-grant without telling the guest (as after a restore): its epoch is stale.
        g2 = framed_call(ctl, {"op": "grant"})
        rc, _, err = fetch_in_guest("--credential", "demo", url)
        check(rc == 1 and "denied: stale epoch" in err, f"stale epoch: rc={rc} {err!r}")
        check(identity(uds, g2["epoch"], g2["token"]).get("ok") is True, "identity after re-grant")
        rc, out, err = fetch_in_guest("--credential", "demo", url)
        check(rc == 0, f"after the new identity: rc={rc} {err!r}")
        print("    cove exec cove-fetch round trips (s): " + " ".join(f"{t:.1f}" for t in times))
        t0 = time.monotonic()

        if not LOCAL:
            # Snapshots (a full one, then an incremental one), taken before the greps below
            # put the secret into the guest's memory as a search pattern: no memory layer,
            # state file or disk overlay layer may hold it.
            sb.sh("sync")
            for kind in ("Full", "Diff"):
                status, body = http_json(api_sock, "PUT", "/snapshot/create",
                                         {"snapshot_type": kind}, timeout=120)
                check(status == 200, f"{kind} snapshot: {status} {body}")
        # The secret is nowhere in the guest: no process environment, no file, no disk block.
        rc, out, err = sb.sh(f"grep -l {secret} /proc/[0-9]*/environ 2>/dev/null; "
                             "ls /proc/[0-9]*/environ | wc -l")
        check("/proc/" not in out and int(out.split()[-1]) > 2, f"environ grep: {out!r} {err!r}")
        # Every regular file of every file system the guest can write (grep -r would follow the
        # applet symlinks into busybox hundreds of times).
        dirs = "/tmp" if LOCAL else "/ /tmp /run /dev/shm"
        rc, out, err = sb.sh(f"for d in {dirs}; do find $d -xdev -type f; done > /tmp/files.lst; "
                             f"xargs grep -l {secret} < /tmp/files.lst 2>/dev/null; "
                             "echo searched $(wc -l < /tmp/files.lst)")
        check(re.fullmatch(r"searched \d+\n", out), f"file grep found the secret: {out!r}")
        print(f"    searched {out.split()[1]} guest files")
        print(f"    guest environ and file greps: {time.monotonic() - t0:.1f} s")
        if not LOCAL:
            sb.sh("sync")
        sb.close()
        sb = None
        if not LOCAL:
            searched = []
            for root in (snapdir, tmp):
                for f in sorted(os.listdir(root)):
                    path = os.path.join(root, f)
                    if not os.path.isfile(path) or f.endswith((".jsonl", ".json", ".err")):
                        continue
                    if path.startswith(os.path.join(tmp, "gnupg")):
                        continue
                    with open(path, "rb") as fh:
                        check(secret.encode() not in fh.read(), f"the secret is in {path}")
                    searched.append(f)
            layers = [f for f in searched if f.startswith("mem-")]
            check(len(layers) >= 2 and any(f.endswith(".ovl") or f.endswith(".map")
                                              for f in searched),
                     f"expected memory layers and overlay files to search, got {searched}")
            print(f"    no secret in {len(searched)} files: memory layers {layers}, state "
                  f"files, the base disk, overlay data and maps")

        broker.terminate()
        broker.wait(30)
        broker = None
        with open(audit, "rb") as f:
            raw = f.read()
        reasons = [json.loads(l)["reason"] for l in raw.splitlines()]
        for reason in ("stale epoch", "host not allowed", "method not allowed", "path not allowed",
                       "unknown credential", "over rate", "expired"):
            check(reason in reasons, f"audit log lacks '{reason}': {reasons}")
        check(secret.encode() not in raw, "audit log holds the secret")
        v = subprocess.run([BROKER, "verify-audit", audit], capture_output=True, text=True)
        check(v.returncode == 0, f"verify-audit: {v.stdout!r} {v.stderr!r}")
        print(f"    audit: {len(reasons)} records, {v.stdout.strip()}")
    finally:
        if sb:
            sb.close()
        if broker:
            broker.kill()
            broker.wait()
        httpd.shutdown()
        subprocess.run(["gpgconf", "--kill", "gpg-agent"], env=dict(
            os.environ, GNUPGHOME=os.path.join(tmp, "gnupg")), capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


class FakeEgress:
    """The host side of vsock port 1026 (what cove-broker's proxy listens on): answers every
    connection with one fixed HTTP response and keeps the request head it got."""

    BODY = b"hello-through-the-egress-proxy\n"
    BIG = bytes(range(256)) * (16 << 10)  # 4 MiB for GET .../big


    def __init__(self, uds):
        self.path = uds + "_1026"
        if os.path.exists(self.path):
            os.unlink(self.path)
        self.heads = []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(self.path)
        self.sock.listen(16)
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            with c:
                c.settimeout(60)
                head = b""
                try:
                    while b"\r\n\r\n" not in head and len(head) < 65536:
                        got = c.recv(4096)
                        if not got:
                            break
                        head += got
                    self.heads.append(head)
                    body = self.BIG if head.split(b" ", 2)[1:2] == [b"http://example.invalid/big"] \
                        else self.BODY
                    c.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: "
                              + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n"
                              + body)
                except OSError:
                    pass

    def close(self):
        self.sock.close()
        if os.path.exists(self.path):
            os.unlink(self.path)


def test_agent_egress_proxy():
    """A guest program's HTTP request: wget -> http_proxy (127.0.0.1:3128 in the guest, set by
    cove-init) -> cove-init's relay -> vsock CID 2 port 1026 -> the host's Unix socket."""
    # The sandbox command's own environment comes from PID 1 (cove-init's defaults).
    sb = Sandbox("egressbox", cmd="env > /tmp/cmd.env; sleep 1000000")
    egress = FakeEgress(sb.uds)
    try:
        rc, out, err = sb.sh("echo $http_proxy $https_proxy $HTTP_PROXY $HTTPS_PROXY; "
                             "echo $no_proxy $NO_PROXY")
        lines = out.splitlines()
        check(rc == 0 and len(lines) == 2, f"env: rc={rc} {out!r} {err!r}")
        proxies = lines[0].split()
        check(len(proxies) == 4 and len(set(proxies)) == 1 and
              re.fullmatch(r"http://127\.0\.0\.1:\d+", proxies[0]) and
              (LOCAL or proxies[0] == "http://127.0.0.1:3128"), f"exec env proxies: {out!r}")
        check(lines[1] == "localhost,127.0.0.1,::1 localhost,127.0.0.1,::1",
              f"exec env no_proxy: {out!r}")
        r = sb.cove("exec", "--env", "http_proxy=http://127.0.0.1:1", "--env", "NO_PROXY=",
                    sb.name, "--", "sh", "-c", 'echo "$http_proxy|$HTTP_PROXY|$NO_PROXY|$no_proxy"')
        check(r.stdout.decode() == f"http://127.0.0.1:1|{proxies[0]}||localhost,127.0.0.1,::1\n",
              f"explicit env wins: {r.stdout!r} {r.stderr!r}")
        if not LOCAL:
            rc, out, err = sb.sh("cat /tmp/cmd.env")
            check("http_proxy=http://127.0.0.1:3128" in out.splitlines() and
                  "NO_PROXY=localhost,127.0.0.1,::1" in out.splitlines(),
                  f"the sandbox command's env: {out!r}")
        t0 = time.monotonic()
        rc, out, err = sb.sh("busybox wget -q -O - http://example.invalid/path", timeout=120)
        dt = time.monotonic() - t0
        check(rc == 0 and out.encode() == FakeEgress.BODY,
              f"wget through the proxy: rc={rc} {out!r} {err!r}; console "
              f"{sb.console()[-800:]!r}")
        check(egress.heads and egress.heads[-1].startswith(b"GET http://example.invalid/path "),
              f"request the host saw: {egress.heads[-1:]!r}")
        print(f"    wget via the egress proxy -> vsock 1026 -> host: {dt:.2f} s")
        t0 = time.monotonic()
        rc, out, err = sb.sh("busybox wget -q -O - http://example.invalid/big | sha256sum",
                             timeout=120)
        dt = time.monotonic() - t0
        check(rc == 0 and out.startswith(hashlib.sha256(FakeEgress.BIG).hexdigest()),
              f"4 MiB through the proxy: rc={rc} {out!r} {err!r}")
        print(f"    4 MiB GET through the egress proxy in {dt:.2f} s")
        # The host side gone: the program gets an error at once, not a hang.
        egress.close()
        t0 = time.monotonic()
        rc, out, err = sb.sh("busybox wget -q -O - http://example.invalid/", timeout=120)
        check(rc != 0 and out == "", f"wget without a host side: rc={rc} {out!r} {err!r}")
        print(f"    without a host side wget failed (rc={rc}) in {time.monotonic() - t0:.2f} s")
    finally:
        egress.close()
        sb.close()


TESTS = [test_agent_exec, test_agent_cp_forward, test_agent_identity, test_agent_sync_mount,
         test_agent_rlimits_hostname, test_agent_refuses_guest_peers,
         test_agent_broker_fetch, test_agent_egress_proxy]


if __name__ == "__main__":
    if LOCAL and (os.geteuid() != 0 or not shutil.which("busybox")):
        print("SKIP: --local needs root (exec --user) and busybox (httpd)")
        sys.exit(77)
    only = [a for a in sys.argv[1:] if not a.startswith("--")]
    failed = 0
    for t in TESTS:
        if only and t.__name__ not in only:
            continue
        t0 = time.monotonic()
        try:
            t()
            print(f"PASS {t.__name__} ({time.monotonic() - t0:.1f}s)", flush=True)
        except Failure as e:
            failed += 1
            print(f"FAIL {t.__name__}: {e}", flush=True)
    sys.exit(1 if failed else 0)
