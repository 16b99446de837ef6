"""XLA's async pairs, steps found without a Steps line, warm-up steps and capture health, on small real
XSpace files (written in the wire format, ingested by the real ingest into a real DuckDB)."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_attribution_xspace import XSpaceBuilder, hlo_op
from tpuanalyze.analyzer.api import analyze_run

from tpuanalyze.pipeline import ingest_paths


def _ingest(tmp_path: Path, builders: list[XSpaceBuilder]) -> tuple[duckdb.DuckDBPyConnection, int]:
    run_dir = tmp_path / "run" / "plugins" / "profile" / "r1"
    for i, b in enumerate(builders):
        b.write(run_dir / f"host{i}.xplane.pb")
    db = tmp_path / "run.duckdb"
    summary = ingest_paths([run_dir], db)
    return duckdb.connect(str(db)), summary.run_ids[0]


def _op(core, short: str, start: float, end: float, category: str, text: str,
        line: str = "XLA Ops") -> None:
    core.event(line, text, start, end, display_name=short, hlo_category=category, program_id=1)


def _codes(a) -> list[str]:
    return [w["code"] for w in a.summary["capture"]["warnings"]]


def test_async_pairs_go_where_their_waits_belong(tmp_path: Path) -> None:
    """One 10 ms step: a fusion 0-2, a host-offload copy-done wait 2-4, an async-done of a wrapped
    all-gather 4-5, a host recv-done 5-6, an async-done of a wrapped fusion 6-7 (compute), a device
    copy-done 7-8, idle 8-10. copy-start spans on 'Async XLA Ops' are in-flight DMA, not core time."""
    b = XSpaceBuilder()
    core = b.tpu_core(0)
    core.event("Steps", "0", 0, 10, event_stats={"step_num": 0})
    hlo_op(core, "fusion.1", 0, 2, "loop fusion")
    _op(core, "copy-start", 0.1, 0.2, "copy-start",
        "%copy-start = (f32[8]{0}, f32[8]{0:S(5)}, u32[]) copy-start(f32[8]{0:S(5)} %param)")
    _op(core, "async-copy", 0.2, 4, "copy-start",
        "%copy-start = (f32[8]{0}, f32[8]{0:S(5)}, u32[]) copy-start(f32[8]{0:S(5)} %param)",
        line="Async XLA Ops")
    _op(core, "copy-done", 2, 4, "copy-done",
        "%copy-done = f32[8]{0} copy-done((f32[8]{0}, f32[8]{0:S(5)}, u32[]) %copy-start)")
    _op(core, "async-done", 4, 5, "async-done",
        "%async-done = f32[64]{0} async-done(((f32[8]), f32[64]) %async-start), calls=%all-gather.7")
    _op(core, "recv-done", 5, 6, "recv-done",
        "%recv-done = (f32[8]{0}, token[]) recv-done((f32[8], u32[], token[]) %recv), channel_id=3, "
        "is_host_transfer=true")
    _op(core, "async-done.1", 6, 7, "async-done",
        "%async-done.1 = f32[8]{0} async-done(((f32[8]), f32[8]) %async-start.1), calls=%fused_computation.2")
    _op(core, "copy-done.1", 7, 8, "copy-done",
        "%copy-done.1 = f32[8]{0:S(1)} copy-done((f32[8]{0:S(1)}, f32[8]{0}, u32[]) %copy-start.1)")
    con, run_id = _ingest(tmp_path, [b])
    a = analyze_run(con, run_id)
    bd = a.summary["breakdown"]
    assert bd["compute"] == pytest.approx(0.3)  # fusion 0-2 (copy-start 0.1-0.2 under it), wrapped fusion 6-7
    assert bd["memory_transfer"] == pytest.approx(0.4)  # host copy 2-4, host recv 5-6, device copy 7-8
    assert bd["collectives"] == pytest.approx(0.1)  # the wrapped all-gather's wait
    assert bd["idle"] == pytest.approx(0.2)
    assert sum(bd.values()) == pytest.approx(1.0)
    cats = dict(zip(a.ops["name"], a.ops["category"], strict=True))
    assert cats["copy-done"] == cats["recv-done"] == cats["copy-done.1"] == "memory_transfer"
    assert cats["async-done"] == "collectives" and cats["async-done.1"] == "compute"
    assert "all-gather" in set(a.collectives["kind"])


def test_steps_from_group_ids_without_a_steps_line(tmp_path: Path) -> None:
    """GPU-style: no Steps line, no XLA Modules; the profiler's group_id on device ops makes the steps."""
    b = XSpaceBuilder()
    gpu = b.plane("/device:GPU:0")
    for step in range(3):
        o = step * 10.0
        for k, (s, e) in enumerate(((0, 3), (3, 7))):
            gpu.event("Stream #7(Compute)", f"kernel_{k}", o + s, o + e, event_stats={"group_id": step})
    con, run_id = _ingest(tmp_path, [b])
    a = analyze_run(con, run_id)
    assert set(a.steps["step_source"]) == {"group_id"}
    assert sorted(a.steps["step_num"]) == [0, 1, 2]
    assert a.summary["step_time_ms"]["mean"] == pytest.approx(7.0)


def test_one_program_per_step_series_and_program_statistics(tmp_path: Path) -> None:
    """No Steps line, two programs: 4 train executions (8 ms) and 2 psum executions (1 ms) between
    them. The step series holds only the dominant program; the psum's device time still counts."""
    b = XSpaceBuilder()
    core = b.tpu_core(0)
    t = 0.0
    for i in range(4):
        core.event("XLA Modules", "jit_train(11)", t, t + 8)
        hlo_op(core, f"fusion.{i}", t, t + 8, "loop fusion")
        t += 9
        if i in (1, 2):
            core.event("XLA Modules", "jit__psum(22)", t, t + 1)
            hlo_op(core, f"all-reduce.{i}", t, t + 1, "all-reduce")
            t += 2
    con, run_id = _ingest(tmp_path, [b])
    a = analyze_run(con, run_id)
    assert set(a.steps["program"]) == {"jit_train(11)"} and len(a.steps) == 4
    assert a.summary["step_time_ms"]["max"] == pytest.approx(8.0)
    programs = {p["program"]: p for p in a.summary["programs"]}
    assert programs["jit_train(11)"]["is_step_program"] and not programs["jit__psum(22)"]["is_step_program"]
    assert programs["jit__psum(22)"]["executions_per_device"] == 2
    wall = t - 1  # the last gap after the last step is not wall
    assert a.summary["breakdown"]["collectives"] == pytest.approx(2 / wall)
    assert a.summary["breakdown"]["compute"] == pytest.approx(32 / wall)


def _compiling_host_run(tmp_path: Path, keep: bool):
    """Host-only JAX-like trace: 5 step annotations, the first 40 ms with a compile inside it."""
    b = XSpaceBuilder()
    host = b.plane("/host:CPU")
    t = 0.0
    for step in range(5):
        dur = 40.0 if step == 0 else 10.0
        host.event("python", "train", t, t + dur, event_stats={"step_num": step})
        if step == 0:
            host.event("python", "backend_compile", t + 1, t + 30)
        host.event("tf_XLAEigen/1", "fusion", t + dur - 5, t + dur - 1,
                   event_stats={"hlo_op": "fusion", "hlo_module": "jit_step", "device_ordinal": 0})
        t += dur + 1
    con, run_id = _ingest(tmp_path, [b])
    return analyze_run(con, run_id, {"warmup": {"keep": keep}})


def test_warmup_step_flagged_and_left_out(tmp_path: Path) -> None:
    a = _compiling_host_run(tmp_path, keep=False)
    assert a.steps.loc[a.steps["is_warmup"], "step_num"].tolist() == [0]
    assert a.summary["steps"] == 4 and a.summary["warmup_steps"] == 1
    assert a.summary["step_time_ms"]["max"] == pytest.approx(10.0)
    warning = next(w for w in a.summary["capture"]["warnings"] if w["code"] == "warmup-step")
    assert warning["steps"] == [0] and warning["kept"] is False
    assert sum(a.summary["breakdown"].values()) == pytest.approx(1.0)


def test_keep_warmup_keeps_it(tmp_path: Path) -> None:
    a = _compiling_host_run(tmp_path, keep=True)
    assert a.summary["steps"] == 5 and a.summary["step_time_ms"]["max"] == pytest.approx(40.0)
    warning = next(w for w in a.summary["capture"]["warnings"] if w["code"] == "warmup-step")
    assert warning["kept"] is True


def _two_host_run(tmp_path: Path, offset_ms: float, last_ms: float = 10.0, hostnames=None):
    builders = []
    for h in range(2):
        b = XSpaceBuilder()
        if hostnames:
            b.space.hostnames[:] = hostnames
        core = b.tpu_core(0)
        for step in range(5):
            o = step * 12.0 + (offset_ms if h else 0.0)
            dur = last_ms if step == 4 else 10.0
            core.event("Steps", str(step), o, o + dur, event_stats={"step_num": step})
            hlo_op(core, f"fusion.{step}", o, o + dur * 0.9, "loop fusion")
        builders.append(b)
    con, run_id = _ingest(tmp_path, builders)
    return analyze_run(con, run_id)


def test_aligned_hosts_are_healthy(tmp_path: Path) -> None:
    assert _codes(_two_host_run(tmp_path, offset_ms=0.0)) == []


def test_clock_skew(tmp_path: Path) -> None:
    a = _two_host_run(tmp_path, offset_ms=4.0)
    warning = next(w for w in a.summary["capture"]["warnings"] if w["code"] == "clock-skew")
    assert warning["skew_ms"] == pytest.approx(4.0) and warning["worst_host"] == "host1"


def test_truncated_last_step(tmp_path: Path) -> None:
    a = _two_host_run(tmp_path, offset_ms=0.0, last_ms=3.0)
    warning = next(w for w in a.summary["capture"]["warnings"] if w["code"] == "truncated")
    assert warning["last_steps"] == [4] and warning["first_steps"] == []


def test_hosts_missing_from_xspace_hostnames(tmp_path: Path) -> None:
    """Two host files whose XSpaces name four hosts of the job: two were not written."""
    a = _two_host_run(tmp_path, offset_ms=0.0, hostnames=["w0", "w1", "w2", "w3"])
    warning = next(w for w in a.summary["capture"]["warnings"] if w["code"] == "hosts-missing")
    assert (warning["hosts_written"], warning["hosts_stated"]) == (2, 4)


def test_empty_device_planes(tmp_path: Path) -> None:
    b = XSpaceBuilder()
    core = b.tpu_core(0)
    core.event("Steps", "0", 0, 10, event_stats={"step_num": 0})
    hlo_op(core, "fusion.1", 0, 9, "loop fusion")
    b.tpu_core(1)  # written, but no events
    con, run_id = _ingest(tmp_path, [b])
    a = analyze_run(con, run_id)
    warning = next(w for w in a.summary["capture"]["warnings"] if w["code"] == "empty-device-planes")
    assert (warning["empty"], warning["total"]) == (1, 2)
    assert warning["planes"] == [{"host": "host0", "plane": "/device:TPU:1"}]


def test_host_sends_are_transfers_device_sends_are_collectives(tmp_path: Path) -> None:
    """XProf's hlo_category "host send"/"host recv" (host/DCN transfers) vs a device send (send/recv
    collective); a host-offload dynamic-slice-done (S(5)) is a memory transfer."""
    b = XSpaceBuilder()
    core = b.tpu_core(0)
    core.event("Steps", "0", 0, 10, event_stats={"step_num": 0})
    _op(core, "send-done.1", 0, 2, "host send",
        "%send-done.1 = token[] send-done((f32[8], u32[], token[]) %send.1)")
    _op(core, "send-done.2", 2, 5, "send",
        "%send-done.2 = token[] send-done((f32[8], u32[], token[]) %send.2)")
    _op(core, "dynamic-slice-done", 5, 6, "dynamic-slice-done",
        "%dynamic-slice-done = f32[8]{0} dynamic-slice-done((f32[64]{0:S(5)}, f32[8]{0}) "
        "%dynamic-slice-start)")
    con, run_id = _ingest(tmp_path, [b])
    a = analyze_run(con, run_id)
    cats = dict(zip(a.ops["name"], a.ops["kind"], strict=True))
    assert cats == {"send-done.1": "memory_transfer", "send-done.2": "send/recv",
                    "dynamic-slice-done": "memory_transfer"}
    assert a.summary["breakdown"]["memory_transfer"] == pytest.approx(0.3)
    assert a.summary["breakdown"]["collectives"] == pytest.approx(0.3)


def test_sampled_generated_run_reports_hosts_missing(tmp_path: Path) -> None:
    """A generated 16-chip slice (4 hosts of 4 chips) with 2 hosts written: the trace states the job's
    size as a real capture does (the collectives' replica groups; the last host's global chip ids 12-15
    in core_details), so 2 of 4 hosts are missing."""
    from tpuanalyze import generator

    run_dir = generator.generate("resnet50", chips=16, steps=3, hosts=2, seed=0, out=tmp_path / "gen")
    db = tmp_path / "gen.duckdb"
    run_id = ingest_paths([run_dir], db).run_ids[0]
    a = analyze_run(duckdb.connect(str(db)), run_id)
    warning = next(w for w in a.summary["capture"]["warnings"] if w["code"] == "hosts-missing")
    assert (warning["hosts_written"], warning["hosts_stated"]) == (2, 4)
    assert "replica groups" in warning["source"] or "core_details" in warning["source"]


def test_trace_json_at_its_event_limit_is_truncated(tmp_path: Path) -> None:
    """A trace.json holding exactly the export limit of events lost the rest: `truncated`. The limit is
    TF/JAX's 1M; the test sets it to this file's 40 events (thresholds `capture.trace_json_event_limit`)."""
    import gzip
    import json

    events = [{"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/host:CPU"}},
              {"ph": "M", "pid": 1, "tid": 2, "name": "thread_name", "args": {"name": "python"}}]
    events += [{"ph": "X", "pid": 1, "tid": 2, "ts": 100.0 * i, "dur": 50.0, "name": f"work{i}"}
               for i in range(40)]
    path = tmp_path / "host0.trace.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode()))
    db = tmp_path / "json.duckdb"
    run_id = ingest_paths([path], db).run_ids[0]
    con = duckdb.connect(str(db))
    capped = analyze_run(con, run_id, {"capture": {"trace_json_event_limit": 40}})
    warning = next(w for w in capped.summary["capture"]["warnings"] if w["code"] == "truncated")
    assert warning["event_limit"] == 40 and warning["hosts"] == ["host0"]
    assert "truncated" not in _codes(analyze_run(con, run_id))  # 40 events are far below 1M


def _truncated_reference(steps: pd.DataFrame, partial_fraction: float) -> dict[str, list[int]]:
    """The truncation rule written device by device, as plainly as it reads."""
    cut: dict[str, list[int]] = {"first": [], "last": []}
    for _, dev in steps[~steps["is_eval"]].groupby(["host", "device_ordinal"]):
        if len(dev) < 3:
            continue
        dev = dev.sort_values("start_ps", kind="stable")
        median = float(dev["duration_ps"].median())
        for edge, row in (("first", dev.iloc[0]), ("last", dev.iloc[-1])):
            if row["duration_ps"] < partial_fraction * median and int(row["step_num"]) not in cut[edge]:
                cut[edge].append(int(row["step_num"]))
    return cut


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["h1", "h10", "h2"]), st.integers(0, 2), st.integers(0, 6),
                          st.integers(1, 10), st.booleans()),
                min_size=1, max_size=40, unique_by=lambda r: r[:3]))
def test_truncated_steps_vectorised_equals_the_rule(rows: list[tuple]) -> None:
    """The vectorised check names the same first/last steps, in the same order, as the rule per device."""
    from tpuanalyze.analyzer.capture_health import _truncated_steps

    steps = pd.DataFrame(
        [{"host": h, "device_ordinal": d, "step_num": n, "start_ps": 100 * n, "duration_ps": dur,
          "is_eval": ev} for h, d, n, dur, ev in rows],
        columns=["host", "device_ordinal", "step_num", "start_ps", "duration_ps", "is_eval"])
    expected = _truncated_reference(steps, 0.5)
    got = _truncated_steps(steps, 0.5)
    if not expected["first"] and not expected["last"]:
        assert got == []
    else:
        assert (got[0]["first_steps"], got[0]["last_steps"]) == (expected["first"], expected["last"])


def test_short_edge_step_with_activity_beyond_it_is_not_cut() -> None:
    """A short first or last step is a cut only when nothing of its device was captured before (first)
    or after (last) it: activity beyond it means the window saw past the step."""
    from tpuanalyze.analyzer.capture_health import _truncated_steps

    steps = pd.DataFrame({"host": "h", "device_ordinal": 0, "step_num": range(5),
                          "start_ps": [0, 10, 110, 210, 310], "duration_ps": [5, 100, 100, 100, 20],
                          "is_eval": False})
    (cut,) = _truncated_steps(steps, 0.5)
    assert (cut["first_steps"], cut["last_steps"]) == ([0], [4])
    edges = pd.DataFrame({"host": ["h"], "device_ordinal": [0], "first_ps": [0], "last_ps": [330]})
    (cut,) = _truncated_steps(steps, 0.5, edges)  # activity exactly at the steps' edges: still cut
    assert (cut["first_steps"], cut["last_steps"]) == ([0], [4])
    beyond = edges.assign(first_ps=-50, last_ps=400)  # programs ran before the first and after the last
    assert _truncated_steps(steps, 0.5, beyond) == []


def test_real_gemm_sweep_is_not_called_truncated(shared_traces: Path, tmp_path: Path) -> None:
    """gpu_mi300x_jax08_gemm: its first jit_dot is a small problem size, complete, with kernels of the
    device captured before it; no `truncated` warning."""
    db = tmp_path / "gemm.duckdb"
    run_id = ingest_paths([shared_traces / "real" / "gpu_mi300x_jax08_gemm.xplane.pb"], db).run_ids[0]
    con = duckdb.connect(str(db), read_only=True)
    try:
        a = analyze_run(con, run_id)
    finally:
        con.close()
    assert "truncated" not in _codes(a)
    assert len(a.steps) >= 3  # the rule had steps to judge
