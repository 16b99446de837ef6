"""Cross-check against MLCommons' own result summarizer (the ``mlperf-logging`` package) on the v0.7
logs: its olympic time to train per folder must equal ours.

The package is not a dependency: the test looks for an interpreter that has it (``MLPERF_LOGGING_PYTHON``,
else this one) and skips with the reason otherwise. Its modern parser rejects the v0.6 ``:::MLL``
format (compliance errors), so only v0.7 is compared.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tpuanalyze.pipeline.mlperf import summarize_paths

_SCRIPT = r"""
import glob, json, sys, io, contextlib
from mlperf_logging.result_summarizer import result_summarizer as rs
out = {}
for folder in sorted(glob.glob(sys.argv[1] + "/*/*")):
    with contextlib.redirect_stdout(io.StringIO()):
        scores = rs._compute_strong_score_standalone(folder.rstrip("/").split("/")[-1], None, False, folder,
                                                     "training", "0.7.0", return_full_scores=True)
    out[folder] = scores[2] * 60 if scores[2] is not None else None
print(json.dumps(out))
"""


def _interpreter() -> str | None:
    for candidate in (os.environ.get("MLPERF_LOGGING_PYTHON"), sys.executable):
        if candidate and subprocess.run([candidate, "-c", "import mlperf_logging"],
                                        capture_output=True).returncode == 0:
            return candidate
    return None


def test_v07_time_to_train_equals_the_official_summarizer(shared_mlperf):
    python = _interpreter()
    if python is None:
        pytest.skip("mlperf-logging not installed (pip install mlperf-logging, or set MLPERF_LOGGING_PYTHON)")
    result = subprocess.run([python, "-c", _SCRIPT, str(shared_mlperf / "v0.7")], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    official = json.loads(result.stdout.strip().splitlines()[-1])
    ours = summarize_paths([shared_mlperf / "v0.7"]).set_index("folder")["time_to_train_s"]
    assert len(official) == len(ours) == 12
    for folder, seconds in official.items():
        assert ours[folder] == pytest.approx(seconds, abs=0.005), folder
