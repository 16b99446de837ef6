"""The terminal summary of analysed runs (rich): what a person reads first, in 100 columns.

Per run: a header (device, hosts, cores, steps, step time), the breakdown with a bar per category,
the slowest cores and hosts, the top ops, and the findings ranked by estimated gain with their
evidence and catalog technique. On a pipe or file rich drops colors and escape codes by itself;
the width is then fixed at 100 columns so the layout does not depend on the environment.
"""

from __future__ import annotations

import io
import math
import sys
from collections.abc import Sequence
from typing import IO, Any

from rich import box
from rich.console import Console, Group
from rich.padding import Padding
from rich.panel import Panel
from rich.table import Table
from rich.text import Text
from tpuanalyze.reports import view
from tpuanalyze.reports.identity_view import identity_rows
from tpuanalyze.reports.palette import CATEGORY_COLORS

from tpuanalyze.safe_text import plain, safe

WIDTH = 100
BAR_WIDTH = 30
TOP_OPS = 8
WORST = 5
SEVERITY_STYLE = {"high": "bold red", "medium": "bold yellow", "low": "bold blue"}


def make_console(file: IO[str] | None = None, width: int | None = None) -> Console:
    """A console that is 100 columns wide unless told otherwise or on a narrower terminal."""
    console = Console(file=file, highlight=False, soft_wrap=False)
    if width is None:
        width = min(console.width, WIDTH) if console.is_terminal else WIDTH
    console.width = width
    return console


def _bar(share: float, color: str, width: int = BAR_WIDTH) -> Text:
    """A horizontal bar of eighth-blocks, so small shares still show."""
    share = max(0.0, min(1.0, share))
    eighths = round(share * width * 8)
    full, rest = divmod(eighths, 8)
    text = "█" * full + ("" if rest == 0 else " ▏▎▍▌▋▊▉"[rest])
    return Text(text.ljust(width), style=color)


def _num(value: Any, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    return f"{float(value):,.{digits}f}"


def _count(value: Any, noun: str) -> str:
    return f"{view.format_value(value)} {noun}{'' if value == 1 else 's'}"


def header(summary: dict) -> Panel:
    st = summary.get("step_time_ms") or {}
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    rows = identity_rows(summary) or [("device", str(summary.get("device_type") or "unknown"))]
    for label, text in rows:
        grid.add_row(label, safe(text))  # workload labels come from the trace: data, not markup
    grid.add_row(
        "hosts / cores", f"{_count(summary.get('hosts'), 'host')} · {_count(summary.get('devices'), 'core')}"
    )
    grid.add_row("steps", view.format_value(summary.get("steps")))
    grid.add_row("step time", view.step_time_text(summary) if st else "no steps found")
    overlapped = summary.get("collectives_overlapped")
    if isinstance(overlapped, (int, float)) and overlapped:
        grid.add_row("overlapped", f"{overlapped:.1%} of wall time is collectives hidden under compute")
    for note in summary.get("notes") or []:
        grid.add_row("note", Text(plain(note), style="yellow"))
    for warning in view.capture_warnings(summary):
        grid.add_row(
            "capture", Text(plain(f"{warning.get('code')}: {warning.get('message')}"), style="bold yellow")
        )
    title = Text(f"run {plain(summary.get('run', '?'))}", style="bold")
    return Panel(grid, title=title, title_align="left", box=box.ROUNDED)


def breakdown_table(summary: dict, steps: Any, per_core: Any = None) -> Table:
    table = Table(
        title="Where the time goes (of wall: share of the devices' wall time; ms per train step)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    table.add_column("category", no_wrap=True)
    table.add_column("of wall", justify="right")
    table.add_column("ms/step", justify="right")
    table.add_column("cores min-max", justify="right")
    table.add_column("", no_wrap=True)
    for row in view.breakdown_rows(summary, steps, per_core):
        spread = "–"
        if row.min_share is not None and row.max_share is not None:
            spread = f"{row.min_share:.1%}-{row.max_share:.1%}"
        table.add_row(
            f"  └ {row.label}" if row.part_of else row.label,
            f"{row.share:6.1%}",
            _num(row.ms_per_step),
            spread,
            _bar(row.share, CATEGORY_COLORS[row.category]),
        )
    return table


def programs_table(summary: dict) -> Table | None:
    """The programs (XLA modules) a trace runs, when there are several: which one is the step."""
    rows = view.program_rows(summary)
    if not rows:
        return None
    table = Table(title="Programs (XLA modules; the step series is one program)", title_justify="left",
                  box=box.SIMPLE_HEAD, pad_edge=False)
    for name, justify in (("program", "left"), ("runs/device", "right"), ("median ms", "right"),
                          ("min-max ms", "right"), ("total ms/device", "right"), ("", "left")):
        table.add_column(name, justify=justify)
    for p in rows:
        role = "step" if p.get("is_step_program") else "eval" if p.get("is_eval") else ""
        table.add_row(str(p.get("program")), view.format_value(p.get("executions_per_device")),
                      view.format_ms(p.get("median_ms")),
                      f"{view.format_ms(p.get('min_ms'))}-{view.format_ms(p.get('max_ms'))}",
                      view.format_ms(p.get("total_ms_per_device")), role)
    return table


def worst_table(title: str, rows: Any, keys: list[str]) -> Table | Text | None:
    """Cores/hosts by own time (step minus exposed collective wait): a straggler comes first."""
    if rows is None or len(rows) < 2:  # one host or core: nothing to compare
        return None
    if float(rows["vs_median"].abs().max()) < 0.005:
        return Text(f"{title}: all within 0.5% of the median (no straggler)\n")
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for key in keys:
        table.add_column("core" if key == "device_ordinal" else key, overflow="fold")
    table.add_column("step ms", justify="right")
    table.add_column("own ms", justify="right")
    table.add_column("vs median", justify="right")
    table.add_column("most above median")
    for record in rows.to_dict("records"):
        vs = record.get("vs_median")
        table.add_row(
            *[safe(record[k]) for k in keys],
            _num(record["step_time_ms"]),
            _num(record.get("own_ms")),
            "–" if vs is None or vs != vs else f"{vs:+.1%}",
            safe(record.get("largest_excess") or ""),
        )
    return table


def ops_table(ops: Any) -> Table | None:
    if ops is None or ops.empty:
        return None
    top = ops.sort_values("self_time_ms", ascending=False).head(TOP_OPS)
    table = Table(
        title=f"Top {len(top)} ops by self time (of ops: share of the ops' time inside steps; roof: achieved "
        "share of the roofline the op is bound by)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    # the op's name is in its category's color (the palette), so no category column is needed
    table.add_column("op", overflow="ellipsis", no_wrap=True, min_width=12, max_width=21)
    table.add_column("framework op · source", overflow="ellipsis", no_wrap=True, min_width=12, max_width=26)
    for name in ("self ms", "of ops", "FLOP/B"):
        table.add_column(name, justify="right", no_wrap=True, min_width=len(name))
    table.add_column("bound", no_wrap=True, min_width=6)
    table.add_column("roof", justify="right", no_wrap=True, min_width=4)
    for record in top.to_dict("records"):
        share = record.get("share")
        achieved = record.get("achieved_fraction")
        table.add_row(
            Text(plain(record.get("name")), style=CATEGORY_COLORS.get(str(record.get("category")), "")),
            safe(view.framework_text(record, short_source=True)),
            view.format_ms(record.get("self_time_ms")),
            "–" if not view.is_number(share) else f"{share:.1%}",
            view.format_intensity(record.get("operational_intensity")),
            str(record.get("bound_by") or "–"),
            "–" if not view.is_number(achieved) else f"{achieved:.0%}",
        )
    return table


def roofline_line(roofline: dict | None) -> Text | None:
    """One line: the whole program on the roofline, and the roofs it was measured against."""
    if not roofline:
        return None
    if not roofline.get("peak_tflops"):
        return Text("Roofline: unknown (the trace states no peak FLOP/s or HBM bandwidth for its device)\n")
    programs = roofline.get("programs") or []
    total = next((p for p in programs if p.get("program") == "all programs"), None)
    source = "trace" if roofline.get("source") == "trace" else "catalog §2"
    roofs = (f"roofs per core: {roofline['peak_tflops']:,.1f} TFLOP/s, {roofline['peak_hbm_gbps']:,.0f} GB/s "
             f"HBM, ridge {roofline['ridge_flops_per_byte']:,.1f} FLOPs/byte ({source})")
    if total is None or not total.get("bound_by"):
        return Text(f"Roofline: no op with FLOPs or bytes; {roofs}\n")
    achieved = total.get("achieved_fraction")
    share = f", {achieved:.0%} of that roof" if view.is_number(achieved) else ""
    counts = roofline.get("ops_by_bound") or {}
    ops = ", ".join(f"{n} {kind}-bound" for kind, n in sorted(counts.items()))
    return Text(
        f"Roofline: all programs {view.format_intensity(total.get('operational_intensity'))} FLOPs/byte, "
        f"{total['bound_by']} bound{share}; ops: {ops or 'none'}; {roofs}\n"
    )


def reproduce_text(n_queries: int, database: str | None, show_sql: bool) -> str:
    """Where a finding's SQL can be rerun: only ever a database that still exists."""
    queries = f"{n_queries} SQL quer{'y' if n_queries == 1 else 'ies'}"
    where = "below" if show_sql else "(--sql prints them)"
    if database:
        return f"{queries} {where}; rerun with `tpuanalyze sql --db {database} QUERY`"
    return f"{queries} {where}; the database was temporary: add --db FILE to keep one to rerun them on"


def findings_block(
    findings: list[view.FindingView],
    title: str = "Findings, by estimated gain",
    database: str | None = None,
    show_sql: bool = False,
) -> Group | Text:
    """Root causes numbered 1, 2, ...; a finding another one explains sits indented under it (1.1, ...)
    with its gain counted under the cause."""
    if not findings:
        return Text("Findings: none (no catalog rule fired)", style="bold")
    parts: list[Any] = [Text(title, style="bold underline")]
    for finding in findings:
        head = Text(f"{'└ ' if finding.depth else ''}{finding.label}. ")
        head.append(plain(finding.rule), style="bold")
        head.append(f"  [{finding.severity}]", style=SEVERITY_STYLE.get(finding.severity, "bold"))
        if finding.caused_by:
            head.append(f"  caused by {finding.caused_by}", style="magenta")
        head.append(f"  gain {finding.gain_text}", style="green")
        if finding.depth:  # wrapped lines of an explained finding stay indented under its cause
            line = Table.grid()
            line.add_column(width=4 * finding.depth)
            line.add_column(ratio=1, overflow="fold")
            line.add_row("", head)
            parts.append(line)
        else:
            parts.append(head)
        grid = Table.grid(padding=(0, 1))
        grid.add_column(width=3 + 4 * finding.depth)
        grid.add_column(style="dim", width=15)
        grid.add_column(ratio=1, overflow="fold")
        grid.add_row("", "evidence", safe(finding.evidence_text or "–"))
        if finding.evidence_items:
            grid.add_row("", "measured", safe("; ".join(f"{k} {v}" for k, v in finding.evidence_items)))
        grid.add_row("", "recommendation", safe(finding.recommendation or "–"))
        if finding.catalog:
            grid.add_row("", "catalog", safe(finding.catalog))
        if finding.sql:
            grid.add_row("", "reproduce", reproduce_text(len(finding.sql), database, show_sql))
        parts.append(grid)
        if finding.sql and show_sql:
            for query in finding.sql:
                parts.append(Padding(Text(query.strip(), style="cyan"), (0, 0, 0, 4)))
    return Group(*parts)


def render_run(console: Console, analysis: Any, database: str | None = None, show_sql: bool = False) -> None:
    summary = analysis.summary
    steps = getattr(analysis, "steps", None)
    console.print(header(summary))
    console.print(breakdown_table(summary, steps, getattr(analysis, "per_core", None)))
    programs = programs_table(summary)
    if programs is not None:
        console.print(programs)
    for title, frame, keys in (
        (
            "Slowest cores (own ms = step minus exposed collective wait)",
            "per_core",
            ["host", "device_ordinal"],
        ),
        ("Slowest hosts (their slowest core)", "per_host", ["host"]),
    ):
        rows = view.worst_rows(steps, keys, WORST, fallback=getattr(analysis, frame, None),
                               keep_warmup=view.warmup_kept(summary))
        table = worst_table(title, rows, keys)
        if table is not None:
            console.print(table)
    ops = ops_table(getattr(analysis, "ops", None))
    if ops is not None:
        console.print(ops)
    roofline = roofline_line(summary.get("roofline"))
    if roofline is not None:
        console.print(roofline)
    findings = view.ranked_findings(view.run_findings(analysis))
    console.print(findings_block(findings, database=database, show_sql=show_sql))


def render_runs(
    analyses: Sequence[Any],
    console: Console | None = None,
    series: Sequence[Any] = (),
    database: str | None = None,
    show_sql: bool = False,
) -> None:
    """Print every run's summary; several runs get a one-line-per-run overview first, and a scaling
    series (``ScalingAnalysis`` objects) its cross-run findings (scaling-limit, catalog §3.13)."""
    console = console or make_console()
    if len(analyses) > 1:
        console.print(overview_table(analyses))
    scaling = view.ranked_findings(view.series_findings(series))
    if scaling:
        console.print(
            findings_block(scaling, "Scaling across runs: findings, by estimated gain", database, show_sql)
        )
        console.print()
    for position, analysis in enumerate(analyses):
        if position:
            console.rule()
        render_run(console, analysis, database, show_sql)


def overview_table(analyses: Sequence[Any]) -> Table:
    """One line per run; long run names are cut here (each run's own header below has it in full)."""
    table = Table(
        title=f"{len(analyses)} runs (compute, coll., input: shares of the devices' wall time)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    table.add_column("run", no_wrap=True, overflow="ellipsis", max_width=30, min_width=12)
    table.add_column("device", no_wrap=True, overflow="ellipsis", max_width=11)
    for name in ("cores", "step ms", "compute", "coll.", "input"):
        table.add_column(name, justify="right", no_wrap=True, min_width=len(name))
    table.add_column("top finding", no_wrap=True, overflow="ellipsis", max_width=22)
    for analysis in analyses:
        summary = analysis.summary
        breakdown = summary.get("breakdown") or {}
        findings = view.ranked_findings(view.run_findings(analysis))
        table.add_row(
            safe(summary.get("run")),
            safe(summary.get("device_type") or ""),
            view.format_value(summary.get("devices")),
            view.format_ms((summary.get("step_time_ms") or {}).get("mean")),
            f"{float(breakdown.get('compute') or 0):.0%}",
            f"{float(breakdown.get('collectives') or 0):.0%}",
            f"{float(breakdown.get('input') or 0):.0%}",
            safe(findings[0].rule) if findings else "none",
        )
    return table


def render_text(
    analyses: Sequence[Any],
    width: int = WIDTH,
    series: Sequence[Any] = (),
    database: str | None = None,
    show_sql: bool = False,
) -> str:
    """The summary as plain text (no escape codes, no trailing blanks), for pipes, files and tests."""
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, highlight=False, no_color=True, force_terminal=False)
    render_runs(analyses, console, series, database, show_sql)
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines()) + "\n"


def print_summary(
    analyses: Sequence[Any],
    file: IO[str] | None = None,
    series: Sequence[Any] = (),
    database: str | None = None,
    show_sql: bool = False,
) -> None:
    """Colors and the terminal's width (up to 100) on a terminal; plain 100-column text otherwise."""
    stream = file or sys.stdout
    if getattr(stream, "isatty", None) and stream.isatty():
        render_runs(analyses, make_console(stream), series, database, show_sql)
    else:
        stream.write(render_text(analyses, series=series, database=database, show_sql=show_sql))
        stream.flush()
