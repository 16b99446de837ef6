"""Profile: CPU and wall seconds of every SQL statement `analyze_run` sends, grouped by the relation it
creates (attribution stages, per-host batches summed) or by its first words (the reduce readers).

    python benchmarks/profile_stages.py DB [--run-id 1] [--top 30]

Where the analysis time goes, statement by statement, on an ingested database (e.g. the 64-host pod of
``tpuanalyze generate --model resnet50 --chips 4096 --hosts 64``). CPU seconds are the process's (DuckDB's
threads included): on a shared, loaded machine they are the comparable figure, wall seconds are not.
The batches of hosts run one at a time here (``TPUANALYZE_BATCH_THREADS=1``), so each statement's time is
its own; ``tpuanalyze report`` runs two at once.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import time
from collections import defaultdict
from typing import Any

_CREATES = re.compile(r"(?:TABLE|VIEW|INTO)\s+(?:IF NOT EXISTS\s+)?(\S+)")


class TimedConnection:
    """A DuckDB connection whose ``execute`` records CPU and wall seconds per statement key."""

    def __init__(self, con: Any) -> None:
        self._con = con
        self.cpu: dict[str, float] = defaultdict(float)
        self.wall: dict[str, float] = defaultdict(float)
        self.count: dict[str, int] = defaultdict(int)

    def execute(self, query: str, *args: Any, **kwargs: Any) -> TimedConnection:
        c0, t0 = time.process_time(), time.perf_counter()
        self._con.execute(query, *args, **kwargs)
        match = _CREATES.search(query)
        key = re.sub(r"^ta_h_", "", match.group(1)) if match else " ".join(query.split())[:70]
        self.cpu[key] += time.process_time() - c0
        self.wall[key] += time.perf_counter() - t0
        self.count[key] += 1
        return self

    def __getattr__(self, name: str) -> Any:  # fetchall, fetchone, df, ... of the last statement
        return getattr(self._con, name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("db")
    parser.add_argument("--run-id", type=int, default=1)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()

    # one batch at a time, on this connection: the batches' threads would run their statements on
    # cursors this wrapper does not see, and each statement's CPU seconds would be both threads'
    os.environ["TPUANALYZE_BATCH_THREADS"] = "1"
    from tpuanalyze.analyzer import api
    from tpuanalyze.store.database import open_database

    con = TimedConnection(open_database(args.db, read_only=True))
    c0, t0 = time.process_time(), time.perf_counter()
    api.analyze_run(con, args.run_id)
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"analyze_run: {cpu:.2f} CPU s, {wall:.2f} wall s, peak RSS {rss:,.0f} MB")
    print(f"{'CPU s':>7} {'wall s':>7} {'n':>4}  statement")
    for key in sorted(con.cpu, key=lambda k: -con.cpu[k])[: args.top]:
        print(f"{con.cpu[key]:7.2f} {con.wall[key]:7.2f} {con.count[key]:4d}  {key}")


if __name__ == "__main__":
    main()
