"""host-input-processing (catalog §3.8) on XSpace files written in the wire format: host pipeline work
(names matching patterns.host_input, not patterns.host_enqueue) that is most of the host's input time
and a real part of the device's input wait names decode/augment as the cause; a few microseconds of
Python-tracer frames whose names happen to match (`$<frozen os>:760 decode`) do not."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from test_attribution_xspace import XSpaceBuilder, design_example_step
from tpuanalyze.analyzer.api import analyze_run

from tpuanalyze.pipeline import ingest_paths

STEPS = 3  # design.md's 10 ms step: 2 ms infeed each


def _run(tmp_path: Path, host_events: list[tuple[str, float, float]]) -> dict[str, dict]:
    b = XSpaceBuilder()
    core = b.tpu_core(0)
    host = b.plane("/host:CPU")
    for step in range(STEPS):
        design_example_step(core, offset_ms=10.0 * step, step=step)
        for name, start, end in host_events:
            host.event("tf_data_iterator", name, 10.0 * step + start, 10.0 * step + end)
    run_dir = tmp_path / "run" / "plugins" / "profile" / "r1"
    b.write(run_dir / "host0.xplane.pb")
    db = tmp_path / "run.duckdb"
    run_id = ingest_paths([run_dir], db).run_ids[0]
    con = duckdb.connect(str(db), read_only=True)
    try:
        return {f["rule"]: f for f in analyze_run(con, run_id).findings}
    finally:
        con.close()


def test_host_decode_behind_the_infeed_wait(tmp_path: Path) -> None:
    found = _run(tmp_path, [("Iterator::Root::Prefetch::ParallelMapV2", 0.1, 1.6),
                            ("InfeedEnqueueTuple", 1.6, 1.9)])
    rule = found["host-input-processing"]
    m = rule["evidence"]["metrics"]
    assert m["host_processing_ms"] == pytest.approx(1.5 * STEPS)
    assert m["host_enqueue_ms"] == pytest.approx(0.3 * STEPS)
    assert m["host_non_enqueue_share"] == pytest.approx(1.5 / 1.8, abs=1e-6)
    assert found["input-bound"]["caused_by"] == "host-input-processing"


def test_python_tracer_frames_are_no_decode(tmp_path: Path) -> None:
    """JAX's python tracer (host_tracer_level 2) names frames `$file:line function`: 10 us of
    `os.environ` decoding beside a 2 ms infeed wait per step is no host decode bound."""
    found = _run(tmp_path, [("$<frozen os>:760 decode", 0.1, 0.11)])
    assert "host-input-processing" not in found
    assert "caused_by" not in found["input-bound"]


def test_matched_work_too_small_for_the_wait(tmp_path: Path) -> None:
    """Host work that matches the input pattern but is under a tenth of the input wait
    (`min_processing_of_input`) explains nothing: input-bound stands alone."""
    found = _run(tmp_path, [("Iterator::Root::ParallelMapV2", 0.1, 0.15)])
    assert "host-input-processing" not in found and "input-bound" in found
