"""The attribution run batch of hosts by batch (analyzer/per_host.py) reports what the whole-run SQL
reports: same per-step breakdown, per-core and collective tables, findings and JSON, on multi-host runs,
including the decisions that are the run's, not a host's (Steps line on some hosts only, the dominant
program over all hosts)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd
import pytest
from test_attribution_xspace import XSpaceBuilder, design_example_step, hlo_op
from tpuanalyze.analyzer import per_host
from tpuanalyze.analyzer.api import RunAnalysis, analyze_run, report_json

from tpuanalyze.pipeline import ingest_paths

WHOLE_RUN = 10**15  # events per batch: every run is one batch (the whole-run SQL)
ONE_HOST = 1  # every host its own batch


def _analyse(db: Path, batch_events: int, monkeypatch: pytest.MonkeyPatch) -> list[RunAnalysis]:
    monkeypatch.setattr(per_host, "BATCH_EVENTS", batch_events)
    con = duckdb.connect(str(db), read_only=True)
    try:
        runs = [r[0] for r in con.execute("SELECT run_id FROM runs ORDER BY run_id").fetchall()]
        return [analyze_run(con, run_id) for run_id in runs]
    finally:
        con.close()


def close_json(a: Any, b: Any, path: str = "") -> list[str]:
    """Differences between two JSON documents (floats to 1e-9 relative: sums in another order; a
    finding's metric, rounded to 6 decimals, may also round the other way: 1.743914 vs 1.743915)."""
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return [f"{path}: keys {sorted(set(a) ^ set(b))}"]
        return [d for k in a for d in close_json(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} vs {len(b)} items"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True))
                for d in close_json(x, y, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, float):
        if math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12):
            return []
        rounded = round(a, 6) == a and round(b, 6) == b and abs(a - b) <= 1.000001e-6
        return [] if rounded else [f"{path}: {a} vs {b}"]
    return [] if a == b else [f"{path}: {a!r} vs {b!r}"]


def _same(whole: list[RunAnalysis], batched: list[RunAnalysis]) -> None:
    for w, b in zip(whole, batched, strict=True):
        key = ["host", "device_ordinal", "start_ps"]
        pd.testing.assert_frame_equal(w.steps.sort_values(key).reset_index(drop=True),
                                      b.steps.sort_values(key).reset_index(drop=True))
        pd.testing.assert_frame_equal(w.per_core, b.per_core)
        pd.testing.assert_frame_equal(w.per_host, b.per_host)
        pd.testing.assert_frame_equal(w.collectives, b.collectives)
        pd.testing.assert_frame_equal(w.input, b.input)
        pd.testing.assert_frame_equal(w.ops, b.ops)
    assert close_json(report_json(whole), report_json(batched)) == []


def _ingest(paths: list[Path], db: Path) -> Path:
    ingest_paths(paths, db)
    return db


def four_host_pod(tmp_path: Path, seed: int, scenario: str = "straggler", steps: int = 3) -> Path:
    """The database of a generated 16-chip (4-host) ResNet-50 pod (default: with a straggler, 3 steps)."""
    from tpuanalyze.generator import generate

    out = tmp_path / "logs"
    generate(model="resnet50", chips=16, steps=steps, scenario=scenario, seed=seed, out=out)
    return _ingest([out], tmp_path / "g.duckdb")


def host_count(db: Path) -> int:
    with duckdb.connect(str(db), read_only=True) as con:
        return int(con.execute("SELECT count(DISTINCT host) FROM planes").fetchone()[0])


@pytest.mark.parametrize("scenario", ["baseline", "straggler", "input-bound"])
def test_generated_pod_batched_equals_whole_run(tmp_path: Path, scenario: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A generated 4-host run (collectives across hosts, a straggler host, a slow input host)."""
    db = four_host_pod(tmp_path, seed=1, scenario=scenario, steps=4)
    hosts = host_count(db)
    con = duckdb.connect(str(db), read_only=True)
    assert len(per_host.host_batches(con, 1, ONE_HOST)) == hosts >= 4
    assert len(per_host.host_batches(con, 1, WHOLE_RUN)) == 1
    con.close()
    whole = _analyse(db, WHOLE_RUN, monkeypatch)
    batched = _analyse(db, ONE_HOST, monkeypatch)
    assert whole[0].summary["hosts"] >= 4 and whole[0].summary["steps"] > 0
    assert whole[0].summary["collectives"], "the run has collectives to reduce across hosts"
    _same(whole, batched)


def _program(core: Any, name: str, start: float, end: float) -> None:
    core.event("XLA Modules", name, start, end)
    hlo_op(core, "fusion.1", start, end - 0.5, "convolution fusion", flops=1e9)
    hlo_op(core, "all-reduce.1", end - 0.5, end, "all-reduce", shape="f32[1024]")


def dominant_program_run(tmp_path: Path) -> Path:
    """Two hosts, no Steps line: host0 spends more time in jit_a, host1 far more in jit_b (the run's)."""
    run_dir = tmp_path / "logs" / "plugins" / "profile" / "r1"
    h0, h1 = XSpaceBuilder(), XSpaceBuilder()
    c0, c1 = h0.tpu_core(0), h1.tpu_core(0)
    for i in range(3):
        _program(c0, "jit_a(1)", 10.0 * i, 10.0 * i + 8)
        _program(c1, "jit_b(2)", 30.0 * i, 30.0 * i + 25)
    _program(c0, "jit_b(2)", 40.0, 45.0)
    _program(c1, "jit_a(1)", 100.0, 102.0)
    h0.write(run_dir / "host0.xplane.pb")
    h1.write(run_dir / "host1.xplane.pb")
    return run_dir


def steps_line_on_one_host_run(tmp_path: Path) -> Path:
    """Two hosts: host0 with a Steps line, host1 with program executions only."""
    run_dir = tmp_path / "logs" / "plugins" / "profile" / "r1"
    h0, h1 = XSpaceBuilder(), XSpaceBuilder()
    c0 = h0.tpu_core(0)
    for step in range(3):
        design_example_step(c0, 12.0 * step, step)
    c1 = h1.tpu_core(0)
    for i in range(3):
        _program(c1, "jit_train_step(1)", 12.0 * i, 12.0 * i + 10)
    h0.write(run_dir / "host0.xplane.pb")
    h1.write(run_dir / "host1.xplane.pb")
    return run_dir


def test_dominant_program_is_the_runs_not_a_hosts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No Steps line: steps are the executions of the program with the most time over the run.
    host0 spends more time in jit_a, host1 far more in jit_b: the run's steps are jit_b's on both."""
    db = _ingest([dominant_program_run(tmp_path)], tmp_path / "d.duckdb")
    whole = _analyse(db, WHOLE_RUN, monkeypatch)
    batched = _analyse(db, ONE_HOST, monkeypatch)
    assert set(whole[0].steps["program"]) == {"jit_b(2)"}
    assert len(whole[0].steps) == 4  # host0: one execution of jit_b; host1: three
    _same(whole, batched)


def test_steps_line_on_one_host_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The run has a Steps line (host0), so host1, without one, is not stepped by its programs (the
    run's flag decides, as in the whole-run SQL) but gets the op-span step of a device without markers."""
    db = _ingest([steps_line_on_one_host_run(tmp_path)], tmp_path / "s.duckdb")
    whole = _analyse(db, WHOLE_RUN, monkeypatch)
    batched = _analyse(db, ONE_HOST, monkeypatch)
    sources = whole[0].steps.groupby("host")["step_source"].agg(set).to_dict()
    assert sources == {"host0": {"steps_line"}, "host1": {"op_span"}}
    _same(whole, batched)



def _tie_host(builder: XSpaceBuilder, index: int) -> None:
    """Two cores, three steps: the all-reduce payload and dtype differ by host (f32 on hosts 0-1, bf16
    on hosts 2-3: a tie of dtypes, an even number of payloads), its duration too (the per-instance
    minimum is another host's), two instances of one op per step (occurrences), two op names with the
    same self time (a tie in the top ops) and one op whose framework op is a tie over the run."""
    shape = "f32[1024]" if index < 2 else "bf16[1024]"
    for ordinal in range(2):
        core = builder.tpu_core(ordinal)
        for step in range(3):
            o = 12.0 * step
            core.event("Steps", str(step), o, o + 10, event_stats={"step_num": step, "group_id": step})
            core.event("XLA Modules", "jit_train_step(1)", o, o + 10, event_stats={"group_id": step})
            hlo_op(core, "infeed", o, o + 1 + 0.25 * index, "infeed", shape="bf16[8,224,224,3]")
            hlo_op(core, "fusion.1", o + 2, o + 4, "convolution fusion", flops=1e9, bytes_accessed=1e6)
            hlo_op(core, "fusion.2", o + 4, o + 6, "convolution fusion", flops=1e9, bytes_accessed=1e6)
            tf_op = "train/x" if index < 2 else "train/y"
            hlo_op(core, "fusion.9", o + 6, o + 6.5, "loop fusion", tf_op=tf_op)
            hlo_op(core, "all-reduce.1", o + 7, o + 8 - 0.2 * index, "all-reduce", shape=shape)
            hlo_op(core, "all-reduce.1", o + 8, o + 8.5 + 0.1 * ordinal, "all-reduce", shape=shape)
            hlo_op(core, "all-gather.1", o + 9, o + 9.5, "all-gather", shape=f"s32[{7 + index}]")


def _reference_collectives(con: duckdb.DuckDBPyConnection, rel: dict[str, str]) -> pd.DataFrame:
    """collectives_frame's numbers straight from all the run's collective op rows at once (pandas)."""
    from tpuanalyze.analyzer.collectives import COLUMNS, SHAPE_TEXT_SQL, shape_bytes

    n_steps = con.execute(f"SELECT count(*) FROM {rel['step_breakdown']} WHERE NOT is_eval").fetchone()[0]
    ops = con.execute(
        f"""SELECT collective_kind AS kind, short_name, {SHAPE_TEXT_SQL} AS shape_text, bytes_accessed, host,
                   device_ordinal, step_num, step_start, start_ps, duration_ps, line FROM {rel['op_steps']}
            WHERE collective_kind IS NOT NULL AND step_start IS NOT NULL AND NOT step_is_eval""").df()
    times = con.execute(
        f"""SELECT c.kind, sum(c.exposed_ps) AS exposed_ps, sum(c.overlapped_ps) AS overlapped_ps
            FROM {rel['collective_time']} c JOIN {rel['step_breakdown']} s ON s.host = c.host
                 AND s.device_ordinal = c.device_ordinal AND s.start_ps = c.step_start
            WHERE NOT s.is_eval GROUP BY c.kind""").df().set_index("kind")
    parsed = [shape_bytes(s) if isinstance(s, str) else (None, None) for s in ops["shape_text"]]
    ops["payload"] = pd.Series([p[0] for p in parsed], dtype="float64").fillna(ops["bytes_accessed"])
    ops["dtype"] = [p[1] for p in parsed]
    sync = ops[ops["line"] != "Async XLA Ops"]
    counted = sync[~sync["short_name"].str.contains("-done", na=False)]
    df = sync.sort_values("start_ps", kind="stable")
    df = df.assign(occ=df.groupby(["host", "device_ordinal", "step_start", "short_name"]).cumcount())
    n_dev_steps = df.groupby(["host", "device_ordinal", "step_start"]).ngroups
    rows = []
    for kind in sorted(set(counted["kind"]) | set(times.index), key=["all-reduce", "all-gather"].index):
        k_ops, k = counted[counted["kind"] == kind], df[df["kind"] == kind]
        compute = float(k.groupby(["step_num", "short_name", "occ"])["duration_ps"].min().sum()) \
            / k["step_num"].nunique() / 1e9
        total = float(k["duration_ps"].sum()) / n_dev_steps / 1e9
        rows.append({
            "kind": kind, "count_per_step": len(k_ops) / n_steps,
            "bytes": float(k_ops["payload"].sum()) / n_steps if k_ops["payload"].notna().any() else None,
            "dtype": k_ops["dtype"].mode().iloc[0] if k_ops["dtype"].notna().any() else None,
            "exposed_ms_per_step": float(times["exposed_ps"].get(kind, 0.0)) / n_steps / 1e9,
            "overlapped_ms_per_step": float(times["overlapped_ps"].get(kind, 0.0)) / n_steps / 1e9,
            "compute_ms": compute, "sync_ms": max(total - compute, 0.0),
            "median_op_bytes": float(k_ops["payload"].median()) if k_ops["payload"].notna().any() else None,
            "ops_per_step_total_ms": total * n_dev_steps / n_steps})
    return pd.DataFrame(rows, columns=COLUMNS)


@pytest.mark.parametrize("batch_events", [ONE_HOST, 110])  # 54 events a host: 1 or 2 hosts a batch
def test_partial_aggregates_equal_the_runs_rows_at_once(tmp_path: Path, batch_events: int,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Top ops, collectives and infeed combined from batches of hosts (one host, or two hosts a
    batch) equal what all the run's op rows give at once, ties included."""
    from tpuanalyze.analyzer.attribution import materialize_run
    from tpuanalyze.analyzer.config import load_thresholds

    run_dir = tmp_path / "logs" / "plugins" / "profile" / "r1"
    for index in range(4):
        builder = XSpaceBuilder()
        _tie_host(builder, index)
        builder.write(run_dir / f"host{index}.xplane.pb")
    db = _ingest([run_dir], tmp_path / "t.duckdb")
    con = duckdb.connect(str(db), read_only=True)
    batches = per_host.host_batches(con, 1, batch_events)
    assert len(batches) == (4 if batch_events == ONE_HOST else 2), batches
    rel = materialize_run(con, 1, load_thresholds(None))
    reference = _reference_collectives(con, rel)
    reference_ops = con.execute(
        f"""SELECT short_name AS name, hlo_module, count(*) AS count, sum(duration_ps) / 1e9 AS self_time_ms,
                   sum(flops) AS flops FROM {rel['op_steps']}
            WHERE step_start IS NOT NULL AND NOT is_container AND line <> 'Async XLA Ops'
            GROUP BY ALL ORDER BY self_time_ms DESC, name""").df()
    reference_infeed = con.execute(
        f"SELECT host, sum(duration_ps) / 1e9 AS ms FROM {rel['op_steps']} WHERE category = 'input' "
        "AND step_start IS NOT NULL GROUP BY host ORDER BY host").df()
    con.close()
    (batched,) = _analyse(db, batch_events, monkeypatch)
    (whole,) = _analyse(db, WHOLE_RUN, monkeypatch)
    coll = batched.collectives
    assert list(coll["kind"]) == ["all-reduce", "all-gather"]
    assert coll.loc[0, "dtype"] == "bf16"  # 24 f32 and 24 bf16 all-reduces: the first in sort order
    assert coll.loc[0, "median_op_bytes"] == (2048 + 4096) / 2  # the mean of the two middle payloads
    # per instance the minimum over devices: host3's first all-reduce (0.4 ms), a core 0's second (0.5 ms)
    assert coll.loc[0, "compute_ms"] == pytest.approx(0.4 + 0.5)
    pd.testing.assert_frame_equal(coll, reference, check_exact=False, rtol=1e-12)
    ops = batched.ops
    pd.testing.assert_frame_equal(ops[reference_ops.columns].reset_index(drop=True), reference_ops,
                                  check_exact=False, rtol=1e-12)
    assert list(ops["name"][:2]) == ["fusion.1", "fusion.2"]  # same self time: by name
    assert ops.set_index("name").loc["fusion.9", "tf_op"] == "train/x"  # 12 each: the first in sort order
    infeed = batched.input.groupby("host")["infeed_ms_per_step"].sum() * 3
    assert infeed.round(9).tolist() == reference_infeed["ms"].round(9).tolist()
    for frame in ("per_core", "per_host", "collectives", "input", "ops"):
        pd.testing.assert_frame_equal(getattr(whole, frame), getattr(batched, frame))
    # f32-gradient-allreduce on this run's f32/bf16 tie: not f32, the same in every run (a mode() of the
    # dtypes picked either, run to run)
    assert close_json(report_json([whole]), report_json([batched])) == []
    assert "f32-gradient-allreduce" not in {f["rule"] for f in batched.findings}


def test_collectives_leave_warmup_out_whole_and_batched(tmp_path: Path, shared_traces: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The shared pmap8_train_eval capture (one all-reduce per device per train step; it compiles in
    step 0) written as two hosts: the warm-up step is out of the collectives' per-step figures on the
    whole-run path and batch by batch alike, and back in with warmup.keep."""
    import shutil

    src = next((shared_traces / "jax_cpu" / "pmap8_train_eval").rglob("*.xplane.pb"))
    run = tmp_path / "logs" / "plugins" / "profile" / "2026_01_01_00_00_00"
    run.mkdir(parents=True)
    for host in ("hosta", "hostb"):
        shutil.copy(src, run / f"{host}.xplane.pb")
    db = _ingest([tmp_path / "logs"], tmp_path / "two.duckdb")
    whole, batched = _analyse(db, WHOLE_RUN, monkeypatch), _analyse(db, ONE_HOST, monkeypatch)
    _same(whole, batched)
    (a,) = whole
    assert a.summary["warmup_steps"] == 1
    (row,) = a.summary["collectives"]
    assert row["kind"] == "all-reduce" and row["count_per_step"] == 1.0
    con = duckdb.connect(str(db), read_only=True)
    try:
        kept = analyze_run(con, a.run_id, {"warmup": {"keep": True}})
    finally:
        con.close()
    assert kept.summary["collectives"][0]["count_per_step"] > 1.0
    assert kept.summary["collectives"][0]["exposed_ms_per_step"] > row["exposed_ms_per_step"]
