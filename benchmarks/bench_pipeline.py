"""`tpuanalyze report DIR` end to end on generated pods: --workers 1 vs --workers 2 vs a baseline commit.

Why: the per-host map must pay off with the pod's size, and its memory must stay flat. For each pod
size (default 64 and 256 hosts; ResNet-50, 4 chips per host, every host written) the contenders run
side by side in one run, each in a fresh process: the baseline commit (default ``main``, laid out
from ``git archive`` and run through PYTHONPATH), then this tree with ``--workers 1`` and
``--workers 2``. Measured: wall seconds (ingest + analysis + JSON), peak RSS of the main process
(``wait4``) and peak RSS of the whole process tree (the main
process and its workers, sampled from /proc every 50 ms: the memory the machine must have). The
JSON reports are compared (equal, or which keys differ).

Usage (from the project root)::

    python benchmarks/bench_pipeline.py             # 64 and 256 hosts -> results/bench_pipeline.md
    python benchmarks/bench_pipeline.py --hosts 16 --no-write
    python benchmarks/bench_pipeline.py --ingest-only --hosts 64   # -> results/bench_pipeline_ingest.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_ingest import snapshot_commit  # noqa: E402

PROJECT_ROOT = Path(__file__).resolve().parents[1]
RESULTS = PROJECT_ROOT / "benchmarks" / "results" / "bench_pipeline.md"
INGEST_RESULTS = PROJECT_ROOT / "benchmarks" / "results" / "bench_pipeline_ingest.md"


@dataclass
class Measured:
    label: str
    wall_s: float
    main_rss_mb: float
    tree_rss_mb: float
    report: dict | None


def _tree_rss_kb(root: int) -> int:
    """Sum of VmRSS over ``root`` and its descendants (0 for processes already gone)."""
    total, stack, seen = 0, [root], set()
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            with open(f"/proc/{pid}/status") as fh:
                for line in fh:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
                        break
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as fh:
                    stack.extend(int(c) for c in fh.read().split())
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return total


def run_with_rusage(label: str, cmd: list[str], env: dict[str, str], json_path: Path, cwd: Path) -> Measured:
    """Wall time, the main process's own peak RSS (``wait4``: its workers are not counted there) and
    the whole tree's peak RSS (sampled)."""
    started = time.perf_counter()
    # cwd outside the project: `python -m` puts the cwd first on sys.path, ahead of PYTHONPATH
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=cwd)
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _tree_rss_kb(proc.pid))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, status, usage = os.wait4(proc.pid, 0)
    done.set()
    sampler.join()
    wall = time.perf_counter() - started
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{label} failed ({proc.returncode}): {err.strip()[-2000:]}")
    report = json.loads(json_path.read_text()) if json_path.exists() else None
    return Measured(label, wall, usage.ru_maxrss / 1024, peak[0] / 1024, report)


def generate(hosts: int, root: Path) -> tuple[Path, int]:
    """A ResNet-50 pod of ``hosts`` hosts (4 chips each, all written); (run folder, events)."""
    out = root / f"pod{hosts}"
    if not out.exists():
        subprocess.run([sys.executable, "-m", "tpuanalyze.cli", "generate", "--model", "resnet50",
                        "--chips", str(hosts * 4), "--out", str(out)], check=True, capture_output=True,
                       cwd=root)
    run = next((out / "plugins" / "profile").iterdir())
    return run, sum(p.stat().st_size for p in run.glob("*.xplane.pb"))


def differing_keys(a: dict | None, b: dict | None, prefix: str = "") -> list[str]:
    if a == b:
        return []
    if not isinstance(a, dict) or not isinstance(b, dict):
        return [prefix or "(root)"]
    keys = sorted(set(a) | set(b))
    out: list[str] = []
    for key in keys:
        out += differing_keys(a.get(key), b.get(key), f"{prefix}.{key}" if prefix else key)
    return out


def run_lists(a: dict | None, b: dict | None) -> list[str]:
    """Differing keys of the first run objects (runs is a list)."""
    if a is None or b is None:
        return ["(missing report)"]
    ra, rb = a.get("runs", [{}])[0], b.get("runs", [{}])[0]
    return differing_keys(ra, rb) + differing_keys({k: v for k, v in a.items() if k != "runs"},
                                                   {k: v for k, v in b.items() if k != "runs"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--baseline", default="main", help="git revision of the baseline (default main)")
    parser.add_argument("--commit", default="HEAD", help="revision run with --workers")
    parser.add_argument("--work", type=Path, default=Path("/tmp/tpuanalyze_bench_pipeline"))
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--ingest-only", action="store_true",
                        help="time `tpuanalyze ingest DIR --db FILE` instead of `report DIR`")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    baseline_commit = snapshot_commit(args.baseline, args.work / "baseline")
    base_env = {**os.environ, "PYTHONPATH": str(args.work / "baseline" / "pkg")}
    head = snapshot_commit(args.commit, args.work / "tree")  # committed code, whatever the work tree holds
    tree_env = {**os.environ, "PYTHONPATH": str(args.work / "tree" / "pkg")}
    rows: list[tuple[int, int, list[Measured], list[str]]] = []
    for hosts in args.hosts:
        run, size = generate(hosts, args.work)
        results: list[Measured] = []
        contenders = [
            (f"baseline {args.baseline} ({baseline_commit[:10]})", base_env, []),
            ("--workers 1", tree_env, ["--workers", "1"]),
            ("--workers 2", tree_env, ["--workers", "2"]),
        ]
        for label, env, extra in contenders:
            target = args.work / f"report-{hosts}-{len(results)}.json"
            target.unlink(missing_ok=True)
            cmd = [sys.executable, "-m", "tpuanalyze.cli", "report", str(run), "--json", str(target), "-q",
                   "--no-progress", *extra]
            if args.ingest_only:
                db = args.work / f"ingest-{hosts}-{len(results)}.duckdb"
                db.unlink(missing_ok=True)
                cmd = [sys.executable, "-m", "tpuanalyze.cli", "ingest", str(run), "--db", str(db),
                       "--no-progress", *extra]
            print(f"{hosts} hosts: {label} ...", flush=True)
            measured = run_with_rusage(label, cmd, env, target, args.work)
            results.append(measured)
            print(f"  {measured.wall_s:.1f} s, main {measured.main_rss_mb:.0f} MB, "
                  f"tree {measured.tree_rss_mb:.0f} MB", flush=True)
        same = ["(not compared)" if args.ingest_only else ", ".join(run_lists(results[0].report, r.report))
                or "identical" for r in results[1:]]
        rows.append((hosts, size, results, same))
    text = render(rows, baseline_commit, head, "ingest DIR --db FILE" if args.ingest_only else "report DIR")
    print(text)
    if not args.no_write:
        results = INGEST_RESULTS if args.ingest_only else RESULTS
        results.write_text(text, encoding="utf-8")
        print(f"wrote {results}")


def render(rows, baseline_commit: str, head: str, verb: str = "report DIR") -> str:
    wall = "ingest + analysis + JSON" if verb.startswith("report") else "discover, read, load, views"
    lines = [
        f"# Pipeline: `tpuanalyze {verb}` on generated pods, --workers 1 vs 2 vs the baseline",
        "",
        f"Written by `benchmarks/bench_pipeline.py` (tree {head[:10]}, baseline {baseline_commit[:10]}); "
        f"{platform.node()}, {os.cpu_count()} cores, python {platform.python_version()}. "
        f"Each contender in a fresh process, one run, same files. Wall: {wall}. "
        "Tree RSS: the main process and its worker processes together (sampled every 50 ms).",
        "",
        "| hosts | input MB | contender | wall s | vs baseline | main peak RSS MB | tree peak RSS MB "
        "| JSON vs baseline |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for hosts, size, results, same in rows:
        base = results[0].wall_s
        for i, m in enumerate(results):
            verdict = "" if i == 0 else same[i - 1]
            lines.append(
                f"| {hosts} | {size / 1e6:.0f} | {m.label} | {m.wall_s:.1f} | {base / m.wall_s:.2f}x | "
                f"{m.main_rss_mb:.0f} | {m.tree_rss_mb:.0f} | {verdict} |"
            )
    lines += ["", "`vs baseline`: baseline wall / contender wall (above 1: faster).", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
