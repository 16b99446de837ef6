"""The roofline: each op's and program's operational intensity against the device's peaks.

Operational intensity = FLOPs / bytes accessed (HBM). The ridge point = peak FLOP/s / peak HBM
bytes/s: an op left of it is memory bound (at best it streams at the HBM bandwidth), right of it
compute bound (at best it runs at the peak FLOP rate). The achieved fraction is the op's rate
against the roof it is bound by: bytes/s over the bandwidth when memory bound, FLOP/s over the peak
when compute bound (XProf's "roofline efficiency", the same formula).

Peaks come from the device planes' stats (``peak_teraflops_per_second``,
``peak_hbm_bw_gigabytes_per_second``, as XProf reads them); a TPU v3 trace without them gets the
catalog's per-core figures (catalog §2: 123 TFLOP/s and ~900 GB/s per chip of 2 cores); any other
device without them has no roofline (bound-by unknown).

The halves of an async transfer (category ``memory_transfer``: ``copy-start`` / ``copy-done``, a
host-offload transfer) have no roofline: the ``bytes_accessed`` XLA gives them is the whole copy, charged
to a nanoseconds-long start or to a done that waits on a link (PCIe/DMA for host offload) rather than
streaming HBM, so the HBM roof would read 549,609x for the start and 2% for the wait (the v6e capture).
XProf rates them anyway; this is where the two tools differ on purpose.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import duckdb
import numpy as np
import pandas as pd

# catalog §2: TPU v3 chip = 2 TensorCores, 123 TFLOP/s bf16 and ~900 GB/s HBM per chip; a device
# plane is one core.
TPU_V3_PER_CORE = {"peak_tflops": 61.5, "peak_hbm_gbps": 450.0}


@dataclass(frozen=True)
class Peaks:
    """One device's roofs (None when unknown) and where they come from."""

    peak_tflops: float | None
    peak_hbm_gbps: float | None
    source: str  # "trace" (device-plane stats), "catalog TPU v3" or "unknown"

    @property
    def known(self) -> bool:
        return bool(self.peak_tflops and self.peak_hbm_gbps)

    @property
    def ridge(self) -> float | None:
        """FLOPs per byte where the memory roof meets the compute roof."""
        return self.peak_tflops * 1e12 / (self.peak_hbm_gbps * 1e9) if self.known else None

    def to_json(self) -> dict[str, Any]:
        return {"peak_tflops": self.peak_tflops, "peak_hbm_gbps": self.peak_hbm_gbps,
                "ridge_flops_per_byte": self.ridge, "source": self.source}


def device_peaks(con: duckdb.DuckDBPyConnection, run_id: int, device_type: str | None) -> Peaks:
    """The device planes' stated peaks (the largest, if planes differ), else the TPU v3 catalog figures."""
    row = con.execute(
        "SELECT max(peak_tflops), max(peak_hbm_bw_gbps), any_value(device_type) FROM planes "
        "WHERE run_id = ? AND device_ordinal IS NOT NULL AND kind IN ('tpu', 'gpu')",
        [int(run_id)],
    ).fetchone()
    tflops, gbps, plane_type = row if row else (None, None, None)
    if tflops and gbps and tflops > 0 and gbps > 0:
        return Peaks(float(tflops), float(gbps), "trace")
    kind = str(plane_type or device_type or "").strip().lower()
    if kind in ("tpu v3", "tpu_v3", "tpuv3"):
        return Peaks(TPU_V3_PER_CORE["peak_tflops"], TPU_V3_PER_CORE["peak_hbm_gbps"], "catalog TPU v3")
    return Peaks(None, None, "unknown")


def _roofline_columns(flops: pd.Series, bytes_: pd.Series, time_ps: pd.Series,
                      peaks: Peaks) -> pd.DataFrame:
    flops = pd.to_numeric(flops, errors="coerce").astype("float64")
    bytes_ = pd.to_numeric(bytes_, errors="coerce").astype("float64")
    seconds = pd.to_numeric(time_ps, errors="coerce").astype("float64") / 1e12
    has_cost = (bytes_ > 0) | (flops > 0)
    intensity = (flops.fillna(0) / bytes_.where(bytes_ > 0)).where(bytes_ > 0)
    intensity = intensity.where(~((bytes_.fillna(0) <= 0) & (flops > 0)), np.inf)  # FLOPs, no bytes
    out = pd.DataFrame({"operational_intensity": intensity}, index=flops.index)
    out["flop_rate_tflops"] = (flops / seconds.where(seconds > 0)) / 1e12
    out["hbm_gbps"] = (bytes_ / seconds.where(seconds > 0)) / 1e9
    if not peaks.known:
        out["bound_by"] = None
        out["achieved_fraction"] = np.nan
        return out
    compute = intensity >= peaks.ridge
    bound = pd.Series(np.where(compute, "compute", "memory"), index=flops.index, dtype="object")
    out["bound_by"] = bound.where(has_cost & intensity.notna(), None)
    achieved = np.where(compute, out["flop_rate_tflops"] / peaks.peak_tflops,
                        out["hbm_gbps"] / peaks.peak_hbm_gbps)
    out["achieved_fraction"] = pd.Series(achieved, index=flops.index).where(out["bound_by"].notna())
    return out


def add_roofline(ops: pd.DataFrame, peaks: Peaks) -> pd.DataFrame:
    """The ops frame with operational_intensity, flop_rate_tflops, hbm_gbps, bound_by, achieved_fraction."""
    if ops.empty:
        return ops.assign(operational_intensity=pd.Series(dtype="float64"),
                          flop_rate_tflops=pd.Series(dtype="float64"), hbm_gbps=pd.Series(dtype="float64"),
                          bound_by=pd.Series(dtype="object"), achieved_fraction=pd.Series(dtype="float64"))
    columns = _roofline_columns(ops["flops"], ops["bytes_accessed"], ops["self_time_ms"] * 1e9, peaks)
    if "category" in ops.columns:  # async transfer halves: no roof (module docstring)
        transfer = (ops["category"] == "memory_transfer").to_numpy()
        columns.loc[transfer, ["operational_intensity", "flop_rate_tflops", "hbm_gbps",
                               "achieved_fraction"]] = np.nan
        columns["bound_by"] = columns["bound_by"].astype("object").where(~transfer, None)
    return pd.concat([ops.drop(columns=[c for c in columns.columns if c in ops.columns]), columns], axis=1)


def programs_roofline(ops: pd.DataFrame, peaks: Peaks) -> pd.DataFrame:
    """One row per program (hlo_module) plus the whole run ('all programs'), over ops with a known cost."""
    columns = ["program", "self_time_ms", "flops", "bytes_accessed", "operational_intensity",
               "flop_rate_tflops", "hbm_gbps", "bound_by", "achieved_fraction"]
    if ops.empty:
        return pd.DataFrame(columns=columns)
    data = ops.assign(program=ops["hlo_module"].fillna("(no program)").astype(str))
    data = data[(data["flops"].fillna(0) > 0) | (data["bytes_accessed"].fillna(0) > 0)]
    if "category" in data.columns:
        data = data[data["category"] != "memory_transfer"]
    if data.empty:
        return pd.DataFrame(columns=columns)
    grouped = data.groupby("program", as_index=False)[["self_time_ms", "flops", "bytes_accessed"]].sum()
    total = pd.DataFrame([{"program": "all programs", **grouped[["self_time_ms", "flops",
                                                                  "bytes_accessed"]].sum().to_dict()}])
    frame = pd.concat([total, grouped.sort_values("self_time_ms", ascending=False)], ignore_index=True)
    roof = _roofline_columns(frame["flops"], frame["bytes_accessed"], frame["self_time_ms"] * 1e9, peaks)
    return pd.concat([frame, roof], axis=1)[columns]


def roofline_summary(ops: pd.DataFrame, programs: pd.DataFrame, peaks: Peaks,
                     top: int = 10) -> dict[str, Any]:
    """The JSON contract's ``roofline`` object (docs/json.md)."""
    def records(frame: pd.DataFrame, keys: list[str]) -> list[dict[str, Any]]:
        out = []
        for row in frame[keys].to_dict("records"):
            out.append({k: (None if isinstance(v, float) and not np.isfinite(v) else v)
                        for k, v in row.items()})
        return out

    op_keys = ["name", "hlo_module", "category", "self_time_ms", "flops", "bytes_accessed",
               "operational_intensity", "bound_by", "achieved_fraction"]
    with_cost = ops[ops["bound_by"].notna()] if "bound_by" in ops.columns else ops.iloc[0:0]
    counts = with_cost["bound_by"].value_counts().to_dict() if not with_cost.empty else {}
    return {
        **peaks.to_json(),
        "programs": records(programs, list(programs.columns)) if not programs.empty else [],
        "ops_by_bound": {k: int(v) for k, v in counts.items()},
        "top_ops": records(with_cost.sort_values("self_time_ms", ascending=False).head(top), op_keys)
        if not with_cost.empty else [],
    }
