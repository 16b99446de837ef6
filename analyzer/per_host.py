"""The attribution stages run host by host: memory bounded by the largest host, not by the pod.

Every stage of attribution.sql but two is a function of one host's events: the run's flags
(``att_runs``: does any host have a Steps line, ...) and the dominant program (the non-eval program
with the most execution time over the run) are the run's. So the stages run in three passes over the
hosts, each host's query reading only that host's row groups:

1. ``att_runs`` per host, OR-ed into the run's flags (an EXISTS over the run is the OR of the hosts').
2. ``att_programs`` per host, appended into the run's program executions (small: one row per program
   execution per device); the dominant program is then the run's, as in the whole-run SQL.
3. The other stages per host. The per-host results that are small (steps, step breakdown, device
   breakdown, collective time per step, eval and input spans) become the run's TEMP tables;
   the elementary intervals (one row per op boundary) live only while their host is processed; a
   batch's ops are narrow rows over the run's op kinds (analyzer/op_kinds.py, ``att_ops`` a view); the
   per-op relation ``op_steps`` is written, narrow, into a table per batch of a scratch database file (read
   through a view joining the kinds back), whose blocks DuckDB
   evicts to disk under its memory limit, so the reduce-side queries over it (the findings' evidence
   SQL) run in bounded memory; the readers whose result is a sum over hosts (top ops, collectives,
   infeed) take partial aggregates from each batch's op rows instead (a hook, ``on_batch``).

Each pass runs over all batches, ``BATCH_THREADS`` batches at once, each on a cursor of its own in a
thread (``in_threads``); what the batches share or hand on (the run's flags, programs and op kinds,
each batch's results) lives in the scratch database, as a cursor sees only its own TEMP relations. The
batches' results then become the caller's TEMP tables in batch order.

The relations returned have the same names, columns and rows as ``materialize_run``'s (row order aside).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from string import Template
from typing import Any, TypeVar

import duckdb
from tpuanalyze.analyzer.attribution import (
    RUN_FLAGS,
    _substitutions,
    chrome_json_run,
    load_stages,
    run_flags,
    stage_error,
    stage_without_sql,
)
from tpuanalyze.analyzer.batch_engine import (
    ENGINE_STAGES,
    collective_time,
    engine_enabled,
    off_op_line_events,
    op_steps_rows,
    outside_steps,
    step_breakdown,
    sweep_batch,
)
from tpuanalyze.analyzer.classify import sql_literal
from tpuanalyze.analyzer.op_kinds import (
    OP_STEPS_OWN,
    OpKinds,
    empty_att_ops,
    fast_path,
    kind_of_op_steps,
    op_steps_select,
)
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


def concat_tables(con: duckdb.DuckDBPyConnection, target: str, parts: list[str], temp: bool = True) -> None:
    """(TEMP) TABLE ``target`` holding the rows of tables ``parts`` one after the other (their order:
    the batches', as one connection appending them in turn would have written them); parts dropped."""
    for i, part in enumerate(parts):
        if i == 0:
            con.execute(f"CREATE OR REPLACE {'TEMP ' if temp else ''}TABLE {target} AS SELECT * FROM {part}")
        else:
            con.execute(f"INSERT INTO {target} SELECT * FROM {part}")
        con.execute(f"DROP TABLE {part}")


# The reduce-side hook: called with each batch's op rows (a relation with op_steps' columns), the
# batch's index, its step_breakdown relation and its op rows as (narrow rows, kinds), on the cursor that
# made them (any thread: partials are combined in batch order after).
BatchHook = Callable[[duckdb.DuckDBPyConnection, str, int, str, tuple[str, str]], None]

# Batches attributed at once, each on its own cursor in a thread of its own: DuckDB runs a statement
# without Python's lock, and one batch's statements keep only ~1.5 of two cores busy (single-threaded
# inserts, short statements, the sweep in numpy), so two batches side by side fill them
# (docs/attribution.md, "Batches in threads"). TPUANALYZE_BATCH_THREADS overrides (1: one at a time).
BATCH_THREADS = 2


def batch_threads(batches: int, largest_events: int = 0) -> int:
    """Threads for ``batches`` batches: BATCH_THREADS (at most the machine's cores), or
    TPUANALYZE_BATCH_THREADS, at most one per batch;
    one where a host alone is larger than a batch (``largest_events``: the largest batch's events), so
    two such hosts never share the memory one of them is allowed (the analysis' bound: its largest host)."""
    text = os.environ.get("TPUANALYZE_BATCH_THREADS", "").strip()
    wanted = int(text) if text.isdigit() and int(text) > 0 else min(BATCH_THREADS, os.cpu_count() or 1)
    if largest_events > BATCH_EVENTS:
        wanted = 1
    return max(1, min(wanted, batches))


T = TypeVar("T")


def in_threads(con: duckdb.DuckDBPyConnection, threads: int, count: int,
               work: Callable[[duckdb.DuckDBPyConnection, int], T]) -> list[T]:
    """``work(cursor, i)`` for i in 0..count-1, ``threads`` at a time, each thread on a cursor of its own
    (its TEMP relations its own; the scratch database shared); results in order. The first failure is
    raised once every batch started has stopped; Ctrl-C interrupts the cursors' statements."""
    if threads <= 1:
        return [work(con, i) for i in range(count)]
    local = threading.local()
    cursors: list[duckdb.DuckDBPyConnection] = []
    lock = threading.Lock()
    failed = threading.Event()

    def cursor() -> duckdb.DuckDBPyConnection:
        cur = getattr(local, "cursor", None)
        if cur is None:
            cur = con.cursor()
            cur.execute("SET enable_progress_bar = false")
            local.cursor = cur
            with lock:
                cursors.append(cur)
        return cur

    def task(i: int) -> T | None:
        if failed.is_set():  # a batch failed: the others are not started
            return None
        try:
            return work(cursor(), i)
        except BaseException:
            failed.set()
            raise

    pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ta-batch")
    futures = [pool.submit(task, i) for i in range(count)]
    try:
        results = [future.result() for future in futures]
    except BaseException as exc:
        failed.set()
        for future in futures:
            future.cancel()
        with lock:
            for cur in cursors:
                cur.interrupt()
        pool.shutdown(wait=True)
        _close(cursors)
        if not isinstance(exc, Exception):  # Ctrl-C, SIGTERM: that, not the statements it interrupted
            raise
        for future in futures:  # the first batch that failed (in batch order) is the one to report
            if future.done() and not future.cancelled() and future.exception() is not None:
                raise future.exception() from None  # type: ignore[misc]
        raise
    pool.shutdown(wait=True)
    _close(cursors)
    return results  # type: ignore[return-value]


def _close(cursors: list[duckdb.DuckDBPyConnection]) -> None:
    for cur in cursors:
        try:
            cur.close()
        except duckdb.Error:
            pass


def collectives_first(rows: Any) -> Any:
    """A batch's narrow op rows (Arrow) with its collectives first, as ``_append_op_rows`` stores
    them: in a file of row groups, the findings' collective filters then skip the compute ops' groups."""
    import pyarrow as pa
    import pyarrow.compute as pc

    collective = pc.is_valid(rows.column("collective_kind"))
    return pa.concat_tables([rows.filter(collective), rows.filter(pc.invert(collective))])


def _append_op_rows(con: duckdb.DuckDBPyConnection, op_rows: str, rows: str) -> None:
    """Append a batch's narrow op rows, its collectives first: they then fill row groups of their own,
    whose statistics let the findings' evidence SQL (``collective_kind IN (...)``) skip the compute ops'."""
    con.execute(f"INSERT INTO {op_rows} SELECT * FROM ({rows}) WHERE collective_kind IS NOT NULL")
    con.execute(f"INSERT INTO {op_rows} SELECT * FROM ({rows}) WHERE collective_kind IS NULL")


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
                         on_batch: BatchHook | None = None, threads: int | None = None,
                         programs_run: str | None = None,
                         op_rows_sink: Callable[[int, Any], str] | None = None,
                         batch: Any = None, flags_given: dict[str, bool] | None = None,
                         events_relation: str | None = None) -> dict[str, str]:
    """Create the run's relations batch of hosts by batch (module docstring); return stage name ->
    relation name. ``on_batch``, when given, is called with each batch's op rows once they are made
    (the reduce side's partial aggregates, analyzer/batch_reduce.py). ``threads``: batches attributed
    at once (default ``batch_threads``: 2, or 1 where a host is larger than a batch). The connection
    must have the scratch database attached as ``ta_scratch``; the run-wide relations the batches read
    live there (a cursor sees no other's TEMP). ``programs_run``: a relation of the run's program
    executions (att_programs' columns, every host) for the dominant program, where the connection
    holds only some of the run's hosts (a batch of a map worker, analyzer/batch_map.py).
    ``op_rows_sink(i, rows)``: batch i's narrow op rows (an Arrow table, collectives first) are given
    to it instead of the scratch database; it returns a Parquet file holding them, which the run's
    ``op_steps`` view reads. ``batch``: the one batch's rows in memory (``store.batch.BatchTables``:
    the connection's base tables are its registered rows), whose arrays the op rows are made from;
    ``flags_given``: its att_runs flags, found from those arrays (``batch_engine.batch_flags``);
    ``events_relation``: its events off the device op lines (``$events`` of the stages after att_ops)."""
    stages = dict(load_stages())
    run_filter = f"run_id = {int(run_id)}"
    local = f"{prefix}h_"  # one batch's relations (TEMP, on the batch's cursor), replaced batch after batch
    shared = f"{SCRATCH}.{prefix}"  # the run's relations the batches read, and each batch's results
    if threads is None:
        threads = batch_threads(len(batches), largest_batch_events(con, run_id))
    threads = max(1, min(threads, len(batches)))

    flags: dict[str, bool] | None = None  # the run's, once pass 1 has found them
    chrome_json = chrome_json_run(con, run_id)

    def subs(relation: dict[str, str], host: tuple[str, str]) -> dict[str, str]:
        return _substitutions(config, run_filter, relation, host, flags, chrome_json)

    def sql(name: str, relation: dict[str, str], host: tuple[str, str]) -> str:
        return Template(stages[name]).safe_substitute(subs(relation, host))

    def run(cur: duckdb.DuckDBPyConnection, kind: str, table: str, text: str, stage: str) -> None:
        try:
            cur.execute(f"CREATE OR REPLACE {kind} {table} AS {text}")
        except duckdb.Error as exc:
            raise stage_error(stage, exc) from exc

    def part(name: str, i: int) -> str:  # batch i's rows of a run-wide relation
        return f"{shared}b{i}_{name}"

    # pass 1: the run's flags, OR over the hosts
    def pass1(cur: duckdb.DuckDBPyConnection, i: int) -> None:
        if flags_given is not None:
            values = ", ".join(f"{'TRUE' if flags_given[f] else 'FALSE'} AS {f}" for f in RUN_FLAGS)
            run(cur, "TABLE", part("att_runs", i),
                f"SELECT CAST({int(run_id)} AS INTEGER) AS run_id, {values}", "att_runs")
            return
        run(cur, "TABLE", part("att_runs", i), sql("att_runs", {}, batches[i]), "att_runs")

    in_threads(con, threads, len(batches), pass1)
    parts = " UNION ALL ".join(f"SELECT * FROM {part('att_runs', i)}" for i in range(len(batches)))
    run(con, "TABLE", f"{shared}att_runs",
        f"SELECT run_id, {', '.join(f'bool_or({f}) AS {f}' for f in RUN_FLAGS)} "
        f"FROM ({parts}) GROUP BY run_id", "att_runs")
    for i in range(len(batches)):
        con.execute(f"DROP TABLE {part('att_runs', i)}")
    runs_rel = {"att_runs": f"{shared}att_runs"}
    flags = run_flags(con, f"{shared}att_runs")
    known = flags or dict.fromkeys(RUN_FLAGS, False)
    has_dev, has_steps, has_modules, has_groups = (
        known[f] for f in ("has_device_planes", "has_steps_line", "has_modules_line", "has_group_ids"))
    # att_programs reads att_ops only for program executions found through host launches
    programs_need_ops = bool(has_dev and not has_modules and not has_steps and not has_groups)

    kinds = OpKinds(con, f"{shared}op_kinds", temp=False, batch=batch if len(batches) == 1 else None)

    def att_ops(cur: duckdb.DuckDBPyConnection, relation: dict[str, str],
                host: tuple[str, str]) -> tuple[str, Any]:
        """The batch's att_ops: narrow op rows over the run's kinds (analyzer/op_kinds.py), as a view,
        and their arrays where the numpy form made them (else None)."""
        try:
            _, view, arrays = kinds.narrow(subs(relation, host), sql("att_ops", relation, host), flags,
                                           local, cur)
            return view, arrays
        except duckdb.Error as exc:
            raise stage_error("att_ops", exc) from exc

    # pass 2: the run's program executions (the dominant program is the run's)
    def pass2(cur: duckdb.DuckDBPyConnection, i: int) -> None:
        host = batches[i]
        if programs_need_ops:
            ops = att_ops(cur, runs_rel, host)[0]
        else:
            ops = f"{local}att_ops_none"
            run(cur, "TEMP TABLE", ops, empty_att_ops(), "att_ops")
        rel = {**runs_rel, "att_ops": ops}
        if events_relation is not None:
            rel["events"] = events_relation
        run(cur, "TABLE", part("att_programs", i), sql("att_programs", rel, host), "att_programs")
        cur.execute(f"DROP TABLE IF EXISTS {local}att_ops_none")

    in_threads(con, threads, len(batches), pass2)
    concat_tables(con, f"{shared}att_programs", [part("att_programs", i) for i in range(len(batches))],
                  temp=False)

    # pass 3: everything else, batch by batch
    op_rows = f"{shared}op_rows"  # the run's narrow op_steps rows (OP_STEPS_OWN), a table per batch
    template = threading.Lock()  # the first batch there creates the op rows' (empty) template table
    kept = [name for name in KEPT_STAGES if name not in ("att_runs", "att_programs")]

    def pass3(cur: duckdb.DuckDBPyConnection, i: int) -> None:
        host = batches[i]
        rel = {**runs_rel, "att_programs_run": programs_run or f"{shared}att_programs"}
        # the batch engine (analyzer/batch_engine.py) where the ops are accelerator op lines
        engine = fast_path(flags) and engine_enabled() and not sweep_in_sql()
        if events_relation is not None:
            rel["events"] = events_relation
        elif engine:
            rel["events"] = off_op_line_events(cur, subs(rel, host), f"{local}events")
        ops = elem = None
        for name in stages:
            if name in ("att_runs", "op_steps"):
                continue
            table = f"{local}{name}"
            if name == "att_programs":
                run(cur, "TEMP VIEW", table, f"SELECT * FROM {shared}att_programs WHERE host "
                    f"BETWEEN {sql_literal(host[0])} AND {sql_literal(host[1])}", name)
            elif name == "att_ops":
                table, ops = att_ops(cur, rel, host)
            elif engine and ops is not None and name in ENGINE_STAGES:
                if name == "att_intervals":
                    continue  # the sweep reads the op arrays and the spans themselves
                if name == "att_elementary":
                    elem = sweep_batch(cur, ops, kinds.table, rel)
                    if elem is None:  # a span without a time: the stages' SQL for this batch
                        engine = False
                        run(cur, "TEMP VIEW", f"{local}att_intervals", sql("att_intervals", rel, host),
                            "att_intervals")
                        rel["att_intervals"] = f"{local}att_intervals"
                        stage_without_sql(cur, name, rel, table)
                    else:
                        outside_steps(cur, elem, run_id, table)
                elif name == "step_breakdown":
                    step_breakdown(cur, elem, rel["att_steps"], table)
                elif name == "collective_time":
                    collective_time(cur, elem, run_id, table)
            elif not stage_without_sql(cur, name, rel, table):
                run(cur, f"TEMP {LOCAL_KIND.get(name, 'TABLE')}", table, sql(name, rel, host), name)
            rel[name] = table
            if name in kept:
                cur.execute(f"CREATE OR REPLACE TABLE {part(name, i)} AS SELECT * FROM {table}")
        elem = None
        # the batch's op-boundary relations are read by no later stage: their memory goes to op_steps
        for name in FREED_BEFORE_OP_STEPS:
            cur.execute(f"DROP {LOCAL_KIND.get(name, 'TABLE')} IF EXISTS {local}{name}")
        text = sql("op_steps", rel, host)
        rows_table = f"{op_rows}_{i}"
        try:
            if op_rows_sink is not None and engine and ops is not None:
                # the rows go to the sink (a Parquet file), read here from memory for the partials
                rows_arrow = op_steps_rows(cur, ops, rel["step_breakdown"])  # (collectives first)
                sunk[i] = op_rows_sink(i, rows_arrow)
                arrow = f"{local}op_steps_arrow"
                cur.register(arrow, rows_arrow)
                try:
                    if on_batch is not None:
                        on_batch(cur, f"({op_steps_select(arrow, kinds.table)})", i, rel["step_breakdown"],
                                 (arrow, kinds.table))
                finally:
                    cur.unregister(arrow)
            else:
                # (empty first: CREATE TABLE AS with the ASOF join plans far slower than INSERT)
                with template:
                    if not _exists(cur, f"{op_rows}_template"):
                        cur.execute(f"CREATE TABLE {op_rows}_template AS SELECT * FROM "
                                    f"({kind_of_op_steps(text, kinds.table)}) LIMIT 0")
                cur.execute(f"CREATE OR REPLACE TABLE {rows_table} AS SELECT * FROM {op_rows}_template")
                if engine and ops is not None:
                    arrow = f"{local}op_steps_arrow"
                    cur.register(arrow, op_steps_rows(cur, ops, rel["step_breakdown"]))
                    try:
                        _append_op_rows(cur, rows_table, f"SELECT * FROM {arrow}")
                    finally:
                        cur.unregister(arrow)
                else:
                    with _op_rows(cur, text, f"{local}op_rows", kinds.table, rel) as rows:
                        _append_op_rows(cur, rows_table, rows)
                if on_batch is not None:
                    on_batch(cur, f"({op_steps_select(rows_table, kinds.table)})", i, rel["step_breakdown"],
                             (rows_table, kinds.table))
                if op_rows_sink is not None:
                    sunk[i] = op_rows_sink(i, cur.sql(f"SELECT * FROM {rows_table}").to_arrow_table())
                    cur.execute(f"DROP TABLE {rows_table}")
        except duckdb.Error as exc:
            raise stage_error("op_steps", exc) from exc
        for name in stages:
            kind = "VIEW" if name == "att_programs" else LOCAL_KIND.get(name, "TABLE")
            cur.execute(f"DROP {kind} IF EXISTS {local}{name}")
        drop_relation(cur, f"{local}op_rows")  # (a table, or the registered rows of op_arrays)
        cur.execute(f"DROP TABLE IF EXISTS {local}events")

    sunk: dict[int, str] = {}  # batch -> the sink's Parquet file of its op rows
    in_threads(con, threads, len(batches), pass3)
    con.execute(f"DROP TABLE IF EXISTS {op_rows}_template")
    relation = {name: f"{prefix}{name}" for name in KEPT_STAGES}
    # the kept relations as TEMP tables of the caller's connection, rows in batch order
    for name in ("att_runs", "att_programs"):
        con.execute(f"CREATE OR REPLACE TEMP TABLE {prefix}{name} AS SELECT * FROM {shared}{name}")
        con.execute(f"DROP TABLE {shared}{name}")
    for name in kept:
        concat_tables(con, f"{prefix}{name}", [part(name, i) for i in range(len(batches))])
    # written to the file: the readers' scans then page its blocks in and out under the memory limit
    con.execute(f"CHECKPOINT {SCRATCH}")

    # the run's op_steps: its narrow op rows (a table per batch) joined to its op kinds (the stage's columns)
    if op_rows_sink is not None:
        files = ", ".join(sql_literal(sunk[i]) for i in range(len(batches)))
        all_rows = f"read_parquet([{files}], hive_partitioning = false)"
    else:
        all_rows = "(" + " UNION ALL ".join(f"SELECT * FROM {op_rows}_{i}" for i in range(len(batches))) + ")"
    op_steps = f"{prefix}op_steps"
    con.execute(f"CREATE OR REPLACE TEMP VIEW {op_steps} AS {op_steps_select(all_rows, kinds.table)}")
    relation["op_steps"] = op_steps
    relation["op_kinds"] = kinds.table
    # the op rows of the run, as att_ops' readers use them (device, category, short_name, ...)
    # (a name of its own: the whole-run path's ta_att_ops is a table)
    con.execute(f"CREATE OR REPLACE TEMP VIEW {prefix}att_ops_all AS "
                f"SELECT *, device_ordinal AS device FROM {op_steps}")
    relation["att_ops"] = f"{prefix}att_ops_all"
    return relation


def drop_relation(con: duckdb.DuckDBPyConnection, name: str) -> None:
    """Drop TEMP table or view ``name`` (a registered Arrow table is a view), if it exists."""
    kinds = con.execute("SELECT 'VIEW' FROM duckdb_views() WHERE view_name = ? AND temporary UNION ALL "
                        "SELECT 'TABLE' FROM duckdb_tables() WHERE table_name = ? AND temporary",
                        [name, name]).fetchall()
    for (kind,) in kinds:
        con.execute(f"DROP {kind} IF EXISTS {name}")


def _exists(con: duckdb.DuckDBPyConnection, qualified: str) -> bool:
    """Whether table ``database.name`` exists."""
    database, _, name = qualified.partition(".")
    return bool(con.execute("SELECT count(*) FROM duckdb_tables() WHERE database_name = ? AND table_name = ?",
                            [database, name]).fetchall()[0][0])
