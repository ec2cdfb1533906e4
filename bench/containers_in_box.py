"""Runs inside the KVM box (bench/containers): what a container engine's user waits for.

- cove-oci on its own: from the `create` call to the container's first byte of output (create,
  then start, the process `sh -c 'echo ...'`), for a bundle whose root is the musl image's tree.
  The first container of that root makes its disk and implicit template; later ones find both.
- a cove reconnect of the same image: `cove exec` of a stopped `cove create --image` sandbox, to
  its first byte (the bar: goal create <= 1.5x reconnect);
- podman run with runc and with cove-oci, to the first byte and to the end, beside them.
Writes /work/out/containers.json."""
import ctypes
import json
import os
import shutil
import statistics
import subprocess
import time

COVE, OCI = "/work/cove", "/work/cove-oci"
RUNS = int(os.environ.get("BENCH_RUNS", "5"))
W = "/tmp/bench-ctr"
ENV = dict(os.environ, COVE_STATE_DIR=W + "/cove", COVE_RUN_DIR=W + "/cove-run",
           COVE_GUEST_DIR="/work", PATH="/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
ARCHIVE = "/work/oci/musl.oci.tar"
PHASES = []  # per cove-oci container: seconds of its create call, start call, then to output


def log(msg):
    print(f"[containers] {msg}", flush=True)


def run(argv, env=None, timeout=900):
    r = subprocess.run(argv, capture_output=True, timeout=timeout, env=env or ENV)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)[:200]}: rc={r.returncode} {r.stderr[-600:]!r}")
    return r.stdout.decode()


def podman_env():
    d = W + "/podman"
    os.makedirs(d, exist_ok=True)
    with open(d + "/storage.conf", "w") as f:
        f.write(f'[storage]\ndriver = "vfs"\nrunroot = "{d}/run"\ngraphroot = "{d}/graph"\n')
    with open(d + "/containers.conf", "w") as f:
        f.write(f"""[engine]
conmon_env_vars = ["PATH={ENV['PATH']}", "COVE_STATE_DIR={ENV['COVE_STATE_DIR']}",
                   "COVE_RUN_DIR={ENV['COVE_RUN_DIR']}", "COVE_GUEST_DIR=/work"]
cgroup_manager = "cgroupfs"
events_logger = "file"
# runc in the box: its root is an initramfs, where pivot_root cannot work
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


def first_byte(argv, env, timeout=900):
    """(seconds to the first byte on stdout, seconds to the end) of argv, which must exit 0."""
    t0 = time.monotonic()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    b = p.stdout.read(1)
    t1 = time.monotonic() - t0
    rest, err = p.communicate(timeout=timeout)
    t2 = time.monotonic() - t0
    if p.returncode != 0 or not b:
        raise RuntimeError(f"{' '.join(argv)[:200]}: rc={p.returncode} {err[-600:]!r}")
    return t1, t2


def disk_builds():
    """The roots cove-oci keeps as disks (oci-root/... in cove's image cache)."""
    r = subprocess.run([COVE, "image", "ls", "--json"], capture_output=True, env=ENV)
    if r.returncode != 0:
        return 0
    return sum(1 for i in json.loads(r.stdout)["images"] if i["name"].startswith("oci-root/"))


def bundle_for(root):
    b = W + "/bundle"
    os.makedirs(b, exist_ok=True)
    cfg = {"ociVersion": "1.0.2",
           "process": {"args": ["sh", "-c", "echo first-output"], "cwd": "/",
                       "user": {"uid": 0, "gid": 0}, "env": ["PATH=/usr/bin:/bin"]},
           "root": {"path": root}, "hostname": "bench", "mounts": []}
    with open(b + "/config.json", "w") as f:
        json.dump(cfg, f)
    return b


def oci_create_to_output(bundle, cid):
    """cove-oci create + start of one container, to its first byte; then it ends (its monitor is
    reaped here: this process is a subreaper) and is deleted."""
    root = W + "/oci-root"
    r, w = os.pipe()
    errf = open(W + "/create.err", "w+b")  # the monitor keeps it: not a pipe
    t0 = time.monotonic()
    c = subprocess.run([OCI, "--root", root, "--log", W + "/oci.log", "--log-format", "json",
                        "create", "--bundle", bundle, "--pid-file", W + "/pid", cid],
                       stdout=w, stderr=errf, env=ENV)
    t_create = time.monotonic() - t0
    os.close(w)
    if c.returncode != 0:
        os.close(r)
        errf.seek(0)
        raise RuntimeError(f"cove-oci create: {errf.read()[-600:]!r}")
    errf.close()
    run([OCI, "--root", root, "start", cid])
    t_start = time.monotonic() - t0
    b = os.read(r, 1)
    took = time.monotonic() - t0
    PHASES.append({"create_call": t_create, "start_call": t_start - t_create,
                   "start_to_first_byte": took - t_start})
    while os.read(r, 4096):
        pass
    os.close(r)
    pid = int(open(W + "/pid").read())
    os.waitpid(pid, 0)
    run([OCI, "--root", root, "delete", cid])
    if not b:
        raise RuntimeError("cove-oci: the container printed nothing")
    return took


def main():
    shutil.rmtree(W, ignore_errors=True)
    os.makedirs(W)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: cove-oci's monitors are reaped here
    if not os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
        os.makedirs("/sys/fs/cgroup", exist_ok=True)
        subprocess.run(["mount", "-t", "cgroup2", "none", "/sys/fs/cgroup"], check=False)
    penv = podman_env()
    out = run(["podman", "pull", "oci-archive:" + ARCHIVE + ":latest"], env=penv)
    image = out.strip().splitlines()[-1]
    root = run(["podman", "image", "mount", image], env=penv).strip()
    res = {"runs": RUNS, "box": "QEMU TCG (emulated CPU): absolute seconds are slow, compare "
                                "ratios"}

    # podman + runc, podman + cove-oci: to the first byte and to the end.
    for rt in ("runc", "cove"):
        t = []
        for i in range(RUNS + 1):
            t.append(first_byte(["podman", "--runtime", rt, "run", "--rm", "--pull", "never",
                                 "--network", "none", image, "echo", "x"], penv))
            log(f"podman --runtime {rt} run echo: first byte {t[-1][0]:.2f} s, end "
                f"{t[-1][1]:.2f} s")
        res[f"podman_{rt}"] = {"first_run_s": [round(x, 3) for x in t[0]],
                               "first_byte_median_s": round(statistics.median(x[0] for x in t[1:]), 3),
                               "end_median_s": round(statistics.median(x[1] for x in t[1:]), 3)}
    disks_after_podman = disk_builds()

    # cove-oci alone, on the image's tree as podman mounts it (the same root podman's runs
    # used: its disk and template are there already); then a new root (a copy with one more
    # file), whose first container makes both.
    bundle = bundle_for(root)
    t = [oci_create_to_output(bundle, f"b{i}") for i in range(RUNS + 1)]
    log(f"cove-oci create+start to first byte: {[round(x, 2) for x in t]}")
    # Where a container's time goes (the runs after the first): the calls, and within create
    # what cove-oci's log says (bundle, disk and sandbox, hostname and mounts; cove create).
    steady = PHASES[1:]
    res["cove_oci_phases_median_s"] = {
        k: round(statistics.median(p[k] for p in steady), 3) for k in steady[0]}
    inside = {"bundle": [], "disk and sandbox": [], "hostname and mounts": [],
              "cove create": []}
    with open(W + "/oci.log") as f:
        lines = [json.loads(line)["msg"] for line in f if line.startswith("{")]
    for m in [m for m in lines if ": created (sandbox" in m][1:]:
        for k in ("bundle", "disk and sandbox", "hostname and mounts"):
            inside[k].append(float(m.split(k + " ")[1].split(",")[0].split()[0]) / 1000)
    for m in [m for m in lines if ": cove create done in " in m][1:]:
        inside["cove create"].append(float(m.split(" in ")[1].split()[0]) / 1000)
    res["cove_oci_create_inside_median_s"] = {
        k: round(statistics.median(v), 3) for k, v in inside.items() if v}
    fresh = W + "/fresh-root"
    subprocess.run(["cp", "-a", root, fresh], check=True)
    with open(fresh + "/new-file", "w") as f:
        f.write("a new root\n")
    nb = bundle_for(fresh)
    before = disk_builds()
    t_new = oci_create_to_output(nb, "n0")
    t_again = oci_create_to_output(nb, "n1")
    after = disk_builds()
    log(f"a new root: first container {t_new:.2f} s (disk and template made), second "
        f"{t_again:.2f} s; disks {before} -> {after}")
    # The first container on podman's image mount (a root without podman's mount points:
    # another digest) makes its disk and template; the median is of the others.
    res["cove_oci"] = {"create_to_first_byte_s": [round(x, 3) for x in t],
                       "median_s": round(statistics.median(t[1:]), 3),
                       "new_root_first_s": round(t_new, 3), "new_root_second_s": round(t_again, 3),
                       "disks_made_by_new_root": after - before,
                       "disks_after_podman_runs": disks_after_podman}

    # A cove reconnect of the same image: cove create --image, stop, exec to the first byte.
    run([COVE, "image", "import", "oci-archive:" + ARCHIVE + ":latest"])
    run([COVE, "create", "rc", "--image", "musl:latest"])
    first_byte([COVE, "exec", "rc", "--", "echo", "x"], ENV)
    rec = []
    for i in range(RUNS):
        run([COVE, "stop", "rc"])
        rec.append(first_byte([COVE, "exec", "rc", "--", "echo", "x"], ENV)[0])
    log(f"cove reconnect (stopped, exec to first byte): {[round(x, 2) for x in rec]}")
    run([COVE, "rm", "rc"])
    res["cove_reconnect"] = {"first_byte_s": [round(x, 3) for x in rec],
                             "median_s": round(statistics.median(rec), 3)}

    ratio = res["cove_oci"]["median_s"] / res["cove_reconnect"]["median_s"]
    res["goals"] = {
        "oci_create_to_first_output_over_reconnect": {
            "value": round(ratio, 2), "goal": "<= 1.5", "met": ratio <= 1.5},
        "second_container_of_a_root_makes_no_disk": {
            "value": after - before, "goal": "== 1 (the first container's only)",
            "met": after - before == 1},
    }
    res["podman_cove_over_podman_runc_first_byte"] = round(
        res["podman_cove"]["first_byte_median_s"] / res["podman_runc"]["first_byte_median_s"], 2)
    os.makedirs("/work/out", exist_ok=True)
    with open("/work/out/containers.json", "w") as f:
        json.dump(res, f, indent=2)
    print(json.dumps(res["goals"]), flush=True)


main()
