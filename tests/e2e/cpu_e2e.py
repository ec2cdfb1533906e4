#!/usr/bin/env python3
"""e2e: CPU templates (issue 30). A chain moves between hosts whose CPUs differ, both ways, under
the shipped template; without it the move to the smaller CPU is refused, naming the feature.

Two KVM box runs at once, each one host with a real Linux guest, sharing nothing but a real Ceph
radosgw on this machine's loopback (tests/lib/s3server.py), which each reaches through kvm-box
--forward: "big" on the box's default CPU model (QEMU's EPYC: BMI1/2, ADX, MOVBE...), "small" on
the same model without BMI2 (kvm-box --cpu-extra ,-bmi2). The KVM box's nested guests see no
XSAVE, so no AVX at all: BMI2 is the feature that differs here where a fleet would see AVX2.
tests/e2e/cpu_box.py is what runs inside each box; it says what it checks.
"""
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
sys.path.insert(0, HERE)
import s3server  # noqa: E402
import store_e2e  # noqa: E402
from store_e2e import Failure, check, store_dir  # noqa: E402

CPU_EXTRA = {"big": "", "small": ",-bmi2"}


def box(srv, work, what, kdir, rdir, results):
    """Host WHAT's box run (store_e2e.box with cpu_box.py), its result or failure in results."""
    store = store_dir(srv, work, os.urandom(32), "host-" + what, srv.rgw)
    extra = ["--add", f"{store}:/work/store"]
    if CPU_EXTRA[what]:
        extra += ["--cpu-extra", CPU_EXTRA[what]]
    try:
        results[what] = store_e2e.box(srv, work, what, kdir, rdir, extra, {}, script="cpu_box.py")
    except Failure as e:
        results[what] = {"ok": False, "why": str(e)}


def main():
    inputs = store_e2e.guest_inputs("cpu e2e", ("qemu-system-x86_64", "socat"))
    if not inputs:
        return 1
    kdir, rdir = inputs
    srv = s3server.Ceph()
    work = tempfile.mkdtemp(prefix="cove-cpu-e2e.")
    try:
        srv.start()
        srv.fleet_hex = secrets.token_hex(32)
        print(f"cpu e2e: radosgw on https://127.0.0.1:{srv.rgw} ({srv.start_s:.1f} s); two "
              f"boxes at once, big (default CPU) and small (without bmi2)", flush=True)
        results = {}
        threads = []
        for what in ("big", "small"):
            d = os.path.join(work, what)
            os.mkdir(d)
            th = threading.Thread(target=box, args=(srv, d, what, kdir, rdir, results))
            th.start()
            threads.append(th)
        for th in threads:
            th.join()
        for what in ("big", "small"):
            r = results.get(what, {})
            check(r.get("ok"), f"host {what}: {r.get('why', 'the box run failed (see above)')}")
        big, small = results["big"], results["small"]
        check("bmi2" in big["hidden"] and "bmi2" in small["refusal"],
              f"hidden {big['hidden']}, refusal {small['refusal']!r}")
        print(f"cpu e2e: baseline-v2 hid {big['hidden']} on big; tpl moved big -> small -> "
              f"big; plain refused on small: {small['refusal']}", flush=True)
        print("PASS: cpu e2e (a templated chain moves both ways; without it, refused by name)")
        return 0
    except (Failure, s3server.Failure, subprocess.CalledProcessError) as e:
        print(f"FAIL: cpu e2e: {e}")
        return 1
    finally:
        srv.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
