"""``tpuanalyze scaling PATH...``: one workload at several chip counts (traces, DB runs or MLPerf logs):
time per step by category vs chips, efficiency, fitted models, projections and scaling-limit findings."""

from __future__ import annotations

import json
import math
from pathlib import Path

import click
import pandas as pd
from rich.console import Console
from rich.table import Table
from tpuanalyze.analyzer.compare import LoadedRun, RunLoader, step_categories_ms
from tpuanalyze.analyzer.scaling import CATEGORIES, ScalingAnalysis, analyze_scaling
from tpuanalyze.reports.cmd_mlperf import wide_console
from tpuanalyze.reports.options import wait_option
from tpuanalyze.store.database import open_database

from tpuanalyze.errors import TpuAnalyzeError
from tpuanalyze.safe_text import safe


def _is_mlperf(path: Path) -> bool:
    from tpuanalyze.parsers.mlperf import is_mlperf_log

    if path.is_file():
        return is_mlperf_log(path)
    if path.is_dir():
        if next(path.rglob("*.xplane.pb"), None) is not None:
            return False
        return any(is_mlperf_log(p) for p in path.rglob("result_*.txt"))
    return False


def _parse_overrides(values: tuple[str, ...]) -> dict[str, int]:
    overrides: dict[str, int] = {}
    for value in values:
        run, sep, chips = value.rpartition("=")
        if not sep or not run or not chips.isdigit() or int(chips) <= 0:
            raise TpuAnalyzeError(f"--chips takes RUN=N with N a positive chip count, got '{value}'")
        overrides[run] = int(chips)
    return overrides


def _override_for(spec: str, overrides: dict[str, int]) -> int | None:
    candidates = {spec, spec.rstrip("/"), Path(spec).name, str(Path(spec).resolve())}
    for key, chips in overrides.items():
        if key in candidates or Path(key).name == Path(spec.rstrip("/")).name:
            return chips
    return None


def trace_series(runs: list[LoadedRun], overrides: dict[str, int]) -> pd.DataFrame:
    """The scaling table of analyzed trace runs (one workload; chips from the trace or --chips)."""
    rows = []
    for run in runs:
        chips = overrides.get(run.name) or overrides.get(run.label) or run.facts.get("chips")
        if not chips:
            raise TpuAnalyzeError("cannot tell the chip count of this run: pass --chips RUN=N", run.label)
        row = {"run": run.label, "run_id": run.run_id, "chips": int(chips), "cores": run.facts.get("cores"),
               "per_core_batch": run.facts.get("per_core_batch"),
               "global_batch": run.facts.get("global_batch"), "workload": run.facts.get("workload")}
        row.update(step_categories_ms(run.analysis))
        row.pop("collectives_overlapped", None)
        rows.append(row)
    frame = pd.DataFrame(rows)
    workloads = frame["workload"].dropna().astype(str)
    if workloads.nunique() > 1:
        mixed = "; ".join(f"{w}: {', '.join(frame.loc[frame['workload'] == w, 'run'])}"
                          for w in workloads.unique())
        raise TpuAnalyzeError(f"runs mix workloads ({mixed}); scaling compares one workload at several "
                              "chip counts")
    return frame.sort_values("chips", kind="stable", ignore_index=True)


def _fmt(value, spec: str = "{:.3f}") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return spec.format(value)


def render(analysis: ScalingAnalysis, console: Console) -> None:
    """Measured runs, fits, projections (estimates), held-out check and findings of one series."""
    metric, unit = analysis.metric, analysis.unit
    categories = [c for c in CATEGORIES if c in analysis.measured]
    title = f"{safe(analysis.workload or 'scaling')}  ({analysis.batch_mode})"
    measured = Table(title=f"{title}: measured")
    for name in ["run", "chips", f"{metric}"] + [f"{c} [{unit}] share" for c in categories] + \
            ["efficiency", "speedup"]:
        measured.add_column(name, justify="left" if name == "run" else "right")
    for row in analysis.measured.to_dict(orient="records"):
        measured.add_row(safe(str(row["run"])), str(int(row["chips"])), _fmt(row[metric]),
                         *[f"{row[c]:.3f} {row[f'{c}_share']:.1%}" for c in categories],
                         _fmt(row["per_core_throughput_rel"], "{:.1%}"), _fmt(row["speedup"], "{:.2f}x"))
    console.print(measured)

    fits = Table(title="fitted model per category (best of constant, a+b/N, a+b log2 N, a+b sqrt N, "
                       "a+b N, a N^b)")
    for name in ("category", "form", "model", "in-sample rms", "leave-one-out rms"):
        fits.add_column(name, justify="left" if name in ("category", "form", "model") else "right")
    for category, fit in analysis.fits.items():
        fits.add_row(category, fit.form, fit.formula, _fmt(fit.rms_error, "{:.4f}"),
                     _fmt(fit.loo_error, "{:.4f}"))
    console.print(fits)

    projection = Table(title="projection (ESTIMATES from the fitted model, not measurements)")
    shares = [c for c in categories if f"{c}_share_est" in analysis.projection]
    for name in ["chips", f"{metric} est", "error"] + [f"{c} share" for c in shares] + ["efficiency est"]:
        projection.add_column(name, justify="right")
    for row in analysis.projection.to_dict(orient="records"):
        label = f"{int(row['chips'])}" + ("" if row["measured"] else " (est)")
        projection.add_row(label, _fmt(row[f"{metric}_est"]), _fmt(row["error_est"], "±{:.1%}"),
                           *[_fmt(row[f"{c}_share_est"], "{:.1%}") for c in shares],
                           _fmt(row["per_core_throughput_rel_est"], "{:.1%}"))
    console.print(projection)
    if analysis.crossovers:
        smallest = int(analysis.measured["chips"].iloc[0])
        console.print("time above compute's (model, estimate): " + ", ".join(
            (f"{c} already at {smallest} chips" if n <= smallest else f"{c} from ~{int(round(n))} chips")
            if n else f"{c} never (up to 4M chips)" for c, n in analysis.crossovers.items()))
    if analysis.growing:
        console.print(f"category growing in share: [bold]{analysis.growing}[/bold]")
    holdout = analysis.holdout
    if holdout and "relative_error" in holdout:
        console.print(f"held-out check: fitted on {holdout['fitted_on_chips']} chips, predicts "
                      f"{holdout['predicted']:.3f} {unit} at {holdout['chips']} chips vs measured "
                      f"{holdout['measured']:.3f} ({holdout['relative_error']:+.1%})")
    for finding in analysis.findings:
        gain = finding["estimated_gain"]
        console.print(f"[bold]{finding['rule']}[/bold] ({finding['severity']}): "
                      f"{safe(finding['evidence']['summary'])}"
                      f"\n  recommendation (catalog §{finding['catalog']}): {finding['recommendation']}\n"
                      f"  estimated gain: {gain['ms']:.3f} {unit} per step = {gain['fraction']:.1%} "
                      f"({gain['model']}; estimate)")


def mlperf_analyses(paths: list[Path], db_path: Path | None) -> list[ScalingAnalysis]:
    """Time to train vs chips per (version, benchmark, framework) series of MLPerf results."""
    from tpuanalyze.analyzer.mlperf_summary import scaling_series, summarize_db, summarize_paths

    frames = [summarize_paths(paths)] if paths else []
    if db_path is not None:

        con = open_database(db_path, read_only=True)
        try:
            frames.append(summarize_db(con))
        finally:
            con.close()
    summary = pd.concat(frames, ignore_index=True).drop_duplicates("folder") if frames else pd.DataFrame()
    if summary.empty:
        return []
    series = scaling_series(summary)
    if not series:
        raise TpuAnalyzeError("MLPerf results hold each benchmark at one chip count only; scaling needs "
                              "2 or more", str(paths[0]) if paths else str(db_path))
    return [analyze_scaling(frame, metric="time_to_train_s", workload=f"MLPerf {name}")
            for name, frame in series.items()]


def _by_workload(runs: list[LoadedRun]) -> list[list[LoadedRun]]:
    groups: dict[str, list[LoadedRun]] = {}
    for run in runs:
        groups.setdefault(str(run.facts.get("workload") or ""), []).append(run)
    return list(groups.values())


def _db_trace_runs(db_path: Path) -> list[str]:

    con = open_database(db_path, read_only=True)
    try:
        return [str(r[0]) for r in con.execute(
            "SELECT run_id FROM runs WHERE source_format <> 'mlperf' ORDER BY run_id").fetchall()]
    finally:
        con.close()


@click.command()
@click.argument("paths", nargs=-1)
@click.option("--db", "db_path", type=click.Path(path_type=Path), default=None,
              help="Database with the runs (PATHs may then be run ids or names; none = every run).")
@click.option("--chips", "chips", multiple=True, metavar="RUN=N",
              help="Chip count of a run when its trace does not say (repeatable).")
@click.option("--project", "project", multiple=True, type=int, metavar="N",
              help="Also project to N chips (repeatable); 2x, 4x and 8x the largest run are always shown.")
@click.option("--json", "json_path", type=click.Path(path_type=Path), default=None, help="Write JSON here.")
@click.option("--html", "html_path", type=click.Path(path_type=Path), default=None,
              help="Write a self-contained HTML page with the charts here.")
@wait_option
def command(paths: tuple[str, ...], db_path: Path | None, chips: tuple[str, ...], project: tuple[int, ...],
            json_path: Path | None, html_path: Path | None) -> None:
    """Scaling across runs of one workload at different chip counts (traces, DB runs or MLPerf logs)."""
    if db_path is not None and not db_path.exists():
        raise TpuAnalyzeError("no such database", str(db_path))
    overrides = _parse_overrides(chips)
    mlperf_paths = [Path(p) for p in paths if _is_mlperf(Path(p))]
    trace_specs = [p for p in paths if not _is_mlperf(Path(p))]
    if not paths and db_path is not None:
        trace_specs = _db_trace_runs(db_path)
    if not paths and db_path is None:
        raise TpuAnalyzeError("scaling needs at least 2 runs (trace paths, DB:RUN, --db, or MLPerf logs)")

    analyses: list[ScalingAnalysis] = []
    db_only = db_path is not None and not paths
    if mlperf_paths:
        analyses.extend(mlperf_analyses(mlperf_paths, None))
    if db_only:
        try:
            analyses.extend(mlperf_analyses([], db_path))
        except TpuAnalyzeError:
            pass  # MLPerf results at one chip count each: the trace runs may still form series
    if trace_specs:
        with RunLoader(db_path) as loader:
            runs: list[LoadedRun] = []
            for spec in trace_specs:
                runs.extend(loader.load(spec, _override_for(spec, overrides)))
            if len(runs) < 2 and not db_only:
                raise TpuAnalyzeError(f"scaling needs at least 2 runs, got {len(runs)}", trace_specs[0])
            # a whole database: one series per workload measured at 2+ chip counts
            groups = _by_workload(runs) if db_only else [runs]
            frames = [trace_series(group, overrides) for group in groups]
        for frame in frames:
            if db_only and frame["chips"].nunique() < 2:
                continue
            workload = next((str(w) for w in frame["workload"].dropna()), "")
            analyses.append(analyze_scaling(frame.drop(columns=["workload"]), workload=workload,
                                            project_to=list(project)))
    if not analyses:
        raise TpuAnalyzeError("no workload measured at 2 or more chip counts", str(db_path or ""))
    console = wide_console()
    for analysis in analyses:
        render(analysis, console)
    if json_path is not None:
        json_path.write_text(json.dumps({"series": [a.to_json() for a in analyses]}, indent=2, default=str))
    if html_path is not None:
        from tpuanalyze.reports.scaling_charts import scaling_html

        html_path.write_text(scaling_html(analyses), encoding="utf-8")
