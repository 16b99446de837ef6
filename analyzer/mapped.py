"""The reduce side of a run attributed where it was read: the batches' results (analyzer/batch_map.py)
combined into the relations the analysis reads, as ``materialize_per_host`` leaves them.

The small relations (steps, breakdowns, collective time, spans, programs, the partial aggregates)
become TEMP tables, the batches' rows in batch order, each column cast back to its DuckDB type; the
op rows stay in the batches' Parquet files, read through the ``op_steps`` view (joined to the
batches' kinds), as findings' evidence SQL reads the scratch database's op rows on the per-host path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import duckdb
from tpuanalyze.analyzer.batch_map import BatchResult
from tpuanalyze.analyzer.collectives import CollectivePartials
from tpuanalyze.analyzer.event_partials import MAP_SQL, map_sql
from tpuanalyze.analyzer.op_kinds import op_steps_select
from tpuanalyze.analyzer.per_host import KEPT_STAGES


def _sql_text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _concat(con: duckdb.DuckDBPyConnection, target: str, key: str, tables: Sequence[tuple[Any, list]],
            run_id: int) -> None:
    """TEMP TABLE ``target``: the batches' Arrow tables one after the other, each column cast to its
    DuckDB type, ``run_id`` the run's."""
    types = next((t for _, t in tables if t), None)
    if types is None:
        return
    columns = ", ".join(f"CAST({int(run_id)} AS {t}) AS {c}" if c == "run_id" else f"CAST({c} AS {t}) AS {c}"
                        for c, t in types)
    whole = _concatenated([table for table, _ in tables])
    pieces = [whole] if whole is not None else [table for table, _ in tables]
    for i, table in enumerate(pieces):
        name = f"{target}_arrow"
        con.register(name, table)
        try:
            if i == 0:
                con.execute(f"CREATE OR REPLACE TEMP TABLE {target} AS SELECT {columns} FROM {name}")
            else:
                con.execute(f"INSERT INTO {target} SELECT {columns} FROM {name}")
        finally:
            con.unregister(name)


def _concatenated(tables: Sequence[Any]) -> Any:
    """The batches' Arrow tables as one (their chunks, not copied), or None where their schemas differ
    (a column all NULL in one batch, say): then one statement per batch. Why: a statement costs a few
    ms, and a 512-host run has 31 batches of 14 relations (0.84 s of the report, one core)."""
    import pyarrow as pa

    try:
        return pa.concat_tables(list(tables))
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return None


def materialize_mapped(con: duckdb.DuckDBPyConnection, run_id: int, results: Sequence[BatchResult],
                       prefix: str = "ta_") -> tuple[dict[str, str], CollectivePartials]:
    """The run's relations from its batches' results (``materialize_per_host``'s names and columns, plus
    the partial aggregates ``ops_parts`` and ``infeed_parts``), and its collective partials."""
    relation: dict[str, str] = {}
    for name in KEPT_STAGES:
        _concat(con, f"{prefix}{name}", name, [(r.relations[name], r.types.get(name, [])) for r in results],
                run_id)
        relation[name] = f"{prefix}{name}"
    kinds = f"{prefix}op_kinds"
    _concat(con, kinds, "op_kinds", [(r.kinds, r.types.get("op_kinds", [])) for r in results], run_id)
    relation["op_kinds"] = kinds
    files = ", ".join(_sql_text(r.op_rows) for r in results if r.op_rows)
    rows = (f"(SELECT * REPLACE (CAST({int(run_id)} AS INTEGER) AS run_id) "
            f"FROM read_parquet([{files}], hive_partitioning = false))")
    op_steps = f"{prefix}op_steps"
    con.execute(f"CREATE OR REPLACE TEMP VIEW {op_steps} AS {op_steps_select(rows, kinds)}")
    relation["op_steps"] = op_steps
    con.execute(f"CREATE OR REPLACE TEMP VIEW {prefix}att_ops_all AS "
                f"SELECT *, device_ordinal AS device FROM {op_steps}")
    relation["att_ops"] = f"{prefix}att_ops_all"
    for key in ("ops_parts", "infeed_parts"):
        parts = [(getattr(r, key), r.types.get(key, [])) for r in results if getattr(r, key) is not None]
        if parts:
            _concat(con, f"{prefix}{key}", key, parts, run_id)
            relation[key] = f"{prefix}{key}"
    for name in MAP_SQL:
        parts = [r.partials[name] for r in results if name in r.partials]
        target = f"{prefix}{name}_parts"
        if parts:
            _concat(con, target, name, parts, run_id)
        else:  # no batch needed it (analyzer/batch_map.py): its columns, no rows
            con.execute(f"CREATE OR REPLACE TEMP TABLE {target} AS SELECT * FROM ({map_sql(name, run_id)}) "
                        "LIMIT 0")
        relation[f"{name}_parts"] = target
    collectives = CollectivePartials()
    for result in results:
        collectives.extend(result.collectives)
    return relation, collectives
