"""Pin XProf's numbers for every real capture in ../shared/traces and the bundled captures in
sample_traces/, for tests/test_xprof_beside.py. Each entry records the command that made it.

    TPUANALYZE_XPROF_PYTHON=/root/.cache/tpuanalyze/xprof-venv/bin/python \
        python tests/data/make_xprof_expected.py     # rewrites tests/data/xprof_expected.json

XProf runs through reports/xprof_probe.py on links to the files (tpuanalyze.reports.xprof_side.run_probe),
exactly as `tpuanalyze report --xprof` runs it.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tpuanalyze.reports.xprof_side import PROBE, run_probe, xprof_python

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "traces"
OUT = Path(__file__).with_name("xprof_expected.json")

JAX_CPU = ("pmap8_input_bound", "pmap8_train_eval", "single_jit_train")
# (where: "shared" = ../shared/traces, "sample" = sample_traces/; path): one capture = one run
CAPTURES = [
    *[("shared", f"real/{name}.xplane.pb") for name in (
        "tpu_v6e_4chip_jax_inference", "gpu_v100x8_tf_multiworker", "gpu_mi300x_jax08_attention",
        "gpu_mi300x_jax08_conv", "gpu_mi300x_jax08_elementwise", "gpu_mi300x_jax08_gemm",
        "gpu_mi355x_jax_te_fused_attn")],
    ("shared", "real/gpu_mi300x_jax_conv_rundir"),
    *[("shared", f"jax_cpu/{name}") for name in JAX_CPU],
    *[("sample", f"jax_cpu/{name}") for name in (*JAX_CPU, "single_jit_cold")],
    *[("sample", f"generated/resnet50_v3-32_{name}") for name in (
        "baseline", "host-overhead", "input-bound", "weight-update-unsharded")],
    *[("sample", f"scaling/gnmt_{chips}") for chips in (16, 64, 512)],
]


def files_of(path: Path) -> list[Path]:
    return [path] if path.is_file() else sorted(path.rglob("*.xplane.pb"))


def main() -> None:
    python = xprof_python()
    version = subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version('xprof'))"],
                             capture_output=True, text=True).stdout.strip()
    entries = {}
    for base, rel in CAPTURES:
        folder = SHARED if base == "shared" else ROOT / "sample_traces"
        files = files_of(folder / rel)
        result = run_probe(python, files)
        prefix = "../shared/traces" if base == "shared" else "sample_traces"
        names = " ".join(f"{prefix}/{f.relative_to(folder)}" for f in files)
        entries[f"{base}:{rel}"] = {  # run from the project root; run_probe links the files first
            "command": f"$TPUANALYZE_XPROF_PYTHON {PROBE.relative_to(ROOT)} {names}",
            "xprof": result,
        }
        print(rel, result)
    OUT.write_text(json.dumps({"xprof_version": version, "made_by": "tests/data/make_xprof_expected.py",
                               "captures": entries}, indent=1) + "\n")


if __name__ == "__main__":
    main()
