"""The map side of the analysis: one batch of hosts attributed where it was read, its results small.

A map worker that has just read a batch of consecutive hosts of a run holds them in a database of its
own (in memory). ``map_batch`` attributes them there, as the per-host attribution attributes a batch
of the run's database (analyzer/per_host.py: the same stages, the batch engine), and returns what the
reduce needs (``BatchResult``): the batch's rows of the kept relations (steps, breakdowns, collective
time, spans, programs), its op kinds, its narrow op rows written to a Parquet file, and the partial
aggregates of the readers that would scan the op rows (analyzer/batch_reduce.py). The reduce
(analyzer/mapped.py) combines the batches into the relations ``analyze_run`` reads, so the op rows
are never sent back through the main process.

Two things are the run's, not a batch's: its flags (does any host have a Steps line, ...) and its
dominant program (the non-eval program with the most execution time over all hosts). A batch takes its
own as the run's; the reduce checks them against the run's (``BatchResult.flags``, ``dominant``) and
has a batch whose guess was wrong attributed again with the run's programs (``programs_run``), or, for
flags that differ between batches, the run attributed from its database instead.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
from tpuanalyze.analyzer import event_partials
from tpuanalyze.analyzer.attribution import RUN_FLAGS
from tpuanalyze.analyzer.batch_engine import batch_flags
from tpuanalyze.analyzer.batch_reduce import BatchReduce
from tpuanalyze.analyzer.collectives import CollectivePartials
from tpuanalyze.analyzer.per_host import KEPT_STAGES, materialize_per_host
from tpuanalyze.analyzer.resources import scratch_database
from tpuanalyze.store.database import events_select

# Kind ids of batch ``i`` start at ``i << KIND_ID_BITS``: the batches' kinds stay distinct without a
# renumbering of their op rows (a kind of several batches has several ids; its rows carry one each).
KIND_ID_BITS = 24
# Rows per row group of a batch's op rows file: the collectives come first, so the findings' filters on
# collective_kind skip the row groups of compute ops by their statistics (DuckDB's own group size).
OP_ROWS_ROW_GROUP = 122_880


@dataclass
class BatchResult:
    """One batch's share of a run's analysis (picklable: Arrow tables, pandas frames, a file path)."""

    flags: dict[str, bool] | None  # the batch's own att_runs flags (None: no run row)
    dominant: str | None  # the batch's dominant program (what its steps assumed), or None
    programs_run_used: bool  # attributed with the run's programs given
    relations: dict[str, Any] = field(default_factory=dict)  # KEPT_STAGES -> Arrow table
    kinds: Any = None  # Arrow: kind_id (BIGINT, the batch's range) + op_kinds.KIND_COLUMNS
    op_rows: str | None = None  # Parquet file of the narrow op_steps rows (op_kinds.OP_STEPS_OWN)
    op_rows_data: bytes | None = None  # the same file's bytes, when it travels (a cluster's worker)
    ops_parts: Any = None  # Arrow: ops.ops_partial_sql's rows
    infeed_parts: Any = None  # Arrow: input.infeed_sql's rows
    collectives: CollectivePartials = field(default_factory=CollectivePartials)
    types: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # each table's DuckDB types
    # the event readers' partials (analyzer/event_partials.py): name -> (Arrow table, DuckDB types)
    partials: dict[str, tuple[Any, list[tuple[str, str]]]] = field(default_factory=dict)


def _fetch(con: duckdb.DuckDBPyConnection, relation: str, result: BatchResult, key: str) -> Any:
    """``relation``'s rows as Arrow, its DuckDB column types kept in ``result.types[key]`` (Arrow has
    no HUGEINT: the reduce casts the columns back)."""
    con.execute("SELECT 1").fetchall()  # (a relation cannot run while an execute() result is unfinished)
    rel = con.sql(f"SELECT * FROM {relation}")
    result.types[key] = [(name, str(kind)) for name, kind in zip(rel.columns, rel.types, strict=True)]
    return rel.to_arrow_table()


def dominant_program(con: duckdb.DuckDBPyConnection, programs: str) -> str | None:
    """The dominant program of the program executions in ``programs`` (stage att_steps' rule)."""
    rows = con.execute(f"SELECT arg_max(program, total_ps) FROM (SELECT program, sum(end_ps - start_ps) AS "
                       f"total_ps FROM {programs} WHERE NOT named_eval GROUP BY ALL)").fetchall()
    return rows[0][0] if rows else None


def map_batch(con: duckdb.DuckDBPyConnection, run_id: int, config: dict[str, Any], index: int,
              op_rows_path: str | Path, programs_run: Any = None, batch: Any = None) -> BatchResult:
    """Attribute every host of ``con`` (one batch of run ``run_id``: a map worker's own database) and
    return the batch's results; its narrow op rows go to the Parquet file ``op_rows_path``.
    ``programs_run``: the run's program executions (an Arrow table of att_programs' columns) when the
    batch's own dominant program was not the run's. ``batch``: the rows in memory the connection's
    base tables are (``store.batch.BatchTables``), for the op rows made from its arrays."""
    hosts = con.execute("SELECT min(host), max(host) FROM planes WHERE run_id = ?",
                        [int(run_id)]).fetchall()[0]
    keep_warmup = bool(config["warmup"].get("keep"))
    base = int(index) << KIND_ID_BITS
    with scratch_database(con, in_memory=True):
        reduce = BatchReduce(run_id, keep_warmup=keep_warmup)
        if programs_run is not None:
            con.register("ta_programs_run", programs_run)
        def sink(_: int, rows: Any) -> str:
            """The batch's op rows to the Parquet file, their kinds in the batch's id range."""
            import pyarrow.compute as pc
            import pyarrow.parquet as pq

            position = rows.schema.get_field_index("kind_id")
            kind_id = pc.add(rows.column(position).cast("int64"), base)
            # dictionaries for the few-valued columns only (start and duration: nearly every value its
            # own), statistics where the findings' filters read them, LZ4: 0.09 s a million rows
            # against 0.25 with the defaults
            pq.write_table(rows.set_column(position, "kind_id", kind_id), str(op_rows_path),
                           compression=os.environ.get("TPUANALYZE_OP_ROWS_COMPRESSION", "lz4"),
                           use_dictionary=["run_id", "host", "device_ordinal", "kind_id", "collective_kind",
                                           "step_num", "step_start", "step_is_eval"],
                           write_statistics=["collective_kind", "step_start", "step_is_eval"],
                           row_group_size=OP_ROWS_ROW_GROUP)
            return str(op_rows_path)

        flags_given = events_relation = None
        if batch is not None:  # the flags and the events off the op lines straight from its arrays
            flags_given = batch_flags(batch)
            off = np.flatnonzero(~batch.op_line_mask())
            con.register("ta_event_rows_off", batch.arrow("event_rows", run_id, off))
            con.execute(f"CREATE OR REPLACE TEMP TABLE ta_events_off AS {events_select('ta_event_rows_off')}")
            con.unregister("ta_event_rows_off")
            events_relation = "ta_events_off"
        try:
            rel = materialize_per_host(con, run_id, config, [(hosts[0], hosts[1])] if hosts[0] else [],
                                       on_batch=reduce.add_batch, threads=1,
                                       programs_run="ta_programs_run" if programs_run is not None else None,
                                       op_rows_sink=sink, batch=batch, flags_given=flags_given,
                                       events_relation=events_relation)
        finally:
            if programs_run is not None:
                con.unregister("ta_programs_run")
        reduce.finish(con)
        flags_row = con.execute(f"SELECT {', '.join(RUN_FLAGS)} FROM {rel['att_runs']}").fetchall()
        flags = dict(zip(RUN_FLAGS, (bool(v) for v in flags_row[0]), strict=True)) if flags_row else None
        result = BatchResult(flags=flags, dominant=dominant_program(con, rel["att_programs"]),
                             programs_run_used=programs_run is not None)
        for name in KEPT_STAGES:
            result.relations[name] = _fetch(con, rel[name], result, name)
        result.kinds = _fetch(con, f"(SELECT * REPLACE (CAST(kind_id AS BIGINT) + {base} AS kind_id) "
                                   f"FROM {rel['op_kinds']})", result, "op_kinds")
        result.op_rows = str(op_rows_path)
        parts = reduce.relations()
        for key in ("ops_parts", "infeed_parts"):
            if key in parts:
                setattr(result, key, _fetch(con, parts[key], result, key))
        result.collectives = reduce.collectives
        # the readers that need a partial only in a run without XLA Modules executions, or without
        # weight-update ops: where the batch has them, the run has them too (flags agree across a run's
        # batches; a weight-update op of any batch is the run's), so the reader never reads its rows
        skip = set()
        if flags and flags["has_modules_line"]:
            skip.add("module_op_time")
        updates = f"SELECT count(*) FROM {rel['op_kinds']} WHERE category = 'weight_update'"
        if con.execute(updates).fetchall()[0][0]:
            skip.add("event_names")
        result.partials = event_partials.compute(con, run_id, tuple(n for n in event_partials.MAP_SQL
                                                                    if n not in skip))
    return result
