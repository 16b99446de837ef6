"""``tpuanalyze ingest PATH... --db FILE``: read traces and MLPerf result logs into the DuckDB database."""

from __future__ import annotations

import sys

import click
from tpuanalyze.reports.options import map_executor, scheduler_option, wait_option, workers_option

from tpuanalyze.pipeline import ingest_paths
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
@click.option(
    "--parquet",
    "parquet_dir",
    type=click.Path(file_okay=False),
    default=None,
    metavar="DIR",
    help="Keep the event rows as a Parquet dataset in DIR (hive layout "
    "<table>/run_id=<id>/host=<host>/), read by the database through views.",
)
@workers_option
@scheduler_option
@wait_option
def command(
    paths: tuple[str, ...],
    db_path: str,
    progress: bool | None,
    parquet_dir: str | None = None,
    workers: int | None = None,
    scheduler: str | None = None,
) -> None:
    """Ingest XSpace (.xplane.pb) and Chrome-trace JSON files, run folders or logdirs, and MLPerf
    result logs (:::MLLOG / :::MLL result_N.txt; one run per result folder), mixed freely.

    All or nothing: a bad file leaves the database unchanged. Re-ingesting a path replaces its run.
    Host files are read in parallel worker processes (--workers), or on a Dask cluster
    (--scheduler ADDRESS; paths or URLs such as gs://bucket/logdir, docs/cluster.md); with
    --parquet DIR the event rows are written as a Parquet dataset that the database (and pyarrow,
    polars, Spark) reads.
    The analyzer's attribution views (step_breakdown, ...) are created for `tpuanalyze sql`.

    \b
    Examples (from the repository root):
      tpuanalyze ingest sample_traces/jax_cpu sample_traces/mlperf --db demo.duckdb
      tpuanalyze ingest sample_traces/generated/resnet50_v3-32_baseline --db demo.duckdb
      tpuanalyze ingest sample_traces/generated/resnet50_v3-32_baseline --db pod.duckdb --parquet pod_events
    """
    show = sys.stderr.isatty() if progress is None else progress
    with map_executor(scheduler, workers) as executor:  # the Dask cluster's, with --scheduler
        summary = ingest_paths(
            list(paths), db_path, progress=show, workers=workers, executor=executor, parquet=parquet_dir
        )
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
