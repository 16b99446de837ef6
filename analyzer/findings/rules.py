"""The catalog rules (design.md rule ids): each builds its evidence SQL, runs it, and decides from the
numbers that SQL returned, so the query a finding shows and the metrics it reports cannot drift.

A rule returns a draft finding: the contract's keys (docs/findings.md) plus ``_gain_ms`` (its own cost
model's saving per train step) and ``_category`` (the step time that saving comes out of). The tree
(findings/tree.py) then links causes and combines the gains. Thresholds and gain factors are in
analyzer/thresholds.toml, each citing its catalog section.
"""

from __future__ import annotations

import re
from typing import Any

import duckdb
from tpuanalyze.analyzer.classify import sql_literal
from tpuanalyze.analyzer.collectives import DTYPE_BYTES, SHAPE_TEXT_SQL
from tpuanalyze.analyzer.findings.advice import ADVICE, recommendation
from tpuanalyze.analyzer.input import host_input_ctes

VIEWS = ("step_breakdown", "device_breakdown", "collective_time", "op_steps")
_VIEW_RE = re.compile(r"\b(" + "|".join(VIEWS) + r")\b")
GRADIENT_KINDS = ("all-reduce", "reduce-scatter", "all-gather")  # gradient sum, sharded or not (§3.2)
_DTYPES = "|".join(DTYPE_BYTES)  # the element types collectives.shape_bytes knows, same order


def severity(value: float | None, medium: float, high: float | None = None) -> str | None:
    """'high' at/above high, 'medium' at/above medium, else None (rule not triggered)."""
    if value is None or value != value:
        return None
    if high is not None and value >= high:
        return "high"
    if value >= medium:
        return "medium"
    return None


def payload_bytes_sql(shape: str) -> str:
    """SQL for the bytes of an HLO shape text (tuples summed), as collectives.shape_bytes computes."""
    sizes = " ".join(f"WHEN '{k}' THEN {v}" for k, v in DTYPE_BYTES.items())
    return (f"list_sum(list_transform(regexp_extract_all({shape}, '(?:{_DTYPES})\\[[0-9,]*\\]'),\n"
            f"         lambda x: (CASE regexp_extract(x, '^([a-z0-9]+)\\[', 1) {sizes} END)\n"
            f"              * coalesce(list_aggregate(list_transform(string_split(\n"
            f"                  regexp_extract(x, '\\[([0-9,]*)\\]', 1), ','), lambda d: TRY_CAST(d AS "
            f"BIGINT)),\n"
            f"                  'product'), 1)))")


def dtype_sql(shape: str) -> str:
    """SQL for the first element type of an HLO shape text."""
    return f"nullif(regexp_extract({shape}, '({_DTYPES})\\[', 1), '')"


class Ctx:
    """The run's connection and relations; ``query`` runs an evidence SQL written against the views."""

    def __init__(self, con: duckdb.DuckDBPyConnection, rel: dict[str, str], run_id: int,
                 config: dict[str, Any], platform: dict[str, Any],
                 identity: dict[str, Any] | None = None) -> None:
        self.con, self.rel, self.run_id, self.t = con, rel, int(run_id), config
        self.platform, self.identity = platform, identity or {}
        self.step = self.query(self.sql_steps(
            "count(*) AS device_steps, sum(duration_ps) / count(*) / 1e9 AS step_ms,\n"
            "       sum(compute_ps) / sum(duration_ps) AS compute_fraction,\n"
            + ",\n".join(f"       sum({c}_ps) / count(*) / 1e9 AS {c}_ms"
                         for c in ("compute", "weight_update", "collectives", "memory_transfer", "input",
                                   "output", "idle"))))
        # The step cycle: a device's wall time (train steps, the gaps between them, eval) per train step,
        # the base of every gain's fraction, as the breakdown's shares are of wall time (docs/findings.md).
        self.step.update(self.query(
            f"SELECT sum(wall_ps) / nullif(sum(train_steps), 0) / 1e9 AS cycle_ms,\n"
            f"       sum(compute_ps) / nullif(sum(wall_ps), 0) AS cycle_compute_fraction\n"
            f"FROM device_breakdown WHERE run_id = {self.run_id} AND train_steps > 0"))
        self.n = int(self.step.get("device_steps") or 0)
        self.step_ms = float(self.step.get("step_ms") or 0.0)

    def train_only(self, sql: str) -> str:
        """``sql`` with warm-up steps left out of "train steps" (as the step statistics leave them out,
        unless ``warmup.keep``): the text a finding shows and the text that runs are this one."""
        if self.t["warmup"]["keep"]:
            return sql
        sql = re.sub(r"NOT (\w+\.)?is_eval\b",
                     lambda m: f"{m.group(0)} AND NOT {m.group(1) or ''}is_warmup", sql)

        def op_filter(m: re.Match) -> str:
            # an op in no warm-up step of its device: NOT EXISTS (... w.host = host AND w.device_ordinal
            # = device_ordinal AND w.start_ps = step_start), spelled as an uncorrelated NOT IN (with the
            # NULLs NOT EXISTS keeps): DuckDB runs the correlated form as a join that materializes every
            # op row, 9 of 14 CPU s of one evidence query at 512 hosts; this one is a hash anti join
            p = m.group(1) or "op_steps."
            return (f"{m.group(0)}\n  AND ({p}device_ordinal IS NULL OR {p}step_start IS NULL\n"
                    f"       OR ({p}host, {p}device_ordinal, {p}step_start) NOT IN (SELECT w.host, "
                    f"w.device_ordinal, w.start_ps\n           FROM step_breakdown w WHERE w.run_id = "
                    f"{self.run_id} AND w.is_warmup\n           AND w.device_ordinal IS NOT NULL "
                    f"AND w.start_ps IS NOT NULL))")

        return re.sub(r"NOT (\w+\.)?step_is_eval\b", op_filter, sql)

    def query(self, sql: str) -> dict[str, Any]:
        """The first row of ``sql`` (views mapped onto this run's relations) as {column: value}."""
        sql = self.train_only(sql)
        cur = self.con.execute(_VIEW_RE.sub(lambda m: self.rel[m.group(1)], sql))
        row = cur.fetchone()
        names = [d[0] for d in cur.description]
        return {n: _plain(v) for n, v in zip(names, row or [None] * len(names), strict=True)}

    def sql_steps(self, select: str) -> str:
        return f"SELECT {select}\nFROM step_breakdown\nWHERE run_id = {self.run_id} AND NOT is_eval"

    def train_steps_cte(self) -> str:
        return (f"steps AS (SELECT count(*) AS n, sum(duration_ps) AS ps FROM step_breakdown\n"
                f"          WHERE run_id = {self.run_id} AND NOT is_eval)")

    def in_train_steps(self, alias: str = "") -> str:
        p = f"{alias}." if alias else ""
        return (f"{p}run_id = {self.run_id} AND {p}step_start IS NOT NULL AND NOT {p}step_is_eval "
                f"AND {p}line <> 'Async XLA Ops'")


def _plain(value: Any) -> Any:
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float):
        return None if value != value else round(value, 6)
    return value


def _f(value: Any) -> float:
    """A metric as a float (NULL -> 0)."""
    return float(value) if value is not None else 0.0


def finding(c: Ctx, rule: str, sev: str, summary: str, sql: str, metrics: dict[str, Any], gain_ms: float,
            model: str, category: str, variant: str = "") -> list[dict[str, Any]]:
    """A draft finding, or nothing when the technique does not apply to the run's platform/workload."""
    text = recommendation(rule, c.platform, variant)
    if text is None:
        return []
    return [{
        "rule": rule,
        "severity": sev,
        "evidence": {"summary": summary, "metrics": metrics, "sql": c.train_only(sql)},
        "recommendation": text,
        "catalog": ADVICE[rule].catalog,
        "_gain_ms": max(float(gain_ms or 0.0), 0.0),
        "_model": model,
        "_category": category,
    }]


def input_bound(c: Ctx) -> list[dict]:  # catalog §3.8, §4: input 5% / 20%
    th = c.t["input_bound"]
    sql = c.sql_steps("sum(input_ps) / sum(duration_ps) AS input_fraction_of_step,\n"
                      "       sum(input_ps) / count(*) / 1e9 AS input_ms_per_step,\n"
                      "       sum(duration_ps) / count(*) / 1e9 AS step_ms")
    m = c.query(sql)
    sev = severity(m["input_fraction_of_step"], th["medium"], th["high"])
    if not sev:
        return []
    return finding(
        c, "input-bound", sev,
        f"exposed input wait is {_f(m['input_fraction_of_step']):.1%} of train step time "
        f"({_f(m['input_ms_per_step']):.3f} ms of {_f(m['step_ms']):.3f} ms per step)",
        sql, m, _f(m["input_ms_per_step"]),
        "exposed input wait removed once the host pipeline keeps up (catalog §3.8); upper bound", "input")


def host_input_processing(c: Ctx) -> list[dict]:
    th = c.t["host_input_processing"]  # catalog §3.8: host non-enqueue work >= 50% of input time
    steps = f"step_breakdown WHERE run_id = {c.run_id}"
    sql = (f"WITH {host_input_ctes(c.run_id, steps, c.t['patterns'])},\n"
           f"st AS (SELECT sum(input_ps) / sum(duration_ps) AS input_fraction_of_step,\n"
           f"              sum(input_ps) / count(*) / 1e9 AS input_ms_per_step,\n"
           f"              sum(input_ps) / 1e9 AS input_ms_total\n"
           f"       FROM step_breakdown WHERE run_id = {c.run_id} AND NOT is_eval),\n"
           f"h AS (SELECT sum(duration_ps) FILTER (WHERE NOT enqueue) / nullif(sum(duration_ps), 0)\n"
           f"               AS host_non_enqueue_share,\n"
           f"             coalesce(sum(duration_ps) FILTER (WHERE NOT enqueue), 0) / 1e9 AS "
           f"host_processing_ms,\n"
           f"             coalesce(sum(duration_ps) FILTER (WHERE enqueue), 0) / 1e9 AS host_enqueue_ms\n"
           f"      FROM hev)\n"
           f"SELECT st.input_fraction_of_step, h.host_non_enqueue_share, h.host_processing_ms,\n"
           f"       h.host_enqueue_ms, st.input_ms_per_step, st.input_ms_total\nFROM st, h")
    m = c.query(sql)
    frac, share = m["input_fraction_of_step"], m["host_non_enqueue_share"]
    if frac is None or share is None or frac < th["min_input_fraction"] or share < th["non_enqueue_share"]:
        return []
    # a share of next to nothing is no diagnosis: the processing must be a real part of the wait
    if _f(m["host_processing_ms"]) < th["min_processing_of_input"] * _f(m["input_ms_total"]):
        return []
    sev = "high" if frac >= th["high"] else "medium"
    return finding(
        c, "host-input-processing", sev,
        f"input wait is {frac:.1%} of step time and {share:.0%} of the host's input pipeline time is "
        f"processing (decode/augment), not enqueue",
        sql, m, _f(m["input_ms_per_step"]) * share,
        "exposed input wait x host processing share (catalog §3.8)", "input")


def outfeed_bound(c: Ctx) -> list[dict]:  # catalog §3.10, §4: output 5% / 20%
    th = c.t["outfeed_bound"]
    sql = c.sql_steps("sum(output_ps) / sum(duration_ps) AS output_fraction_of_step,\n"
                      "       sum(output_ps) / count(*) / 1e9 AS output_ms_per_step")
    m = c.query(sql)
    sev = severity(m["output_fraction_of_step"], th["medium"], th["high"])
    if not sev:
        return []
    return finding(
        c, "outfeed-bound", sev,
        f"exposed outfeed is {_f(m['output_fraction_of_step']):.1%} of train step time "
        f"({_f(m['output_ms_per_step']):.3f} ms per step)",
        sql, m, _f(m["output_ms_per_step"]),
        "exposed outfeed removed when metrics stay on the device (catalog §3.10)", "output")


def collective_bound(c: Ctx) -> list[dict]:  # catalog §4: all-reduce 6%, collective-bound 30%
    th = c.t["collective_bound"]
    # the kind with most exposed time picks the wording: an all-to-all is no gradient all-reduce
    sql = c.sql_steps("sum(collectives_ps) / sum(duration_ps) AS collectives_fraction_of_step,\n"
                      "       sum(collectives_ps) / count(*) / 1e9 AS collectives_ms_per_step,\n"
                      "       sum(collectives_overlapped_ps) / count(*) / 1e9 AS "
                      "collectives_overlapped_ms_per_step,\n"
                      "       (SELECT t.kind FROM collective_time t JOIN step_breakdown s\n"
                      "          ON s.run_id = t.run_id AND s.host = t.host AND s.device_ordinal = "
                      "t.device_ordinal\n"
                      "         AND s.start_ps = t.step_start\n"
                      f"        WHERE t.run_id = {c.run_id} AND NOT s.is_eval GROUP BY t.kind\n"
                      "        ORDER BY sum(t.exposed_ps) DESC, t.kind LIMIT 1) AS most_exposed_kind")
    m = c.query(sql)
    sev = severity(m["collectives_fraction_of_step"], th["medium"], th["high"])
    if not sev:
        return []
    torus = c.platform.get("family") == "TPU"
    return finding(
        c, "collective-bound", sev,
        f"exposed collectives are {_f(m['collectives_fraction_of_step']):.1%} of train step time "
        f"({_f(m['collectives_ms_per_step']):.3f} ms per step; "
        f"{_f(m['collectives_overlapped_ms_per_step']):.3f} ms more hidden under compute)",
        sql, m, _f(m["collectives_ms_per_step"]) * th["gain_factor"],
        f"faster, hidden collectives: {th['gain_factor']:.0%} of the exposed collective time "
        + ("(catalog §2: a 2-D torus with two concurrent schedules ~ M/(2B); §3.3)" if torus else
           "(overlapped with compute on their own stream, or cheaper; catalog §3.3)"),
        "collectives", variant="all-to-all" if m["most_exposed_kind"] == "all-to-all" else "")


def _collective_ops_cte(c: Ctx, kinds: tuple[str, ...]) -> str:
    """The collective ops of the kinds in train steps, with their dtype and payload (the shape's bytes,
    else the trace's bytes_accessed). The shape text is parsed once per distinct text (a pod's million
    collective ops have a handful of shapes; parsing each op's was most of these queries' time)."""
    kind_list = ", ".join(f"'{k}'" for k in kinds)
    return (f"collective_ops AS (SELECT collective_kind AS kind, short_name, duration_ps, bytes_accessed,\n"
            f"                          {SHAPE_TEXT_SQL} AS shape_text\n"
            f"        FROM op_steps WHERE {c.in_train_steps()} AND collective_kind IN ({kind_list})),\n"
            f"shapes AS (SELECT shape_text, {dtype_sql('shape_text')} AS dtype,\n"
            f"                  {payload_bytes_sql('shape_text')} AS payload\n"
            f"           FROM (SELECT DISTINCT shape_text FROM collective_ops)),\n"
            f"ops AS (SELECT o.kind, o.short_name, o.duration_ps, s.dtype,\n"
            f"               coalesce(s.payload, o.bytes_accessed) AS payload\n"
            f"        FROM collective_ops o LEFT JOIN shapes s USING (shape_text))")


def f32_gradient_allreduce(c: Ctx) -> list[dict]:  # catalog §3.4
    """Gradient collectives (all-reduce, or reduce-scatter + all-gather when the update is sharded) in
    f32 whose exposed time is > 6% of the step."""
    th = c.t["f32_gradient_allreduce"]
    sql = (f"WITH {_collective_ops_cte(c, GRADIENT_KINDS)},\n{c.train_steps_cte()},\n"
           # the kind's most frequent dtype, a tie going to the other dtype (mode() picks either at random)
           f"dtypes AS (SELECT kind, dtype, count(*) AS n FROM ops WHERE short_name NOT LIKE '%-done%'\n"
           f"           AND dtype IS NOT NULL GROUP BY kind, dtype),\n"
           f"f32 AS (SELECT kind, sum(payload) AS payload FROM ops WHERE short_name NOT LIKE '%-done%'\n"
           f"        AND kind IN (SELECT kind FROM dtypes GROUP BY kind\n"
           f"                     HAVING first(dtype ORDER BY n DESC, dtype = 'f32', dtype) = 'f32')\n"
           f"        GROUP BY kind),\n"
           f"exposed AS (SELECT sum(t.exposed_ps) AS ps FROM collective_time t JOIN step_breakdown s\n"
           f"              ON s.run_id = t.run_id AND s.host = t.host AND s.device_ordinal = "
           f"t.device_ordinal\n"
           f"             AND s.start_ps = t.step_start\n"
           f"            WHERE t.run_id = {c.run_id} AND NOT s.is_eval AND t.kind IN (SELECT kind FROM "
           f"f32))\n"
           f"SELECT exposed.ps / steps.ps AS gradient_exposed_fraction_of_step,\n"
           f"       exposed.ps / steps.n / 1e9 AS gradient_exposed_ms_per_step,\n"
           f"       (SELECT string_agg(kind, ', ' ORDER BY kind) FROM f32) AS kinds,\n"
           f"       (SELECT sum(payload) FROM f32) / steps.n AS gradient_bytes_per_step\n"
           f"FROM exposed, steps")
    m = c.query(sql)
    if not m["kinds"]:
        return []
    frac = _f(m["gradient_exposed_fraction_of_step"])
    sev = severity(frac, th["min_allreduce_fraction"], th["high"])
    if not sev:
        return []
    return finding(
        c, "f32-gradient-allreduce", sev,
        f"gradient collectives ({m['kinds']}) move f32 ({_f(m['gradient_bytes_per_step']) / 1e6:.1f} MB per "
        f"step) and their exposed time is {frac:.1%} of step time",
        sql, m, _f(m["gradient_exposed_ms_per_step"]) * th["gain_factor"],
        "bf16 summation halves the bytes: ~2x on the bandwidth term (catalog §3.4)", "collectives")


def latency_bound(c: Ctx) -> list[dict]:  # catalog §3.5
    th = c.t["latency_bound_collectives"]
    sql = (f"WITH {_collective_ops_cte(c, ('all-reduce', 'reduce-scatter'))},\n{c.train_steps_cte()},\n"
           f"k AS (SELECT CASE WHEN count(*) FILTER (WHERE kind = 'all-reduce') > 0 THEN 'all-reduce'\n"
           f"                  ELSE 'reduce-scatter' END AS kind FROM ops),\n"
           f"counted AS (SELECT * FROM ops WHERE kind = (SELECT kind FROM k) AND short_name NOT LIKE "
           f"'%-done%'),\n"
           f"exposed AS (SELECT sum(t.exposed_ps) AS ps FROM collective_time t JOIN step_breakdown s\n"
           f"              ON s.run_id = t.run_id AND s.host = t.host AND s.device_ordinal = "
           f"t.device_ordinal\n"
           f"             AND s.start_ps = t.step_start\n"
           f"            WHERE t.run_id = {c.run_id} AND NOT s.is_eval AND t.kind = (SELECT kind FROM k)),\n"
           f"done AS (SELECT sum(duration_ps) AS ps FROM op_steps\n"
           f"         WHERE {c.in_train_steps()} AND category = 'collectives' AND short_name LIKE "
           f"'%-done%')\n"
           f"SELECT (SELECT kind FROM k) AS kind, (SELECT count(*) FROM counted) / steps.n AS "
           f"count_per_step,\n"
           f"       (SELECT median(payload) FROM counted) AS median_op_bytes,\n"
           f"       coalesce(exposed.ps, 0) / steps.n / 1e9 AS exposed_ms_per_step,\n"
           f"       coalesce(exposed.ps, 0) / steps.ps AS exposed_fraction_of_step,\n"
           f"       coalesce(done.ps, 0) / steps.ps AS async_done_fraction_of_step\n"
           f"FROM steps, exposed, done")
    m = c.query(sql)
    count, median = _f(m["count_per_step"]), m["median_op_bytes"]
    done_frac, frac = _f(m["async_done_fraction_of_step"]), _f(m["exposed_fraction_of_step"])
    many_small = count > th["min_count_per_step"] and (median is None or median < th["max_median_bytes"])
    if not (many_small or done_frac > th["async_done_fraction"]):
        return []
    sev = ("high" if frac >= th["high"] else
           "medium" if frac >= th["medium"] or done_frac > th["async_done_fraction"] else "low")
    median_text = "n/a" if median is None else f"{median / 1e3:.1f} KB"
    return finding(
        c, "latency-bound-collectives", sev,
        f"{count:.0f} {m['kind']}s per step (median {median_text}), exposed "
        f"{_f(m['exposed_ms_per_step']):.3f} ms per step; async -done waits {done_frac:.1%} of step",
        sql, m, _f(m["exposed_ms_per_step"]) * th["gain_factor"],
        "combined buckets overlapped with backward: about half the exposed latency-bound time "
        "(catalog §3.5)", "collectives")


def distributed_batch_norm(c: Ctx) -> list[dict]:  # catalog §3.6
    th = c.t["distributed_batch_norm"]
    small = int(th["small_bytes"])
    sql = (f"WITH {_collective_ops_cte(c, ('all-reduce',))},\n{c.train_steps_cte()}\n"
           f"SELECT coalesce(sum(ops.duration_ps) FILTER (WHERE ops.payload < {small}), 0) / "
           f"any_value(steps.ps)\n"
           f"         AS small_allreduce_fraction_of_step,\n"
           f"       count(*) FILTER (WHERE ops.payload < {small} AND ops.short_name NOT LIKE '%-done%')\n"
           f"         / any_value(steps.n) AS small_allreduce_count_per_step,\n"
           f"       coalesce(sum(ops.duration_ps) FILTER (WHERE ops.payload < {small}), 0) / "
           f"any_value(steps.n)\n"
           f"         / 1e9 AS small_allreduce_ms_per_step\n"
           f"FROM steps LEFT JOIN ops ON TRUE")
    m = c.query(sql)
    frac = _f(m["small_allreduce_fraction_of_step"])
    if frac <= th["small_fraction"]:
        return []
    return finding(
        c, "distributed-batch-norm", "medium",
        f"{_f(m['small_allreduce_count_per_step']):.0f} all-reduces under {small / 1024:.0f} KB per "
        f"step take "
        f"{frac:.1%} of step time (batch-norm statistics over replica groups)",
        sql, m, _f(m["small_allreduce_ms_per_step"]) * th["gain_factor"],
        "replica groups mapped onto neighbouring cores: about half of the small all-reduce time "
        "(catalog §3.6)", "collectives")


def weight_update_unsharded(c: Ctx) -> list[dict]:  # catalog §3.2
    th = c.t["weight_update_unsharded"]
    # the run's data-parallel replicas (the gradient all-reduce's group, identity.replicas), not the cores
    # written; without replica groups in the trace, the devices with steps
    stated = c.identity.get("replicas")
    replicas_sql = (f"{int(stated)} AS replicas,  -- identity.replicas: the collectives' replica groups"
                    if stated else "count(DISTINCT host || ':' || device_ordinal) AS replicas,")
    sql = c.sql_steps(
        "sum(weight_update_ps) / sum(duration_ps) AS weight_update_fraction_of_step,\n"
        "       sum(weight_update_ps) / count(*) / 1e9 AS weight_update_ms_per_step,\n"
        f"       {replicas_sql}\n"
        f"       (SELECT count(*) > 0 FROM op_steps WHERE {c.in_train_steps()}\n"
        "          AND collective_kind IN ('reduce-scatter', 'all-gather')) AS reduce_scatter_or_all_gather")
    m = c.query(sql)
    if m["reduce_scatter_or_all_gather"]:
        return []
    sev = severity(m["weight_update_fraction_of_step"], th["medium"], th["high"])
    if not sev:
        return []
    replicas = max(int(m["replicas"] or 1), 1)
    return finding(
        c, "weight-update-unsharded", sev,
        f"the optimizer update is {_f(m['weight_update_fraction_of_step']):.1%} of step time "
        f"({_f(m['weight_update_ms_per_step']):.3f} ms) and no reduce-scatter/all-gather is present: every "
        f"replica repeats it",
        sql, m, _f(m["weight_update_ms_per_step"]) * (1 - 1 / replicas),
        "update x (1 - 1/N) with N replicas (catalog §3.2); the reduce-scatter + all-gather cost about what "
        "the all-reduce did", "weight_update")


def eval_overhead(c: Ctx) -> list[dict]:  # catalog §3.10: eval > 10% of wall time
    th = c.t["eval_overhead"]
    sql = (f"SELECT avg(eval_ps / wall_ps) AS eval_fraction_of_wall,  -- mean over devices\n"
           f"       avg(wall_ps) / 1e9 AS wall_ms, avg(eval_ps) / 1e9 AS eval_ms,\n"
           f"       avg(eval_ps / nullif(train_steps, 0)) / 1e9 AS eval_ms_per_train_step\n"
           f"FROM device_breakdown WHERE run_id = {c.run_id}")
    m = c.query(sql)
    sev = severity(m["eval_fraction_of_wall"], th["medium"], th["high"])
    if not sev:
        return []
    return finding(
        c, "eval-overhead", sev,
        f"eval takes {_f(m['eval_fraction_of_wall']):.1%} of wall time ({_f(m['eval_ms']):.1f} ms of "
        f"{_f(m['wall_ms']):.1f} ms)",
        sql, m, _f(m["eval_ms_per_train_step"]) * th["gain_factor"],
        "distributed, overlapped eval hides about half of it, amortized per train step (catalog §3.10)",
        "eval")


def host_overhead(c: Ctx) -> list[dict]:  # catalog §3.7, §4: idle >= 3%
    th = c.t["host_overhead"]
    warm = "" if c.t["warmup"]["keep"] else " AND NOT is_warmup"
    # The idle of the step cycle (first step to last), not of the capture: a set-up gap before the first
    # step is idle in the breakdown (as in XProf's duty cycle) but no per-step launch overhead. Nor is one
    # long pause between two steps (host work between calls of an eager capture): when the idlest gap of a
    # device (its length less the ops that ran in it) is most of its cycle idle, it is left out of the
    # recurring idle that severity and gain judge.
    sql = (f"WITH s AS (SELECT host, device_ordinal, start_ps + duration_ps AS gap_start,\n"
           f"                  lead(start_ps) OVER (PARTITION BY host, device_ordinal ORDER BY start_ps)"
           f" AS gap_end\n"
           f"           FROM step_breakdown WHERE run_id = {c.run_id}{warm}),\n"
           f"gaps AS (SELECT s.host, s.device_ordinal, s.gap_start,\n"
           f"                any_value(s.gap_end - s.gap_start) - coalesce(sum(o.duration_ps), 0)\n"
           f"                  AS idle_ps\n"
           f"         FROM s LEFT JOIN op_steps o ON o.run_id = {c.run_id} AND o.host = s.host\n"
           f"              AND o.device_ordinal = s.device_ordinal AND o.step_start IS NULL\n"
           f"              AND NOT o.is_container AND o.line <> 'Async XLA Ops'\n"
           f"              AND o.start_ps >= s.gap_start AND o.start_ps < s.gap_end\n"
           f"         WHERE s.gap_end > s.gap_start GROUP BY s.host, s.device_ordinal, s.gap_start),\n"
           # a gap's idle is at most the device's idle between steps: eval spans between two steps are
           # busy without ops in op_steps' gap rows, so the gap less its ops would overstate it
           f"dev AS (SELECT d.*, CASE WHEN least(w.idle_ps, d.idle_in_cycle_ps - d.idle_in_steps_ps)\n"
           f"                              > {th['one_off_gap_share']} * d.idle_in_cycle_ps\n"
           f"                         THEN least(w.idle_ps, d.idle_in_cycle_ps - d.idle_in_steps_ps)\n"
           f"                         ELSE 0 END AS one_off_ps\n"
           f"        FROM device_breakdown d\n"
           f"        LEFT JOIN (SELECT host, device_ordinal, max(idle_ps) AS idle_ps FROM gaps\n"
           f"                   GROUP BY ALL) w USING (host, device_ordinal)\n"
           f"        WHERE d.run_id = {c.run_id} AND d.train_steps > 0)\n"
           f"SELECT avg(idle_in_cycle_ps / cycle_ps) AS idle_fraction_of_cycle,  -- mean over devices\n"
           f"       sum(idle_in_steps_ps) / sum(mean_step_ps * train_steps) AS idle_in_step_fraction,\n"
           f"       avg(idle_in_cycle_ps / train_steps) / 1e9 AS idle_ms_per_step,\n"
           f"       avg((idle_in_cycle_ps - one_off_ps) / cycle_ps) AS recurring_idle_fraction_of_cycle,\n"
           f"       avg((idle_in_cycle_ps - one_off_ps) / train_steps) / 1e9 AS recurring_idle_ms_per_step,\n"
           f"       max(one_off_ps) / 1e9 AS one_off_gap_ms,\n"
           f"       avg(idle_ps / wall_ps) AS idle_fraction_of_wall,\n"
           f"       min(train_steps) AS min_train_steps, count(*) AS devices\n"
           f"FROM dev")
    m = c.query(sql)
    sev = severity(m["recurring_idle_fraction_of_cycle"], th["medium"], th["high"])
    if not sev:
        return []
    caveat = ""
    if _f(m["one_off_gap_ms"]) > 0:
        caveat += (f"; one pause between two steps ({_f(m['one_off_gap_ms']):.3g} ms on the worst device) is "
                   f"most of that idle and no per-step cost: the recurring idle, "
                   f"{_f(m['recurring_idle_fraction_of_cycle']):.1%}, is what the gain counts")
    if int(m["min_train_steps"] or 0) < th["min_steps"]:
        # a stall in one step reads as launch overhead: say so and rank it below measured findings
        sev = "low"
        caveat += (f"; measured over only {m['min_train_steps']} train step(s) on {m['devices']} device(s), "
                   f"too few to tell a steady launch gap from a one-off stall (a host sync, a late batch)")
    return finding(
        c, "host-overhead", sev,
        f"devices are idle {_f(m['idle_fraction_of_cycle']):.1%} of the step cycle (in-step idle "
        f"{_f(m['idle_in_step_fraction']):.1%} of step time plus gaps between steps): the host launches work "
        f"too slowly{caveat}",
        sql, m, _f(m["recurring_idle_ms_per_step"]),
        "the recurring idle between and inside steps removed once the host stops gating the device "
        "(catalog §3.7)",
        "idle")


def data_parallel_limit(c: Ctx) -> list[dict]:
    th = c.t["data_parallel_limit"]  # catalog §3.1, §3.13
    # Per device first, then the peaks: joining each op row to its device's peak was most of the
    # query's time on a pod (16M op rows against 4096 devices).
    sql = (f"WITH peaks AS (SELECT host, device_ordinal, max(peak_tflops) * 1e12 AS peak_flops FROM planes\n"
           f"               WHERE run_id = {c.run_id} AND device_ordinal IS NOT NULL GROUP BY ALL),\n"
           f"dev AS (SELECT host, device_ordinal,\n"
           f"               sum(flops) FILTER (WHERE NOT is_container) AS flops,\n"
           f"               sum(duration_ps) FILTER (WHERE NOT is_container AND flops IS NOT NULL)\n"
           f"                 AS flop_op_ps,\n"
           f"               sum(duration_ps) FILTER (WHERE category = 'compute' AND NOT is_container)\n"
           f"                 AS compute_ps,\n"
           f"               count(*) FILTER (WHERE collective_kind = 'collective-permute') AS permutes\n"
           f"        FROM op_steps WHERE {c.in_train_steps()} GROUP BY host, device_ordinal),\n"
           f"infeed AS (SELECT mode(TRY_CAST(nullif(regexp_extract(coalesce(shape, name), "
           f"'[a-z0-9]+\\[(\\d+)', 1), '')\n"
           f"                        AS DOUBLE)) AS per_core_batch\n"
           f"           FROM op_steps WHERE {c.in_train_steps()} AND category = 'input')\n"
           f"SELECT (SELECT per_core_batch FROM infeed) AS per_core_batch,\n"
           f"       coalesce(sum(d.permutes), 0) > 0 AS partitioned,\n"
           f"       sum(d.flops) / nullif(sum(d.flop_op_ps * p.peak_flops) / 1e12, 0) AS flop_utilization,\n"
           f"       sum(d.compute_ps)\n"
           f"         / (SELECT count(*) FROM step_breakdown WHERE run_id = {c.run_id} AND NOT is_eval) "
           f"/ 1e9\n"
           f"         AS compute_op_ms_per_step\n"
           f"FROM dev d LEFT JOIN peaks p ON p.host = d.host AND p.device_ordinal = d.device_ordinal")
    m = c.query(sql)
    batch, util = m["per_core_batch"], m["flop_utilization"]
    if batch is None or m["partitioned"] or batch > th["max_per_core_batch"]:
        return []
    low_util = util is not None and util < th["max_flop_utilization"]
    sev = "high" if batch < 1 else "medium" if low_util or util is None else "low"
    gain_ms = (_f(m["compute_op_ms_per_step"]) * max(1 - util / th["max_flop_utilization"], 0.0)
               * th["gain_factor"]) if util else 0.0
    return finding(
        c, "data-parallel-limit", sev,
        f"{batch:g} examples per core (leading dimension of the infeed shape) with no spatial/model "
        f"partitioning; "
        f"FLOP utilization {'n/a' if util is None else f'{util:.1%}'}",
        sql, m, gain_ms,
        "larger per-core slices via partitioning raise MXU use; rough quarter of the under-utilized compute "
        "(catalog §3.1)", "compute")


def partition_overhead(c: Ctx) -> list[dict]:  # catalog §3.1: collective-permute > 10%
    th = c.t["partition_overhead"]
    sql = (f"WITH {c.train_steps_cte()},\n"
           f"cp AS (SELECT sum(duration_ps) AS ps FROM op_steps\n"
           f"       WHERE {c.in_train_steps()} AND collective_kind = 'collective-permute'),\n"
           f"exposed AS (SELECT sum(t.exposed_ps) AS ps FROM collective_time t JOIN step_breakdown s\n"
           f"              ON s.run_id = t.run_id AND s.host = t.host AND s.device_ordinal = "
           f"t.device_ordinal\n"
           f"             AND s.start_ps = t.step_start\n"
           f"            WHERE t.run_id = {c.run_id} AND NOT s.is_eval AND t.kind = 'collective-permute')\n"
           f"SELECT coalesce(cp.ps, 0) / steps.ps AS collective_permute_fraction_of_step,\n"
           f"       coalesce(cp.ps, 0) / steps.n / 1e9 AS collective_permute_ms_per_step,\n"
           f"       coalesce(exposed.ps, 0) / steps.n / 1e9 AS collective_permute_exposed_ms_per_step\n"
           f"FROM steps, cp, exposed")
    m = c.query(sql)
    sev = severity(m["collective_permute_fraction_of_step"], th["medium"], th["high"])
    if not sev:
        return []
    cp_ms, exposed = _f(m["collective_permute_ms_per_step"]), _f(m["collective_permute_exposed_ms_per_step"])
    return finding(
        c, "partition-overhead", sev,
        f"collective-permute (halo exchange) takes {_f(m['collective_permute_fraction_of_step']):.1%} "
        f"of step "
        f"time ({cp_ms:.3f} ms per step, {exposed:.3f} ms exposed)",
        sql, m, max(exposed, cp_ms * th["gain_factor"]),
        "fewer partitions / overlapped halos: the exposed halo time, at least half the permute time "
        "(catalog §3.1)", "collectives")


def data_formatting(c: Ctx) -> list[dict]:  # catalog §3.9
    th = c.t["data_formatting"]
    pattern = sql_literal(c.t["patterns"]["data_formatting"])
    # ``ops`` NOT MATERIALIZED: DuckDB materializes a CTE read twice, which copied every compute op
    # row of a pod (4x this query's time); the regex runs once per distinct op name, not per row.
    sql = (f"WITH ops AS NOT MATERIALIZED (\n"
           f"  SELECT host, device_ordinal, step_start, start_ps, duration_ps, short_name, hlo_category\n"
           f"  FROM op_steps WHERE {c.in_train_steps()} AND category IN ('compute', 'weight_update')\n"
           f"    AND NOT is_container),\n"
           f"names AS (SELECT short_name, hlo_category, sum(duration_ps) AS op_ps,\n"
           f"                 regexp_matches(lower(short_name), {pattern})\n"
           f"                   OR lower(coalesce(hlo_category, '')) = 'data formatting' AS formatting\n"
           f"          FROM ops GROUP BY short_name, hlo_category),\n"
           f"conv AS (SELECT DISTINCT hlo_category FROM names\n"
           f"         WHERE lower(coalesce(hlo_category, '')) LIKE '%convolution%'),\n"
           f"firsts AS (SELECT arg_min(duration_ps, start_ps) AS d FROM ops\n"
           f"           WHERE hlo_category IN (SELECT hlo_category FROM conv)\n"
           f"           GROUP BY host, device_ordinal, step_start),\n"
           f"{c.train_steps_cte()}\n"
           f"SELECT sum(op_ps) FILTER (WHERE formatting) / sum(op_ps) AS "
           f"data_formatting_share_of_compute,\n"
           f"       coalesce(sum(op_ps) FILTER (WHERE formatting), 0) / any_value(steps.n) / 1e9\n"
           f"         AS data_formatting_ms_per_step,\n"
           f"       (SELECT avg(d) FROM firsts) * any_value(steps.n) / sum(op_ps)\n"
           f"         AS first_conv_share_of_compute,\n"
           f"       sum(op_ps) / any_value(steps.n) / 1e9 AS compute_op_ms_per_step\n"
           f"FROM names, steps")
    m = c.query(sql)
    share, first_conv = m["data_formatting_share_of_compute"], m["first_conv_share_of_compute"]
    if share is None:
        return []
    sev = severity(share, th["medium"])
    if not sev and first_conv is not None and first_conv >= th["first_conv_fraction"]:
        sev = "medium"
    if not sev:
        return []
    gain_ms = (_f(m["data_formatting_ms_per_step"]) * th["gain_factor"]
               + _f(first_conv) * _f(m["compute_op_ms_per_step"]) * th["first_conv_gain_factor"])
    return finding(
        c, "data-formatting", sev,
        f"copies/transposes are {share:.1%} of compute time"
        + (f"; the first convolution is {first_conv:.1%} of compute" if first_conv is not None else ""),
        sql, m, gain_ms,
        "native layouts remove most copies/transposes, space-to-depth half the first convolution "
        "(catalog §3.9)", "compute", variant="conv" if first_conv is not None else "")


def straggler(c: Ctx) -> list[dict]:  # catalog §3.8 (infeed max/avg > 2), §3.3 (sync > compute)
    th = c.t["straggler"]
    kinds = ", ".join(f"'{k}'" for k in GRADIENT_KINDS)
    sql = (f"WITH st AS (SELECT host, device_ordinal, count(*) AS n, sum(input_ps) AS input_ps\n"
           f"            FROM step_breakdown WHERE run_id = {c.run_id} AND NOT is_eval GROUP BY ALL),\n"
           f"inf AS (SELECT host, device_ordinal, sum(duration_ps) AS infeed_ps FROM op_steps\n"
           f"        WHERE {c.in_train_steps()} AND category = 'input' GROUP BY ALL),\n"
           f"core AS (SELECT st.host, st.device_ordinal, coalesce(inf.infeed_ps, st.input_ps) / st.n / "
           f"1e9 AS ms\n"
           f"         FROM st LEFT JOIN inf USING (host, device_ordinal)),\n"
           f"-- hosts are compared when there are several (a slow host feeds all its cores late), else "
           f"cores\n"
           f"unit AS (SELECT any_value(host) AS host, avg(ms) AS ms FROM core\n"
           f"         GROUP BY CASE WHEN (SELECT count(DISTINCT host) FROM core) > 1 THEN host\n"
           f"                       ELSE host || ':' || device_ordinal END),\n"
           f"outlier AS (SELECT arg_max(host, ms) AS worst_host, max(ms) AS infeed_ms_worst,\n"
           f"                   (sum(ms) - max(ms)) / nullif(count(*) - 1, 0) AS infeed_ms_rest FROM unit),\n"
           f"-- XProf's split: compute = per collective instance the minimum across cores, sync = the rest\n"
           f"g AS (SELECT host, device_ordinal, step_num, step_start, short_name, duration_ps,\n"
           f"             row_number() OVER (PARTITION BY host, device_ordinal, step_start, short_name\n"
           f"                                ORDER BY start_ps) AS occurrence\n"
           f"      FROM op_steps WHERE {c.in_train_steps()} AND collective_kind IN ({kinds})),\n"
           f"inst AS (SELECT min(duration_ps) AS ps FROM g GROUP BY step_num, short_name, occurrence),\n"
           f"split AS (SELECT (SELECT sum(ps) FROM inst) / nullif((SELECT count(DISTINCT step_num) FROM "
           f"g), 0)\n"
           f"                   / 1e9 AS compute_ms,\n"
           f"                 (SELECT sum(duration_ps) FROM g) / nullif((SELECT count(*) FROM\n"
           f"                   (SELECT DISTINCT host, device_ordinal, step_start FROM g)), 0) / 1e9 AS "
           f"total_ms)\n"
           f"SELECT outlier.worst_host, outlier.infeed_ms_worst, outlier.infeed_ms_rest,\n"
           f"       outlier.infeed_ms_worst / nullif(outlier.infeed_ms_rest, 0) AS infeed_worst_over_rest,\n"
           f"       split.compute_ms AS collective_compute_ms,\n"
           f"       greatest(split.total_ms - split.compute_ms, 0) AS collective_sync_ms,\n"
           f"       coalesce((SELECT sum(duration_ps) FROM g), 0) / (SELECT sum(n) FROM st) / 1e9\n"
           f"         AS gradient_collective_ms_per_step,\n"
           f"       (SELECT count(*) FROM st) AS devices,\n"
           f"       (SELECT sum(duration_ps) FROM step_breakdown WHERE run_id = {c.run_id} AND NOT is_eval)\n"
           f"         / (SELECT sum(n) FROM st) / 1e9 AS step_ms\n"
           f"FROM outlier, split")
    m = c.query(sql)
    step_ms = max(_f(m["step_ms"]), 1e-12)
    reasons: list[str] = []
    kinds_found: list[str] = []
    sev, excess, category = None, 0.0, "input"
    worst, rest, ratio = _f(m["infeed_ms_worst"]), _f(m["infeed_ms_rest"]), m["infeed_worst_over_rest"]
    if m["infeed_ms_rest"] is not None and (ratio is None and worst > 0 or ratio is not None
                                             and ratio > th["infeed_max_over_mean"]):
        if worst / step_ms >= th["min_infeed_fraction"]:
            times = "" if ratio is None else f" ({ratio:.1f}x)"
            reasons.append(f"host {m['worst_host']} waits {worst:.3f} ms per step in infeed vs {rest:.3f} ms "
                           f"on the others{times}")
            sev = "high" if ratio is None or ratio > th["high_infeed_max_over_mean"] else "medium"
            excess = worst - rest
            kinds_found.append("infeed")
    compute, sync = _f(m["collective_compute_ms"]), _f(m["collective_sync_ms"])
    total = _f(m["gradient_collective_ms_per_step"])
    if (m["devices"] or 0) > 1 and total / step_ms >= th["min_allreduce_fraction"] \
            and sync > th["sync_over_compute"] * compute:
        reasons.append(f"gradient collective sync {sync:.3f} ms > compute {compute:.3f} ms per step: cores "
                       f"wait for a slower one")
        sev = sev or "medium"
        kinds_found.append("sync")
        # the slow core's excess shows on every other core as collective sync wait (and on its own cores
        # as infeed wait, when that fired too): that time is saved
        excess = max(excess, sync - compute)
        category = "collectives+input" if kinds_found[0] == "infeed" else "collectives"
    if not reasons:
        return []
    out = finding(
        c, "straggler", sev or "medium", "; ".join(reasons), sql, m, excess,
        "the slowest host's excess wait (its infeed minus the others', or collective sync minus compute) "
        "removed by fixing it (catalog §3.3, §3.8)", category)
    for f in out:
        f["_reasons"] = kinds_found  # which symptom fired: the tree links the findings it explains
    return out


RULES = (input_bound, host_input_processing, outfeed_bound, collective_bound, f32_gradient_allreduce,
         latency_bound, distributed_batch_norm, weight_update_unsharded, eval_overhead, host_overhead,
         data_parallel_limit, partition_overhead, data_formatting, straggler)
