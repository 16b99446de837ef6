"""Root causes and combined gains: a finding another one explains carries caused_by, sits under it in
every report, and its gain is not counted again; the stand-alone gains never sum past the step time
spent outside compute (docs/findings.md), on any generated scenario."""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_report_pipeline import generated_run, ingested
from tpuanalyze.analyzer.api import analyze_db, analyze_run, install_views, report_json
from tpuanalyze.generator.scenarios import SCENARIOS
from tpuanalyze.reports import browser, terminal, view
from tpuanalyze.reports.html import write_html

from tpuanalyze import generator
from tpuanalyze.pipeline import ingest_paths

COLLECTIVE_RULES = {"collective-bound", "latency-bound-collectives", "f32-gradient-allreduce",
                    "distributed-batch-norm"}
ROUNDING = 1e-3  # gains are rounded to 4 decimals each


def _compute_share(analysis) -> float:  # noqa: ANN001 - RunAnalysis
    """Compute's share of the devices' wall time (the step cycle: train steps, gaps, eval; warm-up left
    out), pooled from the per-device rows (not from the findings)."""
    cores = analysis.per_core[analysis.per_core["steps"] > 0]
    return float((cores["compute"] * cores["wall_ms"]).sum()) / float(cores["wall_ms"].sum())


def _check_tree_and_budget(analysis) -> None:  # noqa: ANN001
    findings = analysis.findings
    rules = [f["rule"] for f in findings]
    assert len(rules) == len(set(rules))
    stand_alone = [f for f in findings if "caused_by" not in f]
    total = sum(f["estimated_gain"]["fraction"] or 0.0 for f in stand_alone)
    assert total <= 1.0 - _compute_share(analysis) + ROUNDING, (total, _compute_share(analysis), rules)
    for position, f in enumerate(findings):
        gain = f["estimated_gain"]
        assert gain["label"] == "estimate" and gain["ms"] >= 0 and gain["own_ms"] >= 0
        assert gain["ms"] <= gain["own_ms"] + ROUNDING  # combining never inflates an estimate
        if "caused_by" in f:  # shown after its cause, its gain counted there
            assert f["caused_by"] in rules[:position], (f["rule"], f["caused_by"], rules)
            assert gain["ms"] == 0 and gain["fraction"] == 0


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=st.sampled_from(["resnet50", "bert", "transformer", "ssd"]),
       chips=st.sampled_from([4, 8, 16]), scenario=st.sampled_from(sorted(SCENARIOS)),
       seed=st.integers(0, 3))
def test_stand_alone_gains_never_exceed_the_time_outside_compute(model: str, chips: int, scenario: str,
                                                                 seed: int) -> None:
    with tempfile.TemporaryDirectory(prefix="findings-prop-") as tmp:
        run = generator.generate(model, chips=chips, steps=3, hosts=min(chips // 4, 2), scenario=scenario,
                                 seed=seed, out=Path(tmp) / "gen")
        db = Path(tmp) / "p.duckdb"
        run_id = ingest_paths([run], db).run_ids[0]
        con = duckdb.connect(str(db), read_only=True)
        try:
            analysis = analyze_run(con, run_id)
        finally:
            con.close()
        _check_tree_and_budget(analysis)


@pytest.fixture(scope="module", params=[16, 32], ids=["4hosts", "8hosts"])
def straggler_run(request: pytest.FixtureRequest):  # noqa: ANN201 - (RunAnalysis, db path)
    run = generated_run(chips=request.param, scenario="straggler", steps=4)
    db, run_ids = ingested(run)
    (analysis,) = analyze_db(db, list(run_ids))
    assert analysis.summary["hosts"] >= 4
    return analysis, db


def test_straggler_is_the_root_of_the_collective_waits(straggler_run) -> None:  # noqa: ANN001
    analysis, _ = straggler_run
    findings = analysis.findings
    assert findings[0]["rule"] == "straggler" and "caused_by" not in findings[0]
    under = [f for f in findings if f["rule"] in COLLECTIVE_RULES]
    assert under, [f["rule"] for f in findings]
    assert all(f.get("caused_by") == "straggler" for f in under), [(f["rule"], f.get("caused_by"))
                                                                   for f in findings]
    _check_tree_and_budget(analysis)
    # the one wait is counted once: the straggler's gain, no more than the waits it causes (the slow
    # host's infeed and the others' collective sync), and more than the collective findings' own
    train = analysis.steps[~analysis.steps["is_eval"] & ~analysis.steps["is_warmup"]]
    waits = float((train["collectives_ps"].sum() + train["input_ps"].sum()) / train["duration_ps"].sum())
    gain = findings[0]["estimated_gain"]
    assert gain["category"] == "collectives+input"
    assert max(f["estimated_gain"]["own_fraction"] for f in under) < gain["fraction"] <= waits + ROUNDING


def test_terminal_json_and_html_show_the_tree(straggler_run, tmp_path: Path) -> None:  # noqa: ANN001
    analysis, _ = straggler_run
    ranked = view.ranked_findings(view.run_findings(analysis))
    assert ranked[0].rule == "straggler" and ranked[0].depth == 0 and ranked[0].label == "1"
    children = [v for v in ranked if v.caused_by == "straggler"]
    assert children and all(v.depth == 1 and v.label.startswith("1.") for v in children)
    text = terminal.render_text([analysis])
    assert re.search(r"^1\. straggler\s+\[", text, re.M)
    for child in children:
        line = re.search(rf"^ +└ {re.escape(child.label)}\. {child.rule}\s+\[\w+\]\s+caused by straggler.*$",
                         text, re.M)
        assert line, child.rule
        assert "counted under straggler" in " ".join(text[line.start():line.start() + 300].split())
        assert text.index("1. straggler") < line.start()
    document = json.loads(json.dumps(report_json([analysis])))
    by_rule = {f["rule"]: f for f in document["runs"][0]["findings"]}
    assert {r for r, f in by_rule.items() if f.get("caused_by") == "straggler"} == {v.rule for v in children}
    out = tmp_path / "tree.html"
    write_html([analysis], out)
    html = out.read_text()
    for child in children:
        card = rf'class="card finding \w+ caused" data-rule="{child.rule}" data-caused-by="straggler"'
        assert re.search(card, html), child.rule


@pytest.mark.browser
@pytest.mark.skipif(browser.find_chromium() is None, reason="headless chromium not installed")
def test_html_tree_renders_in_chromium(straggler_run, tmp_path: Path) -> None:  # noqa: ANN001
    analysis, _ = straggler_run
    out = tmp_path / "tree.html"
    write_html([analysis], out)
    page = browser.render(out)
    assert page.status.get("done") is True and page.status["errors"] == [], page.status
    cards = re.findall(r'<article class="card finding (\w+)( caused)?" data-rule="([\w-]+)"', page.dom)
    assert cards[0][2] == "straggler" and not cards[0][1]
    assert any(c[1] and c[2] in COLLECTIVE_RULES for c in cards)
    assert "caused by straggler" in page.dom


def test_evidence_sql_returns_every_metric(straggler_run) -> None:  # noqa: ANN001
    """The SQL a finding shows, run in `tpuanalyze sql`'s views, returns exactly its metrics."""
    analysis, db = straggler_run
    con = duckdb.connect(str(db))
    try:
        install_views(con)
        for f in analysis.findings:
            cur = con.execute(f["evidence"]["sql"])
            row = dict(zip([d[0] for d in cur.description], cur.fetchone(), strict=True))
            for key, value in f["evidence"]["metrics"].items():
                assert key in row, (f["rule"], key)
                if isinstance(value, float):
                    assert float(row[key]) == pytest.approx(value, rel=1e-5, abs=1e-6), (f["rule"], key)
                else:
                    assert row[key] == value, (f["rule"], key)
    finally:
        con.close()
