#!/usr/bin/env python3
"""e2e: the local copies of sandboxes are a bounded cache of the store (issue 29).

One KVM box run is one host with real Linux guests, its store a real Ceph radosgw on this
machine's loopback (tests/lib/s3server.py), reached through kvm-box --forward. cove gc
--cache-max evicts the least recently used stopped sandbox, which then reconnects from the store
(a cove exec answers); store.json's cache_max bounds it without the flag; a running sandbox's
files are never evicted. tests/e2e/cache_box.py is what runs inside the box; it says what it
checks.
"""
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
sys.path.insert(0, HERE)
import s3server  # noqa: E402
import store_e2e  # noqa: E402
from store_e2e import Failure, check, store_dir  # noqa: E402


def main():
    inputs = store_e2e.guest_inputs("cache e2e", ("qemu-system-x86_64", "socat"))
    if not inputs:
        return 1
    kdir, rdir = inputs
    srv = s3server.Ceph()
    work = tempfile.mkdtemp(prefix="cove-cache-e2e.")
    t0 = time.monotonic()
    try:
        srv.start()
        srv.fleet_hex = secrets.token_hex(32)
        print(f"cache e2e: radosgw on https://127.0.0.1:{srv.rgw} ({srv.start_s:.1f} s)",
              flush=True)
        store = store_dir(srv, work, os.urandom(32), "host-a", srv.rgw)
        res = store_e2e.box(srv, work, "cache", kdir, rdir, ["--add", f"{store}:/work/store"],
                            {}, script="cache_box.py")
        check(res.get("ok"), f"the box run failed: {res.get('why', 'see above')}")
        print(f"cache e2e: usage {res['usage_before']} -> {res['usage_after1']} bytes under "
              f"--cache-max {res['bound1']}; s1 reconnected in {res['s1_reconnect_s']:.1f} s; "
              f"counters {res['final']}", flush=True)
        print(f"PASS: cache e2e ({time.monotonic() - t0:.0f} s: the least recently used "
              "stopped sandbox evicted and reconnected from the store; a running one never "
              "evicted)")
        return 0
    except (Failure, s3server.Failure, subprocess.CalledProcessError) as e:
        print(f"FAIL: cache e2e: {e}")
        return 1
    finally:
        srv.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
