"""What a run ran on and what it did, from the trace itself: platform family and generation, training or
inference. Findings word their advice for the platform found and keep training advice to training runs.

Platform comes from the device planes' own type (``device_type_string`` stats, ``/device:TPU:N`` or
``/device:GPU:N`` planes, GPU kernels of a Kineto trace) and, for GPUs, the plane's vendor and compute
capability stats. Training is recognised by what only training executes: optimizer / weight-update ops
(the ``weight_update`` category), gradient and backward ops, training programs and step annotations
(``patterns.training`` in analyzer/thresholds.toml). A trace without any of them is treated as inference.
"""

from __future__ import annotations

import re
from typing import Any

import duckdb
from tpuanalyze.analyzer.classify import sql_literal

FAMILIES = ("TPU", "GPU", "CPU")
_TPU_RE = re.compile(r"tpu\s*v?(\d+)\s*(lite|e|p)?", re.IGNORECASE)
# TPU generations whose chips form a 3-D torus over ICI (v4, v5p); the others (v2, v3, v5e, v6e) a 2-D one
TORUS_3D = {"v4", "v5p"}


def tpu_generation(device_type: str | None) -> str | None:
    """'TPU v3' -> 'v3', 'TPU v6 Lite' -> 'v6e', 'TPU v5 lite' -> 'v5e', 'TPU v5p' -> 'v5p'."""
    match = _TPU_RE.search(device_type or "")
    if not match:
        return None
    suffix = (match.group(2) or "").lower()
    return f"v{match.group(1)}" + {"lite": "e", "e": "e", "p": "p"}.get(suffix, "")


def family_of(device_type: str | None) -> str | None:
    """TPU / GPU / CPU from the run's device type (docs/json.md `device_type`); None when unknown."""
    text = (device_type or "").upper()
    for family in FAMILIES:
        if family in text:
            return family
    return None


def _gpu_identity(con: duckdb.DuckDBPyConnection, run_id: int) -> tuple[str | None, str | None]:
    """(vendor, generation) of the GPU planes: device_vendor stat (AMD writes it), else NVIDIA when the
    plane has CUDA compute-capability stats or the trace launches CUDA kernels."""
    row = con.execute(
        "SELECT any_value(json_extract_string(stats, '$.device_vendor')),"
        "       any_value(json_extract_string(stats, '$.compute_cap_major')),"
        "       any_value(json_extract_string(stats, '$.compute_cap_minor'))"
        " FROM planes WHERE run_id = ? AND kind = 'gpu'", [int(run_id)]
    ).fetchone()
    vendor, major, minor = row if row else (None, None, None)
    generation = f"compute capability {major}.{minor}" if major is not None else None
    if vendor:
        return str(vendor), generation
    if major is not None:
        return "NVIDIA", generation
    cuda = con.execute(
        "SELECT count(*) FROM events WHERE run_id = ? AND (name LIKE 'cuda%' OR name LIKE 'nccl%')",
        [int(run_id)]).fetchone()[0]
    return ("NVIDIA" if cuda else None), generation


def _training_evidence(con: duckdb.DuckDBPyConnection, run_id: int, rel: dict[str, str],
                       config: dict[str, Any]) -> str | None:
    """A short statement of what shows training, or None."""
    updates = con.execute(
        f"SELECT count(*), any_value(short_name) FROM {rel['att_ops']} WHERE category = 'weight_update'"
    ).fetchone()
    if updates and updates[0]:
        return f"{updates[0]:,} optimizer/weight-update ops (e.g. {updates[1]})"
    pattern = sql_literal(config["patterns"]["training"])
    row = con.execute(  # the pattern runs once per distinct name, not per event
        f"SELECT sum(n), any_value(name) FROM (SELECT name, count(*) AS n FROM events WHERE run_id = ?"
        f" GROUP BY name) WHERE regexp_matches(name, {pattern})", [int(run_id)]).fetchone()
    if row and row[0]:
        return (f"{row[0]:,} training events (gradients, backward, optimizer or train steps; "
                f"e.g. {row[1][:60]})")
    return None


def detect_platform(con: duckdb.DuckDBPyConnection, run_id: int, rel: dict[str, str], device_type: str | None,
                    config: dict[str, Any]) -> dict[str, Any]:
    """The JSON `platform` object (docs/json.md): family, generation, vendor, mode, mode_evidence."""
    family = family_of(device_type)
    vendor = generation = None
    if family == "TPU":
        vendor, generation = "Google", tpu_generation(device_type)
    elif family == "GPU":
        vendor, generation = _gpu_identity(con, run_id)
    evidence = _training_evidence(con, run_id, rel, config)
    return {
        "family": family,
        "generation": generation,
        "vendor": vendor,
        "mode": "training" if evidence else "inference",
        "mode_evidence": evidence or "no optimizer, gradient, backward or train-step events in the trace",
    }
