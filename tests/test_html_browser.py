"""The HTML report in a real headless Chromium, offline: every chart renders, no errors, findings shown.

Chromium runs with the network cut (dead proxy, no DNS) and the report's CSP forbids fetches; the
page's own script reports errors, rejected chart promises and CSP violations in #render-status.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import IN_CI
from test_html_offline import external_references
from test_report_pipeline import cli, generated_run, ingested, jax_cpu_run
from tpuanalyze.reports import browser

pytestmark = pytest.mark.browser

# skips without chromium, fails under CI=true (conftest.chromium)
needs_chromium = pytest.mark.usefixtures("chromium")


def _report(tmp_path: Path, *paths: Path, name: str = "report.html", via_cli: bool = False) -> Path:
    """The HTML report of the ingested traces: through the CLI, or in-process (same code, faster)."""
    db, run_ids = ingested(*paths)
    out = tmp_path / name
    if via_cli:
        proc = cli("report", str(db), "--html", str(out), "--quiet")
        assert proc.returncode == 0, proc.stderr
        assert f"wrote {out}" in proc.stderr
    else:
        from tpuanalyze.analyzer.api import analyze_db
        from tpuanalyze.reports.html import write_html

        write_html(analyze_db(db, list(run_ids)), out)
    return out


def _check_rendered(page: browser.RenderedPage, document: str) -> None:
    status = page.status
    assert status.get("done") is True, status
    assert status["errors"] == [], status["errors"]
    expected = len(re.findall(r'<div class="chart" id="', document))
    assert expected >= 1
    assert status["charts"] == expected and status["rendered"] == expected, status
    containers = page.chart_containers()
    assert len(containers) == expected
    for chart_id, inner in containers.items():
        assert "<svg" in inner or "<canvas" in inner, f"chart {chart_id} did not render"
        assert "data-error" not in inner


@needs_chromium
def test_generated_pod_report_renders_offline_with_findings(tmp_path: Path) -> None:
    run = generated_run(scenario="input-bound", chips=16)
    out = _report(tmp_path, run, via_cli=True)
    document = out.read_text()
    assert external_references(document) == []
    assert "<script src" not in document.lower() and "@import" not in document
    page = browser.render(out)
    _check_rendered(page, document)
    assert page.status["warnings"] == [], page.status["warnings"]  # Vega-Lite has nothing to complain about
    # The roofline (a TPU v3 trace states its peaks) is one of the charts that rendered, with its roof.
    roofline = page.chart_containers().get("run0-roofline")
    assert roofline is not None and "<svg" in roofline, "roofline chart missing or not rendered"
    assert "operational intensity" in roofline and "ridge point" in document
    # Findings: each card present after rendering, with evidence, recommendation and gain.
    from tpuanalyze.analyzer.api import analyze_db

    db, run_ids = ingested(run)
    rules = [f["rule"] for a in analyze_db(db, list(run_ids)) for f in a.summary["findings"]]
    assert "input-bound" in rules
    for rule in rules:
        assert f'data-rule="{rule}"' in page.dom
    assert page.dom.count("Evidence</dt>") == len(rules)
    assert page.dom.count("Recommendation</dt>") == len(rules)
    # Tooltips are declared on every chart's marks.
    for spec in re.findall(r'<script type="application/json" id="spec-[^"]+">(.*?)</script>', document, re.S):
        assert '"tooltip"' in spec


@needs_chromium
def test_cpu_capture_report_shows_notes_instead_of_broken_charts(tmp_path: Path) -> None:
    out = _report(tmp_path, jax_cpu_run("single_jit_train"))
    document = out.read_text()
    page = browser.render(out)
    _check_rendered(page, document)
    assert "no collectives in this trace" in page.dom


@needs_chromium
def test_several_runs_render_with_overview_and_scaling_charts(tmp_path: Path) -> None:
    # One workload at two chip counts (the larger one host-sampled): a scaling series.
    runs = (generated_run(chips=8), generated_run(chips=32, hosts=2))
    out = _report(tmp_path, *runs, via_cli=True)
    document = out.read_text()
    page = browser.render(out)
    _check_rendered(page, document)
    assert 'id="runs"' in page.dom
    assert page.dom.count('<section class="run"') == 2
    scaling = page.dom[page.dom.index('<section id="scaling"') : page.dom.index('<section class="run"')]
    assert scaling.count('<div class="chart') >= 2 and scaling.count("<svg") >= 2
    assert page.status["warnings"] == [], page.status["warnings"]  # scaling charts included


SCALING_SAMPLE = Path(__file__).resolve().parents[1] / "sample_traces" / "scaling"


@needs_chromium
@pytest.mark.parametrize("verb", ["report", "scaling"])
def test_scaling_sample_renders_without_vega_warnings(tmp_path: Path, verb: str) -> None:
    """The bundled 3-run scaling series, through both verbs that write scaling charts: every chart
    renders, Vega-Lite logs no warning (e.g. opacity on an unsorted discrete field), nothing fetched."""
    assert (SCALING_SAMPLE / "gnmt_512").is_dir(), "bundled sample_traces/scaling is missing"
    out = tmp_path / f"{verb}.html"
    extra = ["--quiet"] if verb == "report" else []
    proc = cli(verb, str(SCALING_SAMPLE), "--html", str(out), *extra)
    assert proc.returncode == 0, proc.stderr
    document = out.read_text()
    assert external_references(document) == []
    page = browser.render(out)
    status = page.status
    assert status.get("done") is True and status["errors"] == [], status
    assert status["warnings"] == [], status["warnings"]
    assert status["charts"] == status["rendered"] >= 4, status
    if verb == "report":
        _check_rendered(page, document)
        scaling = page.dom[page.dom.index('<section id="scaling"') : page.dom.index('<section class="run"')]
    else:
        scaling = page.dom
    assert scaling.count("<svg") >= 4
    for title in ("time vs chips", "time per step by category", "share of the step", "scaling efficiency"):
        assert title in scaling
    assert "1024 (est)" in scaling  # projected chip counts are labelled as estimates on the share chart


@needs_chromium
def test_harness_sees_errors_and_network_attempts(tmp_path: Path) -> None:
    """Negative control: a broken chart spec and an external image must show up as errors."""
    out = _report(tmp_path, generated_run())
    document = out.read_text()
    broken = tmp_path / "broken.html"
    first_spec = re.search(
        r'(<script type="application/json" id="spec-[^"]+">)(.*?)(</script>)', document, re.S
    )
    document = document.replace(
        first_spec.group(0), first_spec.group(1) + '{"mark": ' + first_spec.group(3), 1
    )
    document = document.replace("</footer>", '<img src="https://example.com/pixel.png"></footer>', 1)
    broken.write_text(document)
    page = browser.render(broken)
    errors = " ".join(page.status["errors"])
    assert "bad spec" in errors
    assert "csp" in errors and "example.com" in errors


def test_html_size_grows_slowly_with_hosts_and_stays_under_10mb_at_256(tmp_path: Path) -> None:
    """Aggregation, not event dumps: extrapolate the size per sampled host to a 256-host report."""
    # 1024 chips = 256 hosts of 4 chips (catalog §2); write a sample of K hosts. Both samples are past
    # 64 cores, so the heatmap is per host in both and the growth per host is what 256 hosts would add.
    sizes = {}
    for hosts in (9, 11):
        run = generated_run(model="resnet50", chips=1024, hosts=hosts, steps=2)
        sizes[hosts] = _report(tmp_path, run, name=f"h{hosts}.html").stat().st_size
    per_host = max(0.0, (sizes[11] - sizes[9]) / 2)
    projected_256 = sizes[11] + per_host * (256 - 11)
    assert projected_256 < 10e6, (sizes, projected_256)
    assert per_host < 20_000, sizes  # a heatmap row and an input bar, not events
    if IN_CI or browser.find_chromium() is not None:  # the per-host charts render cleanly too (CI: must)
        out = tmp_path / "h11.html"
        page = browser.render(out)
        _check_rendered(page, out.read_text())
        assert page.status["warnings"] == [], page.status["warnings"]


@needs_chromium
def test_real_shared_traces_render_together(tmp_path: Path, shared_traces: Path) -> None:
    """Real captures from other tools (TPU v6e XSpace, V100 XSpace, PyTorch Kineto JSON) in one report."""
    paths = [
        shared_traces / "real" / "tpu_v6e_4chip_jax_inference.xplane.pb",
        shared_traces / "real" / "gpu_v100x8_tf_multiworker.xplane.pb",
        shared_traces / "chrome_json" / "kineto_resnet50_v100.json.gz",
    ]
    missing = [p for p in paths if not p.exists()]
    if missing:
        pytest.skip(f"shared traces missing: {missing}")
    out = _report(tmp_path, *paths)
    document = out.read_text()
    assert external_references(document) == []
    page = browser.render(out)
    _check_rendered(page, document)
    assert page.status["warnings"] == [], page.status["warnings"]
    assert page.dom.count('<section class="run"') == 3
    assert "TPU v6 Lite" in page.dom
    # capture health and the v6e's programs, rendered in the browser
    assert page.dom.count("Capture health") >= 2
    assert "empty-device-planes" in page.dom and "hosts-missing" in page.dom
    assert "jit__psum" in page.dom and "memory transfers (waits)" in page.dom


def test_hostile_run_names_are_escaped(tmp_path: Path) -> None:
    """Run names come from folder names: markup in them must stay text (HTML and chart data)."""
    import dataclasses

    from tpuanalyze.analyzer.api import analyze_db
    from tpuanalyze.reports.html import render_html

    db, run_ids = ingested(generated_run())
    (analysis,) = analyze_db(db, list(run_ids))
    name = '</script><img src="https://evil.example/x.png">'
    hostile = dataclasses.replace(analysis, summary={**analysis.summary, "run": name})
    document = render_html([hostile])
    assert name not in document
    assert external_references(document) == []
    assert "&lt;/script&gt;&lt;img" in document  # shown as text in the header
