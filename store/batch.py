"""A batch of hosts' rows held in memory, for a map worker that attributes them where it read them.

``BatchTables`` runs the loader (``store.load.TablesWriter``: typed columns, stats JSON, time shift)
with sinks that keep each table's numpy columns instead of writing them. Then:

- ``arrow(table)`` is the table's rows as an Arrow table with the database's columns and types (what
  the loader's SQL casts write, ``store.load.part_select``, built in numpy: tests/test_map_analysis.py
  compares them), so ``register`` can give a DuckDB connection the batch as the base tables
  (``planes``, ``lines``, ``event_metadata``, ``event_rows``, ``event_details``) without inserting
  a row: the analyzer's SQL reads them as it reads the database;
- ``write_parts`` writes the rows to store as Parquet parts, as ``GroupParts`` writes them, with the
  events of some lines left out (a report's temporary database does without the device op events,
  which the map's results stand for).

Memory: the batch's rows, once (a map task's batch is bounded by ``GROUP_EVENTS``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
from tpuanalyze.parsers.staging import HostReader
from tpuanalyze.store.load import (
    _EXPRESSIONS,
    _HOST,
    _JSON,
    EVENT_PART_TABLES,
    FLUSH_EVENTS,
    FLUSH_PLANE_ROWS,
    TablesWriter,
    _concat,
    _Details,
    _Parts,
    _stats_json,
    table_types,
)
from tpuanalyze.store.parts import HOST_TABLES, HostParts, group_part_dir

from tpuanalyze.keys import columns_in, is_op_line, lookup

_ARROW_OF = {"INTEGER": "int32", "BIGINT": "int64", "UBIGINT": "uint64", "DOUBLE": "float64",
             "VARCHAR": "string", "JSON": "string", "BOOLEAN": "bool_"}


class _Kept(_Parts):
    """A table's rows kept as numpy columns (the loader's, before the SQL casts), never written."""

    def add(self, columns: dict[str, np.ndarray], host: str) -> None:
        rows = len(next(iter(columns.values())))
        if not rows:
            return
        code = self.hosts.setdefault(host, len(self.hosts))
        columns["host_code"] = np.full(rows, code, dtype=np.int32)
        self.pending.append(columns)
        self.rows += rows

    def flush(self) -> None:  # kept: written (or not) by BatchTables
        return None

    def columns(self) -> dict[str, np.ndarray] | None:
        if not self.pending:
            return None
        if len(self.pending) > 1:
            self.pending = [_concat(self.pending)]
        return self.pending[0]


@dataclass
class MetadataBlock:
    """A plane's block of ``event_metadata`` rows in a batch: rows ``first``.. ``first + rows`` of the
    kept table, ``columns`` the loader's numpy columns of those rows, ``table`` the number of the
    metadata table object they came from (``_KeptMetadata``)."""

    host: str
    plane: int
    table: int
    first: int
    rows: int
    columns: dict[str, np.ndarray]


class _KeptMetadata(_Kept):
    """``event_metadata`` kept, with each plane's block of rows and which table it is: the reader hands
    the planes (and hosts) whose metadata tables are the same bytes one table object (parsers/
    xspace.py), so blocks of one object hold the same rows, and an op's kind is a function of its line,
    its block's table and its metadata id (analyzer/op_arrays.py). A table is known by the ``id`` of its
    ``metadata_id`` array, which its blocks' columns keep alive (an id is not reused meanwhile)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.blocks: list[MetadataBlock] = []
        self._tables: dict[int, int] = {}  # id(the table's metadata_id array) -> table number

    def add(self, columns: dict[str, np.ndarray], host: str) -> None:
        rows = len(next(iter(columns.values())))
        if rows:
            table = self._tables.setdefault(id(columns["metadata_id"]), len(self._tables))
            self.blocks.append(MetadataBlock(host, int(columns["plane_index"][0]), table, self.rows, rows,
                                             columns))
        super().add(columns, host)


class _KeptDetails(_Kept, _Details):
    """``event_details`` kept; the stats JSON built once for all rows (``_Details`` builds it per part)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stats: list[dict[str, np.ndarray]] = []
        self.stat_rows = 0
        self._json_done = False

    def columns(self) -> dict[str, np.ndarray] | None:
        rows = super().columns()
        if rows is None or self._json_done:
            return rows
        text = np.full(len(rows["serial"]), None, dtype=object)
        if self.stats:
            owners, texts = _stats_json(self.con, _concat(self.stats))
            text[np.searchsorted(rows["serial"], owners)] = texts  # serials ascend: rows in event order
        self.stats, self.stat_rows = [], 0
        rows["stats"] = text
        self._json_done = True
        return rows


class BatchTables:
    """Consecutive hosts of a run read into memory (module docstring)."""

    def __init__(self, con: duckdb.DuckDBPyConnection, run_t0_ns: int | None) -> None:
        self.con = con  # an in-memory DuckDB of this process (the loader's stats JSON statements)
        self.run_t0_ns = run_t0_ns
        dropped = {table: ("run_id",) for table in HOST_TABLES}
        self._writer = TablesWriter(con, dict.fromkeys(HOST_TABLES), dropped)
        for table in HOST_TABLES:
            cls = {"event_details": _KeptDetails, "event_metadata": _KeptMetadata}.get(table, _Kept)
            self._writer.parts[table] = cls(con, table, None, dropped[table],
                                            FLUSH_EVENTS if table in EVENT_PART_TABLES else FLUSH_PLANE_ROWS,
                                            "snappy")
        self.hosts: list[HostParts] = []
        self._op_line_mask: np.ndarray | None = None  # (the parts' keep and the map's events read it)

    def add(self, reader: HostReader) -> HostParts:
        """Read one host (the loader's rows of every table, kept)."""
        self._op_line_mask = None
        load = self._writer.add_host(reader, self.run_t0_ns)
        parts = HostParts(host=reader.host, planes=load.counts.planes, events=load.counts.events,
                          devices=load.devices, device_type=load.device_type,
                          kinds_with_events=sorted(load.kinds_with_events), window=load.window)
        self.hosts.append(parts)
        return parts

    def columns(self, table: str) -> dict[str, np.ndarray] | None:
        """The table's kept numpy columns (``host_code`` indexes ``host_names(table)``), or None."""
        return self._writer.parts[table].columns()  # type: ignore[union-attr]

    def host_names(self, table: str) -> list[str]:
        return list(self._writer.parts[table].hosts)

    def metadata_blocks(self) -> list[MetadataBlock]:
        """Each plane's block of ``event_metadata`` rows; blocks of one table number hold the same rows
        (``_KeptMetadata``)."""
        return list(self._writer.parts["event_metadata"].blocks)  # type: ignore[attr-defined]

    def arrow(self, table: str, run_id: int, rows: np.ndarray | None = None) -> Any:
        """The table's rows (``rows``: positions, default all) as Arrow with the database's columns and
        types, ``run_id`` as given. All of ``event_metadata``: each distinct table converted once, its
        planes' blocks sharing its Arrow buffers (a pod batch's 300 planes have 2 tables)."""
        import pyarrow as pa

        if table == "event_metadata" and rows is None:
            return self._metadata_arrow(run_id)
        columns = self.columns(table)
        types = table_types()[table]
        if columns is None:
            return pa.table({c: pa.array([], type=getattr(pa, _ARROW_OF[t])()) for c, t in types})
        if rows is None:
            rows = np.arange(len(columns["host_code"]))
        host = pa.array(self.host_names(table), type=pa.string()).take(pa.array(columns["host_code"][rows]))
        return _as_arrow(table, columns, rows, host, run_id)

    def _metadata_arrow(self, run_id: int) -> Any:
        import pyarrow as pa

        blocks = self.metadata_blocks()
        if not blocks:
            return self.arrow("event_metadata", run_id, np.arange(0))
        converted: dict[int, Any] = {}
        pieces = []
        for block in blocks:
            n = block.rows
            if block.table not in converted:
                converted[block.table] = _as_arrow("event_metadata", block.columns, np.arange(n),
                                                   pa.nulls(n, pa.string()), run_id)
            piece = converted[block.table]
            host_column = pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)),
                                                         pa.array([block.host], type=pa.string()))
            piece = piece.set_column(piece.schema.get_field_index("host"), "host", host_column)
            plane = pa.array(np.full(n, block.plane, np.int32))
            pieces.append(piece.set_column(piece.schema.get_field_index("plane_index"), "plane_index", plane))
        return pa.concat_tables(pieces)

    def register(self, con: duckdb.DuckDBPyConnection, run_id: int) -> None:
        """Give ``con`` the batch as its base tables (registered Arrow, no rows inserted) and the
        ``events`` view over them."""
        from tpuanalyze.store.database import events_select

        for table in HOST_TABLES:
            con.register(table, self.arrow(table, run_id))
        con.execute(f"CREATE OR REPLACE TEMP VIEW events AS {events_select('event_rows')}")

    def op_line_mask(self) -> np.ndarray:
        """Per ``event_rows`` row (in order): whether it lies on a device op line (stage att_ops' device
        branch, ``tpuanalyze.keys.is_op_line``); found once per set of hosts."""
        if self._op_line_mask is None:
            self._op_line_mask = self._find_op_lines()
        return self._op_line_mask

    def _find_op_lines(self) -> np.ndarray:
        events = self.columns("event_rows")
        if events is None:
            return np.zeros(0, bool)
        lines, planes = self.columns("lines"), self.columns("planes")
        if lines is None or planes is None:
            return np.zeros(len(events["host_code"]), bool)
        plane_hosts, line_hosts = self.host_names("planes"), self.host_names("lines")
        plane_name = {(plane_hosts[h], int(p)): name for h, p, name in
                      zip(planes["host_code"].tolist(), planes["plane_index"].tolist(),
                          planes["name"].tolist(), strict=True)}
        code = {h: i for i, h in enumerate(self.host_names("event_rows"))}
        op_lines = [(code[line_hosts[h]], int(p), int(i)) for h, p, i, name in
                    zip(lines["host_code"].tolist(), lines["plane_index"].tolist(),
                        lines["line_index"].tolist(), lines["name"].tolist(), strict=True)
                    if line_hosts[h] in code and is_op_line(plane_name.get((line_hosts[h], int(p))), name)]
        ids = np.stack([events[c].astype(np.int64) for c in ("host_code", "plane_index", "line_index")])
        return lookup(np.array(op_lines, dtype=np.int64).T, np.ones(len(op_lines), bool), ids, default=False)

    def off_op_lines(self) -> Callable[[str, dict[str, np.ndarray]], np.ndarray | None]:
        """``write_parts``' ``keep`` leaving out the events of device op lines, their details, and the
        event metadata only they name (what a report's temporary database stores of a run the map
        attributed: every other reader reads events off those lines, analyzer/event_partials.py)."""
        on_op_line = self.op_line_mask()
        kept_events = ~on_op_line

        def keep(table: str, columns: dict[str, np.ndarray]) -> np.ndarray | None:
            if table == "event_rows":
                return kept_events
            if table == "event_details":
                # a details row's serial is its event's position in the batch's event_rows (TablesWriter)
                return kept_events[columns["serial"]] if len(kept_events) else None
            if table == "event_metadata":
                events = self.columns("event_rows")
                if events is None:
                    return None
                ev_hosts, md_hosts = self.host_names("event_rows"), self.host_names("event_metadata")
                code = {h: i for i, h in enumerate(md_hosts)}
                remap = np.array([code.get(h, -1) for h in ev_hosts], dtype=np.int64)

                ev_host = remap[events["host_code"]]
                named = np.stack([ev_host[kept_events], events["plane_index"][kept_events],
                                  events["metadata_id"][kept_events]])
                op_planes = np.stack([ev_host[on_op_line], events["plane_index"][on_op_line]])
                md = np.stack([columns["host_code"].astype(np.int64), columns["plane_index"].astype(np.int64),
                               columns["metadata_id"].astype(np.int64)])
                referenced = columns_in(md, named)
                on_op_plane = columns_in(md[:2], op_planes)
                return referenced | ~on_op_plane
            return None

        return keep

    def write_parts(self, staging: str | Path, compression: str,
                    keep: Callable[[str, dict[str, np.ndarray]], np.ndarray | None] | None = None,
                    ) -> list[HostParts]:
        """Write the rows to store as Parquet parts of each table in ``staging`` (the group's folders,
        as ``GroupParts`` names them); ``keep(table, columns)`` may choose the rows of a table. The
        hosts' ``HostParts``, the group's parts listed on its first host."""
        if not self.hosts:
            return []
        first = self.hosts[0].host
        files: dict[str, list[str]] = {}
        for table in HOST_TABLES:
            columns = self.columns(table)
            if columns is None:
                continue
            if keep is not None:
                mask = keep(table, columns)
                if mask is not None:
                    columns = {name: values[mask] for name, values in columns.items()}
            if not len(columns["host_code"]):
                continue
            # (event_details' stats JSON is built already: a plain part writer writes it as it is)
            writer = _Parts(self.con, table, group_part_dir(staging, table, first), ("run_id",), 1 << 62,
                            compression)
            writer.hosts = {name: i for i, name in enumerate(self.host_names(table))}
            writer.pending = [columns]
            writer.rows = len(columns["host_code"])
            writer.needs_host = True
            writer.flush()
            files[table] = writer.take_files()
        self.hosts[0].files.update({t: f for t, f in files.items() if f})
        self.hosts[0].group = [h.host for h in self.hosts]
        return self.hosts


def _as_arrow(table: str, columns: dict[str, np.ndarray], rows: np.ndarray, host: Any, run_id: int) -> Any:
    """``table``'s columns and types (schema.sql) from the loader's numpy ``columns`` at ``rows``, as
    its SQL casts write them (store.load.part_select): ``host`` the rows' host column (Arrow)."""
    import pyarrow as pa

    expressions = _EXPRESSIONS[table]
    out = {}
    for column, kind in table_types()[table]:
        arrow_type = getattr(pa, _ARROW_OF[kind])()
        expr = expressions.get(column)
        if column == "run_id":
            out[column] = pa.array(np.full(len(rows), run_id, np.int32))
        elif expr is None:  # a column the loader does not write: NULL in the database too
            out[column] = pa.nulls(len(rows), arrow_type)
        elif expr == _HOST:
            out[column] = host
        elif expr == "start_ps + shift_ps":
            out[column] = pa.array(columns["start_ps"][rows] + columns["shift_ps"][rows], type=arrow_type)
        elif expr == _JSON or kind in ("VARCHAR", "JSON"):
            out[column] = pa.array(columns[column][rows], type=pa.string())
        elif f"{column}__ok" in columns:
            out[column] = pa.array(columns[column][rows], type=arrow_type,
                                   mask=~columns[f"{column}__ok"][rows])
        else:
            out[column] = pa.array(columns[column][rows], type=arrow_type)
    return pa.table(out)
