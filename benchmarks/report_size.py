"""HTML report size and time on a generated pod, against a naive per-device-step dump as baseline.

    python benchmarks/report_size.py [--chips 1024] [--hosts K] [--steps 10] [--out DIR] [--browser]

1024 chips = 256 hosts of 4 chips (catalog §2), all written unless --hosts samples K of them. Prints
the report's size (budget: 10 MB), what a chart embedding every device-step row would weigh (the
baseline the aggregation avoids), and the time of each stage. With --browser it also renders the
report in headless Chromium and prints the render status.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from tpuanalyze.analyzer.api import analyze_db
from tpuanalyze.generator import generate
from tpuanalyze.reports.html import render_html, vendor_javascript

from tpuanalyze.pipeline import ingest_paths


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--chips", type=int, default=1024)
    parser.add_argument("--hosts", type=int, default=None, help="write a sample of K hosts (default: all)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", type=Path, default=None, help="keep trace, database and report here")
    parser.add_argument("--browser", action="store_true", help="also render in headless chromium")
    parser.add_argument("--results", type=Path, default=None, help="also write a markdown summary here")
    parser.add_argument("--reuse", action="store_true", help="reuse OUT/bench.duckdb from an earlier run")
    args = parser.parse_args()

    tmp = tempfile.TemporaryDirectory(prefix="tpuanalyze-bench-report-")
    out = args.out or Path(tmp.name)
    out.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}

    db = out / "bench.duckdb"
    if args.reuse and db.exists():
        import duckdb

        con = duckdb.connect(str(db), read_only=True)
        run_ids = [r[0] for r in con.execute("SELECT run_id FROM runs ORDER BY run_id").fetchall()]
        events = con.execute("SELECT sum(num_events) FROM runs").fetchone()[0]
        con.close()
    else:
        start = time.perf_counter()
        run = generate(
            model=args.model, chips=args.chips, steps=args.steps, hosts=args.hosts, out=out / "trace"
        )
        timings["generate_s"] = time.perf_counter() - start
        print(f"generated {run} in {timings['generate_s']:.1f} s", file=sys.stderr)
        db.unlink(missing_ok=True)
        start = time.perf_counter()
        summary = ingest_paths([run], db)
        timings["ingest_s"] = time.perf_counter() - start
        run_ids, events = summary.run_ids, summary.events
        print(f"ingested {events:,} events in {timings['ingest_s']:.1f} s", file=sys.stderr)

    start = time.perf_counter()
    analyses = analyze_db(db, run_ids)
    timings["analyze_s"] = time.perf_counter() - start
    print(f"analysed in {timings['analyze_s']:.1f} s", file=sys.stderr)

    start = time.perf_counter()
    document = render_html(analyses)
    timings["render_html_s"] = time.perf_counter() - start
    report = out / "report.html"
    report.write_text(document, encoding="utf-8")

    analysis = analyses[0]
    naive = len(analysis.steps.to_json(orient="records")) + len(analysis.per_core.to_json(orient="records"))
    result = {
        "run": analysis.summary["run"],
        "hosts": analysis.summary["hosts"],
        "devices": analysis.summary["devices"],
        "steps": analysis.summary["steps"],
        "events": events,
        "html_bytes": len(document.encode("utf-8")),
        "vendored_js_bytes": len(vendor_javascript().encode("utf-8")),
        "baseline_naive_step_rows_json_bytes": naive + len(vendor_javascript().encode("utf-8")),
        "under_10MB": len(document.encode("utf-8")) < 10_000_000,
        **{k: round(v, 2) for k, v in timings.items()},
    }
    result["size_ratio_vs_baseline"] = round(
        result["html_bytes"] / result["baseline_naive_step_rows_json_bytes"], 3
    )
    if args.browser:
        from tpuanalyze.reports.browser import render

        start = time.perf_counter()
        page = render(report, budget_ms=30000, timeout=300)
        result["browser_render_s"] = round(time.perf_counter() - start, 2)
        result["browser_status"] = page.status
    print(json.dumps(result, indent=2))
    if args.results is not None:
        args.results.write_text(results_markdown(result, args), encoding="utf-8")
    return 0 if result["under_10MB"] else 1


def results_markdown(result: dict, args: argparse.Namespace) -> str:
    """The figures as the markdown kept in benchmarks/results/report_size.md."""
    lines = [
        "# HTML report size on a generated pod",
        "",
        f"`python benchmarks/report_size.py --chips {args.chips} --steps {args.steps}"
        f"{' --hosts ' + str(args.hosts) if args.hosts else ''}{' --browser' if args.browser else ''}`",
        "",
        "| figure | value |",
        "|---|---|",
        f"| run | {result['run']}: {result['hosts']} hosts, {result['devices']} cores, "
        f"{result['steps']} train steps |",
        f"| events ingested | {result['events']:,} |",
        f"| HTML report | {result['html_bytes']:,} bytes (budget 10,000,000) |",
        f"| of which vendored Vega JS | {result['vendored_js_bytes']:,} bytes |",
        f"| baseline: per-device-step rows as chart data | "
        f"{result['baseline_naive_step_rows_json_bytes']:,} bytes |",
        f"| report / baseline | {result['size_ratio_vs_baseline']} |",
        f"| analyse (analyzer) | {result['analyze_s']} s |",
        f"| render HTML | {result['render_html_s']} s |",
    ]
    if "browser_status" in result:
        status = result["browser_status"]
        lines.append(
            f"| headless Chromium | {result['browser_render_s']} s, "
            f"{status.get('rendered')}/{status.get('charts')} charts rendered, "
            f"{len(status.get('errors', []))} errors |"
        )
    lines += ["", "The baseline grows with cores x steps; the report grows by one heatmap row per host."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
