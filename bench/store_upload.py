#!/usr/bin/python3
"""bench/store_upload (issue 29): upload throughput of one large layer, cove against Debian's
aws-cli 2.9 (`/usr/bin/aws s3 cp`), the same file to the same radosgw from the same host, both
with 8 MiB parts and 4 in flight. Goal: cove's throughput / aws's >= 1.0.

cove's side is `cove-store put FILE KEY` (cli/store_put.c): the code path a generation's layers
go up by (s3_upload_fd with the store's part size and parallelism, as sync.c's send_blob). Each
run is timed from the exec of the command to its exit (wall clock, start-up included on both
sides); the start-up of each tool alone is measured too (a 1 KiB file, `fixed_s`) and reported
beside it. Runs alternate (the order flips every pair: ABBA), every uploaded object is checked
with a HEAD (size and multipart ETag part count), the warm-up objects are read back whole and
compared byte for byte, and each object is deleted and radosgw's garbage collection run before
the next upload (the memstore OSD holds 1 GiB).

Usage: bench/store_upload [--runs N] [--mib M] [--out FILE|-] [--quick]
  starts its own radosgw (tests/lib/s3server.py); JSON on stdout, kept in
  bench/results-store-upload.json. bench/fleet calls run_upload_bench(srv) on its own radosgw.
"""
import argparse
import datetime
import hashlib
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
import s3server  # noqa: E402

AWS = "/usr/bin/aws"  # Debian's aws-cli 2.9: never another `aws` on PATH
COVE_STORE = os.path.abspath(os.environ.get(
    "COVE_STORE_BIN", os.path.join(ROOT, "build", "cli", "cove-store")))
PART_MIB = 8
PARALLEL = 4


def log(msg):
    print("[store_upload] " + msg, file=sys.stderr, flush=True)


class BenchError(Exception):
    pass


def aws_version():
    if not os.path.exists(AWS):
        raise BenchError(f"{AWS} is missing (tools/setup installs Debian's awscli)")
    out = subprocess.run([AWS, "--version"], capture_output=True, text=True, timeout=60)
    v = (out.stdout + out.stderr).strip()
    if not v.startswith("aws-cli/2.9."):
        raise BenchError(f"{AWS} --version says {v!r}, not aws-cli/2.9")
    return v


def make_file(path, mib):
    with open(path, "wb") as f:
        for _ in range(mib):
            f.write(os.urandom(1 << 20))


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(1 << 20)
            if not b:
                return h.hexdigest()
            h.update(b)


class Store:
    """The server as both tools and the checks see it: endpoint, bucket, CA, credentials."""

    def __init__(self, srv, work):
        cfg = json.load(open(srv.store_json))
        cred = json.load(open(cfg["credentials_file"]))
        self.endpoint = cfg["endpoint"]
        self.bucket = cfg["bucket"]
        self.region = cfg.get("region", "us-east-1")
        self.ca = cfg["ca_file"]
        self.ceph_conf = srv.conf
        self.access, self.secret = cred["access_key_id"], cred["secret_access_key"]
        self.work = work
        # cove's own store.json: the same server, its own prefix
        self.prefix = "bench-upload/"
        cfg["prefix"] = self.prefix
        self.store_json = os.path.join(work, "store.json")
        with open(self.store_json, "w") as f:
            json.dump(cfg, f)
        # curl (HEAD, GET, DELETE) reads the secret from a 0600 netrc, never from argv
        self.netrc = os.path.join(work, "netrc")
        fd = os.open(self.netrc, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        host = self.endpoint.split("//", 1)[1].split(":")[0]
        os.write(fd, f"machine {host} login {self.access} password {self.secret}\n".encode())
        os.close(fd)
        # aws: a private config (8 MiB parts, 4 in flight), no ~/.aws, credentials by env
        self.aws_env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        self.aws_env.update({
            "AWS_CONFIG_FILE": os.path.join(work, "aws-config"),
            "AWS_SHARED_CREDENTIALS_FILE": os.path.join(work, "aws-credentials-none"),
            "AWS_ACCESS_KEY_ID": self.access, "AWS_SECRET_ACCESS_KEY": self.secret,
            "AWS_CA_BUNDLE": self.ca, "AWS_DEFAULT_REGION": self.region,
            "AWS_PAGER": "", "HOME": work})
        for k, v in (("default.region", self.region),
                     ("default.s3.multipart_chunksize", f"{PART_MIB}MB"),
                     ("default.s3.max_concurrent_requests", str(PARALLEL))):
            subprocess.run([AWS, "configure", "set", k, v], env=self.aws_env, check=True,
                           timeout=60)
        self.aws_config = open(self.aws_env["AWS_CONFIG_FILE"]).read()

    def url(self, key):
        return f"{self.endpoint}/{self.bucket}/{key}"

    def curl(self, args, key):
        return subprocess.run(
            ["curl", "-sS", "--cacert", self.ca, "--aws-sigv4",
             f"aws:amz:{self.region}:s3", "--netrc-file", self.netrc,
             "-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD"] + args + [self.url(key)],
            capture_output=True, text=True, timeout=300)

    def head(self, key):
        r = self.curl(["-I"], key)
        if r.returncode:
            raise BenchError(f"HEAD {key}: curl: {r.stderr.strip()}")
        status = r.stdout.splitlines()[0] if r.stdout else ""
        hdr = {}
        for line in r.stdout.splitlines()[1:]:
            if ":" in line:
                k, v = line.split(":", 1)
                hdr[k.strip().lower()] = v.strip()
        if " 200" not in status:
            raise BenchError(f"HEAD {key}: {status}")
        return int(hdr.get("content-length", -1)), hdr.get("etag", "").strip('"')

    def get_sha256(self, key, path):
        r = self.curl(["-f", "-o", path], key)
        if r.returncode:
            raise BenchError(f"GET {key}: curl: {r.stderr.strip()}")
        d = sha256_file(path)
        os.unlink(path)
        return d

    def delete(self, key):
        r = self.curl(["-f", "-X", "DELETE"], key)
        if r.returncode:
            raise BenchError(f"DELETE {key}: curl: {r.stderr.strip()}")
        # deleted tails wait for radosgw's gc (hours by default): run it now
        subprocess.run(["radosgw-admin", "-c", self.ceph_conf, "gc", "process",
                        "--include-all"], capture_output=True, timeout=300)

    def put_cove(self, path, key):
        """key relative to self.prefix; (wall s, CPU s (user + sys), cove's own JSON line)"""
        c0, t0 = child_cpu_s(), time.perf_counter()
        r = subprocess.run([COVE_STORE, "put", path, key, "--config", self.store_json],
                           capture_output=True, text=True, timeout=600)
        wall, cpu = time.perf_counter() - t0, child_cpu_s() - c0
        if r.returncode:
            raise BenchError(f"cove-store put: exit {r.returncode}: {r.stderr.strip()[-400:]}")
        return wall, cpu, json.loads(r.stdout.strip().splitlines()[-1])

    def put_aws(self, path, key):
        """key relative to the bucket; (wall s, CPU s (user + sys), None)"""
        c0, t0 = child_cpu_s(), time.perf_counter()
        r = subprocess.run([AWS, "s3", "cp", path, f"s3://{self.bucket}/{key}",
                            "--endpoint-url", self.endpoint, "--no-progress"],
                           env=self.aws_env, capture_output=True, text=True, timeout=600)
        wall, cpu = time.perf_counter() - t0, child_cpu_s() - c0
        if r.returncode:
            raise BenchError(f"aws s3 cp: exit {r.returncode}: {r.stderr.strip()[-400:]}")
        return wall, cpu, None


def child_cpu_s():
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def parts_of(etag):
    m = re.fullmatch(r"[0-9a-f]{32}-(\d+)", etag)
    return int(m.group(1)) if m else None


def run_upload_bench(srv, runs=5, mib=256, fixed_runs=3, work_dir="/var/tmp"):
    """Against a started s3server.Ceph (srv): the JSON-able result, with "goals"."""
    version = aws_version()
    if not os.path.exists(COVE_STORE):
        raise BenchError(f"{COVE_STORE} is missing (ninja -C build)")
    work = tempfile.mkdtemp(prefix="cove-upload.", dir=work_dir)
    try:
        st = Store(srv, work)
        big, tiny, dl = (os.path.join(work, n) for n in ("layer.bin", "tiny.bin", "get.bin"))
        log(f"making {mib} MiB of random bytes in {big}")
        make_file(big, mib)
        with open(tiny, "wb") as f:
            f.write(os.urandom(1024))
        size = mib << 20
        want_parts = -(-size // (PART_MIB << 20))
        digest = sha256_file(big)
        checks = []

        def one(tool, name, path, nbytes, whole=False):
            key = st.prefix + name
            if tool == "cove":
                wall, cpu, line = st.put_cove(path, name)
            else:
                wall, cpu, line = st.put_aws(path, key)
            got, etag = st.head(key)
            c = {"tool": tool, "key": key, "size": got, "etag_parts": parts_of(etag)}
            if got != nbytes:
                raise BenchError(f"{tool}: {key} reads back {got} bytes, not {nbytes}")
            if nbytes == size and c["etag_parts"] != want_parts:
                raise BenchError(f"{tool}: {key} has ETag {etag}: not {want_parts} parts")
            if whole:
                c["sha256_equal"] = st.get_sha256(key, dl) == digest
                if not c["sha256_equal"]:
                    raise BenchError(f"{tool}: {key} does not read back equal")
            checks.append(c)
            st.delete(key)
            return wall, cpu, line

        # warm-up (not recorded): each tool once, read back whole
        for tool in ("cove", "aws"):
            one(tool, f"{tool}/warm", big, size, whole=True)
        fixed = {"cove": [], "aws": []}
        for i in range(fixed_runs):
            for tool in ("cove", "aws"):
                fixed[tool].append(one(tool, f"{tool}/tiny-{i}", tiny, 1024)[0])
        walls = {"cove": [], "aws": []}
        cpus = {"cove": [], "aws": []}
        cove_own = []
        for i in range(runs):
            order = ("cove", "aws") if i % 2 == 0 else ("aws", "cove")
            for tool in order:
                wall, cpu, line = one(tool, f"{tool}/run-{i}", big, size)
                walls[tool].append(round(wall, 3))
                cpus[tool].append(round(cpu, 3))
                if line:
                    cove_own.append(line["seconds"])
                    if line["retries"]:
                        log(f"cove run {i}: {line['retries']} retries")
            log(f"run {i}: cove {walls['cove'][-1]:.2f} s, aws {walls['aws'][-1]:.2f} s")
        med = {t: statistics.median(v) for t, v in walls.items()}
        fmed = {t: statistics.median(v) for t, v in fixed.items()}
        ratio = med["aws"] / med["cove"]  # throughput cove / throughput aws
        ex = {t: med[t] - fmed[t] for t in med}
        ratio_ex = ex["aws"] / ex["cove"] if ex["cove"] > 0 else None
        return {
            "bench": "store_upload",
            "what": f"one {mib} MiB file of random bytes uploaded to radosgw over TLS on "
                    f"loopback: cove-store put (s3_upload_fd) against {AWS} s3 cp, "
                    f"{PART_MIB} MiB parts, {PARALLEL} in flight, wall clock of each command",
            "file_mib": mib, "part_mib": PART_MIB, "parallel": PARALLEL, "runs": runs,
            "cove": {"wall_s": walls["cove"], "median_s": round(med["cove"], 3),
                     "mib_per_s": round(mib / med["cove"], 1),
                     "own_upload_s": cove_own, "cpu_s": cpus["cove"],
                     "fixed_s": [round(x, 3) for x in fixed["cove"]]},
            "awscli": {"wall_s": walls["aws"], "median_s": round(med["aws"], 3),
                       "mib_per_s": round(mib / med["aws"], 1), "cpu_s": cpus["aws"],
                       "version": version,
                       "config": st.aws_config,
                       "fixed_s": [round(x, 3) for x in fixed["aws"]]},
            "upload_vs_awscli_without_fixed_cost": round(ratio_ex, 3) if ratio_ex else None,
            "checks": checks,
            "goals": {"upload_vs_awscli": {"value": round(ratio, 3), "goal": 1.0,
                                           "met": ratio >= 1.0}},
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


def quick():
    missing = [p for p in (COVE_STORE,) if not os.path.exists(p)]
    missing += [t for t in s3server.NEEDED if not shutil.which(t)]
    try:
        v = aws_version()
    except (BenchError, OSError, subprocess.SubprocessError) as e:
        missing.append(str(e))
        v = None
    if missing:
        print(json.dumps({"errors": [f"missing: {m}" for m in missing]}))
        return 1
    print(json.dumps({"quick": f"inputs checked (cove-store, Ceph, {v}), nothing uploaded"}))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results-store-upload.json"))
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    if a.quick:
        return quick()
    srv = s3server.Ceph()
    load0 = os.getloadavg()
    try:
        srv.start()
        doc = run_upload_bench(srv, runs=a.runs, mib=a.mib)
    except (BenchError, s3server.Failure) as e:
        print(json.dumps({"bench": "store_upload", "errors": [str(e)]}))
        return 1
    finally:
        srv.stop()
    doc["metadata"] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                                 capture_output=True, text=True).stdout.strip(),
        "nproc": os.cpu_count(), "loadavg_start": load0, "loadavg_end": os.getloadavg(),
        "curl": subprocess.run(["curl", "--version"], capture_output=True,
                               text=True).stdout.splitlines()[0]}
    text = json.dumps(doc, indent=2)
    if a.out != "-":
        with open(a.out, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
