"""The numpy decoding of a plane's event metadata (parsers/xspace_metadata.py) gives exactly the
columns of the upb reading (``XSpaceReader._metadata``), or declines (None) and leaves the plane
to it: on every plane of the bundled samples and shared captures, and on planes built with the
edge cases (repeated names, refs, bytes, casts, modules and their program ids)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from tpuanalyze.parsers import xspace
from tpuanalyze.parsers.xspace_metadata import decode_metadata, key_order

from tpuanalyze.proto import xplane_pb2

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "traces"


def _same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def _both(blob: bytes, module_ids: set[int] | None = None) -> tuple[dict, dict | None]:
    """(upb columns, numpy columns or None) of one serialized XPlane."""
    plane = xspace._Plane(blob, "test", 0)
    message = plane.metadata_message()
    stat_names = {k: v.name for k, v in plane.message.stat_metadata.items()}
    modules = module_ids or set()
    reader = object.__new__(xspace.XSpaceReader)
    old = reader._metadata(message, stat_names, modules)
    starts, ends = plane.metadata_ranges
    new = decode_metadata(plane.buffer, starts, ends, key_order(message), stat_names, modules,
                          xspace._MODULE_PROGRAM_ID)
    return old, new


def _assert_equal(old: dict, new: dict) -> None:
    assert sorted(old) == sorted(new)
    for column in old:
        assert old[column].dtype == new[column].dtype, column
        a, b = old[column].tolist(), new[column].tolist()
        assert len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True)), (column, a, b)


def _planes(path: Path) -> list[bytes]:
    space = xplane_pb2.XSpace()
    space.ParseFromString(path.read_bytes())
    return [p.SerializeToString() for p in space.planes]


def _captures() -> list[Path]:
    files = sorted((ROOT / "sample_traces").rglob("*.xplane.pb"))
    if SHARED.is_dir():
        files += [p for p in sorted(SHARED.rglob("*.xplane.pb")) if "corrupt" not in p.name]
    return files


def test_every_plane_of_the_captures_decodes_as_upb_reads_it() -> None:
    decoded = 0
    for path in _captures():
        for blob in _planes(path):
            old, new = _both(blob)
            if new is not None:
                _assert_equal(old, new)
                decoded += len(new["metadata_id"])
    assert decoded > 1000  # the fast path is the one taken on TPU planes and the JAX captures


Entry = tuple[int, str, str, list[tuple[int, str, object]]]  # id, name, display name, stats


def _plane(entries: list[Entry], names: dict[int, str]) -> bytes:
    plane = xplane_pb2.XPlane(id=1, name="/device:TPU:0")
    for sid, name in names.items():
        plane.stat_metadata[sid].id = sid
        plane.stat_metadata[sid].name = name
    for md_id, name, display, stats in entries:
        md = plane.event_metadata[md_id]
        md.id, md.name, md.display_name = md_id, name, display
        for sid, field, value in stats:
            stat = md.stats.add(metadata_id=sid)
            setattr(stat, field, value)
    return plane.SerializeToString()


NAMES = {1: "hlo_category", 2: "program_id", 3: "flops", 4: "step_num", 5: "iter_num", 6: "tf_op",
         7: "symbol_id", 8: "hlo_module", 9: "shape_with_layout", 10: "", 11: "group_id"}
VALUES = st.one_of(
    st.tuples(st.just("int64_value"), st.integers(-(2**63), 2**63 - 1)),
    st.tuples(st.just("uint64_value"), st.integers(0, 2**64 - 1)),
    st.tuples(st.just("double_value"), st.floats(allow_nan=True, allow_infinity=True)),
    st.tuples(st.just("str_value"), st.text(max_size=6)),
    st.tuples(st.just("ref_value"), st.integers(0, 12)),
    st.tuples(st.just("bytes_value"), st.binary(max_size=3)),
)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 40),
            st.sampled_from(["fusion.1", "jit_step(7)", "jit_eval(8)", "", "é\"x"]),
            st.sampled_from(["", "op", "ü"]),
            st.lists(st.tuples(st.integers(1, 13), VALUES), max_size=5),
        ),
        min_size=1,
        max_size=12,
        unique_by=lambda e: e[0],
    ),
    st.sets(st.integers(0, 40), max_size=4),
)
def test_built_planes_decode_as_upb_reads_them_or_are_left_to_it(entries, module_ids) -> None:
    blob = _plane(
        [(md, name, display, [(sid, field, value) for sid, (field, value) in stats])
         for md, name, display, stats in entries],
        NAMES,
    )
    old, new = _both(blob, module_ids)
    if new is not None:
        _assert_equal(old, new)


def test_the_common_shape_is_decoded_with_modules_and_program_ids() -> None:
    """A TPU plane's ops and modules: the fast path answers (not None), modules name their ops."""
    entries = [
        (1, "jit_step(7)", "", []),
        (2, "fusion.1", "fusion", [(1, "str_value", "convolution"), (2, "uint64_value", 7),
                                   (3, "int64_value", 1000), (7, "uint64_value", 3),
                                   (6, "str_value", "a/b")]),
        (3, "copy.2", "", [(2, "int64_value", 8), (3, "double_value", float("nan")),
                           (4, "uint64_value", 2**63)]),
    ]
    old, new = _both(_plane(entries, NAMES), {1})
    assert new is not None
    _assert_equal(old, new)
    by_id = dict(zip(new["metadata_id"].tolist(), new["hlo_module"].tolist(), strict=True))
    assert by_id == {1: "jit_step(7)", 2: "jit_step(7)", 3: None}
    stats = dict(zip(new["metadata_id"].tolist(), new["stats"].tolist(), strict=True))
    assert stats[2] == '{"symbol_id": 3}' and stats[3] == '{"step_num": 9223372036854775808}'


def test_repeated_stat_names_and_bytes_are_left_to_upb() -> None:
    twice = [(1, "op", "", [(1, "str_value", "a"), (1, "str_value", "b")])]
    assert _both(_plane(twice, NAMES))[1] is None
    raw = [(1, "op", "", [(7, "bytes_value", b"\x00\x01")])]
    assert _both(_plane(raw, NAMES))[1] is None


def test_no_entries_is_left_to_the_empty_table() -> None:
    plane = xplane_pb2.XPlane(id=1, name="/host:CPU").SerializeToString()
    old, new = _both(plane)
    assert new is None and len(old["metadata_id"]) == 0 and old["metadata_id"].dtype == np.int64
