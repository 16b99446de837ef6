"""``tpuanalyze compare``: the CI gate's exit status on real JAX CPU captures, and clear bad-input errors."""

from __future__ import annotations

import json
import subprocess
import sys

import duckdb
import pytest
from tpuanalyze.analyzer.compare import compare_runs

from tpuanalyze.cli import main
from tpuanalyze.pipeline.runs import RunLoader


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tpuanalyze.cli", *args], capture_output=True, text=True,
                          env={"COLUMNS": "200", "PATH": ""})


@pytest.fixture(scope="module")
def two_run_db(tmp_path_factory, shared_traces):
    """A database with a normal and an input-bound capture of the same pmap training loop."""
    from tpuanalyze.pipeline import ingest_paths

    db = tmp_path_factory.mktemp("compare") / "runs.duckdb"
    fast = ingest_paths([shared_traces / "jax_cpu" / "pmap8_train_eval"], db).run_ids[0]
    slow = ingest_paths([shared_traces / "jax_cpu" / "pmap8_input_bound"], db).run_ids[0]
    return db, fast, slow


def test_slower_run_fails_the_gate_and_equal_run_passes(two_run_db, tmp_path):
    db, fast, slow = two_run_db
    out = tmp_path / "cmp.json"
    slower = _cli("compare", f"{db}:{fast}", f"{db}:{slow}", "--fail-if-slower", "5", "--json", str(out))
    assert slower.returncode == 1, slower.stderr
    assert "slower than A" in slower.stderr
    document = json.loads(out.read_text())
    assert document["b_slower_pct"] > 5
    # the input-bound capture waits on its 20 ms/batch host pipeline: input is what grew most
    grew = max(document["breakdown"], key=lambda row: row["delta_ms"])
    assert grew["category"] == "input"

    equal = _cli("compare", str(fast), str(fast), "--db", str(db), "--fail-if-slower", "0")
    assert equal.returncode == 0, equal.stderr
    assert "+0.0%" in equal.stdout
    # B faster than A passes too (in-process: the subprocess path is covered above)
    try:
        main(["compare", f"{db}:{slow}", f"{db}:{fast}", "--fail-if-slower", "5"])
        status = 0
    except SystemExit as exc:
        status = exc.code
    assert status in (0, None)


def test_comparison_numbers_match_each_analysis(two_run_db):
    db, fast, slow = two_run_db
    with RunLoader(db) as loader:
        a, b = loader.load(str(fast))[0], loader.load(str(slow))[0]
        comparison = compare_runs(a, b)
    assert comparison.step_a_ms == pytest.approx(a.analysis.summary["step_time_ms"]["mean"], rel=0.05)
    in_step = comparison.breakdown[comparison.breakdown["category"] != "collectives_overlapped"]
    assert in_step["a_ms"].sum() == pytest.approx(comparison.step_a_ms, rel=0.01)
    assert in_step["b_ms"].sum() == pytest.approx(comparison.step_b_ms, rel=0.01)
    assert comparison.ops["delta_ms"].abs().is_monotonic_decreasing
    rules_a = {f["rule"] for f in a.analysis.findings}
    rules_b = {f["rule"] for f in b.analysis.findings}
    assert {f["rule"] for f in comparison.findings_appeared} == rules_b - rules_a
    assert {f["rule"] for f in comparison.findings_resolved} == rules_a - rules_b


@pytest.mark.parametrize("args, needle", [
    (["compare", "only-one"], "exactly 2 runs"),
    (["compare", "/no/such/trace", "/no/such/other"], "/no/such/trace"),
    (["compare", "a", "b", "--fail-if-slower", "-3"], "percentage"),
])
def test_bad_inputs_are_one_line_exit_2(args, needle):
    result = _cli(*args)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and needle in result.stderr


def test_unknown_run_in_db_is_exit_2_and_db_unchanged(two_run_db):
    db, fast, _ = two_run_db
    before = duckdb.connect(str(db), read_only=True).execute("SELECT count(*) FROM runs").fetchone()[0]
    result = _cli("compare", str(fast), "no-such-run", "--db", str(db))
    assert result.returncode == 2 and "no-such-run" in result.stderr
    after = duckdb.connect(str(db), read_only=True).execute("SELECT count(*) FROM runs").fetchone()[0]
    assert before == after
