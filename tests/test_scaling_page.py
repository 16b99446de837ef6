"""The stand-alone scaling page looks like the report: its stylesheet, percentages, plain numbers, no
pandas tables, nothing wider than the page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import SAMPLE_TRACES, run_cli
from tpuanalyze.reports import browser


def _visible_text(document: str) -> str:
    """The page without its scripts and chart specs (what a person reads)."""
    return re.sub(r"<script\b.*?</script>", "", document, flags=re.S)


def test_scaling_page_is_styled_like_the_report(tmp_path: Path) -> None:
    out = tmp_path / "scaling.html"
    proc = run_cli("scaling", str(SAMPLE_TRACES / "scaling"), "--html", str(out))
    assert proc.returncode == 0, proc.stderr
    document = out.read_text()
    text = _visible_text(document)
    from tpuanalyze.reports.scaling_page import report_css

    assert report_css() and report_css() in document  # the report's own stylesheet
    assert 'class="dataframe' not in document  # no pandas default tables
    assert not re.search(r"\d\.\d+e[-+]?\d", text), re.search(r".{40}\d\.\d+e[-+]?\d.{20}", text)
    assert re.search(r"\d+\.\d%", text)  # shares as percentages
    assert "(estimate)" in text and "scaling-limit" in text


@pytest.mark.skipif(browser.find_chromium() is None, reason="headless chromium not installed")
def test_scaling_page_fits_a_laptop_screen_without_sideways_scroll(tmp_path: Path) -> None:
    out = tmp_path / "scaling.html"
    assert run_cli("scaling", str(SAMPLE_TRACES / "scaling"), "--html", str(out)).returncode == 0
    page = browser.render(out, window=(1280, 800))
    assert page.status["done"] and page.status["errors"] == [], page.status
    assert page.status["rendered"] == page.status["charts"] >= 4
    assert page.status["scrollWidth"] <= 1280, page.status
    assert page.status["overflowing"] == [], page.status["overflowing"]  # no card scrolls inside either


@pytest.mark.skipif(browser.find_chromium() is None, reason="headless chromium not installed")
def test_multi_run_report_fits_a_laptop_screen(tmp_path: Path) -> None:
    out = tmp_path / "runs.html"
    runs = [str(p) for p in sorted((SAMPLE_TRACES / "generated").iterdir()) if p.is_dir()]
    proc = run_cli("report", *runs, "--html", str(out), "--quiet")
    assert proc.returncode == 0, proc.stderr
    page = browser.render(out, window=(1280, 800))
    assert page.status["done"] and page.status["errors"] == [], page.status
    assert page.status["scrollWidth"] <= 1280, page.status
    # the runs table shows its last column without a scroll bar
    assert page.status["overflowing"] == [], page.status["overflowing"]
