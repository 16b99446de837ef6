"""``tpuanalyze ingest PATH... --db FILE``: read traces and MLPerf result logs into the DuckDB database."""

from __future__ import annotations

import sys

import click
from tpuanalyze.reports.options import wait_option
from tpuanalyze.store.ingest import ingest_paths

from tpuanalyze.safe_text import plain


@click.command("ingest")
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@click.option(
    "--db", "db_path", required=True, type=click.Path(dir_okay=False), help="DuckDB file (created)."
)
@click.option(
    "--progress/--no-progress",
    default=None,
    help="Progress bar (default: only when stderr is a terminal).",
)
@wait_option
def command(paths: tuple[str, ...], db_path: str, progress: bool | None) -> None:
    """Ingest XSpace (.xplane.pb) and Chrome-trace JSON files, run folders or logdirs, and MLPerf
    result logs (:::MLLOG / :::MLL result_N.txt; one run per result folder), mixed freely.

    All or nothing: a bad file leaves the database unchanged. Re-ingesting a path replaces its run.
    The analyzer's attribution views (step_breakdown, ...) are created for `tpuanalyze sql`.

    \b
    Examples (from the repository root):
      tpuanalyze ingest sample_traces/jax_cpu sample_traces/mlperf --db demo.duckdb
      tpuanalyze ingest sample_traces/generated/resnet50_v3-32_baseline --db demo.duckdb
    """
    show = sys.stderr.isatty() if progress is None else progress
    summary = ingest_paths(list(paths), db_path, progress=show)
    for note in summary.notes:
        click.echo(f"note: {plain(note)}", err=True)
    replaced = ""
    if summary.replaced_run_ids:
        replaced = f", replaced run(s) {', '.join(map(str, summary.replaced_run_ids))}"
    ids = ", ".join(map(str, summary.run_ids))
    mlperf = ""
    if summary.mlperf_runs:
        mlperf = (
            f" ({summary.mlperf_runs} MLPerf result folder(s): {summary.mlperf_results} result file(s), "
            f"{summary.mlperf_intervals:,} intervals)"
        )
    click.echo(
        f"ingested {summary.runs} run(s){mlperf} [run_id {ids}], {summary.hosts} host(s), "
        f"{summary.planes} planes, {summary.events:,} events in {summary.seconds:.2f} s "
        f"into {db_path}{replaced}"
    )
