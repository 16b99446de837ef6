"""XProf itself reads generated traces as a TPU-v3 run and measures the modelled step time (within 10% of
ground_truth.json). XProf runs in its own interpreter (conftest.xprof_python); skipped when absent."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import xprof_python
from tpuanalyze.generator import generate

OVERVIEW = """
import json, sys
from xprof.convert import raw_to_tool_data
data, _ = raw_to_tool_data.xspace_to_tool_data(sys.argv[1:], "overview_page", {})
tables = json.loads(data)
props = {}
for table in tables:
    props.update(table.get("p", {}))
keys = ("hardware_type", "device_type", "steptime_ms_average", "tc_compute_ms_average",
        "tc_infeed_ms_average", "tc_idle_ms_average")
print(json.dumps({k: props.get(k) for k in keys}))
"""


def xprof_overview(files: list[Path]) -> dict:
    res = subprocess.run(
        [xprof_python(), "-c", OVERVIEW, *map(str, files)], capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.xprof
@pytest.mark.parametrize(
    ("model", "chips", "hosts", "scenario"),
    [
        ("resnet50", 16, 1, "baseline"),
        ("bert", 4096, 2, "input-bound"),
        ("resnet50", 32, 4, "straggler"),
        ("gnmt", 512, 1, "eval-overhead"),
    ],
)
def test_xprof_measures_the_modelled_step_time(
    model: str, chips: int, hosts: int, scenario: str, tmp_path: Path
) -> None:
    run = generate(model, chips, steps=5, hosts=hosts, scenario=scenario, out=tmp_path)
    truth = json.loads((run / "ground_truth.json").read_text())
    overview = xprof_overview(sorted(run.glob("*.xplane.pb")))
    assert overview["hardware_type"] == "TPU"
    assert overview["device_type"] == "TPU v3"
    assert float(overview["steptime_ms_average"]) == pytest.approx(truth["step_time_ms"], rel=0.10)
    # XProf also sees the ops: compute dominates its breakdown, and the injected input wait shows
    assert float(overview["tc_compute_ms_average"]) > 0.3 * truth["step_time_ms"]
    if scenario == "input-bound":
        assert float(overview["tc_infeed_ms_average"]) > 0.2 * truth["step_time_ms"]
