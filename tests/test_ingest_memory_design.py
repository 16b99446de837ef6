"""What keeps ingest memory small stays true: no Arrow/pandas imported to ingest XSpace, a load that
runs out of DuckDB's small buffer is redone (not failed), event stats survive the narrow storage
(typed in numpy by SQL's cast rules), and a database in the older storage layout is refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb
import numpy as np
import pytest
from conftest import SAMPLE_TRACES
from hypothesis import given, settings
from hypothesis import strategies as st
from tpuanalyze.store import commit as commit_module
from tpuanalyze.store import parts as ingest_module

from tpuanalyze.errors import TpuAnalyzeError
from tpuanalyze.pipeline import ingest_paths
from tpuanalyze.proto import xplane_pb2

CAPTURE = SAMPLE_TRACES / "jax_cpu"
GENERATED = SAMPLE_TRACES / "generated" / "resnet50_v3-32_input-bound"


def _stats_trace(path: Path, events: int = 20_000) -> Path:
    """One CPU plane whose events carry every stat kind (typed ones and others), spread over
    batches: the stats path of the loader, at a size that crosses batch and piece boundaries."""
    space = xplane_pb2.XSpace(hostnames=["h"])
    plane = space.planes.add(id=1, name="/host:CPU")
    names = ["step_num", "group_id", "tf_op", "program_id", "flops", "note", "ratio", "blob", "kind"]
    for i, name in enumerate(names, start=1):
        plane.stat_metadata[i].id = i
        plane.stat_metadata[i].name = name
    plane.event_metadata[1].id = 1
    plane.event_metadata[1].name = "train"
    line = plane.lines.add(id=1, name="python", timestamp_ns=1_000)
    for i in range(events):
        event = line.events.add(metadata_id=1, offset_ps=i * 1000, duration_ps=500)
        if i % 3 == 0:
            event.stats.add(metadata_id=1, int64_value=i)  # step_num -> event_rows
            event.stats.add(metadata_id=2, uint64_value=i // 7)  # group_id -> event_rows
        if i % 5 == 0:
            event.stats.add(metadata_id=3, str_value=f"op/{i}")  # tf_op -> event_details
            event.stats.add(metadata_id=4, int64_value=-1)  # program_id: two's complement
            event.stats.add(metadata_id=5, double_value=2.5)
        if i % 7 == 0:
            event.stats.add(metadata_id=6, str_value='say "hi"')  # other -> stats JSON
            event.stats.add(metadata_id=7, double_value=float("inf"))
            event.stats.add(metadata_id=8, bytes_value=b"\x00\x01")
            event.stats.add(metadata_id=9, ref_value=6)
    path.write_bytes(space.SerializeToString())
    return path


def test_ingesting_xspace_imports_neither_pyarrow_nor_pandas(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from tpuanalyze.pipeline import ingest_paths\n"
        f"ingest_paths([{str(CAPTURE)!r}], {str(tmp_path / 'db.duckdb')!r})\n"
        "print(sorted(m for m in ('pyarrow', 'pandas', 'altair') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_stats_of_every_kind_survive_the_narrow_storage(tmp_path: Path) -> None:
    trace = _stats_trace(tmp_path / "stats.xplane.pb")
    db = tmp_path / "db.duckdb"
    assert ingest_paths([trace], db).events == 20_000
    con = duckdb.connect(str(db), read_only=True)
    rows = {
        r[0]: r[1:]
        for r in con.execute(
            "SELECT start_ps // 1000, step_num, group_id, tf_op, program_id, flops, stats FROM events"
        ).fetchall()
    }
    assert len(rows) == 20_000
    for i in (0, 3, 5, 7, 15, 21, 35, 105, 19_998):
        step_num, group_id, tf_op, program_id, flops, stats = rows[i]
        assert step_num == (i if i % 3 == 0 else None)
        assert group_id == (i // 7 if i % 3 == 0 else None)
        assert tf_op == (f"op/{i}" if i % 5 == 0 else None)
        assert program_id == (2**64 - 1 if i % 5 == 0 else None)
        assert flops == (2.5 if i % 5 == 0 else None)
        if i % 7 == 0:
            assert json.loads(stats) == {"note": 'say "hi"', "ratio": "inf", "blob": "AAE=", "kind": "note"}
        else:
            assert stats is None
    # only events with something beyond step_num/group_id have a details row
    details = con.execute("SELECT count(*) FROM event_details").fetchone()[0]
    assert details == len([i for i in range(20_000) if i % 5 == 0 or i % 7 == 0])


@pytest.mark.parametrize("direct", [False, True], ids=["parts", "direct"])
def test_a_load_out_of_duckdb_memory_is_redone_with_a_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, direct: bool
) -> None:
    reference = ingest_paths([GENERATED], tmp_path / "reference.duckdb")
    monkeypatch.setenv("TPUANALYZE_DIRECT_LOAD", "1" if direct else "0")
    # parts: the buffer while a host's parts are written; direct: the database's, inside the commit
    # (an XSpace run's own, smaller than the commit's of parts)
    monkeypatch.setattr(commit_module if direct else ingest_module,
                        "DIRECT_XSPACE_MEMORY_LIMIT" if direct else "LOAD_MEMORY_LIMIT", "1MB")
    summary = ingest_paths([GENERATED], tmp_path / "tiny.duckdb", workers=1)  # in this process
    assert any("ran out of its 1MB load buffer" in note for note in summary.notes), summary.notes
    assert summary.events == reference.events
    query = "SELECT count(*), sum(duration_ps), count(DISTINCT name), count(stats) FROM events"
    tiny = duckdb.connect(str(tmp_path / "tiny.duckdb"), read_only=True).execute(query).fetchall()
    full = duckdb.connect(str(tmp_path / "reference.duckdb"), read_only=True).execute(query).fetchall()
    assert tiny == full


def test_database_in_the_older_storage_layout_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "old.duckdb"
    con = duckdb.connect(str(db))
    con.execute("CREATE TABLE event_rows (run_id INTEGER, host VARCHAR, start_ps BIGINT)")
    con.close()
    with pytest.raises(TpuAnalyzeError, match="older tpuanalyze .event_rows has no event_index"):
        ingest_paths([CAPTURE], db)


EDGE_DOUBLES = [0.5, 1.5, 2.5, -0.5, -2.5, -0.4, 2.0**63, -(2.0**63), 2.0**64]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.integers(-(2**63), 2**63 - 1).map(lambda v: ("int", v)),
            st.integers(0, 2**64 - 1).map(lambda v: ("uint", v)),
            st.floats(allow_nan=False, allow_infinity=False, width=64).map(lambda v: ("double", v)),
            st.sampled_from(EDGE_DOUBLES).map(lambda v: ("double", v)),
        ),
        min_size=1,
        max_size=40,
    )
)
def test_typed_stat_conversion_matches_duckdb_casts(values: list[tuple[str, object]]) -> None:
    """The numpy conversion of stat values into typed columns gives what SQL's casts give."""
    from tpuanalyze.parsers.staging import STAT_DOUBLE, STAT_INT, STAT_UINT
    from tpuanalyze.store.load import _converted

    kinds = {"int": STAT_INT, "uint": STAT_UINT, "double": STAT_DOUBLE}
    n = len(values)
    stats = {
        "kind": np.array([kinds[k] for k, _ in values], dtype=np.int8),
        "i64": np.array([v if k == "int" else 0 for k, v in values], dtype=np.int64),
        "u64": np.array([v if k == "uint" else 0 for k, v in values], dtype=np.uint64),
        "f64": np.array([v if k == "double" else 0.0 for k, v in values], dtype=np.float64),
        "text": np.full(n, None, dtype=object),
    }
    con = duckdb.connect()
    sql_type = {"int": "BIGINT", "uint": "UBIGINT", "double": "DOUBLE", "str": "VARCHAR"}
    for target in ("int", "uint", "double", "str"):
        got, fits = _converted(target, stats, np.arange(n))
        for i, (kind, value) in enumerate(values):
            source = {"int": "BIGINT", "uint": "UBIGINT", "double": "DOUBLE"}[kind]
            if target == "str" and kind == "double":
                expected = None  # a string column takes text and integers only
            elif target == "uint" and kind == "int":
                expected = value & (2**64 - 1)  # two's complement, as protobuf writes it
            else:
                expected = con.execute(
                    f"SELECT TRY_CAST(CAST(? AS {source}) AS {sql_type[target]})", [value]
                ).fetchone()[0]
            assert (got[i] if fits[i] else None) == expected, (target, kind, value)
