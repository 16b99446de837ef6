"""The reduce side of a run attributed batch of hosts by batch (analyzer/per_host.py): the readers
that would scan the run's op rows (top ops, collectives, infeed per device) take their partial sums
from each batch's op rows while those are at hand, and combine the small partials at the end, so their
memory is bounded by the batch, not the pod."""

from __future__ import annotations

import duckdb
from tpuanalyze.analyzer.collectives import CollectivePartials
from tpuanalyze.analyzer.input import infeed_sql
from tpuanalyze.analyzer.ops import ops_partial_sql
from tpuanalyze.analyzer.per_host import append_rows


class BatchReduce:
    """Partial aggregates of the run's op rows, batch by batch: ``add_batch`` is per_host's hook;
    ``relations()`` names the TEMP tables of partials (``ops_parts``, ``infeed_parts``) for the readers,
    ``collectives`` the collective partials for ``collectives_frame``."""

    def __init__(self, run_id: int, prefix: str = "ta_") -> None:
        self.run_id = int(run_id)
        self.collectives = CollectivePartials()
        self._tables = {"ops_parts": f"{prefix}ops_parts", "infeed_parts": f"{prefix}infeed_parts"}
        self._batches = 0

    def add_batch(self, con: duckdb.DuckDBPyConnection, op_rows: str) -> None:
        """Add one batch's op rows (a relation with op_steps' columns)."""
        selects = {"ops_parts": ops_partial_sql(self.run_id, op_rows), "infeed_parts": infeed_sql(op_rows)}
        for key, select in selects.items():
            append_rows(con, self._tables[key], select, self._batches == 0)
        self.collectives.add(con, op_rows)
        self._batches += 1

    def relations(self) -> dict[str, str]:
        """Relation names of the partials (none before the first batch)."""
        return dict(self._tables) if self._batches else {}
