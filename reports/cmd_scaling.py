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
from tpuanalyze.analyzer.compare import LoadedRun, check_comparable, step_categories_ms
from tpuanalyze.analyzer.scaling import CATEGORIES, ScalingAnalysis, analyze_scaling, link_traces_and_logs
from tpuanalyze.reports.cmd_mlperf import wide_console
from tpuanalyze.reports.options import wait_option
from tpuanalyze.reports.output import check_output_paths, write_output
from tpuanalyze.store.database import open_database, require_runs_table

from tpuanalyze.errors import TpuAnalyzeError
from tpuanalyze.pipeline.runs import RunLoader
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


def parse_projections(values: tuple[str, ...]) -> list[tuple[int, int | None]]:
    """``--project N[:BATCH]`` values: chips, optionally the global batch at that scale."""
    out: list[tuple[int, int | None]] = []
    for value in values:
        chips, sep, batch = str(value).partition(":")
        if not chips.isdigit() or int(chips) <= 0 or (sep and (not batch.isdigit() or int(batch) <= 0)):
            raise TpuAnalyzeError(f"--project takes N or N:BATCH (positive integers), got '{value}'")
        out.append((int(chips), int(batch) if sep else None))
    return out


def _override_for(spec: str, overrides: dict[str, int]) -> int | None:
    candidates = {spec, spec.rstrip("/"), Path(spec).name, str(Path(spec).resolve())}
    for key, chips in overrides.items():
        if key in candidates or Path(key).name == Path(spec.rstrip("/")).name:
            return chips
    return None


def _check_overrides_used(overrides: dict[str, int], specs: list[str], runs: list[LoadedRun]) -> None:
    """Every --chips RUN=N names a run given (a typo would otherwise leave the trace's count in place)."""
    for key in overrides:
        if any(_override_for(spec, {key: 1}) for spec in specs):
            continue
        if any(key in (run.name, run.label) for run in runs):
            continue
        known = ", ".join(sorted({run.label for run in runs})[:6])
        raise TpuAnalyzeError(f"--chips {key}=N names no run given (runs: {known})")


def trace_series(runs: list[LoadedRun], overrides: dict[str, int], allow_mixed: bool = False) -> pd.DataFrame:
    """The scaling table of analyzed trace runs (one workload on one platform; chips from the trace or
    --chips). Runs of different workloads or platforms are refused unless ``allow_mixed``."""
    check_comparable(runs, allow_mixed)
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
    return frame.sort_values("chips", kind="stable", ignore_index=True)


def _fmt(value, spec: str = "{:.3f}") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return spec.format(value)


def render_time_to_train(analysis: ScalingAnalysis, console: Console) -> None:
    """An MLPerf series through the time-to-train model: measured, projections, limits, remedies."""
    ttt = analysis.time_to_train or {}
    title = f"{analysis.workload or 'scaling'}  (time to train)"
    measured = Table(title=f"{title}: measured (logs)")
    for name in ("run", "chips", "batch", "per core", "P", "epochs", "steps", "step ms [est]", "eval s",
                 "time to train s", "examples/s per core", "efficiency"):
        measured.add_column(name, justify="left" if name == "run" else "right")
    for row in analysis.measured.to_dict(orient="records"):
        measured.add_row(safe(str(row["run"])), str(int(row["chips"])), _fmt(row["global_batch"], "{:.0f}"),
                         _fmt(row["per_core_batch"], "{:g}"), str(int(row["partition"])),
                         _fmt(row["epochs"], "{:.1f}"), _fmt(row["steps"], "{:.0f}"),
                         _fmt(row["step_time_ms"], "{:.2f}"), _fmt(row["eval_s"], "{:.1f}"),
                         _fmt(row["time_to_train_s"], "{:.1f}"),
                         _fmt(row["per_core_examples_per_s"], "{:.1f}"),
                         _fmt(row["per_core_throughput_rel"], "{:.1%}"))
    console.print(measured)
    step = ttt.get("step", {})
    per_example = ", ".join(f"{1e3 * v:.4f} ms/example (P={p})"
                            for p, v in step.get("c_s_per_example", {}).items())
    epochs = ttt.get("epochs", {})
    console.print(f"model: {ttt.get('model')}\n  step near the largest run: c = {per_example}, "
                  f"d = {1e3 * step.get('d_s', float('nan')):.3f} ms ({safe(str(step.get('d_source')))}); "
                  f"epochs(batch) logged at {epochs.get('batches')}: {epochs.get('epochs')}; "
                  f"examples per epoch {ttt.get('examples_per_epoch')}")
    projection = Table(title="projection (ESTIMATES from the time-to-train model, not measurements)")
    for name in ("chips", "batch", "per core", "P", "epochs", "step ms", "eval s", "time to train s",
                 "error (LOO)", "efficiency"):
        projection.add_column(name, justify="right")
    notes: dict[str, int] = {}
    for row in analysis.projection.to_dict(orient="records"):
        label = f"{int(row['chips'])}" + ("" if row["measured"] else " (est)")
        source = row["epochs_source"] if not row["epochs_source"].startswith("logged") else ""
        batch_note = "" if row["batch_source"] in ("logged at these chips", "given") else row["batch_source"]
        marks = ""
        for note in (source, batch_note):
            if note:
                marks += f"[{notes.setdefault(note, len(notes) + 1)}]"
        projection.add_row(label, f"{row['global_batch']}{marks}", _fmt(row["per_core_batch"], "{:g}"),
                           str(row["partition"]), _fmt(row["epochs_est"], "{:.1f}"),
                           _fmt(row["step_time_ms_est"], "{:.2f}"), _fmt(row["eval_s_est"], "{:.1f}"),
                           _fmt(row["time_to_train_s_est"], "{:.1f}"), _fmt(row["error_est"], "±{:.1%}"),
                           _fmt(row["per_core_throughput_rel_est"], "{:.1%}"))
    console.print(projection)
    for note, number in notes.items():
        console.print(f"  [{number}] {safe(note)}")
    holdout = analysis.holdout or {}
    if "relative_error" in holdout:
        console.print(f"held-out check (estimate): fitted on {holdout['fitted_on_chips']} chips, predicts "
                      f"{holdout['predicted']:.1f} s at {holdout['chips']} chips "
                      f"(batch {holdout['global_batch']}, "
                      f"epochs {holdout['epochs_used']:.2f} {holdout['epochs_source']}) vs logged "
                      f"{holdout['measured']:.1f} s ({holdout['relative_error']:+.1%})")
    _render_limits(analysis, console)
    _render_joined(analysis, console)


def _render_limits(analysis: ScalingAnalysis, console: Console) -> None:
    limits = analysis.limits
    if not limits:
        return
    passes = limits["fixed_passes_compute_chips"]
    smallest = int(analysis.measured["chips"].min())
    where = ("no chip count up to 4M chips" if not passes else
             f"{smallest} chips already (the smallest run)" if passes <= smallest else f"~{passes} chips")
    console.print(
        f"[bold]limit (estimate)[/bold]: global batch capped at {limits['convergence_cap_batch']} -> "
        f"data parallelism runs out at ~{limits['data_parallel_limit_chips']} chips (1 example per core, "
        f"catalog §3.1); all-reduce + update + overhead pass compute at {where}")
    for remedy in limits["remedies"]:
        saved = remedy.get("gain_s", remedy.get("gain_ms"))
        if saved is not None and saved <= 0:
            gain = "no gain"
        elif "gain_s" in remedy:
            gain = f"{remedy['gain_s']:.1f} s = {remedy['fraction']:.1%} of time to train"
        else:
            gain = f"{remedy['gain_ms']:.3f} ms = {_fmt(remedy['fraction'], '{:.1%}')} of the step"
        console.print(f"  {remedy['remedy']} (catalog §{remedy['catalog']}) at {remedy['at_chips']} "
                      f"chips: {gain} ({safe(remedy['model'])}; estimate)")


def _render_trace_time_to_train(analysis: ScalingAnalysis, console: Console) -> None:
    """A trace series placed in the time-to-train model of the MLPerf series of its workload."""
    ttt = analysis.time_to_train
    if not ttt:
        return
    table = Table(title=f"time to train from these traces with {safe(ttt['from_logs'])}'s "
                        "epochs(batch) and evals (ESTIMATES)")
    for name in ("chips", "batch", "epochs", "step ms", "time to train s", "error (LOO, logs)"):
        table.add_column(name, justify="right")
    for row in ttt["projection"]:
        table.add_row(str(row["chips"]) + ("" if row["batch_source"] == "given" else " (est)"),
                      str(row["global_batch"]), _fmt(row["epochs_est"], "{:.1f}"),
                      _fmt(row["step_time_ms_est"], "{:.2f}"), _fmt(row["time_to_train_s_est"], "{:.1f}"),
                      _fmt(row["error_est"], "±{:.1%}"))
    console.print(table)
    _render_joined(analysis, console)


def _render_joined(analysis: ScalingAnalysis, console: Console) -> None:
    if not analysis.joined:
        return
    table = Table(title="trace runs beside the MLPerf result of the same workload and chips")
    for name in ("trace run", "chips", "trace step ms", "logged step ms [est]", "logged steps",
                 "time to train from trace s [est]", "logged time to train s", "difference"):
        table.add_column(safe(name), justify="left" if name == "trace run" else "right")
    for row in analysis.joined:
        table.add_row(safe(str(row["trace_run"])), str(row["chips"]), _fmt(row["trace_step_ms"], "{:.2f}"),
                      _fmt(row["logged_step_ms_est"], "{:.2f}"), _fmt(row["logged_steps"], "{:.0f}"),
                      _fmt(row["time_to_train_from_trace_s_est"], "{:.1f}"),
                      _fmt(row["logged_time_to_train_s"], "{:.1f}"), _fmt(row["difference"], "{:+.1%}"))
    console.print(table)


def render(analysis: ScalingAnalysis, console: Console) -> None:
    """Measured runs, fits, projections (estimates), held-out check and findings of one series."""
    if analysis.model is not None:
        render_time_to_train(analysis, console)
        return
    metric, unit = analysis.metric, analysis.unit
    categories = [c for c in CATEGORIES if c in analysis.measured]
    title = f"{safe(analysis.workload or 'scaling')}  ({analysis.batch_mode})"
    measured = Table(title=f"{title}: measured")
    # "[ms]" would be rich markup: the unit and the share's base are spelled out instead
    for name in ["run", "chips", f"{metric}"] + [f"{c} {unit} · of step" for c in categories] + \
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
    for name in ["chips", f"{metric} est", "error"] + [f"{c} of step" for c in shares] + ["efficiency est"]:
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
    _render_limits(analysis, console)
    _render_trace_time_to_train(analysis, console)
    for finding in analysis.findings:
        gain = finding["estimated_gain"]
        console.print(f"[bold]{finding['rule']}[/bold] ({finding['severity']}): "
                      f"{safe(finding['evidence']['summary'])}"
                      f"\n  recommendation (catalog §{finding['catalog']}): {finding['recommendation']}\n"
                      f"  estimated gain: {gain['ms']:.3f} {unit} per step = {gain['fraction']:.1%} "
                      f"({gain['model']}; estimate)")


def mlperf_analyses(paths: list[Path], db_path: Path | None,
                    projections: list[tuple[int, int | None]] | None = None) -> list[ScalingAnalysis]:
    """Time to train vs chips per (version, benchmark, framework) series of MLPerf results."""
    from tpuanalyze.analyzer.mlperf_summary import scaling_series, summarize_db

    from tpuanalyze.pipeline.mlperf import summarize_paths

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
    return [analyze_scaling(frame, metric="time_to_train_s", workload=f"MLPerf {name}",
                            project_to=projections)
            for name, frame in series.items()]


def _by_workload(runs: list[LoadedRun]) -> list[list[LoadedRun]]:
    """Runs grouped by workload and platform; runs whose workload or platform is unknown stay alone."""
    from tpuanalyze.analyzer.identity import comparable_key

    groups: dict[object, list[LoadedRun]] = {}
    for run in runs:
        key = comparable_key(run.facts.get("identity") or {})
        groups.setdefault(key if key is not None else ("unknown", run.run_id), []).append(run)
    return list(groups.values())


def _db_trace_runs(db_path: Path) -> list[str]:

    con = open_database(db_path, read_only=True)
    try:
        require_runs_table(con, db_path)
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
@click.option("--project", "project", multiple=True, metavar="N[:BATCH]",
              help="Also project to N chips, optionally at global batch BATCH (repeatable); 2x, 4x and 8x "
                   "the largest run are always shown.")
@click.option("--json", "json_path", type=click.Path(path_type=Path), default=None, help="Write JSON here.")
@click.option("--html", "html_path", type=click.Path(path_type=Path), default=None,
              help="Write a self-contained HTML page with the charts here.")
@click.option("--allow-mixed", "allow_mixed", is_flag=True,
              help="Fit runs of different workloads or platforms as one series anyway (with a warning).")
@wait_option
def command(paths: tuple[str, ...], db_path: Path | None, chips: tuple[str, ...], project: tuple[str, ...],
            json_path: Path | None, html_path: Path | None, allow_mixed: bool) -> None:
    """Scaling across runs of one workload at different chip counts (traces, DB runs or MLPerf logs).

    \b
    Examples (from the repository root):
      tpuanalyze scaling sample_traces/scaling --html scaling.html
      tpuanalyze scaling sample_traces/scaling/gnmt_16 sample_traces/scaling/gnmt_64 --project 1024 --json scaling.json
    """  # noqa: E501 (example lines are shown as they are typed)
    if db_path is not None and not db_path.exists():
        raise TpuAnalyzeError("no such database", str(db_path))
    check_output_paths(json_path, html_path)
    overrides = _parse_overrides(chips)
    projections = parse_projections(project)
    mlperf_paths = [Path(p) for p in paths if _is_mlperf(Path(p))]
    trace_specs = [p for p in paths if not _is_mlperf(Path(p))]
    if not paths and db_path is not None:
        trace_specs = _db_trace_runs(db_path)
    if not paths and db_path is None:
        raise TpuAnalyzeError("scaling needs at least 2 runs (trace paths, DB:RUN, --db, or MLPerf logs)")

    analyses: list[ScalingAnalysis] = []
    lone: list[pd.DataFrame] = []
    db_only = db_path is not None and not paths
    if mlperf_paths:
        analyses.extend(mlperf_analyses(mlperf_paths, None, projections))
    if db_only:
        try:
            analyses.extend(mlperf_analyses([], db_path, projections))
        except TpuAnalyzeError:
            pass  # MLPerf results at one chip count each: the trace runs may still form series
    if trace_specs:
        with RunLoader(db_path) as loader:
            runs: list[LoadedRun] = []
            for spec in trace_specs:
                runs.extend(loader.load(spec, _override_for(spec, overrides)))
            _check_overrides_used(overrides, trace_specs, runs)
            if len(runs) < 2 and not db_only and not mlperf_paths:
                raise TpuAnalyzeError(f"scaling needs at least 2 runs, got {len(runs)}", trace_specs[0])
            # a whole database: one series per workload measured at 2+ chip counts
            groups = _by_workload(runs) if db_only else [runs]
            if not db_only:
                for warning in check_comparable(runs, allow_mixed):
                    click.echo(f"tpuanalyze: warning: {warning}", err=True)
            # a single run forms no series, but stands beside a logged result (MLPerf paths or --db)
            frames = [trace_series(group, overrides, allow_mixed) for group in groups
                      if len(group) >= 2 or db_only or mlperf_paths]
        for frame in frames:
            if frame["chips"].nunique() < 2 and (db_only or mlperf_paths):
                lone.append(frame)  # one chip count: no series, but it can stand beside a logged result
                continue
            workload = next((str(w) for w in frame["workload"].dropna()), "")
            analyses.append(analyze_scaling(frame.drop(columns=["workload"]), workload=workload,
                                            project_to=projections))
    if not analyses:
        raise TpuAnalyzeError("no workload measured at 2 or more chip counts", str(db_path or ""))
    link_traces_and_logs(analyses, lone)
    console = wide_console()
    for analysis in analyses:
        render(analysis, console)
    if json_path is not None:
        from tpuanalyze.analyzer.api import json_header

        document = {**json_header(), "series": [a.to_json() for a in analyses]}
        write_output(json_path, json.dumps(document, indent=2, default=str), "JSON")
    if html_path is not None:
        from tpuanalyze.reports.scaling_charts import scaling_html

        write_output(html_path, scaling_html(analyses), "HTML page")
