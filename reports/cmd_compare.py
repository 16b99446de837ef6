"""``tpuanalyze compare A B [--fail-if-slower PCT]``: two runs side by side; a CI gate on step time."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table
from tpuanalyze.analyzer.compare import RunComparison, check_comparable, compare_runs
from tpuanalyze.reports.cmd_mlperf import wide_console
from tpuanalyze.reports.options import wait_option
from tpuanalyze.reports.output import check_output_paths, write_output

from tpuanalyze.errors import TpuAnalyzeError
from tpuanalyze.pipeline.runs import RunLoader
from tpuanalyze.safe_text import safe


def _signed(value: float, unit: str = "") -> str:
    return f"{value:+.3f}{unit}"


def render(comparison: RunComparison, console: Console) -> None:
    """The terminal view: step time, breakdown, top ops, findings that changed."""
    head = Table(title=f"compare  A = {safe(comparison.a)}   B = {safe(comparison.b)}",
                 caption="per train step: ms and share of the step (report's breakdown gives shares of "
                         "wall time)")
    for name in ("", "A: ms · of step", "B: ms · of step", "B - A"):
        head.add_column(name, justify="right" if name else "left")
    head.add_row("step time", f"{comparison.step_a_ms:.3f} ms", f"{comparison.step_b_ms:.3f} ms",
                 f"{comparison.step_b_ms - comparison.step_a_ms:+.3f} ms ({comparison.slower_pct:+.1f}%)")
    for row in comparison.breakdown.itertuples(index=False):
        label = row.category + {"collectives_overlapped": " (hidden, not in step)",
                                "idle": " (within steps)"}.get(row.category, "")
        head.add_row(label, f"{row.a_ms:.3f} ms  {row.a_share:5.1%}",
                     f"{row.b_ms:.3f} ms  {row.b_share:5.1%}", _signed(row.delta_ms, " ms"))
    per_chip = comparison.throughput_per_chip
    if per_chip.get("a") and per_chip.get("b"):
        head.add_row(f"throughput per chip ({per_chip['unit']})", f"{per_chip['a']:.4g}",
                     f"{per_chip['b']:.4g}",
                     f"{per_chip['b'] - per_chip['a']:+.4g} ({-(comparison.slower_per_chip_pct or 0):+.1f}%)")
    console.print(head)
    if not comparison.ops.empty:
        ops = Table(title="ops that changed most (ms per device step)")
        for name, justify in (("op", "left"), ("category", "left"), ("A", "right"), ("B", "right"),
                              ("B - A", "right"), ("", "left")):
            ops.add_column(name, justify=justify)
        for row in comparison.ops.itertuples(index=False):
            ops.add_row(safe(str(row.name)[:60]), safe(row.category), f"{row.a_ms:.4f}", f"{row.b_ms:.4f}",
                        _signed(row.delta_ms), row.status)
        console.print(ops)
    for title, items in (("findings that appeared in B", comparison.findings_appeared),
                         ("findings gone in B", comparison.findings_resolved)):
        if items:
            console.print(f"[bold]{title}:[/bold] " + ", ".join(
                f"{f['rule']} ({f.get('severity', '?')})" for f in items))
    if comparison.findings_kept:
        console.print("findings in both: " + ", ".join(comparison.findings_kept))


@click.command()
@click.argument("runs", nargs=-1)
@click.option("--db", "db_path", type=click.Path(path_type=Path), default=None,
              help="Database holding the runs when A/B are run ids or names (or use DB:RUN, trace paths).")
@click.option("--fail-if-slower", "fail_pct", type=float, default=None, metavar="PCT",
              help="Exit with status 1 when B's step time is more than PCT percent slower than A's.")
@click.option("--per-chip", "per_chip", is_flag=True,
              help="Gate on throughput per chip (examples/s per chip when both traces state the batch, else "
                   "steps/s per chip) instead of step time: for runs at different chip counts.")
@click.option("--allow-mixed", "allow_mixed", is_flag=True,
              help="Compare runs of different workloads or platforms anyway (with a warning).")
@click.option("--top", type=int, default=10, show_default=True, help="How many changed ops to list.")
@click.option("--json", "json_path", type=click.Path(path_type=Path), default=None,
              help="Also write the comparison as JSON to FILE.")
@wait_option
def command(runs: tuple[str, ...], db_path: Path | None, fail_pct: float | None, per_chip: bool,
            allow_mixed: bool, top: int, json_path: Path | None) -> None:
    """Compare run B against run A (RUNS = A B: trace paths, DB:RUN, or run ids/names in --db).

    \b
    Examples (from the repository root; exit status 1 when B is slower than the limit: a CI gate):
      tpuanalyze compare sample_traces/generated/resnet50_v3-32_baseline sample_traces/generated/resnet50_v3-32_input-bound
      tpuanalyze compare sample_traces/generated/resnet50_v3-32_baseline sample_traces/generated/resnet50_v3-32_host-overhead --fail-if-slower 5
    """  # noqa: E501 (example lines are shown as they are typed)
    if len(runs) != 2:
        raise TpuAnalyzeError(f"compare takes exactly 2 runs (A B), got {len(runs)}")
    check_output_paths(json_path)
    a, b = runs
    if fail_pct is not None and fail_pct < 0:
        raise TpuAnalyzeError("--fail-if-slower takes a percentage >= 0")
    with RunLoader(db_path) as loader:
        loaded_runs = []
        for spec in (a, b):
            loaded = loader.load(spec)
            if len(loaded) != 1:
                names = ", ".join(run.name for run in loaded)
                raise TpuAnalyzeError(f"names {len(loaded)} runs ({names}); compare takes exactly one run "
                                      "per argument (use DB:RUN)", spec)
            loaded_runs.append(loaded[0])
        mixed = check_comparable(loaded_runs, allow_mixed)
        comparison = compare_runs(loaded_runs[0], loaded_runs[1], top=top)
    comparison.warnings[:0] = mixed
    for warning in comparison.warnings:
        click.echo(f"tpuanalyze: warning: {warning}", err=True)
    render(comparison, wide_console())
    if json_path is not None:
        from tpuanalyze.analyzer.api import json_header

        write_output(json_path, json.dumps({**json_header(), **comparison.to_json()}, indent=2, default=str),
                     "JSON")
    if per_chip and comparison.slower_per_chip_pct is None:
        raise TpuAnalyzeError("--per-chip: the chip count of A or B is unknown")
    slower = comparison.slower_per_chip_pct if per_chip else comparison.slower_pct
    measure = "throughput per chip" if per_chip else "step time"
    if fail_pct is not None and slower is not None and slower > fail_pct:
        click.echo(f"tpuanalyze: B is {slower:.2f}% slower than A by {measure} "
                   f"(limit {fail_pct:g}%)", err=True)
        # sys.exit, not click's Exit: with standalone_mode=False click returns Exit's code instead of
        # raising it, and tpuanalyze.cli.main would drop it
        sys.exit(1)
