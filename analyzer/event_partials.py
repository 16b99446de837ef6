"""The readers' aggregates over every event or event metadata of a run, as partials a map worker
computes for its batch of hosts and the reduce sums.

A few readers of the analysis look past the attribution relations at the run's events or event
metadata: the program time by module (identity, when the trace has no XLA Modules line), the model's
name scopes, the infeed shape, the collectives' replica groups, the ops' source lines and the event
names that show training. Each is a GROUP BY whose result is small; its *map* SQL (below) over one
batch's tables gives partial rows, and the reader's own query over the union of the batches' partials
gives what it gave over the whole run (sums of counts and durations, distinct names; ``any_value``
picks among the batches' picks, as it picks among rows). A run attributed where it was read
(analyzer/batch_map.py) has these partials as relations (``rel['<name>_parts']``) and its database
need not hold the events of its device op lines; otherwise the reader runs the map SQL over the
run's tables as a subquery.
"""

from __future__ import annotations

from string import Template

import duckdb

# name -> the map SQL over the base tables of run $run (one batch of hosts, or the whole run)
MAP_SQL: dict[str, str] = {
    # op time per HLO module (identity: a trace without XLA Modules executions)
    "module_op_time": "SELECT hlo_module, sum(duration_ps) AS ps FROM events WHERE run_id = $run "
                      "AND hlo_module IS NOT NULL AND hlo_module <> '' GROUP BY 1",
    # framework op paths per module (identity: the model's name scope)
    "model_scopes": "SELECT tf_op, hlo_module, count(*) AS n FROM event_metadata WHERE run_id = $run "
                    "AND tf_op IS NOT NULL AND tf_op <> '' GROUP BY ALL",
    # executions of each infeed op's shape text (identity: per-core batch); infeed op metadata are
    # few, so their executions are counted, not every event's category read
    "infeed_texts": "WITH md AS (SELECT host, plane_index, metadata_id, coalesce(shape, name) AS text "
                    "FROM event_metadata WHERE run_id = $run AND lower(hlo_category) = 'infeed') "
                    "SELECT md.text, count(*) AS n FROM event_rows r JOIN md ON md.host = r.host "
                    "AND md.plane_index = r.plane_index AND md.metadata_id = r.metadata_id "
                    "WHERE r.run_id = $run GROUP BY 1",
    # HLO texts naming replica groups (identity: devices in the job)
    "replica_texts": "SELECT DISTINCT name FROM event_metadata WHERE run_id = $run "
                     "AND name LIKE '%replica_groups=%'",
    # an op's source line by its short name (the top-ops table)
    "op_sources": "SELECT display_name, any_value(source) AS source FROM event_metadata "
                  "WHERE run_id = $run AND source IS NOT NULL GROUP BY display_name",
    # events per name (training evidence); counted per metadata id before the names are joined (the
    # events view's name: its metadata's, '' without one; every stored event has its plane and line)
    "event_names": "SELECT coalesce(m.name, '') AS name, sum(c.n) AS n FROM (SELECT host, plane_index, "
                   "metadata_id, count(*) AS n FROM event_rows WHERE run_id = $run GROUP BY ALL) c "
                   "LEFT JOIN event_metadata m ON m.run_id = $run AND m.host = c.host "
                   "AND m.plane_index = c.plane_index AND m.metadata_id = c.metadata_id GROUP BY 1",
}


def map_sql(name: str, run_id: int) -> str:
    """The map SQL of partial ``name`` for run ``run_id``."""
    return Template(MAP_SQL[name]).substitute(run=int(run_id))


def partial(rel: dict[str, str] | None, name: str, run_id: int) -> str:
    """The relation holding partial ``name``'s rows of the run: the batches' partials where the run
    was attributed in the map, else its map SQL over the whole run (a subquery)."""
    key = f"{name}_parts"
    if rel is not None and key in rel:
        return rel[key]
    return f"({map_sql(name, run_id)})"


def compute(con: duckdb.DuckDBPyConnection, run_id: int, names: tuple[str, ...] = tuple(MAP_SQL)) -> dict:
    """The partials ``names`` of run ``run_id`` over ``con``'s tables (a map worker's batch), as
    Arrow tables with their DuckDB column types: name -> (table, [(column, type)])."""
    out = {}
    for name in names:
        con.execute("SELECT 1").fetchall()  # (a relation cannot run while an execute() result is unfinished)
        rel = con.sql(map_sql(name, run_id))
        out[name] = (rel.to_arrow_table(), [(c, str(t)) for c, t in zip(rel.columns, rel.types, strict=True)])
    return out
