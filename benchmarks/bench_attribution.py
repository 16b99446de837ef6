"""Benchmark: step-time attribution on a 256-host generated pod trace, beside a plain scan baseline.

    python benchmarks/bench_attribution.py [--model resnet50] [--chips 1024] [--steps 4] [--work /tmp/...]

Generates the run once (all hosts written), ingests it once, then runs each measured job in a fresh
subprocess so peak RSS is per job: the baseline `SELECT count(*), sum(duration_ps) FROM events` scan, one
sorted window pass over every event (the floor of any sweep) and `analyze_run`, all under the same
DuckDB memory_limit. Prints seconds and peak RSS, ratios to the baselines, and the database size.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

JOB = r"""
import json, resource, sys, time
import duckdb
db, job, run_id, mem = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
con = duckdb.connect(db, read_only=True)
if mem:
    con.execute(f"SET memory_limit = '{mem}'")
t = time.perf_counter()
if job == "baseline":
    result = con.execute("SELECT count(*), sum(duration_ps) FROM events").fetchall()[0]
    extra = {"events": result[0]}
elif job == "window":  # one sorted window pass over every event: the floor of any sweep
    result = con.execute(
        "SELECT count(*), sum(gap) FROM (SELECT lead(start_ps) OVER (PARTITION BY host, plane_index, "
        "line_index ORDER BY start_ps) - start_ps AS gap FROM events)").fetchall()[0]
    extra = {"events": result[0]}
else:
    from tpuanalyze.analyzer.api import analyze_run
    a = analyze_run(con, run_id)
    extra = {"devices": a.summary["devices"], "steps": a.summary["steps"],
             "breakdown": a.summary["breakdown"], "findings": [f["rule"] for f in a.findings],
             "step_rows": len(a.steps)}
seconds = time.perf_counter() - t
rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print("BENCH_JSON" + json.dumps({"job": job, "seconds": seconds, "peak_rss_mb": rss_mb, **extra}))
"""


def _run_job(db: Path, job: str, run_id: int, memory_limit: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", JOB, str(db), job, str(run_id), memory_limit],
                          capture_output=True, text=True, check=False)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("BENCH_JSON")), None)
    if line is None:
        raise SystemExit(f"{job} failed:\n{proc.stderr[-3000:]}")
    return json.loads(line[len("BENCH_JSON"):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--chips", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--work", type=Path, default=Path("/tmp/tpuanalyze_bench_attribution"))
    parser.add_argument("--memory-limit", default="4GB", help="DuckDB memory_limit for both jobs")
    args = parser.parse_args()

    from tpuanalyze.generator import generate

    from tpuanalyze.pipeline import ingest_paths

    run_root = args.work / f"{args.model}_{args.chips}_{args.steps}"
    db = args.work / f"{args.model}_{args.chips}_{args.steps}.duckdb"
    if not db.exists():
        t = time.perf_counter()
        run_dir = generate(args.model, chips=args.chips, steps=args.steps, hosts=None, scenario="baseline",
                           seed=0, out=run_root)
        print(f"generated {run_dir} in {time.perf_counter() - t:.1f} s")
        t = time.perf_counter()
        summary = ingest_paths([run_dir], db)
        print(f"ingested {summary.hosts} hosts, {summary.events:,} events in {time.perf_counter() - t:.1f} s")
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    run_id, hosts, events = con.execute(
        "SELECT run_id, num_hosts, num_events FROM runs LIMIT 1").fetchall()[0]
    con.close()
    size_mb = db.stat().st_size / 2**20
    base = _run_job(db, "baseline", run_id, args.memory_limit)
    window = _run_job(db, "window", run_id, args.memory_limit)
    attr = _run_job(db, "analyze", run_id, args.memory_limit)
    print(f"database: {size_mb:,.0f} MB, {hosts} hosts, {events:,} events, {attr['devices']} devices, "
          f"{attr['step_rows']} device steps")
    print(f"baseline scan : {base['seconds']:8.2f} s  peak RSS {base['peak_rss_mb']:8.0f} MB")
    print(f"window pass   : {window['seconds']:8.2f} s  peak RSS {window['peak_rss_mb']:8.0f} MB")
    print(f"analyze_run   : {attr['seconds']:8.2f} s  peak RSS {attr['peak_rss_mb']:8.0f} MB")
    print(f"ratio         : {attr['seconds'] / max(base['seconds'], 1e-9):8.1f} x time, "
          f"{attr['peak_rss_mb'] / max(base['peak_rss_mb'], 1e-9):.1f} x RSS vs the scan; "
          f"{attr['seconds'] / max(window['seconds'], 1e-9):.1f} x time vs the window pass; "
          f"analyze peak RSS / DB size = {attr['peak_rss_mb'] / size_mb:.2f}")
    print("breakdown:", {k: round(v, 4) for k, v in attr["breakdown"].items()}, "findings:", attr["findings"])


if __name__ == "__main__":
    main()
