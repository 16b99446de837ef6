"""XSpace decoding alone: the numpy decoder vs the compiled (numba) kernels, in one process.

Why: ``bench_ingest.py`` times whole processes, where the compiled decoder's one-off cost (numba
import, kernel load) and DuckDB's inserts are mixed in. Here the one-off cost is measured on its
own, then each decoder streams every batch of the same file (``XSpaceReader``, no database),
alternated ``--repeat`` times; events/s on wall and on CPU time (CPU is the figure a shared,
loaded machine distorts least).

Usage (from the project root)::

    python benchmarks/bench_decode.py /tmp/large.xplane.pb --repeat 3
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def stream(path: Path, jit: object) -> tuple[int, float, float]:
    """(events, wall s, CPU s) of validating the file and streaming all of its batches."""
    from tpuanalyze.parsers.xspace import XSpaceReader

    wall, cpu = time.perf_counter(), time.process_time()
    reader = XSpaceReader(path)
    reader._jit = jit
    events = sum(batch.num_rows for plane in reader.planes() for batch in plane.batches)
    return events, time.perf_counter() - wall, time.process_time() - cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    import os

    os.environ["TPUANALYZE_DECODER"] = "numpy"  # no background warm-up: it is timed below
    from tpuanalyze.parsers import xspace

    before = rss_mb()
    wall, cpu = time.perf_counter(), time.process_time()
    os.environ["TPUANALYZE_DECODER"] = "compiled"
    jit = xspace.compiled_decoder()
    os.environ["TPUANALYZE_DECODER"] = "numpy"
    warm_wall, warm_cpu = time.perf_counter() - wall, time.process_time() - cpu
    after = rss_mb()
    best: dict[str, tuple[int, float, float]] = {}
    for _ in range(args.repeat):
        for label, decoder in (("numpy decoder", None), ("compiled decoder", jit)):
            got = stream(args.trace, decoder)
            if label not in best or got[1] < best[label][1]:
                best[label] = got
    numpy_cpu = best["numpy decoder"][2]
    print(f"File `{args.trace}`; best of {args.repeat} alternated runs; numba import + kernel load "
          f"(once per process): {warm_wall:.2f} s wall, {warm_cpu:.2f} CPU s, RSS {before:.0f} -> "
          f"{after:.0f} MB.\n")
    print("| decoder | events | wall s | CPU s | events/s | events/CPU-s | CPU vs numpy |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label, (events, wall_s, cpu_s) in best.items():
        print(f"| {label} | {events:,} | {wall_s:.2f} | {cpu_s:.2f} | {events / wall_s:,.0f} | "
              f"{events / cpu_s:,.0f} | {numpy_cpu / cpu_s:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
