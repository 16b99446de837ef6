"""The attribution stages run host by host: memory bounded by the largest host, not by the pod.

Every stage of attribution.sql but two is a function of one host's events: the run's flags
(``att_runs``: does any host have a Steps line, ...) and the dominant program (the non-eval program
with the most execution time over the run) are the run's. So the stages run in three passes over the
hosts, each host's query reading only that host's row groups:

1. ``att_runs`` per host, OR-ed into the run's flags (an EXISTS over the run is the OR of the hosts').
2. ``att_programs`` per host, appended into the run's program executions (small: one row per program
   execution per device); the dominant program is then the run's, as in the whole-run SQL.
3. The other stages per host. The per-host results that are small (steps, step breakdown, device
   breakdown, collective time per step, eval and input spans) are appended into the run's TEMP tables;
   the elementary intervals (one row per op boundary) live only while their host is processed; a
   batch's ops are narrow rows over the run's op kinds (analyzer/op_kinds.py, ``att_ops`` a view); the
   per-op relation ``op_steps`` is appended, narrow, into a table of a scratch database file (read
   through a view joining the kinds back), whose blocks DuckDB
   evicts to disk under its memory limit, so the reduce-side queries over it (the findings' evidence
   SQL) run in bounded memory; the readers whose result is a sum over hosts (top ops, collectives,
   infeed) take partial aggregates from each batch's op rows instead (a hook, ``on_batch``).

The relations returned have the same names, columns and rows as ``materialize_run``'s (row order aside).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from string import Template
from typing import Any

import duckdb
from tpuanalyze.analyzer.attribution import (
    RUN_FLAGS,
    _substitutions,
    load_stages,
    run_flags,
    stage_without_sql,
)
from tpuanalyze.analyzer.classify import sql_literal
from tpuanalyze.analyzer.op_kinds import OP_STEPS_OWN, OpKinds, kind_of_op_steps, op_steps_select
from tpuanalyze.analyzer.sweep import OpSteps, sweep_in_sql

# Stages whose per-host rows are kept for the run (TEMP tables); the rest live per host only.
KEPT_STAGES = ("att_runs", "att_programs", "att_steps", "att_eval_spans", "att_input_spans",
               "step_breakdown", "device_breakdown", "collective_time")
SCRATCH = "ta_scratch"  # the attached scratch database holding the run's op_steps
# One host's relations that are views rather than tables: att_intervals (one row per op, eval span and
# step) is read once, by att_elementary, so copying it would only hold a second op-sized relation in memory;
# att_ops is the batch's narrow op rows joined to the run's op kinds (analyzer/op_kinds.py).
LOCAL_KIND = {"att_intervals": "VIEW", "att_ops": "VIEW"}
# One host's op-sized relations no stage after them reads once the step tables exist (op_steps reads
# att_ops and step_breakdown): dropped before op_steps, which then runs in the memory they held.
FREED_BEFORE_OP_STEPS = ("att_intervals", "att_elementary")


# Events per batch of hosts: one statement per stage and batch costs a fixed planning and classification
# time, so small hosts go together; a host larger than this is a batch of its own.
BATCH_EVENTS = 1_000_000


def run_hosts(con: duckdb.DuckDBPyConnection, run_id: int) -> list[str]:
    """The hosts whose planes the run has (every event belongs to a plane of its host), in SQL order."""
    rows = con.execute("SELECT DISTINCT host FROM planes WHERE run_id = ? ORDER BY host", [int(run_id)])
    return [r[0] for r in rows.fetchall()]


def largest_batch_events(con: duckdb.DuckDBPyConnection, run_id: int) -> int:
    """Events of the largest batch: BATCH_EVENTS, or the largest host when it has more."""
    row = con.execute("SELECT max(n) FROM (SELECT sum(num_events) AS n FROM planes WHERE run_id = ? "
                      "GROUP BY host)", [int(run_id)]).fetchone()
    return max(BATCH_EVENTS, int(row[0] or 0) if row else 0)


def host_batches(con: duckdb.DuckDBPyConnection, run_id: int,
                 batch_events: int | None = None) -> list[tuple[str, str]]:
    """Consecutive hosts (in SQL string order) grouped up to ``batch_events`` events, as (first, last)
    host names: a batch is the hosts BETWEEN them, which the store's row-group statistics prune to."""
    rows = con.execute("SELECT host, sum(num_events) FROM planes WHERE run_id = ? GROUP BY host "
                       "ORDER BY host", [int(run_id)]).fetchall()
    limit = BATCH_EVENTS if batch_events is None else batch_events
    batches: list[tuple[str, str]] = []
    first, total = None, 0
    for i, (host, events) in enumerate(rows):
        if first is None:
            first, total = host, 0
        total += int(events or 0)
        if i + 1 == len(rows) or total + int(rows[i + 1][1] or 0) > limit:
            batches.append((first, host))
            first = None
    return batches


def append_rows(con: duckdb.DuckDBPyConnection, table: str, select: str, first: bool) -> None:
    """A TEMP table of ``select``'s rows when ``first``, else those rows appended to it."""
    if first:
        con.execute(f"CREATE OR REPLACE TEMP TABLE {table} AS {select}")
    else:
        con.execute(f"INSERT INTO {table} {select}")


# The reduce-side hook: called with each batch's op rows (a relation with op_steps' columns).
BatchHook = Callable[[duckdb.DuckDBPyConnection, str], None]


def _append_op_rows(con: duckdb.DuckDBPyConnection, op_rows: str, rows: str) -> None:
    """Append a batch's narrow op rows, its collectives first: they then fill row groups of their own,
    whose statistics let the findings' evidence SQL (``collective_kind IN (...)``) skip the compute ops'."""
    con.execute(f"INSERT INTO {op_rows} SELECT * FROM ({rows}) WHERE collective_kind IS NOT NULL")
    con.execute(f"INSERT INTO {op_rows} SELECT * FROM ({rows}) WHERE collective_kind IS NULL")


def _op_steps_with_hook(con: duckdb.DuckDBPyConnection, op_rows: str, kinds: str, text: str,
                        on_batch: BatchHook) -> None:
    """Append the batch's op rows to the run's and hand them to ``on_batch`` with op_steps' columns:
    the rows from the row count before on (an append-only table numbers its rows in order, and a rowid
    filter reads only the row groups holding them), so the partial aggregates read the batch, not the run."""
    before = int(con.execute(f"SELECT count(*) FROM {op_rows}").fetchone()[0])
    _append_op_rows(con, op_rows, text)
    on_batch(con, f"({op_steps_select(op_rows, kinds, f'o.rowid >= {before}')})")


@contextmanager
def _op_rows(con: duckdb.DuckDBPyConnection, text: str, rows: str, kinds: str,
             rel: dict[str, str]) -> Iterator[str]:
    """The SELECT of a batch's narrow op_steps rows (OP_STEPS_OWN) from its narrow op rows ``rows``: the
    step lookup in numpy (analyzer/sweep.py), or the stage's SQL ``text`` when TPUANALYZE_SWEEP=sql."""
    if sweep_in_sql():
        yield kind_of_op_steps(text, kinds)
        return
    columns = ", ".join("device AS device_ordinal" if c == "device_ordinal" else c
                        for c in OP_STEPS_OWN if not c.startswith("step_"))
    with OpSteps(con, rows, rel["step_breakdown"], f"{rows}_steps", columns) as found:
        yield found.sql


def materialize_per_host(con: duckdb.DuckDBPyConnection, run_id: int, config: dict[str, Any],
                         batches: list[tuple[str, str]], prefix: str = "ta_",
                         on_batch: BatchHook | None = None) -> dict[str, str]:
    """Create the run's relations batch of hosts by batch (module docstring); return stage name ->
    relation name. ``on_batch``, when given, is called with each batch's op rows once they are made
    (the reduce side's partial aggregates, analyzer/batch_reduce.py).
    The connection must have the scratch database attached as ``ta_scratch``."""
    stages = dict(load_stages())
    run_filter = f"run_id = {int(run_id)}"
    local = f"{prefix}h_"  # one host's relations, replaced host after host

    flags: dict[str, bool] | None = None  # the run's, once pass 1 has found them

    def subs(relation: dict[str, str], host: tuple[str, str]) -> dict[str, str]:
        return _substitutions(config, run_filter, relation, host, flags)

    def sql(name: str, relation: dict[str, str], host: tuple[str, str]) -> str:
        return Template(stages[name]).safe_substitute(subs(relation, host))

    def run(kind: str, table: str, text: str, stage: str) -> None:
        try:
            con.execute(f"CREATE OR REPLACE TEMP {kind} {table} AS {text}")
        except duckdb.Error as exc:
            raise RuntimeError(f"attribution stage {stage} failed: {exc}") from exc

    # pass 1: the run's flags, OR over the hosts
    for i, host in enumerate(batches):
        append_rows(con, f"{prefix}att_runs_parts", sql("att_runs", {}, host), i == 0)
    run("TABLE", f"{prefix}att_runs",
        f"SELECT run_id, {', '.join(f'bool_or({f}) AS {f}' for f in RUN_FLAGS)} "
        f"FROM {prefix}att_runs_parts GROUP BY run_id", "att_runs")
    con.execute(f"DROP TABLE {prefix}att_runs_parts")
    runs_rel = {"att_runs": f"{prefix}att_runs"}
    flags = run_flags(con, f"{prefix}att_runs")
    known = flags or dict.fromkeys(RUN_FLAGS, False)
    has_dev, has_steps, has_modules, has_groups = (
        known[f] for f in ("has_device_planes", "has_steps_line", "has_modules_line", "has_group_ids"))
    # att_programs reads att_ops only for program executions found through host launches
    programs_need_ops = bool(has_dev and not has_modules and not has_steps and not has_groups)

    kinds = OpKinds(con, f"{prefix}op_kinds")

    def att_ops(relation: dict[str, str], host: tuple[str, str]) -> str:
        """The batch's att_ops: narrow op rows over the run's kinds (analyzer/op_kinds.py), as a view."""
        try:
            return kinds.narrow(subs(relation, host), sql("att_ops", relation, host), flags, local)[1]
        except duckdb.Error as exc:
            raise RuntimeError(f"attribution stage att_ops failed: {exc}") from exc

    # pass 2: the run's program executions (the dominant program is the run's)
    for i, host in enumerate(batches):
        if programs_need_ops:
            ops = att_ops(runs_rel, host)
        else:
            ops = f"{local}att_ops_none"
            run("TABLE", ops, f"SELECT * FROM ({sql('att_ops', runs_rel, host)}) LIMIT 0", "att_ops")
        rel = {**runs_rel, "att_ops": ops}
        append_rows(con, f"{prefix}att_programs", sql("att_programs", rel, host), i == 0)
    con.execute(f"DROP TABLE IF EXISTS {local}att_ops_none")

    # pass 3: everything else, host by host
    op_rows = f"{SCRATCH}.{prefix}op_rows"  # the run's narrow op_steps rows (OP_STEPS_OWN)
    for i, host in enumerate(batches):
        rel = {**runs_rel, "att_programs_run": f"{prefix}att_programs"}
        for name in stages:
            if name in ("att_runs", "op_steps"):
                continue
            table = f"{local}{name}"
            if name == "att_programs":
                run("VIEW", table, f"SELECT * FROM {prefix}att_programs WHERE host "
                    f"BETWEEN {sql_literal(host[0])} AND {sql_literal(host[1])}", name)
            elif name == "att_ops":
                table = att_ops(rel, host)
            elif not stage_without_sql(con, name, rel, table):
                run(LOCAL_KIND.get(name, "TABLE"), table, sql(name, rel, host), name)
            rel[name] = table
            if name in KEPT_STAGES and name != "att_programs":
                append_rows(con, f"{prefix}{name}", f"SELECT * FROM {table}", i == 0)
        # the batch's op-boundary relations are read by no later stage: their memory goes to op_steps
        for name in FREED_BEFORE_OP_STEPS:
            con.execute(f"DROP {LOCAL_KIND.get(name, 'TABLE')} IF EXISTS {local}{name}")
        text = sql("op_steps", rel, host)
        try:
            if i == 0:  # (empty first: CREATE TABLE AS with the ASOF join plans far slower than INSERT)
                con.execute(f"CREATE OR REPLACE TABLE {op_rows} AS SELECT * FROM "
                            f"({kind_of_op_steps(text, kinds.table)}) LIMIT 0")
            with _op_rows(con, text, f"{local}op_rows", kinds.table, rel) as rows:
                if on_batch is None:
                    _append_op_rows(con, op_rows, rows)
                else:
                    _op_steps_with_hook(con, op_rows, kinds.table, rows, on_batch)
        except duckdb.Error as exc:
            raise RuntimeError(f"attribution stage op_steps failed: {exc}") from exc
    for name in stages:
        kind = "VIEW" if name == "att_programs" else LOCAL_KIND.get(name, "TABLE")
        con.execute(f"DROP {kind} IF EXISTS {local}{name}")
    con.execute(f"DROP TABLE IF EXISTS {local}op_rows")
    # written to the file: the readers' scans then page its blocks in and out under the memory limit
    con.execute(f"CHECKPOINT {SCRATCH}")

    relation = {name: f"{prefix}{name}" for name in KEPT_STAGES}
    # the run's op_steps: its narrow op rows joined to its op kinds (the stage's columns)
    op_steps = f"{prefix}op_steps"
    con.execute(f"CREATE OR REPLACE TEMP VIEW {op_steps} AS {op_steps_select(op_rows, kinds.table)}")
    relation["op_steps"] = op_steps
    # the op rows of the run, as att_ops' readers use them (device, category, short_name, ...)
    # (a name of its own: the whole-run path's ta_att_ops is a table)
    con.execute(f"CREATE OR REPLACE TEMP VIEW {prefix}att_ops_all AS "
                f"SELECT *, device_ordinal AS device FROM {op_steps}")
    relation["att_ops"] = f"{prefix}att_ops_all"
    return relation
