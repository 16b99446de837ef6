"""``report --xprof``: XProf's own numbers beside ours, on the same trace files.

XProf (the ``xprof`` package, the optional extra ``pip install 'tpuanalyze[xprof]'``) runs in a
subprocess: the interpreter running tpuanalyze when it imports xprof, else the one named by
``TPUANALYZE_XPROF_PYTHON``. The subprocess runs ``reports/xprof_probe.py`` (XProf's ``overview_page``,
``input_pipeline_analyzer`` and ``hlo_stats`` converters) on symbolic links to the run's ``.xplane.pb``
files in a scratch folder, because XProf caches its analysis (``ALL_HOSTS.op_stats_v2.pb``) beside the
files it reads and shares that cache among every file of the folder: links keep the user's trace
folders untouched and one run's cache from answering for another.

Shown beside ours (docs/json.md, ``xprof``): step time, device idle (XProf: 100% - duty cycle), infeed
share of the step, all-reduce share of device op time. A difference over 5 points (step time: 5% of
ours) is flagged.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from tpuanalyze.errors import TpuAnalyzeError

XPROF_PYTHON_ENV = "TPUANALYZE_XPROF_PYTHON"
PROBE = Path(__file__).with_name("xprof_probe.py")
INSTALL_HINT = ("report --xprof needs XProf: pip install 'tpuanalyze[xprof]' "
                f"(or set {XPROF_PYTHON_ENV} to a python that has the xprof package)")
FLAG_POINTS = 5.0  # a difference over 5 points (of the step or of device time) is flagged
TIMEOUT_S = 600


def xprof_python() -> str:
    """The interpreter that runs XProf: ours when it imports xprof, else $TPUANALYZE_XPROF_PYTHON."""
    if importlib.util.find_spec("xprof") is not None:
        return sys.executable
    named = os.environ.get(XPROF_PYTHON_ENV)
    if named and Path(named).is_file():
        probe = subprocess.run([named, "-c", "import xprof.convert.raw_to_tool_data"], capture_output=True,
                               timeout=120)
        if probe.returncode == 0:
            return named
        raise TpuAnalyzeError(f"{XPROF_PYTHON_ENV}={named} cannot import xprof; {INSTALL_HINT}")
    raise TpuAnalyzeError(INSTALL_HINT)


def probe_command(files: list[str]) -> str:
    """The command that produces XProf's numbers for these files (shown in the report, used by tests)."""
    return f"python {PROBE.name} " + " ".join(files)


def run_probe(python: str, files: list[Path]) -> dict[str, Any]:
    """XProf's numbers for one run's XSpace files (``{"error": ...}`` when XProf fails on them)."""
    with tempfile.TemporaryDirectory(prefix="tpuanalyze-xprof-") as tmp:
        links = []
        for i, path in enumerate(files):
            link = Path(tmp) / f"{i}_{path.name}"
            link.symlink_to(Path(path).resolve())
            links.append(str(link))
        try:
            proc = subprocess.run([python, str(PROBE), *links], capture_output=True, text=True,
                                  timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return {"error": f"XProf took longer than {TIMEOUT_S} s"}
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("XPROF_JSON")), None)
    if line is None:
        last = next((ln for ln in reversed(proc.stderr.strip().splitlines()) if ln.strip()), "no output")
        return {"error": f"XProf failed: {last[:200]}"}
    return json.loads(line[len("XPROF_JSON"):])


def _ours(analysis: Any) -> dict[str, float | None]:
    """Our numbers in XProf's terms: mean train step, idle share of device time, input share of train
    step time, all-reduce share of op self time."""
    summary = analysis.summary
    steps = analysis.steps
    train = steps[~steps["is_eval"].astype(bool)] if steps is not None and not steps.empty else None
    step_ps = float(train["duration_ps"].sum()) if train is not None and len(train) else 0.0
    ops = analysis.ops
    total = float(ops["self_time_ms"].sum()) if ops is not None and not ops.empty else 0.0
    reduce = float(ops.loc[ops["kind"] == "all-reduce", "self_time_ms"].sum()) if total else 0.0
    return {
        "step_time_ms": (summary.get("step_time_ms") or {}).get("mean"),
        "idle_percent": 100.0 * float((summary.get("breakdown") or {}).get("idle", 0.0)),
        "infeed_percent": 100.0 * float(train["input_ps"].sum()) / step_ps if step_ps else None,
        "all_reduce_percent": 100.0 * reduce / total if total else None,
    }


def beside(analysis: Any, xprof: dict[str, Any], command: str) -> dict[str, Any]:
    """The ``xprof`` object of a run's JSON summary: each metric ours / XProf's / difference / flagged."""
    out: dict[str, Any] = {"command": command, "metrics": [], "flagged": [], "notes": []}
    if "error" in xprof:
        out["notes"].append(xprof["error"])
        return out
    out["device_type"] = xprof.get("device_type")
    ours = _ours(analysis)
    theirs: dict[str, float | None] = {
        "step_time_ms": xprof.get("steptime_ms_average") or None,  # XProf writes 0.00 for "no steps"
        "idle_percent": xprof.get("device_idle_time_percent"),
        "infeed_percent": xprof.get("infeed_percent_average"),
        "all_reduce_percent": xprof.get("all_reduce_percent"),
    }
    if xprof.get("hardware_type") == "CPU_ONLY":
        theirs["idle_percent"] = None
        out["notes"].append("XProf reports no device time for a CPU-only capture: idle not compared")
    if theirs["step_time_ms"] is None:
        out["notes"].append("XProf measured no step time on this capture")
    labels = {"step_time_ms": "step time (ms)", "idle_percent": "device idle (%)",
              "infeed_percent": "infeed (% of step)", "all_reduce_percent": "all-reduce (% of op time)"}
    for key, label in labels.items():
        a, b = ours[key], theirs[key]
        diff = a - b if a is not None and b is not None else None
        if key == "step_time_ms":
            points = 100.0 * abs(diff) / a if diff is not None and a else None
        else:
            points = abs(diff) if diff is not None else None
        flagged = points is not None and points > FLAG_POINTS
        out["metrics"].append({"metric": key, "label": label, "ours": a, "xprof": b, "difference": diff,
                               "flagged": flagged})
        if flagged:
            out["flagged"].append(key)
    return out


def attach(con: Any, run_ids: list[int], analyses: list[Any]) -> None:
    """Run XProf on each run's files and put the comparison in ``summary["xprof"]``."""
    python = xprof_python()
    for run_id, analysis in zip(run_ids, analyses, strict=True):
        fmt = con.execute("SELECT source_format FROM runs WHERE run_id = ?", [int(run_id)]).fetchone()
        files = [Path(r[0]) for r in con.execute(
            "SELECT file_path FROM hosts WHERE run_id = ? ORDER BY host", [int(run_id)]).fetchall()]
        if not fmt or fmt[0] != "xspace":
            analysis.summary["xprof"] = {"command": None, "metrics": [], "flagged": [], "notes": [
                "XProf reads XSpace (.xplane.pb) files; this run is not one"]}
            continue
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            analysis.summary["xprof"] = {"command": None, "metrics": [], "flagged": [],
                                         "notes": [f"trace file gone since ingest: {missing[0]}"]}
            continue
        result = run_probe(python, files)
        analysis.summary["xprof"] = beside(analysis, result, probe_command([str(f) for f in files]))


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def xprof_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows for the HTML/terminal tables: label, ours, XProf's, difference (text), flagged."""
    block = summary.get("xprof") or {}
    return [{"label": m["label"], "ours": _fmt(m["ours"]), "xprof": _fmt(m["xprof"]),
             "difference": "–" if m["difference"] is None else f"{m['difference']:+.2f}",
             "flagged": m["flagged"],
             "flag_text": _flag_text(m)} for m in block.get("metrics", [])]


def _flag_text(metric: dict[str, Any]) -> str:
    if not metric["flagged"]:
        return ""
    return "over 5%" if metric["metric"] == "step_time_ms" else "over 5 points"


def print_xprof(analyses: list[Any], console: Any) -> None:
    """One table per run: ours beside XProf's, differences over 5 points marked."""
    from rich import box
    from rich.table import Table

    from tpuanalyze.safe_text import safe as escape  # markup and control characters

    for analysis in analyses:
        block = analysis.summary.get("xprof")
        if block is None:
            continue
        table = Table(title=f"XProf beside ours: {escape(str(analysis.summary.get('run')))}",
                      title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
        for name in ("metric", "ours", "XProf", "difference", ""):
            table.add_column(name, justify="left" if name in ("metric", "") else "right")
        for row in xprof_rows(analysis.summary):
            table.add_row(row["label"], row["ours"], row["xprof"], row["difference"], row["flag_text"])
        console.print(table)
        for note in block.get("notes", []):
            console.print(f"  note: {escape(note)}")
