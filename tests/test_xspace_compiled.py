"""The compiled XSpace decoder (parsers.wire_jit) against the numpy decoder and the protobuf classes.

Both decoders must hand the loader the same batches (a file's events, lines, metadata and event
stats, field for field) on every bundled sample and shared capture; on arbitrary bytes the
kernels must refuse what the numpy decoder refuses (never read outside the buffer) and otherwise
decode the same values. Small files must not pay for numba (it is not even imported).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import SAMPLE_TRACES, SHARED_TRACES
from hypothesis import given, settings
from hypothesis import strategies as st
from tpuanalyze.parsers import wire
from tpuanalyze.parsers.xspace import XSpaceReader, compiled_decoder

from tpuanalyze.errors import TraceFormatError
from tpuanalyze.proto import xplane_pb2

jit = pytest.importorskip("tpuanalyze.parsers.wire_jit", reason="numba not installed")


def _canonical(path: Path, compiled: bool) -> list:
    """Everything the reader hands the loader, as plain lists; an event's stats in its trace order
    (the loader only relies on that order, not on how stats of different events interleave)."""
    reader = XSpaceReader(path)
    reader._jit = compiled_decoder() if compiled else None
    out: list = []
    for plane in reader.planes():
        lines = {k: v.tolist() for k, v in plane.lines.items()}
        metadata = {k: v.tolist() for k, v in plane.metadata.items()}
        out.append((repr(plane.info), lines, metadata))
        for batch in plane.batches:
            rows = {k: v.tolist() for k, v in batch.columns().items()}
            if batch.stats is not None:
                stats = batch.stats.columns()
                order = np.argsort(stats["owner"], kind="stable")
                rows["stats"] = {k: v[order].tolist() for k, v in stats.items() if k != "seq"}
            out.append(rows)
    return out


def _xspace_files() -> list[Path]:
    roots = [SAMPLE_TRACES, SHARED_TRACES]
    files = sorted(p for root in roots if root.is_dir() for p in root.rglob("*.xplane.pb"))
    return [p for p in files if "corrupt" not in p.name]


@pytest.mark.parametrize("path", _xspace_files(), ids=lambda p: p.parent.name + "/" + p.name)
def test_compiled_decoder_gives_the_same_batches(path: Path) -> None:
    assert _canonical(path, compiled=True) == _canonical(path, compiled=False)


def test_the_comparison_sees_a_difference(tmp_path: Path) -> None:
    """The check above can fail: two files differing in one event's stat compare unequal."""
    files = []
    for value in (1, 2):
        space = xplane_pb2.XSpace()
        plane = space.planes.add(id=1, name="/device:TPU:0")
        plane.stat_metadata[1].id, plane.stat_metadata[1].name = 1, "k"
        plane.event_metadata[1].id, plane.event_metadata[1].name = 1, "op"
        event = plane.lines.add(id=1, name="XLA Ops", timestamp_ns=1).events.add(metadata_id=1, duration_ps=5)
        event.stats.add(metadata_id=1, int64_value=value)
        path = tmp_path / f"h{value}.xplane.pb"
        path.write_bytes(space.SerializeToString())
        files.append(path)
    assert _canonical(files[0], compiled=True) != _canonical(files[1], compiled=True)
    assert _canonical(files[0], compiled=True) == _canonical(files[0], compiled=False)


def _numpy_events(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[list, ...]:
    fields = wire.decode_fields(buf, starts, ends)
    n = len(starts)
    occ, has = wire.scalar(fields, n, 5)
    owner, start, length = fields.select(4, 2)
    order = np.argsort(owner, kind="stable")
    columns = [wire.scalar(fields, n, f)[0].view(np.int64) for f in (1, 2, 3)] + [occ.view(np.int64), has]
    return (
        *(c.tolist() for c in columns),
        owner[order].tolist(),
        start.astype(np.int64)[order].tolist(),
        (start.astype(np.int64) + length)[order].tolist(),
    )


def _split(data: bytes, cuts: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    bounds = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    buf = np.frombuffer(data, dtype=np.uint8)
    return buf, np.array(bounds[:-1], dtype=np.int64), np.array(bounds[1:], dtype=np.int64)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=80), st.lists(st.integers(0, 200), max_size=4))
def test_kernels_agree_with_numpy_on_arbitrary_bytes(data: bytes, cuts: list[int]) -> None:
    """Random bytes as messages: both decoders refuse, or both decode the same values."""
    buf, starts, ends = _split(data, cuts)
    try:
        want = _numpy_events(buf, starts, ends)
    except wire.WireError:
        with pytest.raises(wire.WireError):
            jit.events(buf, starts, ends)
    else:
        got = jit.events(buf, starts, ends)
        assert [g.tolist() for g in got] == list(want)
    try:
        want_stats = _numpy_stats(buf, starts, ends)
    except wire.WireError:
        with pytest.raises(wire.WireError):
            jit.stats(buf, starts, ends)
    else:
        got_stats = jit.stats(buf, starts, ends)
        assert [np.asarray(g).view(np.uint8).tolist() for g in got_stats] == [
            np.asarray(w).view(np.uint8).tolist() for w in want_stats
        ]


def _numpy_stats(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple:
    from tpuanalyze.parsers.xspace import _stat_values

    return _stat_values(buf, starts, ends - starts)


def _xevent_bytes(**fields: int) -> bytes:
    event = xplane_pb2.XEvent(**fields)
    event.stats.add(metadata_id=3, str_value="hello")
    event.stats.add(metadata_id=4, double_value=1.5)
    return event.SerializeToString()


def test_kernels_refuse_every_cut_message() -> None:
    """A message cut anywhere inside a field is an error (never a shorter message read), and the
    kernels read only inside the buffer: each cut is decoded from a buffer ending at the cut."""
    data = _xevent_bytes(metadata_id=1, offset_ps=2**40, duration_ps=5)
    for cut in range(1, len(data)):
        buf = np.frombuffer(data[:cut], dtype=np.uint8)
        starts, ends = np.zeros(1, np.int64), np.full(1, cut, np.int64)
        try:
            wire.decode_fields(buf, starts, ends)
        except wire.WireError:
            with pytest.raises(wire.WireError):
                jit.events(buf, starts, ends)
        else:  # a cut between two fields is a well-formed shorter message
            jit.events(buf, starts, ends)
    buf = np.frombuffer(data, dtype=np.uint8)
    with pytest.raises(wire.WireError, match="past the buffer"):  # an end beyond the buffer
        jit.events(buf, np.zeros(1, np.int64), np.full(1, len(data) + 1, np.int64))
    for bad in (b"\x0b\x01", b"\x00\x01", b"\x08" + b"\xff" * 10 + b"\x01", b"\x22\x05\x01"):
        buf = np.frombuffer(bad, dtype=np.uint8)
        with pytest.raises(wire.WireError):
            jit.events(buf, np.zeros(1, np.int64), np.full(1, len(bad), np.int64))


def test_line_walk_refuses_an_event_past_the_line() -> None:
    line = xplane_pb2.XLine(id=1, name="XLA Ops", timestamp_ns=1)
    for i in range(3):
        line.events.add(metadata_id=1, offset_ps=i * 10, duration_ps=5)
    data = line.SerializeToString()
    starts, ends = np.empty(8, np.int64), np.empty(8, np.int64)
    buf = np.frombuffer(data, dtype=np.uint8)
    n, pos, err = jit.line_events(buf, 0, len(data), 8, starts, ends)
    assert (n, pos, err) == (3, len(data), jit.OK)
    cut = data.rindex(b"\x22")  # the last event's length, one more than the bytes left
    bad = data[: cut + 1] + bytes([data[cut + 1] + 1]) + data[cut + 2 :]
    n, pos, err = jit.line_events(np.frombuffer(bad, dtype=np.uint8), 0, len(bad), 8, starts, ends)
    assert err == jit.LINE_ERROR


def test_corrupt_event_bytes_are_a_one_line_error_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Event payloads are not checked by upb (the skeleton keeps them as bytes): the kernels do."""
    space = xplane_pb2.XSpace()
    plane = space.planes.add(id=1, name="/device:TPU:0")
    plane.event_metadata[300].id, plane.event_metadata[300].name = 300, "op"
    line = plane.lines.add(id=1, name="XLA Ops", timestamp_ns=1)
    line.events.add(metadata_id=300, offset_ps=10, duration_ps=5)
    data = space.SerializeToString()
    event = line.events[0].SerializeToString()
    assert data.count(event) == 1 and event.startswith(b"\x08\xac\x02")
    path = tmp_path / "bad.xplane.pb"
    path.write_bytes(data.replace(event, b"\x0b" + event[1:]))  # field 1 as wire type 3
    monkeypatch.setenv("TPUANALYZE_DECODER", "compiled")
    reader = XSpaceReader(path)
    assert reader._jit is not None
    with pytest.raises(TraceFormatError, match="unsupported wire type") as caught:
        for p in reader.planes():
            list(p.batches)
    assert str(path.resolve()) in str(caught.value) and "\n" not in str(caught.value)


def test_small_files_do_not_import_numba() -> None:
    """Below COMPILED_MIN_EVENTS the numpy decoder reads the file: numba is never imported."""
    sample = next(p for p in _xspace_files() if "jax_cpu" in str(p))
    code = (
        "import sys\n"
        "from tpuanalyze.parsers.xspace import XSpaceReader\n"
        f"r = XSpaceReader({str(sample)!r})\n"
        "n = sum(b.num_rows for p in r.planes() for b in p.batches)\n"
        "assert n > 0\n"
        "print('numba' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("how, numba_loaded", [("reader", True), ("ingest", False)])
def test_a_direct_load_reads_large_files_with_numpy(tmp_path: Path, how: str, numba_loaded: bool) -> None:
    """A file past COMPILED_MIN_EVENTS (lowered to 1 here) gets the compiled kernels when read alone,
    but not when one process ingests it straight into the database (pipeline/ingest.py
    DIRECT_LOAD_DECODER): its inserts set the pace, and numba would cost start-up and ~120 MB."""
    sample = next(p for p in _xspace_files() if "jax_cpu" in str(p))
    read = ("from tpuanalyze.parsers.xspace import XSpaceReader\n"
            f"r = XSpaceReader({str(sample)!r})\n"
            "assert sum(b.num_rows for p in r.planes() for b in p.batches) > 0\n")
    ingest = ("from tpuanalyze.pipeline import ingest_paths\n"
              f"s = ingest_paths([{str(sample)!r}], {str(tmp_path / 'db.duckdb')!r}, workers=1)\n"
              "assert s.events > 0\n")
    code = ("import sys\n"
            "from tpuanalyze.parsers import xspace\n"
            "xspace.COMPILED_MIN_EVENTS = 1\n"
            + (read if how == "reader" else ingest)
            + "print('numba' in sys.modules)\n")
    env = {k: v for k, v in os.environ.items() if k != "TPUANALYZE_DECODER"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == str(numba_loaded)


def test_a_large_file_of_few_events_does_not_load_numba() -> None:
    """The warm-up starts once validation has counted COMPILED_MIN_EVENTS events, not by the file's
    size: a file of heavy events below the count (set here just under its bytes / 20, the size rule
    that started it before) never imports numba."""
    sample = next(p for p in _xspace_files() if "jax_cpu" in str(p))
    threshold = sample.stat().st_size // 20 - 1
    code = ("import sys\n"
            "from tpuanalyze.parsers import xspace\n"
            f"xspace.COMPILED_MIN_EVENTS = {threshold}\n"
            f"r = xspace.XSpaceReader({str(sample)!r})\n"
            f"assert 0 < r.num_events < {threshold}, r.num_events\n"
            "assert sum(b.num_rows for p in r.planes() for b in p.batches) == r.num_events\n"
            "print('numba' in sys.modules)\n")
    env = {k: v for k, v in os.environ.items() if k != "TPUANALYZE_DECODER"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_forked_worker_gets_the_compiled_decoder() -> None:
    """A worker forked while the kernels load in the background (the warm-up a large file starts)
    gets the compiled decoder too: the fork waits for the warm-up, never deadlocks on its locks."""
    code = (
        "import multiprocessing as mp, os\n"
        "os.environ['TPUANALYZE_DECODER'] = 'compiled'\n"
        "from tpuanalyze.parsers import xspace\n"
        "xspace._Warmup.start()\n"
        "def child(q):\n"
        "    q.put(xspace.compiled_decoder() is not None)\n"
        "ctx = mp.get_context('fork')\n"
        "q = ctx.Queue()\n"
        "p = ctx.Process(target=child, args=(q,))\n"
        "p.start()\n"
        "print(q.get(timeout=120))\n"
        "p.join()\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "True"


def _plane_blobs(path: Path) -> list[bytes]:
    """Every plane's bytes of an XSpace file (as the reader reads them)."""
    from tpuanalyze.parsers import xspace
    from tpuanalyze.parsers.trace_file import open_trace_file

    handle, size = open_trace_file(path, "an XSpace file")
    with handle:
        ranges, _ = xspace._split_planes(handle, size, str(path))
        return [xspace._read_range(handle, start, length, str(path)) for start, length in ranges]


def _splits_agree(blob: bytes) -> None:
    """The compiled plane split is the Python one's (or None, leaving it the words) on ``blob``."""
    from tpuanalyze.parsers.xspace import _split_lines, _split_lines_compiled

    try:
        expected: tuple | Exception = _split_lines(blob, "f.xplane.pb", "plane #0")
    except TraceFormatError as exc:
        expected = exc
    try:
        found = _split_lines_compiled(jit, np.frombuffer(blob, np.uint8), "f.xplane.pb", "plane #0")
    except TraceFormatError as exc:  # only the line-count refusal, worded as the Python walk's
        assert isinstance(expected, TraceFormatError) and str(exc) == str(expected)
        return
    if found is None:
        assert isinstance(expected, TraceFormatError)
        return
    assert not isinstance(expected, Exception), expected
    ranges, rest, md_starts, md_ends, md_fields = found
    assert (ranges, rest, md_starts.tolist(), md_ends.tolist(), md_fields.tolist()) == expected
    assert all(type(v) is int for pair in ranges + rest for v in pair)  # plain ints, as the walk's


def test_compiled_plane_split_is_the_python_walks_on_every_capture() -> None:
    planes = [blob for path in _xspace_files() for blob in _plane_blobs(path)]
    assert len(planes) > 100
    for blob in planes:
        _splits_agree(blob)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=120), st.integers(0, 119), st.integers(0, 255))
def test_compiled_plane_split_agrees_on_arbitrary_and_damaged_bytes(data: bytes, at: int, byte: int) -> None:
    _splits_agree(data)
    plane = xplane_pb2.XPlane(id=1, name="/device:TPU:0")
    plane.lines.add(id=1, name="XLA Ops").events.add(metadata_id=1, offset_ps=5, duration_ps=7)
    plane.event_metadata[1].name = "fusion.1"
    plane.lines.add(id=2, name="Steps")
    blob = bytearray(plane.SerializeToString())
    blob[at % len(blob)] = byte  # one byte damaged: most are still a plane the walk must split alike
    _splits_agree(bytes(blob))


def test_a_reader_uses_the_compiled_split_once_the_kernels_are_loaded(monkeypatch) -> None:
    from tpuanalyze.parsers import xspace

    def python_walk(*_: object) -> None:
        raise AssertionError("the Python walk ran")

    compiled_decoder()  # loaded in this process
    monkeypatch.setattr(xspace, "_split_lines", python_walk)
    assert XSpaceReader(_xspace_files()[0]).num_events > 0


def _opened(path: Path) -> tuple:
    """What opening ``path`` finds (its lines' rows, events, time zero) and everything it then streams."""
    reader = XSpaceReader(path)
    streamed = _canonical(path, compiled=True)
    return reader._line_rows, reader.num_events, reader.t0_ns, reader.hostnames, streamed


@pytest.mark.parametrize("path", _xspace_files(), ids=lambda p: p.parent.name + "/" + p.name)
def test_a_reader_opened_with_the_kernels_loaded_reads_what_upb_reads(path: Path, monkeypatch) -> None:
    """With the kernels loaded, a line's fields are walked by the kernel and only the few that are not
    events parsed by upb, and the planes' event_metadata entries are parsed once per distinct bytes:
    the same lines, counts and streamed planes as upb's parse of everything."""
    from tpuanalyze.parsers import xspace

    compiled_decoder()
    xspace._validated_regions.clear()
    walked = _opened(path)
    monkeypatch.setattr(xspace._Warmup, "ready", classmethod(lambda cls: None))
    xspace._validated_regions.clear()
    assert walked == _opened(path)


def test_opening_a_pod_host_leaves_event_bytes_and_repeated_metadata_out_of_upb(monkeypatch) -> None:
    """upb copies what it parses into arenas whose freed blocks it counts toward a ``malloc_trim(0)``
    (executors.keep_freed_memory): with the kernels loaded, opening a host parses no event bytes with
    upb, and the event_metadata entries its planes share once."""
    from tpuanalyze.parsers import xspace

    parsed: list[tuple[str, object]] = []
    parse = xspace._parse_part

    def recorded(kind: str, data: bytes, path: str, where: str) -> object:
        message = parse(kind, data, path, where)
        parsed.append((kind, message))
        return message

    path = next((SAMPLE_TRACES / "generated" / "resnet50_v3-32_baseline").rglob("*.xplane.pb"))
    compiled_decoder()
    xspace._validated_regions.clear()
    monkeypatch.setattr(xspace, "_parse_part", recorded)
    reader = XSpaceReader(path)
    lines = [m for kind, m in parsed if kind == "XLine"]
    assert len(lines) == sum(len(rows) for rows in reader._line_rows) > 0
    assert all(len(m.events) == 0 for m in lines)  # type: ignore[attr-defined]
    regions = [s.metadata_region for s in reader._splits if len(s.metadata_ends)]
    assert len(regions) > 1 and None not in regions
    with_entries = [m for kind, m in parsed if kind == "XPlane" and len(m.event_metadata)]  # type: ignore[attr-defined]
    planes_bytes = [p for p in _plane_blobs(path)]
    distinct = {planes_bytes[i][a:b] for i, (a, b) in enumerate(s.metadata_region for s in reader._splits)
                if a < b}
    assert len(with_entries) == len(distinct) < len(regions)


def test_corrupt_event_metadata_is_still_refused_when_the_file_is_opened(tmp_path: Path) -> None:
    """The event_metadata entries left out of the planes' messages are still checked by upb on opening."""
    from tpuanalyze.parsers import xspace

    space = xplane_pb2.XSpace()
    for ordinal in range(2):
        plane = space.planes.add(id=ordinal, name=f"/device:TPU:{ordinal}")
        plane.lines.add(id=1, name="XLA Ops", timestamp_ns=1).events.add(metadata_id=1, duration_ps=7)
        plane.event_metadata[1].name = "fusion.1"
    good = space.SerializeToString()
    bad = good.replace(b"fusion.1", b"fusion\xff1")  # a string field that is not UTF-8
    assert bad != good
    path = tmp_path / "host.xplane.pb"
    path.write_bytes(bad)
    compiled_decoder()
    xspace._validated_regions.clear()
    with pytest.raises(TraceFormatError, match="corrupt or truncated XSpace protobuf"):
        XSpaceReader(path)


def _lines_read(blob: bytes, kernels: object) -> list | str:
    """A plane's lines as ``_Plane.lines`` reads them (each header's fields and its event count), or the
    refusal's words."""
    from tpuanalyze.parsers import xspace

    try:
        plane = xspace._Plane(blob, "f.xplane.pb", 0)
        return [(line.SerializeToString(deterministic=True) if kernels else
                 _without_events(line), count) for line, count in plane.lines(kernels)]
    except TraceFormatError as exc:
        return str(exc)


def _without_events(line: object) -> bytes:
    line.ClearField("events")  # type: ignore[attr-defined]
    return line.SerializeToString(deterministic=True)  # type: ignore[attr-defined]


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 400), st.integers(0, 255))
def test_the_compiled_line_walk_reads_what_upb_reads_on_damaged_planes(at: int, byte: int) -> None:
    """``_Plane.lines`` with the kernels (events counted by ``wire_jit.line_headers``, only the other
    fields parsed by upb) gives upb's lines and counts, or the same refusal, on a plane with one byte
    changed anywhere."""
    plane = xplane_pb2.XPlane(id=1, name="/device:TPU:0")
    ops = plane.lines.add(id=1, display_id=3, name="XLA Ops", display_name="ops", timestamp_ns=11,
                          duration_ps=900)
    for i in range(4):
        event = ops.events.add(metadata_id=i + 1, offset_ps=5 * i, duration_ps=7)
        event.stats.add(metadata_id=1, int64_value=i)
    steps = plane.lines.add(id=2, name="Steps", timestamp_ns=10)
    steps.events.add(metadata_id=9, offset_ps=1, duration_ps=99)
    plane.lines.add(id=3, name="empty")
    blob = bytearray(plane.SerializeToString())
    blob[at % len(blob)] = byte
    assert _lines_read(bytes(blob), compiled_decoder()) == _lines_read(bytes(blob), None)
