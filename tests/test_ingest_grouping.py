"""Small planes decoded and loaded together, the per-process decoder choice and the database template.

A pod host holds ~20 planes of ~2K events: the reader decodes consecutive small planes in one pass
(``parsers.xspace._PlaneGroup``) and the loader turns their batches into rows together
(``store.load._merged_tables``). Both must give exactly what plane-by-plane work gives: the same
batches, the same Parquet parts, the same error on a corrupt plane. A new database is a copy of a
template with the schema and the views: it must equal one created statement by statement.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import duckdb
import numpy as np
import pytest
from conftest import SAMPLE_TRACES, SHARED_TRACES
from tpuanalyze.parsers import staging, xspace
from tpuanalyze.parsers.xspace import XSpaceReader
from tpuanalyze.store import load
from tpuanalyze.store.parts import GroupParts

from tpuanalyze.errors import TraceFormatError
from tpuanalyze.pipeline import ingest_paths
from tpuanalyze.pipeline.ingest import _compiled_share
from tpuanalyze.pipeline.tasks import Probe
from tpuanalyze.proto import xplane_pb2

POD_HOST = next((SAMPLE_TRACES / "generated" / "resnet50_v3-32_baseline").rglob("*.xplane.pb"))


def _xspace_files() -> list[Path]:
    files = sorted(SAMPLE_TRACES.rglob("*.xplane.pb"))
    if SHARED_TRACES.is_dir():
        files += sorted(p for p in SHARED_TRACES.rglob("*.xplane.pb") if "corrupt" not in p.name)
    return files


def _batches(path: Path) -> list:
    """Every plane's rows and batches as plain lists (what the loader is handed)."""
    out: list = []
    for plane in XSpaceReader(path).planes():
        out.append((repr(plane.info), {k: v.tolist() for k, v in plane.lines.items()},
                    {k: v.tolist() for k, v in plane.metadata.items()}))
        for batch in plane.batches:
            out.append({k: v.tolist() for k, v in batch.columns().items()})
            if batch.stats is not None:
                out.append({k: v.tolist() for k, v in batch.stats.columns().items()})
    return out


def _plane_by_plane(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(xspace, "GROUP_EVENTS", -1)  # every plane a group of its own


@pytest.mark.parametrize("path", _xspace_files(), ids=lambda p: p.parent.name + "/" + p.name)
def test_grouped_planes_give_the_batches_of_plane_by_plane_decoding(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    grouped = _batches(path)
    _plane_by_plane(monkeypatch)
    assert grouped == _batches(path)


def test_a_pod_host_is_decoded_in_few_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    """The point of grouping: one decoder call for many planes (a generated host: 9 planes with
    events, each also with an 'XLA Modules' line whose ids its metadata needs)."""
    calls: list[int] = []
    decode = XSpaceReader._decode_chunk

    def counted(self, buf, starts, ends):  # type: ignore[no-untyped-def]
        calls.append(len(starts))
        return decode(self, buf, starts, ends)

    monkeypatch.setattr(XSpaceReader, "_decode_chunk", counted)
    reader = XSpaceReader(POD_HOST)
    planes = sum(1 for plane in reader.planes() for _ in plane.batches)
    grouped_calls = len(calls)
    calls.clear()
    _plane_by_plane(monkeypatch)
    for plane in XSpaceReader(POD_HOST).planes():
        list(plane.batches)
    assert planes > 4 and grouped_calls == 1 and len(calls) >= planes


def _corrupt_second_plane(tmp_path: Path) -> Path:
    """Three small planes; the second's only event has field 1 as wire type 3 (unsupported)."""
    space = xplane_pb2.XSpace()
    for index in range(3):
        plane = space.planes.add(id=index + 1, name=f"/device:TPU:{index}")
        plane.event_metadata[300].id, plane.event_metadata[300].name = 300, "op"
        line = plane.lines.add(id=1, name="XLA Ops", timestamp_ns=1)
        line.events.add(metadata_id=300, offset_ps=10 + index, duration_ps=5)
    data = space.SerializeToString()
    event = space.planes[1].lines[0].events[0].SerializeToString()
    position = data.index(space.planes[1].SerializeToString())
    at = data.index(event, position)
    path = tmp_path / "bad.xplane.pb"
    path.write_bytes(data[:at] + b"\x0b" + event[1:] + data[at + len(event):])
    return path


def test_a_corrupt_plane_in_a_group_fails_as_plane_by_plane(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The group falls back to plane by plane: the first plane's batch still comes, then the error."""
    path = _corrupt_second_plane(tmp_path)

    def read() -> tuple[list[int], str]:
        seen: list[int] = []
        with pytest.raises(TraceFormatError) as caught:
            for plane in XSpaceReader(path).planes():
                for batch in plane.batches:
                    seen.append(batch.num_rows)
        return seen, str(caught.value)

    grouped = read()
    _plane_by_plane(monkeypatch)
    assert grouped == read()
    assert grouped[0] == [1] and "unsupported wire type" in grouped[1]


def _parts(path: Path, staging: Path) -> dict[str, list]:
    reader = XSpaceReader(path)
    group = GroupParts(reader.host, reader.source_format, reader.t0_ns, staging, hive_events=False)
    group.add(reader)
    parts = group.finish()[0]
    con = duckdb.connect()
    try:
        return {
            table: con.execute(f"SELECT * FROM read_parquet({files!r})").fetchall()
            for table, files in parts.files.items()
        }
    finally:
        con.close()


PARTS_INPUTS = [POD_HOST, *sorted((SAMPLE_TRACES / "jax_cpu").rglob("*.xplane.pb"))[:2]]


@pytest.mark.parametrize("path", PARTS_INPUTS, ids=lambda p: p.parent.name)
def test_batches_loaded_together_give_the_rows_of_one_by_one(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    together = _parts(path, tmp_path / "together")
    monkeypatch.setattr(load, "CHUNK_EVENTS", 1)  # every batch turned into rows alone
    one_by_one = _parts(path, tmp_path / "alone")
    assert together == one_by_one
    assert len(together["event_rows"]) == XSpaceReader(path).num_events


def test_factorize_codes_rows_by_first_appearance() -> None:
    names, codes = load.factorize(np.array(["b", "a", "b", "c", "a"], dtype=object))
    assert names == ["b", "a", "c"] and codes.tolist() == [0, 1, 0, 2, 1]
    assert [names[c] for c in codes] == ["b", "a", "b", "c", "a"]


def test_stat_rows_carry_their_names_numbers_and_index_as_the_names_do() -> None:
    stats = [batch.stats for plane in XSpaceReader(POD_HOST).planes() for batch in plane.batches
             if batch.stats is not None and len(batch.stats)]
    assert stats and all(s.key_code is not None for s in stats)  # the reader numbers the names
    columns = load._concat([s.columns() for s in stats])
    names, index = load.stat_key_index(columns)
    by_name, by_name_index = load.factorize(columns["key"])
    assert [names[i] for i in index] == [by_name[i] for i in by_name_index] == columns["key"].tolist()
    # a batch without numbers among others (-1): the names are hashed
    first = stats[0]
    unnumbered = dataclasses.replace(first, key_code=None)
    mixed = load._concat([first.columns(), unnumbered.columns()])
    assert (mixed["key_code"] == -1).any() and staging.stat_key_names(mixed["key_code"]) is None
    names, index = load.stat_key_index(mixed)
    assert [names[i] for i in index] == mixed["key"].tolist()


@pytest.mark.parametrize("path", PARTS_INPUTS, ids=lambda p: p.parent.name)
def test_stat_name_numbers_run_out_and_the_rows_stay_the_same(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    numbered = _parts(path, tmp_path / "numbered")
    monkeypatch.setattr(staging, "MAX_STAT_KEYS", 0)  # the process has numbered all it may
    monkeypatch.setattr(staging, "STAT_KEY_NAMES", [])
    monkeypatch.setattr(staging, "_STAT_KEY_CODES", {})
    assert XSpaceReader(path) and staging.stat_key_codes(["step_num"]) is None
    assert _parts(path, tmp_path / "hashed") == numbered


def test_compiled_decoder_is_chosen_per_process_for_many_hosts() -> None:
    pod = [Probe(num_events=36_868) for _ in range(64)]
    assert _compiled_share(pod, workers=1)  # 2.4M events in 64 files for one process
    assert not _compiled_share(pod, workers=2)  # 1.2M each: loading numba would not pay
    assert not _compiled_share([Probe(num_events=2_500_000)], workers=1)  # one file: its own rule
    assert not _compiled_share(pod, workers=0)  # a caller's executor: unknown processes


def test_use_compiled_switches_a_reader_to_the_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("tpuanalyze.parsers.wire_jit", reason="numba not installed")
    reader = XSpaceReader(POD_HOST)
    assert reader._jit is None  # a small file alone: numpy
    numpy_batches = _batches(POD_HOST)
    reader.use_compiled()
    assert reader._jit is not None
    monkeypatch.setenv("TPUANALYZE_DECODER", "numpy")
    forced = XSpaceReader(POD_HOST)
    forced.use_compiled()
    assert forced._jit is None  # TPUANALYZE_DECODER=numpy wins
    assert numpy_batches  # (the two decoders' equality: tests/test_xspace_compiled.py)


def _catalog(db: Path) -> tuple[list, list]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        views = con.execute(
            "SELECT view_name, comment, sql FROM duckdb_views() WHERE NOT internal ORDER BY 1"
        ).fetchall()
        tables = con.execute("SELECT table_name, sql FROM duckdb_tables() ORDER BY 1").fetchall()
        return views, tables
    finally:
        con.close()


def test_a_new_database_from_the_template_equals_one_built_statement_by_statement(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sample = SAMPLE_TRACES / "jax_cpu" / "single_jit_train"
    monkeypatch.setenv("TPUANALYZE_CACHE_DIR", "")  # no template
    plain = ingest_paths([sample], tmp_path / "plain.duckdb", workers=1)
    monkeypatch.setenv("TPUANALYZE_CACHE_DIR", str(tmp_path / "cache"))
    first = ingest_paths([sample], tmp_path / "first.duckdb", workers=1)  # builds the template
    assert list((tmp_path / "cache").glob("empty-*.duckdb"))
    seeded = ingest_paths([sample], tmp_path / "seeded.duckdb", workers=1)  # copies it
    assert plain.views == first.views == seeded.views and plain.events == seeded.events > 0
    reference = _catalog(tmp_path / "plain.duckdb")
    assert _catalog(tmp_path / "first.duckdb") == reference
    assert _catalog(tmp_path / "seeded.duckdb") == reference
    con = duckdb.connect(str(tmp_path / "seeded.duckdb"), read_only=True)
    try:
        assert con.execute("SELECT count(*) FROM step_breakdown").fetchone()[0] > 0
    finally:
        con.close()


def test_an_unusable_cache_folder_means_no_template(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("TPUANALYZE_CACHE_DIR", str(blocker / "cache"))
    summary = ingest_paths([SAMPLE_TRACES / "jax_cpu" / "single_jit_train"], tmp_path / "x.duckdb", workers=1)
    assert summary.events > 0 and summary.views
    assert _catalog(tmp_path / "x.duckdb")[0]  # the views, created statement by statement
