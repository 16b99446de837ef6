"""Advice by platform and workload, on the real captures in ../shared/traces: GPU and CPU traces never
get TPU wording, an inference capture never gets training advice, and the platform and workload come
from the trace itself (device planes, optimizer/gradient/backward events), not from generator metadata.
Plus the thresholds file contract (unknown keys are errors) and the cross-run section of the JSON."""

from __future__ import annotations

import json
import re
from pathlib import Path

import duckdb
import pandas as pd
import pytest
from conftest import run_cli, sample_capture_paths
from test_report_pipeline import generated_run, ingested
from tpuanalyze.analyzer.api import analyze_db, install_views, report_json
from tpuanalyze.analyzer.config import load_thresholds
from tpuanalyze.analyzer.findings import ADVICE
from tpuanalyze.analyzer.platform import advice_platform

from tpuanalyze.errors import TpuAnalyzeError

pytestmark = pytest.mark.xdist_group("captures")  # the session's shared ingest: one worker makes it

TPU_WORDING = re.compile(
    r"iterations_per_loop|\bICI\b|torus|infeed|outfeed|\bTPU|space-to-depth|MXU|TensorCore", re.IGNORECASE)
TRAINING_WORDING = re.compile(r"optimizer|gradient|backward|training loop|train step|iterations_per_loop|"
                              r"weight update|while-loop with per-step", re.IGNORECASE)
TRAINING_ONLY = {rule for rule, advice in ADVICE.items() if advice.modes == ("training",)}


def _gpu_and_cpu_traces(shared: Path) -> list[Path]:
    real = shared / "real"
    paths = sorted(real.glob("gpu_*.xplane.pb")) + sorted(p for p in real.glob("gpu_*") if p.is_dir())
    paths += sorted((shared / "chrome_json").glob("kineto_*.json.gz"))
    paths += sorted(p for p in (shared / "jax_cpu").iterdir() if p.is_dir())
    return paths


@pytest.fixture(scope="module")
def shared_analyses(shared_traces: Path, shared_captures) -> dict[str, object]:
    """Source path -> RunAnalysis for the GPU/CPU captures and the v6e inference capture (the session's
    shared ingest, a database of many runs); "db" -> that database."""
    v6e = shared_traces / "real" / "tpu_v6e_4chip_jax_inference.xplane.pb"
    paths = _gpu_and_cpu_traces(shared_traces) + [v6e]
    analyses = {str(p.resolve()): shared_captures.analysis(p) for p in paths}
    assert len({id(a) for a in analyses.values()}) == len(paths)  # one run each
    analyses["db"] = shared_captures.db
    return analyses


def _runs(analyses: dict) -> dict:
    return {source: a for source, a in analyses.items() if source != "db"}


def _pick(analyses: dict, fragment: str) -> list:
    found = [a for source, a in _runs(analyses).items() if fragment in source]
    assert found, fragment
    return found


def test_gpu_and_cpu_traces_get_no_tpu_wording(shared_analyses: dict) -> None:
    checked = 0
    for source, a in _runs(shared_analyses).items():
        family = advice_platform(a.summary["identity"])["family"]
        if "tpu_v6e" in source:
            continue
        expected = "CPU" if "jax_cpu" in source else "GPU"
        assert family == expected, (source, advice_platform(a.summary["identity"]))
        for f in a.findings:
            assert not TPU_WORDING.search(f["recommendation"]), (source, f["rule"], f["recommendation"])
            checked += 1
    assert checked >= 8  # the rules do fire on these traces (host overhead, input, collectives)


def test_gpu_advice_names_the_gpu_techniques(shared_analyses: dict) -> None:
    (v100,) = _pick(shared_analyses, "gpu_v100x8_tf_multiworker")
    assert advice_platform(v100.summary["identity"])["vendor"] == "NVIDIA"
    host = {f["rule"]: f for f in v100.findings}["host-overhead"]
    assert "CUDA graphs" in host["recommendation"]
    (nccl,) = _pick(shared_analyses, "kineto_nccl_rank0")
    coll = {f["rule"]: f for f in nccl.findings}["collective-bound"]
    assert "NCCL" in coll["recommendation"] and "torus" not in coll["recommendation"]
    amd = _pick(shared_analyses, "gpu_mi300x_jax08_gemm")[0]
    assert advice_platform(amd.summary["identity"])["vendor"] == "AMD"


def test_amd_advice_names_hip_not_cuda(shared_analyses: dict) -> None:
    """MI300X / MI355X captures: the graph capture and stream are HIP's, the collective library RCCL."""
    checked = 0
    for a in _pick(shared_analyses, "gpu_mi3"):
        assert advice_platform(a.summary["identity"])["vendor"] == "AMD"
        for f in a.findings:
            assert "CUDA" not in f["recommendation"] and "NCCL" not in f["recommendation"].replace(
                "RCCL", ""), (f["rule"], f["recommendation"])
            if f["rule"] == "host-overhead":
                assert "HIP graphs" in f["recommendation"]
                checked += 1
    assert checked >= 1


def test_all_to_all_is_not_advised_as_a_gradient_all_reduce(shared_analyses: dict) -> None:
    """The Kineto NCCL ranks' exposed collective time is the embedding all-to-all (SendRecv kernels),
    not a gradient all-reduce: the advice and the gain model say so, with no torus on a GPU."""
    for a in _pick(shared_analyses, "kineto_nccl_rank"):
        coll = {f["rule"]: f for f in a.findings}["collective-bound"]
        assert coll["evidence"]["metrics"]["most_exposed_kind"] == "all-to-all"
        assert "all-to-all" in coll["recommendation"] and "gradient all-reduce" not in coll["recommendation"]
        assert "torus" not in coll["estimated_gain"]["model"]
    (jax,) = _pick(shared_analyses, "jax_cpu/pmap8_train_eval")  # a psum: the all-reduce wording
    coll = {f["rule"]: f for f in jax.findings}["collective-bound"]
    assert coll["evidence"]["metrics"]["most_exposed_kind"] == "all-reduce"
    assert "all-to-all" not in coll["recommendation"]


def test_pytorch_dataloader_wait_is_input_not_launch_overhead(shared_analyses: dict) -> None:
    """kineto_resnet50_v100: the loop's DataLoader __next__ (single-process loader) runs inside each
    ProfilerStep while the GPU has little to do. That idle is input: input-bound fires, and ranks above
    host-overhead. Bounds from the raw events: the __next__ windows, less the GPU work inside them."""
    (a,) = _pick(shared_analyses, "kineto_resnet50_v100")
    rules = [f["rule"] for f in a.findings]
    assert rules[0] == "input-bound", rules
    con = duckdb.connect(str(shared_analyses["db"]), read_only=True)
    try:
        window_ps, busy_ps = con.execute("""
            WITH n AS (SELECT start_ps AS s, start_ps + duration_ps AS e FROM events
                       WHERE run_id = $run AND name LIKE 'enumerate(DataLoader)#%__next__'),
                 k AS (SELECT start_ps AS s, start_ps + duration_ps AS e FROM events
                       WHERE run_id = $run AND json_extract_string(stats, '$.cat')
                             IN ('Kernel', 'kernel', 'Memcpy', 'gpu_memcpy', 'Memset', 'gpu_memset'))
            SELECT (SELECT sum(e - s) FROM n),
                   (SELECT sum(least(k.e, n.e) - greatest(k.s, n.s)) FROM n JOIN k ON k.s < n.e AND k.e > n.s)
            """, {"run": a.run_id}).fetchone()
    finally:
        con.close()
    input_ps = float(a.steps.loc[~a.steps["is_eval"] & ~a.steps["is_warmup"], "input_ps"].sum())
    # H2D copies outside the windows are input too, so the sum may exceed the idle under __next__
    assert window_ps - busy_ps <= input_ps <= window_ps + 0.02 * float(a.steps["duration_ps"].sum())
    assert a.summary["breakdown"]["input"] > 0.25


def test_gpu_transpose_fusions_are_data_formatting(shared_analyses: dict) -> None:
    """The MI300X conv run (JAX, ROCm): XLA GPU's input_transpose_fusion / loop_transpose_fusion
    kernels (NCDHW <-> NDHWC around the convolution) are over half the compute: data-formatting fires,
    its share as a plain name match over the op rows counts it, worded for AMD."""
    (a,) = _pick(shared_analyses, "gpu_mi300x_jax_conv_rundir")
    fmt = {f["rule"]: f for f in a.findings}["data-formatting"]
    con = duckdb.connect(str(shared_analyses["db"]))  # writable: the views `tpuanalyze sql` reads
    try:
        install_views(con)
        (share,) = con.execute("""
            SELECT sum(duration_ps) FILTER (WHERE short_name LIKE '%transpose%fusion%'
                                               OR short_name LIKE '%copy%fusion%') / sum(duration_ps)
            FROM op_steps WHERE run_id = $run AND step_start IS NOT NULL AND NOT step_is_eval
              AND category IN ('compute', 'weight_update') AND NOT is_container""",
                               {"run": a.run_id}).fetchone()
    finally:
        con.close()
    assert share > 0.5
    assert fmt["evidence"]["metrics"]["data_formatting_share_of_compute"] == pytest.approx(share, abs=1e-6)
    assert "Matrix Cores" in fmt["recommendation"] and "Tensor Cores" not in fmt["recommendation"]


def test_jax08_gpu_executions_are_the_users_calls(shared_analyses: dict) -> None:
    """gpu_mi300x_jax08_conv: JAX 0.8 launches the kernels from a thread of its own while eight
    per-device ExecuteHelper spans overlap; an execution is the user's call (the outermost execute
    span), so each device has as many steps as the python thread has Execute calls (5 kernels each)."""
    (a,) = _pick(shared_analyses, "gpu_mi300x_jax08_conv")
    con = duckdb.connect(str(shared_analyses["db"]), read_only=True)
    try:
        (calls,) = con.execute("SELECT count(*) FROM events WHERE run_id = $run AND line = 'python' "
                               "AND name = 'PjRtStreamExecutorLoadedExecutable::Execute'",
                               {"run": a.run_id}).fetchone()
        kernels = con.execute("SELECT device_ordinal, count(*) FROM events WHERE run_id = $run "
                              "AND plane LIKE '/device:GPU:%' AND line LIKE 'Stream #%' GROUP BY ALL",
                              {"run": a.run_id}).fetchall()
    finally:
        con.close()
    per_device = a.steps.groupby("device_ordinal").size()
    assert calls == 5 and len(per_device) == 8 and set(per_device) == {calls}
    assert [n for _, n in kernels].count(5 * calls) >= 7  # GPU:0 also ran the set-up kernels
    assert a.summary["step_time_ms"]["min"] > 0.5  # whole executions, not one-kernel fragments


def test_eager_capture_says_steps_describe_one_program(shared_analyses: dict) -> None:
    """gpu_mi300x_jax08_attention runs 13 small programs eagerly; the step series (the largest one,
    jit_matmul) is 56% of their time: a note says the step figures describe that program alone. The
    v6e capture's jit_f is nearly all of its program time: no note."""
    (eager,) = _pick(shared_analyses, "gpu_mi300x_jax08_attention")
    programs = pd.DataFrame(eager.summary["programs"])
    share = programs.loc[programs["is_step_program"], "total_ms_per_device"].sum() / programs[
        "total_ms_per_device"].sum()
    assert share < 0.75
    (note,) = [n for n in eager.summary["notes"] if n.startswith("the step series is")]
    assert f"{share:.0%} of the devices' program time" in note and "jit_matmul" in note
    (v6e,) = _pick(shared_analyses, "tpu_v6e_4chip_jax_inference")
    assert not [n for n in v6e.summary["notes"] if n.startswith("the step series is")]


def test_one_pause_between_calls_is_no_per_step_launch_cost(shared_analyses: dict) -> None:
    """gpu_mi300x_jax08_attention: of its step cycle's idle, one 20.7 ms gap between two jit_matmul
    calls (between the script's python calls, 16 us of ops in it) is most; the gain counts the idle
    that recurs, the summary names the pause. The generated host-overhead run has no such pause."""
    (a,) = _pick(shared_analyses, "gpu_mi300x_jax08_attention")
    host = {f["rule"]: f for f in a.findings}["host-overhead"]
    m = host["evidence"]["metrics"]
    steps = a.steps[~a.steps["is_eval"]].sort_values("start_ps")
    gaps = (steps["start_ps"].shift(-1) - (steps["start_ps"] + steps["duration_ps"])).dropna() / 1e9
    assert 0.99 * gaps.max() <= m["one_off_gap_ms"] <= gaps.max()  # the gap less its few tiny ops
    assert m["one_off_gap_ms"] > 0.5 * m["idle_ms_per_step"] * len(steps)
    assert m["recurring_idle_ms_per_step"] == pytest.approx(  # metrics carry 6 decimals
        m["idle_ms_per_step"] - m["one_off_gap_ms"] / len(steps), abs=1e-5)
    assert host["estimated_gain"]["own_ms"] == pytest.approx(m["recurring_idle_ms_per_step"], rel=1e-3)
    assert "one pause between two steps" in host["evidence"]["summary"]


def test_cpu_advice_speaks_of_host_threads(shared_analyses: dict) -> None:
    for a in _pick(shared_analyses, "jax_cpu"):
        platform = advice_platform(a.summary["identity"])
        assert platform["mode"] == "training", platform  # StepTraceAnnotation("train"), train_step
        host = {f["rule"]: f for f in a.findings}.get("host-overhead")
        if host:
            assert "host thread" in host["recommendation"]


def test_v6e_inference_gets_no_training_advice(shared_analyses: dict) -> None:
    (a,) = _pick(shared_analyses, "tpu_v6e_4chip_jax_inference")
    platform = advice_platform(a.summary["identity"])
    assert (platform["family"], platform["generation"], platform["mode"]) == ("TPU", "v6e", "inference")
    for f in a.findings:
        assert f["rule"] not in TRAINING_ONLY, f["rule"]
        assert not TRAINING_WORDING.search(f["recommendation"]), (f["rule"], f["recommendation"])
    assert "data-formatting" not in {f["rule"] for f in a.findings}  # async copy waits are not layout copies
    from tpuanalyze.reports.terminal import render_text

    assert re.search(r"mode\s+inference \(no optimizer", render_text([a]))


def test_v6e_setup_gap_is_no_host_overhead(shared_analyses: dict) -> None:
    """The v6e capture idles 5.5 s between its set-up programs and the first jit_f: idle of the capture
    (13% of wall, as XProf's duty cycle counts it) but no launch overhead, as its 100 steps run back
    to back. host-overhead judges the step cycle; the notes say what lies outside it, and that the
    copy-done waits filling the cycle have no catalog rule."""
    (a,) = _pick(shared_analyses, "tpu_v6e_4chip_jax_inference")
    assert a.summary["breakdown"]["idle"] > 0.10
    cores = a.per_core
    assert "host-overhead" not in {f["rule"] for f in a.findings}
    outside = [n for n in a.summary["notes"] if "outside the step cycle" in n]
    assert len(outside) == 1 and "host-overhead does not" in outside[0], a.summary["notes"]
    uncovered = [n for n in a.summary["notes"] if n.startswith("memory_transfer is")]
    assert len(uncovered) == 1 and "no catalog rule covers it" in uncovered[0], a.summary["notes"]
    assert "copy-done" in uncovered[0]
    assert len(cores) == 4


def test_v6e_cycle_idle_is_the_gaps_between_its_steps(shared_analyses: dict) -> None:
    """device_breakdown.idle_in_cycle_ps is the step cycle less its busy time; on the v6e capture it
    equals the in-step idle plus the gaps between consecutive steps, computed here from the steps."""
    (a,) = _pick(shared_analyses, "tpu_v6e_4chip_jax_inference")
    con = duckdb.connect(str(shared_analyses["db"]))  # writable: the views `tpuanalyze sql` reads
    try:
        install_views(con)
        rows = con.execute("""
            WITH s AS (SELECT device_ordinal, start_ps, duration_ps, idle_ps,
                              lead(start_ps) OVER (PARTITION BY device_ordinal ORDER BY start_ps)
                                - (start_ps + duration_ps) AS gap_ps
                       FROM step_breakdown WHERE run_id = $run AND NOT is_eval)
            SELECT d.device_ordinal, d.idle_in_cycle_ps, d.cycle_ps, d.idle_ps, d.wall_ps,
                   (SELECT sum(idle_ps) + coalesce(sum(gap_ps), 0) FROM s
                    WHERE s.device_ordinal = d.device_ordinal) AS from_steps,
                   (SELECT max(start_ps + duration_ps) - min(start_ps) FROM s
                    WHERE s.device_ordinal = d.device_ordinal) AS span_ps
            FROM device_breakdown d WHERE d.run_id = $run ORDER BY 1""", {"run": a.run_id}).fetchall()
    finally:
        con.close()
    assert len(rows) == 4
    for _, idle_cycle, cycle, idle, wall, from_steps, span in rows:
        assert cycle == span and wall > cycle
        # no op runs between the steps (the psum programs precede them): the gaps are all idle
        assert idle_cycle == from_steps
        assert 0 <= idle_cycle < 1e-5 * cycle < idle


def test_one_step_host_overhead_is_low_and_says_why(shared_analyses: dict) -> None:
    """The V100 capture holds one train step on each of its two timelines: its idle cannot tell a
    launch gap from a one-off stall, so the finding ranks low and its summary says so."""
    (v100,) = _pick(shared_analyses, "gpu_v100x8_tf_multiworker")
    host = {f["rule"]: f for f in v100.findings}["host-overhead"]
    assert host["severity"] == "low"
    assert host["evidence"]["metrics"]["min_train_steps"] == 1
    assert host["evidence"]["metrics"]["devices"] == 2
    assert "only 1 train step(s) on 2 device(s)" in host["evidence"]["summary"]


def test_generated_tpu_v3_training_is_recognised_from_its_ops() -> None:
    db, run_ids = ingested(generated_run(scenario="weight-update-unsharded"))
    (a,) = analyze_db(db, list(run_ids))
    platform = advice_platform(a.summary["identity"])
    assert (platform["family"], platform["generation"], platform["mode"]) == ("TPU", "v3", "training")
    assert "optimizer/weight-update ops" in a.summary["identity"]["workload"]["mode_evidence"]
    wu = {f["rule"]: f for f in a.findings}["weight-update-unsharded"]
    assert "reduce-scatter" in wu["recommendation"]


def test_unknown_thresholds_key_is_a_one_line_error(tmp_path: Path, shared_traces: Path) -> None:
    bad = tmp_path / "mine.toml"
    bad.write_text("[input_bound]\nmedium = 0.1\nhihg = 0.3\n")
    trace = shared_traces / "jax_cpu" / "single_jit_train"
    proc = run_cli("report", str(trace), "--thresholds", str(bad))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert str(bad) in lines[0] and "input_bound.hihg" in lines[0] and "Traceback" not in proc.stderr
    bad.write_text("[no_such_rule]\nmedium = 0.1\n")
    proc = run_cli("report", str(trace), "--thresholds", str(bad))
    assert proc.returncode == 2 and "no_such_rule" in proc.stderr
    with pytest.raises(TpuAnalyzeError, match="collective_bound.hgh"):
        load_thresholds({"collective_bound": {"hgh": 0.5}})
    assert load_thresholds({"collective_bound": {"high": 0.5}})["collective_bound"]["high"] == 0.5


def test_every_threshold_is_used_by_the_analyzer() -> None:
    """No dead keys: each key of thresholds.toml is read somewhere in the analyzer's code."""
    import tpuanalyze.analyzer as analyzer_pkg

    folder = Path(analyzer_pkg.__file__).parent
    code = "\n".join(p.read_text() for p in folder.rglob("*.py"))
    for section, values in load_thresholds().items():
        for key in values:
            assert f'["{key}"]' in code or f"['{key}']" in code, f"{section}.{key}"


def test_json_over_several_runs_has_the_cross_run_findings(tmp_path: Path) -> None:
    series = Path(__file__).resolve().parents[1] / "sample_traces" / "scaling"
    assert series.is_dir(), "bundled sample_traces/scaling is missing"
    out = tmp_path / "series.json"
    proc = run_cli("report", str(series), "--json", str(out), "--quiet")
    assert proc.returncode == 0, proc.stderr
    document = json.loads(out.read_text())
    assert len(document["runs"]) == 3
    cross = document["cross_run"]["findings"]
    assert cross and {f["rule"] for f in cross} == {"scaling-limit"}
    for f in cross:
        assert set(f) >= {"rule", "severity", "evidence", "recommendation", "catalog", "estimated_gain"}
    proc = run_cli("report", str(series), "--no-progress")  # the terminal shows the same findings
    assert proc.stdout.count("scaling-limit") >= len(cross)


def test_evidence_sql_returns_every_metric_on_real_captures(shared_analyses: dict) -> None:
    """Each finding's metrics are its SQL's row, column for column, in `tpuanalyze sql`'s views."""
    con = duckdb.connect(str(shared_analyses["db"]))
    try:
        install_views(con)
        checked = 0
        for source, a in _runs(shared_analyses).items():
            for f in a.findings:
                cur = con.execute(f["evidence"]["sql"])
                row = dict(zip([d[0] for d in cur.description], cur.fetchone(), strict=True))
                assert set(row) == set(f["evidence"]["metrics"]), (source, f["rule"])
                for key, value in f["evidence"]["metrics"].items():
                    if isinstance(value, float):
                        assert float(row[key]) == pytest.approx(value, rel=1e-5, abs=1e-6), (source, key)
                    else:
                        assert row[key] == value, (source, f["rule"], key)
                checked += 1
        assert checked >= 8
    finally:
        con.close()


def test_json_cross_run_section_is_present_but_empty_without_a_series(shared_analyses: dict) -> None:
    runs = list(_runs(shared_analyses).values())[:2]
    document = json.loads(json.dumps(report_json(runs)))
    assert document["cross_run"] == {"findings": []}
    assert "cross_run" not in report_json(runs[:1])  # one run: the JSON is its summary only


def test_real_captures_gains_stay_within_the_time_outside_compute(shared_analyses: dict) -> None:
    """E.g. the JAX CPU capture with eval: its findings once claimed 110% of the step."""
    for source, a in _runs(shared_analyses).items():
        cores = a.per_core[a.per_core["steps"] > 0]  # the step cycle: wall time per train step
        if cores.empty:
            continue
        outside = 1.0 - float((cores["compute"] * cores["wall_ms"]).sum()) / float(cores["wall_ms"].sum())
        total = sum(f["estimated_gain"]["fraction"] or 0.0 for f in a.findings if "caused_by" not in f)
        assert total <= outside + 1e-3, (source, total, outside)
    (train_eval,) = _pick(shared_analyses, "pmap8_train_eval")
    assert len(train_eval.findings) >= 3


def test_eval_between_steps_is_no_pause(sample_captures) -> None:  # noqa: ANN001 - conftest.CaptureSet
    """The bundled pmap8_input_bound runs an eval program between two train steps: that gap is busy
    (eval), not a one-off pause, so host-overhead keeps its whole cycle idle (a gap's idle is bounded by
    the device's idle between steps)."""
    run = next(p for p in sample_capture_paths() if "pmap8_input_bound" in str(p))
    a = sample_captures.analysis(run)
    assert a.summary["breakdown"]["eval"] > 0.2
    m = {f["rule"]: f for f in a.findings}["host-overhead"]["evidence"]["metrics"]
    assert m["one_off_gap_ms"] == 0 and m["recurring_idle_ms_per_step"] == m["idle_ms_per_step"]
