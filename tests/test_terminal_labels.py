"""The terminal summary labels every number's base, splits idle, and points only at databases that
exist: `--sql` prints the findings' queries, a temporary database is never offered for rerunning."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import SAMPLE_TRACES, run_cli

RUN = SAMPLE_TRACES / "generated" / "resnet50_v3-32_host-overhead"


def test_temporary_database_is_never_pointed_at_and_sql_prints_with_flag(tmp_path: Path) -> None:
    plain = run_cli("report", str(RUN))
    assert plain.returncode == 0, plain.stderr
    assert "in the HTML report" not in plain.stdout
    assert "the database was temporary" in plain.stdout and "--sql prints them" in plain.stdout
    assert "FROM step_breakdown" not in plain.stdout
    db = tmp_path / "kept.duckdb"
    doc = tmp_path / "r.json"
    kept = run_cli("report", str(RUN), "--db", str(db), "--sql", "--json", str(doc))
    assert kept.returncode == 0, kept.stderr
    flat = "".join(kept.stdout.split())  # long paths and queries fold across lines
    assert "".join(f"tpuanalyze sql --db {db}".split()) in flat
    queries = [f["evidence"]["sql"] for f in json.loads(doc.read_text())["runs"][0]["findings"]]
    assert queries
    for query in queries:
        assert "".join(query.split()) in flat  # each finding's query, printed in full
        rerun = run_cli("sql", "--db", str(db), query)  # and it runs on the kept database
        assert rerun.returncode == 0, (query, rerun.stderr)


def test_breakdown_labels_its_base_and_splits_idle() -> None:
    out = run_cli("report", str(RUN)).stdout
    assert "share of the devices' wall time" in out and "of wall" in out and "ms per train step" in out
    within = next(line for line in out.splitlines() if "└ within steps" in line)
    between = next(line for line in out.splitlines() if "└ between steps" in line)
    idle = next(line for line in out.splitlines() if line.strip().startswith("idle "))
    share = [float(line.split("%")[0].split()[-1]) for line in (idle, within, between)]
    assert abs(share[0] - share[1] - share[2]) <= 0.11  # the two parts add up to idle (rounding)
    assert share[2] > 0  # this run's host leaves gaps between steps
    assert "Roofline:" in out and "memory bound" in out
    assert " None" not in out and " False" not in out
