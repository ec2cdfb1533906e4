"""e2e snapshot tests (issue 5), run inside the KVM box by box_tests.py: a Linux guest counting
while it is snapshotted every second, kill -9, restore, the count goes on; a vsock listener still
accepts after restore; three forks continue independently with different RNG output; a host
CONNECT reaching a restore at each of its named phases is answered (COVE_TEST_PHASE_DIR)."""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time

import box_tests as bt
from covetest import (Failure, chain_json, check, frame, http_json, recv_msg, vsock_connect,
                      vsock_handshake)

COUNT = re.compile(r"count (\d+)\r?\n")
COUNTER = "i=0; while :; do i=$((i+1)); echo \"count $i\"; sleep 0.2; done"


def wait_file(path, pred, timeout, what, proc=None):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if os.path.exists(path):
            with open(path, "rb") as f:
                text = f.read().decode(errors="replace")
            if pred(text):
                return text
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(0.1)
    tail = ""
    if os.path.exists(path):
        with open(path, "rb") as f:
            tail = f.read()[-1500:].decode(errors="replace")
    raise Failure(f"timed out waiting for {what}; tail {tail!r}")


def layers(d):
    try:
        return chain_json(d)["layers"]
    except (FileNotFoundError, ValueError):
        return []


def fresh(*paths):
    for p in paths:
        if os.path.isdir(p):
            shutil.rmtree(p)
        elif os.path.exists(p):
            os.unlink(p)


def kill(p):
    if p.poll() is None:
        p.kill()
    p.wait()


def counts(text):
    return [int(n) for n in COUNT.findall(text)]


def test_snapshot_every_second_kill_restore():
    d, con1, con2 = "/tmp/snap-count", "/tmp/snap-count.out", "/tmp/snap-count.restored"
    fresh(d, con1, con2)
    run = [bt.COVE, "run", "--kernel", bt.BZIMAGE, "--initrd", bt.INITRD, "--mem", "256M",
           "--cmdline", bt.cmdline_for(COUNTER), "--snapshot-dir", d,
           "--snapshot-interval", "1s", "--console", con1, "--log-level", "info"]
    p = subprocess.Popen(run, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_file(con1, lambda t: len(counts(t)) >= 5, bt.BOOT_TIMEOUT, "the guest to count", p)
        end = time.monotonic() + 120
        while len(layers(d)) < 4 and time.monotonic() < end:
            time.sleep(0.2)
        got = layers(d)
        check(len(got) >= 4 and got[0]["full"] and not got[-1]["full"],
              f"expected a full layer and increments, chain has {got}")
        time.sleep(0.5)
    finally:
        kill(p)
    err = p.stderr.read().decode(errors="replace")
    with open(con1) as f:
        before = counts(f.read())
    last = before[-1]
    chain_len = len(layers(d))
    print(f"    counted to {last} under snapshots; chain has {chain_len} layers; "
          f"{err.count('snapshot: layer')} snapshots logged")
    t0 = time.monotonic()
    r = subprocess.Popen([bt.COVE, "restore", d, "--console", con2, "--log-level", "info"],
                         stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        text = wait_file(con2, lambda t: len(counts(t)) >= 6, 120, "the restored guest to count", r)
        dt = time.monotonic() - t0
    finally:
        kill(r)
    after = counts(text)
    check(1 < after[0] <= last + 1, f"restored count starts at {after[0]}, the killed one reached {last}")
    check(after == list(range(after[0], after[0] + len(after))),
          f"restored count does not go on one by one: {after}")
    print(f"    restored: count continues {after[0]}..{after[-1]} ({dt:.2f} s to 6 counts)")
    fresh(d, con1, con2)


def test_vsock_listener_after_restore():
    d, con1, con2 = "/tmp/snap-vsock", "/tmp/snap-vsock.out", "/tmp/snap-vsock.restored"
    sock, uds2 = "/tmp/snap-vsock.api", "/tmp/snap-vsock-2.sock"
    fresh(d, con1, con2, sock, uds2)
    cmd = ("mount -t ext4 -o ro /dev/vda /mnt && echo LISTENING && "
           "/mnt/vsock_guest listen 5000 && echo GUEST-DONE")
    run = [bt.COVE, "run", "--kernel", bt.BZIMAGE, "--initrd", bt.INITRD, "--mem", "256M",
           "--cmdline", bt.cmdline_for(cmd), "--disk", bt.VSOCK_DISK + ",ro",
           "--vsock-cid", "3", "--vsock-uds", bt.VSOCK_UDS, "--api-sock", sock,
           "--snapshot-dir", d, "--console", con1]
    p = subprocess.Popen(run, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_file(con1, lambda t: "LISTENING" in t, bt.BOOT_TIMEOUT, "the guest listener", p)
        time.sleep(3)  # the listener is up well before this
        status, body = http_json(sock, "PUT", "/snapshot/create", {"snapshot_type": "Full"},
                                 timeout=120)
        check(status == 200, f"snapshot: {status} {body}")
    finally:
        kill(p)
    # Restore takes host paths from its command line only: the disk and the vsock socket.
    r = subprocess.Popen([bt.COVE, "restore", d, "--console", con2, "--vsock-uds", uds2,
                          "--disk", bt.VSOCK_DISK + ",ro"],
                         stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        s, _ = vsock_connect(uds2, 5000, time.monotonic() + 60, proc=r, pause=0.3)
        s.sendall(b"hello-after-restore\n")
        s.shutdown(socket.SHUT_WR)
        s.settimeout(30)
        while s.recv(4096):
            pass
        s.close()
        text = wait_file(con2, lambda t: "GUEST-DONE" in t, 60, "the guest to read the data", r)
        check("hello-after-restore" in text, f"guest did not print the data: {text[-800:]!r}")
        rc = r.wait(timeout=60)
        check(rc == 0, f"restored cove exited {rc}")
    finally:
        kill(r)
    print("    restored listener accepted on a new host socket and read the data")
    fresh(d, con1, con2, sock, uds2)


def test_fork_three_diverge():
    d, con, sock, uds = "/tmp/snap-fork", "/tmp/snap-fork.out", "/tmp/snap-fork.api", "/tmp/snap-fork.sock"
    fresh(d, con, sock, uds)
    cmd = ("i=0; while :; do i=$((i+1)); "
           "echo \"rng $i $(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' ')\"; sleep 0.3; done")
    run = [bt.COVE, "run", "--kernel", bt.BZIMAGE, "--initrd", bt.INITRD, "--mem", "256M",
           "--cmdline", bt.cmdline_for(cmd), "--vsock-cid", "3", "--vsock-uds", uds,
           "--api-sock", sock, "--snapshot-dir", d, "--console", con]
    p = subprocess.Popen(run, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
    clones = []
    try:
        wait_file(con, lambda t: "rng 5 " in t, bt.BOOT_TIMEOUT, "the guest's rng loop", p)
        t0 = time.monotonic()
        f = subprocess.run([bt.COVE, "fork", sock, "-n", "3"], capture_output=True, text=True,
                           timeout=300)
        dt = time.monotonic() - t0
        check(f.returncode == 0, f"cove fork: {f.returncode} {f.stderr!r} {f.stdout!r}")
        clones = json.loads(f.stdout)["clones"]
        check(len(clones) == 3, f"clones: {clones}")
        check(all(c.get("identity") == "sent" for c in clones), f"identity events: {clones}")
        check(len({c["cid"] for c in clones}) == 3 and len({c["vsock_uds"] for c in clones}) == 3,
              f"clones share a CID or socket: {clones}")
        lines = []
        for c in clones:
            def enough(t):
                return len(re.findall(r"rng \d+ [0-9a-f]{16}", t)) >= 4
            text = wait_file(c["console"], enough, 60, f"clone {c['pid']} to go on")
            rng = re.findall(r"rng (\d+) ([0-9a-f]{16})", text)
            nums = [int(n) for n, _ in rng]
            check(nums == list(range(nums[0], nums[0] + len(nums))),
                  f"clone {c['pid']} does not continue: {nums}")
            lines.append(rng[-1][1])
        check(len(set(lines)) == 3, f"clones produced the same random bytes: {lines}")
        check(p.poll() is None, "the original died")
        print(f"    3 clones in {dt:.2f} s (snapshot + restore + identity), last rng: {lines}")
        # PUT /fork itself gives each clone its identity before replying (same code as cove
        # fork): two API clones print different random bytes (a line printed in the
        # milliseconds between restore and the identity event may still match: compare later ones).
        status, body = http_json(sock, "PUT", "/fork", {"count": 2}, timeout=120)
        check(status == 200, f"PUT /fork: {status} {body}")
        api_clones = body["clones"]
        clones += api_clones
        check(all(c.get("identity") == "sent" for c in api_clones),
              f"PUT /fork identity: {api_clones}")
        # Lines already on a clone's console when PUT /fork answered may predate its identity
        # (a CONNECT can be retried); compare the second line printed after the answer.
        offsets = {}
        for c in api_clones:
            try:
                with open(c["console"], "rb") as f:
                    offsets[c["pid"]] = len(f.read().decode(errors="replace"))
            except FileNotFoundError:
                offsets[c["pid"]] = 0
        firsts = []
        for c in api_clones:
            off = offsets[c["pid"]]
            text = wait_file(c["console"],
                             lambda t: len(re.findall(r"rng \d+ [0-9a-f]{16}\r?\n", t[off:])) >= 2,
                             60, f"API clone {c['pid']} to go on")
            firsts.append(re.findall(r"rng \d+ ([0-9a-f]{16})\r?\n", text[off:])[1])
        check(len(set(firsts)) == 2, f"PUT /fork clones printed the same random bytes: {firsts}")
        print(f"    PUT /fork: 2 clones with identity sent, last rng: {firsts}")
    finally:
        for c in clones:
            # Jailed (--jailed), a clone's pid is its jail's and it ends with its parent.
            try:
                if "COVE_REAL" not in os.environ:
                    os.kill(c["pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass
            fresh(c["snapshot_dir"], c["console"], c["api_sock"], c["vsock_uds"])
        kill(p)
    fresh(d, con, sock, uds)


TESTS = [
    test_snapshot_every_second_kill_restore,
    test_vsock_listener_after_restore,
    test_fork_three_diverge,
]


def test_snapshot_disk_agrees_with_memory():
    """An overlay root disk is frozen in the snapshot's pause: after restore the guest, with its
    caches dropped, sees on disk exactly what it had written before the snapshot."""
    d, con1, con2 = "/tmp/snap-disk", "/tmp/snap-disk.out", "/tmp/snap-disk.restored"
    sock, base, ovl = "/tmp/snap-disk.api", "/tmp/snap-disk-base.ext4", "/tmp/snap-disk.ovl"
    fresh(d, con1, con2, sock, base, ovl, ovl + ".map")
    subprocess.run(["cp", bt.ROOTFS, base], check=True)
    loop = ("echo before > /root/a && sync && echo WROTE-A; i=0; while :; do i=$((i+1)); "
            "echo \"count $i\"; "
            "if [ $i = 30 ]; then sync; echo 3 > /proc/sys/vm/drop_caches; "
            "echo \"LS: $(ls /root | tr '\\n' ' ')\"; fi; "
            "if [ $i = 34 ]; then echo after > /root/c && sync && echo WROTE-C; fi; "
            "sleep 0.5; done")
    run = [bt.COVE, "run", "--kernel", bt.BZIMAGE, "--mem", "256M",
           "--cmdline", bt.cmdline_for(loop, bt.DISK_ROOT), "--disk", f"{base},overlay={ovl}",
           "--api-sock", sock, "--snapshot-dir", d, "--console", con1]
    p = subprocess.Popen(run, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_file(con1, lambda t: "WROTE-A" in t and len(counts(t)) >= 2, bt.BOOT_TIMEOUT,
                  "the guest to write /root/a", p)
        status, body = http_json(sock, "PUT", "/snapshot/create", {"snapshot_type": "Full"},
                                 timeout=120)
        check(status == 200, f"snapshot: {status} {body}")
        with open(con1) as f:
            at_snap = counts(f.read())[-1]
        # The restored guest lists /root at count 30: the snapshot must come before it (a
        # loaded box reached count 8 before its snapshot landed; count 30 is ~15 s of margin).
        check(at_snap < 30, f"the snapshot came too late (count {at_snap})")
        wait_file(con1, lambda t: "WROTE-C" in t, 120, "the guest to write /root/c", p)
    finally:
        kill(p)
    tops = [f for f in os.listdir(d) if f.endswith(".ovl")]
    check(tops, f"no new overlay top in {d}: {os.listdir(d)}")
    # The base comes from the host; the frozen overlay layers are files inside the chain.
    r = subprocess.Popen([bt.COVE, "restore", d, "--console", con2, "--disk", base],
                         stdin=subprocess.DEVNULL,
                         stderr=subprocess.PIPE)
    try:
        text = wait_file(con2, lambda t: "LS:" in t, 120, "the restored guest to list /root", r)
    finally:
        kill(r)
    ls = re.search(r"LS: ([^\r\n]*)", text).group(1).split()
    check("a" in ls and "c" not in ls, f"restored disk shows {ls}: want a and not c; the "
          f"snapshot at count {at_snap}, chain {sorted(os.listdir(d))}; restored console "
          f"{text[-1500:]!r}")
    print(f"    snapshot at count {at_snap}; restored guest lists /root: {ls} "
          f"(the original wrote c after the snapshot)")
    fresh(d, con1, con2, sock, base, ovl, ovl + ".map")


TESTS.append(test_snapshot_disk_agrees_with_memory)


# Restore's named phases (sandbox/phase_hook.h), in order; with COVE_TEST_PHASE_DIR=DIR cove
# restore writes DIR/PHASE.reached at each and waits for DIR/PHASE.go.
PHASES = ("opened", "built", "state", "started")
# What exists when restore is held at each phase: (vsock socket, API socket).
PHASE_SOCKETS = {"opened": (False, False), "built": (True, False), "state": (True, True),
                 "started": (True, True)}
AGENT_PORT = 1024
PHASE_HOLD_S = 0.3   # how long the clients wait on a held restore before it is let go
PHASE_ANSWER_S = 5   # each client must be answered within this of the release (handshake: 30 s)


def phase_client(uds, out, deadline):
    """One agent status call the strict way: connect() is retried only while the socket does not
    exist yet (or refuses), then a single CONNECT that must get OK (no retry on reset or
    silence, unlike cove exec). Fills out: line, reply or error, and t (monotonic, when done)."""
    try:
        while True:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(30)
            try:
                s.connect(uds)
                break
            except (FileNotFoundError, ConnectionRefusedError):
                s.close()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
        with s:
            out["line"] = vsock_handshake(s, AGENT_PORT)
            if out["line"].startswith(b"OK "):
                s.sendall(frame({"op": "status"}))
                out["reply"] = recv_msg(s)
    except Exception as e:  # reported by the test, with the phase
        out["error"] = f"{type(e).__name__}: {e}"
    out["t"] = time.monotonic()


def touch(path):
    with open(path, "w"):
        pass


def test_connect_at_each_restore_phase():
    """Issue 14: a host vsock CONNECT that reached a restored sandbox while it was starting was
    lost (cove exec waited out its 30 s handshake). Restore is held at each named phase in turn
    (COVE_TEST_PHASE_DIR); two clients connect to the agent while it is held (a strict one-shot
    CONNECT + status call, and cove exec --wait); once let go both must answer within
    PHASE_ANSWER_S. At "opened" no socket exists yet (the clients retry until it does); at
    "built" and "state" the CONNECT waits in the listener's backlog before the guest runs; at
    "started" the guest runs but the host has read nothing yet."""
    base = "/tmp/snap-phase"
    d, con, sock, uds, pdir = base, base + ".out", base + ".api", base + ".sock", base + "-phases"
    per_phase = [(f"{base}-{ph}.sock", f"{base}-{ph}.api", f"{base}-{ph}.out", f"{base}-{ph}.chain")
                 for ph in PHASES]
    fresh(d, con, sock, uds, pdir, *[x for t in per_phase for x in t])
    # The agent_tests guest: cove-init's agent answers on vsock port 1024.
    run = [bt.COVE, "run", "--kernel", bt.BZIMAGE, "--initrd", bt.INITRD, "--mem", "256M",
           "--vcpus", "2", "--cmdline", bt.cmdline_for("sleep 1000000"), "--vsock-cid", "3",
           "--vsock-uds", uds, "--api-sock", sock, "--snapshot-dir", d, "--console", con]
    p = subprocess.Popen(run, stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        r = subprocess.run([bt.COVE, "exec", "--wait", "240", uds, "--", "true"],
                           capture_output=True, timeout=300)
        check(r.returncode == 0, f"agent never answered: rc={r.returncode} {r.stderr!r}")
        status, body = http_json(sock, "PUT", "/snapshot/create", {"snapshot_type": "Full"},
                                 timeout=120)
        check(status == 200, f"snapshot: {status} {body}")
    finally:
        kill(p)
    times = []
    for i, phase in enumerate(PHASES):
        uds2, sock2, con2, chain2 = per_phase[i]
        fresh(pdir)
        os.mkdir(pdir, 0o700)
        for earlier in PHASES[:i]:
            touch(os.path.join(pdir, earlier + ".go"))
        log = tempfile.TemporaryFile()
        env = dict(os.environ, COVE_TEST_PHASE_DIR=pdir)
        # Each phase restores the same chain; its own snapshots (none here) go elsewhere.
        r = subprocess.Popen([bt.COVE, "restore", d, "--console", con2, "--vsock-uds", uds2,
                              "--api-sock", sock2, "--snapshot-dir", chain2,
                              "--log-level", "debug"],
                             env=env, stdin=subprocess.DEVNULL, stderr=log)

        def restore_log():
            log.seek(0)
            text = log.read().decode(errors="replace")[-2500:]
            try:
                with open(con2, "rb") as f:
                    text += " | console: " + f.read().decode(errors="replace")[-1500:]
            except OSError:
                pass
            return text
        ex = None
        try:
            try:
                wait_file(os.path.join(pdir, phase + ".reached"), lambda t: True, 120,
                          f"restore to reach {phase}", r)
            except Failure as e:
                raise Failure(f"{e}; restore log {restore_log()!r}")
            have = (os.path.exists(uds2), os.path.exists(sock2))
            check(have == PHASE_SOCKETS[phase],
                  f"{phase}: (vsock, API) sockets exist {have}, want {PHASE_SOCKETS[phase]}")
            res = {}
            raw = threading.Thread(target=phase_client,
                                   args=(uds2, res, time.monotonic() + 120), daemon=True)
            raw.start()
            ex = subprocess.Popen([bt.COVE, "exec", "--wait", "30", uds2, "--", "echo",
                                   f"phase-{phase}"],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE)
            time.sleep(PHASE_HOLD_S)
            check(raw.is_alive() and ex.poll() is None and r.poll() is None,
                  f"{phase}: something finished while restore was held: client {res}, "
                  f"exec {ex.poll()}, restore {r.poll()}; restore log {restore_log()!r}")
            t_go = time.monotonic()
            for later in PHASES[i:]:
                touch(os.path.join(pdir, later + ".go"))
            try:
                out, err = ex.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                raise Failure(f"{phase}: cove exec still waiting 60 s after the release; "
                              f"restore log {restore_log()!r}")
            t_exec = time.monotonic() - t_go
            raw.join(60)
            check(not raw.is_alive(), f"{phase}: the CONNECT client still waiting 60 s after "
                  f"the release; restore log {restore_log()!r}")
            t_raw = res["t"] - t_go
            check(res.get("line", b"").startswith(b"OK ") and
                  (res.get("reply") or {}).get("ok") is True,
                  f"{phase}: the one-shot CONNECT got {res} after {t_raw:.2f} s; "
                  f"restore log {restore_log()!r}")
            check(ex.returncode == 0 and out == f"phase-{phase}\n".encode(),
                  f"{phase}: cove exec rc={ex.returncode} out={out!r} err={err!r}")
            check(t_raw < PHASE_ANSWER_S and t_exec < PHASE_ANSWER_S,
                  f"{phase}: answered {t_raw:.2f} s (CONNECT) and {t_exec:.2f} s (exec) after "
                  f"the release, want under {PHASE_ANSWER_S} s")
            missing = [ph for ph in PHASES if not os.path.exists(os.path.join(pdir, ph + ".reached"))]
            check(not missing, f"{phase}: phases never reached: {missing}")
            times.append(f"{phase} {t_raw:.2f}/{t_exec:.2f}")
        finally:
            if ex is not None and ex.poll() is None:
                ex.kill()
                ex.wait()
            kill(r)
            log.close()
            fresh(uds2, sock2, con2, chain2)
    print("    answered after the release at each restore phase (s, CONNECT/exec): " +
          ", ".join(times))
    fresh(d, con, sock, uds, pdir)


TESTS.append(test_connect_at_each_restore_phase)


CHURN = ("i=0; while :; do dd if=/dev/urandom of=/c.$i bs=64k count=64 2>/dev/null; "
         "md5sum < /c.$i > /m.$i; if [ $i -gt 0 ]; then j=$((i-1)); "
         "if [ \"$(md5sum < /c.$j)\" = \"$(cat /m.$j)\" ]; then echo \"ok $j\"; "
         "else echo \"BROKEN $j\"; fi; rm -f /c.$j /m.$j; fi; i=$((i+1)); done")
OK_ROUND = re.compile(r"ok (\d+)\r?\n")


def test_snapshot_precopy_churn():
    """Snapshots stage dirty pages while the guest runs (pre-copy) and copy again in the pause
    only what it wrote since: taken back to back while the guest writes 4 MiB files, frees them
    and checks each one's md5 the round after, the restored guest finds every file it had
    written intact. A page staged before it was written again and not copied in the pause
    would show as a BROKEN round (or a dead guest)."""
    d, con1, con2, sock = "/tmp/snap-churn", "/tmp/snap-churn.out", "/tmp/snap-churn.r", \
        "/tmp/snap-churn.api"
    fresh(d, con1, con2, sock)
    log = tempfile.TemporaryFile()
    run = [bt.COVE, "run", "--kernel", bt.BZIMAGE, "--initrd", bt.INITRD, "--mem", "256M",
           "--cmdline", bt.cmdline_for(CHURN), "--api-sock", sock, "--snapshot-dir", d,
           "--console", con1, "--log-level", "debug"]
    p = subprocess.Popen(run, stdin=subprocess.DEVNULL, stderr=log)
    diffs = []
    try:
        wait_file(con1, lambda t: len(OK_ROUND.findall(t)) >= 2, bt.BOOT_TIMEOUT,
                  "the guest to churn", p)
        for i in range(10):
            status, body = http_json(sock, "PUT", "/snapshot/create",
                                     {"snapshot_type": "Full" if i == 0 else "Diff"},
                                     timeout=120)
            check(status == 200, f"snapshot {i}: {status} {body}")
            if i:
                diffs.append(body)
            time.sleep(0.15)
    finally:
        kill(p)
    log.seek(0)
    err = log.read().decode(errors="replace")
    pre = [int(n) for n in re.findall(r"\((\d+) pages pre-copied\)", err)]
    with open(con1) as f:
        before = f.read()
    check("BROKEN" not in before, f"the guest saw a broken file before any restore: {before[-500:]!r}")
    check(len(pre) == 10 and all(n > 0 for n in pre),
          f"every snapshot should have pre-copied pages, the log says {pre}")
    last = max(int(n) for n in OK_ROUND.findall(before))
    r = subprocess.Popen([bt.COVE, "restore", d, "--console", con2],
                         stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        text = wait_file(con2, lambda t: "BROKEN" in t or len(OK_ROUND.findall(t)) >= 3, 180,
                         "the restored guest to check 3 rounds", r)
    finally:
        kill(r)
    check("BROKEN" not in text, f"the restored guest found a file changed under it: {text[-500:]!r}")
    after = [int(n) for n in OK_ROUND.findall(text)]
    check(after[0] <= last + 1 and after == list(range(after[0], after[0] + len(after))),
          f"restored rounds {after} do not go on from {last}")
    pauses = sorted(b["pause_us"] / 1e3 for b in diffs)
    print(f"    10 snapshots under churn, pre-copied pages {pre}; Diff pause median "
          f"{pauses[len(pauses) // 2]:.1f} ms; restored rounds {after[0]}..{after[-1]} "
          f"(killed at {last}) intact")
    fresh(d, con1, con2, sock)
TESTS.append(test_snapshot_precopy_churn)


MERGE_INTERVALS = 30
WROTE_BLK = re.compile(r"WROTE (\d+)\r?\n")
CHECKED = re.compile(r"CHECK (\d+) (OK|BAD \d+)\r?\n")
SNAP_LINE = re.compile(r"snapshot: layer (\d+) \((full|diff)\):.* paused (\d+) us")


def test_disk_writes_every_interval_merged():
    """A guest that writes (and syncs) a new 64 KiB file on its overlay root disk several times
    per snapshot interval: every snapshot freezes a disk layer, and the chain, capped at 15
    frozen layers, goes on only because frozen layers are merged (devices/OVERLAY.md "Merging
    layers"). 30 intervals commit 30 snapshots; after a kill -9 and a restore the guest, its page
    cache dropped, reads back every file it had written, byte for byte."""
    d, con1, con2 = "/tmp/snap-merge", "/tmp/snap-merge.out", "/tmp/snap-merge.restored"
    base, ovl = "/tmp/snap-merge-base.ext4", "/tmp/snap-merge.ovl"
    fresh(d, con1, con2, base, ovl, ovl + ".map")
    subprocess.run(["cp", bt.ROOTFS, base], check=True)
    # Each round writes and syncs the next file; every 5th round first checks every file written
    # so far from the disk (caches dropped). A restored guest goes on with its rounds: its next
    # check reads the restored chain.
    loop = ("i=0; while :; do i=$((i+1)); if [ $((i % 5)) = 0 ]; then "
            "sync; echo 3 > /proc/sys/vm/drop_caches; bad=''; "
            "j=1; while [ $j -lt $i ]; do "
            "[ \"$(yes blk-$j | head -c 65536 | md5sum)\" = \"$(md5sum < /root/b$j)\" ] "
            "|| bad=$j; j=$((j+1)); done; "
            "if [ -n \"$bad\" ]; then echo \"CHECK $i BAD $bad\"; else echo \"CHECK $i OK\"; fi; fi; "
            "yes blk-$i | head -c 65536 > /root/b$i && sync && echo \"WROTE $i\"; "
            "sleep 0.3; done")
    log = tempfile.TemporaryFile()
    run = [bt.COVE, "run", "--kernel", bt.BZIMAGE, "--mem", "256M",
           "--cmdline", bt.cmdline_for(loop, bt.DISK_ROOT), "--disk", f"{base},overlay={ovl}",
           "--snapshot-dir", d, "--snapshot-interval", "1s", "--console", con1,
           "--log-level", "info"]
    p = subprocess.Popen(run, stdin=subprocess.DEVNULL, stderr=log)
    t0 = time.monotonic()
    try:
        wait_file(con1, lambda t: len(WROTE_BLK.findall(t)) >= 1, bt.BOOT_TIMEOUT,
                  "the guest to write its first file", p)
        log.seek(0)
        booted = len(SNAP_LINE.findall(log.read().decode(errors="replace")))
        end = time.monotonic() + 150
        while time.monotonic() < end and p.poll() is None:
            log.seek(0)
            text = log.read().decode(errors="replace")
            if (len(SNAP_LINE.findall(text)) >= booted + MERGE_INTERVALS and
                    text.count("froze its overlay") >= MERGE_INTERVALS):
                break
            time.sleep(0.3)
    finally:
        kill(p)
    run_s = time.monotonic() - t0
    log.seek(0)
    err = log.read().decode(errors="replace")
    with open(con1) as f:
        before = f.read()
    check("BAD" not in before, f"the guest read back a wrong file before any restore: "
          f"{CHECKED.findall(before)[-3:]}")
    check("snapshot failed" not in err and "frozen layers, the most" not in err,
          f"a snapshot failed: {[l for l in err.splitlines() if 'failed' in l][:3]}")
    snaps = SNAP_LINE.findall(err)
    check(len(snaps) >= booted + MERGE_INTERVALS,
          f"{len(snaps) - booted} snapshots committed after the guest's first write in "
          f"{run_s:.0f} s, want {MERGE_INTERVALS}")
    # The frozen layers under the top, snapshot by snapshot, from the log: a freeze adds one,
    # a merge put in place leaves one (then the freeze of that same pause adds one).
    frozen, most, merges, freezes = 0, 0, 0, 0
    merge_pause, plain_pause, installed = [], [], False
    for line in err.splitlines():
        if "froze its overlay" in line:
            frozen += 1
            freezes += 1
            most = max(most, frozen)
        elif "are now the merged layer" in line:
            check(frozen >= 8, f"a merge replaced {frozen} layers: {line}")
            frozen = 1
            merges += 1
            installed = True
        m = SNAP_LINE.search(line)
        if m:
            (merge_pause if installed else plain_pause).append(int(m.group(3)) / 1e3)
            installed = False
    check(freezes >= MERGE_INTERVALS,
          f"only {freezes} disk layers frozen in {len(snaps)} snapshots "
          f"({len(WROTE_BLK.findall(before))} files written)")
    check(merges >= 3 and most <= 15, f"{merges} merges, at most {most} frozen layers")
    built = re.findall(r"merged its (\d+) frozen layers \((\d+) chunks\) .* in (\d+) us", err)
    wrote = [int(n) for n in WROTE_BLK.findall(before)]
    r = subprocess.Popen([bt.COVE, "restore", d, "--console", con2, "--disk", base,
                          "--log-level", "info"],
                         stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        text = wait_file(con2, lambda t: len(CHECKED.findall(t)) >= 1, 120,
                         "the restored guest to check its files", r)
    finally:
        kill(r)
    i, verdict = CHECKED.findall(text)[0]
    check(verdict == "OK", f"the restored guest's round {i}: {verdict} (file b{verdict[4:]} differs)")
    # Every file but the last few (written after the last snapshot) came back. The guest's rate
    # is the box's: in a loaded one it wrote 9 files over 30 intervals, each still in one of the
    # 30 frozen (and merged) layers.
    check(int(i) - 1 >= max(wrote[-1] - 6, 4),
          f"the restored guest checked {int(i) - 1} files, the killed one had written {wrote[-1]}")

    def med(xs):
        return sorted(xs)[len(xs) // 2] if xs else 0.0
    print(f"    {len(snaps)} snapshots ({len(snaps) - booted} after the first write) in "
          f"{run_s:.0f} s, {freezes} disk layers frozen, {merges} "
          f"merges (built with the guest running in {[int(b[2]) // 1000 for b in built]} ms, "
          f"{[int(b[1]) for b in built]} chunks), at most {most} frozen layers; pause median "
          f"{med(plain_pause):.1f} ms, {med(merge_pause):.1f} ms with a merge put in place "
          f"(max {max(merge_pause or [0]):.1f} / {max(plain_pause or [0]):.1f} ms); restored: "
          f"{int(i) - 1} files read back intact")
    fresh(d, con1, con2, base, ovl, ovl + ".map")


TESTS.append(test_disk_writes_every_interval_merged)
