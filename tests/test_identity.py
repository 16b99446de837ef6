"""Run identity from the trace itself (platform, workload, chips captured vs in the job, batch), and the
refusal to compare or fit runs of different workloads or platforms.

Expected facts are read here from the files with the protobuf library (an independent parse, not our
wire decoder) and from traces/INDEX.md; generated runs are checked against their ground_truth.json,
which the analyzer never reads."""

from __future__ import annotations

import json
import re
from pathlib import Path

import duckdb
import pytest
from conftest import run_cli
from tpuanalyze.analyzer.api import analyze_run
from tpuanalyze.analyzer.identity import program_name, tpu_generation

from tpuanalyze import generator  # a broken generator must fail these tests, not skip them
from tpuanalyze.pipeline import ingest_paths
from tpuanalyze.proto import xplane_pb2

pytestmark = pytest.mark.xdist_group("captures")  # the session's shared ingest: one worker makes it

V6E = "real/tpu_v6e_4chip_jax_inference.xplane.pb"
V100 = "real/gpu_v100x8_tf_multiworker.xplane.pb"


def _space(path: Path) -> xplane_pb2.XSpace:
    space = xplane_pb2.XSpace()
    space.ParseFromString(path.read_bytes())
    return space


def _plane_stats(plane) -> dict:
    names = {k: v.name for k, v in plane.stat_metadata.items()}
    out = {}
    for stat in plane.stats:
        field = stat.WhichOneof("value")
        out[names.get(stat.metadata_id)] = getattr(stat, field) if field else None
    return out


def _programs(space: xplane_pb2.XSpace) -> set[str]:
    """Every XLA program the file names (`XLA Modules` event names, `hlo_module` stats), no fingerprint."""
    found = set()

    def add(text: str) -> None:
        if text:
            found.add(re.sub(r"\(\d+\)$", "", text))

    for plane in space.planes:
        stat_names = {k: v.name for k, v in plane.stat_metadata.items()}

        def modules(stats, stat_names=stat_names) -> None:
            for stat in stats:
                if stat_names.get(stat.metadata_id) == "hlo_module":
                    add(stat.str_value or (stat_names.get(stat.ref_value, "") if stat.ref_value else ""))

        module_line_ids = {ln.id for ln in plane.lines if ln.name == "XLA Modules"}
        for md_id in {ev.metadata_id for ln in plane.lines if ln.id in module_line_ids for ev in ln.events}:
            add(plane.event_metadata[md_id].name)
        for md in plane.event_metadata.values():
            modules(md.stats)
        for ln in plane.lines:
            for ev in ln.events:
                modules(ev.stats)
    return found


@pytest.fixture(scope="module")
def real_db(shared_traces, shared_captures):
    """Run folder or file -> identity, for every real XSpace capture (the session's shared ingest)."""
    paths = sorted(p for p in (shared_traces / "real").glob("*.xplane.pb") if "corrupt" not in p.name)
    paths += [shared_traces / "real" / "gpu_mi300x_jax_conv_rundir"]
    paths += sorted(p for p in (shared_traces / "jax_cpu").iterdir() if p.is_dir())
    runs = {shared_captures.run_id(p) for p in paths}
    assert len(runs) == len(paths)
    con = duckdb.connect(str(shared_captures.db), read_only=True)
    try:
        sources = [Path(s) for (s,) in con.execute(
            f"SELECT source_path FROM runs WHERE run_id IN ({', '.join(map(str, sorted(runs)))})").fetchall()]
    finally:
        con.close()
    return {source: shared_captures.analysis(source).summary["identity"] for source in sources}


def _files(source: Path) -> list[Path]:
    return [source] if source.is_file() else sorted(source.rglob("*.xplane.pb"))


def test_every_real_capture_states_its_platform_workload_and_devices(real_db) -> None:
    for source, identity in real_db.items():
        spaces = [_space(f) for f in _files(source)]
        device_planes = [p for s in spaces for p in s.planes if re.match(r"^/device:(TPU|GPU):\d+$", p.name)]
        stats = [_plane_stats(p) for p in device_planes]
        platform = identity["platform"]
        assert identity["hosts_captured"] == len(spaces), source
        if device_planes:
            assert identity["devices_captured"] == len(device_planes), source
            assert identity["devices_with_events"] == sum(
                1 for p in device_planes if any(len(ln.events) for ln in p.lines)), source
        if any(p.name.startswith("/device:TPU") for p in device_planes):
            types = {s.get("device_type_string") for s in stats}
            assert platform["kind"] == "tpu" and {platform["device_type"]} == types, source
            assert platform["generation"] == tpu_generation(platform["device_type"])
        elif device_planes:
            caps = {(s.get("compute_cap_major"), s.get("compute_cap_minor")) for s in stats} - {(None, None)}
            assert platform["kind"] == "gpu" and len(caps) == 1, source
            major, minor = caps.pop()
            assert f"{major}{minor}" in platform["generation"].replace(".", "") or \
                f"gfx9{minor}" in platform["generation"], (source, platform)
            vendor = {s.get("device_vendor") for s in stats} - {None}
            assert platform["vendor"] == (vendor.pop() if vendor else "NVIDIA"), source
        else:
            assert platform["kind"] == "cpu", source
        programs = set().union(*(_programs(s) for s in spaces))
        assert set(identity["workload"]["programs"]) == programs, source
        if programs:
            assert identity["workload"]["program"] in programs
        else:
            assert identity["workload"]["program"] is None
            assert any(n.startswith("workload:") for n in identity["notes"]), source
        if identity["per_core_batch"] is None:
            assert any(n.startswith("batch:") for n in identity["notes"]), source


def test_named_facts_of_the_real_captures(real_db, shared_traces) -> None:
    v6e = real_db[shared_traces / V6E]
    # INDEX.md: TPU v6e, 4 chips, one host; its all-reduce spans 8 devices (replica_groups=[4,2]<=[2,4])
    # and its planes' global chip ids run 4..7: the job is 8 chips, 4 of them captured
    assert v6e["platform"] == {"kind": "tpu", "vendor": "Google", "device_type": "TPU v6 Lite",
                               "generation": "v6e"}
    assert (v6e["chips_captured"], v6e["chips_in_job"], v6e["chips_at_least"]) == (4, 8, 8)
    assert v6e["cores_per_chip"] == 1 and v6e["workload"]["program"] == "jit_f"
    v100 = real_db[shared_traces / V100]
    assert v100["platform"]["generation"] == "Volta (sm_70)" and v100["platform"]["vendor"] == "NVIDIA"
    assert v100["devices_captured"] == 8 and v100["chips_in_job"] is None
    assert v100["workload"]["program"] is None  # TensorFlow without XLA: no program named
    mi355 = real_db[shared_traces / "real/gpu_mi355x_jax_te_fused_attn.xplane.pb"]
    assert mi355["platform"]["generation"] == "CDNA4 (gfx950)"
    assert mi355["workload"]["program"] == "jit_loss_fn"
    single = next(v for k, v in real_db.items() if "single_jit_train" in str(k))
    assert single["platform"]["kind"] == "cpu" and single["devices_captured"] == 1
    pmap = next(v for k, v in real_db.items() if "pmap8_train_eval" in str(k))
    assert pmap["devices_captured"] == 8


def test_program_names_drop_the_fingerprint() -> None:
    assert program_name("jit_train_step(12190760917235803885)") == "jit_train_step"
    assert program_name("jit__psum(9646411105960254074)") == "jit__psum"
    assert program_name("jit_forward_3d_conv") == "jit_forward_3d_conv"
    assert tpu_generation("TPU v5 Lite") == "v5e" and tpu_generation("TPU v4") == "v4"


# --- mixed runs ------------------------------------------------------------------------------------------

def _one_error_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert lines[0].startswith("tpuanalyze: error: ") and "Traceback" not in result.stderr
    return lines[0]


def test_mixed_real_runs_are_refused_by_scaling_and_compare(shared_traces) -> None:
    a, b = str(shared_traces / V6E), str(shared_traces / V100)
    for verb in ("scaling", "compare"):
        line = _one_error_line(run_cli(verb, a, b))
        assert a in line and b in line, line
        assert "platform tpu v6e vs gpu NVIDIA Volta (sm_70)" in line, line
        assert "--allow-mixed" in line


def test_report_over_mixed_real_runs_builds_no_scaling_series(shared_traces, tmp_path) -> None:
    result = run_cli("report", str(shared_traces / V6E), str(shared_traces / V100),
                     "--json", str(tmp_path / "r.json"), "--html", str(tmp_path / "r.html"))
    assert result.returncode == 0, result.stderr
    assert "scaling-limit" not in result.stdout and "Scaling across runs" not in result.stdout
    assert "scaling-limit" not in (tmp_path / "r.json").read_text()
    assert "scaling-limit" not in (tmp_path / "r.html").read_text()


def test_allow_mixed_compares_with_a_warning(shared_traces) -> None:
    result = run_cli("compare", str(shared_traces / V6E), str(shared_traces / V100), "--allow-mixed")
    assert result.returncode == 0, result.stderr
    assert "tpuanalyze: warning: " in result.stderr and "compared anyway" in result.stderr
    assert "step time" in result.stdout


@pytest.fixture(scope="module")
def small_runs(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("models")
    return {
        "resnet8": generator.generate("resnet50", 8, steps=3, hosts=1, out=out / "resnet8"),
        "resnet16": generator.generate("resnet50", 16, steps=3, hosts=1, out=out / "resnet16"),
        "bert8": generator.generate("bert", 8, steps=3, hosts=1, out=out / "bert8"),
    }


def test_compare_refuses_resnet_against_bert(small_runs) -> None:
    line = _one_error_line(run_cli("compare", str(small_runs["resnet8"]), str(small_runs["bert8"])))
    assert "model resnet_model vs bert" in line and "input bf16[*,112,112,12] vs s32[*,512]" in line


def test_scaling_allow_mixed_fits_with_a_warning(small_runs) -> None:
    refused = run_cli("scaling", str(small_runs["resnet8"]), str(small_runs["bert8"]))
    _one_error_line(refused)
    forced = run_cli("scaling", str(small_runs["resnet8"]), str(small_runs["bert8"]), "--allow-mixed",
                     "--chips", f"{small_runs['bert8']}=16")
    assert forced.returncode == 0, forced.stderr
    assert "tpuanalyze: warning: " in forced.stderr and "not the same workload" in forced.stderr


def test_compare_warns_on_size_and_gates_per_chip(small_runs, tmp_path) -> None:
    a, b = str(small_runs["resnet8"]), str(small_runs["resnet16"])
    result = run_cli("compare", a, b, "--json", str(tmp_path / "c.json"))
    assert result.returncode == 0, result.stderr
    assert "chips differ: A 8 vs B 16" in result.stderr
    document = json.loads((tmp_path / "c.json").read_text())
    per_chip = document["throughput_per_chip"]
    truths = [json.loads((small_runs[k] / "ground_truth.json").read_text()) for k in ("resnet8", "resnet16")]
    for side, truth in zip("ab", truths, strict=True):
        batch = truth["model"]["per_core_batch"] * truth["model"]["cores"]
        expected = batch / (truth["step_time_ms"] / 1e3) / truth["model"]["chips"]
        assert per_chip[side] == pytest.approx(expected, rel=0.05), (side, per_chip)
    assert per_chip["unit"] == "examples/s per chip"
    slower = per_chip["b_slower_pct"]
    gate = run_cli("compare", a, b, "--per-chip", "--fail-if-slower", str(max(slower, 0) / 2 if slower > 0
                                                                          else 1000))
    assert gate.returncode == (1 if slower > 0 else 0), gate.stderr
    if slower > 0:
        assert "throughput per chip" in gate.stderr


# --- generated pods: the run's size from what a real capture carries ---------------------------------

def test_sampled_bert_pod_reports_the_runs_replicas(tmp_path) -> None:
    run = generator.generate("bert", 4096, steps=3, hosts=2, scenario="weight-update-unsharded",
                             out=tmp_path / "bert")
    truth = json.loads((run / "ground_truth.json").read_text())
    files = sorted(run.glob("*.xplane.pb"))
    assert len(files) == 2
    for f in files:  # the generator writes no run configuration: only what a real capture carries
        meta = next(p for p in _space(f).planes if p.name == "/host:metadata")
        assert not meta.stats
    summary = ingest_paths([run], tmp_path / "db.duckdb")
    con = duckdb.connect(str(tmp_path / "db.duckdb"), read_only=True)
    analysis = analyze_run(con, summary.run_ids[0])
    con.close()
    identity = analysis.summary["identity"]
    assert identity["hosts_captured"] == 2 and identity["chips_captured"] == 16
    assert identity["chips_in_job"] == truth["model"]["chips"] == 4096
    assert identity["hosts_in_job"] == truth["model"]["hosts"] == 512
    assert identity["replicas"] == truth["model"]["cores"] == 8192
    assert identity["per_core_batch"] == pytest.approx(truth["model"]["per_core_batch"])
    assert identity["workload"]["model_scope"] == "bert" and identity["platform"]["generation"] == "v3"
    finding = next(f for f in analysis.findings if f["rule"] == "weight-update-unsharded")
    assert finding["evidence"]["metrics"]["replicas"] == 8192


def test_report_builds_series_only_within_one_workload(small_runs, tmp_path) -> None:
    from tpuanalyze.reports.cmd_report import analyse

    db = tmp_path / "runs.duckdb"
    ids = ingest_paths([small_runs["bert8"], small_runs["resnet8"], small_runs["resnet16"]], db).run_ids
    _, series = analyse(db, ids, (), None, False)
    # BERT at 8 chips and ResNet-50 at 16 would be a 2-point "series"; only the ResNet-50 pair is one
    assert series is not None and len(series) == 1
    assert list(series[0].measured["chips"]) == [8, 16]
    assert "resnet_model" in series[0].workload
    _, none = analyse(db, [ids[0], ids[2]], (), None, False)
    assert none is None


def test_replica_groups_in_both_hlo_spellings() -> None:
    from tpuanalyze.analyzer.identity import _replica_groups

    con = duckdb.connect()
    con.execute("CREATE TABLE event_metadata (run_id INTEGER, name VARCHAR)")
    texts = {
        1: ["%all-reduce = f32[5] all-reduce(f32[5] %b), channel_id=1, replica_groups=[4,2]<=[2,4]T(1,0), "
            "use_global_device_ids=true, to_apply=%r"],
        2: ["%ar = f32[8] all-reduce(f32[8] %x), replica_groups={{0,1,2,3},{4,5,6,7}}, to_apply=%add",
            "%ag = f32[16] all-gather(f32[8] %y), replica_groups={{0,4},{1,5},{2,6},{3,7}}, dimensions={0}"],
        3: ["%ar = f32[8] all-reduce(f32[8] %x), replica_groups={}, to_apply=%add"],
    }
    for run_id, names in texts.items():
        for name in names:
            con.execute("INSERT INTO event_metadata VALUES (?, ?)", [run_id, name])
    assert _replica_groups(con, 1) == (8, 2)   # 4 groups of 2 over 8 devices
    assert _replica_groups(con, 2) == (8, 4)  # the all-reduce's groups set the replicas
    assert _replica_groups(con, 3) == (None, None)  # `{}` = all replicas: the count is not stated
