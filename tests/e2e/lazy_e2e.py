#!/usr/bin/env python3
"""e2e: a reconnect from the store starts before the whole chain is fetched (issue 29).

A real Ceph radosgw on this machine (tests/lib/s3server.py), one KVM box with two hosts in it
(their own state roots, image caches and host ids), a real Linux guest. tests/e2e/lazy_box.py
is what runs in the box and says what it checks there. Checked here:
- x's chain in the store holds more than 300 MiB (the newest manifest's blobs, by size);
- host B's first exec answered having fetched less than half of it;
- the guest's SHA-256 of its 192 MiB after the lazy restore (read across a 10 s radosgw outage)
  equals the one host A took before the stop; z likewise after a failed fetch and a restart.
The host kills radosgw (kill -9, restarted on the same port N s later) when the box asks with a
GET of /cove-e2e-mark-bounce-N.
"""
import json
import os
import re
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
from store_e2e import Failure, check, list_keys, store_dir  # noqa: E402


def bounce_watch(srv, stop, done):
    """Bounces radosgw when the box asks: a marked GET in radosgw's own log."""
    bounce = os.path.join(srv.t, "rgw-bounce.sh")
    for lines in store_e2e.rgw_log_follow(srv, stop):
        for m in re.finditer(r"/cove-e2e-mark-bounce-(\d+) ", lines):
            if m.group(0) not in done:
                done.append(m.group(0))
                subprocess.run(["sh", bounce, m.group(1)], check=False)
                print(f"lazy e2e: radosgw killed, back in {m.group(1)} s (the box asked)",
                      flush=True)


def main():
    inputs = store_e2e.guest_inputs("lazy e2e", ("qemu-system-x86_64", "socat", "curl"))
    if not inputs:
        return 1
    kdir, rdir = inputs
    srv = s3server.Ceph(osd_mib=4096)  # 1 GiB guests' chains, twice, and their images
    work = tempfile.mkdtemp(prefix="cove-lazy-e2e.")
    stop = threading.Event()
    try:
        srv.start()
        srv.fleet_hex = secrets.token_hex(32)
        print(f"lazy e2e: radosgw on https://127.0.0.1:{srv.rgw} ({srv.start_s:.1f} s)",
              flush=True)
        store = store_dir(srv, work, os.urandom(32), "host-a", srv.rgw)
        # Host B's configuration: the same store and fleet, its own host id.
        cfg = json.load(open(os.path.join(store, "store.json")))
        cfg["host_id"] = "host-b"
        with open(os.path.join(store, "store-b.json"), "w") as f:
            json.dump(cfg, f)
        done = []
        watch = threading.Thread(target=bounce_watch, args=(srv, stop, done), daemon=True)
        watch.start()
        d = os.path.join(work, "box")
        os.mkdir(d)
        r = store_e2e.box(srv, d, "ab", kdir, rdir, ["--add", f"{store}:/work/store"], {},
                          script="lazy_box.py")
        check(len(done) == 2, f"the box asked for two radosgw outages, the host saw {done}")
        keys = list_keys(srv)
        sizes = {k.rsplit("/", 1)[1]: s for k, s in keys if "/blobs/sha256/" in k}
        # The generation host B took over: the files its first exec pulled (A's last ones).
        m = json.loads(store_e2e.s3(srv, f"/{store_e2e.PREFIX}sandboxes/x/gen/"
                                         f"{r['x_gen_b']:020d}.json"))
        total = sum(sizes.get(f["sha256"], 0) for f in m["files"])
        images = sum(sizes.get(f["sha256"], 0) for f in m["files"]
                     if f["name"] in ("kernel", "initrd") or f["name"].endswith("-base"))
        big = max((sizes.get(f["sha256"], 0), f["name"], f["size"]) for f in m["files"])
        print(f"lazy e2e: x's generation {r['x_gen_b']} holds {total / 2**20:.1f} MiB in the "
              f"store ({images / 2**20:.1f} MiB of it the kernel and root image); its largest "
              f"blob: {big[1]}, {big[0] / 2**20:.1f} MiB for a file of {big[2] / 2**20:.0f} MiB",
              flush=True)
        before = r["fetched_before_first_exec"]
        print(f"lazy e2e: x's chain holds {total / 2**20:.1f} MiB in the store; host B's first "
              f"exec answered after {r['first_exec_s']} s having fetched {before / 2**20:.1f} "
              f"MiB ({100 * before / total:.1f} %); {r['fetched_total'] / 2**20:.1f} MiB "
              f"fetched in all", flush=True)
        check(total - images > 180 * 2**20, f"x's chain holds only {total - images} bytes")
        check(before < total / 2, f"the first exec waited for {before} of {total} bytes")
        check(r["x_sum_b"] == r["x_sum"], f"x: the guest's SHA-256 after the lazy restore "
              f"{r['x_sum_b']} differs from host A's {r['x_sum']}")
        check(r["z_sum_b"] == r["z_sum"], f"z: SHA-256 {r['z_sum_b']} after the restart, host "
              f"A's {r['z_sum']}")
        with open(os.path.join(work, "result.json"), "w") as f:
            json.dump(dict(r, chain_total=total, images=images), f)
        if os.environ.get("LAZY_E2E_RESULT"):
            shutil.copyfile(os.path.join(work, "result.json"), os.environ["LAZY_E2E_RESULT"])
        keys = [k for k, _ in list_keys(srv)]
        check(any("/templates/tx/gen/" in k for k in keys),
              f"no manifest of template tx in the store: {[k for k in keys if 'tx' in k]}")
        print(f"lazy e2e: template tx made on host A: host B fetched it once "
              f"({r['template_fetched'] / 2**20:.1f} MiB) and created two sandboxes from it in "
              f"{r['template_creates_s']} s", flush=True)
        print(f"PASS: lazy e2e (a template from host A made two sandboxes on host B; first exec at {100 * before / total:.1f} % of the chain; the "
              "guest's data intact across a radosgw outage; a store gone past the timeout "
              "stopped the VM with one line and the next exec worked)")
        return 0
    except (Failure, s3server.Failure, subprocess.CalledProcessError) as e:
        print(f"FAIL: lazy e2e: {e}")
        try:
            print("radosgw log tail:\n" + srv.tail("rgw.out"))
        except Exception:  # noqa: BLE001 - best effort
            pass
        return 1
    finally:
        stop.set()
        srv.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
