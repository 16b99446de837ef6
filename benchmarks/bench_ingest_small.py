"""Small inputs must not get slower: `tpuanalyze ingest` of the given inputs, a base commit vs the
working tree, alternated in one run (ratios from the same run; the machine is shared).

Why: the compiled decoder costs a numba import and kernel load per process; files below
``COMPILED_MIN_EVENTS`` must keep the numpy decoder's start-up, time and memory.

Usage (from the project root)::

    python benchmarks/bench_ingest_small.py --base main --repeat 3 \
        sample_traces/jax_cpu/pmap8_train_eval /tmp/gen32     # prints a markdown table
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_ingest import CLI_SECONDS, run_measured, snapshot_commit  # noqa: E402


def ingest_once(exe: str, target: Path, db: Path, env: dict[str, str] | None) -> tuple[float, float, float]:
    """(work s as the CLI reports it, CPU s, peak RSS MB) of one fresh ingest."""
    for path in (db, db.with_name(db.name + ".wal")):
        path.unlink(missing_ok=True)
    m = run_measured([exe, "ingest", str(target), "--db", str(db)], env)
    reported = CLI_SECONDS.search(m.stdout)
    return (float(reported.group(1)) if reported else m.wall_s), m.cpu_s, m.peak_rss_mb


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("inputs", nargs="+", type=Path)
    parser.add_argument("--base", default="main", help="git revision to compare against")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="tpuanalyze_bench_small_"))
    beside = Path(sys.executable).with_name("tpuanalyze")
    exe = str(beside) if beside.exists() else shutil.which("tpuanalyze") or "tpuanalyze"
    commit = snapshot_commit(args.base, scratch / "base")
    base_env = {**os.environ, "PYTHONPATH": str(scratch / "base" / "pkg")}
    rows = []
    for target in args.inputs:
        best: dict[str, tuple[float, float, float]] = {}
        for _ in range(args.repeat):
            for label, env in ((f"base {commit[:10]}", base_env), ("working tree", None)):
                got = ingest_once(exe, target, scratch / "bench.duckdb", env)
                if label not in best or got[0] < best[label][0]:
                    best[label] = got
        (b_work, b_cpu, b_rss), (w_work, w_cpu, w_rss) = best.values()
        rows.append(
            f"| `{target}` | {b_work:.2f} | {w_work:.2f} | {w_work / b_work:.2f}x | {b_cpu:.2f} "
            f"| {w_cpu:.2f} | {b_rss:.0f} | {w_rss:.0f} |"
        )
        print(rows[-1], flush=True)
    print()
    print(f"Base: commit {commit[:10]} ({args.base}); best of {args.repeat} alternated runs each.\n")
    print("| input | base work s | now work s | now/base | base CPU s | now CPU s | base peak RSS MB "
          "| now peak RSS MB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    print("\n".join(rows))
    shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
