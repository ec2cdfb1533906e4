"""The metrics check's host side (issue 30): a `cove metrics` file checked by promtool, served
by prometheus-node-exporter's textfile collector and scraped by Prometheus, each started here on
loopback ports of its own and stopped after; a series is read back through Prometheus' HTTP API."""
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request

import s3server


class Failure(Exception):
    pass


def _get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode(errors="replace")


def check_file(prom_file, queries, deadline_s=60):
    """promtool check metrics on prom_file, then node-exporter + Prometheus; queries maps a
    PromQL expression to the value it must have. Returns {expr: value} and the seconds taken."""
    t0 = time.monotonic()
    with open(prom_file, "rb") as f:
        r = subprocess.run(["promtool", "check", "metrics"], stdin=f, capture_output=True)
    if r.returncode != 0:
        raise Failure(f"promtool check metrics: {r.stdout.decode()} {r.stderr.decode()}")
    work = tempfile.mkdtemp(prefix="cove-prom.")
    procs = []
    try:
        tdir = os.path.join(work, "textfile")
        os.mkdir(tdir)
        shutil.copy(prom_file, os.path.join(tdir, "cove.prom"))
        ne_port, pr_port = s3server.free_port(), s3server.free_port()
        ne_log = open(os.path.join(work, "node-exporter.log"), "wb")
        procs.append(subprocess.Popen(
            ["prometheus-node-exporter", "--collector.disable-defaults", "--collector.textfile",
             f"--collector.textfile.directory={tdir}",
             f"--web.listen-address=127.0.0.1:{ne_port}"],
            stdout=ne_log, stderr=subprocess.STDOUT))
        with open(os.path.join(work, "prometheus.yml"), "w") as f:
            f.write("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                    "scrape_configs:\n  - job_name: cove\n    static_configs:\n"
                    f"      - targets: ['127.0.0.1:{ne_port}']\n")
        pr_log = open(os.path.join(work, "prometheus.log"), "wb")
        procs.append(subprocess.Popen(
            ["prometheus", f"--config.file={work}/prometheus.yml",
             f"--storage.tsdb.path={work}/tsdb", f"--web.listen-address=127.0.0.1:{pr_port}"],
            stdout=pr_log, stderr=subprocess.STDOUT))
        got, last = {}, ""
        while time.monotonic() - t0 < deadline_s:
            time.sleep(1)
            for p, log in zip(procs, (ne_log.name, pr_log.name)):
                if p.poll() is not None:
                    with open(log, errors="replace") as f:
                        raise Failure(f"{p.args[0]} exited ({p.returncode}): {f.read()[-800:]}")
            try:
                for expr in queries:
                    q = urllib.parse.quote(expr)
                    res = json.loads(_get(f"http://127.0.0.1:{pr_port}/api/v1/query?query={q}"))
                    vals = res.get("data", {}).get("result", [])
                    got[expr] = float(vals[0]["value"][1]) if len(vals) == 1 else None
                    last = str(res)[:300]
            except (OSError, ValueError, KeyError, IndexError) as e:
                last = repr(e)
                continue
            if all(got.get(e) == v for e, v in queries.items()):
                return got, time.monotonic() - t0
        raise Failure(f"Prometheus did not answer {queries} within {deadline_s} s: {got}; "
                      f"last {last}")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(work, ignore_errors=True)
