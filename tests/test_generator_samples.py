"""The bundled generator samples are exactly what the generator writes today (same seed, same bytes)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from conftest import SAMPLE_TRACES
from tpuanalyze.generator import generate

SPEC = importlib.util.spec_from_file_location("make_samples", SAMPLE_TRACES / "generated" / "make_samples.py")
make_samples = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(make_samples)


@pytest.mark.parametrize("sample", make_samples.SAMPLES, ids=[s[2] for s in make_samples.SAMPLES])
def test_bundled_sample_matches_a_fresh_generation(sample: tuple[str, int, str], tmp_path: Path) -> None:
    model, chips, scenario = sample
    bundled = make_samples.sample_dir(model, chips, scenario)
    [run] = list((bundled / "plugins" / "profile").iterdir())
    fresh = generate(
        model,
        chips,
        steps=make_samples.STEPS,
        hosts=make_samples.HOSTS,
        scenario=scenario,
        seed=make_samples.SEED,
        out=tmp_path,
    )
    assert fresh.name == run.name
    files = sorted(p.name for p in run.glob("*.xplane.pb"))
    assert files == sorted(p.name for p in fresh.glob("*.xplane.pb")) and files
    for name in files:
        assert (run / name).read_bytes() == (fresh / name).read_bytes(), name
    old, new = (json.loads((d / "ground_truth.json").read_text()) for d in (run, fresh))
    for volatile in ("generate_seconds",):
        old.pop(volatile), new.pop(volatile)
    assert old == new
    if scenario != "baseline":
        assert old["injected_rules"] == [scenario]
