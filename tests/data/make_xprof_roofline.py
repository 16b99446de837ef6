"""Write xprof_roofline.json: XProf's own roofline bound-by per op and program for the bundled captures.

Run with an interpreter that has xprof (the independent reader), from the repository root:

    $TPUANALYZE_XPROF_PYTHON tests/data/make_xprof_roofline.py [path/to/tpu_v6e_....xplane.pb]

It calls ``xprof.convert.raw_to_tool_data.xspace_to_tool_data([file], "roofline_model", {})`` on a
copy of each file in a folder of its own (XProf caches its analysis per folder) and keeps, per op
(the "Total" rows with infeed/outfeed included), XProf's "Bound by" and operational intensity, plus
the device's peaks. tests/test_roofline.py compares tpuanalyze's roofline with this file.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

from xprof.convert import raw_to_tool_data

ROOT = Path(__file__).resolve().parents[2]
OUT = Path(__file__).with_name("xprof_roofline.json")


def roofline(path: Path) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / path.name
        shutil.copyfile(path, copy)
        data, _ = raw_to_tool_data.xspace_to_tool_data([str(copy)], "roofline_model", {})
    tables = json.loads(data)
    table = tables[0]
    cols = [c["id"] for c in table["cols"]]
    ops, programs = {}, {}
    for row in table["rows"]:
        values = dict(zip(cols, [cell.get("v") if cell else None for cell in row["c"]], strict=False))
        if values["step"] != "Total" or not values["include_infeed_outfeed"]:
            continue
        entry = {"bound_by": values["bound_by"], "operational_intensity": values["operational_intensity"],
                 "roofline_efficiency": values["roofline_efficiency"], "category": values["category"]}
        if values["category"] == "Program":
            programs[str(values["hlo_module_id"])] = entry
        else:
            ops[values["operation"]] = entry
    props = table.get("p", {})
    return {"device_type": props.get("device_type"),
            "peak_flop_rate_gflops": float(props["peak_flop_rate"]),
            "peak_hbm_bw_gibps": float(props["peak_hbm_bw"]),
            "hbm_ridge_point": float(props["hbm_ridge_point"]),
            "programs": programs, "ops": ops}


def main(extra: list[str]) -> None:
    files = sorted((ROOT / "sample_traces").rglob("*.xplane.pb"))
    result = {str(p.relative_to(ROOT)): roofline(p) for p in files}
    for name in extra:
        result[Path(name).name] = roofline(Path(name))
    OUT.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(f"wrote {OUT} ({len(result)} files)")


if __name__ == "__main__":
    main(sys.argv[1:])
