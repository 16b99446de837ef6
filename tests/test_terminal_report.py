"""The terminal summary as users get it: `tpuanalyze report ...` piped, read as plain text."""

from __future__ import annotations

import re

from conftest import PROJECT_ROOT
from test_report_pipeline import cli, generated_run, ingested, jax_cpu_run

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\]")
CATEGORY_ROWS = [
    "compute",
    "weight update",
    "collectives (exposed)",
    "input (infeed)",
    "output (outfeed)",
    "eval",
    "idle",
]


def _check_plain_100_columns(text: str) -> None:
    assert not ANSI.search(text), "escape codes in piped output"
    widths = [len(line) for line in text.splitlines()]
    assert max(widths) <= 100, max(widths)


def test_piped_summary_has_header_breakdown_and_ranked_findings(tmp_path) -> None:
    run = generated_run(scenario="input-bound")
    proc = cli("report", str(run), "--db", str(tmp_path / "t.duckdb"))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    _check_plain_100_columns(out)
    # Header: the run and its facts.
    assert re.search(rf"run \S*/{re.escape(run.name)}", out)  # <logdir>/<run>
    assert "TPU v3" in out
    assert re.search(r"hosts / cores\s+\d+ hosts? · \d+ cores?", out)
    assert re.search(r"step time\s+[\d.]+ ms mean · median", out)
    # Breakdown: one row per category with a share, ms/step and a bar.
    for label in CATEGORY_ROWS:
        assert re.search(rf"^ {re.escape(label)}\s+\d+\.\d%\s+([\d,.]+|–)\s", out, re.M), label
    assert "█" in out
    # Findings, ranked: the injected input-bound finding is there with evidence and the catalog technique.
    assert "Findings, by estimated gain" in out
    assert re.search(r"^\d+\. input-bound\s+\[(high|medium|low)\]\s+gain", out, re.M)
    block = out[out.index("Findings, by estimated gain") :]
    assert "evidence" in block and "recommendation" in block and "catalog" in block
    # Slowest cores/hosts and top ops.
    assert "Slowest cores" in out and "Top " in out
    # Piped: no progress bars or spinners on stderr either.
    assert not ANSI.search(proc.stderr)


def test_findings_are_ranked_by_estimated_gain() -> None:
    from tpuanalyze.analyzer.api import analyze_db
    from tpuanalyze.reports.terminal import render_text
    from tpuanalyze.reports.view import ranked_findings, run_findings

    db, run_ids = ingested(generated_run(scenario="input-bound"))
    (analysis,) = analyze_db(db, list(run_ids))
    ranked = ranked_findings(run_findings(analysis))
    gains = [f.gain_fraction for f in ranked if f.gain_fraction is not None]
    assert gains == sorted(gains, reverse=True)
    text = render_text([analysis])
    positions = [text.index(f". {f.rule}  [") for f in ranked]
    assert positions == sorted(positions)


def test_several_runs_get_an_overview_and_fit_100_columns(tmp_path) -> None:
    db, _ = ingested(generated_run(), generated_run(scenario="input-bound", seed=1))
    proc = cli("report", str(db))
    assert proc.returncode == 0, proc.stderr
    _check_plain_100_columns(proc.stdout)
    assert proc.stdout.startswith("2 runs")
    assert proc.stdout.count("Where the time goes") == 2


def test_real_cpu_capture_summary(tmp_path) -> None:
    proc = cli("report", str(jax_cpu_run("pmap8_input_bound")))
    assert proc.returncode == 0, proc.stderr
    _check_plain_100_columns(proc.stdout)
    assert "CPU" in proc.stdout
    assert "Where the time goes" in proc.stdout
    # the bundled capture's programs compiled before the trace: nothing to say about warm-up there
    assert "memory transfers (waits)" in proc.stdout


def test_warmup_shown_and_kept_on_request(tmp_path, shared_traces) -> None:
    """A shared JAX capture compiles in step 0: the header says so; --keep-warmup keeps the step."""
    run = shared_traces / "jax_cpu" / "single_jit_train"
    plain = cli("report", str(run))
    assert plain.returncode == 0, plain.stderr
    _check_plain_100_columns(plain.stdout)
    assert "capture" in plain.stdout and "warmup-step" in plain.stdout
    assert "left out of step-time statistics" in plain.stdout
    kept = cli("report", str(run), "--keep-warmup")
    assert kept.returncode == 0, kept.stderr
    assert "kept in step-time statistics" in kept.stdout


def test_scaling_series_gets_its_cross_run_findings(tmp_path) -> None:
    """The bundled GNMT series (16, 64, 512 chips; collectives grow with scale) reported together."""
    series = PROJECT_ROOT / "sample_traces" / "scaling"
    assert series.is_dir(), "bundled sample_traces/scaling is missing"
    html_path = tmp_path / "series.html"
    proc = cli("report", str(series), "--html", str(html_path))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    _check_plain_100_columns(out)
    assert out.startswith("3 runs")
    # Runs listed from the smallest slice up, then the cross-run finding before the runs' own sections.
    rows = [line.split()[0] for line in out.splitlines()[4:7]]
    assert [r.split("/")[-1].split("_")[1][:6] for r in rows] == ["v3-32", "v3-128", "v3-102"]
    assert out.index("Scaling across runs") < out.index("╭─ run ")
    assert re.search(r"^1\. scaling-limit\s+\[(high|medium|low)\]", out, re.M)
    document = html_path.read_text()
    assert '<section id="scaling">' in document and 'data-rule="scaling-limit"' in document
