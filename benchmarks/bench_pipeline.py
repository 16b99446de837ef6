"""`tpuanalyze report DIR` end to end on generated pods: --workers 1 vs --workers 2 vs a baseline commit.

Why: the per-host map must pay off with the pod's size, and its memory must stay flat. For each pod
size (default 64 and 256 hosts; ResNet-50, 4 chips per host, every host written) the contenders run
side by side in one run, each in a fresh process: the baseline commit (default ``main``, laid out
from ``git archive`` and run through PYTHONPATH), then this tree with ``--workers 1`` and
``--workers 2``. Measured: wall seconds (ingest + analysis + JSON), peak RSS of the main process
(``wait4``) and peak RSS of the whole process tree (the main
process and its workers, sampled from /proc every 50 ms: the memory the machine must have). The
JSON reports are compared (equal, or which keys differ).

CPU seconds (user + system of the command and the worker processes it waited for, ``wait4``) are
measured beside wall seconds: on a shared machine the wall clock is noisy, CPU per event is the
comparable cost. ``--file-events N`` adds one large single-host file (``make_large_xspace.py``) as an
input beside the pods.

Usage (from the project root)::

    python benchmarks/bench_pipeline.py             # 64 and 256 hosts -> results/bench_pipeline.md
    python benchmarks/bench_pipeline.py --hosts 16 --no-write
    python benchmarks/bench_pipeline.py --ingest-only --hosts 64   # -> results/bench_pipeline_ingest.md
    python benchmarks/bench_pipeline.py --ingest-only --hosts 64 --pod-chips 4096 --file-events 2000000
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
    cpu_s: float  # user + system, the worker processes included
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
    cpu = usage.ru_utime + usage.ru_stime
    return Measured(label, wall, cpu, usage.ru_maxrss / 1024, peak[0] / 1024, report)


def count_events(path: Path) -> int:
    """Events of the XSpace files at ``path`` (a file or folder), as the reader counts them."""
    from tpuanalyze.parsers.xspace import XSpaceReader

    files = [path] if path.is_file() else sorted(path.glob("*.xplane.pb"))
    return sum(XSpaceReader(f).num_events for f in files)


def large_file(events: int, root: Path) -> tuple[Path, int]:
    """One large single-host XSpace file (``make_large_xspace.py``); (file, bytes)."""
    out = root / f"large{events}" / "plugins" / "profile" / "2026_01_01_00_00_00" / "tpu-host-0.xplane.pb"
    if not out.exists():
        subprocess.run([sys.executable, str(Path(__file__).parent / "make_large_xspace.py"), "--events",
                        str(events), "--out", str(out), "--no-verify"], check=True, capture_output=True)
    return out, out.stat().st_size


def generate(hosts: int, root: Path, pod_chips: int = 0) -> tuple[Path, int]:
    """A ResNet-50 pod of ``hosts`` hosts (4 chips each, all written; or the first ``hosts`` hosts
    of a ``pod_chips``-chip pod); (run folder, bytes)."""
    out = root / (f"pod{hosts}" if not pod_chips else f"pod{hosts}of{pod_chips}")
    chips = ["--chips", str(pod_chips), "--hosts", str(hosts)] if pod_chips else ["--chips", str(hosts * 4)]
    if not out.exists():
        subprocess.run([sys.executable, "-m", "tpuanalyze.cli", "generate", "--model", "resnet50", *chips,
                        "--out", str(out)], check=True, capture_output=True, cwd=root)
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
    parser.add_argument("--file-events", type=int, default=0,
                        help="also one single-host file of at least this many events (make_large_xspace.py)")
    parser.add_argument("--pod-chips", type=int, default=0,
                        help="the first HOSTS hosts of a pod of this many chips (default: 4 chips a host)")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2],
                        help="worker counts of this tree's contenders (default 1 2)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="alternate baseline and tree this many times (shown: each one's least CPU)")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    baseline_commit = snapshot_commit(args.baseline, args.work / "baseline")
    base_env = {**os.environ, "PYTHONPATH": str(args.work / "baseline" / "pkg")}
    head = snapshot_commit(args.commit, args.work / "tree")  # committed code, whatever the work tree holds
    tree_env = {**os.environ, "PYTHONPATH": str(args.work / "tree" / "pkg")}
    rows: list[tuple[str, int, int, list[Measured], list[str]]] = []
    inputs = [(f"{hosts} hosts" + (f" of {args.pod_chips} chips" if args.pod_chips else ""),
               *generate(hosts, args.work, args.pod_chips)) for hosts in args.hosts]
    if args.file_events:
        inputs.append(("1 file", *large_file(args.file_events, args.work)))
    for name, run, size in inputs:
        events = count_events(run)
        # each worker count runs with the baseline's default and its own: the baseline at the same count
        contenders = []
        for workers in args.workers:
            extra = ["--workers", str(workers)]
            contenders.append((f"baseline {args.baseline} ({baseline_commit[:10]}), --workers {workers}",
                               base_env, extra))
            contenders.append((f"this tree, --workers {workers}", tree_env, extra))
        best: dict[int, Measured] = {}
        for attempt in range(args.repeat):
            for index, (label, env, extra) in enumerate(contenders):
                slug = name.replace(" ", "")
                target = args.work / f"report-{slug}-{index}.json"
                target.unlink(missing_ok=True)
                cmd = [sys.executable, "-m", "tpuanalyze.cli", "report", str(run), "--json", str(target),
                       "-q", "--no-progress", *extra]
                if args.ingest_only:
                    db = args.work / f"ingest-{slug}-{index}.duckdb"
                    db.unlink(missing_ok=True)
                    cmd = [sys.executable, "-m", "tpuanalyze.cli", "ingest", str(run), "--db", str(db),
                           "--no-progress", *extra]
                print(f"{name}: {label} ({attempt + 1}/{args.repeat}) ...", flush=True)
                measured = run_with_rusage(label, cmd, env, target, args.work)
                if index not in best or measured.cpu_s < best[index].cpu_s:
                    best[index] = measured
                print(f"  {measured.wall_s:.1f} s wall, {measured.cpu_s:.1f} CPU s, "
                      f"main {measured.main_rss_mb:.0f} MB, tree {measured.tree_rss_mb:.0f} MB", flush=True)
        results = [best[i] for i in range(len(contenders))]
        same = []
        for i, r in enumerate(results):
            base = results[i - i % 2]
            if i % 2 == 0:
                same.append("")
            elif args.ingest_only:
                same.append("(not compared)")
            else:
                same.append(", ".join(run_lists(base.report, r.report)) or "identical")
        rows.append((name, size, events, results, same))
    text = render(rows, baseline_commit, head, "ingest DIR --db FILE" if args.ingest_only else "report DIR",
                  args.repeat)
    print(text)
    if not args.no_write:
        results = INGEST_RESULTS if args.ingest_only else RESULTS
        results.write_text(text, encoding="utf-8")
        print(f"wrote {results}")


def render(rows, baseline_commit: str, head: str, verb: str = "report DIR", repeat: int = 1) -> str:
    wall = "ingest + analysis + JSON" if verb.startswith("report") else "discover, read, load, views"
    lines = [
        f"# Pipeline: `tpuanalyze {verb}`, this tree vs the baseline at the same --workers",
        "",
        f"Written by `benchmarks/bench_pipeline.py` (tree {head[:10]}, baseline {baseline_commit[:10]}); "
        f"{platform.node()}, {os.cpu_count()} cores, python {platform.python_version()}. "
        f"Each contender in a fresh process, same files, baseline and tree alternated {repeat} time(s) "
        f"(the run of least CPU shown). Wall: {wall}. CPU: user + system, worker processes included. "
        "Tree RSS: the main process and its worker processes together (sampled every 50 ms).",
        "",
        "| input | MB | events | contender | wall s | CPU s | CPU us/event | CPU vs baseline "
        "| wall vs baseline | main peak RSS MB | tree peak RSS MB | JSON vs baseline |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, size, events, results, same in rows:
        for i, m in enumerate(results):
            base = results[i - i % 2]
            lines.append(
                f"| {name} | {size / 1e6:.0f} | {events:,} | {m.label} | {m.wall_s:.1f} | {m.cpu_s:.1f} | "
                f"{m.cpu_s / max(events, 1) * 1e6:.1f} | {base.cpu_s / m.cpu_s:.2f}x | "
                f"{base.wall_s / m.wall_s:.2f}x | "
                f"{m.main_rss_mb:.0f} | {m.tree_rss_mb:.0f} | {same[i]} |"
            )
    lines += ["", "`vs baseline`: the baseline's figure / the contender's, at the same --workers (above 1: "
              "faster).", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
