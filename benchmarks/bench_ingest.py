"""Ingest throughput and peak memory, side by side with two baselines, in one run.

Why: ingest is the one step that touches every event; it must stay fast at pod scale. Contenders,
each in its own fresh subprocess (peak RSS per process from ``os.wait4``'s rusage, so one contender's
memory never hides another's), all on the same large XSpace file (``make_large_xspace.py``):

- ``tpuanalyze ingest``: the real CLI into a real DuckDB file (wall time includes interpreter start),
  with the decoder it picks for the file, and again with each decoder forced
  (``TPUANALYZE_DECODER=numpy`` / ``compiled``: the numpy decoder is the previous code's);
- ``ingest_paths()``: the same ingest through the Python API, timed inside the process (work time);
- ``parsing only``: ``read_run`` (the ingest's reader, no database), to split ingest time into
  parsing and loading, with each decoder;
- ``xprof ProfileData``: XProf's own reader (the venv ``.ci/run`` installs, skipped with a message
  when absent): ``ProfileData.from_file`` then every event's name, start_ns, duration_ns and stats;
- ``protobuf iterate``: ``XSpace.ParseFromString`` then every event's metadata_id, offset_ps,
  duration_ps (the floor: decoding alone, nothing stored).

Prints a table (events, wall and work seconds, events/s, peak RSS MB, ratios vs xprof and vs the
protobuf floor), the file and database sizes, checks "ingest events/s >= 5x xprof" and "ingest peak
RSS <= 3 x file size + database size", checks the database holds every event, writes the report to
``benchmarks/results/bench_ingest.md``.

Usage (from the project root)::

    python benchmarks/bench_ingest.py                      # default 2M-event file in /tmp
    python benchmarks/bench_ingest.py --events 500000 --no-write   # a quick look, report untouched
    python benchmarks/bench_ingest.py --commit HEAD --repeat 2     # committed code, best of 2 rounds
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import duckdb

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_large_xspace import DEFAULT_OUT, LargeSpec  # noqa: E402

PROJECT_ROOT = Path(__file__).resolve().parents[1]
RESULTS = PROJECT_ROOT / "benchmarks" / "results" / "bench_ingest.md"
# the venv .ci/run installs XProf into (as bench_pod.py), unless told otherwise
_XPROF_VENV = os.environ.get("TPUANALYZE_XPROF_VENV", str(Path.home() / ".cache/tpuanalyze/xprof-venv"))
XPROF_PYTHON = os.environ.get("TPUANALYZE_XPROF_PYTHON", str(Path(_XPROF_VENV) / "bin/python"))
TARGET_RATIO_VS_XPROF = 5.0
TARGET_EVENTS_PER_S = 3_000_000  # one file, end to end (the CLI's reported time)
MEMORY_FACTOR = 3.0

# Child programs: each prints one JSON line {"events": n, "work_s": s} as its last stdout line;
# work_s starts after the imports (the CLI's reported time excludes them too).
XPROF_CHILD = r"""
import json, sys, time
from xprof import profile_data
t0 = time.perf_counter()
pd = profile_data.ProfileData.from_file(sys.argv[1])
n = 0
for plane in pd.planes:
    for line in plane.lines:
        for ev in line.events:
            ev.name; ev.start_ns; ev.duration_ns; ev.stats
            n += 1
print(json.dumps({"events": n, "work_s": time.perf_counter() - t0}))
"""

PROTOBUF_CHILD = r"""
import json, sys, time
from tpuanalyze.proto import xplane_pb2
t0 = time.perf_counter()
space = xplane_pb2.XSpace()
with open(sys.argv[1], "rb") as f:
    space.ParseFromString(f.read())
n = 0
for plane in space.planes:
    for line in plane.lines:
        for ev in line.events:
            ev.metadata_id; ev.offset_ps; ev.duration_ps
            n += 1
print(json.dumps({"events": n, "work_s": time.perf_counter() - t0}))
"""

API_CHILD = r"""
import json, sys, time
from tpuanalyze.pipeline import ingest_paths
t0 = time.perf_counter()
summary = ingest_paths([sys.argv[1]], sys.argv[2])
print(json.dumps({"events": summary.events, "work_s": time.perf_counter() - t0}))
"""


PARSE_CHILD = r"""
import json, sys, time
from tpuanalyze.parsers.discover import discover
from tpuanalyze.parsers.readers import read_run
t0 = time.perf_counter()
runs = [read_run(source) for source in discover([sys.argv[1]])]
print(json.dumps({"events": sum(r.num_events for r in runs), "work_s": time.perf_counter() - t0}))
"""

NOTES_MARK = "<!-- notes: kept when the benchmark rewrites this file -->"
CLI_SECONDS = re.compile(r" in ([0-9.]+) s into ")


@dataclass
class Result:
    contender: str
    events: int | None
    wall_s: float
    work_s: float | None
    peak_rss_mb: float
    cpu_s: float = 0.0

    @property
    def rate(self) -> float:
        """Events per second on the work time when measured, else on the wall time."""
        return (self.events or 0) / (self.work_s or self.wall_s)

    @property
    def cpu_rate(self) -> float:
        """Events per CPU second (all threads; interpreter start included): robust to a loaded machine."""
        return (self.events or 0) / self.cpu_s if self.cpu_s else 0.0


@dataclass
class Measured:
    wall_s: float
    cpu_s: float  # user + system CPU of the process (all its threads), interpreter start included
    peak_rss_mb: float
    stdout: str


def decoder_env(decoder: str | None) -> dict[str, str] | None:
    """The environment forcing ``TPUANALYZE_DECODER`` (None: the decoder the reader picks)."""
    if decoder is None:
        return None
    return {**os.environ, "TPUANALYZE_DECODER": decoder}


def run_measured(cmd: list[str], env: dict[str, str] | None = None) -> Measured:
    """Run ``cmd`` in a fresh process and measure it alone (``os.wait4`` rusage). Raises on failure."""
    started = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=PROJECT_ROOT)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - started
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(), err.read().decode()
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed ({proc.returncode}): {stderr.strip()[-2000:]}")
    # ru_maxrss is in KiB on Linux; reported in MB (10^6 bytes), the unit of the file and database sizes
    return Measured(wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024 / 1e6, stdout)


def child_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


def _timed_child(label: str, cmd: list[str], decoder: str | None = None) -> Result:
    """A child that prints {"events", "work_s"} as its last line, measured."""
    m = run_measured(cmd, decoder_env(decoder))
    data = child_json(m.stdout)
    return Result(label, data["events"], m.wall_s, data["work_s"], m.peak_rss_mb, m.cpu_s)


def bench_cli(trace: Path, db: Path, decoder: str | None = None) -> Result:
    beside = Path(sys.executable).with_name("tpuanalyze")  # the CLI of the interpreter running us
    exe = str(beside) if beside.exists() else shutil.which("tpuanalyze") or "tpuanalyze"
    remove_db(db)
    m = run_measured([exe, "ingest", str(trace), "--db", str(db)], decoder_env(decoder))
    reported = CLI_SECONDS.search(m.stdout)  # the CLI's own "... in X s into DB" (ingest work, no start-up)
    work = float(reported.group(1)) if reported else None
    label = "tpuanalyze ingest (CLI)" + (f", {decoder} decoder" if decoder else "")
    return Result(label, count_db_events(db), m.wall_s, work, m.peak_rss_mb, m.cpu_s)


def bench_api(trace: Path, db: Path) -> Result:
    remove_db(db)
    return _timed_child("ingest_paths() (API)", [sys.executable, "-c", API_CHILD, str(trace), str(db)])


def bench_parse_only(trace: Path, decoder: str | None = None) -> Result:
    label = "parsing only (read_run, no DB)" + (f", {decoder} decoder" if decoder else "")
    return _timed_child(label, [sys.executable, "-c", PARSE_CHILD, str(trace)], decoder)


def bench_xprof(trace: Path) -> Result | None:
    if not Path(XPROF_PYTHON).exists():
        print(f"SKIP xprof baseline: no interpreter at {XPROF_PYTHON} (set TPUANALYZE_XPROF_PYTHON)")
        return None
    return _timed_child("xprof ProfileData loop", [XPROF_PYTHON, "-c", XPROF_CHILD, str(trace)])


def bench_protobuf(trace: Path) -> Result:
    return _timed_child("protobuf parse + iterate", [sys.executable, "-c", PROTOBUF_CHILD, str(trace)])


def snapshot_commit(rev: str, dest: Path) -> str:
    """Lay out the package tree of git ``rev`` under ``dest`` (importable via PYTHONPATH); returns its id.

    Why: others edit the shared work tree all the time; benchmarking a commit measures code that
    exists, whatever state the working copy is in. Folders map to subpackages as in pyproject.toml.
    """
    import tomllib

    commit = subprocess.run(["git", "rev-parse", rev], cwd=PROJECT_ROOT, check=True, capture_output=True,
                            text=True).stdout.strip()
    source = dest / "src"
    shutil.rmtree(dest, ignore_errors=True)
    source.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", commit], cwd=PROJECT_ROOT, check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(source)], input=archive.stdout, check=True)
    config = tomllib.loads((source / "pyproject.toml").read_text())
    for package, folder in config["tool"]["setuptools"]["package-dir"].items():
        shutil.copytree(source / folder, dest / "pkg" / Path(*package.split(".")), dirs_exist_ok=True)
    return commit


def remove_db(db: Path) -> None:
    for path in (db, db.with_name(db.name + ".wal")):
        path.unlink(missing_ok=True)


def db_bytes(db: Path) -> int:
    return sum(p.stat().st_size for p in (db, db.with_name(db.name + ".wal")) if p.exists())


def count_db_events(db: Path) -> int:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute("SELECT count(*) FROM events").fetchone()[0]


def versions() -> str:
    import google.protobuf

    parts = [f"python {platform.python_version()}", f"duckdb {duckdb.__version__}",
             f"protobuf {google.protobuf.__version__}"]
    try:
        import pyarrow

        parts.append(f"pyarrow {pyarrow.__version__}")
    except ImportError:
        pass
    if Path(XPROF_PYTHON).exists():
        code = "import importlib.metadata as m; print(m.version('xprof'))"
        probe = subprocess.run([XPROF_PYTHON, "-c", code], capture_output=True, text=True)
        if probe.returncode == 0:
            parts.append(f"xprof {probe.stdout.strip()}")
    return ", ".join(parts)


def render(results: list[Result], trace: Path, file_mb: float, db_mb: float, expected: int,
           checks: list[tuple[str, bool, str]], repeat: int, code: str) -> str:
    xprof = next((r for r in results if r.contender.startswith("xprof")), None)
    floor = next(r for r in results if r.contender.startswith("protobuf"))
    header = ("| contender | events | wall s | work s | CPU s | events/s | events/CPU-s | peak RSS MB "
              "| vs xprof | vs xprof (CPU) | vs protobuf |\n"
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    rows = []
    for r in results:
        vs_xprof = f"{r.rate / xprof.rate:.2f}x" if xprof else "n/a"
        vs_xprof_cpu = f"{r.cpu_rate / xprof.cpu_rate:.2f}x" if xprof else "n/a"
        rows.append(
            f"| {r.contender} | {r.events:,} | {r.wall_s:.2f} | "
            f"{'' if r.work_s is None else f'{r.work_s:.2f}'} | {r.cpu_s:.2f} | {r.rate:,.0f} | "
            f"{r.cpu_rate:,.0f} | {r.peak_rss_mb:,.0f} | "
            f"{vs_xprof} | {vs_xprof_cpu} | {r.rate / floor.rate:.2f}x |"
        )
    lines = [
        "# Ingest benchmark",
        "",
        f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {os.cpu_count()} CPUs "
        f"({platform.processor() or platform.machine()}); {versions()}; tpuanalyze code: {code}.",
        "",
        f"File: `{trace}` ({expected:,} events, {file_mb:.1f} MB, written by `make_large_xspace.py`); "
        f"database after ingest: {db_mb:.1f} MB.",
        "",
        "events/s uses the work time (timed inside the process: load + iterate, or the whole ingest; for "
        "the CLI the time it reports) when there is one, else the wall time of the process (interpreter "
        "start included). CPU s: user + system time of the whole process, all threads (so DuckDB's "
        "parallelism counts against us there; the CPU ratio is the one that load from other processes "
        "does not distort). Peak RSS is the "
        "process's own maximum resident set (os.wait4 rusage), each contender in a fresh process; "
        f"fastest of {repeat} round-robin run(s) per contender. The machine is shared, "
        "so absolute times vary between runs; ratios come from the same run.",
        "",
        header,
        *rows,
        "",
        "Checks:",
        "",
        *[f"- {'PASS' if ok else 'FAIL'}: {name} ({detail})" for name, ok, detail in checks],
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT_OUT, help="written first when missing")
    parser.add_argument("--events", type=int, default=LargeSpec.events, help="events when writing the trace")
    parser.add_argument("--regenerate", action="store_true", help="rewrite the trace even when present")
    parser.add_argument("--db", type=Path, help="database file (default: a fresh temporary folder per run)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per contender; the fastest is kept")
    parser.add_argument("--commit", help="benchmark this git commit (e.g. HEAD) instead of the working tree")
    parser.add_argument("--no-write", action="store_true", help=f"do not write {RESULTS.name}")
    parser.add_argument("--no-xprof", action="store_true", help="skip the XProf baseline (32 s, 2.3 GB)")
    parser.add_argument("--results", type=Path, default=RESULTS, help="report file to write")
    args = parser.parse_args(argv)

    # Private scratch per run: two benchmark runs at once must not share a database or a snapshot.
    scratch = Path(tempfile.mkdtemp(prefix="tpuanalyze_bench_"))
    args.db = args.db or scratch / "bench.duckdb"
    code = "the installed working tree"
    if args.commit:
        commit = snapshot_commit(args.commit, scratch / "commit")
        os.environ["PYTHONPATH"] = str(scratch / "commit" / "pkg")
        code = f"commit {commit[:10]}"
    print(f"benchmarking {code}", flush=True)
    if args.regenerate or not args.trace.exists():
        # in a child process: a contender's peak RSS (``os.wait4``) includes the memory this process
        # had when it started the contender (Linux keeps the larger of the address spaces before and
        # after ``exec``), and writing the file here took this process to 229 MB, every contender's
        # figure then
        print(f"writing {args.trace} ...", flush=True)
        subprocess.run([sys.executable, str(Path(__file__).with_name("make_large_xspace.py")),
                        "--out", str(args.trace), "--events", str(args.events)], check=True)
    expected = bench_protobuf(args.trace).events
    file_mb = args.trace.stat().st_size / 1e6
    args.db.parent.mkdir(parents=True, exist_ok=True)

    contenders = {
        "tpuanalyze ingest (CLI)": lambda: bench_cli(args.trace, args.db),
        "ingest_paths() (API)": lambda: bench_api(args.trace, args.db),
        "ingest (CLI), numpy decoder": lambda: bench_cli(args.trace, args.db, "numpy"),
        "ingest (CLI), compiled decoder": lambda: bench_cli(args.trace, args.db, "compiled"),
        "parsing only, numpy decoder": lambda: bench_parse_only(args.trace, "numpy"),
        "parsing only, compiled decoder": lambda: bench_parse_only(args.trace, "compiled"),
        "xprof ProfileData loop": lambda: None if args.no_xprof else bench_xprof(args.trace),
        "protobuf parse + iterate": lambda: bench_protobuf(args.trace),
    }
    best: dict[str, Result] = {}
    # Round-robin, so that load from other processes on a shared machine hits every contender alike.
    for attempt in range(1, max(args.repeat, 1) + 1):
        for name, bench in list(contenders.items()):
            print(f"running {name} ({attempt}/{args.repeat}) ...", flush=True)
            result = bench()
            if result is None:
                del contenders[name]
                continue
            print(f"  {result.events:,} events, wall {result.wall_s:.2f} s, work "
                  f"{result.work_s or float('nan'):.2f} s, cpu {result.cpu_s:.2f} s, "
                  f"peak {result.peak_rss_mb:.0f} MB", flush=True)
            if name not in best or result.rate > best[name].rate:
                best[name] = result
    results = list(best.values())
    db_mb = db_bytes(args.db) / 1e6

    ingest = best["tpuanalyze ingest (CLI)"]
    api = best["ingest_paths() (API)"]
    xprof = next((r for r in results if r.contender.startswith("xprof")), None)
    checks = [("database holds every event", ingest.events == expected == api.events,
               f"{ingest.events:,} in the DB via the CLI, {api.events:,} via the API, "
               f"{expected:,} in the file")]
    if xprof:
        for r in (ingest, api):
            ratio, cpu_ratio = r.rate / xprof.rate, r.cpu_rate / xprof.cpu_rate
            checks.append((f"{r.contender} >= {TARGET_RATIO_VS_XPROF:.0f}x xprof events/s",
                           ratio >= TARGET_RATIO_VS_XPROF, f"{ratio:.2f}x"))
            checks.append((f"{r.contender} >= {TARGET_RATIO_VS_XPROF:.0f}x xprof events per CPU second",
                           cpu_ratio >= TARGET_RATIO_VS_XPROF, f"{cpu_ratio:.2f}x"))
    else:
        why = "--no-xprof" if args.no_xprof else "interpreter missing"
        checks.append(("ratio vs xprof", False, f"xprof baseline skipped: {why}"))
    for r in results:
        if r.contender.startswith("tpuanalyze ingest"):
            checks.append((f"{r.contender} >= {TARGET_EVENTS_PER_S / 1e6:.0f}M events/s end to end",
                           r.rate >= TARGET_EVENTS_PER_S, f"{r.rate / 1e6:.2f}M events/s"))
    budget = MEMORY_FACTOR * file_mb + db_mb
    for r in (ingest, api):
        checks.append((f"{r.contender} peak RSS <= {MEMORY_FACTOR:.0f} x file + database",
                       r.peak_rss_mb <= budget, f"{r.peak_rss_mb:.0f} MB vs {budget:.0f} MB"))

    report = render(results, args.trace, file_mb, db_mb, expected, checks, max(args.repeat, 1), code)
    print()
    print(report)
    if not args.no_write:
        out = args.results
        out.parent.mkdir(parents=True, exist_ok=True)
        old = out.read_text() if out.exists() else ""
        notes = old[old.index(NOTES_MARK):] if NOTES_MARK in old else NOTES_MARK + "\n"
        out.write_text(report + "\n" + notes)
        print(f"wrote {out}")
    shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
