"""A batch's ``att_ops`` as narrow rows over the run's op kinds: what the per-host attribution
(analyzer/per_host.py) builds instead of the stage's wide rows.

Every device op of a pod carries the same few strings as thousands of others (its HLO text, short
name, category, module, framework op, shape), and its class (category, collective kind, ...) is a
function of them. The stage ``att_ops`` (attribution.sql) classifies each distinct combination once
but then joins the class back to every op row on five strings and writes every op's strings out,
and ``op_steps`` copies them once more into the scratch file: together about half of a 512-host
analysis's CPU time. Here an op row holds numbers (plus its collective kind, which the evidence SQL
filters on) and ``kind_id``, a key into the run's ``op kinds`` table, one row per distinct
combination of the op's line, properties and class. Views join them back, so
the stages after ``att_ops``, ``op_steps``' readers and the findings' evidence SQL see the stage's
columns, types and rows (tests/test_op_kinds.py checks it on every capture).

The fast path reads the base tables as the stage's device branch reads the ``events`` view: an op's
properties are its event metadata's unless its own typed stats (``event_details``) say otherwise, so
they are classified per (plane, metadata id), or per event where the event has such stats, never per
op row. Runs the stage handles otherwise (host-only XLA CPU ops, Kineto traces) run the stage's SQL
and are narrowed afterwards (small runs; same result).
"""

from __future__ import annotations

import os
import threading
from typing import Any

import duckdb
from tpuanalyze.analyzer.classify import classified_sql

from tpuanalyze.keys import DEVICE_PLANE_PREFIXES, OP_LINE_NAMES, STREAM_LINE_PREFIX

# An op's line, properties (its event metadata's, or its event's own typed stats) and class: a kind.
PROPERTY_COLUMNS = ("short_name", "hlo_category", "hlo_module", "tf_op", "shape", "flops", "bytes_accessed")
CLASS_COLUMNS = ("collective_kind", "category", "is_container", "wrapped", "host_transfer")
# the kinds table: the op's line (a handful per run), the stage's ``name`` (HLO text where shapes are
# read, else NULL), properties, class. Strings stay here: in the op rows even low-cardinality strings
# cost more to write than all their numbers (64-host pod, scratch rows: 0.88 CPU s a batch vs 0.38)
KIND_COLUMNS = ("line", "name", *PROPERTY_COLUMNS, *CLASS_COLUMNS)
# a narrow op row (its collective kind copied from its kind: the stages filter on it)
ROW_COLUMNS = ("run_id", "host", "device", "kind_id", "collective_kind", "start_ps", "duration_ps",
               "group_id", "correlation_id")
# stage att_ops' columns, in its order (attribution.sql)
ATT_OPS_COLUMNS = ("run_id", "host", "device", "line", "name", "short_name", "hlo_category", "hlo_module",
                   "tf_op", "shape", "flops", "bytes_accessed", "start_ps", "duration_ps", "collective_kind",
                   "category", "is_container", "wrapped", "host_transfer", "group_id", "correlation_id")
# stage att_ops' column types (an empty att_ops needs no planning of the stage: per_host's pass 2)
ATT_OPS_TYPES = {"run_id": "INTEGER", "host": "VARCHAR", "device": "INTEGER", "line": "VARCHAR",
                 "name": "VARCHAR", "short_name": "VARCHAR", "hlo_category": "VARCHAR",
                 "hlo_module": "VARCHAR",
                 "tf_op": "VARCHAR", "shape": "VARCHAR", "flops": "DOUBLE", "bytes_accessed": "DOUBLE",
                 "start_ps": "BIGINT", "duration_ps": "BIGINT", "collective_kind": "VARCHAR",
                 "category": "VARCHAR", "is_container": "BOOLEAN", "wrapped": "VARCHAR",
                 "host_transfer": "BOOLEAN", "group_id": "BIGINT", "correlation_id": "BIGINT"}


def empty_att_ops() -> str:
    """A SELECT of no rows with stage att_ops' columns and types."""
    columns = ", ".join(f"CAST(NULL AS {ATT_OPS_TYPES[c]}) AS {c}" for c in ATT_OPS_COLUMNS)
    return f"SELECT {columns} LIMIT 0"


# stage op_steps' columns, in its order; the narrow op rows of the scratch file hold the OP_STEPS_OWN
OP_STEPS_COLUMNS = ("run_id", "host", "device_ordinal", "short_name", "name", "category", "collective_kind",
                    "hlo_category", "hlo_module", "tf_op", "shape", "flops", "bytes_accessed", "start_ps",
                    "duration_ps", "line", "is_container", "step_num", "step_start", "step_is_eval")
# (collective_kind too: the findings' collective evidence SQL filters on it, and a batch's collectives
# stored first fill row groups of their own, which the filter then skips the compute ops' by statistics)
OP_STEPS_OWN = ("run_id", "host", "device_ordinal", "kind_id", "collective_kind", "start_ps", "duration_ps",
                "step_num", "step_start", "step_is_eval")
# the typed stats an event may hold itself (event_details) that make an op's properties its own (its
# short name is always its metadata's)
_OWN_PROPERTIES = tuple(c for c in PROPERTY_COLUMNS if c != "short_name")


def fast_path(flags: dict[str, bool] | None) -> bool:
    """Whether the run's ops are exactly the stage's device branch (accelerator op lines, no Kineto
    JSON): then the fast SQL below builds them from the base tables."""
    return bool(flags and flags["has_device_planes"] and not flags["is_kineto"])


def _same(a: str, b: str, columns: tuple[str, ...]) -> str:
    return " AND ".join(f"{a}.{c} IS NOT DISTINCT FROM {b}.{c}" for c in columns)


class OpKinds:
    """The run's op kinds (table ``table``: TEMP, or one in an attached database that the cursors of
    batches attributed in threads share), grown batch by batch; ``narrow`` builds a batch's narrow op
    rows and the ``att_ops`` view over them."""

    def __init__(self, con: duckdb.DuckDBPyConnection, table: str, temp: bool = True,
                 batch: Any = None) -> None:
        self.con, self.table, self.temp = con, table, temp
        # a map worker's batch in memory (store.batch.BatchTables): the connection's base tables are
        # its rows, and the narrow rows are made from its arrays (op_arrays.narrow_from_batch)
        self.batch = batch
        self._created = False
        self._lock = threading.Lock()  # one batch at a time adds kinds: ids stay unique and dense

    def _add(self, con: duckdb.DuckDBPyConnection, classes: str) -> None:
        """Add the kinds of relation ``classes`` (KIND_COLUMNS) not in the table yet (each statement
        commits before the lock is let go: the next batch's sees its kinds)."""
        kinds = ", ".join(KIND_COLUMNS)
        with self._lock:
            if not self._created:
                con.execute(f"CREATE OR REPLACE {'TEMP ' if self.temp else ''}TABLE {self.table} AS SELECT "
                            f"CAST(row_number() OVER () - 1 AS INTEGER) AS kind_id, * "
                            f"FROM (SELECT DISTINCT {kinds} FROM {classes})")
                self._created = True
                return
            con.execute(
                f"INSERT INTO {self.table} SELECT CAST((SELECT coalesce(max(kind_id), -1) FROM {self.table}) "
                f"+ row_number() OVER () AS INTEGER), * FROM (SELECT DISTINCT {kinds} FROM {classes}) n "
                f"WHERE NOT EXISTS (SELECT 1 FROM {self.table} k WHERE {_same('k', 'n', KIND_COLUMNS)})")

    def narrow(self, subs: dict[str, str], stage_sql: str, flags: dict[str, bool] | None,
               local: str, con: duckdb.DuckDBPyConnection | None = None) -> tuple[str, str, Any]:
        """Create the batch's narrow op rows (TEMP TABLE ``<local>op_rows``) and the ``att_ops`` view
        over them and the kinds (``<local>att_ops``) on ``con`` (default: the table's connection);
        return (rows, view, arrays): ``arrays`` the rows as ``op_arrays.OpArrays`` where the numpy form
        made them, else None. ``subs`` are the batch's stage substitutions, ``stage_sql`` the stage's
        text for runs off the fast path."""
        con = self.con if con is None else con
        rows, view = f"{local}op_rows", f"{local}att_ops"
        arrays = None
        if fast_path(flags):
            arrays = self._narrow_device_ops(con, subs, local, rows)
        else:
            self._narrow_stage_rows(con, stage_sql, local, rows)
        cols = ", ".join(f"o.{c}" if c in ROW_COLUMNS else f"k.{c}" for c in ATT_OPS_COLUMNS)
        con.execute(f"CREATE OR REPLACE TEMP VIEW {view} AS SELECT {cols} "
                    f"FROM {rows} o JOIN {self.table} k USING (kind_id)")
        return rows, view, arrays

    def _narrow_stage_rows(self, con: duckdb.DuckDBPyConnection, stage_sql: str, local: str,
                           rows: str) -> None:
        """The stage's wide rows, then narrowed: their kinds added, each row keyed to its kind."""
        wide = f"{local}op_wide"
        con.execute(f"CREATE OR REPLACE TEMP TABLE {wide} AS {stage_sql}")
        try:
            self._add(con, wide)
            cols = ", ".join(f"k.{c}" if c == "kind_id" else f"w.{c}" for c in ROW_COLUMNS)
            con.execute(f"CREATE OR REPLACE TEMP TABLE {rows} AS SELECT {cols} FROM {wide} w "
                        f"JOIN {self.table} k ON {_same('k', 'w', KIND_COLUMNS)}")
        finally:
            con.execute(f"DROP TABLE IF EXISTS {wide}")

    def _narrow_device_ops(self, con: duckdb.DuckDBPyConnection, subs: dict[str, str], local: str,
                           rows: str) -> Any:
        """The device branch of stage att_ops from the base tables (module docstring): the per-op
        joins in numpy (analyzer/op_arrays.py; its arrays returned), or all in SQL with
        TPUANALYZE_OP_ROWS=sql (None returned)."""
        if os.environ.get("TPUANALYZE_OP_ROWS", "").strip().lower() == "sql":
            self._narrow_device_ops_sql(con, subs, local, rows)
            return None
        from tpuanalyze.analyzer import op_arrays

        if self.batch is not None and os.environ.get("TPUANALYZE_OP_ROWS", "").strip().lower() != "fetch":
            from tpuanalyze.analyzer.batch_engine import run_of

            try:
                return op_arrays.narrow_from_batch(self, con, self.batch, subs, local, rows, run_of(subs))
            except op_arrays.NoArrays:
                pass
        return op_arrays.narrow_device_ops(self, con, subs, local, rows)

    def _narrow_device_ops_sql(self, con: duckdb.DuckDBPyConnection, subs: dict[str, str], local: str,
                               rows: str) -> None:
        """The device branch of stage att_ops from the base tables, in SQL (the definition)."""
        lines, events = f"{local}op_lines", f"{local}op_events"
        keys, classes = f"{local}op_keys", f"{local}op_classes"
        run = subs["run_filter"]
        e_host = subs["e_host"]

        def batch(table: str, alias: str) -> str:
            return batch_relation(subs, table, alias)

        # 1. the batch's op lines (a few per device), numbered: the events carry the number, not strings
        con.execute(f"CREATE OR REPLACE TEMP TABLE {lines} AS {op_lines_select(subs)}")
        own = " OR ".join(f"d.{c} IS NOT NULL" for c in _OWN_PROPERTIES)
        # 2. the batch's op events (the events view's device op rows), narrow; an event's own typed
        # stats make it a key of its own (own_index), else its line and metadata id are its key
        con.execute(f"""CREATE OR REPLACE TEMP TABLE {events} AS
SELECT o.line_key, e.metadata_id, CASE WHEN {own} THEN d.event_index END AS own_index,
       e.start_ps, e.duration_ps, e.group_id, d.correlation_id
FROM event_rows e JOIN {lines} o USING (run_id, host, plane_index, line_index)
LEFT JOIN {batch('event_details', 'd')} d
  ON d.run_id = e.run_id AND d.host = e.host AND d.plane_index = e.plane_index
 AND d.event_index = e.event_index
WHERE e.{run} AND {e_host} AND e.duration_ps > 0""")
        # 3. each key's properties, as the events view resolves them (the event's own value wins)
        props = ", ".join(f"COALESCE(d.{c}, m.{c}) AS {c}" for c in _OWN_PROPERTIES)
        con.execute(f"""CREATE OR REPLACE TEMP TABLE {keys} AS
WITH k AS (
    SELECT o.run_id, o.host, o.plane_index, o.line, k.*
    FROM (SELECT DISTINCT line_key, metadata_id, own_index FROM {events}) k JOIN {lines} o USING (line_key)
)
SELECT k.line_key, k.line, k.metadata_id, k.own_index, COALESCE(m.name, '') AS full_name,
       coalesce(nullif(COALESCE(NULLIF(m.display_name, ''), m.name, ''), ''), COALESCE(m.name, ''))
           AS short_name,
       {props}, m.group_id AS metadata_group_id, m.correlation_id AS metadata_correlation_id
FROM k LEFT JOIN {batch('event_metadata', 'm')} m
  ON m.run_id = k.run_id AND m.host = k.host AND m.plane_index = k.plane_index
 AND m.metadata_id = k.metadata_id
LEFT JOIN {batch('event_details', 'd')} d
  ON k.own_index IS NOT NULL AND d.run_id = k.run_id AND d.host = k.host AND d.plane_index = k.plane_index
 AND d.event_index = k.own_index""")
        # 4. each distinct combination of properties classified once (as the stage classifies its combos)
        properties = ("line", "full_name", *PROPERTY_COLUMNS)
        con.execute(f"CREATE OR REPLACE TEMP TABLE {classes} AS {classes_select(keys, subs)}")
        try:
            self._add(con, classes)
            # 5. the op rows keyed to their kinds; the async line only contributes collective spans
            con.execute(f"""CREATE OR REPLACE TEMP TABLE {rows} AS
WITH keyed AS (
    SELECT y.line_key, y.metadata_id, y.own_index, y.metadata_group_id, y.metadata_correlation_id,
           n.kind_id, n.line, n.collective_kind
    FROM {keys} y
    JOIN {classes} c ON {_same('y', 'c', properties)}
    JOIN {self.table} n ON {_same('n', 'c', KIND_COLUMNS)}
)
SELECT o.run_id, o.host, o.device, y.kind_id, y.collective_kind, e.start_ps, e.duration_ps,
       coalesce(e.group_id, y.metadata_group_id) AS group_id,
       coalesce(e.correlation_id, y.metadata_correlation_id) AS correlation_id
FROM {events} e JOIN keyed y
  ON y.line_key = e.line_key AND y.metadata_id IS NOT DISTINCT FROM e.metadata_id
 AND y.own_index IS NOT DISTINCT FROM e.own_index
JOIN {lines} o ON o.line_key = e.line_key
WHERE y.line <> 'Async XLA Ops' OR y.collective_kind IS NOT NULL""")
        finally:
            for table in (lines, events, keys, classes):
                con.execute(f"DROP TABLE IF EXISTS {table}")



# a device op line (tpuanalyze.keys.is_op_line) in SQL, of lines ``l`` joined to their planes ``p``
# (the names hold no LIKE wildcards but the prefixes' trailing ``%``)
OP_LINES_SQL = ("(" + " OR ".join(f"p.name LIKE '{prefix}%'" for prefix in DEVICE_PLANE_PREFIXES) + ") "
                "AND (l.name IN (" + ", ".join(f"'{name}'" for name in OP_LINE_NAMES) + ") "
                f"OR l.name LIKE '{STREAM_LINE_PREFIX}%')")


def op_lines_select(subs: dict[str, str]) -> str:
    """The batch's op lines (a few per device: XLA Ops, Async XLA Ops, GPU streams of an accelerator
    plane) with their device, numbered 1.. in (host, plane, line) order (``line_key``)."""
    run, l_host = subs["run_filter"], subs["l_host"]
    return f"""SELECT l.run_id, l.host, l.plane_index, l.line_index, p.device_ordinal AS device,
       l.name AS line,
       CAST(row_number() OVER (ORDER BY l.host, l.plane_index, l.line_index) AS INTEGER) AS line_key
FROM lines l JOIN planes p USING (run_id, host, plane_index)
WHERE l.{run} AND {l_host} AND l.run_id IN (SELECT run_id FROM {subs['att_runs']})
  AND {OP_LINES_SQL}"""


def batch_relation(subs: dict[str, str], table: str, alias: str) -> str:
    """A base table's rows of the run and batch (``subs``: a batch's stage substitutions)."""
    run, e_host = subs["run_filter"], subs["e_host"]
    return (f"(SELECT * FROM {table} {alias} WHERE {alias}.{run} "
            f"AND {e_host.replace('e.host', f'{alias}.host')})")


def classes_select(keys: str, subs: dict[str, str]) -> str:
    """The class of each distinct combination of an op key's line and properties (relation ``keys``:
    line, full_name and PROPERTY_COLUMNS), classified once as the stage classifies its combos."""
    properties = ("line", "full_name", *PROPERTY_COLUMNS)
    return f"""WITH combos AS (
    SELECT DISTINCT {', '.join(properties)}, full_name AS name FROM {keys}
), classified AS (
    {classified_sql("combos", subs["op_category"])}
)
SELECT line, full_name, {', '.join(PROPERTY_COLUMNS)},
       CASE WHEN category IN ('collectives', 'input') THEN name END AS name, {', '.join(CLASS_COLUMNS)}
FROM classified"""


def op_steps_select(rows: str, kinds: str, where: str = "") -> str:
    """Stage op_steps' columns from narrow op rows (OP_STEPS_OWN) and the run's kinds."""
    own = set(OP_STEPS_OWN)
    cols = ", ".join(f"o.{c}" if c in own else f"k.{c}" for c in OP_STEPS_COLUMNS)
    return (f"SELECT {cols} FROM {rows} o JOIN {kinds} k USING (kind_id)"
            + (f" WHERE {where}" if where else ""))


def kind_of_op_steps(stage_rows: str, kinds: str) -> str:
    """OP_STEPS_OWN of the stage op_steps' wide rows (TPUANALYZE_SWEEP=sql): each keyed to a kind with
    the same op_steps columns (kinds that differ only in columns op_steps lacks are alike here)."""
    common = tuple(c for c in KIND_COLUMNS if c in OP_STEPS_COLUMNS)
    cols = ", ".join("k.kind_id" if c == "kind_id" else f"w.{c}" for c in OP_STEPS_OWN)
    return (f"SELECT {cols} FROM ({stage_rows}) w JOIN (SELECT min(kind_id) AS kind_id, "
            f"{', '.join(common)} FROM {kinds} GROUP BY ALL) k ON {_same('k', 'w', common)}")

