#!/usr/bin/env python3
"""e2e: a sandbox outlives its host (issue 28), with a real guest, a real VMM and a real store.

On this machine: a real Ceph radosgw (memstore OSD, TLS from a test CA; tests/lib/s3server.py).
Two KVM box runs are the two hosts: each has its own state root, run directory and cache, and
reaches the store only through kvm-box --forward (a restricted user-mode network whose one
address, 10.0.2.100:PORT, is relayed to radosgw on 127.0.0.1). Host A's box, state root and all,
is gone before host B's boots. tests/e2e/store_box.py is what runs inside each box.

Checked here, outside the boxes:
- host A: s1 (100 MiB in guest RAM, a file on its disk) got a periodic upload and a final one;
- a scan of every object in the store finds s1's plain marker (the positive control) and never
  the marker planted in the encrypted sandbox s3, in RAM or on its disk;
- host B: 20 concurrent `cove exec` of s2 all answered, with one restore, and every blob only s2
  names fetched once (radosgw's own request log); s1's two files with host A's digests; s3
  refused with its KEK revoked, read back once granted.
"""
import hashlib
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
import s3server  # noqa: E402
import promcheck  # noqa: E402

COVE = os.path.abspath(os.environ.get("COVE", os.path.join(ROOT, "build", "cli", "cove")))
PREFIX = "e2e/"
KEK_PY = """import base64, sys
# The test's key command (tools/key-cmd-openssl's protocol): XOR with the KEK file; revoked = gone.
try:
    kek = open(sys.argv[1], "rb").read()
except OSError:
    sys.exit("kek.py: the KEK is revoked")
data = base64.b64decode(sys.stdin.readline())
print(base64.b64encode(bytes(b ^ kek[i % len(kek)] for i, b in enumerate(data))).decode())
"""


class Failure(Exception):
    pass


def check(ok, what):
    if not ok:
        raise Failure(what)


def write(path, data, mode=0o644):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def guest_inputs(what, tools):
    """(kernel dir, rootfs dir) once every tool is on PATH, else None with one FAIL line."""
    for tool in tools:
        if not shutil.which(tool):
            print(f"FAIL: {what} needs {tool} (tools/setup installs it)")
            return None
    kdir = subprocess.run([os.path.join(ROOT, "guest", "kernel", "build")], check=True,
                          capture_output=True, text=True).stdout.strip().splitlines()[-1]
    rdir = subprocess.run([os.path.join(ROOT, "guest", "rootfs", "build")], check=True,
                          capture_output=True, text=True).stdout.strip().splitlines()[-1]
    return kdir, rdir


def rgw_log_follow(srv, stop):
    """radosgw's own log as it grows (complete lines, a batch every 0.2 s) until stop is set;
    a log that starts over (radosgw restarted) is read from its top."""
    pos, buf = 0, ""
    path = os.path.join(srv.t, "log", "client.rgw.a.log")
    while not stop.is_set():
        try:
            if os.path.getsize(path) < pos:
                pos, buf = 0, ""
            with open(path, errors="replace") as f:
                f.seek(pos)
                buf += f.read()
                pos = f.tell()
        except OSError:
            pass
        lines, _, buf = buf.rpartition("\n")
        if lines:
            yield lines
        stop.wait(0.2)


def store_dir(srv, work, kek, host, relay_port):
    """What a host's configuration holds: store.json naming the store at the forwarded address,
    the test CA, credentials and fleet key files (0600), the key command and its KEK."""
    d = os.path.join(work, "store")
    os.mkdir(d)
    shutil.copyfile(srv.ca, os.path.join(d, "ca.pem"))
    write(os.path.join(d, "credentials.json"),
          json.dumps({"access_key_id": s3server.ACCESS, "secret_access_key": s3server.SECRET}),
          0o600)
    write(os.path.join(d, "fleet.key"), srv.fleet_hex + "\n", 0o600)
    write(os.path.join(d, "kek.py"), KEK_PY)
    write(os.path.join(d, "kek"), kek, 0o600)
    # Each host's own store.json: its host id, a short lease (20 s, 1 s of clock skew) so
    # the takeover test waits little. Host C lives in host B's box with a root of its own.
    for fn, hid, port in (("store.json", host, srv.rgw), ("store-c.json", "host-c", relay_port)):
        write(os.path.join(d, fn), json.dumps({
            "endpoint": f"https://10.0.2.100:{port}", "bucket": s3server.BUCKET,
            "prefix": PREFIX, "region": "us-east-1", "ca_file": "/work/store/ca.pem",
            "addressing": "path", "credentials_file": "/work/store/credentials.json",
            "fleet_key_file": "/work/store/fleet.key", "host_id": hid, "lease_ttl_s": 20,
            "clock_skew_s": 1,
            "key_providers": {"key-cmd": "key-cmd:python3 /work/store/kek.py /work/store/kek"}}))
    return d


class Relay:
    """Host C's own way to the store: socat on 127.0.0.1:PORT relaying to radosgw, which the
    test can cut (the listener and every connection through it killed at once, as a host's
    network going away) and heal. The box reaches it as 10.0.2.100:PORT (kvm-box --forward)."""

    def __init__(self, target):
        self.target = target
        self.proc = None
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self.events = []  # (monotonic, "cut" | "heal")

    def heal(self):
        # Its own process group: a cut kills the listener and its per-connection children.
        self.proc = subprocess.Popen(
            ["socat", f"TCP-LISTEN:{self.port},bind=127.0.0.1,fork,reuseaddr",
             f"TCP:127.0.0.1:{self.target}"], start_new_session=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        self.events.append((time.monotonic(), "heal"))

    def cut(self):
        if self.proc:
            try:
                os.killpg(self.proc.pid, 9)
            except ProcessLookupError:
                pass
            self.proc.wait()
            self.proc = None
        self.events.append((time.monotonic(), "cut"))

    def stop(self):
        if self.proc:
            self.cut()


def relay_watch(srv, relay, stop):
    """Cuts or heals host C's relay when host B (through its own relay) asks by a marked GET."""
    done = set()
    for lines in rgw_log_follow(srv, stop):
        for what in ("cut-c", "heal-c"):
            if what not in done and f"/cove-e2e-mark-{what} " in lines:
                done.add(what)
                (relay.cut if what == "cut-c" else relay.heal)()
                print(f"store e2e: host C's relay {what.split('-')[0]} on host B's request",
                      flush=True)


def box(srv, work, what, kdir, rdir, extra, env, script="store_box.py"):
    """One box run as host WHAT: SCRIPT (beside store_box.py, which it may import) run there
    with WHAT as its argument; its /work/out/WHAT.json is the result."""
    out = os.path.join(work, "out-" + what)
    reason = os.path.join(work, "reason-" + what)
    cmd = [os.path.join(ROOT, "tools", "kvm-box"), "--with-python", "--timeout", "2400",
           "--reason-file", reason, "--forward", str(srv.rgw),
           "--add", f"{COVE}:/work/cove",
           "--add", f"{kdir}/bzImage:/work/kernel/bzImage",
           "--add", f"{kdir}/vmlinux:/work/kernel/vmlinux",
           "--add", f"{rdir}/rootfs.ext4:/work/rootfs/rootfs.ext4",
           "--add", f"{os.path.join(HERE, 'store_box.py')}:/work/store_box.py",
           "--add", f"{os.path.join(ROOT, 'sdk', 'python')}:/work/sdk",
           "--out-dir", out]
    if script != "store_box.py":
        cmd += ["--add", f"{os.path.join(HERE, script)}:/work/{script}"]
    cmd += extra + ["--", "env"] + [f"{k}={v}" for k, v in env.items()] + \
        ["python3", f"/work/{script}", what]
    t0 = time.monotonic()
    rc = subprocess.run(cmd).returncode
    took = time.monotonic() - t0
    try:
        with open(os.path.join(out, what + ".json")) as f:
            res = json.load(f)
    except (OSError, ValueError) as e:
        cause = open(reason).read().strip() if os.path.exists(reason) else ""
        raise Failure(f"host {what}: no result from the box (kvm-box rc={rc}{', ' + cause if cause else ''}): {e}")
    check(rc == 0 and res.get("ok"), f"host {what}: the box run failed (rc={rc}, see above)")
    print(f"store e2e: host {what}'s box run took {took:.0f} s", flush=True)
    return res


def s3(srv, path, query=""):
    """GET from the store with curl's SigV4 (loopback only)."""
    url = f"https://127.0.0.1:{srv.rgw}/{s3server.BUCKET}{path}{query}"
    # curl 7.88 signs but does not send x-amz-content-sha256, which radosgw wants (STORE.md).
    r = subprocess.run(["curl", "-sS", "--fail", "--cacert", srv.ca, "-H",
                        "x-amz-content-sha256: " + hashlib.sha256(b"").hexdigest(), "--aws-sigv4",
                        "aws:amz:us-east-1:s3", "--user", f"{s3server.ACCESS}:{s3server.SECRET}",
                        url], capture_output=True, timeout=120)
    check(r.returncode == 0, f"GET {path}{query}: curl rc={r.returncode} {r.stderr[-300:]!r}")
    return r.stdout


def list_keys(srv):
    keys, token = [], None
    while True:
        # SigV4's canonical query (curl signs it as given): sorted, values percent-encoded.
        args = {"list-type": "2", "max-keys": "1000", "prefix": PREFIX}
        if token:
            args["continuation-token"] = token
        q = "?" + "&".join(f"{k}={urllib.parse.quote(v, safe='')}" for k, v in sorted(args.items()))
        xml = s3(srv, "/", q).decode()
        keys += [(k, int(s)) for k, s in
                 re.findall(r"<Key>([^<]+)</Key>.*?<Size>(\d+)</Size>", xml, re.S)]
        m = re.search(r"<NextContinuationToken>([^<]+)<", xml)
        if not m:
            return keys
        token = m.group(1)


def newest_manifest(srv, keys, name):
    gens = sorted(k for k, _ in keys if k.startswith(f"{PREFIX}sandboxes/{name}/gen/"))
    check(gens, f"no generation of {name} in the store")
    return json.loads(s3(srv, "/" + gens[-1]))


def scan(srv, plain, secret):
    """Every object in the store, whole: the plain marker must be found (else the scan proves
    nothing), the encrypted sandbox's never."""
    keys = list_keys(srv)
    found_plain, found_secret, total = [], [], 0
    for k, size in keys:
        data = s3(srv, "/" + k)
        check(len(data) == size, f"{k}: {len(data)} bytes read, the listing says {size}")
        total += size
        if plain.encode() in data:
            found_plain.append(k)
        if secret.encode() in data:
            found_secret.append(k)
    print(f"store e2e: scanned {len(keys)} objects, {total / 2**20:.1f} MiB: plain marker in "
          f"{len(found_plain)}, encrypted sandbox's marker in {len(found_secret)}", flush=True)
    check(found_plain, "positive control: the plain sandbox's marker is in no object "
          "(the scan cannot see guest memory)")
    check(not found_secret, f"the encrypted sandbox's plaintext is in the store: {found_secret}")
    return keys


def rgw_gets(srv):
    """GET request paths in radosgw's own log (beast's access lines)."""
    try:
        with open(os.path.join(srv.t, "log", "client.rgw.a.log"), errors="replace") as f:
            return re.findall(r'"GET (/[^ ?"]+)', f.read())
    except OSError:
        return []


def metrics_verdict(wb, b):
    """Host B's `cove metrics` file: promtool accepts it, node-exporter's textfile collector
    serves it, and Prometheus scrapes it; its series read back through Prometheus' API."""
    prom = os.path.join(wb, "out-b", "cove.prom")
    want = {}
    for st in b["metrics"]["states"].values():
        want[st] = want.get(st, 0) + 1
    queries = {f'cove_sandboxes{{state="{st}"}}': float(n) for st, n in want.items()}
    queries['cove_store_fetched_bytes_total{sandbox="s1"}'] = float(b["metrics"]["fetched_s1"])
    try:
        got, took = promcheck.check_file(prom, queries)
    except promcheck.Failure as e:
        raise Failure(f"metrics: {e}")
    print(f"store e2e: host B's cove metrics: promtool ok; Prometheus 2.42 scraped it through "
          f"node-exporter's textfile collector in {took:.1f} s and answered {got}", flush=True)


def partition_verdict(srv, b, relay):
    """Nothing host C wrote after its cut is in any committed generation: every manifest of y
    written under C's lease is at most the generation the store had at the cut, and the next
    one is host B's takeover."""
    p = b["partition"]
    check([e for _, e in relay.events] == ["heal", "cut", "heal"],
          f"host C's relay: {relay.events}")
    keys = list_keys(srv)
    gens = sorted(k for k, _ in keys if k.startswith(f"{PREFIX}sandboxes/y/gen/"))
    ms = {int(k.rsplit("/", 1)[1].split(".")[0]): json.loads(s3(srv, "/" + k)) for k in gens}
    by_c = sorted(g for g, m in ms.items() if m.get("lease") == p["epoch_c"])
    check(by_c and max(by_c) <= p["gen_at_cut"],
          f"y: generations under host C's lease {by_c}, the store had {p['gen_at_cut']} at the cut")
    nxt = ms.get(p["gen_at_cut"] + 1, {})
    check(nxt.get("lease", 0) > p["epoch_c"],
          f"y: generation {p['gen_at_cut'] + 1} is not host B's takeover: lease "
          f"{nxt.get('lease')}, host C's {p['epoch_c']}")
    print(f"store e2e: y's generations under host C's lease {by_c[0]}..{by_c[-1]} (the store "
          f"had {p['gen_at_cut']} at the cut), {p['gen_at_cut'] + 1} is host B's takeover "
          f"(lease {nxt['lease']}); {len(ms)} generations in all", flush=True)


def main():
    inputs = guest_inputs("store e2e", ("qemu-system-x86_64", "socat", "curl", "promtool",
                                         "prometheus", "prometheus-node-exporter"))
    if not inputs:
        return 1
    kdir, rdir = inputs
    srv = s3server.Ceph()
    relay = None
    work = tempfile.mkdtemp(prefix="cove-store-e2e.")
    try:
        srv.start()
        srv.fleet_hex = secrets.token_hex(32)
        print(f"store e2e: radosgw on https://127.0.0.1:{srv.rgw} ({srv.start_s:.1f} s); "
              f"the boxes reach it as 10.0.2.100:{srv.rgw}", flush=True)
        kek = os.urandom(32)
        marks = {"PLAIN_MARK": "COVE-PLAIN-" + secrets.token_hex(8),
                 "SECRET_MARK": "COVE-SECRET-" + secrets.token_hex(8)}
        only = os.environ.get("STORE_E2E_ONLY")
        if only:
            # One role of store_box.py alone in one box (host B's, with host C's relay): for
            # a look at one part, never what the suite runs.
            relay = Relay(srv.rgw)
            relay.heal()
            wo = os.path.join(work, "b")
            os.mkdir(wo)
            stop = threading.Event()
            watch = threading.Thread(target=relay_watch, args=(srv, relay, stop), daemon=True)
            watch.start()
            try:
                box(srv, wo, only, kdir, rdir,
                    ["--forward", str(relay.port),
                     "--add", f"{store_dir(srv, wo, kek, 'host-b', relay.port)}:/work/store"],
                    marks)
            finally:
                stop.set()
                watch.join()
            print(f"PASS: store e2e, role {only} alone")
            return 0
        wa = os.path.join(work, "a")
        os.mkdir(wa)
        relay = Relay(srv.rgw)
        relay.heal()
        a = box(srv, wa, "a", kdir, rdir,
                ["--add", f"{store_dir(srv, wa, kek, 'host-a', relay.port)}:/work/store"], marks)
        keys = scan(srv, marks["PLAIN_MARK"], marks["SECRET_MARK"])
        m1 = newest_manifest(srv, keys, "s1")
        check(m1["generation"] == a["s1_final_gen"] and a["s1_final_gen"] > a["s1_periodic_gen"],
              f"s1: newest manifest generation {m1['generation']}, host A saw periodic "
              f"{a['s1_periodic_gen']} and final {a['s1_final_gen']}")
        names, s2_files = {}, {}
        for n in ("s1", "s2", "s3"):
            files = newest_manifest(srv, keys, n)["files"]
            names[n] = {f["sha256"] for f in files}
            if n == "s2":
                s2_files = {f["sha256"]: f for f in files}
        only_s2 = names["s2"] - names["s1"] - names["s3"]
        wb = os.path.join(work, "b")
        os.mkdir(wb)
        with open(os.path.join(wb, "a.json"), "w") as f:
            json.dump(a, f)
        gets0 = len(rgw_gets(srv))
        stop = threading.Event()
        watch = threading.Thread(target=relay_watch, args=(srv, relay, stop), daemon=True)
        watch.start()
        try:
            box(srv, wb, "b", kdir, rdir,
                ["--forward", str(relay.port),
                 "--add", f"{store_dir(srv, wb, kek, 'host-b', relay.port)}:/work/store",
                 "--add", f"{wb}/a.json:/work/a.json"], marks)
        finally:
            stop.set()
            watch.join()
        b = json.load(open(os.path.join(wb, "out-b", "b.json")))
        gets = rgw_gets(srv)[gets0:]
        marks = [i for i, g in enumerate(gets) if "/cove-e2e-mark-s2-" in g]
        check(len(marks) == 2 and gets[marks[0]].endswith("-begin"),
              f"radosgw's log lacks host B's two marks around s2's execs: {marks}")
        gets = gets[marks[0]:marks[1]]
        # A GET the client retried (it logs each retry) is the one fetch sent again.
        retried = {d: sum(1 for l in b["s2_retries"] if d in l) for d in only_s2}
        per = {d: sum(1 for g in gets if g.endswith("/blobs/sha256/" + d)) for d in only_s2}
        lists = {d: sum(1 for g in gets if g.endswith("/chunks/sha256/" + d)) for d in only_s2}

        def once(d):
            """A whole blob: one GET. A memory layer fetched lazily (its chunk list read by the
            pull and by the one fetcher, each with the blob's header and run map): each chunk
            at most once, so at most 4 + its chunks."""
            if not lists[d]:
                return per[d] == 1 + retried[d]
            chunks = -(-s2_files[d]["size"] // 2**20)
            return lists[d] == 2 + retried[d] and per[d] <= 4 + chunks + retried[d]
        check(only_s2 and all(once(d) for d in only_s2),
              f"s2's own blobs were not fetched once each: GETs {per}, chunk lists {lists}, "
              f"client retries {b['s2_retries']}")
        starts = [e for e in b["s2_events"] if e.get("to") == "running"]
        print(f"store e2e: host B fetched each of s2's {len(only_s2)} own blobs once for 20 "
              f"concurrent execs ({sum(1 for d in only_s2 if lists[d])} by chunks, GETs {per}, "
              f"chunk lists {lists}); s2's events there: {b['s2_events']}", flush=True)
        check(len(starts) == 1, f"s2 should have started (restored) once on host B: {starts}")
        partition_verdict(srv, b, relay)
        metrics_verdict(wb, b)
        print("PASS: store e2e (host A -> store -> host B)")
        return 0
    except (Failure, s3server.Failure, subprocess.CalledProcessError) as e:
        print(f"FAIL: store e2e: {e}")
        try:
            print("radosgw log tail:\n" + srv.tail("rgw.out"))
        except Exception:  # noqa: BLE001 - best effort
            pass
        return 1
    finally:
        if relay:
            relay.stop()
        srv.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
