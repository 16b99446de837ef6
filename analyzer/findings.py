"""Catalog findings (design.md rule ids) from a RunAnalysis.

Each finding: rule, severity (high/medium/low), evidence {summary, metrics, sql}, recommendation (the
catalog §3 technique), catalog (section), estimated_gain {ms, fraction, label: "estimate", model}.
Thresholds come from analyzer/thresholds.toml (sections cited there and below). Evidence SQL runs
against the database's attribution views (``install_views``; docs/attribution.md) and reproduces the
measured numbers. ``scaling-limit`` is cross-run (analyzer/scaling.py), not evaluated here.
"""

from __future__ import annotations

import re
from typing import Any

import pandas as pd
from tpuanalyze.analyzer.api import RunAnalysis

SEVERITY_ORDER = {"high": 0, "medium": 1, "low": 2}

RECOMMENDATIONS = {  # catalog §3: (section, technique text)
    "input-bound": (
        "3.8",
        "Scale the host input pipeline: per-host sharding, parallel interleave, cache decoded records, "
        "fused decode-and-crop, host-side space-to-depth, prefetch and background infeed threads so the "
        "next batch is on the device before the step needs it.",
    ),
    "host-input-processing": (
        "3.8",
        "Host decode/augmentation bounds the step: cache decoded records, fuse decode-and-crop, "
        "parallelize map/interleave across host cores, move space-to-depth to the host, or add input hosts.",
    ),
    "outfeed-bound": (
        "3.10",
        "Reduce per-step outfeed: keep metrics on the device (sum on device, outfeed once per loop), drop "
        "per-example predictions/summaries from the training step, run eval metrics asynchronously.",
    ),
    "collective-bound": (
        "3.3",
        "Make the gradient all-reduce cheaper and hidden: a 2-D torus schedule (reduce-scatter on X, "
        "all-reduce on Y, all-gather on X) with two concurrent schedules over ICI, overlapped with "
        "backward, instead of a ring or the DCN.",
    ),
    "f32-gradient-allreduce": (
        "3.4",
        "Sum gradients in bf16: halves the all-reduce bytes (2 x params instead of 4), about 2x on the "
        "bandwidth term.",
    ),
    "latency-bound-collectives": (
        "3.5",
        "Combine small all-reduces into a few large buckets and overlap them with backward (async "
        "start/done), so the per-op latency term stops dominating; check the batch-norm group mapping "
        "onto the torus (§3.6).",
    ),
    "weight-update-unsharded": (
        "3.2",
        "Shard the weight update: reduce-scatter the gradients, update 1/N of the weights on each "
        "replica, all-gather the weights (replaces one all-reduce).",
    ),
    "eval-overhead": (
        "3.10",
        "Distribute evaluation over all cores (padded even per-host batches, metrics summed on device) "
        "and overlap or run it asynchronously (e.g. COCO eval off the critical path).",
    ),
    "host-overhead": (
        "3.7",
        "Run the training loop on the device: iterations_per_loop (TF) or a device while-loop with "
        "per-step infeed (JAX), so the host does not launch every step.",
    ),
    "data-parallel-limit": (
        "3.1",
        "Global batch is capped below the core count: use model parallelism / spatial partitioning "
        "(SPMD) so each core gets a larger slice, instead of more data-parallel replicas.",
    ),
    "partition-overhead": (
        "3.1",
        "Halo exchanges (collective-permute) dominate: use fewer partitions per replica, partition along "
        "the dimension with the smallest halo, or overlap the exchange with compute.",
    ),
    "data-formatting": (
        "3.9",
        "Use space-to-depth for the first convolution and MXU-friendly layouts (NHWC / batch-minor) so "
        "device-side copies and transposes disappear.",
    ),
    "straggler": (
        "3.8",
        "A slow host or core holds every other core in the collectives: find the worst host (infeed max "
        "vs average, all-reduce sync time) and fix its input pipeline or hardware; balance per-host "
        "input sharding.",
    ),
}


def severity(value: float | None, medium: float, high: float | None = None) -> str | None:
    """'high' at/above high, 'medium' at/above medium, else None (rule not triggered)."""
    if value is None or value != value:
        return None
    if high is not None and value >= high:
        return "high"
    if value >= medium:
        return "medium"
    return None


def gain(ms: float, step_ms: float, model: str) -> dict[str, Any]:
    ms = max(float(ms), 0.0)
    return {"ms": round(ms, 4), "fraction": round(ms / step_ms, 4) if step_ms else None,
            "label": "estimate", "model": model}


class _Ctx:
    """Measured quantities the rules share (all per train device-step unless said otherwise)."""

    def __init__(self, a: RunAnalysis, run_id: int) -> None:
        self.a = a
        self.run_id = run_id
        train = a.steps[~a.steps["is_eval"]] if not a.steps.empty else a.steps
        self.train = train
        self.n = len(train)
        self.step_ps = float(train["duration_ps"].sum()) if self.n else 0.0
        self.step_ms = self.step_ps / self.n / 1e9 if self.n else 0.0
        self.frac = {}
        self.ms = {}
        for c in ("compute", "weight_update", "collectives", "input", "output", "idle", "eval",
                  "collectives_overlapped"):
            total = float(train[f"{c}_ps"].sum()) if self.n else 0.0
            self.frac[c] = total / self.step_ps if self.step_ps else 0.0
            self.ms[c] = total / self.n / 1e9 if self.n else 0.0
        self.first_conv_ms: float | None = None
        self.coll = a.collectives.set_index("kind") if not a.collectives.empty else pd.DataFrame()
        # wall time per device (steps, eval and gaps) and the reported step count, for wall-time rules
        self.wall_ms = float(a.per_core["wall_ms"].mean()) if not a.per_core.empty else 0.0
        self.n_steps = max(a.summary.get("steps") or 1, 1)

    def coll_value(self, kind: str, column: str, default: float = 0.0) -> float:
        if self.coll.empty or kind not in self.coll.index:
            return default
        value = self.coll.at[kind, column]
        return default if value is None or value != value else float(value)

    def sql_steps(self, select: str) -> str:
        return f"SELECT {select}\nFROM step_breakdown\nWHERE run_id = {self.run_id} AND NOT is_eval"


def _finding(rule: str, sev: str, summary: str, metrics: dict[str, Any], sql: str,
             gain_: dict[str, Any]) -> dict[str, Any]:
    section, text = RECOMMENDATIONS[rule]
    return {
        "rule": rule,
        "severity": sev,
        "evidence": {"summary": summary, "metrics": {k: _round(v) for k, v in metrics.items()}, "sql": sql},
        "recommendation": text,
        "catalog": section,
        "estimated_gain": gain_,
    }


def _round(v: Any) -> Any:
    return round(v, 6) if isinstance(v, float) else v


def _input_bound(c: _Ctx, t: dict) -> list[dict]:  # catalog §3.8, §4: input 5% / 20%
    th = t["input_bound"]
    sev = severity(c.frac["input"], th["medium"], th["high"])
    if not sev:
        return []
    inp = c.a.input
    metrics = {"input_fraction_of_step": c.frac["input"], "input_ms_per_step": c.ms["input"],
               "step_ms": c.step_ms}
    if not inp.empty:
        metrics["infeed_ms_per_step_mean"] = float(inp["infeed_ms_per_step"].mean())
        metrics["infeed_ms_per_step_max"] = float(inp["infeed_ms_per_step"].max())
    return [_finding(
        "input-bound", sev,
        f"exposed input wait is {c.frac['input']:.1%} of train step time ({c.ms['input']:.3f} ms of "
        f"{c.step_ms:.3f} ms per step)",
        metrics,
        c.sql_steps("sum(input_ps) / sum(duration_ps) AS input_fraction_of_step,\n"
                    "       sum(input_ps) / count(*) / 1e9 AS input_ms_per_step"),
        gain(c.ms["input"], c.step_ms, "exposed input wait removed once the host pipeline keeps up "
             "(catalog §3.8); upper bound"),
    )]


def _host_input_processing(c: _Ctx, t: dict, host_input: dict[str, float] | None) -> list[dict]:
    th = t["host_input_processing"]  # catalog §3.8: host non-enqueue work >= 50% of input time
    if not host_input or c.frac["input"] < th["min_input_fraction"]:
        return []
    total = host_input["enqueue_ms"] + host_input["non_enqueue_ms"]
    if total <= 0:
        return []
    share = host_input["non_enqueue_ms"] / total
    if share < th["non_enqueue_share"]:
        return []
    sev = "high" if c.frac["input"] >= t["input_bound"]["high"] else "medium"
    sql = (f"SELECT sum(duration_ps) FILTER (WHERE NOT regexp_matches(lower(name), '{_host_enqueue(t)}'))\n"
           f"       / sum(duration_ps) AS non_enqueue_share\nFROM events\n"
           f"WHERE run_id = {c.run_id} AND plane LIKE '/host:%'\n"
           f"  AND (regexp_matches(lower(name), '{_sqlq(t['patterns']['host_input'])}')\n"
           f"       OR regexp_matches(lower(name), '{_host_enqueue(t)}'))\n"
           f"  AND start_ps >= (SELECT min(start_ps) FROM step_breakdown WHERE run_id = {c.run_id})\n"
           f"  AND start_ps < (SELECT max(start_ps + duration_ps) FROM step_breakdown WHERE run_id = "
           f"{c.run_id})")
    return [_finding(
        "host-input-processing", sev,
        f"input wait is {c.frac['input']:.1%} of step time and {share:.0%} of the host's input pipeline time "
        f"is processing (decode/augment), not enqueue",
        {"input_fraction_of_step": c.frac["input"], "host_non_enqueue_share": share,
         "host_processing_ms": host_input["non_enqueue_ms"], "host_enqueue_ms": host_input["enqueue_ms"]},
        sql,
        gain(c.ms["input"] * share, c.step_ms, "exposed input wait x host processing share (catalog §3.8)"),
    )]


def _sqlq(text: str) -> str:
    return text.replace("'", "''")


def _host_enqueue(t: dict) -> str:
    return _sqlq(t["patterns"]["host_enqueue"])


def _outfeed_bound(c: _Ctx, t: dict) -> list[dict]:  # catalog §3.10, §4: output 5% / 20%
    th = t["outfeed_bound"]
    sev = severity(c.frac["output"], th["medium"], th["high"])
    if not sev:
        return []
    return [_finding(
        "outfeed-bound", sev,
        f"exposed outfeed is {c.frac['output']:.1%} of train step time ({c.ms['output']:.3f} ms per step)",
        {"output_fraction_of_step": c.frac["output"], "output_ms_per_step": c.ms["output"]},
        c.sql_steps("sum(output_ps) / sum(duration_ps) AS output_fraction_of_step,\n"
                    "       sum(output_ps) / count(*) / 1e9 AS output_ms_per_step"),
        gain(c.ms["output"], c.step_ms, "exposed outfeed removed when metrics stay on the device "
                                        "(catalog §3.10)"),
    )]


def _collective_bound(c: _Ctx, t: dict) -> list[dict]:  # catalog §4: all-reduce 6%, collective-bound 30%
    th = t["collective_bound"]
    sev = severity(c.frac["collectives"], th["medium"], th["high"])
    if not sev:
        return []
    return [_finding(
        "collective-bound", sev,
        f"exposed collectives are {c.frac['collectives']:.1%} of train step time "
        f"({c.ms['collectives']:.3f} ms per step; {c.ms['collectives_overlapped']:.3f} ms more hidden "
        f"under compute)",
        {"collectives_fraction_of_step": c.frac["collectives"],
         "collectives_ms_per_step": c.ms["collectives"],
         "collectives_overlapped_ms_per_step": c.ms["collectives_overlapped"]},
        c.sql_steps("sum(collectives_ps) / sum(duration_ps) AS collectives_fraction_of_step,\n"
                    "       sum(collectives_ps) / count(*) / 1e9 AS collectives_ms_per_step,\n"
                    "       sum(collectives_overlapped_ps) / count(*) / 1e9 AS "
                    "collectives_overlapped_ms_per_step"),
        gain(c.ms["collectives"] * 0.5, c.step_ms,
             "2-D torus with two concurrent schedules ~ M/(2B): half the exposed collective time "
             "(catalog §2, §3.3)"),
    )]


GRADIENT_KINDS = ("all-reduce", "reduce-scatter", "all-gather")  # gradient sum, sharded or not (§3.2)


def _gradient_sql(c: _Ctx, kinds: list[str]) -> str:
    kind_list = ", ".join(f"'{k}'" for k in kinds)
    return (f"SELECT sum(t.exposed_ps) / (SELECT sum(duration_ps) FROM step_breakdown\n"
            f"        WHERE run_id = {c.run_id} AND NOT is_eval) AS gradient_exposed_fraction_of_step\n"
            f"FROM collective_time t JOIN step_breakdown s\n"
            f"  ON s.run_id = t.run_id AND s.host = t.host AND s.device_ordinal = t.device_ordinal\n"
            f" AND s.start_ps = t.step_start\n"
            f"WHERE t.run_id = {c.run_id} AND t.kind IN ({kind_list}) AND NOT s.is_eval")


def _f32_gradient_allreduce(c: _Ctx, t: dict) -> list[dict]:  # catalog §3.4
    """Gradient collectives (all-reduce, or reduce-scatter + all-gather when the update is sharded) in
    f32 whose exposed time is > 6% of the step."""
    th = t["f32_gradient_allreduce"]
    if c.coll.empty:
        return []
    kinds = [k for k in GRADIENT_KINDS if k in c.coll.index and c.coll.at[k, "dtype"] == "f32"]
    if not kinds:
        return []
    exposed = sum(c.coll_value(k, "exposed_ms_per_step") for k in kinds)
    payload = sum(c.coll_value(k, "bytes") for k in kinds)
    frac = exposed / c.step_ms if c.step_ms else 0.0
    sev = severity(frac, th["min_allreduce_fraction"], th["high"])
    if not sev:
        return []
    return [_finding(
        "f32-gradient-allreduce", sev,
        f"gradient collectives ({', '.join(kinds)}) move f32 ({payload / 1e6:.1f} MB per step) and their "
        f"exposed time is {frac:.1%} of step time",
        {"gradient_exposed_fraction_of_step": frac, "dtype": "f32", "kinds": ", ".join(kinds),
         "gradient_exposed_ms_per_step": exposed, "gradient_bytes_per_step": payload},
        _gradient_sql(c, kinds),
        gain(exposed * 0.5, c.step_ms, "bf16 summation halves the bytes: ~2x on the bandwidth term "
                                       "(catalog §3.4)"),
    )]


def _latency_bound(c: _Ctx, t: dict) -> list[dict]:  # catalog §3.5, §3.6
    th = t["latency_bound_collectives"]
    if c.coll.empty:
        return []
    kind = "all-reduce" if "all-reduce" in c.coll.index else "reduce-scatter"  # sharded update: RS
    count = c.coll_value(kind, "count_per_step")
    median = c.coll_value(kind, "median_op_bytes", default=float("nan"))
    exposed = c.coll_value(kind, "exposed_ms_per_step")
    done_ms = _async_done_ms(c)
    done_frac = done_ms / c.step_ms if c.step_ms else 0.0
    many_small = count > th["min_count_per_step"] and (median != median or median < th["max_median_bytes"])
    if not (many_small or done_frac > th["async_done_fraction"]):
        return []
    frac = exposed / c.step_ms if c.step_ms else 0.0
    sev = "high" if frac >= t["collective_bound"]["high"] else "medium" if frac >= 0.03 or done_frac > \
        th["async_done_fraction"] else "low"
    return [_finding(
        "latency-bound-collectives", sev,
        f"{count:.0f} {kind}s per step (median {median / 1e3:.1f} KB), exposed {exposed:.3f} ms per step; "
        f"async -done waits {done_frac:.1%} of step",
        {"count_per_step": count, "kind": kind, "median_op_bytes": median,
         "exposed_ms_per_step": exposed, "async_done_fraction_of_step": done_frac},
        (f"SELECT count(*) FILTER (WHERE short_name NOT LIKE '%-done%') * 1.0\n"
         f"       / (SELECT count(*) FROM step_breakdown WHERE run_id = {c.run_id} AND NOT is_eval)"
         f" AS count_per_step\n"
         f"FROM op_steps WHERE run_id = {c.run_id} AND collective_kind = '{kind}'\n"
         f"  AND line <> 'Async XLA Ops' AND step_start IS NOT NULL AND NOT step_is_eval"),
        gain(exposed * 0.5, c.step_ms, "combined buckets overlapped with backward: about half the exposed "
             "latency-bound time (catalog §3.5)"),
    )]


def _async_done_ms(c: _Ctx) -> float:
    ops = c.a.ops
    if ops.empty or not c.n:
        return 0.0
    done = ops[ops["name"].str.contains(r"-done", na=False) & (ops["category"] == "collectives")]
    return float(done["self_time_ms"].sum()) / c.n


def _weight_update_unsharded(c: _Ctx, t: dict) -> list[dict]:  # catalog §3.2
    th = t["weight_update_unsharded"]
    sharded = not c.coll.empty and any(k in c.coll.index for k in ("reduce-scatter", "all-gather"))
    if sharded:
        return []
    sev = severity(c.frac["weight_update"], th["medium"], th["high"])
    if not sev:
        return []
    # the run's data-parallel replicas (the gradient all-reduce's group), not the cores written
    identity = c.a.summary.get("identity") or {}
    replicas = max(int(identity.get("replicas") or c.a.summary.get("devices") or 1), 1)
    return [_finding(
        "weight-update-unsharded", sev,
        f"the optimizer update is {c.frac['weight_update']:.1%} of step time "
        f"({c.ms['weight_update']:.3f} ms) "
        f"and no reduce-scatter/all-gather is present: every replica repeats it",
        {"weight_update_fraction_of_step": c.frac["weight_update"], "weight_update_ms_per_step":
         c.ms["weight_update"], "replicas": replicas, "reduce_scatter_or_all_gather": False},
        c.sql_steps("sum(weight_update_ps) / sum(duration_ps) AS weight_update_fraction_of_step,\n"
                    "       sum(weight_update_ps) / count(*) / 1e9 AS weight_update_ms_per_step"),
        gain(c.ms["weight_update"] * (1 - 1 / replicas), c.step_ms,
             "update x (1 - 1/N) with N replicas (catalog §3.2); the reduce-scatter + all-gather cost "
             "about what the all-reduce did"),
    )]


def _eval_overhead(c: _Ctx, t: dict) -> list[dict]:  # catalog §3.10: eval > 10% of wall time
    th = t["eval_overhead"]
    frac = float(c.a.summary["breakdown"].get("eval") or 0.0)
    sev = severity(frac, th["medium"], th["high"])
    if not sev:
        return []
    wall_ms, n_steps = c.wall_ms, c.n_steps
    eval_ms_per_step = frac * wall_ms / n_steps
    return [_finding(
        "eval-overhead", sev,
        f"eval takes {frac:.1%} of wall time ({frac * wall_ms:.1f} ms of {wall_ms:.1f} ms)",
        {"eval_fraction_of_wall": frac, "wall_ms": wall_ms, "eval_ms": frac * wall_ms},
        (f"SELECT avg(eval_ps / wall_ps) AS eval_fraction_of_wall  -- mean over devices\n"
         f"FROM device_breakdown WHERE run_id = {c.run_id}"),
        gain(eval_ms_per_step * 0.5, c.step_ms, "distributed, overlapped eval hides about half of it, "
             "amortized per train step (catalog §3.10)"),
    )]


def _host_overhead(c: _Ctx, t: dict) -> list[dict]:  # catalog §3.7, §4: idle >= 3%
    th = t["host_overhead"]
    frac = float(c.a.summary["breakdown"].get("idle") or 0.0)
    sev = severity(frac, th["medium"], th["high"])
    if not sev:
        return []
    wall_ms, n_steps = c.wall_ms, c.n_steps
    idle_ms = frac * wall_ms / n_steps
    return [_finding(
        "host-overhead", sev,
        f"devices are idle {frac:.1%} of wall time (in-step idle {c.frac['idle']:.1%} of step time plus gaps "
        f"between steps): the host launches work too slowly",
        {"idle_fraction_of_wall": frac, "idle_in_step_fraction": c.frac["idle"], "idle_ms_per_step": idle_ms},
        (f"SELECT avg(idle_ps / wall_ps) AS idle_fraction_of_wall,  -- mean over devices\n"
         f"       avg(idle_in_steps_ps / wall_ps) AS idle_in_steps_fraction_of_wall\n"
         f"FROM device_breakdown WHERE run_id = {c.run_id}"),
        gain(idle_ms, c.step_ms, "idle time between and inside steps removed by an on-device loop "
                                 "(catalog §3.7)"),
    )]


_BATCH_RE = re.compile(r"\[(\d+)[,\]]")


def _data_parallel_limit(c: _Ctx, t: dict, run_metadata: Any, infeed_batch: float | None) -> list[dict]:
    th = t["data_parallel_limit"]  # catalog §3.1, §3.13
    # per-core batch as the trace states it (no generator-only metadata): the infeed's leading dimension
    batch, source = infeed_batch, "leading dimension of the infeed shape"
    if batch is None:
        return []
    partitioned = not c.coll.empty and "collective-permute" in c.coll.index
    util = _flop_utilization(c)
    if partitioned or batch > th["max_per_core_batch"]:
        return []
    low_util = util is not None and util < th["max_flop_utilization"]
    sev = "high" if batch < 1 else "medium" if low_util or util is None else "low"
    return [_finding(
        "data-parallel-limit", sev,
        f"{batch:g} examples per core ({source}) with no spatial/model partitioning; "
        f"FLOP utilization {'n/a' if util is None else f'{util:.1%}'}",
        {"per_core_batch": batch, "batch_source": source, "flop_utilization": util, "partitioned": False},
        (f"SELECT regexp_extract(shape, '\\[(\\d+)', 1) AS infeed_leading_dim, count(*)\n"
         f"FROM op_steps WHERE run_id = {c.run_id} AND category = 'input' GROUP BY 1"),
        gain(c.ms["compute"] * (1 - (util or 0) / th["max_flop_utilization"]) * 0.25 if util else 0.0,
             c.step_ms, "larger per-core slices via partitioning raise MXU use; rough quarter of the "
             "under-utilized compute (catalog §3.1)"),
    )]


def _flop_utilization(c: _Ctx) -> float | None:
    ops = c.a.ops
    if ops.empty or ops["flops"].fillna(0).sum() <= 0:
        return None
    fu = ops["flop_utilization"]
    w = ops["self_time_ms"]
    mask = fu.notna()
    if not mask.any() or w[mask].sum() <= 0:
        return None
    return float((fu[mask] * w[mask]).sum() / w[mask].sum())


def _partition_overhead(c: _Ctx, t: dict) -> list[dict]:  # catalog §3.1: collective-permute > 10%
    th = t["partition_overhead"]
    cp_ms = c.coll_value("collective-permute", "ops_per_step_total_ms")
    frac = cp_ms / c.step_ms if c.step_ms else 0.0
    sev = severity(frac, th["medium"], th["high"])
    if not sev:
        return []
    exposed = c.coll_value("collective-permute", "exposed_ms_per_step")
    return [_finding(
        "partition-overhead", sev,
        f"collective-permute (halo exchange) takes {frac:.1%} of step time ({cp_ms:.3f} ms per step, "
        f"{exposed:.3f} ms exposed)",
        {"collective_permute_fraction_of_step": frac, "collective_permute_ms_per_step": cp_ms,
         "collective_permute_exposed_ms_per_step": exposed},
        (f"SELECT sum(duration_ps) / (SELECT sum(duration_ps) FROM step_breakdown\n"
         f"                           WHERE run_id = {c.run_id} AND NOT is_eval) AS "
         f"collective_permute_fraction\n"
         f"FROM op_steps WHERE run_id = {c.run_id} AND collective_kind = 'collective-permute'\n"
         f"  AND line <> 'Async XLA Ops' AND step_start IS NOT NULL AND NOT step_is_eval"),
        gain(max(exposed, cp_ms * 0.5), c.step_ms, "fewer partitions / overlapped halos: the exposed halo "
             "time, at least half the permute time (catalog §3.1)"),
    )]


def _data_formatting(c: _Ctx, t: dict) -> list[dict]:  # catalog §3.9
    th = t["data_formatting"]
    ops = c.a.ops
    if ops.empty or not c.n:
        return []
    compute = ops[ops["category"].isin(["compute", "weight_update"])]
    total = float(compute["self_time_ms"].sum())
    if total <= 0:
        return []
    pat = re.compile(t["patterns"]["data_formatting"], re.IGNORECASE)
    fmt_mask = compute["name"].fillna("").map(lambda n: bool(pat.search(n.lower())))
    if "hlo_category" in compute:
        fmt_mask |= compute["hlo_category"].fillna("").str.lower().eq("data formatting")
    fmt_ms = float(compute.loc[fmt_mask, "self_time_ms"].sum())
    share = fmt_ms / total
    first_conv = _first_conv_share(c, total)
    sev = severity(share, th["medium"])
    if not sev and first_conv is not None and first_conv >= th["first_conv_fraction"]:
        sev = "medium"
    if not sev:
        return []
    return [_finding(
        "data-formatting", sev,
        f"copies/transposes are {share:.1%} of compute time"
        + (f"; the first convolution is {first_conv:.1%} of compute" if first_conv is not None else ""),
        {"data_formatting_share_of_compute": share, "data_formatting_ms_per_step": fmt_ms / c.n,
         "first_conv_share_of_compute": first_conv},
        (f"SELECT sum(duration_ps) FILTER (WHERE regexp_matches(lower(short_name), "
         f"'{_sqlq(t['patterns']['data_formatting'])}')\n"
         f"         OR lower(coalesce(hlo_category, '')) = 'data formatting') / sum(duration_ps)"
         f" AS data_formatting_share_of_compute\n"
         f"FROM op_steps WHERE run_id = {c.run_id} AND category IN ('compute', 'weight_update')\n"
         f"  AND NOT is_container AND line <> 'Async XLA Ops' AND step_start IS NOT NULL"),
        gain(fmt_ms / c.n * 0.8 + (first_conv or 0) * total / c.n * 0.5, c.step_ms,
             "space-to-depth and native layouts remove most copies/transposes and half the first "
             "convolution (catalog §3.9)"),
    )]


def _first_conv_share(c: _Ctx, total_ms: float) -> float | None:
    """Share of compute of the first convolution executed in a step (conv0, catalog §3.9)."""
    fc = c.first_conv_ms
    return fc * c.n / total_ms if fc is not None and total_ms else None


def _infeed_outlier(inp: pd.DataFrame) -> tuple[str, float, float, float] | None:
    """(worst host, its mean infeed ms, the others' mean infeed ms, ratio). Hosts are compared when
    there are several (a slow host feeds all its cores late), else cores. Comparing the worst against
    the mean of the *rest* keeps the catalog's max/avg > 2 meaningful with few hosts (with two hosts
    max/avg can never exceed 2)."""
    if inp.empty:
        return None
    key = "host" if inp["host"].nunique() > 1 else "device_ordinal"
    per = inp.groupby(key)["infeed_ms_per_step"].mean()
    if len(per) < 2:
        return None
    worst = per.idxmax()
    rest = float(per.drop(worst).mean())
    ratio = float(per[worst]) / rest if rest > 0 else float("inf")
    host = worst if key == "host" else inp.loc[inp["device_ordinal"] == worst, "host"].iloc[0]
    return str(host), float(per[worst]), rest, ratio


def _straggler(c: _Ctx, t: dict) -> list[dict]:  # catalog §3.8 (infeed max/avg > 2), §3.3 (sync > compute)
    th = t["straggler"]
    reasons: list[str] = []
    metrics: dict[str, Any] = {}
    sev = None
    excess = 0.0
    outlier = _infeed_outlier(c.a.input)
    if outlier:
        host, worst_ms, rest_ms, ratio = outlier
        metrics.update(infeed_worst_over_rest=ratio, infeed_ms_worst=worst_ms, infeed_ms_rest=rest_ms,
                       worst_host=host)
        worst_frac = worst_ms / max(c.step_ms, 1e-12)
        if ratio > th["infeed_max_over_mean"] and worst_frac >= th["min_infeed_fraction"]:
            reasons.append(f"host {host} waits {worst_ms:.3f} ms per step in infeed vs {rest_ms:.3f} ms "
                           f"on the others ({ratio:.1f}x)")
            sev = "high" if ratio > 2 * th["infeed_max_over_mean"] else "medium"
            excess = worst_ms - rest_ms
    kinds = [k for k in GRADIENT_KINDS if not c.coll.empty and k in c.coll.index]
    compute = sum(c.coll_value(k, "compute_ms") for k in kinds)
    sync = sum(c.coll_value(k, "sync_ms") for k in kinds)
    total = sum(c.coll_value(k, "ops_per_step_total_ms") for k in kinds)
    if kinds and len(c.a.per_core) > 1:
        metrics.update(collective_compute_ms=compute, collective_sync_ms=sync)
        big_enough = total / max(c.step_ms, 1e-12) >= th["min_allreduce_fraction"]
        if big_enough and sync > th["sync_over_compute"] * compute:
            reasons.append(f"{'/'.join(kinds)} sync {sync:.3f} ms > compute {compute:.3f} ms per step: cores "
                           f"wait for a slower one")
            sev = sev or "medium"
            excess = max(excess, sync - compute)
    if not reasons:
        return []
    return [_finding(
        "straggler", sev or "medium", "; ".join(reasons), metrics,
        (f"WITH st AS (SELECT host, device_ordinal, count(*) AS n, sum(input_ps) AS input_ps\n"
         f"            FROM step_breakdown WHERE run_id = {c.run_id} AND NOT is_eval GROUP BY ALL),\n"
         f"op AS (SELECT host, device_ordinal,\n"
         f"              sum(duration_ps) FILTER (WHERE category = 'input') AS infeed_ps,\n"
         f"              sum(duration_ps) FILTER (WHERE collective_kind IN ('all-reduce', 'reduce-scatter',\n"
         f"                  'all-gather') AND line <> 'Async XLA Ops') AS gradient_collective_ps\n"
         f"       FROM op_steps WHERE run_id = {c.run_id} AND step_start IS NOT NULL AND NOT step_is_eval\n"
         f"       GROUP BY ALL)\n"
         f"SELECT st.host, avg(coalesce(op.infeed_ps, st.input_ps) / st.n / 1e9) AS infeed_ms_per_step,\n"
         f"       avg(coalesce(op.gradient_collective_ps, 0) / st.n / 1e9)\n"
         f"         AS gradient_collective_ms_per_step\n"
         f"FROM st LEFT JOIN op USING (host, device_ordinal)\n"
         f"GROUP BY st.host ORDER BY infeed_ms_per_step DESC"),
        gain(excess, c.step_ms, "the slowest host's excess wait (its infeed minus the others', or "
                                "collective sync minus compute) removed by fixing it (catalog §3.3, §3.8)"),
    )]


def evaluate_findings(analysis: RunAnalysis, config: dict[str, Any], run_id: int,
                      host_input: dict[str, float] | None = None, run_metadata: Any = None,
                      infeed_batch: float | None = None,
                      first_conv_ms: float | None = None) -> list[dict[str, Any]]:
    """Every rule the trace supports, most severe first (then by estimated gain)."""
    c = _Ctx(analysis, run_id)
    c.first_conv_ms = first_conv_ms
    if not c.n:
        return []
    found: list[dict[str, Any]] = []
    found += _input_bound(c, config)
    found += _host_input_processing(c, config, host_input)
    found += _outfeed_bound(c, config)
    found += _collective_bound(c, config)
    found += _f32_gradient_allreduce(c, config)
    found += _latency_bound(c, config)
    found += _weight_update_unsharded(c, config)
    found += _eval_overhead(c, config)
    found += _host_overhead(c, config)
    found += _data_parallel_limit(c, config, run_metadata, infeed_batch)
    found += _partition_overhead(c, config)
    found += _data_formatting(c, config)
    found += _straggler(c, config)
    if not config.get("severity", {}).get("report_low", True):
        found = [f for f in found if f["severity"] != "low"]
    found.sort(key=lambda f: (SEVERITY_ORDER[f["severity"]], -(f["estimated_gain"]["ms"] or 0)))
    return found
