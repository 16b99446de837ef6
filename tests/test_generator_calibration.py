"""The generator's baseline presets reproduce the published MLPerf step times (catalog §1) within 15%,
and the v0.6 ResNet-50 scaling trend (per-core throughput vs chips) in direction and size."""

from __future__ import annotations

import pytest
from tpuanalyze.generator.calibration import TOLERANCE, calibration_rows


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return calibration_rows(steps=3)


def test_published_step_times_within_tolerance(rows: list[dict]) -> None:
    checked = [r for r in rows if r["published"] is not None]
    assert {(r["model"], r["chips"]) for r in checked if r["metric"] == "step time ms"} >= {
        ("resnet50", 4096),
        ("bert", 4096),
        ("resnet50", 1024),
    }
    for r in checked:
        assert abs(r["error"]) <= TOLERANCE, r


def test_resnet_step_time_falls_with_chips_as_per_core_batch_shrinks(rows: list[dict]) -> None:
    steps = {
        r["chips"]: r["ours"]
        for r in rows
        if r["model"] == "resnet50" and r["metric"].startswith("step time")
    }
    assert (
        steps[256] < steps[128]
        and steps[512] < steps[256]
        and steps[1024] < steps[512]
        and steps[4096] < steps[1024]
    )
    rel = {r["chips"]: r["ours"] for r in rows if r["metric"] == "per-core throughput vs 16 chips"}
    assert rel[4096] < rel[1024] < rel[64]  # per-core throughput falls with scale (catalog §1)
