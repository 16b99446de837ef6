"""Benchmark: `tpuanalyze report DIR` on generated pod runs of 64 to 512 hosts, beside XProf's overview.

    python benchmarks/bench_pod.py [--hosts 64,128,256,512] [--cache /tmp/tpuanalyze_pod] [--no-xprof]
                                   [--rounds N]

For each host count, a ResNet-50 run of the 4096-chip pod (`tpuanalyze generate --chips 4096 --hosts N`:
the same pod, N of its hosts written, so every host file holds the same work) is generated once under
the cache folder and reused by later runs. Each measured job runs in its own child process, timed and
measured alone (wall seconds, CPU seconds and peak RSS from ``os.wait4``):

- ``report DIR``: ours end to end from the raw files, as users run it (its temporary database); with
  ``--baseline``, the other build's too, and whether the two JSON documents are the same;
- ``ingest DIR --db``: the files into a database kept in the cache (every event stored);
- ``report DB``: ours, the analysis alone on that database (the analysis of a database ingested before),
  and whether its JSON is ``report DIR``'s;
- XProf: ``xspace_to_tool_data(files, 'overview_page')`` (what ``xprof get_overview`` computes) in the
  XProf venv, on symbolic links to the run's files in a scratch folder, since XProf writes its cache
  (``ALL_HOSTS.op_stats_v2.pb``) beside the files it reads.

Prints a table with the ratios (ours / XProf; per-event cost against the smallest run) and writes
``benchmarks/results/pod.md``. Targets on 2 cores: at 512 hosts ours <= 1/3 of XProf's time, peak RSS
<= 1 GB, flat from 64 to 512 hosts, per-event cost at 512 hosts within 1.5x of 64 hosts.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

XPROF_PYTHON = os.environ.get("TPUANALYZE_XPROF_PYTHON", "/root/.cache/tpuanalyze/xprof-venv/bin/python")
XPROF_JOB = r"""
import sys
from xprof.convert import raw_to_tool_data
data = raw_to_tool_data.xspace_to_tool_data(sys.argv[1:], "overview_page", {})[0]
print("XPROF_BYTES", len(data or b""))
"""
RESULTS = Path(__file__).with_name("results") / "pod.md"
CHIPS = 4096


def tpuanalyze_exe() -> str:
    """The CLI of the interpreter running this benchmark (its venv), else the one on PATH."""
    beside = Path(sys.executable).with_name("tpuanalyze")
    return str(beside) if beside.exists() else (shutil.which("tpuanalyze") or "tpuanalyze")


def analysis_job(exe: str, db: Path, out: Path) -> dict:
    """``report DB`` (the analysis alone), its JSON report read back."""
    job = measure([exe, "report", str(db), "--json", str(out), "-q", "--no-progress"])
    job["json"] = json.loads(out.read_text())
    return job


def json_differences(a: object, b: object, path: str = "") -> list[str]:
    """Where two report JSONs differ, floats to 1e-9 relative (parallel sums differ in the last digits
    from run to run) and the header's tool version aside."""
    import math

    if isinstance(a, dict) and isinstance(b, dict):
        keys = (set(a) | set(b)) - {"tool_version"}
        return [d for k in sorted(keys) for d in json_differences(a.get(k), b.get(k), f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} vs {len(b)} items"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True))
                for d in json_differences(x, y, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, float):
        return [] if math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12) else [f"{path}: {a} vs {b}"]
    return [] if a == b else [f"{path}: {a!r} vs {b!r}"]


def measure(argv: list[str], env: dict[str, str] | None = None) -> dict[str, float]:
    """Wall and CPU seconds and peak RSS (MB) of one child process, measured alone (os.wait4)."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    err = proc.stderr.read() if proc.stderr else b""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(argv)}\n{err.decode()[-3000:]}")
    return {"seconds": wall, "cpu_seconds": usage.ru_utime + usage.ru_stime,
            "peak_rss_mb": usage.ru_maxrss / 1024}


def generated_run(cache: Path, hosts: int) -> Path:
    """The N-host run's folder, generated once (a marker file says the folder is complete)."""
    out = cache / f"resnet50-h{hosts}"
    done = out / ".complete"
    if not done.exists():
        shutil.rmtree(out, ignore_errors=True)
        print(f"generating {hosts} hosts into {out} ...", flush=True)
        subprocess.run([tpuanalyze_exe(), "generate", "--model", "resnet50", "--chips", str(CHIPS),
                        "--hosts", str(hosts), "--out", str(out)], check=True, stdout=subprocess.DEVNULL)
        done.write_text("")
    return out


def xspace_files(run_dir: Path) -> list[Path]:
    return sorted(run_dir.rglob("*.xplane.pb"))


def run_events(db: Path) -> int:
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        return int(con.execute("SELECT sum(num_events) FROM runs").fetchone()[0])
    finally:
        con.close()


def bench_size(cache: Path, hosts: int, xprof: bool, reuse_db: bool, baseline: str | None,
               baseline_max_hosts: int, rounds: int = 1) -> dict:
    run_dir = generated_run(cache, hosts)
    files = xspace_files(run_dir)
    db = cache / f"resnet50-h{hosts}.duckdb"
    row: dict = {"hosts": hosts, "files": len(files), "bytes": sum(f.stat().st_size for f in files)}
    exe = tpuanalyze_exe()
    xprof = xprof and Path(XPROF_PYTHON).exists()
    with tempfile.TemporaryDirectory(prefix="bench_pod-") as tmp:
        def xprof_argv() -> list[str]:
            """XProf's job on links in a folder of their own: XProf caches what it computed beside the
            files it reads, and a second run in the same folder would only read that cache back."""
            links = Path(tempfile.mkdtemp(prefix="xprof-", dir=tmp))
            for i, f in enumerate(files):
                (links / f"{i}_{f.name}").symlink_to(f.resolve())
            return [XPROF_PYTHON, "-c", XPROF_JOB, *sorted(map(str, links.iterdir()))]
        if not reuse_db:
            # report DIR as users run it: from the raw files, into its temporary database; with
            # ``rounds``, alternated with XProf, each pair's ratio kept (the machine's speed drifts)
            pairs = []
            for number in range(rounds):
                print(f"[{hosts} hosts] report DIR (round {number + 1} of {rounds}) ...", flush=True)
                ours = measure([exe, "report", str(run_dir), "--json", f"{tmp}/e2e.json", "-q",
                                "--no-progress"])
                theirs = None
                if xprof and rounds > 1:
                    print(f"[{hosts} hosts] XProf overview_page (round {number + 1} of {rounds}) ...",
                          flush=True)
                    theirs = measure(xprof_argv())
                pairs.append((ours, theirs))
            row["e2e"] = _median_job([ours for ours, _ in pairs])
            if rounds > 1 and xprof:
                row["xprof"] = _median_job([theirs for _, theirs in pairs])
                row["rounds"] = [{"e2e_s": ours["seconds"], "xprof_s": theirs["seconds"],
                                  "ratio": ours["seconds"] / theirs["seconds"]} for ours, theirs in pairs]
            e2e_json = json.loads(Path(f"{tmp}/e2e.json").read_text())
            if baseline and hosts <= baseline_max_hosts:
                print(f"[{hosts} hosts] report DIR with the baseline build ...", flush=True)
                row["baseline_e2e"] = measure([baseline, "report", str(run_dir), "--json",
                                               f"{tmp}/base_e2e.json", "-q", "--no-progress"])
                differences = json_differences(json.loads(Path(f"{tmp}/base_e2e.json").read_text()),
                                               e2e_json)
                row["same_e2e_json_as_baseline"] = not differences
                row["e2e_json_differences"] = differences[:20]
        if not (reuse_db and db.exists()):
            db.unlink(missing_ok=True)
            print(f"[{hosts} hosts] ingest DIR --db ...", flush=True)
            row["ingest"] = measure([exe, "ingest", str(run_dir), "--db", str(db), "--no-progress"])
        row["events"] = run_events(db)
        print(f"[{hosts} hosts] report DB ...", flush=True)
        row["analysis"] = analysis_job(exe, db, Path(tmp) / "analysis.json")
        document = row["analysis"].pop("json")
        row["breakdown"] = document["runs"][0]["breakdown"]
        if "e2e" in row:  # the map's report and the database's report are the same
            differences = json_differences(document, e2e_json)
            row["same_json_dir_and_db"] = not differences
            row["dir_db_json_differences"] = differences[:20]
        if baseline and hosts <= baseline_max_hosts:
            print(f"[{hosts} hosts] report DB with the baseline build ...", flush=True)
            row["baseline_analysis"] = analysis_job(baseline, db, Path(tmp) / "baseline.json")
            differences = json_differences(row["baseline_analysis"].pop("json"), document)
            row["same_json_as_baseline"] = not differences
            row["json_differences"] = differences[:20]
        if xprof and "xprof" not in row:
            print(f"[{hosts} hosts] XProf overview_page ...", flush=True)
            row["xprof"] = measure(xprof_argv())
    return row


def _median_job(jobs: list[dict]) -> dict:
    """The job of median wall time (the lower middle one of an even count)."""
    return sorted(jobs, key=lambda job: job["seconds"])[(len(jobs) - 1) // 2]


def _cell(job: dict | None) -> str:
    """wall s / CPU s / peak RSS MB of one job."""
    if not job:
        return "-"
    return f"{job['seconds']:.1f} / {job['cpu_seconds']:.1f} / {job['peak_rss_mb']:,.0f}"


def table(rows: list[dict]) -> str:
    """Markdown table: each job's wall and CPU seconds and peak RSS, ours / XProf (wall, the target's
    basis, and CPU), per-event CPU cost against the smallest run."""
    def sec(r: dict, job: str, key: str) -> float | None:
        return r[job][key] if r.get(job) else None

    def ratio(a: float | None, b: float | None) -> str:
        return f"{a / b:.2f}x" if a and b else "-"

    def per_event(r: dict, job: str) -> float | None:
        cpu = sec(r, job, "cpu_seconds")
        return cpu / r["events"] * 1e6 if cpu else None

    base = rows[0]
    lines = ["| hosts | events | report DIR: wall s / CPU s / RSS MB | baseline build's report DIR "
             "| ingest --db | analysis (report DB) | baseline build's analysis | XProf overview_page "
             "| DIR / XProf: wall, CPU | CPU us/event DIR, analysis | vs smallest: DIR, analysis |",
             "|" + "---|" * 11]
    for r in rows:
        pe_dir, pe_an = per_event(r, "e2e"), per_event(r, "analysis")
        wall = ratio(sec(r, 'e2e', 'seconds'), sec(r, 'xprof', 'seconds'))
        if r.get("rounds"):  # alternated pairs: their median ratio, and the range
            ratios = sorted(pair["ratio"] for pair in r["rounds"])
            wall = f"{statistics.median(ratios):.2f}x (pairs {', '.join(f'{x:.2f}' for x in ratios)})"
        cells = [str(r["hosts"]), f"{r['events']:,}", _cell(r.get("e2e")), _cell(r.get("baseline_e2e")),
                 _cell(r.get("ingest")), _cell(r["analysis"]), _cell(r.get("baseline_analysis")),
                 _cell(r.get("xprof")),
                 f"{wall}, "
                 f"{ratio(sec(r, 'e2e', 'cpu_seconds'), sec(r, 'xprof', 'cpu_seconds'))}",
                 f"{pe_dir:.2f}, {pe_an:.2f}" if pe_dir else f"-, {pe_an:.2f}",
                 f"{ratio(pe_dir, per_event(base, 'e2e'))}, {ratio(pe_an, per_event(base, 'analysis'))}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", default="64,128,256,512", help="comma-separated host counts")
    parser.add_argument("--cache", type=Path, default=Path("/tmp/tpuanalyze_pod"),
                        help="generated runs and kept databases (reused between runs)")
    parser.add_argument("--no-xprof", action="store_true", help="skip XProf")
    parser.add_argument("--reuse-db", action="store_true",
                        help="keep a database already in the cache: time the analysis only, not report DIR")
    parser.add_argument("--baseline", metavar="CLI", default=None,
                        help="another build's tpuanalyze CLI: its `report DIR` and `report DB` beside ours "
                             "on the same files and database (seconds, RSS, whether the JSON is the same)")
    parser.add_argument("--baseline-max-hosts", type=int, default=128,
                        help="run the baseline build only up to this many hosts (a whole-run analysis "
                             "needs ~1.1 GB per million events)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="report DIR and XProf alternated this many times: the table gives the median "
                             "job and the median of the pairs' wall-time ratios (this machine's speed drifts "
                             "by up to a third between runs)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    sizes = sorted(int(h) for h in args.hosts.split(","))
    rows = [bench_size(args.cache, h, not args.no_xprof, args.reuse_db, args.baseline,
                       args.baseline_max_hosts, args.rounds)
            for h in sizes]
    text = table(rows)
    print(text)
    detail = json.dumps(rows, indent=1)
    args.out.write_text(
        f"# bench_pod\n\nResNet-50, 4096-chip pod, N hosts written (`generate --chips {CHIPS} --hosts N`), "
        f"10 steps, seed 0; {os.cpu_count()} cores; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}."
        f"\nEach job in its own child process (wall s, peak RSS from os.wait4).\n\n{text}\n\n"
        f"<details><summary>raw</summary>\n\n```json\n{detail}\n```\n</details>\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
