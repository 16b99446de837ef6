"""Regenerate the bundled generator samples (deterministic; tests/test_generator_samples.py checks that
the bundled files equal a fresh generation). Run from the project root:

    python sample_traces/generated/make_samples.py
"""

from __future__ import annotations

import shutil
from pathlib import Path

from tpuanalyze.generator import generate

HERE = Path(__file__).resolve().parent
# (model, chips, scenario): ResNet-50 on a v3-32 slice (16 chips, 4 hosts of 8 cores), one host written,
# 6 steps (one eval in the window), seed 0
SAMPLES = [
    ("resnet50", 16, "baseline"),
    ("resnet50", 16, "input-bound"),
    ("resnet50", 16, "weight-update-unsharded"),
    ("resnet50", 16, "host-overhead"),
]
STEPS, HOSTS, SEED = 6, 1, 0


def sample_dir(model: str, chips: int, scenario: str) -> Path:
    return HERE / f"{model}_v3-{chips * 2}_{scenario}"


def main() -> None:
    for model, chips, scenario in SAMPLES:
        out = sample_dir(model, chips, scenario)
        shutil.rmtree(out, ignore_errors=True)
        run = generate(model, chips, steps=STEPS, hosts=HOSTS, scenario=scenario, seed=SEED, out=out)
        size = sum(f.stat().st_size for f in run.iterdir())
        print(f"{run.relative_to(HERE.parents[1])}: {size / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
