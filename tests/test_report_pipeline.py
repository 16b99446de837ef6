"""`tpuanalyze report` end to end on real files: generated XSpace pods and real JAX CPU captures.

The verb runs in this process (``run_cli``) where its output is the check, and in a process of its own
(``cli``) where the process is: exit statuses and one-line errors on bad input, the temporary database
and folder it leaves behind. Also home of the builders the other report tests share (``generated_run``,
``ingested``): traces are generated and ingested once per test run (cached), into real DuckDB files
under a temporary folder.
"""

from __future__ import annotations

import atexit
import json
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

import pytest
from conftest import PROJECT_ROOT, run_cli, run_cli_process

from tpuanalyze import generator
from tpuanalyze.pipeline import ingest_paths

_RUN_DIR = Path(tempfile.mkdtemp(prefix="tpuanalyze-report-tests-"))
atexit.register(shutil.rmtree, _RUN_DIR, ignore_errors=True)

JAX_CPU = PROJECT_ROOT / "sample_traces" / "jax_cpu"


def cli(*args: str, cwd: Path | None = None, timeout: float = 300,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run the real `tpuanalyze` command (piped: stdout/stderr are not terminals), in a scratch folder."""
    return run_cli_process(*args, cwd=cwd or _RUN_DIR, timeout=timeout, env=env)


@cache
def generated_run(
    model: str = "resnet50",
    chips: int = 8,
    hosts: int | None = None,
    scenario: str = "baseline",
    steps: int = 4,
    seed: int = 0,
) -> Path:
    """A generated TPU-v3 run folder (real XSpace files), made once per test run."""
    out = _RUN_DIR / f"gen-{model}-{chips}-{hosts}-{scenario}-{steps}-{seed}"
    return Path(
        generator.generate(
            model=model, chips=chips, steps=steps, hosts=hosts, scenario=scenario, seed=seed, out=out
        )
    )


@cache
def ingested(*paths: Path) -> tuple[Path, tuple[int, ...]]:
    """A DuckDB file holding the given traces (real ingest), made once per test run."""
    db = _RUN_DIR / f"db-{abs(hash(paths))}.duckdb"
    summary = ingest_paths(list(paths), db)
    return db, tuple(summary.run_ids)


def jax_cpu_run(name: str) -> Path:
    runs = sorted((JAX_CPU / name / "plugins" / "profile").glob("*"))
    assert runs, f"bundled JAX CPU capture {name} is missing"
    return runs[-1]


def test_report_json_is_the_analyzer_contract_for_each_ingested_run(tmp_path: Path) -> None:
    from tpuanalyze.analyzer.api import analyze_db, report_json

    run = generated_run(scenario="input-bound")
    db, run_ids = ingested(run)
    out = tmp_path / "report.json"
    proc = run_cli("report", str(db), "--json", str(out), "--quiet")
    assert proc.returncode == 0, proc.stderr
    document = json.loads(out.read_text())
    assert document == json.loads(json.dumps(report_json(analyze_db(db, list(run_ids)))))
    (run_summary,) = document["runs"]
    assert run_summary["device_type"] == "TPU v3"
    assert abs(sum(run_summary["breakdown"].values()) - 1.0) < 1e-6
    assert "input-bound" in {f["rule"] for f in run_summary["findings"]}


def test_traces_are_ingested_on_the_fly_into_a_kept_database(tmp_path: Path) -> None:
    run = generated_run(scenario="input-bound")
    db = tmp_path / "kept.duckdb"
    proc = run_cli("report", str(run), "--db", str(db), "--json", "-")
    assert proc.returncode == 0, proc.stderr
    document = json.loads(proc.stdout)  # --json - : stdout is only the JSON
    assert [r["run"] for r in document["runs"]] == [f"{run.parent.parent.parent.name}/{run.name}"]
    assert db.is_file()
    # Every finding's evidence SQL runs on the kept database and reproduces its numbers.
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        for finding in document["runs"][0]["findings"]:
            cursor = con.execute(finding["evidence"]["sql"])
            row = dict(zip([d[0] for d in cursor.description], cursor.fetchone(), strict=True))
            for name, value in row.items():
                expected = finding["evidence"]["metrics"].get(name)
                if isinstance(expected, float) and isinstance(value, float):
                    assert value == pytest.approx(expected, rel=1e-3), (finding["rule"], name)
        input_bound = next(f for f in document["runs"][0]["findings"] if f["rule"] == "input-bound")
        assert "input_fraction_of_step" in input_bound["evidence"]["sql"]
    finally:
        con.close()
    # The kept database is a report PATH by itself, with the same numbers.
    again = run_cli("report", str(db), "--json", "-")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["runs"][0]["breakdown"] == document["runs"][0]["breakdown"]


def test_without_db_the_temporary_database_is_removed(tmp_path: Path) -> None:
    run = generated_run()
    work, private_tmp = tmp_path / "cwd", tmp_path / "tmp"
    work.mkdir()
    private_tmp.mkdir()
    # a private TMPDIR: other processes' reports in the shared /tmp cannot confuse the check
    proc = cli("report", str(run), "--json", "-", cwd=work, env={"TMPDIR": str(private_tmp)})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["runs"]
    assert list(work.iterdir()) == []  # nothing left in the working directory
    assert list(private_tmp.iterdir()) == []  # nor in the temporary folder


def test_run_selection_in_a_database_with_several_runs(tmp_path: Path) -> None:
    first, second = generated_run(), generated_run(scenario="input-bound", seed=1)
    db, run_ids = ingested(first, second)
    assert len(run_ids) == 2
    both = run_cli("report", str(db), "--json", "-")
    assert both.returncode == 0, both.stderr
    assert len(json.loads(both.stdout)["runs"]) == 2
    one = run_cli("report", str(db), "--run", str(run_ids[1]), "--json", "-")
    assert one.returncode == 0, one.stderr
    assert [r["run"].rsplit("/", 1)[-1] for r in json.loads(one.stdout)["runs"]] == [second.name]
    missing = run_cli("report", str(db), "--run", "no-such-run")
    assert missing.returncode == 2
    assert missing.stderr.startswith("tpuanalyze: error: ") and "no-such-run" in missing.stderr


def test_bad_input_is_one_line_exit_2_and_the_database_unchanged(tmp_path: Path) -> None:
    missing = cli("report", str(tmp_path / "nope"))
    assert missing.returncode == 2
    assert missing.stderr.strip().count("\n") == 0 and "nope" in missing.stderr

    run = generated_run()
    db = tmp_path / "kept.duckdb"
    assert cli("report", str(run), "--db", str(db), "--quiet").returncode == 0
    before = db.read_bytes()
    corrupt = tmp_path / "broken" / "plugins" / "profile" / "r1"
    corrupt.mkdir(parents=True)
    (corrupt / "h0.xplane.pb").write_bytes(b"\x0a\xff\xff\xff\x0f not an xspace")
    bad = cli("report", str(corrupt), "--db", str(db))
    assert bad.returncode == 2
    assert bad.stderr.startswith("tpuanalyze: error: ") and bad.stderr.strip().count("\n") == 0
    assert db.read_bytes() == before

    import duckdb

    foreign = tmp_path / "foreign.duckdb"
    duckdb.connect(str(foreign)).close()
    not_ours = cli("report", str(foreign))
    assert not_ours.returncode == 2 and "not a tpuanalyze database" in not_ours.stderr

    unwritable = cli("report", str(db), "--html", str(tmp_path / "no" / "such" / "dir" / "r.html"))
    assert unwritable.returncode == 2 and unwritable.stderr.strip().count("\n") == 0
    assert "r.html" in unwritable.stderr

    thresholds = tmp_path / "bad.toml"
    thresholds.write_text("this is = = not toml")
    bad_thresholds = cli("report", str(db), "--thresholds", str(thresholds))
    assert bad_thresholds.returncode == 2 and "bad.toml" in bad_thresholds.stderr


def test_thresholds_file_changes_the_findings(tmp_path: Path) -> None:
    run = generated_run(scenario="input-bound")
    db, _ = ingested(run)
    from tpuanalyze.analyzer.api import analyze_db

    (default,) = analyze_db(db)
    assert "input-bound" in {f["rule"] for f in default.summary["findings"]}
    strict = tmp_path / "strict.toml"
    strict.write_text("[input_bound]\nmedium = 0.99\nhigh = 0.995\n")
    proc = run_cli("report", str(db), "--thresholds", str(strict), "--json", "-")
    assert proc.returncode == 0, proc.stderr
    assert "input-bound" not in {f["rule"] for f in json.loads(proc.stdout)["runs"][0]["findings"]}


def test_real_jax_cpu_capture_reports_without_collectives(tmp_path: Path) -> None:
    run = jax_cpu_run("single_jit_train")
    html_path = tmp_path / "cpu.html"
    proc = run_cli("report", str(run), "--html", str(html_path), "--json", str(tmp_path / "cpu.json"))
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "cpu.json").read_text())["runs"][0]
    assert summary["device_type"] == "CPU"
    document = html_path.read_text()
    assert "no collectives in this trace" in document
    assert "tpuanalyze: " in document  # title


@pytest.mark.parametrize("outputs, charts_loaded", [(("--json", "r.json"), False),
                                                    (("--html", "r.html"), True)])
def test_only_an_html_report_loads_the_chart_library(tmp_path: Path, outputs: tuple[str, str],
                                                     charts_loaded: bool) -> None:
    """The terminal summary and the JSON take the palette, not Altair (~0.2 s to import on every
    report that draws nothing); the HTML report loads it."""
    code = (
        "import sys\n"
        "from tpuanalyze.cli import main\n"
        "try:\n"
        f"    main(['report', {str(JAX_CPU / 'pmap8_input_bound')!r}, {outputs[0]!r}, {outputs[1]!r}])\n"
        "except SystemExit as exc:\n"
        "    assert not exc.code, exc.code\n"
        "print('altair' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == str(charts_loaded)
    assert (tmp_path / outputs[1]).stat().st_size > 0
