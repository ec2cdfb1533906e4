"""e2e balloon tests (issue 17), run inside the KVM box by box_tests.py: a Linux guest with
virtio-balloon free page reporting allocates and frees 200 MiB; the memfd behind its RAM gives
at least 150 MiB back within 10 s; the next snapshot layer does not hold the freed pages, and
after restore the guest's live data has the checksum it had before."""
import json
import os
import re
import time

import box_tests as bt
from covetest import Failure, check, http_json
from snapshot_tests import fresh, kill, layers, wait_file

MIB = 1 << 20
BIG_MIB = 200
# The guest: 8 MiB of random live data it keeps (its checksum printed), then 200 MiB of copies
# of it (not zeros: pages the host did not get back would then be stored by the snapshot),
# freed again; then it prints the live data's checksum every 2 s (also after restore).
SUM_CMD = ("echo SUM $(md5sum /mnt/b/live | cut -c1-32) "
           "$(grep MemFree /proc/meminfo | tr -s ' ' | cut -d' ' -f2)")
GUEST = (
    "mkdir -p /mnt/b && mount -t tmpfs -o size=400m tmpfs /mnt/b && "
    "echo ORDER $(cat /sys/module/page_reporting/parameters/page_reporting_order 2>&1) && "
    "ls /sys/bus/virtio/drivers/ && "
    "dd if=/dev/urandom of=/mnt/b/live bs=1M count=8 2>/dev/null && "
    "echo LIVE $(md5sum /mnt/b/live | cut -c1-32) && "
    "sleep 6; "  # the host takes its full snapshot meanwhile
    f"for i in $(seq {BIG_MIB // 8}); do cat /mnt/b/live; done > /mnt/b/big && "
    "echo ALLOCATED $(du -m /mnt/b/big | cut -f1) && sleep 6 && rm /mnt/b/big && echo FREED && "
    # 60 s of guest time later (after the host's snapshot, kill and restore: the restored
    # guest goes on from the snapshot) the same again, now in restored (private) memory.
    f"for i in $(seq 30); do {SUM_CMD}; sleep 2; done; "
    f"for i in $(seq {BIG_MIB // 8}); do cat /mnt/b/live; done > /mnt/b/big && "
    "echo ALLOCATED2 && sleep 6 && rm /mnt/b/big && echo FREED2 && "
    f"while :; do {SUM_CMD}; sleep 2; done"
)
LIVE = re.compile(r"LIVE ([0-9a-f]{32})")
SUM = re.compile(r"SUM ([0-9a-f]{32}) (\d+)")


def family(pid):
    """`pid` and its descendants (a jailed cove runs the guest below itself, beside helpers)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for t in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{t}/children") as f:
                    todo += [int(k) for k in f.read().split()]
        except OSError:
            pass
    return out


def memfd_path(pid):
    """The /proc path of the guest RAM memfd of cove `pid` (or of its jailed child)."""
    for p in family(pid):
        d = f"/proc/{p}/fd"
        try:
            fds = os.listdir(d)
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(os.path.join(d, fd)).startswith("/memfd:cove-guest-ram"):
                    return os.path.join(d, fd)
            except OSError:
                continue
    raise Failure(f"no cove-guest-ram memfd among the fds of pid {pid} and its children")


def allocated(path):
    return os.stat(path).st_blocks * 512


def rss_anon(pid):
    """Private anonymous memory of the process running the guest (the largest of cove `pid`
    and its children): a restored guest's copied-on-write RAM."""
    best = None
    for p in family(pid):
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("RssAnon:"):
                        v = int(line.split()[1]) * 1024
                        best = v if best is None or v > best else best
        except OSError:
            continue
    if best is None:
        raise Failure(f"no RssAnon for pid {pid}")
    return best


def wait_drop(measure, peak, want, limit=30):
    """Polls measure() until it is `want` below peak: (bytes given back, seconds or None)."""
    t0 = time.monotonic()
    low = peak
    while time.monotonic() - t0 < limit:
        low = min(low, measure())
        if peak - low >= want:
            return peak - low, time.monotonic() - t0
        time.sleep(0.1)
    return peak - low, None


def test_balloon_reporting_gives_back_and_snapshot_restores():
    d, con1, con2 = "/tmp/bal", "/tmp/bal.out", "/tmp/bal.restored"
    sock, sock2 = "/tmp/bal.api", "/tmp/bal2.api"
    fresh(d, con1, con2, sock, sock2)
    run = [bt.COVE, "run", "--kernel", bt.BZIMAGE, "--initrd", bt.INITRD, "--mem", "512M",
           "--cmdline", bt.cmdline_for(GUEST), "--balloon", "--api-sock", sock,
           "--snapshot-dir", d, "--console", con1, "--log-level", "info"]
    p = bt.subprocess.Popen(run, stdin=bt.subprocess.DEVNULL, stderr=bt.subprocess.PIPE)
    try:
        text = wait_file(con1, lambda t: LIVE.search(t), bt.BOOT_TIMEOUT, "the live data", p)
        live = LIVE.search(text).group(1)
        check("virtio_balloon" in text, f"the guest has no virtio_balloon driver: {text[-800:]}")
        ram = memfd_path(p.pid)
        status, body = http_json(sock, "PUT", "/snapshot/create", {"snapshot_type": "Full"},
                                 timeout=120)
        check(status == 200, f"full snapshot: {status} {body}")
        base = allocated(ram)
        text = wait_file(con1, lambda t: "ALLOCATED" in t, 180, "the 200 MiB", p)
        peak = allocated(ram)
        wait_file(con1, lambda t: "FREED" in t, 60, "the free", p)
        given, took = wait_drop(lambda: allocated(ram), peak, 150 * MIB)
        low = peak - given
        status, bal = http_json(sock, "GET", "/balloon")
        check(status == 200, f"GET /balloon: {status} {bal}")
        status, stats = http_json(sock, "GET", "/balloon/statistics")
        check(status == 200, f"GET /balloon/statistics: {status} {stats}")
        time.sleep(0.5)  # the first read hands the driver's buffer back for fresh numbers
        status, stats = http_json(sock, "GET", "/balloon/statistics")
        print(f"    memfd: {base / MIB:.1f} MiB before, {peak / MIB:.1f} MiB with 200 MiB "
              f"allocated, {low / MIB:.1f} MiB after the free: {given / MIB:.1f} MiB given "
              f"back in {'%.2f s' % took if took is not None else 'more than 30 s'}")
        print(f"    balloon: {json.dumps(bal)}")
        print(f"    statistics: {json.dumps(stats)}")
        # The next layer: the pages the guest wrote and freed are dirty, but given back.
        status, snap = http_json(sock, "PUT", "/snapshot/create", {"snapshot_type": "Diff"},
                                 timeout=120)
        check(status == 200, f"incremental snapshot: {status} {snap}")
        top = layers(d)[-1]
        layer_file = os.path.join(d, top["mem"])
        layer_alloc = allocated(layer_file)
        after = allocated(ram)
        print(f"    layer {top['mem']}: {snap.get('pages')} pages in its bitmap, "
              f"{snap.get('stored_pages')} stored ({snap.get('stored_pages', 0) * 4096 / MIB:.1f} MiB), "
              f"file allocates {layer_alloc / MIB:.1f} MiB; memfd after it {after / MIB:.1f} "
              f"MiB; pause {snap.get('pause_us')} us")
        result = {"given_back_mib": round(given / MIB, 1),
                  "seconds": round(took, 2) if took is not None else None,
                  "memfd_peak_mib": round(peak / MIB, 1), "memfd_after_mib": round(low / MIB, 1),
                  "layer_stored_mib": round(snap.get("stored_pages", 0) * 4096 / MIB, 2),
                  "layer_alloc_mib": round(layer_alloc / MIB, 2)}
        print(f"BALLOON_RESULT {json.dumps(result)}", flush=True)
        check(stats.get("updates", 0) >= 1 and stats.get("total_memory", 0) > 400 * MIB,
              f"no statistics from the guest: {stats}")
        check(peak - base >= 180 * MIB, f"the guest's 200 MiB did not reach the memfd "
              f"({(peak - base) / MIB:.1f} MiB)")
        check(took is not None and took <= 10,
              f"only {given / MIB:.1f} MiB given back, goal 150 MiB within 10 s")
        check(snap.get("stored_pages", 0) * 4096 < 50 * MIB and layer_alloc < 60 * MIB,
              f"the layer holds freed pages: {snap}")
        check(after <= low + 20 * MIB,
              f"the snapshot allocated given-back pages again ({low / MIB:.1f} -> "
              f"{after / MIB:.1f} MiB)")
    finally:
        kill(p)
    r = bt.subprocess.Popen([bt.COVE, "restore", d, "--console", con2, "--api-sock", sock2,
                             "--log-level", "info"],
                            stdin=bt.subprocess.DEVNULL, stderr=bt.subprocess.PIPE)
    try:
        text = wait_file(con2, lambda t: len(SUM.findall(t)) >= 2, 120,
                         "the restored guest's checksum", r)
        sums = [m[0] for m in SUM.findall(text)]
        check(all(s == live for s in sums),
              f"live data changed across the snapshot: {live} before, {sums} after")
        print(f"    restored: live data checksum {live} matches ({len(sums)} checks)")
        # Restored RAM is a private mapping of the layer: what the guest writes is anonymous
        # copy-on-write memory, and what it frees again must leave the process.
        wait_file(con2, lambda t: "ALLOCATED2" in t, 240, "the restored guest's 200 MiB", r)
        peak2 = rss_anon(r.pid)
        wait_file(con2, lambda t: "FREED2" in t, 60, "the restored guest's free", r)
        given2, took2 = wait_drop(lambda: rss_anon(r.pid), peak2, 150 * MIB)
        status, bal = http_json(sock2, "GET", "/balloon")
        check(status == 200, f"restored GET /balloon: {status} {bal}")
        text = open(con2, errors="replace").read()
        sums = [m[0] for m in SUM.findall(text)]
        print(f"    restored guest: RssAnon {peak2 / MIB:.1f} MiB with 200 MiB allocated, "
              f"{given2 / MIB:.1f} MiB given back in "
              f"{'%.2f s' % took2 if took2 is not None else 'more than 30 s'}; "
              f"balloon {json.dumps(bal)}")
        print(f"BALLOON_RESTORED_RESULT {json.dumps({'given_back_mib': round(given2 / MIB, 1), 'seconds': round(took2, 2) if took2 is not None else None, 'rss_anon_peak_mib': round(peak2 / MIB, 1)})}", flush=True)
        check(all(s == live for s in sums),
              f"live data changed after the restored guest freed memory: {sums}")
        check(took2 is not None and took2 <= 10,
              f"restored guest: only {given2 / MIB:.1f} MiB given back, goal 150 MiB in 10 s")
    finally:
        kill(r)
    fresh(d, con1, con2, sock, sock2)


TESTS = [test_balloon_reporting_gives_back_and_snapshot_restores]
