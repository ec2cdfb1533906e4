#!/usr/bin/env python3
"""bench/density's host side: takes the box's density.json, adds the metadata and the goals
object of issue 17 ({"value", "goal", "met"} per goal), and the encryption figures when a
snapshot-bench JSON is given (--encrypt-json). Prints the result and writes --out.

usage: density_goals.py BOX_JSON --out FILE [--encrypt-json FILE] [--meta K=V]..."""
import argparse
import datetime
import json
import os
import sys


def goal(value, target, met, **extra):
    g = {"value": value, "goal": target, "met": bool(met) if value is not None else False}
    g.update(extra)
    return g


def absent(target, note):
    if not note.startswith("not measured"):
        note = f"not measured: {note}"
    return {"value": None, "goal": target, "met": False, "note": note}


def git_commit(repo):
    """HEAD's commit from .git (a worktree's .git is a file naming its gitdir)."""
    try:
        gd = os.path.join(repo, ".git")
        if os.path.isfile(gd):
            with open(gd) as f:
                gd = f.read().split(":", 1)[1].strip()
        with open(os.path.join(gd, "HEAD")) as f:
            head = f.read().strip()
        if not head.startswith("ref:"):
            return head
        ref = head.split(None, 1)[1]
        for base in (gd, os.path.join(gd, "..", "..")):
            p = os.path.join(base, ref)
            if os.path.exists(p):
                with open(p) as f:
                    return f.read().strip()
    except (OSError, IndexError):
        pass
    return None


def encrypt_goals(path):
    """The encrypted/plain ratios from bench/snapshot_bench.py's JSON ("encrypt" part)."""
    try:
        with open(path) as f:
            d = json.load(f)
        e = d.get("encrypt") or d
        p, c = e["plain"], e["encrypted"]
        tot = round(c["diff_total_ms"]["median"] / p["diff_total_ms"]["median"], 3)
        rst = round(c["restore_first_output_ms"]["median"] /
                    p["restore_first_output_ms"]["median"], 3)
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError) as ex:
        return (absent(1.3, f"{path}: no encrypt figures ({type(ex).__name__}: {ex})"),
                absent(1.5, f"{path}: no encrypt figures"))
    src = {"source": path, "source_date": (d.get("metadata") or {}).get("date")}
    return (goal(tot, 1.3, tot <= 1.3, plain_ms=p["diff_total_ms"]["median"],
                 encrypted_ms=c["diff_total_ms"]["median"], **src),
            goal(rst, 1.5, rst <= 1.5, plain_ms=p["restore_first_output_ms"]["median"],
                 encrypted_ms=c["restore_first_output_ms"]["median"], **src))


def goals(res, errors, encrypt_json):
    g = {}
    L = res.get("launch")
    if L and L.get("bursts"):
        n = max(int(k) for k in L["bursts"])
        b = L["bursts"][str(n)]
        note = {} if n == 32 else {"note": f"largest burst measured was N={n}, not 32"}
        g["launch_32_none_lost"] = goal(b["lost"], 0, b["lost"] == 0 and n == 32, n=n, **note)
        g["launch_32_per_s_per_box_cpu"] = goal(
            b["launches_per_s_per_box_cpu"], 8, b["launches_per_s_per_box_cpu"] >= 8 and n == 32,
            n=n, wall_s=b["wall_s"], box_vcpus=L.get("box_vcpus"), **note)
        m = b.get("memory_after_idle") or {}
        pss = m.get("vmm_only_pss_mib") or {}
        tree = m.get("pss_mib") or {}
        g["launch_pss_per_sandbox_mib"] = goal(
            pss.get("mean"), 8, pss.get("mean") is not None and pss["mean"] <= 8, max=pss.get("max"),
            with_jail_processes_mean=tree.get("mean"), n=n, idle_s=m.get("idle_s"),
            note="mean smaps_rollup Pss of each clone's VMM process (guest RAM mapped from the "
            "shared page cache counts once over all clones); with_jail_processes adds the "
            "small processes of its jail")
        sh = m.get("share_unwritten_pages")
        g["clones_share_unwritten_pages"] = (
            goal(sh["shared"], True, sh["shared"], guest_ram_pss_over_rss=sh["guest_ram_pss_over_rss"])
            if sh else absent(True, "fewer than two clones measured"))
    else:
        why = errors.get("launch", "part not run")
        for k, t in (("launch_32_none_lost", 0), ("launch_32_per_s_per_box_cpu", 8),
                     ("launch_pss_per_sandbox_mib", 8), ("clones_share_unwritten_pages", True)):
            g[k] = absent(t, why)
    I = res.get("idle")
    if I and I.get("cpu_cove_over_qemu") is not None:
        r = I["cpu_cove_over_qemu"]
        g["idle_cpu_cove_over_qemu"] = goal(
            r, 0.5, r <= 0.5, cove_cpu_s=I["cove"].get("cpu_s_schedstat"),
            qemu_cpu_s=I["qemu"].get("cpu_s_schedstat"),
            cove_cpu_s_ticks=I["cove"]["cpu_s_total"], qemu_cpu_s_ticks=I["qemu"]["cpu_s_total"],
            ratio_ticks=I.get("cpu_cove_over_qemu_ticks"), cmdline=I.get("cmdline"),
            cove_vmm_own_cpu_s=I["cove"].get("vmm_own_cpu_s"),
            qemu_vmm_own_cpu_s=I["qemu"].get("vmm_own_cpu_s"),
            cove_exits_per_guest_per_s=I["cove"]["exits_per_guest_per_s"],
            qemu_exits_per_guest_per_s=I["qemu"]["exits_per_guest_per_s"], guests=I["guests"],
            idle_s=I["idle_s"])
    else:
        g["idle_cpu_cove_over_qemu"] = absent(0.5, errors.get("idle", "part not run"))
    M = res.get("memory")
    if M and M.get("booted"):
        b = M["booted"]
        rss = round(b["rss_excl_guest_kib"] / 1024, 2)
        pd = round(b["private_dirty_excl_guest_kib"] / 1024, 2)
        g["vmm_rss_excl_guest_mib"] = goal(rss, 5, rss <= 5, shared_objects=b["shared_objects"],
                                           restored=round(M["restored"]["rss_excl_guest_kib"]
                                                          / 1024, 2) if M.get("restored") else None)
        g["vmm_private_dirty_mib"] = goal(pd, 2, pd <= 2)
    else:
        for k, t in (("vmm_rss_excl_guest_mib", 5), ("vmm_private_dirty_mib", 2)):
            g[k] = absent(t, errors.get("memory", "part not run"))
    B = res.get("boot")
    for k in ("bzImage", "vmlinux"):
        e = (B or {}).get("results", {}).get(k)
        if e and e.get("ratio_cove_over_qemu") is not None:
            r = e["ratio_cove_over_qemu"]
            g[f"boot_{k}_cove_over_qemu"] = goal(r, 0.6, r <= 0.6,
                                                 cove_ms=e["cove"]["ready_ms"]["median"],
                                                 qemu_ms=e["qemu"]["ready_ms"]["median"])
        else:
            g[f"boot_{k}_cove_over_qemu"] = absent(0.6, errors.get("boot", "part not run"))
    P = res.get("pause")
    if P and (P.get("diff_16mib") or {}).get("pause_ms"):
        v = P["diff_16mib"]["pause_ms"]["median"]
        g["snapshot_pause_diff_16mib_ms"] = goal(v, 9, v <= 9,
                                                 full_ms=P["full"]["pause_ms"]["median"])
    else:
        g["snapshot_pause_diff_16mib_ms"] = absent(9, errors.get("pause", "part not run"))
    bal = res.get("balloon") or {}
    fresh = bal.get("fresh") or {}  # bench/balloon_in_box.py: the fresh (memfd) guest's round
    if bal.get("given_back_mib") is None and fresh.get("given_back_mib") is not None:
        bal = dict(bal, given_back_mib=fresh["given_back_mib"], within_s=fresh.get("seconds"),
                   freed_mib=200)
    if bal.get("given_back_mib") is not None:
        v = bal["given_back_mib"]
        ok = v >= 150 and (bal.get("within_s") or 0) <= 10 and not bal.get("error")
        g["balloon_given_back_mib"] = goal(v, 150, ok, freed_mib=bal.get("freed_mib"),
                                           within_s=bal.get("within_s"),
                                           layer_stored_mib=fresh.get("layer_stored_mib"),
                                           restored=bal.get("restored"), error=bal.get("error"))
    else:
        g["balloon_given_back_mib"] = absent(150, bal.get("note", "bench/density --with-balloon "
                                                      "and bench/balloon_in_box.py needed"))
    if encrypt_json:
        g["encrypt_incremental_total_enc_over_plain"], \
            g["encrypt_restore_first_output_enc_over_plain"] = encrypt_goals(encrypt_json)
    else:
        g["encrypt_incremental_total_enc_over_plain"] = absent(
            1.3, "pass --encrypt-json FILE (bench/snapshot --only encrypt output)")
        g["encrypt_restore_first_output_enc_over_plain"] = absent(
            1.5, "pass --encrypt-json FILE (bench/snapshot --only encrypt output)")
    return g


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("box_json")
    ap.add_argument("--out", required=True)
    ap.add_argument("--encrypt-json")
    ap.add_argument("--meta", action="append", default=[])
    a = ap.parse_args()
    try:
        with open(a.box_json) as f:
            d = json.load(f)
    except (OSError, ValueError) as e:
        d = {"bench": "density", "results": {}, "errors": {"box": f"no box result: {e}"}}
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "git_commit": git_commit(repo), "host_cpus": os.cpu_count(),
            "note": "KVM box: kvm_amd under QEMU TCG on a shared 2-CPU machine; compare ratios "
            "from this run only"}
    for kv in a.meta:
        k, _, v = kv.partition("=")
        meta[k] = v
    with open("/proc/loadavg") as f:
        meta["host_loadavg_end"] = f.read().split()[:3]
    out = {"bench": "density", "metadata": meta,
           "goals": goals(d.get("results", {}), d.get("errors", {}), a.encrypt_json)}
    out.update({k: v for k, v in d.items() if k != "bench"})
    text = json.dumps(out, indent=1)
    if a.out != "-":
        with open(a.out, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
