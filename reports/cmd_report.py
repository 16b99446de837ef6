"""``tpuanalyze report PATH... [--db FILE] [--json FILE] [--html FILE] [--thresholds FILE]``.

PATH is either trace files/folders (ingested on the fly) or one existing ``.duckdb`` database.
Traces go into ``--db FILE`` when given (kept, so the findings' SQL can be rerun with
``tpuanalyze sql``), else into a temporary database that is deleted afterwards: a report should
not leave a database of possibly gigabytes behind unasked. The terminal summary goes to stdout;
progress and "wrote ..." lines go to stderr.
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click
from tpuanalyze.reports import progress
from tpuanalyze.reports.options import scheduler_option, wait_option, workers_option
from tpuanalyze.reports.output import write_output
from tpuanalyze.store.database import open_database

from tpuanalyze.errors import TpuAnalyzeError

DUCKDB_MAGIC = b"DUCK"  # bytes 8..12 of every DuckDB database file


def is_duckdb_file(path: Path) -> bool:
    """A DuckDB database, recognised by its header rather than its name."""
    if not path.is_file():
        return False
    try:
        with path.open("rb") as fh:
            head = fh.read(12)
    except OSError:
        return False
    return len(head) == 12 and head[8:12] == DUCKDB_MAGIC


def _check_exists(paths: Sequence[Path | str]) -> None:
    """Local paths exist (URLs are checked when they are listed)."""
    for path in paths:
        if isinstance(path, Path) and not path.exists():
            raise TpuAnalyzeError("no such file or directory", str(path))


def _ingest(
    paths: Sequence[Path | str],
    db_path: Path,
    show_progress: bool,
    workers: int | None = None,
    scheduler: str | None = None,
    analyze: dict[str, Any] | None = None,
    store_op_events: bool = True,
) -> Any:
    """Ingest the traces; with ``analyze`` (the thresholds), their batches attributed in the map
    (the summary's ``mapped``; close the summary when the report is done)."""
    from tpuanalyze.reports.options import map_executor

    from tpuanalyze.pipeline import ingest_paths

    with map_executor(scheduler, workers) as executor:  # the Dask cluster's, with --scheduler
        return ingest_paths(
            list(paths), db_path, progress=show_progress, workers=workers, executor=executor,
            analyze=analyze, store_op_events=store_op_events,
        )


def _install_views(db_path: Path, thresholds: Path | None) -> None:
    """Attribution views (step_breakdown, ...) in a kept database, so the findings' SQL runs there."""
    from tpuanalyze.analyzer.api import install_views

    con = open_database(db_path)
    try:
        install_views(con, thresholds)
    finally:
        con.close()


def _select_runs(con: Any, db_path: Path, selectors: Sequence[str]) -> list[int]:
    """Trace runs of the database (MLPerf-only runs have no trace to analyse), optionally by name or id."""
    import duckdb

    try:
        rows = con.execute(
            "SELECT run_id, name, source_path, source_format FROM runs ORDER BY run_id"
        ).fetchall()
    except duckdb.Error as exc:
        raise TpuAnalyzeError("not a tpuanalyze database (no runs table)", str(db_path)) from exc
    trace_runs = [r for r in rows if r[3] != "mlperf"]
    if not selectors:
        return [r[0] for r in trace_runs]
    chosen: list[int] = []
    for selector in selectors:
        match = [
            r[0] for r in trace_runs if selector in (str(r[0]), r[1], r[2]) or r[1].endswith(f"/{selector}")
        ]
        if not match:
            names = ", ".join(f"{r[0]}:{r[1]}" for r in trace_runs[:10]) or "none"
            raise TpuAnalyzeError(f"no trace run '{selector}' in the database (runs: {names})", str(db_path))
        chosen += [m for m in match if m not in chosen]
    return chosen


def analyse(
    db_path: Path,
    run_ids: Sequence[int] | None,
    selectors: Sequence[str],
    thresholds: Path | None,
    show_progress: bool,
    xprof: bool = False,
    keep_warmup: bool = False,
    source: str | None = None,
    mapped: dict[int, list[Any]] | None = None,
) -> tuple[list[Any], list[Any] | None]:
    """RunAnalysis of each selected run, read-only, with a progress bar; and their scaling series, if any.
    With ``xprof``, XProf's numbers on the same files go into each summary (``xprof``). ``source``
    names the input in errors when the database is a temporary one of the traces given. ``mapped``:
    run id -> its batches' results where the ingest attributed them in the map."""
    import duckdb
    from tpuanalyze.analyzer.api import analyze_mapped, analyze_run

    config = analysis_config(thresholds, keep_warmup)
    try:
        con = open_database(db_path, read_only=True)
    except duckdb.Error as exc:
        raise TpuAnalyzeError(f"cannot open database: {exc}", str(db_path)) from exc
    try:
        if run_ids is None:
            run_ids = _select_runs(con, db_path, selectors)
        else:
            formats = dict(con.execute("SELECT run_id, source_format FROM runs").fetchall())
            run_ids = [r for r in run_ids if formats.get(r) != "mlperf"]
        if not run_ids:
            raise TpuAnalyzeError(
                "no trace runs to report (MLPerf logs: use `tpuanalyze mlperf`)", source or str(db_path)
            )
        analyses = []
        with progress.progress_bar(len(run_ids), "analysing", enabled=show_progress) as bar:
            names = dict(con.execute("SELECT run_id, name FROM runs").fetchall())
            for run_id in run_ids:
                bar.advance(0, note=str(names.get(run_id, run_id)))
                try:
                    if mapped and run_id in mapped:
                        analyses.append(analyze_mapped(con, run_id, mapped[run_id], config))
                    else:
                        analyses.append(analyze_run(con, run_id, config))
                except TpuAnalyzeError as exc:  # the run's data unreadable: name the database
                    if exc.path is not None:
                        raise
                    raise TpuAnalyzeError(exc.reason, source or str(db_path)) from exc
                bar.advance(1)
        if xprof:
            from tpuanalyze.reports.xprof_side import attach

            with progress.phase("running XProf on the same files", enabled=show_progress):
                attach(con, list(run_ids), analyses)
        series = scaling_series(con, run_ids, analyses)
        if series is not None:
            analyses = [analyses[i] for i in chips_order(analyses)]
        return analyses, series
    finally:
        con.close()


def analysis_config(thresholds: Path | None, keep_warmup: bool) -> dict[str, Any] | None:
    """The analyzer's thresholds (None: the defaults), warm-up kept in the statistics if asked."""
    from tpuanalyze.analyzer.api import load_thresholds

    config = load_thresholds(thresholds) if thresholds is not None else None
    if keep_warmup:  # warm-up steps stay in the step statistics (docs/attribution.md)
        config = config or load_thresholds()
        config["warmup"]["keep"] = True
    return config


def scaling_series(con: Any, run_ids: Sequence[int], analyses: list[Any]) -> list[Any] | None:
    """One scaling series (``ScalingAnalysis``) per group of runs of the same workload on the same
    platform measured at 2+ chip counts; None when no group qualifies (no section).

    Built exactly as ``tpuanalyze scaling`` builds it (chips, batch, workload and platform from the
    trace's own identity, never from the number of traced hosts, which may be a sample). Runs whose
    workload or platform the trace does not state join no series.
    """
    if len(analyses) < 2:
        return None
    try:
        from tpuanalyze.analyzer.compare import LoadedRun, run_facts
        from tpuanalyze.analyzer.identity import comparable_key
        from tpuanalyze.analyzer.scaling import analyze_scaling
        from tpuanalyze.reports.cmd_scaling import trace_series
    except ImportError:
        return None
    groups: dict[tuple, list[Any]] = {}
    for run_id, analysis in zip(run_ids, analyses, strict=True):
        name = str(analysis.summary.get("run"))
        run = LoadedRun(label=name, run_id=run_id, name=name, analysis=analysis, facts=run_facts(analysis))
        key = comparable_key(run.facts["identity"])
        if key is not None and run.facts.get("chips"):
            groups.setdefault(key, []).append(run)
    series = []
    for runs in groups.values():
        if len({r.facts["chips"] for r in runs}) < 2:
            continue
        try:
            frame = trace_series(runs, {})
            series.append(analyze_scaling(frame, workload=str(runs[0].facts.get("workload") or "")))
        except (TpuAnalyzeError, ValueError):
            continue
    return series or None


def chips_order(analyses: Sequence[Any]) -> list[int]:
    """Positions of the runs from the smallest slice up (a scaling series reads best that way)."""
    from tpuanalyze.analyzer.compare import run_facts

    chips = [run_facts(a).get("chips") or 0 for a in analyses]
    return sorted(range(len(analyses)), key=lambda i: chips[i])


def _write_json(analyses: Sequence[Any], target: str, series: Sequence[Any] | None = None) -> None:
    from tpuanalyze.analyzer.api import report_json
    from tpuanalyze.reports.view import series_findings

    document = report_json(analyses, series_findings(series or ()))
    text = json.dumps(document, indent=2, allow_nan=False) + "\n"
    if target == "-":
        sys.stdout.write(text)
    else:
        write_output(target, text, "JSON report")
        click.echo(f"wrote {target} (JSON, {len(text.encode()):,} bytes)", err=True)


def _write_html(
    analyses: Sequence[Any], target: Path, show_progress: bool, series: Sequence[Any] | None = None
) -> None:
    from tpuanalyze.reports.html import write_html

    with progress.phase("writing HTML report", enabled=show_progress):
        try:
            size = write_html(analyses, target, scaling_items=series if series is not None else [])
        except OSError as exc:
            raise TpuAnalyzeError(
                f"cannot write the HTML report: {exc.strerror or exc}", str(target)
            ) from exc
    click.echo(f"wrote {target} (HTML, {size / 1e6:.2f} MB, self-contained)", err=True)


@click.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@click.option(
    "--db",
    "db_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Ingest the traces into this database file and keep it (default: a temporary one).",
)
@click.option(
    "--json",
    "json_path",
    type=str,
    default=None,
    metavar="FILE",
    help="Write the JSON report (contract: docs/json.md) to FILE ('-' for stdout).",
)
@click.option(
    "--html",
    "html_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write one self-contained HTML report (works offline) to FILE.",
)
@click.option(
    "--thresholds",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="TOML file overriding analyzer thresholds (shape of analyzer/thresholds.toml).",
)
@click.option(
    "--run",
    "run_selectors",
    multiple=True,
    metavar="NAME|ID",
    help="With a database PATH: report only these runs (repeatable; default all trace runs).",
)
@click.option(
    "--sql",
    "show_sql",
    is_flag=True,
    help="Print each finding's SQL in the terminal summary (rerun it with `tpuanalyze sql --db FILE`).",
)
@click.option(
    "--xprof",
    "with_xprof",
    is_flag=True,
    help="Also run XProf on the same files and show its step time, idle, infeed and all-reduce shares "
    "beside ours (needs the xprof extra, or TPUANALYZE_XPROF_PYTHON).",
)
@click.option("--quiet", "-q", is_flag=True, help="No terminal summary (only the files asked for).")
@click.option(
    "--keep-warmup",
    is_flag=True,
    help="Keep warm-up steps (compilation) in the step statistics; by default they are flagged and left out.",
)
@click.option(
    "--progress/--no-progress",
    "show_progress",
    default=None,
    help="Progress bars on stderr (default: only when stderr is a terminal).",
)
@workers_option
@scheduler_option
@wait_option
def command(
    paths: tuple[Path | str, ...],
    db_path: Path | None,
    json_path: str | None,
    html_path: Path | None,
    thresholds: Path | None,
    run_selectors: tuple[str, ...],
    show_sql: bool,
    with_xprof: bool,
    quiet: bool,
    show_progress: bool | None,
    keep_warmup: bool = False,
    workers: int | None = None,
    scheduler: str | None = None,
) -> None:
    """Analyse traces (or a tpuanalyze database) and report: terminal summary, --html, --json.

    \b
    Examples (from the repository root):
      tpuanalyze report sample_traces/jax_cpu/pmap8_input_bound --html report.html
      tpuanalyze report sample_traces/generated/resnet50_v3-32_baseline sample_traces/jax_cpu/pmap8_train_eval --db runs.duckdb --json report.json
      tpuanalyze report runs.duckdb --sql --html runs.html
    """  # noqa: E501 (example lines are shown as they are typed)
    from tpuanalyze.parsers.remote import is_url

    paths = tuple(p if is_url(p) else Path(p) for p in paths)  # URLs: docs/cluster.md
    _check_exists(paths)
    for target in (json_path, html_path):  # fail before a long analysis, not after it
        if target is not None and str(target) != "-" and not Path(target).resolve().parent.is_dir():
            raise TpuAnalyzeError("cannot write here: no such directory", str(target))
    if thresholds is not None and not thresholds.is_file():
        raise TpuAnalyzeError("no such thresholds file", str(thresholds))
    if thresholds is not None:  # a typo in the file fails before a long ingest, not after it
        from tpuanalyze.analyzer.config import load_thresholds

        load_thresholds(thresholds)
    if with_xprof and any(isinstance(p, str) for p in paths):
        raise TpuAnalyzeError("--xprof reads local files only; give the local path of the traces",
                              next(p for p in paths if isinstance(p, str)))
    if with_xprof:  # before a long analysis: without XProf, one line saying how to get it
        from tpuanalyze.reports.xprof_side import xprof_python

        xprof_python()
    show = progress.resolve_enabled(show_progress)
    databases = [p for p in paths if isinstance(p, Path) and is_duckdb_file(p)]
    if databases:
        if len(paths) > 1:
            raise TpuAnalyzeError("give either one database or trace paths, not both", str(databases[0]))
        if db_path is not None:
            raise TpuAnalyzeError(
                "--db is for ingesting traces; the PATH is already a database", str(db_path)
            )
        if scheduler is not None:
            raise TpuAnalyzeError(
                "--scheduler runs the ingest of traces; the PATH is already a database", str(databases[0])
            )
        analyses, series = analyse(databases[0], None, run_selectors, thresholds, show, with_xprof,
                                   keep_warmup)
        database_note = str(databases[0])
    else:
        if run_selectors:
            raise TpuAnalyzeError("--run selects runs of a database PATH; trace PATHs are all reported")
        with tempfile.TemporaryDirectory(prefix="tpuanalyze-report-") as tmp:
            target = db_path if db_path is not None else Path(tmp) / "report.duckdb"
            from tpuanalyze.analyzer.config import load_thresholds

            config = analysis_config(thresholds, keep_warmup) or load_thresholds()
            # a temporary database need not hold the device op events: the map's results have them
            summary = _ingest(paths, target, show, workers, scheduler, analyze=config,
                              store_op_events=db_path is not None)
            try:
                if db_path is not None and thresholds is not None:
                    # ingest installed the default-threshold views; custom thresholds replace them
                    _install_views(db_path, thresholds)
                analyses, series = analyse(target, list(summary.run_ids), (), thresholds, show, with_xprof,
                                           keep_warmup, source=", ".join(map(str, paths)),
                                           mapped=summary.mapped)
            finally:
                summary.close()
        database_note = str(db_path) if db_path is not None else None
    emit_reports(analyses, json_path, html_path, quiet, show, database_note, series, show_sql)


def emit_reports(
    analyses: Sequence[Any],
    json_path: str | None,
    html_path: Path | None,
    quiet: bool,
    show_progress: bool,
    database: str | None,
    series: Sequence[Any] | None = None,
    show_sql: bool = False,
) -> None:
    """Terminal summary (unless quiet or JSON goes to stdout), then the files.

    ``database`` is the kept database file (None: it was temporary and is gone), so the terminal
    only ever points at a database that exists."""
    from tpuanalyze.reports import terminal

    if not quiet and json_path != "-":
        terminal.print_summary(analyses, series=series or (), database=database, show_sql=show_sql)
        if any("xprof" in a.summary for a in analyses):
            from tpuanalyze.reports.xprof_side import print_xprof

            print_xprof(list(analyses), terminal.make_console(sys.stdout))
        if database is None:
            click.echo(
                "(temporary database; add --db FILE to keep it and rerun the findings' SQL "
                "with `tpuanalyze sql`)",
                err=True,
            )
    if json_path is not None:
        _write_json(analyses, json_path, series)
    if html_path is not None:
        _write_html(analyses, html_path, show_progress, series)
