"""bench/crypto_host: issue 36's three encrypted-over-plain ratios on this host, with goals."""
import argparse
import datetime
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def run_json(argv):
    r = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=3600)
    if r.returncode:
        raise RuntimeError(f"{' '.join(argv)}: exit {r.returncode}: {r.stderr.strip()[-400:]}")
    return json.loads(r.stdout)


def goal(value, limit):
    return {"value": value, "goal": f"<= {limit}", "met": value is not None and value <= limit}


def kvm_usable():
    try:
        fd = os.open("/dev/kvm", os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return False
    os.close(fd)
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--out", default=os.path.join(HERE, "results-crypto-host.json"))
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    parts = ("seal_write", "lazy_restore", "snapshot")
    if a.quick:
        missing = [p for p in parts if not os.access(os.path.join(HERE, p), os.X_OK)]
        print(json.dumps({"quick": "inputs checked only", "missing": missing}))
        return 1 if missing else 0
    with open("/proc/cpuinfo") as f:
        aes = " aes " in f.read().split("\nflags", 1)[-1].split("\n", 1)[0] + " "
    doc = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                    capture_output=True, text=True).stdout.strip(),
           "host_aes_ni": aes, "cpus": os.cpu_count(), "runs": a.runs}
    goals = {}
    sw = run_json([os.path.join(HERE, "seal_write"), a.dir, "40", str(a.runs)])
    doc["seal_write"] = sw
    goals["seal_write_40mib_uring_encrypted_over_plain"] = dict(
        goal(sw["uring"]["ratios_over_plain"]["enc_pipeline"], 1.3),
        before=sw["uring"]["ratios_over_plain"]["enc_parallel"],
        note="enc_pipeline (what snapshots do now) over plain, io_uring, medians of runs "
             "interleaved; before: enc_parallel, the writer before issue 36")
    lr = run_json([os.path.join(HERE, "lazy_restore"), a.dir, "40", str(min(a.runs, 9))])
    doc["lazy_restore"] = lr
    goals["lazy_restore_40mib_encrypted_over_plain"] = dict(
        goal(lr["ratios_over_plain"]["enc_runs_prefetch"], 2.0),
        note="runs with prefetch (the default) over the plain layer mapped privately")
    if kvm_usable():
        out = os.path.join(a.dir, "crypto-host-snapshot.json")
        sn = run_json([os.path.join(HERE, "snapshot"), "--only", "encrypt", "--out", out])
        os.unlink(out)
        en = sn.get("encrypt") or {}
        doc["snapshot_encrypt"] = en
        rt = en.get("ratios", {})
        goals["snapshot_diff_total_encrypted_over_plain"] = goal(
            rt.get("diff_total_encrypted_over_plain"), 1.3)
        goals["snapshot_restore_first_output_encrypted_over_plain"] = goal(
            rt.get("restore_first_output_encrypted_over_plain"), 1.5)
        if sn.get("errors"):
            doc["snapshot_errors"] = sn["errors"]
    else:
        doc["snapshot_encrypt"] = "not run: /dev/kvm is missing or unusable here"
    doc["goals"] = goals
    text = json.dumps(doc, indent=2)
    with open(a.out, "w") as f:
        f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
