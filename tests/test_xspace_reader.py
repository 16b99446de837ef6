"""The XSpace reader: every stat type, metadata/event stat merge, times relative to the run, plane
classification, and the vectorised wire decoder against protobuf's own encoder (property test)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import duckdb
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tpuanalyze.parsers import wire

from tpuanalyze.pipeline import ingest_paths
from tpuanalyze.proto import xplane_pb2

T0_NS = 1_767_225_600_000_000_000  # absolute ns since the epoch: ps would overflow int64


def _stat_md(plane: xplane_pb2.XPlane, names: list[str]) -> dict[str, int]:
    ids = {}
    for i, name in enumerate(names, start=1):
        plane.stat_metadata[i].id = i
        plane.stat_metadata[i].name = name
        ids[name] = i
    return ids


def build_space() -> xplane_pb2.XSpace:
    space = xplane_pb2.XSpace(hostnames=["tpu-host-0"], warnings=["a warning"])
    tpu = space.planes.add(id=2, name="/device:TPU:1")
    sid = _stat_md(
        tpu,
        [
            "device_type_string",
            "peak_teraflops_per_second",
            "peak_hbm_bw_gigabytes_per_second",
            "hlo_category",
            "program_id",
            "flops",
            "bytes_accessed",
            "shape_with_layout",
            "tf_op",
            "source",
            "group_id",
            "step_num",
            "big",
            "neg",
            "ratio",
            "note",
            "blob",
            "kind",
            "fusion",
            "nan",
            "hlo_module",
        ],
    )
    tpu.stats.add(metadata_id=sid["device_type_string"], str_value="TPU v3")
    tpu.stats.add(metadata_id=sid["peak_teraflops_per_second"], double_value=123.0)
    tpu.stats.add(metadata_id=sid["peak_hbm_bw_gigabytes_per_second"], double_value=900.0)
    module = tpu.event_metadata[1]
    module.id, module.name = 1, "jit_train_step(12345678901234567890)"
    op = tpu.event_metadata[2]
    op.id, op.name, op.display_name = 2, "%fusion.1 = bf16[8]{0} fusion(...)", "fusion.1"
    op.stats.add(metadata_id=sid["hlo_category"], str_value="loop fusion")
    op.stats.add(metadata_id=sid["program_id"], uint64_value=12345678901234567890)
    op.stats.add(metadata_id=sid["flops"], int64_value=1000)
    op.stats.add(metadata_id=sid["bytes_accessed"], double_value=2.5e6)
    op.stats.add(metadata_id=sid["shape_with_layout"], str_value="bf16[8]{0}")
    op.stats.add(metadata_id=sid["tf_op"], str_value="model/dense/MatMul")
    op.stats.add(metadata_id=sid["source"], str_value="model.py:12")
    op.stats.add(metadata_id=sid["note"], str_value="from metadata")
    op.stats.add(metadata_id=sid["ratio"], double_value=0.5)
    step = tpu.event_metadata[3]
    step.id, step.name = 3, "7"

    modules = tpu.lines.add(id=1, name="XLA Modules", timestamp_ns=T0_NS + 1000)
    modules.events.add(metadata_id=1, offset_ps=0, duration_ps=50_000)
    ops = tpu.lines.add(id=2, name="XLA Ops", timestamp_ns=T0_NS + 1000)
    e = ops.events.add(metadata_id=2, offset_ps=500, duration_ps=7_000)
    e.stats.add(metadata_id=sid["big"], uint64_value=2**64 - 1)
    e.stats.add(metadata_id=sid["neg"], int64_value=-(2**63))
    e.stats.add(metadata_id=sid["note"], str_value='event "wins"\nline2 \u00e9')
    e.stats.add(metadata_id=sid["blob"], bytes_value=b"\x00\x01\xff")
    e.stats.add(metadata_id=sid["kind"], ref_value=sid["fusion"])
    e.stats.add(metadata_id=sid["nan"], double_value=float("nan"))
    e.stats.add(metadata_id=sid["flops"], double_value=4096.0)  # event value beats metadata
    e2 = ops.events.add(metadata_id=2, offset_ps=9_000, duration_ps=1_000)
    e2.stats.add(metadata_id=sid["group_id"], int64_value=3)
    steps = tpu.lines.add(id=3, name="Steps", timestamp_ns=T0_NS + 2000)
    s = steps.events.add(metadata_id=3, offset_ps=0, duration_ps=60_000)
    s.stats.add(metadata_id=sid["group_id"], int64_value=3)
    s.stats.add(metadata_id=sid["step_num"], int64_value=7)
    agg = tpu.lines.add(id=4, name="Aggregated", timestamp_ns=T0_NS + 2000)
    agg.events.add(metadata_id=3, num_occurrences=5, duration_ps=10)

    host = space.planes.add(id=0, name="/host:CPU")
    hid = _stat_md(host, ["hlo_module", "device_ordinal"])
    host.event_metadata[9].id = 9
    host.event_metadata[9].name = "ExecuteOnDevice"
    line = host.lines.add(id=77, name="python", timestamp_ns=T0_NS)
    h = line.events.add(metadata_id=9, offset_ps=250, duration_ps=100)
    h.stats.add(metadata_id=hid["hlo_module"], ref_value=hid["device_ordinal"])
    h.stats.add(metadata_id=hid["device_ordinal"], int64_value=1)
    space.planes.add(name="/host:metadata")
    space.planes.add(name="Task Environment")
    return space


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> duckdb.DuckDBPyConnection:
    folder = tmp_path_factory.mktemp("xspace") / "plugins" / "profile" / "run1"
    folder.mkdir(parents=True)
    (folder / "tpu-host-0.xplane.pb").write_bytes(build_space().SerializeToString())
    second = build_space()
    for plane in second.planes:
        for ln in plane.lines:
            ln.timestamp_ns += 5_000_000  # host 1 starts 5 ms later
    (folder / "tpu-host-1.xplane.pb").write_bytes(second.SerializeToString())
    (folder / "jit_x(1).hlo_proto.pb").write_bytes(b"sidecar, ignored")
    path = folder.parents[2] / "db.duckdb"
    summary = ingest_paths([folder], path)
    assert (summary.runs, summary.hosts, summary.events) == (1, 2, 2 * 6)
    con = duckdb.connect(str(path), read_only=True)
    yield con
    con.close()


def test_run_row_and_common_time_zero(db: duckdb.DuckDBPyConnection) -> None:
    row = db.execute(
        "SELECT name, source_format, device_type, num_hosts, num_devices, t0_ns, capture_start_ps, "
        "capture_end_ps, num_events FROM runs"
    ).fetchall()
    name = row[0][0]
    assert name.endswith("/run1")  # <logdir>/<run> (docs/schema.md, Run names)
    assert row == [(name, "xspace", "TPU v3", 2, 2, T0_NS, 250, 5_000_000_000 + 2_000_000 + 60_000, 12)]
    starts = dict(
        db.execute("SELECT host, min(start_ps) FROM events WHERE line = 'XLA Ops' GROUP BY host").fetchall()
    )
    # start_ps = (line.timestamp_ns - run t0_ns) * 1000 + offset_ps, one t0 for all hosts
    assert starts == {"tpu-host-0": 1_000_000 + 500, "tpu-host-1": 5_000_000_000 + 1_000_000 + 500}


def test_planes_classified_with_device_stats(db: duckdb.DuckDBPyConnection) -> None:
    planes = db.execute(
        "SELECT plane_index, name, kind, device_ordinal, device_type, peak_tflops, peak_hbm_bw_gbps, "
        "num_lines, num_events FROM planes WHERE host = 'tpu-host-0' ORDER BY plane_index"
    ).fetchall()
    assert planes == [
        (0, "/device:TPU:1", "tpu", 1, "TPU v3", 123.0, 900.0, 4, 5),
        (1, "/host:CPU", "cpu_host", None, None, None, None, 1, 1),
        (2, "/host:metadata", "metadata", None, None, None, None, 0, 0),
        (3, "Task Environment", "other", None, None, None, None, 0, 0),
    ]
    hosts = db.execute("SELECT host, hostnames, warnings FROM hosts ORDER BY host").fetchall()
    assert hosts[0] == ("tpu-host-0", ["tpu-host-0"], ["a warning"])


def test_op_typed_columns_merge_metadata_and_event_stats(db: duckdb.DuckDBPyConnection) -> None:
    rows = db.execute(
        """SELECT name, display_name, hlo_category, hlo_module, program_id, flops, bytes_accessed,
                  shape, tf_op, source, group_id, device_ordinal, stats
           FROM events WHERE host = 'tpu-host-0' AND line = 'XLA Ops' ORDER BY start_ps"""
    ).fetchall()
    first, second = rows
    assert first[:12] == (
        "%fusion.1 = bf16[8]{0} fusion(...)",
        "fusion.1",
        "loop fusion",
        "jit_train_step(12345678901234567890)",
        12345678901234567890,
        4096.0,
        2.5e6,
        "bf16[8]{0}",
        "model/dense/MatMul",
        "model.py:12",
        None,
        1,
    )
    stats = json.loads(first[12])
    assert stats["big"] == 2**64 - 1 and stats["neg"] == -(2**63)
    assert stats["note"] == 'event "wins"\nline2 \u00e9'
    assert stats["blob"] == "AAH/"  # base64 of the bytes
    assert stats["kind"] == "fusion"  # ref -> the referenced stat-metadata name
    assert stats["nan"] == "nan"
    assert "flops" not in stats  # typed stats are columns, not JSON
    assert second[2] == "loop fusion" and second[5] == 1000.0 and second[10] == 3
    meta = db.execute(
        "SELECT stats FROM event_metadata WHERE host = 'tpu-host-0' AND metadata_id = 2"
    ).fetchall()[0][0]
    assert json.loads(meta) == {"note": "from metadata", "ratio": 0.5}
    merged = db.execute(
        "SELECT all_stats FROM event_stats WHERE host = 'tpu-host-0' AND line = 'XLA Ops' ORDER BY start_ps"
    ).fetchall()
    assert json.loads(merged[0][0])["note"] == 'event "wins"\nline2 \u00e9'  # event wins
    assert json.loads(merged[0][0])["ratio"] == 0.5
    assert json.loads(merged[1][0]) == {"note": "from metadata", "ratio": 0.5}


def test_modules_steps_aggregates_and_refs(db: duckdb.DuckDBPyConnection) -> None:
    module = db.execute(
        "SELECT name, hlo_module FROM events WHERE host = 'tpu-host-0' AND line = 'XLA Modules'"
    ).fetchall()
    assert module == [("jit_train_step(12345678901234567890)",) * 2]
    step = db.execute(
        "SELECT name, step_num, group_id, duration_ps FROM events "
        "WHERE host = 'tpu-host-0' AND line = 'Steps'"
    ).fetchall()
    assert step == [("7", 7, 3, 60_000)]
    agg = db.execute(
        "SELECT num_occurrences, duration_ps FROM events WHERE host = 'tpu-host-0' AND line = 'Aggregated'"
    ).fetchall()
    assert agg == [(5, 10)]
    host_event = db.execute(
        "SELECT hlo_module, stats FROM events WHERE host = 'tpu-host-0' AND plane = '/host:CPU'"
    ).fetchall()
    assert host_event[0][0] == "device_ordinal" and json.loads(host_event[0][1]) == {"device_ordinal": 1}


def test_reingest_replaces_the_run(tmp_path: Path) -> None:
    path = tmp_path / "h.xplane.pb"
    path.write_bytes(build_space().SerializeToString())
    db = tmp_path / "db.duckdb"
    first = ingest_paths([path], db)
    second = ingest_paths([path], db)
    # replaced in place: the same run_id, so saved `db:ID` references keep naming it
    assert second.replaced_run_ids == first.run_ids and second.run_ids == first.run_ids
    con = duckdb.connect(str(db), read_only=True)
    for table in ("runs", "hosts", "planes", "lines", "event_metadata", "events"):
        ids = con.execute(f"SELECT DISTINCT run_id FROM {table}").fetchall()
        assert ids == [(second.run_ids[0],)], table
    assert con.execute("SELECT count(*) FROM events").fetchall() == [(6,)]
    con.close()


# --- the vectorised decoder against protobuf's encoder ---------------------------------------

stat_values = st.one_of(
    st.builds(lambda v: ("int64_value", v), st.integers(-(2**63), 2**63 - 1)),
    st.builds(lambda v: ("uint64_value", v), st.integers(0, 2**64 - 1)),
    st.builds(lambda v: ("double_value", v), st.floats(allow_nan=False)),
    st.builds(lambda v: ("str_value", v), st.text(max_size=20)),
    st.builds(lambda v: ("ref_value", v), st.integers(0, 2**64 - 1)),
)
events = st.lists(
    st.tuples(
        st.integers(-(2**63), 2**63 - 1),
        st.integers(-(2**63), 2**63 - 1),
        st.integers(-(2**63), 2**63 - 1),
        st.lists(st.tuples(st.integers(0, 2**40), stat_values), max_size=4),
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=60, deadline=None)
@given(events)
def test_wire_decoder_matches_protobuf(evs: list) -> None:
    raw = []
    for md, off, dur, stats in evs:
        e = xplane_pb2.XEvent(metadata_id=md, offset_ps=off, duration_ps=dur)
        for mid, (kind, value) in stats:
            e.stats.add(metadata_id=mid, **{kind: value})
        raw.append(e.SerializeToString())
    lengths = np.array([len(r) for r in raw], dtype=np.int64)
    buf = np.frombuffer(b"".join(raw) or b"\0", dtype=np.uint8)
    ends = np.cumsum(lengths)
    fields = wire.decode_fields(buf, ends - lengths, ends)
    n = len(raw)
    assert wire.scalar(fields, n, 1)[0].view(np.int64).tolist() == [e[0] for e in evs]
    assert wire.scalar(fields, n, 2)[0].view(np.int64).tolist() == [e[1] for e in evs]
    assert wire.scalar(fields, n, 3)[0].view(np.int64).tolist() == [e[2] for e in evs]
    owner, start, length = fields.select(4, 2)
    assert np.bincount(owner, minlength=n).tolist() == [len(e[3]) for e in evs]
    if not len(owner):
        return
    sf = wire.decode_fields(buf, start.astype(np.int64), start.astype(np.int64) + length)
    m = len(owner)
    got_ids = wire.scalar(sf, m, 1)[0].tolist()
    order = np.lexsort((np.arange(m), owner))  # stats of one event in wire order
    want = [s for e in evs for s in e[3]]
    assert [got_ids[i] for i in order] == [mid for mid, _ in want]
    doubles = wire.scalar(sf, m, 2, wire=1)[0].view(np.float64)
    for i, (_, (kind, value)) in zip(order, want, strict=True):
        if kind == "double_value":
            assert doubles[i] == value or (math.isnan(value) and math.isnan(doubles[i]))


def test_wire_decoder_refuses_cut_fields() -> None:
    """A message cut inside a field (a varint or a length-delimited payload) is an error, never a
    silently shorter message."""
    e = xplane_pb2.XEvent(metadata_id=1, offset_ps=2**40, duration_ps=5)
    e.stats.add(metadata_id=3, str_value="hello")
    data = e.SerializeToString()
    # layout: 08 01 | 10 <6-byte varint> | 18 05 | 22 <len> <stat...>
    inside_offset = range(3, 9)  # cut inside the multi-byte offset varint
    inside_stats = range(12, len(data))  # cut inside the stats payload
    for cut in [*inside_offset, *inside_stats]:
        buf = np.frombuffer(data[:cut], dtype=np.uint8)
        with pytest.raises(wire.WireError):
            wire.decode_fields(buf, np.array([0]), np.array([cut]))
    bad_wire_type = np.frombuffer(bytes([0x0B, 0x01]), dtype=np.uint8)  # wire type 3 (group)
    with pytest.raises(wire.WireError):
        wire.decode_fields(bad_wire_type, np.array([0]), np.array([2]))
