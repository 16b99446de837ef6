"""The reduce side of a run attributed batch of hosts by batch (analyzer/per_host.py): the readers
that would scan the run's op rows (top ops, collectives, infeed per device) take their partial sums
from each batch's op rows while those are at hand, and combine the small partials at the end, so their
memory is bounded by the batch, not the pod."""

from __future__ import annotations

import duckdb
from tpuanalyze.analyzer.collectives import CollectivePartials
from tpuanalyze.analyzer.input import infeed_sql
from tpuanalyze.analyzer.ops import ops_partial_narrow_sql, ops_partial_sql
from tpuanalyze.analyzer.per_host import SCRATCH, concat_tables


class BatchReduce:
    """Partial aggregates of the run's op rows, batch by batch: ``add_batch`` is per_host's hook (batches
    may come in any order, from threads, each on its own cursor); ``finish`` combines them in batch order
    into TEMP tables of the caller's connection, ``relations()`` names them (``ops_parts``,
    ``infeed_parts``) for the readers, ``collectives`` the collective partials for ``collectives_frame``."""

    def __init__(self, run_id: int, prefix: str = "ta_", keep_warmup: bool = False) -> None:
        self.run_id, self.keep_warmup = int(run_id), keep_warmup
        self.collectives = CollectivePartials()
        self._prefix = prefix
        self._tables = {"ops_parts": f"{prefix}ops_parts", "infeed_parts": f"{prefix}infeed_parts"}
        self._batches: dict[int, CollectivePartials] = {}
        self._done = False

    def _part(self, key: str, index: int) -> str:
        return f"{SCRATCH}.{self._prefix}b{index}_{key}"

    def add_batch(self, con: duckdb.DuckDBPyConnection, op_rows: str, index: int,
                  steps: str | None = None, narrow: tuple[str, str] | None = None) -> None:
        """Add batch ``index``'s op rows (a relation with op_steps' columns) into its partial tables
        (in the scratch database: the caller's connection reads them); ``steps``, the batch's
        step_breakdown, names the warm-up steps the collectives leave out; ``narrow``: the same rows
        as (narrow rows, kinds), which the top ops' partial sums read (grouped on integers first)."""
        ops = (ops_partial_sql(self.run_id, op_rows) if narrow is None
               else ops_partial_narrow_sql(self.run_id, *narrow))
        selects = {"ops_parts": ops, "infeed_parts": infeed_sql(op_rows)}
        for key, select in selects.items():
            con.execute(f"CREATE OR REPLACE TABLE {self._part(key, index)} AS {select}")
        partials = CollectivePartials()
        partials.add(con, op_rows, steps, self.keep_warmup)
        self._batches[index] = partials

    def finish(self, con: duckdb.DuckDBPyConnection) -> None:
        """Combine the batches' partials, in batch order (as one connection adding them in turn)."""
        order = sorted(self._batches)
        for key, table in self._tables.items():
            concat_tables(con, table, [self._part(key, i) for i in order])
        for i in order:
            self.collectives.extend(self._batches.pop(i))
        self._done = bool(order)

    def relations(self) -> dict[str, str]:
        """Relation names of the partials (none before the first batch)."""
        return dict(self._tables) if self._done else {}
