"""The generator: real XSpace files laid out like a TPU capture, deterministic, and a ground truth that an
independent reader of the written files reproduces with the documented recognition rules."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tpuanalyze.generator import SCENARIOS, generate
from tpuanalyze.generator.topology import topology_for
from tpuanalyze.generator.wire import encode_events

from tpuanalyze.errors import TpuAnalyzeError
from tpuanalyze.proto import xplane_pb2 as pb

COLLECTIVES = {"all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute"}
KEYS = ("compute", "weight_update", "collectives", "input", "output", "eval", "idle")


def _space(path: Path) -> pb.XSpace:
    xs = pb.XSpace()
    xs.ParseFromString(path.read_bytes())
    return xs


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return generate(
        "resnet50", 16, steps=6, hosts=2, scenario="baseline", seed=7, out=tmp_path_factory.mktemp("g")
    )


def test_wire_encoding_is_byte_identical_to_protobuf() -> None:
    rng = np.random.default_rng(3)
    n = 500
    md, off = rng.integers(1, 400, n), rng.integers(0, 2**50, n)
    dur, grp, present = rng.integers(1, 2**40, n), rng.integers(0, 300, n), rng.random(n) < 0.5
    chunks = encode_events(md, off, dur, [(5, grp, present), (6, grp, None)], groups=[200, 0, 300])
    for chunk, rows in zip((chunks[0], chunks[2]), (range(0, 200), range(200, 500)), strict=True):
        ref = pb.XLine(id=3)
        for i in rows:
            e = ref.events.add(metadata_id=int(md[i]), offset_ps=int(off[i]), duration_ps=int(dur[i]))
            if present[i]:
                e.stats.add(metadata_id=5, int64_value=int(grp[i]))
            e.stats.add(metadata_id=6, int64_value=int(grp[i]))
        assert pb.XLine(id=3).SerializeToString() + chunk == ref.SerializeToString()
    assert chunks[1] == b""


def test_topology_hosts_and_cores() -> None:
    pod, multipod, small = topology_for(1024), topology_for(4096), topology_for(4)
    assert (pod.hosts, pod.cores_per_host, pod.x, pod.y, pod.wrap_x, pod.wrap_y) == (
        256,
        8,
        32,
        32,
        True,
        True,
    )
    assert (multipod.hosts, multipod.cores_per_host, multipod.x, multipod.y) == (512, 16, 128, 32)
    assert (multipod.wrap_x, multipod.wrap_y) == (False, True)
    assert (small.hosts, small.cores, small.name) == (1, 8, "v3-8")
    with pytest.raises(TpuAnalyzeError):
        topology_for(48)


def test_layout_follows_a_real_tpu_capture(run: Path) -> None:
    files = sorted(run.glob("*.xplane.pb"))
    assert [f.name for f in files] == ["v3-32-w-0.xplane.pb", "v3-32-w-3.xplane.pb"]
    xs = _space(files[0])
    assert list(xs.hostnames) == ["v3-32-w-0"]
    names = [p.name for p in xs.planes]
    assert names == [f"/device:TPU:{i}" for i in range(8)] + ["/host:CPU", "/host:metadata"]
    tpu = xs.planes[3]
    sm = {k: v.name for k, v in tpu.stat_metadata.items()}
    stats = {sm[s.metadata_id]: getattr(s, s.WhichOneof("value")) for s in tpu.stats}
    assert stats["device_type_string"] == "TPU v3"
    assert stats["peak_teraflops_per_second"] == 61.5
    assert stats["peak_hbm_bw_gigabytes_per_second"] == 450.0
    assert [line.name for line in tpu.lines] == ["Steps", "XLA Modules", "XLA Ops", "Async XLA Ops"]
    steps, modules, ops, async_ops = tpu.lines
    assert [tpu.event_metadata[e.metadata_id].name for e in steps.events] == [str(i) for i in range(6)]
    module_names = {tpu.event_metadata[e.metadata_id].name.split("(")[0] for e in modules.events}
    assert module_names == {"jit_train_step", "jit_eval_step"}
    md = tpu.event_metadata[ops.events[10].metadata_id]
    md_stats = {sm[s.metadata_id]: getattr(s, s.WhichOneof("value")) for s in md.stats}
    assert md.name.startswith(f"%{md.display_name} = ")
    for key in (
        "hlo_category",
        "program_id",
        "symbol_id",
        "flops",
        "bytes_accessed",
        "shape_with_layout",
        "tf_op",
    ):
        assert key in md_stats
    categories = {
        next(
            s.str_value
            for s in tpu.event_metadata[e.metadata_id].stats
            if sm[s.metadata_id] == "hlo_category"
        )
        for e in ops.events
    }
    assert {
        "infeed",
        "outfeed",
        "reduce-scatter",
        "all-gather",
        "convolution fusion",
        "loop fusion",
    } <= categories
    assert len(async_ops.events) > 0
    starts = [e.offset_ps for e in ops.events]
    ends = [e.offset_ps + e.duration_ps for e in ops.events]
    assert all(b >= a for a, b in zip(ends[:-1], starts[1:], strict=True))  # one op at a time


def _independent_breakdown(xs: pb.XSpace, ordinal: int) -> dict[str, float]:
    """Re-derive one core's attribution from the file alone, with the rules of docs/generator.md."""
    tpu = next(p for p in xs.planes if p.name == f"/device:TPU:{ordinal}")
    sm = {k: v.name for k, v in tpu.stat_metadata.items()}

    def mdstat(md_id: int, key: str) -> str:
        return next((s.str_value for s in tpu.event_metadata[md_id].stats if sm[s.metadata_id] == key), "")

    lines = {line.name: line for line in tpu.lines}
    intervals: list[tuple[int, int, str]] = []
    for line_name in ("XLA Ops", "Async XLA Ops"):
        for e in lines[line_name].events:
            cat, tf_op = mdstat(e.metadata_id, "hlo_category"), mdstat(e.metadata_id, "tf_op")
            kind = (
                "collectives"
                if cat in COLLECTIVES or line_name == "Async XLA Ops"
                else "weight_update"
                if "/optimizer/" in tf_op
                else "input"
                if cat == "infeed"
                else "output"
                if cat == "outfeed"
                else "compute"
            )
            intervals.append((e.offset_ps, e.offset_ps + e.duration_ps, kind))
    for e in lines["XLA Modules"].events:
        if tpu.event_metadata[e.metadata_id].name.startswith("jit_eval_step"):
            intervals.append((e.offset_ps, e.offset_ps + e.duration_ps, "eval"))
    steps = lines["Steps"].events
    lo, hi = steps[0].offset_ps, steps[-1].offset_ps + steps[-1].duration_ps
    points = sorted({lo, hi, *[t for a, b, _ in intervals for t in (a, b)]})
    order = ["eval", "weight_update", "compute", "collectives", "input", "output"]
    totals = dict.fromkeys([*order, "idle", "overlapped"], 0)
    for a, b in zip(points[:-1], points[1:], strict=True):
        if b <= lo or a >= hi:
            continue
        active = {k for s, e, k in intervals if s <= a and e >= b}
        kind = next((k for k in order if k in active), "idle")
        totals[kind] += b - a
        if "collectives" in active and active & {"compute", "weight_update"} and "eval" not in active:
            totals["overlapped"] += b - a
    return {k: v / (hi - lo) for k, v in totals.items()}


def test_ground_truth_is_reproduced_from_the_written_files(run: Path) -> None:
    truth = json.loads((run / "ground_truth.json").read_text())
    assert sum(truth["breakdown"][k] for k in KEYS) == pytest.approx(1.0, abs=1e-9)
    xs = _space(run / "v3-32-w-3.xplane.pb")
    for ordinal in (0, 5):
        mine = _independent_breakdown(xs, ordinal)
        core = next(c for c in truth["per_core"] if c["host"] == 3 and c["device_ordinal"] == ordinal)
        for k in KEYS:
            assert mine[k] == pytest.approx(core[k], abs=1e-9), k
        assert mine["overlapped"] == pytest.approx(core["collectives_overlapped"], abs=1e-9)
        exposed = sum(v for k, v in core.items() if k.startswith("exposed_"))
        assert exposed == pytest.approx(core["collectives"], abs=1e-9)  # split by kind, nothing lost
    steps = [e.duration_ps for e in xs.planes[0].lines[0].events]
    assert truth["step_time_ms"] == pytest.approx(np.mean(steps) / 1e9, rel=1e-9)


def test_baseline_trips_no_catalog_threshold(run: Path) -> None:
    truth = json.loads((run / "ground_truth.json").read_text())
    b = truth["breakdown"]
    assert b["input"] < 0.05 and b["idle"] < 0.03 and b["collectives"] < 0.06 and b["eval"] < 0.10
    assert b["weight_update"] < 0.10 and b["output"] < 0.05
    assert truth["injected_rules"] == [] and truth["scenario"] == "baseline"
    ops = truth["op_time_ms_per_step"]
    assert ops["reduce-scatter"] > 0 and ops["all-gather"] > 0 and "all-reduce" not in ops  # sharded update


def test_deterministic_for_a_seed(tmp_path: Path) -> None:
    a = generate("bert", 8, steps=3, hosts=1, seed=5, out=tmp_path / "a")
    b = generate("bert", 8, steps=3, hosts=1, seed=5, out=tmp_path / "b")
    c = generate("bert", 8, steps=3, hosts=1, seed=6, out=tmp_path / "c")
    name = "v3-16-w-0.xplane.pb"
    assert (a / name).read_bytes() == (b / name).read_bytes()
    assert (a / name).read_bytes() != (c / name).read_bytes()


@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if s != "baseline"])
def test_every_scenario_shows_its_rule_on_resnet50(scenario: str, tmp_path: Path) -> None:
    hosts = 4 if scenario == "straggler" else 1  # max/avg infeed needs several hosts
    run = generate("resnet50", 32, steps=6, hosts=hosts, scenario=scenario, seed=1, out=tmp_path)
    truth = json.loads((run / "ground_truth.json").read_text())
    assert truth["scenario_rules"] == [scenario]
    assert truth["visibility"][scenario]["visible"], truth["visibility"]
    assert truth["injected_rules"] == [scenario]
    assert sum(truth["breakdown"].values()) == pytest.approx(1.0, abs=1e-9)
    if scenario == "straggler":
        assert truth["straggler_host"] in truth["hosts_written"] and "v3-64-w-0" in truth["hosts_written"]


def test_bert_weight_update_and_f32_scenarios_at_scale(tmp_path: Path) -> None:
    for scenario, key in (
        ("weight-update-unsharded", "weight_update"),
        ("f32-gradient-allreduce", "collectives"),
    ):
        truth = json.loads(
            (
                generate("bert", 4096, steps=3, hosts=1, scenario=scenario, out=tmp_path / scenario)
                / "ground_truth.json"
            ).read_text()
        )
        assert truth["breakdown"][key] > 0.15, truth["breakdown"]
        assert truth["injected_rules"] == [scenario]


def test_host_sampling_keeps_host_zero(tmp_path: Path) -> None:
    run = generate("resnet50", 4096, steps=2, hosts=2, out=tmp_path)
    truth = json.loads((run / "ground_truth.json").read_text())
    assert truth["hosts_written"] == ["v3-8192-w-0", "v3-8192-w-511"]
    assert truth["model"]["hosts"] == 512 and truth["cores_written"] == 32
    xs = _space(run / "v3-8192-w-511.xplane.pb")
    assert sum(p.name.startswith("/device:TPU:") for p in xs.planes) == 16


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"model": "alexnet", "chips": 32}, "unknown model"),
        ({"model": "bert", "chips": 48}, "not a TPU-v3 slice size"),
        ({"model": "bert", "chips": 32, "steps": 0}, "--steps"),
        ({"model": "bert", "chips": 32, "hosts": 9}, "--hosts"),
        ({"model": "bert", "chips": 32, "scenario": "slow"}, "unknown scenario"),
    ],
)
def test_bad_requests_are_refused(kwargs: dict, message: str, tmp_path: Path) -> None:
    with pytest.raises(TpuAnalyzeError, match=message):
        generate(out=tmp_path, **kwargs)
    assert not any(tmp_path.iterdir())


def test_parallel_writers_produce_the_same_run(tmp_path: Path) -> None:
    one = generate("resnet50", 128, steps=2, hosts=16, seed=4, out=tmp_path / "one", workers=1)
    two = generate("resnet50", 128, steps=2, hosts=16, seed=4, out=tmp_path / "two", workers=2)
    files = sorted(p.name for p in one.glob("*.xplane.pb"))
    assert len(files) == 16 and files == sorted(p.name for p in two.glob("*.xplane.pb"))
    assert all((one / f).read_bytes() == (two / f).read_bytes() for f in files)
    a, b = (json.loads((d / "ground_truth.json").read_text()) for d in (one, two))
    assert a["breakdown"] == b["breakdown"] and a["per_core"] == b["per_core"]
