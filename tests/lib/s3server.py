#!/usr/bin/python3
"""A real S3 server for the store suite: single-node Ceph (ceph-mon, a memstore ceph-osd,
radosgw) in a private temp dir, on per-run free ports, served over TLS by radosgw's own beast
SSL endpoint with a test CA made by the openssl CLI (one daemon fewer than stunnel in front, and
a restarted radosgw serves TLS again on the same port by itself).

usage: s3server.py run -- CMD [ARG...]
  starts the server, runs CMD with COVE_STORE (store.json) and the variables below set, and
  tears everything down (every daemon killed by pid, the dir removed) whatever happens.
  COVE_TEST_S3_DIR        the temp dir
  COVE_TEST_OTHER_CA      a CA that did not sign the server's certificate
  COVE_TEST_RGW_BOUNCE    a script: kill -9 radosgw alone, start it again on the same port in
                          the background after $1 seconds (returns at once)
  COVE_TEST_RGW_PORT      radosgw's TLS port (store.json's endpoint)
  COVE_TEST_RGW_HTTP_PORT the same radosgw in plain http, for the one test of insecure_http
  COVE_TEST_RGW_START_S   seconds the server took to start (printed too)
Recipe: ../shared/testbed/s3-etcd-netns.md (section A). No mock: this is Ceph's radosgw.
"""
import json
import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import http.client

BUCKET = "cove-test"
ACCESS = "COVETESTACCESSKEY"
SECRET = "covetestsecretkey0123456789"
NEEDED = ["ceph-mon", "ceph-osd", "radosgw", "radosgw-admin", "ceph", "ceph-authtool",
          "monmaptool", "openssl", "curl"]


class Failure(Exception):
    pass


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_free(p):
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))
        return True
    except OSError:
        return False


def free_range(n):
    """n consecutive free ports for the OSD's messenger (ms bind port min/max), random so
    that parallel runs (plain and ASan) do not collide."""
    for _ in range(200):
        base = random.randrange(20000, 60000 - n)
        if all(port_free(base + i) for i in range(n)):
            return base
    raise Failure("no %d consecutive free ports on 127.0.0.1" % n)


def sh(cmd, **kw):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)
    if r.returncode != 0:
        raise Failure("%s failed (%d): %s" % (cmd[0], r.returncode, r.stdout.strip()[-400:]))
    return r.stdout


def make_ca(t, name):
    key, pem = os.path.join(t, name + ".key"), os.path.join(t, name + ".pem")
    sh(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-nodes", "-keyout", key, "-out", pem, "-subj", "/CN=cove test " + name, "-days", "2"])
    return key, pem


def make_server_cert(t, ca_key, ca_pem):
    key, csr, pem = (os.path.join(t, "server." + e) for e in ("key", "csr", "pem"))
    ext = os.path.join(t, "server.ext")
    with open(ext, "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,IP:10.0.2.100,DNS:localhost,DNS:s3.test,DNS:*.s3.test\n")
    sh(["openssl", "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-nodes", "-keyout", key, "-out", csr, "-subj", "/CN=127.0.0.1"])
    sh(["openssl", "x509", "-req", "-in", csr, "-CA", ca_pem, "-CAkey", ca_key,
        "-CAcreateserial", "-out", pem, "-days", "2", "-extfile", ext])
    return key, pem


CONF = """[global]
fsid = {fsid}
mon host = v2:127.0.0.1:{mon}
mon initial members = a
public addr = 127.0.0.1
cluster addr = 127.0.0.1
ms bind msgr1 = false
ms bind port min = {pmin}
ms bind port max = {pmax}
auth cluster required = none
auth service required = none
auth client required = none
auth allow insecure global id reclaim = false
ms mon client mode = crc
ms client mode = crc
run dir = {t}/run
admin socket = {t}/run/$cluster-$name.asok
log file = {t}/log/$name.log
keyring = {t}/keyring
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 1
osd pool default pgp num = 1
osd pool default pg autoscale mode = off
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
mon max pg per osd = 1000
osd crush chooseleaf type = 0
mon data avail warn = 1
mon data avail crit = 0
[mon]
paxos propose interval = 0.01
paxos min wait = 0.001
mon tick interval = 1
[mon.a]
mon data = {t}/mon
[osd.0]
osd data = {t}/osd0
osd objectstore = memstore
memstore device bytes = {osd_bytes}
[client.rgw.a]
rgw frontends = beast endpoint=127.0.0.1:{http} ssl_endpoint=127.0.0.1:{rgw} ssl_certificate={t}/server.pem ssl_private_key={t}/server.key
rgw data = {t}/rgw
rgw zone = default
rgw dns name = s3.test
"""

BOUNCE = """#!/bin/sh
# kill -9 radosgw alone (never the memstore OSD), start it again on the same port, return at once
T={t}
p=$(cat "$T/rgw.pid")
kill -9 "$p" 2>/dev/null
# gone, or a zombie of s3server.py (kill -0 succeeds on a zombie)
while kill -0 "$p" 2>/dev/null && ! grep -q '^State:.*Z' "/proc/$p/status" 2>/dev/null; do
	sleep 0.05
done
echo "s3server: radosgw $p killed" >&2
# $1: seconds radosgw stays down before it is started again
setsid sh -c 'sleep "$1"; exec radosgw -c "$2/ceph.conf" -n client.rgw.a -f' sh "${{1:-0}}" "$T" \
	>>"$T/log/rgw.out" 2>&1 </dev/null &
echo $! >"$T/rgw.pid"
echo $! >>"$T/all.pids"
"""


class Ceph:
    def __init__(self, osd_mib=1024):
        self.t = None
        self.pids = []
        self.osd_bytes = osd_mib << 20  # the memstore OSD's size: RAM, used as filled

    def spawn(self, name, cmd):
        log = open(os.path.join(self.t, "log", name + ".out"), "ab")
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True)
        log.close()
        self.pids.append(p.pid)
        with open(os.path.join(self.t, name + ".pid"), "w") as f:
            f.write("%d\n" % p.pid)
        with open(os.path.join(self.t, "all.pids"), "a") as f:
            f.write("%d\n" % p.pid)
        return p

    def start(self):
        missing = [n for n in NEEDED if shutil.which(n) is None]
        if missing:
            raise Failure("the store suite needs a real Ceph radosgw; missing: %s "
                          "(tools/setup installs radosgw ceph-mon ceph-osd)" % " ".join(missing))
        t0 = time.monotonic()
        self.t = tempfile.mkdtemp(prefix="cove-s3.")
        t = self.t
        for d in ("mon", "osd0", "run", "log", "rgw"):
            os.mkdir(os.path.join(t, d))
        ca_key, self.ca = make_ca(t, "ca")
        _, self.other_ca = make_ca(t, "other-ca")
        make_server_cert(t, ca_key, self.ca)
        ports = set()
        while len(ports) < 3:
            ports.add(free_port())
        self.mon, self.rgw, self.http = sorted(ports)
        pmin = free_range(8)
        fsid = open("/proc/sys/kernel/random/uuid").read().strip()
        self.conf = os.path.join(t, "ceph.conf")
        with open(self.conf, "w") as f:
            f.write(CONF.format(fsid=fsid, mon=self.mon, pmin=pmin, pmax=pmin + 7, t=t,
                                osd_bytes=self.osd_bytes,
                                rgw=self.rgw, http=self.http))
        c = ["-c", self.conf]
        sh(["ceph-authtool", "--create-keyring", t + "/keyring", "--gen-key", "-n", "mon.",
            "--cap", "mon", "allow *"])
        sh(["monmaptool", "--create", "--fsid", fsid, "--addv", "a",
            "[v2:127.0.0.1:%d]" % self.mon, t + "/monmap"])
        sh(["ceph-mon"] + c + ["--mkfs", "-i", "a", "--monmap", t + "/monmap", "--keyring",
                               t + "/keyring"])
        self.spawn("mon", ["ceph-mon"] + c + ["-i", "a", "-f"])
        osd_uuid = open("/proc/sys/kernel/random/uuid").read().strip()
        sh(["ceph"] + c + ["--connect-timeout", "60", "osd", "new", osd_uuid])
        sh(["ceph-osd"] + c + ["-i", "0", "--mkfs", "--osd-uuid", osd_uuid])
        self.spawn("osd", ["ceph-osd"] + c + ["-i", "0", "-f"])
        self.spawn("rgw", ["radosgw"] + c + ["-n", "client.rgw.a", "-f"])
        with open(os.path.join(t, "rgw-bounce.sh"), "w") as f:
            f.write(BOUNCE.format(t=t))
        os.chmod(os.path.join(t, "rgw-bounce.sh"), 0o700)
        self.wait_https(120)
        sh(["radosgw-admin"] + c + ["user", "create", "--uid=tester", "--display-name=tester",
                                    "--access-key=" + ACCESS, "--secret-key=" + SECRET])
        self.create_bucket()
        self.write_config()
        self.start_s = time.monotonic() - t0
        return self

    def wait_https(self, limit):
        ctx = ssl.create_default_context(cafile=self.ca)
        end = time.monotonic() + limit
        last = ""
        while time.monotonic() < end:
            try:
                h = http.client.HTTPSConnection("127.0.0.1", self.rgw, context=ctx, timeout=2)
                h.request("GET", "/")
                h.getresponse().read()
                h.close()
                return
            except (OSError, http.client.HTTPException) as e:
                last = str(e)
            time.sleep(0.1)
        raise Failure("radosgw did not answer https on 127.0.0.1:%d in %d s (%s); its log: %s"
                      % (self.rgw, limit, last, self.tail("rgw.out")))

    def tail(self, name):
        try:
            with open(os.path.join(self.t, "log", name), errors="replace") as f:
                return " | ".join(f.read().strip().splitlines()[-5:])
        except OSError:
            return "(none)"

    def create_bucket(self):
        netrc = os.path.join(self.t, "netrc")
        with open(netrc, "w") as f:
            f.write("machine 127.0.0.1 login %s password %s\n" % (ACCESS, SECRET))
        os.chmod(netrc, 0o600)
        # the user may take a moment to be visible to radosgw: retry a few times
        for _ in range(100):
            code = sh(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--cacert", self.ca,
                       "--aws-sigv4", "aws:amz:us-east-1:s3", "--netrc-file", netrc,
                       "-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD", "-X", "PUT",
                       "https://127.0.0.1:%d/%s" % (self.rgw, BUCKET)])
            if code in ("200", "409"):
                return
            time.sleep(0.1)
        raise Failure("creating bucket %s: HTTP %s" % (BUCKET, code))

    def write_config(self):
        cred = os.path.join(self.t, "credentials.json")
        fd = os.open(cred, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, json.dumps({"access_key_id": ACCESS, "secret_access_key": SECRET}).encode())
        os.close(fd)
        self.store_json = os.path.join(self.t, "store.json")
        with open(self.store_json, "w") as f:
            json.dump({"endpoint": "https://127.0.0.1:%d" % self.rgw, "bucket": BUCKET,
                       "prefix": "test/", "region": "us-east-1", "ca_file": self.ca,
                       "addressing": "path", "credentials_file": cred}, f)

    def env(self):
        e = dict(os.environ)
        for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
            e.pop(k, None)
        e.update({"COVE_STORE": self.store_json, "COVE_TEST_S3_DIR": self.t,
                  "COVE_TEST_OTHER_CA": self.other_ca,
                  "COVE_TEST_RGW_BOUNCE": os.path.join(self.t, "rgw-bounce.sh"),
                  "COVE_TEST_RGW_PORT": str(self.rgw),
                  "COVE_TEST_RGW_HTTP_PORT": str(self.http),
                  "COVE_TEST_RGW_START_S": "%.2f" % self.start_s})
        return e

    def stop(self):
        if not self.t:
            return
        pids = set(self.pids)
        try:
            with open(os.path.join(self.t, "all.pids")) as f:
                pids |= {int(x) for x in f.read().split()}
        except OSError:
            pass
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)  # memstore: nothing to flush, nothing to keep
            except ProcessLookupError:
                pass
        end = time.monotonic() + 10
        for p in pids:
            while time.monotonic() < end:
                try:
                    if os.waitpid(p, os.WNOHANG)[0] == p:
                        break
                except ChildProcessError:
                    try:
                        os.kill(p, 0)
                    except ProcessLookupError:
                        break
                time.sleep(0.05)
        shutil.rmtree(self.t, ignore_errors=True)
        self.t = None


def main():
    if len(sys.argv) < 4 or sys.argv[1] != "run" or sys.argv[2] != "--":
        print(__doc__, file=sys.stderr)
        return 2

    def term(sig, frame):
        raise KeyboardInterrupt("signal %d" % sig)

    signal.signal(signal.SIGTERM, term)
    srv = Ceph()
    child = None
    try:
        srv.start()
        print("s3server: Ceph radosgw (memstore) up on https://127.0.0.1:%d in %.2f s"
              % (srv.rgw, srv.start_s), flush=True)
        child = subprocess.Popen(sys.argv[3:], env=srv.env())
        return child.wait()
    except Failure as e:
        print("s3server: FAILED: %s" % e, file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:
        print("s3server: interrupted (%s): tearing down" % e, file=sys.stderr)
        return 1
    finally:
        if child and child.poll() is None:
            child.kill()
            child.wait()
        t0 = time.monotonic()
        srv.stop()
        print("s3server: torn down in %.2f s" % (time.monotonic() - t0), flush=True)


if __name__ == "__main__":
    sys.exit(main())
