"""``tpuanalyze mlperf PATH...``: time to train and run facts per MLPerf result folder."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import click
import pandas as pd
from rich.console import Console
from rich.table import Table
from tpuanalyze.analyzer.mlperf_summary import summarize_db
from tpuanalyze.reports.options import wait_option
from tpuanalyze.reports.output import check_output_paths, write_output
from tpuanalyze.store.database import open_database

from tpuanalyze.errors import TpuAnalyzeError
from tpuanalyze.pipeline.mlperf import summarize_paths
from tpuanalyze.safe_text import safe


def wide_console() -> Console:
    """A console for wide tables: piped output (no terminal, no COLUMNS) gets 200 columns, not 80."""
    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(width=200)
    return console


def _fmt(value, spec: str = "{}", missing: str = "-") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return missing
    return spec.format(value)


def summary_table(summary: pd.DataFrame) -> Table:
    """One line per result folder."""
    table = Table(title="MLPerf results (time to train = olympic mean of run_stop - run_start)")
    for name, justify in [("folder", "left"), ("chips", "right"), ("runs", "right"),
                          ("time to train", "right"), ("scoring", "left"), ("epochs", "right"),
                          ("evals", "right"), ("eval in flight", "right"), ("global batch", "right"),
                          ("per core", "right"), ("optimizer", "left"), ("step [est]", "right")]:
        table.add_column(name, justify=justify)
    for row in summary.itertuples(index=False):
        runs = f"{row.runs}" + (f" ({row.failed_runs} failed)" if row.failed_runs else "")
        table.add_row(safe(str(row.submitter_path)), _fmt(row.chips), runs,
                      _fmt(row.time_to_train_s, "{:.2f} s"),
                      safe(row.scoring), _fmt(row.epochs, "{:.1f}"), _fmt(row.eval_count, "{:.1f}"),
                      _fmt(row.eval_share, "{:.1%}"), _fmt(row.global_batch_size),
                      _fmt(row.per_core_batch, "{:g}"), safe(_fmt(row.opt_name)),
                      _fmt(row.step_ms_est, "~{:.1f} ms"))
    return table


def scaling_pivot(summary: pd.DataFrame) -> pd.DataFrame:
    """Time to train by chips for each (version, benchmark, framework) measured at 2+ chip counts."""
    frame = summary.assign(framework=summary["framework"].astype(object).fillna(""))
    frame = frame[frame["time_to_train_s"].notna()]
    counts = frame.groupby(["version", "benchmark", "framework"])["chips"].transform("nunique")
    frame = frame[counts >= 2]
    if frame.empty:
        return pd.DataFrame()
    return frame.pivot_table(index=["version", "benchmark", "framework"], columns="chips",
                             values="time_to_train_s", aggfunc="first")


def pivot_table(pivot: pd.DataFrame) -> Table:
    table = Table(title="Time to train [s] by chips (series measured at 2+ scales)")
    table.add_column("series")
    for chips in pivot.columns:
        table.add_column(f"{chips}", justify="right")
    for index, row in pivot.iterrows():
        label = " ".join(str(part) for part in index if part)
        table.add_row(safe(label), *[_fmt(value, "{:.2f}") for value in row.tolist()])
    return table


def summary_records(summary: pd.DataFrame) -> list[dict]:
    """JSON-ready rows (NaN -> null)."""
    records = summary.drop(columns=["folder"]).to_dict(orient="records")
    return [{key: (None if isinstance(value, float) and math.isnan(value) else value)
             for key, value in record.items()} for record in records]


@click.command()
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@click.option("--db", "db_path", type=click.Path(path_type=Path), default=None,
              help="Read MLPerf runs already ingested into this database instead of (or besides) PATHs.")
@click.option("--json", "json_path", type=click.Path(path_type=Path), default=None,
              help="Also write the summary as JSON to FILE.")
@wait_option
def command(paths: tuple[Path, ...], db_path: Path | None, json_path: Path | None) -> None:
    """Summarize MLPerf result logs (result_*.txt, :::MLLOG and :::MLL): time to train per folder.

    \b
    Examples (from the repository root):
      tpuanalyze mlperf sample_traces/mlperf
      tpuanalyze mlperf sample_traces/mlperf --json mlperf.json
    """
    check_output_paths(json_path)
    frames = []
    if paths:
        frames.append(summarize_paths(paths))
    if db_path is not None:
        if not db_path.exists():
            raise TpuAnalyzeError("no such database", str(db_path))
        import duckdb

        con = open_database(db_path, read_only=True)
        try:
            frames.append(summarize_db(con))
        except duckdb.Error as exc:
            raise TpuAnalyzeError(f"cannot read MLPerf tables: {exc}", str(db_path)) from exc
        finally:
            con.close()
    if not frames:
        raise TpuAnalyzeError("give MLPerf result folders or files (or --db FILE)")
    summary = pd.concat(frames, ignore_index=True).drop_duplicates("folder")
    if summary.empty:
        raise TpuAnalyzeError("no MLPerf results found", str(db_path or paths[0]))
    console = wide_console()
    console.print(summary_table(summary))
    pivot = scaling_pivot(summary)
    if not pivot.empty:
        console.print(pivot_table(pivot))
    if json_path is not None:
        from tpuanalyze.analyzer.api import json_header

        document = {**json_header(), "mlperf": summary_records(summary),
                    "time_to_train_by_chips": [
                        {"version": v, "benchmark": b, "framework": f or None,
                         "time_to_train_s": {str(c): t for c, t in row.items() if not math.isnan(t)}}
                        for (v, b, f), row in pivot.iterrows()] if not pivot.empty else []}
        write_output(json_path, json.dumps(document, indent=2, default=str), "JSON")
