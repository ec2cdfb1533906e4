#!/usr/bin/env python3
"""Runs inside the KVM box: how long a snapshot pauses a 256 MiB Linux guest (issue 17).

One cove process boots the bzImage with the initramfs; the guest writes 16 MiB of random data
into the same tmpfs file every round (so 16 MiB of its pages are dirty) and says so on its
console; the host then asks for a snapshot over the API socket (a Full one first, Diffs after)
and keeps `pause_us` from the reply and the per-step split from cove's debug log. Two cove
processes in the same box run, one after the other: pre-copy off (COVE_SNAP_PRECOPY=0, every
dirty page copied in the pause) and on (the default). Writes /work/out/pause.json.
"""
import base64
import json
import os
import re
import statistics
import subprocess
import sys
import time

from covetest import http_json

RUNS = int(os.environ.get("BENCH_RUNS", "7"))
DIRTY_MIB = int(os.environ.get("BENCH_DIRTY_MIB", "16"))
COVE = "/work/cove"
KERNEL = "/work/kernel/bzImage"
INITRD = "/work/rootfs/initramfs.cpio.gz"
GUEST = ("i=0; while :; do dd if=/dev/urandom of=/dirty bs=1M count=%d conv=notrunc "
         "2>/dev/null; echo \"dirty $i\"; i=$((i+1)); sleep 3; done" % DIRTY_MIB)
CMDLINE = ("console=ttyS0 reboot=k panic=-1 quiet cove.cmd="
           + base64.b64encode(GUEST.encode()).decode())
SPLIT = re.compile(r"snapshot pause: (.*)")


def wait_console(path, n, timeout):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with open(path, "rb") as f:
                if f"dirty {n}\n".encode() in f.read().replace(b"\r", b""):
                    return True
        except FileNotFoundError:
            pass
        time.sleep(0.02)
    return False


def summary(vals):
    if not vals:
        return None
    return {"median": round(statistics.median(vals), 2), "min": round(min(vals), 2),
            "max": round(max(vals), 2), "n": len(vals), "samples": [round(v, 2) for v in vals]}


def one_vm(precopy):
    d, con, sock, errf = "/tmp/pause-chain", "/tmp/pause.out", "/tmp/pause.api", "/tmp/pause.err"
    subprocess.run(["rm", "-rf", d, con, sock, errf])
    os.makedirs(d)
    err = open(errf, "wb")
    env = dict(os.environ, COVE_SNAP_PRECOPY="1" if precopy else "0")
    p = subprocess.Popen([COVE, "run", "--kernel", KERNEL, "--initrd", INITRD, "--mem", "256M",
                          "--cmdline", CMDLINE, "--api-sock", sock, "--snapshot-dir", d,
                          "--console", con, "--log-level", "debug"],
                         stdin=subprocess.DEVNULL, stderr=err, env=env)
    rows = []
    try:
        for i in range(RUNS + 1):
            if not wait_console(con, i, 240):
                raise SystemExit(f"guest round {i} never came: {open(con, 'rb').read()[-500:]!r}")
            kind = "Full" if i == 0 else "Diff"
            st, body = http_json(sock, "PUT", "/snapshot/create", {"snapshot_type": kind},
                                 timeout=120)
            if st != 200:
                raise SystemExit(f"snapshot {i}: HTTP {st} {body}")
            body["kind"] = kind
            rows.append(body)
            print(f"pause precopy={precopy} round {i} {kind}: pause {body['pause_us']} us, pages {body['pages']}, "
                  f"write {body['write_us']} us", file=sys.stderr, flush=True)
    finally:
        p.kill()
        p.wait()
        err.close()
    splits = SPLIT.findall(open(errf, errors="replace").read())
    for r, s in zip(rows, splits):
        r["split"] = s
    diffs = [r for r in rows if r["kind"] == "Diff"]
    return {"full_pause_ms": rows[0]["pause_us"] / 1e3,
            "diff_pause_ms": summary([r["pause_us"] / 1e3 for r in diffs]),
            "diff_precopy_ms": summary([r.get("precopy_us", 0) / 1e3 for r in diffs]),
            "diff_total_ms": summary([r["total_us"] / 1e3 for r in diffs]),
            "diff_pages": summary([r["pages"] for r in diffs]),
            "rows": rows}


def main():
    off = one_vm(False)
    on = one_vm(True)
    out = {"what": f"cove run, 256 MiB Linux guest (bzImage + initramfs), {DIRTY_MIB} MiB "
           "rewritten in tmpfs before each snapshot; pause_us from PUT /snapshot/create; "
           "precopy_off: COVE_SNAP_PRECOPY=0 (all dirty pages copied in the pause), precopy_on: "
           "the default, same box run",
           "dirty_mib": DIRTY_MIB, "runs": RUNS, "precopy_off": off, "precopy_on": on,
           "full_pause_ms": on["full_pause_ms"], "diff_pause_ms": on["diff_pause_ms"]}
    out["goal_ms"] = 9
    out["met"] = out["diff_pause_ms"]["median"] <= 9
    os.makedirs("/work/out", exist_ok=True)
    with open("/work/out/pause.json", "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps({"off": off["diff_pause_ms"]["median"], "on": on["diff_pause_ms"]["median"],
                      "full_off": off["full_pause_ms"], "full_on": on["full_pause_ms"],
                      "met": out["met"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
