"""Cross-check with XProf on the same generated files: our input share vs its input_pipeline_analyzer,
and our all-reduce op-time share vs its hlo_stats, within 5 points. XProf runs in its own interpreter
(conftest.xprof_python: /opt/xprofvenv or $TPUANALYZE_XPROF_PYTHON) in a subprocess; skipped when it
is not installed."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import duckdb
import pytest
from conftest import missing_tool, xprof_python
from tpuanalyze.analyzer.api import analyze_run

from tpuanalyze import generator  # a broken generator must fail these tests, not skip them
from tpuanalyze.pipeline import ingest_paths

XPROF_SCRIPT = r"""
import json, sys
from xprof.convert import raw_to_tool_data
paths = sys.argv[1:]
out = {}
ipa = json.loads(raw_to_tool_data.xspace_to_tool_data(paths, "input_pipeline_analyzer", {})[0])
props = next(t["p"] for t in ipa if "infeed_percent_average" in t.get("p", {}))
out["infeed_percent_average"] = float(props["infeed_percent_average"])
out["steptime_ms_average"] = float(props["steptime_ms_average"])
hlo = json.loads(raw_to_tool_data.xspace_to_tool_data(paths, "hlo_stats", {})[0])
table = hlo[0] if isinstance(hlo, list) else hlo
cols = [c["id"] for c in table["cols"]]
cat, self_time = cols.index("category"), cols.index("total_self_time")
total = sum(r["c"][self_time]["v"] for r in table["rows"])
def share(prefixes):
    t = sum(r["c"][self_time]["v"] for r in table["rows"] if str(r["c"][cat]["v"]).startswith(prefixes))
    return t / total if total else 0.0
out["allreduce_share"] = share(("all-reduce",))
out["collective_share"] = share(
    ("all-reduce", "reduce-scatter", "all-gather", "collective-permute", "all-to-all"))
print("XPROF_JSON" + json.dumps(out))
"""


def _xprof(paths: list[Path]) -> dict:
    python = xprof_python()
    probe = subprocess.run([python, "-c", "import xprof"], capture_output=True)
    if probe.returncode:
        missing_tool(f"xprof is not importable by {python}")
    proc = subprocess.run([python, "-c", XPROF_SCRIPT, *map(str, paths)], capture_output=True,
                          text=True, timeout=300)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("XPROF_JSON")), None)
    assert line, proc.stderr[-2000:]
    return json.loads(line[len("XPROF_JSON"):])


@pytest.mark.xprof
@pytest.mark.parametrize("scenario", ["input-bound", "latency-bound-collectives"])
def test_input_and_allreduce_shares_agree_with_xprof(scenario: str, tmp_path: Path) -> None:
    run_dir = generator.generate("resnet50", chips=8, steps=6, hosts=1, scenario=scenario, seed=0,
                                 out=tmp_path / scenario)
    xprof = _xprof(sorted(run_dir.glob("*.xplane.pb")))
    summary = ingest_paths([run_dir], tmp_path / "db.duckdb")
    con = duckdb.connect(str(tmp_path / "db.duckdb"), read_only=True)
    a = analyze_run(con, summary.run_ids[0])
    train = a.steps[~a.steps["is_eval"]]
    our_input = float(train["input_ps"].sum() / train["duration_ps"].sum())
    ops = a.ops
    total_ms = ops["self_time_ms"].sum()
    our_allreduce = float(ops.loc[ops["kind"] == "all-reduce", "self_time_ms"].sum() / total_ms)
    our_collective = float(ops.loc[ops["category"] == "collectives", "self_time_ms"].sum() / total_ms)
    print(f"{scenario}: input ours {our_input:.2%} xprof {xprof['infeed_percent_average'] / 100:.2%}; "
          f"all-reduce op share ours {our_allreduce:.2%} xprof {xprof['allreduce_share']:.2%}; "
          f"collective op share ours {our_collective:.2%} xprof {xprof['collective_share']:.2%}; "
          f"step ms ours "
          f"{a.summary['step_time_ms']['mean']:.2f} xprof {xprof['steptime_ms_average']:.2f}")
    assert our_input == pytest.approx(xprof["infeed_percent_average"] / 100, abs=0.05)
    assert our_allreduce == pytest.approx(xprof["allreduce_share"], abs=0.05)
    assert our_collective == pytest.approx(xprof["collective_share"], abs=0.05)
    assert a.summary["step_time_ms"]["mean"] == pytest.approx(xprof["steptime_ms_average"], rel=0.03)
