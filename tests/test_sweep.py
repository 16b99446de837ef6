"""The numpy boundary sweep and op-step lookup (analyzer/sweep.py) give att_elementary's and op_steps'
SQL rows exactly: on every bundled and shared capture, on a multi-host generated pod attributed host
batch by host batch, and on hypothesis-built interval sets with ties, nesting, zero-length spans and
steps sharing boundaries."""

from __future__ import annotations

from pathlib import Path
from string import Template

import duckdb
import pytest
from conftest import CaptureSet
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tpuanalyze.analyzer.api import load_thresholds
from tpuanalyze.analyzer.attribution import _substitutions, load_stages, materialize_run, run_flags
from tpuanalyze.analyzer.sweep import OpSteps, numpy_elementary

COLUMNS = ("run_id, host, device, ts, len_ps, category, collective_overlapped, in_step, "
           "ar, ag, rs, a2a, cp, sr, step_start")


def _differences(con: duckdb.DuckDBPyConnection, a: str, b: str) -> int:
    """Rows of a not in b plus rows of b not in a (bag semantics: duplicates count)."""
    return int(con.execute(f"SELECT (SELECT count(*) FROM (FROM {a} EXCEPT ALL FROM {b})) + "
                           f"(SELECT count(*) FROM (FROM {b} EXCEPT ALL FROM {a}))").fetchall()[0][0])


def _same_both_ways(db: Path, run_ids: list[int]) -> None:
    """Each run materialized once (the numpy sweep and op-step lookup); the stages' SQL then run over the
    same input relations: att_elementary and op_steps must hold the same rows, with the same types."""
    config = load_thresholds(None)
    con = duckdb.connect(str(db), read_only=True)
    stages = dict(load_stages())
    try:
        for run_id in run_ids:
            rel = materialize_run(con, run_id, config)
            flags = run_flags(con, rel["att_runs"])
            subs = _substitutions(config, f"run_id = {int(run_id)}", rel, flags=flags)
            con.execute("CREATE OR REPLACE TEMP TABLE sq_elementary AS "
                        + Template(stages["att_elementary"]).safe_substitute(subs))
            types = {t: con.execute(f"SELECT column_name, column_type FROM (DESCRIBE {t})").fetchall()
                     for t in ("sq_elementary", rel["att_elementary"])}
            assert types["sq_elementary"] == types[rel["att_elementary"]]
            assert _differences(con, "sq_elementary", rel["att_elementary"]) == 0, run_id
            op_sql = Template(stages["op_steps"]).safe_substitute(subs)
            with OpSteps(con, rel["att_ops"], rel["step_breakdown"], "found_steps") as found:
                assert _differences(con, f"({op_sql})", f"({found.sql})") == 0, run_id
    finally:
        con.close()


def _run_ids(captures: CaptureSet) -> list[int]:
    return sorted({captures.run_id(p) for p in captures.paths})


def test_numpy_stages_equal_sql_on_bundled_captures(sample_captures: CaptureSet) -> None:
    _same_both_ways(sample_captures.db, _run_ids(sample_captures))


def test_numpy_stages_equal_sql_on_shared_captures(shared_captures: CaptureSet) -> None:
    _same_both_ways(shared_captures.db, _run_ids(shared_captures))


@pytest.mark.parametrize("scenario", ["straggler"])
def test_per_host_analysis_is_the_same_either_way(tmp_path: Path, scenario: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A generated 4-host pod attributed host by host: every frame and the JSON equal with either sweep."""
    from test_per_host import ONE_HOST, _analyse, _same, close_json
    from tpuanalyze.analyzer.api import report_json
    from tpuanalyze.generator import generate

    from tpuanalyze.pipeline import ingest_paths

    out = tmp_path / "logs"
    generate(model="resnet50", chips=16, steps=4, scenario=scenario, seed=1, out=out)
    db = tmp_path / "g.duckdb"
    ingest_paths([out], db)
    monkeypatch.setenv("TPUANALYZE_SWEEP", "sql")
    sql = _analyse(db, ONE_HOST, monkeypatch)
    monkeypatch.setenv("TPUANALYZE_SWEEP", "numpy")
    vectorised = _analyse(db, ONE_HOST, monkeypatch)
    assert sql[0].summary["steps"] > 0
    _same(sql, vectorised)
    assert close_json(report_json(sql), report_json(vectorised)) == []


CATS = ("eval", "weight_update", "compute", "collectives", "input", "output", "container",
        "memory_transfer")
KINDS = (None, "all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute",
         "send/recv")


@st.composite
def interval_sets(draw: st.DrawFn) -> tuple[list[tuple], list[tuple]]:
    """Intervals on a coarse time grid (many shared boundaries) on 1-3 devices, with steps; the grid's
    unit is 1 ps, 1 us or 2^56 ps (times too far apart for the sweep's packed sort key: its other sort)."""
    intervals, steps = [], []
    unit = draw(st.sampled_from([1, 10**6, 2**56]))
    for device in (0, None, 2)[:draw(st.integers(1, 3))]:  # a NULL device is a device too
        for _ in range(draw(st.integers(0, 25))):
            start = draw(st.integers(0, 40))
            length = draw(st.integers(0, 12))
            cat = draw(st.sampled_from(CATS))
            kind = draw(st.sampled_from(KINDS)) if cat == "collectives" else None
            intervals.append((device, cat, kind, start * unit, (start + length) * unit))
        t = draw(st.integers(0, 5))
        for _ in range(draw(st.integers(0, 4))):
            length = draw(st.integers(1, 15))
            steps.append((device, t * unit, (t + length) * unit))
            intervals.append((device, "step", None, t * unit, (t + length) * unit))
            t += length + draw(st.integers(-3, 4))  # overlapping, touching or gapped steps
    return intervals, steps


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(interval_sets())
def test_numpy_sweep_equals_sql_on_built_intervals(data: tuple[list[tuple], list[tuple]]) -> None:
    intervals, steps = data
    con = duckdb.connect()
    con.execute("CREATE TEMP TABLE iv (run_id BIGINT, host VARCHAR, device INTEGER, category VARCHAR, "
                "kind VARCHAR, start_ps BIGINT, end_ps BIGINT)")
    con.execute("CREATE TEMP TABLE stp (run_id BIGINT, host VARCHAR, device INTEGER, start_ps BIGINT, "
                "end_ps BIGINT)")
    if intervals:
        con.executemany("INSERT INTO iv VALUES (1, 'h', ?, ?, ?, ?, ?)", intervals)
    if steps:
        con.executemany("INSERT INTO stp VALUES (1, 'h', ?, ?, ?)", steps)
    body = dict(load_stages())["att_elementary"]
    subs = _substitutions(load_thresholds(None), "TRUE", {"att_intervals": "iv", "att_steps": "stp"})
    con.execute(f"CREATE TEMP TABLE sq AS {Template(body).safe_substitute(subs)}")
    numpy_elementary(con, "iv", "stp", "cc")
    # a step start shared by two steps: the ASOF join picks either; the numpy sweep the longer
    ambiguous = len({(d, s) for d, s, _ in steps}) < len(steps)
    if ambiguous:
        no_step = COLUMNS.replace("step_start", "NULL AS step_start")
        con.execute(f"CREATE TEMP TABLE sq2 AS SELECT {no_step} FROM sq")
        con.execute(f"CREATE TEMP TABLE cc2 AS SELECT {no_step} FROM cc")
        assert _differences(con, "sq2", "cc2") == 0
    else:
        assert _differences(con, f"(SELECT {COLUMNS} FROM sq)", f"(SELECT {COLUMNS} FROM cc)") == 0
    con.close()
