"""The real captures in ../shared/traces (and the bundled JAX CPU ones): XLA's async copies are memory
transfers, not compute; one program per step series; idle as XProf's duty cycle says; capture health
(empty GPU planes, warm-up steps left out of the step statistics)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.xdist_group("captures")  # the session's shared ingest: one worker makes it

V6E = "real/tpu_v6e_4chip_jax_inference.xplane.pb"
V100 = "real/gpu_v100x8_tf_multiworker.xplane.pb"

# XProf's overview page on the same file, pinned in tests/data/xprof_expected.json with the command that
# made it (tests/data/make_xprof_expected.py); test_xprof_beside.py runs XProf live and checks the pins hold.
PINNED = json.loads((Path(__file__).parent / "data" / "xprof_expected.json").read_text())["captures"]


@pytest.fixture(scope="module")
def v6e(shared_captures, shared_traces: Path):  # noqa: ANN001, ANN201 - CaptureSet, RunAnalysis
    return shared_captures.analysis(shared_traces / V6E)


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


def test_v6e_idle_matches_xprof_duty_cycle(v6e) -> None:
    xprof = PINNED[f"shared:{V6E}"]["xprof"]  # 13.4% idle, 86.5% duty cycle on the shared capture
    ours = v6e.summary["breakdown"]["idle"]
    print(f"idle ours {ours:.2%} xprof {xprof['device_idle_time_percent']:.1f}% "
          f"(duty cycle {xprof['device_duty_cycle_percent']:.1f}%)")
    assert ours * 100 == pytest.approx(xprof["device_idle_time_percent"], abs=2.0)
    assert (1 - ours) * 100 == pytest.approx(xprof["device_duty_cycle_percent"], abs=2.0)


def test_v100_reports_empty_device_planes(shared_traces: Path, shared_captures) -> None:
    a = shared_captures.analysis(shared_traces / V100)
    warning = _codes(a)["empty-device-planes"]
    assert (warning["empty"], warning["total"]) == (6, 8)
    assert {p["plane"] for p in warning["planes"]} == {f"/device:GPU:{i}" for i in (0, 1, 2, 3, 5, 7)}


def _jax_runs(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.is_dir())


@pytest.mark.parametrize("capture", ["single_jit_train", "pmap8_train_eval", "pmap8_input_bound"])
def test_shared_jax_cpu_warmup_left_out(shared_traces: Path, shared_captures, capture: str) -> None:
    """The shared JAX captures compile inside their first step: flagged, and out of the statistics."""
    path = shared_traces / "jax_cpu" / capture
    a, kept = shared_captures.analysis(path), shared_captures.analysis(path, {"warmup": {"keep": True}})
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
def test_bundled_jax_cpu_warmup(sample_traces: Path, sample_captures, capture: str) -> None:
    """The bundled steady-state captures compiled every program before the trace started (their
    README): a first step much slower than the median is still flagged and left out; a first step
    within the warm-up factor is not called warm-up. `single_jit_cold` compiles in step 0."""
    a = sample_captures.analysis(sample_traces / "jax_cpu" / capture)
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


def test_jax_gpu_steps_are_program_executions(shared_traces: Path, shared_captures) -> None:
    """MI355X JAX capture: no Steps nor XLA Modules line; its 5 host execute calls of jit_loss_fn
    (GpuExecutable::ExecuteThunks) are the 5 steps, found through the kernels' correlation ids."""
    a = shared_captures.analysis(shared_traces / "real" / "gpu_mi355x_jax_te_fused_attn.xplane.pb")
    assert set(a.steps["step_source"]) == {"program_launches"}
    assert set(a.steps["program"]) == {"jit_loss_fn"} and a.summary["steps"] == 5
    assert any("dominant program (jit_loss_fn)" in n for n in a.summary["notes"])


def test_eager_jax_gpu_steps_hold_one_program(shared_traces: Path, shared_captures) -> None:
    """MI300X eager JAX ops: thirteen programs; the step series is the one with most device time."""
    a = shared_captures.analysis(shared_traces / "real" / "gpu_mi300x_jax08_attention.xplane.pb")
    assert a.steps["program"].nunique() == 1
    assert len(a.summary["programs"]) > 5
    step_program = [p for p in a.summary["programs"] if p["is_step_program"]]
    assert len(step_program) == 1 and step_program[0]["program"] == a.steps["program"].iloc[0]


@pytest.mark.parametrize("capture", [V6E, "jax_cpu/single_jit_train", "jax_cpu/pmap8_input_bound",
                                     "jax_cpu/pmap8_train_eval"])
def test_idle_split_adds_up_without_warmup_or_setup(shared_traces: Path, shared_captures,
                                                    capture: str) -> None:
    """The report's idle rows (within steps, between steps, outside the step cycle) add up to idle's
    share, and the per-step ones leave the warm-up step and the set-up gap out: in-step idle per step
    is never more than the step (a compile step's idle spread over the steps read 25615%)."""
    from tpuanalyze.reports.view import breakdown_rows, worst_rows

    a = shared_captures.analysis(shared_traces / capture)
    rows = breakdown_rows(a.summary, a.steps, a.per_core)
    (idle,) = [r for r in rows if r.category == "idle" and not r.part_of]
    parts = {r.label: r for r in rows if r.part_of == "idle"}
    assert {"within steps", "between steps"} <= set(parts)
    assert sum(r.share for r in parts.values()) == pytest.approx(idle.share, abs=1e-9)
    step_ms = a.summary["step_time_ms"]["mean"]
    assert 0 <= parts["within steps"].ms_per_step <= step_ms
    assert 0 <= parts["within steps"].share <= idle.share
    if capture == V6E:  # 13% idle before the first step: none of it per step
        assert parts["outside the step cycle"].share > 0.10
        assert parts["outside the step cycle"].ms_per_step is None
        assert idle.ms_per_step < 0.01
    cores = worst_rows(a.steps, ["host", "device_ordinal"], limit=100)
    train = a.steps[~a.steps["is_eval"] & ~a.steps["is_warmup"]]
    assert len(cores) == train.groupby(["host", "device_ordinal"]).ngroups
    by_core = train.groupby(["host", "device_ordinal"])["duration_ps"].mean() / 1e9
    for _, core in cores.iterrows():  # the slowest-cores table's step ms: train steps, no warm-up
        assert core["step_time_ms"] == pytest.approx(by_core[(core["host"], core["device_ordinal"])])
