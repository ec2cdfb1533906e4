"""Runs inside the KVM box (bench/crypto_box): encrypted against plain snapshot chains of a
4 GiB stamper test guest that dirties MIB (40) MiB per round, the same measure as
`bench/snapshot --only encrypt` (snapshot_bench.bench_encrypt), with plain and encrypted
processes interleaved for each writer in turn. Writes /work/out/crypto-box.json with
`diff_total_encrypted_over_plain` and `restore_first_output_encrypted_over_plain` per writer."""
import json
import subprocess
import os
import sys
import tempfile
import time
import types

sys.path.insert(0, "/work/bench")
import snapshot_bench as sb  # noqa: E402

# AES-GCM runs at tens of MB/s under TCG: a restore that decrypts 40 MiB needs seconds.
sb.RESTORE_TIMEOUT_S = 120

PROCS = int(os.environ.get("BENCH_PROCS", "3"))
RESTORES = int(os.environ.get("BENCH_RESTORES", "3"))
WRITERS = os.environ.get("BENCH_WRITERS", "default,pwrite").split(",")
MIB = int(os.environ.get("BENCH_MIB", "40"))


def cpu_flags():
    """The box CPU's crypto-relevant flags (AES-NI under TCG is emulated)."""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                have = set(line.split(":", 1)[1].split())
                return {k: k in have for k in ("aes", "pclmulqdq", "avx", "avx2", "vaes",
                                                "vpclmulqdq", "movbe", "sse4_1", "ssse3")}
    return {}


def aes_gcm_in_box():
    """bench/crypto_bench (snapshot/crypto.c) inside the box: MB/s per 4 KiB page."""
    exe = "/work/bench/crypto_bench"
    if not os.path.exists(exe):
        return None
    r = subprocess.run([exe, "1"], capture_output=True, text=True, timeout=600)
    try:
        return json.loads(r.stdout)
    except ValueError:
        return {"error": r.stderr[-300:]}


def main():
    work = tempfile.mkdtemp(prefix="cryptobench-", dir="/tmp")
    a = types.SimpleNamespace(cove="/work/build/cli/cove", guests="/work/guests",
                              encrypt_procs=PROCS, encrypt_restores=RESTORES,
                              encrypt_writers=WRITERS, encrypt_mib=MIB)
    errors = []
    aes = aes_gcm_in_box()
    t0 = time.monotonic()
    try:
        enc = sb.bench_encrypt(a, work, errors)
    finally:
        sb.kill_everything()
    out = {"bench": "crypto_in_box", "procs": PROCS, "restores_per_chain": RESTORES,
           "dirty_mib": MIB, "work_fs": sb.fs_of(work), "box_cpu_flags": cpu_flags(),
           "aes_gcm_in_box": aes,
           "seconds": round(time.monotonic() - t0, 1), "errors": errors,
           "ratios_by_writer": {w: v["ratios"] for w, v in enc["by_writer"].items()},
           "encrypt": enc}
    goals = {}
    for w, v in enc["by_writer"].items():
        d = v["ratios"]["diff_total_encrypted_over_plain"]
        r = v["ratios"]["restore_first_output_encrypted_over_plain"]
        goals[f"{w}_diff_total_encrypted_over_plain"] = {
            "value": d, "goal": 1.3, "met": d is not None and d <= 1.3}
        goals[f"{w}_restore_first_output_encrypted_over_plain"] = {
            "value": r, "goal": 1.5, "met": r is not None and r <= 1.5}
    out["goals"] = goals
    os.makedirs("/work/out", exist_ok=True)
    with open("/work/out/crypto-box.json", "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps({"ratios_by_writer": out["ratios_by_writer"], "errors": errors,
                      "box_cpu_flags": out["box_cpu_flags"], "aes_gcm_in_box": aes}),
          flush=True)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
