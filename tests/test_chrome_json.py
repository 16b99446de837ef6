"""The Chrome-trace JSON reader: phases X, B/E, i, C, M; pid/tid names; microseconds -> ps; args
as stats; gzip; generic Kineto files and JAX's trace.json beside the XSpace."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import duckdb
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tpuanalyze.parsers import chrome_json

from tpuanalyze.pipeline import ingest_paths

TRACE = {
    "displayTimeUnit": "ns",  # display only: ts/dur are microseconds regardless
    "traceEvents": [
        {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/device:TPU:0"}},
        {"ph": "M", "pid": 1, "tid": 2, "name": "thread_name", "args": {"name": "XLA Ops"}},
        {"ph": "M", "pid": 7, "name": "process_name", "args": {"name": "/host:CPU"}},
        {"ph": "M", "pid": 7, "tid": 70, "name": "thread_name", "args": {"name": "python"}},
        {
            "ph": "X",
            "pid": 1,
            "tid": 2,
            "ts": 1000.5,
            "dur": 2.25,
            "name": "fusion.1",
            "args": {"hlo_category": "loop fusion", "flops": 12.0, "long_name": "%fusion.1 = ..."},
        },
        {"ph": "B", "pid": 7, "tid": 70, "ts": 1000.0, "name": "train", "args": {"step_num": "3"}},
        {"ph": "B", "pid": 7, "tid": 70, "ts": 1001.0, "name": "inner"},
        {"ph": "E", "pid": 7, "tid": 70, "ts": 1002.0},
        {"ph": "E", "pid": 7, "tid": 70, "ts": 1010.0, "args": {"result": [1, 2]}},
        {"ph": "E", "pid": 7, "tid": 70, "ts": 1011.0},
        {"ph": "i", "pid": 7, "tid": 70, "ts": 1003.0, "name": "mark", "s": "t"},
        {"ph": "C", "pid": 7, "ts": 1004.0, "name": "memory", "args": {"bytes": 2048, "ok": True}},
        {"ph": "s", "pid": 7, "tid": 70, "ts": 1004.0, "name": "flow", "id": 1},
        {"ph": "X", "pid": 9, "tid": 1, "ts": 1005.0, "dur": 1, "name": "anonymous", "cat": "misc"},
    ],
}


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> duckdb.DuckDBPyConnection:
    folder = tmp_path_factory.mktemp("json")
    path = folder / "host7.trace.json.gz"
    path.write_bytes(gzip.compress(json.dumps(TRACE).encode()))
    summary = ingest_paths([path], folder / "db.duckdb")
    assert (summary.runs, summary.hosts, summary.events) == (1, 1, 6)
    con = duckdb.connect(str(folder / "db.duckdb"), read_only=True)
    yield con
    con.close()


def test_planes_and_lines_from_process_and_thread_names(db: duckdb.DuckDBPyConnection) -> None:
    planes = db.execute("SELECT plane_index, name, kind, device_ordinal FROM planes ORDER BY 1").fetchall()
    assert planes == [
        (0, "/device:TPU:0", "tpu", 0),
        (1, "/host:CPU", "cpu_host", None),
        (2, "pid 9", "other", None),
    ]
    lines = db.execute("SELECT plane_index, line_index, name, num_events FROM lines ORDER BY 1, 2").fetchall()
    assert lines == [(0, 0, "XLA Ops", 1), (1, 0, "python", 3), (1, 1, "tid None", 1), (2, 0, "tid 1", 1)]
    run = db.execute(
        "SELECT host, source_format, num_devices, t0_ns, metadata FROM runs JOIN hosts USING (run_id)"
    )
    host, fmt, devices, t0_ns, metadata = run.fetchall()[0]
    assert (host, fmt, devices, t0_ns) == ("host7", "chrome_json", 1, 1_000_000)
    assert json.loads(metadata)["skipped_events"] == {"ph=s": 1, "E without B": 1}


def test_times_phases_and_args(db: duckdb.DuckDBPyConnection) -> None:
    rows = db.execute(
        "SELECT name, start_ps, duration_ps, hlo_category, flops, step_num, stats "
        "FROM events ORDER BY start_ps, name"
    ).fetchall()
    by_name = {r[0]: r for r in rows}
    assert by_name["train"][1:3] == (0, 10_000_000) and by_name["train"][5] == 3
    assert json.loads(by_name["train"][6]) == {"result": [1, 2]}
    assert by_name["inner"][1:3] == (1_000_000, 1_000_000)  # B/E pair innermost first
    assert by_name["fusion.1"][1:5] == (500_000, 2_250_000, "loop fusion", 12.0)
    assert json.loads(by_name["fusion.1"][6]) == {"long_name": "%fusion.1 = ..."}
    assert by_name["mark"][1:3] == (3_000_000, 0)
    assert json.loads(by_name["memory"][6]) == {"bytes": 2048, "ok": True}
    assert json.loads(by_name["anonymous"][6]) == {"cat": "misc"}
    assert len(rows) == 6  # the unmatched E and the flow event are not events


def test_kineto_files_keep_every_supported_event(tmp_path: Path, shared_traces: Path) -> None:
    files = sorted((shared_traces / "chrome_json").glob("*.json.gz"))
    assert files
    summary = ingest_paths(files, tmp_path / "k.duckdb")
    con = duckdb.connect(str(tmp_path / "k.duckdb"), read_only=True)
    for path in files:
        trace = json.loads(gzip.decompress(path.read_bytes()))
        events = trace["traceEvents"]
        want = sum(1 for e in events if e.get("ph") in ("X", "i", "I", "C"))
        want += sum(1 for e in events if e.get("ph") == "B")
        got = con.execute(
            "SELECT count(*), sum(duration_ps) FROM events JOIN hosts USING (run_id, host) "
            "WHERE file_path = ?",
            [str(path.resolve())],
        ).fetchall()[0]
        assert got[0] == want
        want_dur = sum(e.get("dur", 0) for e in events if e.get("ph") == "X") * 1_000_000
        assert abs(got[1] - want_dur) <= len(events)  # rounding to whole ps per event at most
    assert summary.runs == len(files)
    con.close()


def test_jax_trace_json_matches_its_xspace_per_line(tmp_path: Path, shared_traces: Path) -> None:
    """JAX writes every XSpace event of /host:CPU as one X event (see tests/test_own_captures.py for
    the full equality): per thread the counts and summed durations agree."""
    run = next((shared_traces / "jax_cpu" / "single_jit_train").rglob("vm.xplane.pb")).parent
    db = tmp_path / "j.duckdb"
    x_id = ingest_paths([run], db).run_ids[0]  # the folder: XSpace preferred
    j_id = ingest_paths([run / "vm.trace.json.gz"], db).run_ids[0]  # the file named: JSON
    con = duckdb.connect(str(db), read_only=True)
    fmts = dict(con.execute("SELECT run_id, source_format FROM runs").fetchall())
    assert fmts == {x_id: "xspace", j_id: "chrome_json"}
    query = """SELECT line, count(*), sum(greatest(duration_ps, 1)) FROM events
               WHERE run_id = ? AND plane = '/host:CPU' GROUP BY line ORDER BY line"""
    x_lines = con.execute(query, [x_id]).fetchall()
    j_lines = con.execute(query, [j_id]).fetchall()
    assert [r[:2] for r in x_lines] == [r[:2] for r in j_lines]
    for (_, n, xd), (_, _, jd) in zip(x_lines, j_lines, strict=True):
        assert abs(xd - jd) <= n * 1000  # JSON keeps ns precision
    con.close()


_ARG_VALUES = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8), st.booleans(), st.none(), st.lists(st.integers(0, 9), max_size=3),
)


@given(args=st.lists(st.tuples(st.integers(0, 50), st.sampled_from(["correlation", "step_num", "grid", "x"]),
                                _ARG_VALUES), max_size=60),
       pack=st.integers(1, 7))
@settings(max_examples=200, deadline=None)
def test_stats_packed_in_pieces_are_the_stats_kept_whole(args: list, pack: int) -> None:
    """The reader packs its args table into arrays every STATS_PACK_ROWS rows (memory): the table,
    its order and every value are those of one piece."""
    pieces, whole = chrome_json._Stats(), chrome_json._Stats()
    original = chrome_json.STATS_PACK_ROWS
    try:
        chrome_json.STATS_PACK_ROWS = pack
        for row, key, value in args:
            pieces.add(row, key, value)
        chrome_json.STATS_PACK_ROWS = 10**9
        for row, key, value in args:
            whole.add(row, key, value)
    finally:
        chrome_json.STATS_PACK_ROWS = original
    assert pieces.rows.tolist() == whole.rows.tolist() == [row for row, _, _ in args]
    every = np.arange(len(args))
    a, b = pieces.long(every, every), whole.long(every, every)
    for column in ("key", "kind", "i64", "u64", "f64", "text"):
        assert np.array_equal(getattr(a, column), getattr(b, column), equal_nan=column == "f64"), column
