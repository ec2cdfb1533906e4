"""e2e: the jail (cove run/restore --jail DIR --uid N --gid N), run inside the KVM box by
box_tests.py. A sandbox jailed as an unprivileged user serves exec, snapshots, is restored
jailed and serves exec again; from the host side its process has no capability, no_new_privs,
a seccomp filter, namespaces of its own, a root holding only its paths, rlimits and a cgroup v2
with the limits asked for (the box mounts cgroup2). A guest that fills its memory past the
jail's memory.max is killed by the cgroup, not the host."""
import hashlib
import os
import re
import shutil
import signal
import stat
import subprocess
import time

import agent_tests as at
import box_tests as bt
import lifecycle_tests as lt
from covetest import Failure, check, http_json

UID = 1000
CGROUP = "/sys/fs/cgroup"


def cgroup2():
    """Mounts cgroup2 on CGROUP when nothing is there (the box); True when it is cgroup2."""
    with open("/proc/mounts") as f:
        mounts = [line.split() for line in f]
    if any(m[1] == CGROUP and m[2] == "cgroup2" for m in mounts):
        return True
    if any(m[1] == CGROUP for m in mounts):
        return False
    os.makedirs(CGROUP, exist_ok=True)
    return subprocess.run(["mount", "-t", "cgroup2", "none", CGROUP]).returncode == 0


def kvm_gid():
    """The group that may open /dev/kvm (made so when it is root's alone)."""
    st = os.stat("/dev/kvm")
    if st.st_mode & 0o060 != 0o060:
        os.chmod("/dev/kvm", stat.S_IMODE(st.st_mode) | 0o060)
    return st.st_gid if st.st_gid else 0


def owned_dir(path):
    if os.path.isdir(path):
        shutil.rmtree(path)
    os.makedirs(path)
    os.chown(path, UID, kvm_gid())
    return path


def jail_args(name, *limits):
    d = owned_dir(f"/jails/{name}")
    os.chown(d, 0, 0)
    return ["--jail", d, "--uid", str(UID), "--gid", str(kvm_gid())] + list(limits)


def vmm_pid(waiter):
    """The jailed VMM: the waiter's only child (pid 1 of the jail's pid namespace)."""
    end = time.monotonic() + 10
    while time.monotonic() < end:
        try:
            with open(f"/proc/{waiter}/task/{waiter}/children") as f:
                kids = f.read().split()
            if kids:
                return int(kids[0])
        except FileNotFoundError:
            break
        time.sleep(0.05)
    raise Failure(f"no VMM process under the jail's waiter {waiter}")


def status_fields(pid):
    with open(f"/proc/{pid}/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def root_listing(pid):
    """Every path in the jailed process's root, bound directories not descended."""
    root = f"/proc/{pid}/root"
    found = []
    for dirpath, dirs, files in os.walk(root):
        rel = dirpath[len(root):] or "/"
        for n in files:
            found.append(os.path.join(rel, n))
        # a bound directory (another file system than its parent's) is listed, not walked;
        # not os.path.ismount: '..' of the jail's root leads out of /proc/PID/root
        keep, here = [], os.stat(dirpath).st_dev
        for n in dirs:
            p = os.path.join(dirpath, n)
            if os.lstat(p).st_dev != here:
                found.append(os.path.join(rel, n) + "/")
            else:
                keep.append(n)
        dirs[:] = keep
    return sorted(found)


def check_confined(pid, waiter, name, mem_max, pids_max):
    st = status_fields(pid)
    check(st["Uid"].split()[0] == str(UID), f"VMM uid: {st['Uid']}")
    for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        check(int(st[cap], 16) == 0, f"VMM {cap} {st[cap]}")
    check(st["NoNewPrivs"] == "1", f"NoNewPrivs {st['NoNewPrivs']}")
    check(st["Seccomp"] == "2", f"Seccomp {st['Seccomp']}")
    for ns in ("mnt", "pid", "net", "ipc", "uts", "cgroup"):
        check(os.readlink(f"/proc/{pid}/ns/{ns}") != os.readlink(f"/proc/self/ns/{ns}"),
              f"the VMM shares the box's {ns} namespace")
    with open(f"/proc/{pid}/limits") as f:
        limits = f.read()
    check(re.search(r"^Max open files +4096 +4096 ", limits, re.M) and
          re.search(r"^Max core file size +0 +0 ", limits, re.M), f"rlimits: {limits}")
    seen = root_listing(pid)
    for p in seen:
        check(p.startswith(("/dev/", "/work/", "/tmp/")),
              f"the jail's root holds {p}, not one of this sandbox's paths: {seen}")
    check("/dev/kvm" in seen and not any(p.startswith("/work/cove") for p in seen),
          f"jail root: {seen}")
    with open(f"/proc/{waiter}/cgroup") as f:
        cg = f.read().strip().split("::", 1)[1]
    check(cg == f"/cove/vmm-{waiter}", f"the VMM's cgroup is {cg!r}")
    with open(f"{CGROUP}{cg}/memory.max") as f:
        got_mem = int(f.read())
    with open(f"{CGROUP}{cg}/pids.max") as f:
        got_pids = int(f.read())
    check((got_mem, got_pids) == (mem_max, pids_max),
          f"cgroup limits memory.max {got_mem}, pids.max {got_pids}")
    print(f"    jailed VMM pid {pid}: uid {UID}, no capability, seccomp, 6 namespaces, "
          f"root holds {len(seen)} paths, cgroup {cg} (memory.max {got_mem >> 20} MiB, "
          f"pids.max {got_pids})")
    return cg


def test_jail_unprivileged_exec_snapshot_restore():
    check(cgroup2(), "no cgroup2 hierarchy at /sys/fs/cgroup in the box")
    name = "jailbox"
    sdir = owned_dir(os.path.join(at.STATE, name))
    api, chain = os.path.join(sdir, "api.sock"), os.path.join(sdir, "chain")
    mem_max = 512 << 20
    extra = ["--api-sock", api, "--snapshot-dir", chain, "--log-level", "info"] + \
        jail_args(name, "--jail-mem-max", "512M", "--jail-pids-max", "64")
    sb = at.Sandbox(name, extra=extra)
    try:
        pid = vmm_pid(sb.p.pid)
        check_confined(pid, sb.p.pid, name, mem_max, 64)
        rc, out, err = sb.sh("echo jailed > /tmp/mark; uname -r")
        check(rc == 0, f"exec in the jailed sandbox: {rc} {err!r}")
        status, body = http_json(api, "PUT", "/snapshot/create", {"snapshot_type": "Full"}, timeout=120)
        check(status in (200, 204), f"snapshot in the jail: {status} {body}")
        check(os.stat(os.path.join(chain, "chain.json")).st_uid == UID,
              "the chain was not written by the jailed user")
    finally:
        text = sb.close()
    check("limits skipped" not in text, f"cgroup limits skipped: {text[-800:]}")
    # Restored jailed (a new jail directory, same user), exec finds the file the first wrote.
    rargs = [at.COVE, "restore", chain, "--vsock-uds", sb.uds, "--api-sock", api,
             "--log-level", "info"] + jail_args(name + "-r", "--jail-pids-max", "64")
    out = open(os.path.join("/tmp", name + "-r.out"), "w+b")
    t0 = time.monotonic()
    r = subprocess.Popen(rargs, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                         env=at.ENV)
    try:
        e = at.Sandbox.__new__(at.Sandbox)
        e.name, e.p, e.out, e.uds = name, r, out, sb.uds
        x = e.cove("exec", "--wait", "120", name, "--", "cat", "/tmp/mark", timeout=180)
        dt = time.monotonic() - t0
        check(x.returncode == 0 and x.stdout == b"jailed\n",
              f"after a jailed restore: {x.returncode} {x.stdout!r} {x.stderr!r}; "
              f"restore said {e.console()[-1500:]!r}")
        pid = vmm_pid(r.pid)
        st = status_fields(pid)
        check(st["Uid"].split()[0] == str(UID) and int(st["CapEff"], 16) == 0,
              f"restored VMM: Uid {st['Uid']} CapEff {st['CapEff']}")
        print(f"    restored jailed: exec answered {dt:.2f} s after cove restore")
    finally:
        if r.poll() is None:
            r.kill()
        r.wait()
        out.seek(0)
        log = out.read().decode(errors="replace")
        out.close()
    check("Sanitizer" not in log, f"restore: {log[-2000:]}")
    shutil.rmtree(sdir, ignore_errors=True)


def test_jail_memory_max_kills_the_vmm():
    """A 512 MiB guest that writes 300 MiB into its RAM-backed root, under memory.max 192M:
    the cgroup's OOM killer ends the VMM (the host is untouched), and memory.events says so."""
    check(cgroup2(), "no cgroup2 hierarchy at /sys/fs/cgroup in the box")
    name = "jailoom"
    sdir = owned_dir(os.path.join(at.STATE, name))
    cmd = ("echo FILLING; dd if=/dev/zero of=/fill bs=1M count=300 2>&1; echo FILLED; "
           "sleep 1000")
    args = [bt.COVE if not bt.COVE.endswith("cove-jailed") else os.environ["COVE_REAL"],
            "run", "--kernel", bt.BZIMAGE, "--initrd", bt.INITRD, "--mem", "512M",
            "--cmdline", bt.cmdline_for(cmd)] + jail_args(name, "--jail-mem-max", "192M")
    # The first test's VMMs have exited, leaving their cgroups: the next jail removes them. A
    # VMM whose waiter the test before killed may still be on its way out (its cgroup still
    # populated, which no jail can remove): wait for that first (a loaded CI box took longer).
    stale = [d for d in os.listdir(f"{CGROUP}/cove") if d.startswith("vmm-")]
    check(stale, "no cgroup left by the jails of the test before")

    def populated(d):
        try:
            with open(f"{CGROUP}/cove/{d}/cgroup.events") as f:
                return "populated 1" in f.read()
        except OSError:
            return False
    deadline = time.monotonic() + 30
    while any(populated(d) for d in stale) and time.monotonic() < deadline:
        time.sleep(0.1)
    check(not any(populated(d) for d in stale),
          f"the test before left running VMMs for 30 s: {[d for d in stale if populated(d)]}")
    p = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT)
    try:
        waiter = p.pid
        vmm_pid(waiter)
        left = [d for d in stale if os.path.exists(f"{CGROUP}/cove/{d}")]
        check(not left, f"stale cgroups not removed by the next jail: {left}")
        with open(f"/proc/{waiter}/cgroup") as f:
            cg = CGROUP + f.read().strip().split("::", 1)[1]
        try:
            rc = p.wait(timeout=240)
        except subprocess.TimeoutExpired:
            raise Failure("the guest filled its memory and the VMM was not killed")
        out = p.stdout.read().decode(errors="replace")
        check("FILLING" in out, f"killed before the guest began to fill: {out[-800:]}")
        check("FILLED" not in out, f"the guest wrote 300 MiB under memory.max 192M: {out[-800:]}")
        check(rc == 128 + 9, f"jailed VMM exit {rc}, want 137 (SIGKILL); {out[-800:]}")
        with open(f"{cg}/memory.events") as f:
            ev = dict(line.split() for line in f)
        check(int(ev.get("oom_kill", 0)) >= 1, f"memory.events: {ev}")
        print(f"    killed by the cgroup's OOM killer (memory.events oom_kill {ev['oom_kill']})")
    finally:
        if p.poll() is None:
            p.kill()
        p.wait()
        shutil.rmtree(sdir, ignore_errors=True)


PROBE = "/work/cove-jail-probe"


def _probe(pid, action, d, name):
    """cove-jail-probe: the broken-into VMM's attempt, from inside its jail (mounts, root, user,
    no capability, the event-loop filter). Refused: exit 0, or death by the filter's SIGSYS."""
    r = subprocess.run([PROBE, str(pid), action, d, name], capture_output=True, timeout=60)
    out = (r.stdout + r.stderr).decode(errors="replace").strip()
    check("joined:" in out, f"the probe did not join VMM {pid}'s jail: rc={r.returncode} {out!r}")
    check(r.returncode != 3, f"a broken-into VMM got through: {action} {d}/{name}:\n{out}")
    check(r.returncode in (0, -signal.SIGSYS),
          f"probe {action} {d}/{name}: rc={r.returncode} {out!r}")
    if r.returncode == -signal.SIGSYS:
        check("forbidden system call" in out, f"SIGSYS without the filter's line: {out!r}")
    return out


def _sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _newest(chain, prefix):
    names = sorted(n for n in os.listdir(chain) if n.startswith(prefix) and "." not in n)
    check(names, f"no {prefix}* layer in {chain}: {os.listdir(chain)}")
    return names[-1]


def test_jail_broken_in_vmm():
    """Issue 27: a guest that has taken over its jailed VMM (played by cove-jail-probe inside the
    VMM's jail, as its user, without capabilities, under the project's own event-loop filter)
    cannot write what the next start trusts (spec, event log, locks, log), nor replace, unlink,
    re-mode or write a committed layer of its own chain or of its parent's shared through a fork,
    nor create a file outside its chain. spec.json is unchanged after, the parent's guest memory
    too, and the next start runs jailed and filtered on every thread."""
    check(os.access(PROBE, os.X_OK), f"{PROBE} is missing (tests/e2e/run adds it)")
    lt.fresh()
    a, b = "atk-a", "atk-b"
    lt.create(a)
    try:
        # Memory only the parent's guest holds: a tmpfs file, and its checksum.
        rc, out, err = lt.sh(a, "mkdir -p /m && mount -t tmpfs none /m && "
                             "dd if=/dev/urandom of=/m/mark bs=1M count=8 2>/dev/null && "
                             "md5sum /m/mark")
        check(rc == 0 and len(out.split()) == 2, f"parent's mark: rc={rc} {out!r} {err!r}")
        mark = out.split()[0]
        rc, out, err = lt.cove("fork", a, b)
        check(rc == 0, f"cove fork {a} {b}: rc={rc} {err!r}")
        sa, sb = os.path.join(lt.STATE, a), os.path.join(lt.STATE, b)
        ca, cb = os.path.join(sa, "chain"), os.path.join(sb, "chain")
        mem_b = _newest(cb, "mem-")
        check(os.path.exists(os.path.join(ca, mem_b)) and
              os.stat(os.path.join(ca, mem_b)).st_ino == os.stat(os.path.join(cb, mem_b)).st_ino,
              f"the clone's {mem_b} is not its parent's file (a hard link)")
        spec_sha = {n: _sha(os.path.join(lt.STATE, n, "spec.json")) for n in (a, b)}
        layer_sha = _sha(os.path.join(cb, mem_b))
        tried = 0
        for name, sd, chain in ((b, sb, cb), (a, sa, ca)):
            vmm = vmm_pid(lt.vmm_pid(name))
            layer, state = _newest(chain, "mem-"), _newest(chain, "state-")
            for f in ("spec.json", "events.jsonl", "vmm.lock", "start.lock", "vmm.log"):
                _probe(vmm, "write", sd, f)
                _probe(vmm, "write-at", sd, f)
            _probe(vmm, "write-at", chain, "../spec.json")
            _probe(vmm, "rename-over", sd, "spec.json")
            for lay in (layer, state):
                _probe(vmm, "rename-over", chain, lay)
                _probe(vmm, "unlink-create", chain, lay)
                _probe(vmm, "chmod-write", chain, lay)
                _probe(vmm, "write-at", chain, lay)
                _probe(vmm, "write", chain, lay)
                _probe(vmm, "link", chain, lay)
            for d in (sd, "/", os.path.dirname(sd), os.path.dirname(chain) + "/jail"):
                _probe(vmm, "create", d, "planted")
            tried += 1
        out = _probe(vmm_pid(lt.vmm_pid(b)), "write-at", cb, mem_b)
        print(f"    writing the parent's layer from the clone's jail: {out.splitlines()[-1]}")
        for n in (a, b):
            check(_sha(os.path.join(lt.STATE, n, "spec.json")) == spec_sha[n],
                  f"{n}'s spec.json changed")
            check(not os.path.exists(os.path.join(lt.STATE, n, "planted")), "a file was planted")
        check(_sha(os.path.join(cb, mem_b)) == layer_sha, f"the shared layer {mem_b} changed")
        rc, out, err = lt.sh(a, "md5sum /m/mark")
        check(rc == 0 and out.split()[0] == mark,
              f"the parent's guest memory changed: {out!r} (was {mark}) {err!r}")
        # The next start: jailed, with every VMM thread under a filter.
        rc, out, err = lt.cove("stop", b)
        check(rc == 0, f"cove stop {b}: rc={rc} {err!r}")
        rc, out, err = lt.cove("start", b)
        check(rc == 0, f"cove start {b}: rc={rc} {err!r}")
        waiter = lt.vmm_pid(b)
        with open(f"/proc/{waiter}/cmdline", "rb") as f:
            argv = f.read().decode(errors="replace").split("\0")
        check("--jail" in argv and "--no-seccomp" not in argv, f"next start's argv: {argv}")
        vmm = vmm_pid(waiter)
        threads = {}
        for tid in os.listdir(f"/proc/{vmm}/task"):
            st = status_fields(f"{vmm}/task/{tid}")
            threads[tid] = (st["Name"], st["Seccomp"])
        check(len(threads) >= 2 and all(v[1] == "2" for v in threads.values()),
              f"the restarted VMM's threads: {threads}")
        print(f"    {tried} VMMs (clone and parent) refused every attempt; spec.json unchanged; "
              f"next start jailed, threads {sorted(v[0] for v in threads.values())} all Seccomp 2")
    finally:
        for n in (a, b):
            lt.cove("rm", n)


TESTS = [test_jail_unprivileged_exec_snapshot_restore, test_jail_memory_max_kills_the_vmm,
         test_jail_broken_in_vmm]
