"""Step-time attribution on small real XSpace files, ingested by the real ingest into a real DuckDB."""

from __future__ import annotations

import random
from pathlib import Path

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_attribution_xspace import XSpaceBuilder, design_example_step, hlo_op
from tpuanalyze.analyzer.api import analyze_run, install_views, report_json

from tpuanalyze.pipeline import ingest_paths

CATS = ("compute", "weight_update", "collectives", "memory_transfer", "input", "output", "eval", "idle")


def _ingest(tmp_path: Path, builder: XSpaceBuilder,
            name: str = "run") -> tuple[duckdb.DuckDBPyConnection, int]:
    run_dir = tmp_path / name / "plugins" / "profile" / "r1"
    builder.write(run_dir / "host0.xplane.pb")
    db = tmp_path / f"{name}.duckdb"
    summary = ingest_paths([run_dir], db)
    return duckdb.connect(str(db)), summary.run_ids[0]


def test_design_example_step(tmp_path: Path) -> None:
    """design.md: infeed 0-2, fusions 2-8, all-reduce 6-9, optimizer 9-9.5 of a 10 ms step."""
    b = XSpaceBuilder()
    design_example_step(b.tpu_core(0))
    con, run_id = _ingest(tmp_path, b)
    a = analyze_run(con, run_id)
    expected = {"compute": 0.6, "weight_update": 0.05, "collectives": 0.1, "memory_transfer": 0.0,
                "input": 0.2, "output": 0.0, "eval": 0.0, "idle": 0.05}
    assert a.summary["breakdown"] == pytest.approx(expected, abs=1e-9)
    assert a.summary["collectives_overlapped"] == pytest.approx(0.2, abs=1e-9)
    assert a.summary["step_time_ms"] == pytest.approx(
        {"mean": 10.0, "median": 10.0, "min": 10.0, "max": 10.0})
    step = a.steps.iloc[0]
    assert (step["input_ps"], step["compute_ps"], step["collectives_ps"]) == (2e9, 6e9, 1e9)
    assert step["weight_update_ps"] == 5e8 and step["idle_ps"] == 5e8
    ar = a.collectives.set_index("kind").loc["all-reduce"]
    assert ar["dtype"] == "f32" and ar["bytes"] == 4 * 25557032
    assert ar["exposed_ms_per_step"] == pytest.approx(1.0)
    assert ar["overlapped_ms_per_step"] == pytest.approx(2.0)
    assert a.summary["device_type"] == "TPU v3" and a.summary["devices"] == 1 and a.summary["steps"] == 1


def test_eval_program_and_gaps_between_steps(tmp_path: Path) -> None:
    """Two train steps with a 2 ms host gap, then an eval program: wall = 10+2+10+3 ms."""
    b = XSpaceBuilder()
    core = b.tpu_core(0)
    design_example_step(core, 0.0, step=0)
    design_example_step(core, 12.0, step=1)
    core.event("XLA Modules", "jit_eval_step(2)", 22.0, 25.0)
    hlo_op(core, "fusion.9", 22.0, 24.5, "convolution fusion")
    con, run_id = _ingest(tmp_path, b)
    a = analyze_run(con, run_id)
    wall = 25.0
    bd = a.summary["breakdown"]
    assert bd["eval"] == pytest.approx(3.0 / wall)
    assert bd["idle"] == pytest.approx((0.5 * 2 + 2.0) / wall)  # in-step idle + the gap
    assert bd["compute"] == pytest.approx(12.0 / wall)
    assert sum(bd.values()) == pytest.approx(1.0)
    assert a.summary["steps"] == 2
    assert a.per_core.iloc[0]["wall_ms"] == pytest.approx(wall)


def test_cores_and_hosts_summary_and_allreduce_split(tmp_path: Path) -> None:
    """Two cores: core 1 waits longer in the all-reduce. XProf's split: compute = min across cores."""
    b = XSpaceBuilder()
    for ordinal, ar_end in ((0, 9.0), (1, 9.8)):
        core = b.tpu_core(ordinal)
        core.event("Steps", "0", 0, 10, event_stats={"step_num": 0})
        hlo_op(core, "fusion.1", 0, 6, "convolution fusion")
        hlo_op(core, "all-reduce.1", 6, ar_end, "all-reduce", shape="bf16[1000]")
    con, run_id = _ingest(tmp_path, b)
    a = analyze_run(con, run_id)
    assert list(a.per_core["device_ordinal"]) == [0, 1]
    assert list(a.per_core["collectives"]) == pytest.approx([0.3, 0.38])
    across = a.summary["across_cores"]["collectives"]
    assert across["max"] == pytest.approx(0.38) and across["worst_core"]["device_ordinal"] == 1
    ar = a.collectives.set_index("kind").loc["all-reduce"]
    assert ar["compute_ms"] == pytest.approx(3.0)
    assert ar["sync_ms"] == pytest.approx(0.4)  # mean 3.4 - min 3.0
    assert ar["dtype"] == "bf16" and ar["bytes"] == 2000
    assert len(a.per_host) == 1 and a.per_host.iloc[0]["collectives"] == pytest.approx(0.34)


def test_views_match_the_run_tables(tmp_path: Path) -> None:
    b = XSpaceBuilder()
    design_example_step(b.tpu_core(0))
    con, run_id = _ingest(tmp_path, b)
    names = install_views(con)
    assert {"step_breakdown", "device_breakdown", "collective_time", "op_steps"} <= set(names)
    via_view = con.execute(
        "SELECT compute_ps, input_ps, collectives_ps, idle_ps FROM step_breakdown WHERE run_id = ?", [run_id]
    ).fetchall()
    a = analyze_run(con, run_id)
    row = a.steps.iloc[0]
    assert via_view == [(row["compute_ps"], row["input_ps"], row["collectives_ps"], row["idle_ps"])]
    out = report_json([a])
    assert set(out["runs"][0]) >= {"run", "device_type", "hosts", "devices", "steps", "step_time_ms",
                                   "breakdown", "collectives_overlapped", "findings"}


# --- property: the SQL sweep equals a brute-force per-instant attribution ----------------------------

PRIORITY = ("weight_update", "compute", "collectives", "memory_transfer", "input", "output")
OP_FOR = {  # category -> (short name, hlo_category, tf_op)
    "weight_update": ("fusion", "loop fusion", "train/optimizer/update"),
    "compute": ("fusion", "convolution fusion", None),
    "collectives": ("all-reduce", "all-reduce", None),
    "memory_transfer": ("copy-done", "copy-done", None),
    "input": ("infeed", "infeed", None),
    "output": ("outfeed", "outfeed", None),
}


def _reference(spans: list[tuple[str, int, int]], step_len: int) -> dict[str, int]:
    """Per 0.1 ms tick of the step: the highest-priority active category (ticks are the grid)."""
    out = dict.fromkeys((*PRIORITY, "idle"), 0)
    for tick in range(step_len):
        active = {cat for cat, s, e in spans if s <= tick < e}
        out[next((c for c in PRIORITY if c in active), "idle")] += 1
    return out


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(PRIORITY), st.integers(0, 99), st.integers(1, 40)),
                min_size=1, max_size=12))
def test_sweep_matches_brute_force(tmp_path_factory: pytest.TempPathFactory,
                                   ops: list[tuple[str, int, int]]) -> None:
    tmp = tmp_path_factory.mktemp("sweep")
    step_len = 100  # ticks of 0.1 ms
    b = XSpaceBuilder()
    core = b.tpu_core(0)
    core.event("Steps", "0", 0, step_len / 10, event_stats={"step_num": 0})
    spans = []
    for i, (cat, start, length) in enumerate(ops):
        end = min(start + length, step_len)
        short, hcat, tf_op = OP_FOR[cat]
        hlo_op(core, f"{short}.{i}", start / 10, end / 10, hcat, tf_op=tf_op)
        spans.append((cat, start, end))
    con, run_id = _ingest(tmp, b)
    step = analyze_run(con, run_id).steps.iloc[0]
    ref = _reference(spans, step_len)
    tick_ps = 100_000_000  # 0.1 ms
    for cat, ticks in ref.items():
        assert step[f"{cat}_ps"] == pytest.approx(ticks * tick_ps, abs=2), (cat, spans)
    overlapped = sum(
        1 for t in range(step_len)
        if any(c == "collectives" and s <= t < e for c, s, e in spans)
        and any(c in ("compute", "weight_update") and s <= t < e for c, s, e in spans)
    )
    assert step["collectives_overlapped_ps"] == pytest.approx(overlapped * tick_ps, abs=2)


def test_random_multi_step_sums_to_wall(tmp_path: Path) -> None:
    """Fractions always sum to 1 of wall time, over several steps with gaps and random ops."""
    rng = random.Random(7)
    b = XSpaceBuilder()
    core = b.tpu_core(0)
    t = 0.0
    for step in range(5):
        core.event("Steps", str(step), t, t + 8, event_stats={"step_num": step})
        for i in range(10):
            cat = rng.choice(PRIORITY)
            s = t + rng.uniform(0, 7)
            short, hcat, tf_op = OP_FOR[cat]
            hlo_op(core, f"{short}.{step}_{i}", s, s + rng.uniform(0.1, 3), hcat, tf_op=tf_op)
        t += 8 + rng.uniform(0, 2)
    con, run_id = _ingest(tmp_path, b)
    a = analyze_run(con, run_id)
    assert sum(a.summary["breakdown"].values()) == pytest.approx(1.0, abs=1e-9)
    assert all(v >= 0 for v in a.summary["breakdown"].values())
    assert a.summary["steps"] == 5


# --- op_steps: each op's step, against an independent lookup ------------------------------------------

@pytest.mark.parametrize("sample", ["jax_cpu/pmap8_train_eval", "generated/resnet50_v3-32_baseline"])
def test_op_steps_step_is_the_latest_step_starting_at_or_before_the_op(tmp_path: Path, sample_traces: Path,
                                                                        sample: str) -> None:
    """op_steps gives an op the step with the latest start at or before the op's start, if the op starts
    before that step ends (else NULL), with that step's number and eval flag: checked op by op against a
    bisect over each device's step starts in Python, on the tables and on the views (whose run flags are
    columns, not the literals the run tables are built with)."""
    from bisect import bisect_right
    from collections import defaultdict

    from tpuanalyze.analyzer.attribution import materialize_run
    from tpuanalyze.analyzer.config import load_thresholds

    db = tmp_path / "sample.duckdb"
    run_id = ingest_paths([sample_traces / sample], db).run_ids[0]
    con = duckdb.connect(str(db))
    rel = materialize_run(con, run_id, load_thresholds())
    steps: dict[tuple[str, int], list[tuple[int, int, int | None, bool]]] = defaultdict(list)
    step_rows = con.execute(f"SELECT host, device_ordinal, start_ps, duration_ps, step_num, is_eval "
                            f"FROM {rel['step_breakdown']}").fetchall()
    for host, device, start, duration, num, is_eval in step_rows:
        steps[(host, device)].append((start, duration, num, is_eval))
    for series in steps.values():
        series.sort()
        assert len({s[0] for s in series}) == len(series), "two steps of one device start together"
    ops = con.execute(f"SELECT host, device_ordinal, start_ps, step_num, step_start, step_is_eval "
                      f"FROM {rel['op_steps']}").fetchall()
    inside = 0
    for host, device, start, num, step_start, is_eval in ops:
        series = steps.get((host, device), [])
        i = bisect_right([s[0] for s in series], start) - 1
        if i >= 0 and start < series[i][0] + series[i][1]:
            expected = (series[i][2], series[i][0], series[i][3])
            inside += 1
        else:
            expected = (None, None, None)
        assert (num, step_start, is_eval) == expected, (host, device, start)
    assert 0 < inside < len(ops)  # ops in steps and ops outside them (between steps, capture edges)
    install_views(con)
    for relation in ("op_steps", "att_runs", "att_input_spans", "step_breakdown"):
        view = f"SELECT * FROM {relation} WHERE run_id = {run_id}"
        table = f"SELECT * FROM {rel[relation]}"
        assert con.execute(f"SELECT count(*) FROM ({view} EXCEPT ALL {table})").fetchone()[0] == 0, relation
        assert con.execute(f"SELECT count(*) FROM ({table} EXCEPT ALL {view})").fetchone()[0] == 0, relation
