"""The real captures in ../shared/traces (and the bundled JAX CPU ones): XLA's async copies are memory
transfers, not compute; one program per step series; idle as XProf's duty cycle says; capture health
(empty GPU planes, warm-up steps left out of the step statistics)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import duckdb
import pytest
from conftest import xprof_python
from tpuanalyze.analyzer.api import analyze_run

from tpuanalyze.pipeline import ingest_paths

V6E = "real/tpu_v6e_4chip_jax_inference.xplane.pb"
V100 = "real/gpu_v100x8_tf_multiworker.xplane.pb"

# XProf's overview page on the same file. The expected value is computed here, by:
#   $TPUANALYZE_XPROF_PYTHON -c "$XPROF_OVERVIEW" ../shared/traces/real/tpu_v6e_4chip_jax_inference.xplane.pb
# (on the shared capture it prints device_idle_time_percent 13.4, device_duty_cycle_percent 86.5).
XPROF_OVERVIEW = r"""
import json, sys
from xprof.convert import raw_to_tool_data
page = json.loads(raw_to_tool_data.xspace_to_tool_data(sys.argv[1:], "overview_page", {})[0])
props = next(t["p"] for t in page if "device_idle_time_percent" in t.get("p", {}))
print("XPROF_JSON" + json.dumps({k: float(props[k].rstrip("%"))
                                 for k in ("device_idle_time_percent", "device_duty_cycle_percent")}))
"""


def _analyze(path: Path, tmp_path: Path, *thresholds: dict | None):
    """The analysis of one capture (one per thresholds override given, on the same database)."""
    db = tmp_path / "t.duckdb"
    summary = ingest_paths([path], db)
    con = duckdb.connect(str(db))
    try:
        out = [analyze_run(con, summary.run_ids[0], t) for t in (thresholds or (None,))]
        return out if len(out) > 1 else out[0]
    finally:
        con.close()


@pytest.fixture(scope="module")
def v6e(shared_traces: Path, tmp_path_factory: pytest.TempPathFactory):
    return _analyze(shared_traces / V6E, tmp_path_factory.mktemp("v6e"))


def _codes(a) -> dict[str, dict]:
    return {w["code"]: w for w in a.summary["capture"]["warnings"]}


def test_v6e_async_copy_waits_are_memory_transfers(v6e) -> None:
    """76 of 92.5 s of TPU:0 are copy-done waits on host-offload copies (S(5)): not compute."""
    ops = v6e.ops.set_index("name")
    copy_done = ops[ops.index.str.startswith("copy-done")]
    assert set(copy_done["category"]) == {"memory_transfer"}
    assert copy_done["self_time_ms"].sum() > 0.9 * ops["self_time_ms"].sum()
    bd = v6e.summary["breakdown"]
    assert bd["memory_transfer"] > 0.75 and bd["compute"] < 0.05, bd
    assert sum(bd.values()) == pytest.approx(1.0)
    assert "data-formatting" not in {f["rule"] for f in v6e.findings}


def test_v6e_step_series_holds_one_program(v6e) -> None:
    assert set(v6e.steps["program"]) == {"jit_f(12190760917235803885)"}
    assert v6e.summary["steps"] == 100
    programs = {p["program"].split("(")[0]: p for p in v6e.summary["programs"]}
    assert programs["jit_f"]["is_step_program"] and not programs["jit__psum"]["is_step_program"]
    # ~800 ms executions only: the ~100 ms psum runs are not steps
    assert v6e.summary["step_time_ms"]["min"] > 500


@pytest.mark.xprof
def test_v6e_idle_matches_xprof_duty_cycle(v6e, shared_traces: Path) -> None:
    python = xprof_python()
    proc = subprocess.run([python, "-c", XPROF_OVERVIEW, str(shared_traces / V6E)], capture_output=True,
                          text=True, timeout=300)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("XPROF_JSON")), None)
    assert line, proc.stderr[-2000:]
    xprof = json.loads(line[len("XPROF_JSON"):])
    ours = v6e.summary["breakdown"]["idle"]
    print(f"idle ours {ours:.2%} xprof {xprof['device_idle_time_percent']:.1f}% "
          f"(duty cycle {xprof['device_duty_cycle_percent']:.1f}%)")
    assert ours * 100 == pytest.approx(xprof["device_idle_time_percent"], abs=2.0)
    assert (1 - ours) * 100 == pytest.approx(xprof["device_duty_cycle_percent"], abs=2.0)


def test_v100_reports_empty_device_planes(shared_traces: Path, tmp_path: Path) -> None:
    a = _analyze(shared_traces / V100, tmp_path)
    warning = _codes(a)["empty-device-planes"]
    assert (warning["empty"], warning["total"]) == (6, 8)
    assert {p["plane"] for p in warning["planes"]} == {f"/device:GPU:{i}" for i in (0, 1, 2, 3, 5, 7)}


def _jax_runs(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.is_dir())


@pytest.mark.parametrize("capture", ["single_jit_train", "pmap8_train_eval", "pmap8_input_bound"])
def test_shared_jax_cpu_warmup_left_out(shared_traces: Path, tmp_path: Path, capture: str) -> None:
    """The shared JAX captures compile inside their first step: flagged, and out of the statistics."""
    a, kept = _analyze(shared_traces / "jax_cpu" / capture, tmp_path, None, {"warmup": {"keep": True}})
    warning = _codes(a)["warmup-step"]
    assert warning["steps"] == [0] and warning["kept"] is False
    first_ms = warning["step_ms"][0]
    assert first_ms > 2 * warning["median_ms"]
    assert a.summary["step_time_ms"]["max"] < first_ms
    assert kept.summary["steps"] == a.summary["steps"] + 1
    assert kept.summary["step_time_ms"]["max"] == pytest.approx(first_ms)
    assert _codes(kept)["warmup-step"]["kept"] is True


@pytest.mark.parametrize("capture", ["single_jit_train", "pmap8_train_eval", "pmap8_input_bound",
                                     "single_jit_cold"])
def test_bundled_jax_cpu_warmup(sample_traces: Path, tmp_path: Path, capture: str) -> None:
    """The bundled steady-state captures compiled every program before the trace started (their
    README): a first step much slower than the median is still flagged and left out; a first step
    within the warm-up factor is not called warm-up. `single_jit_cold` compiles in step 0."""
    a = _analyze(sample_traces / "jax_cpu" / capture, tmp_path)
    train = a.steps[~a.steps["is_eval"]]
    per_step = train.groupby("step_num")["duration_ps"].mean()
    slow_first = per_step.iloc[0] > 1.5 * per_step.median()
    codes = _codes(a)
    assert ("warmup-step" in codes) == slow_first
    if slow_first:
        assert a.summary["step_time_ms"]["max"] < per_step.iloc[0] / 1e9
        assert a.summary["steps"] == len(per_step) - 1
    if capture == "single_jit_cold":
        assert codes["warmup-step"]["steps"] == [0]
        warning = codes["warmup-step"]
        assert warning["step_ms"][0] > 10 * warning["median_ms"]  # compiling takes far longer than a step


def test_v6e_global_chip_ids_say_the_job_is_larger(v6e) -> None:
    """The v6e host's 4 chips are global chips 4-7 (core_details): the job spans >= 2 hosts, 1 written."""
    warning = _codes(v6e)["hosts-missing"]
    assert (warning["hosts_written"], warning["hosts_stated"]) == (1, 2)


def test_jax_gpu_steps_are_program_executions(shared_traces: Path, tmp_path: Path) -> None:
    """MI355X JAX capture: no Steps nor XLA Modules line; its 5 host execute calls of jit_loss_fn
    (GpuExecutable::ExecuteThunks) are the 5 steps, found through the kernels' correlation ids."""
    a = _analyze(shared_traces / "real" / "gpu_mi355x_jax_te_fused_attn.xplane.pb", tmp_path)
    assert set(a.steps["step_source"]) == {"program_launches"}
    assert set(a.steps["program"]) == {"jit_loss_fn"} and a.summary["steps"] == 5
    assert any("dominant program (jit_loss_fn)" in n for n in a.summary["notes"])


def test_eager_jax_gpu_steps_hold_one_program(shared_traces: Path, tmp_path: Path) -> None:
    """MI300X eager JAX ops: thirteen programs; the step series is the one with most device time."""
    a = _analyze(shared_traces / "real" / "gpu_mi300x_jax08_attention.xplane.pb", tmp_path)
    assert a.steps["program"].nunique() == 1
    assert len(a.summary["programs"]) > 5
    step_program = [p for p in a.summary["programs"] if p["is_step_program"]]
    assert len(step_program) == 1 and step_program[0]["program"] == a.steps["program"].iloc[0]
