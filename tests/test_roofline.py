"""The roofline (analyzer/roofline.py) against XProf's roofline_model tool on the same files.

``tests/data/xprof_roofline.json`` holds XProf's bound-by and operational intensity per op and for the
whole program, for every bundled capture and the real v6e capture; it was made with

    $TPUANALYZE_XPROF_PYTHON tests/data/make_xprof_roofline.py \
        ../shared/traces/real/tpu_v6e_4chip_jax_inference.xplane.pb

(xprof 2.x, ``xspace_to_tool_data([file], "roofline_model", {})``). Every op those captures hold is
memory bound in both tools, so a second check runs XProf live on a copy of a bundled capture whose
device plane states a 10x HBM bandwidth: the ridge point moves left of the convolutions, and both
tools must then call exactly the same ops compute bound.
"""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import duckdb
import pytest
from conftest import PROJECT_ROOT, SHARED_TRACES, xprof_python
from tpuanalyze.analyzer.api import analyze_run
from tpuanalyze.analyzer.roofline import Peaks, add_roofline

from tpuanalyze.pipeline import ingest_paths

pytestmark = pytest.mark.xdist_group("captures")  # the session's shared ingest: one worker makes it

EXPECTED = json.loads((Path(__file__).with_name("data") / "xprof_roofline.json").read_text())
XPROF_BOUND = {"HBM": "memory", "Compute": "compute", "Unknown": None}
V6E = "tpu_v6e_4chip_jax_inference.xplane.pb"
CONTAINERS = {"while", "conditional", "call"}


def _path(key: str) -> Path:
    return SHARED_TRACES / "real" / key if key == V6E else PROJECT_ROOT / key


def _analyse(path: Path, tmp_path: Path):
    db = tmp_path / "r.duckdb"
    run_id = ingest_paths([path], db).run_ids[0]
    con = duckdb.connect(str(db), read_only=True)
    try:
        return analyze_run(con, run_id)
    finally:
        con.close()


def _compare(analysis, expected: dict, efficiency_tol: float | None = None) -> int:
    """Bound-by of every op both tools list must agree (and, with ``efficiency_tol``, the achieved
    fraction of the roof against XProf's roofline efficiency); returns how many were compared."""
    ours = {}
    for row in analysis.ops.to_dict("records"):
        ours.setdefault(row["name"], row)
    # control-flow containers (while, conditional) are not ops of their own here: their body's ops are
    listed = {n: v for n, v in expected["ops"].items() if v["category"] not in CONTAINERS}
    # async transfer halves (copy-start / copy-done): XProf rates them against the HBM roof, we give
    # them none (analyzer/roofline.py): the copy's bytes over a start's nanoseconds or a done's link wait
    transfers = {n for n in listed if n in ours and ours[n]["category"] == "memory_transfer"}
    for name in transfers:
        assert ours[name]["bound_by"] is None and math.isnan(ours[name]["achieved_fraction"]), name
    common = [name for name in listed if name in ours]
    # ops of programs that run outside the step series (the v6e capture's one-off jit__psum and
    # jit_broadcast_in_dim) are in XProf's whole-capture total, not in the ops of the steps here
    assert len(common) >= 0.85 * len(listed), (len(common), len(listed))
    errors: list[float] = []
    for name in (n for n in common if n not in transfers):
        xprof, mine = expected["ops"][name], ours[name]
        assert mine["bound_by"] == XPROF_BOUND[xprof["bound_by"]], (name, mine["bound_by"], xprof)
        if mine["bound_by"] is not None:
            assert math.isclose(mine["operational_intensity"], xprof["operational_intensity"],
                                rel_tol=0.02, abs_tol=1e-6), name
            if efficiency_tol is not None and xprof["roofline_efficiency"]:
                errors.append(abs(mine["achieved_fraction"] / xprof["roofline_efficiency"] - 1))
    if efficiency_tol is not None:
        # the same formula on the same events: most ops agree exactly; the few whose instances fall
        # partly outside the measured steps (XProf's total counts them, the steps here do not) differ
        errors.sort()
        assert errors and errors[len(errors) // 2] < 1e-9, errors[len(errors) // 2]
        assert sum(e <= efficiency_tol for e in errors) >= 0.9 * len(errors)
    program = expected["programs"].get("0")
    total = analysis.summary["roofline"]["programs"]
    if program is not None:
        assert total[0]["program"] == "all programs"
        assert total[0]["bound_by"] == XPROF_BOUND[program["bound_by"]]
    else:
        assert total == [] or total[0]["bound_by"] is None
    return len(common)


@pytest.mark.parametrize("key", sorted(k for k in EXPECTED if k != V6E))
def test_bundled_capture_bound_by_agrees_with_xprof(key: str, sample_captures) -> None:
    expected = EXPECTED[key]
    analysis = sample_captures.analysis(_path(key))  # the file's run, analysed once per session
    roof = analysis.summary["roofline"]
    if expected["peak_flop_rate_gflops"]:
        # the device plane's stated peaks, read the same way (XProf's HBM figure is in GiB/s)
        assert roof["source"] == "trace"
        assert roof["peak_tflops"] * 1e3 == pytest.approx(expected["peak_flop_rate_gflops"])
        assert roof["peak_hbm_gbps"] == pytest.approx(expected["peak_hbm_bw_gibps"] * 2**30 / 1e9, rel=1e-4)
        assert roof["ridge_flops_per_byte"] == pytest.approx(expected["hbm_ridge_point"], rel=1e-3)
        # every op runs inside a step in these captures, so both tools time the same events
        assert _compare(analysis, expected, efficiency_tol=0.02) > 10
    else:  # a CPU capture: no peaks, XProf has no roofline, neither have we
        assert roof["source"] == "unknown" and not expected["ops"]
        assert analysis.ops["bound_by"].isna().all()


def test_real_v6e_capture_bound_by_agrees_with_xprof(request) -> None:
    path = _path(V6E)
    if not path.exists():
        pytest.skip(f"shared traces not present at {SHARED_TRACES}")
    analysis = request.getfixturevalue("shared_captures").analysis(path)
    assert analysis.summary["roofline"]["source"] == "trace"
    assert analysis.summary["roofline"]["ridge_flops_per_byte"] == pytest.approx(
        EXPECTED[V6E]["hbm_ridge_point"], rel=1e-3)
    assert _compare(analysis, EXPECTED[V6E]) >= 10
    # the framework op and the source line the trace carries reach the ops table
    fusion = analysis.ops[analysis.ops["name"] == "broadcast_add_fusion"].iloc[0]
    assert fusion["tf_op"] == "jit(f)/jit(main)/add:"
    assert str(fusion["source"]).endswith("host_offload_stress_test.py:29")


def _with_stated_bandwidth(src: Path, dst: Path, gbps: float) -> None:
    from tpuanalyze.proto import xplane_pb2

    space = xplane_pb2.XSpace()
    space.ParseFromString(src.read_bytes())
    changed = 0
    for plane in space.planes:
        ids = {m.id for m in plane.stat_metadata.values() if m.name == "peak_hbm_bw_gigabytes_per_second"}
        for stat in plane.stats:
            if stat.metadata_id in ids:
                stat.double_value = gbps
                changed += 1
    assert changed
    dst.write_bytes(space.SerializeToString())


XPROF_SCRIPT = r"""
import json, shutil, sys, tempfile
from pathlib import Path
from xprof.convert import raw_to_tool_data
with tempfile.TemporaryDirectory() as tmp:
    copy = Path(tmp) / Path(sys.argv[1]).name
    shutil.copyfile(sys.argv[1], copy)
    table = json.loads(raw_to_tool_data.xspace_to_tool_data([str(copy)], "roofline_model", {})[0])[0]
cols = [c["id"] for c in table["cols"]]
out = {}
for row in table["rows"]:
    v = dict(zip(cols, [c.get("v") if c else None for c in row["c"]]))
    if v["step"] == "Total" and v["include_infeed_outfeed"] and v["category"] != "Program":
        out[v["operation"]] = v["bound_by"]
print("XPROF_JSON" + json.dumps({"ops": out, "ridge": float(table["p"]["hbm_ridge_point"])}))
"""


@pytest.mark.xprof
def test_compute_bound_ops_agree_with_xprof_live(tmp_path: Path) -> None:
    python = xprof_python()
    baseline = PROJECT_ROOT / "sample_traces" / "generated" / "resnet50_v3-32_baseline"
    src = next(baseline.rglob("*.xplane.pb"))
    fast = tmp_path / "run" / "plugins" / "profile" / "fast_hbm" / src.name
    fast.parent.mkdir(parents=True)
    _with_stated_bandwidth(src, fast, 4500.0)
    proc = subprocess.run([python, "-c", XPROF_SCRIPT, str(fast)], capture_output=True, text=True,
                          timeout=300)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("XPROF_JSON")), None)
    assert line, proc.stderr[-2000:]
    xprof = json.loads(line[len("XPROF_JSON"):])
    analysis = _analyse(fast, tmp_path)
    assert analysis.summary["roofline"]["ridge_flops_per_byte"] == pytest.approx(xprof["ridge"], rel=1e-3)
    ours = dict(zip(analysis.ops["name"], analysis.ops["bound_by"], strict=False))
    common = [n for n in xprof["ops"] if n in ours]
    assert len(common) >= 0.9 * len(xprof["ops"])  # the bundled ResNet-50 sample has no while loops
    kinds = {XPROF_BOUND[xprof["ops"][n]] for n in common}
    assert {"compute", "memory"} <= kinds  # both sides of the ridge are exercised
    mismatched = [n for n in common if ours[n] != XPROF_BOUND[xprof["ops"][n]]]
    assert not mismatched, mismatched[:10]


def test_achieved_fraction_is_against_the_roof_the_op_is_bound_by() -> None:
    import pandas as pd

    peaks = Peaks(100.0, 1000.0, "trace")  # ridge 100 FLOP/byte
    ops = pd.DataFrame({"name": ["mem", "cmp", "none", "copy"], "hlo_module": ["m"] * 4,
                        "flops": [1e9, 1e12, 0.0, 0.0], "bytes_accessed": [1e9, 1e9, 0.0, 2e9],
                        "self_time_ms": [2.0, 20.0, 1.0, 4.0]})
    out = add_roofline(ops, peaks).set_index("name")
    assert list(out["bound_by"]) == ["memory", "compute", None, "memory"]
    assert out.loc["mem", "achieved_fraction"] == pytest.approx((1e9 / 2e-3) / 1e12)  # 500 GB/s of 1000
    assert out.loc["cmp", "achieved_fraction"] == pytest.approx((1e12 / 20e-3) / 100e12)  # 50 of 100 TF
    assert out.loc["copy", "achieved_fraction"] == pytest.approx(0.5)
    unknown = add_roofline(ops, Peaks(None, None, "unknown"))
    assert unknown["bound_by"].isna().all() and unknown["operational_intensity"].notna().any()
