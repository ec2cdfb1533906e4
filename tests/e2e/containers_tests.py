"""Container engines drive cove-oci (issue 33) on the real Linux guest in the KVM box: a private
containerd (its runc shim told BinaryName by `ctr run --runc-binary`) and podman with conmon
(`[engine.runtimes] cove`), both on the musl OCI image tests/e2e/make-oci-images builds, no
registry. Every container is a cove microVM: the process the engine's pid file names is
cove-oci's monitor, and its exit status is the container's."""
import json
import os
import pty
import select
import subprocess
import time

import box_tests as bt

COVE = bt.COVE
OCI = os.path.join(os.path.dirname(COVE), "cove-oci")
IMAGES = "/work/oci"
WORK = "/tmp/engines"
# The sandboxes of both engines' containers: cove's own state, as any sandbox's.
ENV = dict(os.environ, COVE_STATE_DIR=WORK + "/cove", COVE_RUN_DIR=WORK + "/cove-run",
           COVE_GUEST_DIR="/work", PATH="/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
SOCK = WORK + "/ctrd/containerd.sock"


def need_inputs():
    if not os.path.exists(os.path.join(IMAGES, "musl.oci.tar")):
        raise bt.Skip("no OCI images (tests/e2e/run builds them with tests/e2e/make-oci-images)")
    for tool in ("containerd", "ctr", "containerd-shim-runc-v2", "podman", "conmon", "runc"):
        if not any(os.access(os.path.join(d, tool), os.X_OK) for d in ENV["PATH"].split(":")):
            raise bt.Skip(f"{tool} is not in the box (tools/setup installs it; tests/e2e/run "
                          f"adds it)")


def run(argv, timeout=300, env=None, check_rc=None):
    try:
        r = subprocess.run(argv, capture_output=True, timeout=timeout, env=env or ENV)
    except subprocess.TimeoutExpired:
        raise bt.Failure(f"{' '.join(argv)[:160]} timed out after {timeout} s")
    out, err = r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace")
    if check_rc is not None:
        bt.check(r.returncode == check_rc,
                 f"{' '.join(argv)[:200]}: rc={r.returncode}, want {check_rc}: out {out!r} "
                 f"err {err[-1500:]!r}")
    return r.returncode, out, err


def oci_sandboxes():
    rc, out, err = run([COVE, "ls", "--json"])
    bt.check(rc == 0, f"cove ls: {err!r}")
    return [s["name"] for s in json.loads(out)["sandboxes"] if s["name"].startswith("oci-")]


def cgroups():
    """Engines read their cgroup; the box's init mounts none."""
    if not os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
        os.makedirs("/sys/fs/cgroup", exist_ok=True)
        subprocess.run(["mount", "-t", "cgroup2", "none", "/sys/fs/cgroup"], check=False)


# ---------------------------------------------------------------------------------------------
# containerd and ctr
# ---------------------------------------------------------------------------------------------

def start_containerd():
    d = WORK + "/ctrd"
    os.makedirs(d, exist_ok=True)
    with open(d + "/config.toml", "w") as f:
        f.write(f"""version = 2
root = "{d}/root"
state = "{d}/state"
oom_score = 0
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "{SOCK}"
[ttrpc]
  address = "{SOCK}.ttrpc"
""")
    return run_containerd(d, SOCK)


def run_containerd(d, sock):
    """containerd on d/config.toml, its log in d/containerd.log, once it listens on sock."""
    log = open(d + "/containerd.log", "w")
    p = subprocess.Popen(["containerd", "--config", d + "/config.toml"], stdout=log,
                         stderr=subprocess.STDOUT, env=ENV)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not os.path.exists(sock):
        bt.check(p.poll() is None, f"containerd ended: {open(d + '/containerd.log').read()[-2000:]}")
        time.sleep(0.2)
    bt.check(os.path.exists(sock), "containerd did not listen within 60 s")
    return p


def stop_containerd(p):
    """containerd (run_containerd's) asked to end, killed after 20 s."""
    p.terminate()
    try:
        p.wait(timeout=20)
    except subprocess.TimeoutExpired:
        p.kill()


def ctr(*args, timeout=300, check_rc=None):
    return run(["ctr", "-a", SOCK, "-n", "cove"] + list(args), timeout=timeout,
               check_rc=check_rc)


def task_status(cid):
    rc, out, err = ctr("task", "ls")
    for line in out.splitlines()[1:]:
        f = line.split()
        if f and f[0] == cid:
            return f[-1]
    return None


def wait_status(cid, want, timeout=120):
    deadline = time.monotonic() + timeout
    st = None
    while time.monotonic() < deadline:
        st = task_status(cid)
        if st == want:
            return
        time.sleep(0.5)
    raise bt.Failure(f"task {cid}: {st}, not {want} within {timeout} s")


def test_containers_ctr():
    """containerd 1.6 with ctr: `ctr run --rm` of the musl image runs its process in a microVM
    as the image's user in its WorkingDir, and ctr returns the process's exit status (42);
    a detached task takes `ctr task exec` (status 5), pause and resume (PAUSED, RUNNING),
    `task ps`, and SIGTERM reaching a trap in the guest (exit 7); SIGKILL ends the VM. No
    oci- sandbox is left after the tasks are removed."""
    need_inputs()
    subprocess.run(["rm", "-rf", WORK])
    cgroups()
    p = start_containerd()
    try:
        ctr("image", "import", "--snapshotter", "native", "--base-name", "localhost/musl",
            os.path.join(IMAGES, "musl.oci.tar"), check_rc=0)
        runc = ["--snapshotter", "native", "--runc-binary", OCI]
        t0 = time.monotonic()
        rc, out, err = ctr("run", "--rm", *runc, "localhost/musl:latest", "t1", "sh", "-c",
                           "echo hello-from-a-vm; id -u; pwd; hello-musl; exit 42")
        took = time.monotonic() - t0
        bt.check(rc == 42 and out.split() == ["hello-from-a-vm", "1000", "/srv/app", "hello",
                                              "from", "musl"],
                 f"ctr run --rm: rc={rc} out={out!r} err={err[-2000:]!r}")
        bt.check(not oci_sandboxes(), f"left after ctr run --rm: {oci_sandboxes()}")
        # A microVM: the cove guest's kernel, not the box's; ctr's /run tmpfs is honoured.
        rc, out, err = ctr("run", "--rm", *runc, "localhost/musl:latest", "t0", "sh", "-c",
                           "uname -r; grep ' /run ' /proc/mounts | cut -d' ' -f3 | sort -u")
        got = out.split()
        bt.check(rc == 0 and len(got) == 2 and got[0] != os.uname().release and
                 got[1] == "tmpfs",
                 f"uname -r and /run in the container: {out!r} (box: {os.uname().release}) "
                 f"{err[-1000:]!r}")
        print(f"    ctr run --rm: exit 42 and the process's output in {took:.1f} s (the first "
              f"container of its root: the root's disk and template made, then restored, the "
              f"process, the VM removed); its kernel "
              f"{got[0]} (the box's {os.uname().release}), /run a tmpfs")

        ctr("run", "-d", *runc, "localhost/musl:latest", "t2", "sh", "-c",
            "trap 'exit 7' TERM; while :; do sleep 1; done", check_rc=0)
        wait_status("t2", "RUNNING")
        rc, out, err = ctr("task", "exec", "--exec-id", "e1", "t2", "sh", "-c",
                           "echo in-exec; exit 5")
        bt.check(rc == 5 and out.strip() == "in-exec", f"task exec: rc={rc} {out!r} {err!r}")
        ctr("task", "pause", "t2", check_rc=0)
        wait_status("t2", "PAUSED", 30)
        ctr("task", "resume", "t2", check_rc=0)
        wait_status("t2", "RUNNING", 30)
        rc, out, err = ctr("task", "ps", "t2")
        bt.check(rc == 0 and len(out.split()) >= 2, f"task ps: rc={rc} {out!r} {err!r}")
        ctr("task", "kill", "-s", "SIGTERM", "t2", check_rc=0)
        wait_status("t2", "STOPPED", 60)
        rc, out, err = ctr("task", "rm", "t2")
        bt.check(rc == 0 and "7" in out + err, f"task rm after SIGTERM: rc={rc} {out!r} {err!r}")
        ctr("container", "rm", "t2", check_rc=0)
        print("    detached: task exec exit 5, pause/resume, ps, SIGTERM caught by a trap in the "
              "guest (exit 7)")

        # A root directory with no image behind it (ctr run --rootfs), holding a symlink that
        # points out of it: the link is copied as a link and resolves in the guest, never on
        # the host, where the file it names exists.
        rootfs = WORK + "/bare-rootfs"
        os.makedirs(rootfs + "/bin", exist_ok=True)
        subprocess.run(["cp", "/bin/busybox", rootfs + "/bin/busybox"], check=True)
        os.symlink("busybox", rootfs + "/bin/sh")
        with open(WORK + "/host-secret", "w") as f:
            f.write("box-secret\n")
        os.symlink(WORK + "/host-secret", rootfs + "/escape")
        rc, out, err = ctr("run", "--rm", "--runc-binary", OCI, "--rootfs", rootfs, "r1",
                           "/bin/sh", "-c", "cat /escape; readlink /escape; exit 4")
        bt.check(rc == 4 and "box-secret" not in out and out.strip() == WORK + "/host-secret",
                 f"ctr run --rootfs with a link out of the root: rc={rc} out={out!r} "
                 f"err={err[-800:]!r}")
        with open(WORK + "/host-secret") as f:
            bt.check(f.read() == "box-secret\n", "the host's file changed")
        print("    ctr run --rootfs (no image): a symlink out of the root stays a link, resolved "
              "in the guest (the host's file unread and unchanged), exit 4")

        ctr("run", "-d", *runc, "localhost/musl:latest", "t3", "sh", "-c", "sleep 1000",
            check_rc=0)
        wait_status("t3", "RUNNING")
        ctr("task", "kill", "-s", "SIGKILL", "t3", check_rc=0)
        wait_status("t3", "STOPPED", 60)
        ctr("task", "rm", "t3", check_rc=0)
        ctr("container", "rm", "t3", check_rc=0)
        bt.check(not oci_sandboxes(), f"left after the tasks: {oci_sandboxes()}")
        print("    SIGKILL: the task stopped and its VM is gone")
    finally:
        stop_containerd(p)


# ---------------------------------------------------------------------------------------------
# podman and conmon
# ---------------------------------------------------------------------------------------------

def podman_env(name="podman"):
    """podman's settings, its storage under WORK/NAME (another NAME: another "host" for podman,
    with cove's own state shared)."""
    d = WORK + "/" + name
    os.makedirs(d, exist_ok=True)
    with open(d + "/storage.conf", "w") as f:
        f.write(f'[storage]\ndriver = "vfs"\nrunroot = "{d}/run"\ngraphroot = "{d}/graph"\n')
    with open(d + "/containers.conf", "w") as f:
        f.write(f"""[containers]
default_ulimits = ["nofile=4096:4096", "nproc=4096:4096"]
[engine]
runtime = "cove"
# conmon passes only these to the runtime: cove-oci's cove finds its state and guest by them
conmon_env_vars = ["PATH={ENV['PATH']}", "COVE_STATE_DIR={ENV['COVE_STATE_DIR']}",
                   "COVE_RUN_DIR={ENV['COVE_RUN_DIR']}", "COVE_GUEST_DIR=/work"]
cgroup_manager = "cgroupfs"
events_logger = "file"
runtime_supports_json = ["cove"]
# runc (the baseline) in the box: its root is an initramfs, where pivot_root cannot work
no_pivot_root = true
[engine.runtimes]
cove = ["{OCI}"]
runc = ["/usr/sbin/runc"]
""")
    os.makedirs("/etc/containers", exist_ok=True)
    if not os.path.exists("/etc/containers/policy.json"):
        with open("/etc/containers/policy.json", "w") as f:
            f.write('{"default":[{"type":"insecureAcceptAnything"}]}\n')
    return dict(ENV, CONTAINERS_CONF=d + "/containers.conf",
                CONTAINERS_STORAGE_CONF=d + "/storage.conf")


def test_containers_podman():
    """podman 4.3 and conmon with runtime cove: `podman run` returns the process's exit status
    (42) with its output, `podman exec` into a running container (status 5), `podman pause` and
    `unpause`, and `podman stop` (TERM caught in the guest: exit 7); nothing is left behind."""
    need_inputs()
    cgroups()
    env = podman_env()

    def podman(*args, timeout=300, check_rc=None):
        return run(["podman"] + list(args), timeout=timeout, env=env, check_rc=check_rc)

    rc, out, err = podman("pull", "oci-archive:" + os.path.join(IMAGES, "musl.oci.tar") +
                          ":latest")
    bt.check(rc == 0, f"podman pull oci-archive: rc={rc} {err[-1500:]!r}")
    image_id = out.strip().splitlines()[-1]
    # The baseline first: the same image under podman's own runtime, runc (namespaces, no VM).
    t0 = time.monotonic()
    rc, out, err = podman("--runtime", "runc", "run", "--rm", "--pull", "never", "--network",
                          "none", image_id, "sh", "-c", "echo hello-from-runc; exit 42")
    bt.check(rc == 42 and out == "hello-from-runc\n",
             f"podman --runtime runc run: rc={rc} out={out!r} err={err[-1500:]!r}")
    print(f"    podman --runtime runc run (the baseline, no VM): exit 42 and the output in "
          f"{time.monotonic() - t0:.1f} s")
    roots_before = image_cache_roots()
    t0 = time.monotonic()
    # By path (--runtime /abs/cove-oci): podman then gives no --log, and the runtime's stderr at
    # create is the container's own: it must carry nothing of cove-oci's.
    rc, out, err = podman("--runtime", OCI, "run", "--rm", "--pull", "never", "--network",
                          "none", image_id, "sh", "-c",
                          "echo hello-from-podman; id -u; echo to-stderr >&2; exit 42")
    took = time.monotonic() - t0
    bt.check(rc == 42 and out.split() == ["hello-from-podman", "1000"] and
             err.strip() == "to-stderr",
             f"podman run: rc={rc} out={out!r} err={err[-2000:]!r}")
    print(f"    podman run --rm: exit 42 and the output in {took:.1f} s")
    podman("run", "-d", "--name", "p2", "--pull", "never", "--network", "none", image_id, "sh",
           "-c", "trap 'exit 7' TERM; while :; do sleep 1; done", check_rc=0)
    rc, out, err = podman("exec", "p2", "sh", "-c", "echo in-exec; exit 5")
    bt.check(rc == 5 and out.strip() == "in-exec", f"podman exec: rc={rc} {out!r} {err!r}")
    podman("pause", "p2", check_rc=0)
    rc, out, err = podman("inspect", "--format", "{{.State.Status}}", "p2")
    bt.check(out.strip() == "paused", f"after podman pause: {out!r} {err!r}")
    podman("unpause", "p2", check_rc=0)
    rc, out, err = podman("exec", "p2", "cat", "/etc/hosts")
    bt.check(rc == 0 and "localhost" in out, f"podman's /etc/hosts, copied in: {out!r} {err!r}")
    podman("stop", "-t", "20", "p2", check_rc=0)
    rc, out, err = podman("inspect", "--format", "{{.State.ExitCode}}", "p2")
    bt.check(out.strip() == "7", f"exit code after podman stop: {out!r} {err!r}")
    podman("rm", "p2", check_rc=0)
    # TERM ignored: podman stop's timeout ends in KILL, which ends the VM (exit 137).
    podman("run", "-d", "--name", "p3", "--pull", "never", "--network", "none", image_id, "sh",
           "-c", "trap '' TERM; while :; do sleep 1; done", check_rc=0)
    t0 = time.monotonic()
    podman("stop", "-t", "2", "p3", check_rc=0)
    rc, out, err = podman("inspect", "--format", "{{.State.ExitCode}}", "p3")
    bt.check(out.strip() == "137", f"exit code after stop -t 2 of a TERM-proof process: "
             f"{out!r} {err!r}")
    print(f"    podman stop -t 2 of a process ignoring TERM: KILL, exit 137, in "
          f"{time.monotonic() - t0:.1f} s")
    podman("rm", "p3", check_rc=0)
    # A terminal: podman run -it on a pty the test drives (conmon gets the pty's master back
    # over its console socket); the shell inside sees a tty, and its exit status comes back.
    master, slave = pty.openpty()
    pr = subprocess.Popen(["podman", "run", "-it", "--rm", "--pull", "never", "--network", "none",
                           image_id, "sh", "-c",
                           "[ -t 0 ] && [ -t 1 ] && echo tty-yes; read line; echo got-$line; "
                           "exit 3"],
                          stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
    os.close(slave)
    seen = b""
    deadline = time.monotonic() + 120
    sent = False
    while time.monotonic() < deadline and pr.poll() is None:
        r, _, _ = select.select([master], [], [], 0.5)
        if r:
            try:
                seen += os.read(master, 4096)
            except OSError:
                break
        if b"tty-yes" in seen and not sent:
            os.write(master, b"typed\r")
            sent = True
    try:
        rc_t = pr.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pr.kill()
        rc_t = None
    os.close(master)
    bt.check(rc_t == 3 and b"tty-yes" in seen and b"got-typed" in seen,
             f"podman run -it: rc={rc_t}, the terminal showed {seen[-800:]!r}")
    print("    podman run -it through a pty: a tty inside, a typed line read, exit 3")
    # 10 MiB of output, every byte, attached and through podman logs.
    big = "head -c 10485760 /dev/zero | tr '\\0' x"
    rc, out, err = podman("run", "--rm", "--pull", "never", "--network", "none", image_id,
                          "sh", "-c", big, timeout=600)
    bt.check(rc == 0 and len(out) == 10 << 20 and set(out) == {"x"},
             f"10 MiB attached: rc={rc} {len(out)} bytes {err[-500:]!r}")
    podman("run", "-d", "--name", "p4", "--pull", "never", "--network", "none", image_id,
           "sh", "-c", big, check_rc=0)
    podman("wait", "p4", timeout=600)
    rc, out, err = podman("logs", "p4", timeout=300)
    bt.check(rc == 0 and len(out) == 10 << 20, f"podman logs: rc={rc} {len(out)} bytes")
    podman("rm", "p4", check_rc=0)
    print("    10 MiB of output: every byte attached and in podman logs")
    # config.json's rlimits and hostname reach the process in the guest; annotations over this
    # host's caps (no /etc/cove/oci.json here: 2G, 2 vCPUs, no policies) are refused.
    rc, out, err = podman("run", "--rm", "--pull", "never", "--network", "none", "--ulimit",
                          "nofile=1234:2345", "--hostname", "ctr-host", image_id, "sh", "-c",
                          "ulimit -n; ulimit -Hn; hostname")
    bt.check(rc == 0 and out.split() == ["1234", "2345", "ctr-host"],
             f"podman run --ulimit --hostname: rc={rc} {out!r} {err[-800:]!r}")
    for ann, want in (("cove.dev/mem=8G", "cove.dev/mem 8G is over this host's cap 2G"),
                      ("cove.dev/vcpus=3", "cove.dev/vcpus 3 is over this host's cap 2"),
                      ("cove.dev/policy=nope", "cove.dev/policy nope: this host has no such "
                                               "policy")):
        rc, out, err = podman("run", "--rm", "--pull", "never", "--network", "none",
                              "--annotation", ann, image_id, "true")
        bt.check(rc != 0 and want in err, f"podman run --annotation {ann}: rc={rc} "
                 f"{err[-1000:]!r}")
    print("    --ulimit nofile=1234:2345 and --hostname in the guest; cove.dev/mem=8G, "
          "cove.dev/vcpus=3 and an unknown cove.dev/policy refused with one line")
    # A host bind mount cannot be honoured by a VM: refused, naming it, before any VM boots.
    rc, out, err = podman("run", "--rm", "--pull", "never", "--network", "none", "-v",
                          "/etc:/hostetc", image_id, "true")
    bt.check(rc != 0 and "mount /hostetc: a bind mount of the host's /etc" in err,
             f"podman run -v /etc:/hostetc: rc={rc} {err[-1500:]!r}")
    bt.check(not oci_sandboxes(), f"left after podman rm: {oci_sandboxes()}")
    # Eight containers of one image: podman made each its own root (a copy, with its own
    # /etc/hosts, /etc/mtab...), and cove-oci made one disk for them all.
    roots = image_cache_roots()
    bt.check(len(roots) == len(roots_before) + 1,
             f"podman's containers of one image: want one new root disk, have {roots} "
             f"(before: {roots_before})")
    print("    podman exec exit 5, pause/unpause, podman stop: TERM caught in the guest (exit 7); "
          "one root disk for all eight containers")


def test_containers_checkpoint():
    """podman checkpoint and restore with cove-oci (issue 34): a container whose shell keeps a
    counter in its memory only (printed every second, never written) is checkpointed with
    --export; a second podman storage root (another "host" for podman) imports the archive with
    restore --import; the counter goes on from where it was and the guest's uptime does not
    restart. cove-oci's checkpoint is a cove snapshot: CRIU never runs. A checkpoint whose record
    names a path, and one with a tampered layer, are refused with one line."""
    need_inputs()
    if not any(os.access(os.path.join(d, "criu"), os.X_OK) for d in ENV["PATH"].split(":")):
        raise bt.Skip("criu is not in the box: podman refuses checkpoints without it "
                      "(tools/setup installs it; tests/e2e/run adds it)")
    cgroups()
    env, env2 = podman_env(), podman_env("podman2")

    def podman(*args, timeout=300, check_rc=None, e=None):
        return run(["podman"] + list(args), timeout=timeout, env=e or env, check_rc=check_rc)

    archive = "oci-archive:" + os.path.join(IMAGES, "musl.oci.tar") + ":latest"
    image_id = podman("pull", archive, check_rc=0)[1].strip().splitlines()[-1]
    bt.check(podman("pull", archive, e=env2, check_rc=0)[1].strip().splitlines()[-1] == image_id,
             "the second storage root's image differs")
    podman("run", "-d", "--name", "ck1", "--pull", "never", "--network", "none", image_id, "sh",
           "-c", "i=0; while :; do i=$((i+1)); echo n=$i; sleep 1; done", check_rc=0)

    def counters(name, e=None):
        rc, out, err = podman("logs", name, e=e)
        return [int(l[2:]) for l in out.split() if l.startswith("n=") and l[2:].isdigit()]

    deadline = time.monotonic() + 120
    while len(counters("ck1")) < 3 and time.monotonic() < deadline:
        time.sleep(1)
    bt.check(len(counters("ck1")) >= 3, f"ck1 printed {counters('ck1')} in 120 s")
    up1 = float(podman("exec", "ck1", "cat", "/proc/uptime", check_rc=0)[1].split()[0])
    export = WORK + "/ck1.tar"
    t0 = time.monotonic()
    # Uncompressed (podman's default is zstd, which the box has no tool to list).
    rc, out, err = podman("container", "checkpoint", "--compress", "none", "--export", export,
                          "ck1", timeout=600)
    t_ck = time.monotonic() - t0
    bt.check(rc == 0, f"podman container checkpoint --export: rc={rc} {err[-2000:]!r}")
    last = counters("ck1")[-1]
    state = podman("inspect", "--format", "{{.State.Status}} {{.State.Checkpointed}}", "ck1",
                   check_rc=0)[1].split()
    bt.check(state == ["exited", "true"], f"ck1 after its checkpoint: {state}")
    size = os.path.getsize(export)
    listing = subprocess.run(["tar", "tf", export], capture_output=True, text=True).stdout
    bt.check("checkpoint/cove/checkpoint.json" in listing and
             "checkpoint/inventory.img" in listing and
             "checkpoint/cove/archive/manifest.json" in listing,
             f"the export holds no cove checkpoint: {listing[:1500]!r}")
    print(f"    podman container checkpoint --export: {t_ck:.1f} s, {size >> 20} MiB "
          f"(the counter at {last}; the container exited, checkpointed)")
    # Another podman storage root imports it.
    t0 = time.monotonic()
    rc, out, err = podman("container", "restore", "--import", export, "--name", "ck2",
                          e=env2, timeout=600)
    t_rs = time.monotonic() - t0
    bt.check(rc == 0, f"podman container restore --import: rc={rc} {err[-2000:]!r}")
    # podman's export carries the container's log, so ck2's starts with ck1's lines. The
    # restored shell goes on from the value it had at the snapshot (cove-oci pauses the VM
    # before it forks it, so ck1 printed nothing after); a step back once, by at most the
    # checkpoint's seconds, is let by (the line podman's log had not yet taken), never a new
    # start from 1.
    deadline = time.monotonic() + 120
    while max(counters("ck2", env2), default=0) < last + 3 and time.monotonic() < deadline:
        time.sleep(1)
    after = counters("ck2", env2)
    drops = [(a, b) for a, b in zip(after, after[1:]) if b != a + 1]
    nxt = [v for v in after if v > last]
    bt.check(len(nxt) >= 3 and len(drops) <= 1 and
             all(b <= a and b > 3 and b >= a - t_ck - 5 for a, b in drops),
             f"ck2's counter after the restore: {after[:5]}...{after[-5:]} ({len(after)} "
             f"lines; its steps other than +1: {drops}; ck1's last: {last})")
    up2 = float(podman("exec", "ck2", "cat", "/proc/uptime", e=env2,
                       check_rc=0)[1].split()[0])
    bt.check(up2 > up1, f"the guest's uptime restarted: {up1} before, {up2} after")
    print(f"    podman container restore --import in a second storage root: {t_rs:.1f} s; "
          f"the counter went on ({drops[0][1] if drops else nxt[0]} after {last}), uptime {up1:.0f} s -> {up2:.0f} s")
    podman("rm", "-f", "ck2", e=env2, check_rc=0)
    # ck1 stays until the end: podman 4.3's import reuses paths of the exported container's
    # run directory (its conmon pid file), which removing ck1 would take away.
    # Hostile checkpoints, straight to cove-oci restore: a record naming a host path, and
    # (through podman again) an archive whose layer was changed after it was packed.
    bad = WORK + "/bad-ck"
    subprocess.run(["rm", "-rf", bad], check=True)
    os.makedirs(bad + "/x")
    subprocess.run(["tar", "xf", export, "-C", bad + "/x"], check=True)
    rec_path = bad + "/x/checkpoint/cove/checkpoint.json"
    with open(rec_path) as f:
        rec = json.load(f)
    good = dict(rec)
    rec["root"] = "../../../etc"
    with open(rec_path, "w") as f:
        json.dump(rec, f)
    rc, out, err = run([OCI, "--root", bad + "/root", "restore", "--image-path",
                        bad + "/x/checkpoint", "--bundle", bad, "--pid-file", bad + "/pid",
                        "bad1"])
    bt.check(rc == 1 and err.strip() == "cove-oci: error: restore bad1: checkpoint record: root "
             "is not a cove image name", f"a record naming a path: rc={rc} {err!r}")
    # The tampered layer: one byte of a packed chain file flipped in place inside podman's own
    # export (its layout untouched), then podman restore --import.
    import shutil
    import tarfile
    shutil.copyfile(export, bad + "/tampered.tar")
    with tarfile.open(export) as t:
        members = [m for m in t.getmembers() if m.isfile() and m.size > 64 and
                   "/cove/archive/" in m.name and not m.name.endswith("manifest.json")]
    bt.check(members, "no packed chain file in the export")
    with open(bad + "/tampered.tar", "r+b") as f:
        f.seek(members[0].offset_data + 64)
        b = f.read(1)
        f.seek(members[0].offset_data + 64)
        f.write(bytes([b[0] ^ 0xff]))
    rc, out, err = podman("container", "restore", "--import", bad + "/tampered.tar",
                          "--name", "ck3", e=env2, timeout=600)
    bt.check(rc != 0 and ("SHA-256 does not match" in err or "archive: " in err),
             f"a tampered checkpoint: rc={rc} {err[-1500:]!r}")
    podman("rm", "-f", "ck3", e=env2)
    podman("rm", "-f", "ck1", check_rc=0)
    bt.check(not oci_sandboxes(), f"left after the checkpoint test: {oci_sandboxes()}")
    print("    a record naming ../../../etc refused with one line; a tampered layer refused: "
          + [l for l in err.splitlines() if "archive" in l][-1][-160:])


test_containers_checkpoint.time_limit = 600


def image_cache_roots():
    """The container roots cove-oci keeps as disks (oci-root/<digest> in cove's image cache)."""
    rc, out, err = run([COVE, "image", "ls", "--json"])
    if rc != 0 and "no images" in err:
        return []
    bt.check(rc == 0, f"cove image ls: {err!r}")
    return sorted(i["name"] for i in json.loads(out)["images"]
                  if i["name"].startswith("oci-root/"))


TESTS = [test_containers_ctr, test_containers_podman, test_containers_checkpoint]
