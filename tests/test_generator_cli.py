"""`tpuanalyze generate` as a user runs it: a run folder on success; one line and exit 2 on bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tpuanalyze.cli", "generate", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_generate_writes_a_run(tmp_path: Path) -> None:
    res = _cli(
        "--model",
        "resnet50",
        "--chips",
        "16",
        "--steps",
        "3",
        "--hosts",
        "1",
        "--scenario",
        "input-bound",
        "--seed",
        "2",
        "--out",
        str(tmp_path),
    )
    assert res.returncode == 0, res.stderr
    run = tmp_path / "plugins" / "profile" / "resnet50_v3-32_input-bound_seed2"
    truth = json.loads((run / "ground_truth.json").read_text())
    assert truth["injected_rules"] == ["input-bound"] and truth["seed"] == 2
    assert (run / "v3-32-w-0.xplane.pb").stat().st_size > 0
    assert str(run) in res.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["--model", "alexnet", "--chips", "16"],
        ["--model", "bert", "--chips", "12"],
        ["--model", "bert", "--chips", "16", "--steps", "0"],
        ["--model", "bert", "--chips", "16", "--scenario", "no-such-rule"],
        ["--model", "bert", "--chips", "16", "--hosts", "0"],
    ],
)
def test_bad_arguments_exit_2_with_one_line(args: list[str], tmp_path: Path) -> None:
    res = _cli(*args, "--out", str(tmp_path / "out"))
    assert res.returncode == 2
    assert res.stderr.startswith("tpuanalyze: error: ") and res.stderr.count("\n") == 1, res.stderr
    assert not (tmp_path / "out").exists()
