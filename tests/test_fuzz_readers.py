"""Property tests of the three readers on hostile mutations of real captures (hypothesis, a few
seconds each): every input is accepted with data equal to an independent parse (protobuf's own
classes, the standard library's json, a separate MLPerf line parser) or refused with one line,
never another exception. tests/fuzz/run_fuzz.py runs the same checks on a million inputs."""

from __future__ import annotations

import random
from functools import cache
from pathlib import Path

import pytest
from fuzz import harness
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@cache
def seeds() -> dict[str, list]:
    return {"xspace": harness.xspace_seeds(), "json": harness.json_seeds(), "mlperf": harness.mlperf_seeds()}


def _check(kind: str, data: bytes, folder: Path, gz: bool = False) -> harness.Outcome:
    folder.mkdir(parents=True, exist_ok=True)
    outcome = harness.CHECKS[kind](harness.write_input(folder, kind, data, gz))
    assert outcome.kind in ("accepted", "refused"), outcome.detail
    return outcome


def test_the_seeds_come_from_the_real_captures(tmp_path: Path) -> None:
    found = seeds()
    assert len(found["xspace"]) >= 3 and len(found["json"]) >= 3  # the bundled samples at least
    for kind, items in (("xspace", found["xspace"]), ("json", found["json"])):
        for n, item in enumerate(items):
            data = item if isinstance(item, bytes) else harness.json.dumps(item).encode()
            assert _check(kind, data, tmp_path / f"{kind}{n}").kind == "accepted"


@FAST
@given(st.integers(0, 2**32), st.booleans())
def test_xspace_reader_on_hostile_mutations(tmp_path: Path, seed: int, structured: bool) -> None:
    rng = random.Random(seed)
    seed_bytes = rng.choice(seeds()["xspace"])
    data = harness.mutate_xspace(seed_bytes, rng) if structured else harness.mutate_bytes(seed_bytes, rng)
    _check("xspace", data, tmp_path / f"x{seed}")


@FAST
@given(st.integers(0, 2**32), st.sampled_from(["structured", "bytes", "gzip"]))
def test_chrome_json_reader_on_hostile_mutations(tmp_path: Path, seed: int, how: str) -> None:
    rng = random.Random(seed)
    doc = rng.choice(seeds()["json"])
    if how == "bytes":
        data = harness.mutate_bytes(harness.json.dumps(doc).encode(), rng)
    else:
        data = harness.mutate_json(doc, rng)
    _check("json", data, tmp_path / f"j{seed}", gz=how == "gzip")


@FAST
@given(st.integers(0, 2**32), st.booleans())
def test_mlperf_reader_on_hostile_mutations(
    tmp_path: Path, shared_mlperf: Path, seed: int, structured: bool
) -> None:
    if not seeds()["mlperf"]:
        pytest.skip("no MLPerf logs to mutate")
    rng = random.Random(seed)
    lines = rng.choice(seeds()["mlperf"])
    data = (
        harness.mutate_mlperf(lines, rng)
        if structured
        else harness.mutate_bytes("\n".join(lines).encode(), rng)
    )
    _check("mlperf", data, tmp_path / f"m{seed}")


@pytest.mark.parametrize(
    "kind,data,accepted",
    [
        ("json", b'{"traceEvents": [{"ph": "X", "ts": 1, "dur": 2, "pid": 1, "tid": 1, "name": "a"}]}', True),
        (
            "json",
            b'{"traceEvents": [{"ph": "X", "ts": 1, "dur": -2, "pid": 1, "tid": 1, "name": "a"}]}',
            False,
        ),
        (
            "json",
            b'{"traceEvents": [{"ph": "X", "ts": 0, "pid": 1}, {"ph": "X", "ts": 9.2e12, "pid": 1}]}',
            False,
        ),
        ("mlperf", b':::MLLOG {"time_ms": 5, "key": "run_start", "value": null}', True),
        ("mlperf", b':::MLLOG {"time_ms": [5], "key": "run_start", "value": null}', False),
    ],
)
def test_the_oracles_tell_right_from_wrong(tmp_path: Path, kind: str, data: bytes, accepted: bool) -> None:
    """The harness itself: a good input passes its oracle, a bad one is refused by the reader."""
    assert _check(kind, data, tmp_path).kind == ("accepted" if accepted else "refused")
