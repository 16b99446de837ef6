"""Run XProf's own converters on XSpace files and print the numbers ``report --xprof`` shows beside ours.

Standalone on purpose (only json, sys and xprof): it runs in whichever interpreter has xprof installed,
which need not have tpuanalyze. Usage: ``python xprof_probe.py FILE.xplane.pb...``; prints one line
``XPROF_JSON {...}`` (percentages as XProf states them, step time in ms; null where XProf has none).
"""

import json
import sys


def _percent(text):
    try:
        return float(str(text).rstrip("%"))
    except (TypeError, ValueError):
        return None


def _tables(paths, tool):
    from xprof.convert import raw_to_tool_data

    data = raw_to_tool_data.xspace_to_tool_data(paths, tool, {})[0]
    if isinstance(data, bytes):
        data = data.decode("utf-8")
    parsed = json.loads(data) if data else []
    return parsed if isinstance(parsed, list) else [parsed]


def _props(tables, key):
    return next((t.get("p", {}) for t in tables if isinstance(t, dict) and key in t.get("p", {})), {})


def main(paths):
    out = {}
    overview = _tables(paths, "overview_page")
    analysis = _props(overview, "device_duty_cycle_percent")
    out["device_duty_cycle_percent"] = _percent(analysis.get("device_duty_cycle_percent"))
    out["device_idle_time_percent"] = _percent(analysis.get("device_idle_time_percent"))
    env = _props(overview, "device_type")
    out["device_type"] = env.get("device_type")
    out["hardware_type"] = _props(overview, "hardware_type").get("hardware_type")
    pipeline = _props(_tables(paths, "input_pipeline_analyzer"), "steptime_ms_average")
    out["steptime_ms_average"] = _percent(pipeline.get("steptime_ms_average"))
    out["infeed_percent_average"] = _percent(pipeline.get("infeed_percent_average"))
    out["all_reduce_percent"] = None
    try:
        hlo = _tables(paths, "hlo_stats")
    except Exception:  # hlo_stats needs device ops: GPU/CPU captures may have none
        hlo = []
    table = hlo[0] if hlo else {}
    cols = [c.get("id") for c in table.get("cols", [])]
    if "category" in cols and "total_self_time" in cols:
        cat, self_time = cols.index("category"), cols.index("total_self_time")
        rows = [r["c"] for r in table.get("rows", [])]
        total = sum(float(r[self_time]["v"] or 0) for r in rows)
        reduce = sum(float(r[self_time]["v"] or 0) for r in rows if str(r[cat]["v"]).startswith("all-reduce"))
        out["all_reduce_percent"] = 100.0 * reduce / total if total else None
    print("XPROF_JSON" + json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
