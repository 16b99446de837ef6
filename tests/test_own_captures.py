"""Real JAX CPU captures ingest exactly: counts per (plane, line) match an independent reader, and the
Chrome-trace JSON JAX writes beside each XSpace ingests to the same events.

The captures: ``sample_traces/jax_cpu/`` (ours, written by ``sample_traces/capture_jax_cpu.py``) and,
when present, ``../shared/traces/jax_cpu/``. Expected counts come from xprof's ProfileData
(``expected_counts.json`` beside each set), never from our own reader.

How JAX's ``<host>.trace.json.gz`` relates to ``<host>.xplane.pb`` (XLA's
``ConvertXSpaceToTraceContainer`` + ``TraceContainerToJson``, checked on all six captures):

- planes: only ``/host:CPU`` (pid 701) and the device planes (the ``/device:GPU:*`` planes, else
  ``/device:TPU:*``, else ``/device:CUSTOM:*``; pid = 1 + plane id). ``/host:metadata`` and
  ``Task Environment`` (no lines on JAX CPU) are not exported; no line named "Async XLA Ops" is.
- lines -> threads: tid = (display_id or id) & 0xffffffff, thread_name = display name or name.
- events: every event becomes one ``ph: X`` event, in line order; none is dropped on these captures
  (the converter drops only "internal" host event types such as memory allocation, and caps at 5M).
  name = event metadata display name if set, else name (the long name goes to ``args.long_name``).
  ts = the XSpace time in microseconds (both are relative to the profile start), exact to the ps;
  dur = duration in microseconds, except that a zero duration is written as 1 ps (1e-06 us).
- stats -> args, all as strings; internal stats (``_r``, ``_p``, ``_pt``, ``_c``, ``_ct``,
  ``program_id``, ...) are dropped; ``step_num`` is kept.

So the strongest honest equality: per (plane, line) the multiset of (name, start relative to the
first exported event, max(duration, 1 ps)) is identical, and ``train`` step numbers agree.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import SAMPLE_TRACES, SHARED_TRACES
from tpuanalyze.store.database import connect

from tpuanalyze.pipeline import ingest_paths

OWN_ROOT = SAMPLE_TRACES / "jax_cpu"
SHARED_ROOT = SHARED_TRACES / "jax_cpu"
HOST_PLANE = "/host:CPU"
DEVICE_PREFIXES = ("/device:GPU:", "/device:TPU:", "/device:CUSTOM:")


def _own_files() -> list[Path]:
    return sorted(OWN_ROOT.rglob("*.xplane.pb"))


def _shared_files() -> list:
    files = sorted(SHARED_ROOT.rglob("*.xplane.pb")) if SHARED_ROOT.is_dir() else []
    reason = f"shared JAX CPU captures not present at {SHARED_ROOT} (they live beside the project)"
    return files or [pytest.param(None, marks=pytest.mark.skip(reason=reason))]


def _capture_id(path: Path | None) -> str:
    return "absent" if path is None else path.parents[3].name  # <capture>/plugins/profile/<run>/<host>


ALL_CAPTURES = [pytest.param(p, id=f"own-{_capture_id(p)}") for p in _own_files()] + [
    p if not isinstance(p, Path) else pytest.param(p, id=f"shared-{_capture_id(p)}") for p in _shared_files()
]


def _expected_counts(xplane: Path) -> dict:
    root = OWN_ROOT if xplane.is_relative_to(OWN_ROOT) else SHARED_TRACES
    table = json.loads((root / "expected_counts.json").read_text())
    key = str(xplane.relative_to(root))
    assert key in table, f"{key} missing from {root / 'expected_counts.json'}: regenerate it"
    return table[key]


@pytest.fixture(scope="module")
def ingested(tmp_path_factory):
    """Ingest a trace file once per module into its own database; returns (connection, run_id, summary)."""
    cache: dict[Path, tuple] = {}

    def get(path: Path):
        if path not in cache:
            db = tmp_path_factory.mktemp("own_captures") / "trace.duckdb"
            summary = ingest_paths([path], db)
            assert len(summary.run_ids) == 1
            cache[path] = (connect(db, read_only=True), summary.run_ids[0], summary)
        return cache[path]

    yield get
    for con, _, _ in cache.values():
        con.close()


def _db_structure(con, run_id: int) -> list[dict]:
    """Planes and lines in file order with event counts and duration sums (ns), from the database."""
    planes = con.execute(
        "SELECT plane_index, name FROM planes WHERE run_id = ? ORDER BY plane_index", [run_id]
    ).fetchall()
    lines = con.execute(
        "SELECT plane_index, line_index, name FROM lines WHERE run_id = ? ORDER BY plane_index, line_index",
        [run_id],
    ).fetchall()
    counts = {
        (p, li): (n, total)
        for p, li, n, total in con.execute(
            "SELECT plane_index, line_index, count(*), sum(duration_ps) FROM events WHERE run_id = ? "
            "GROUP BY plane_index, line_index",
            [run_id],
        ).fetchall()
    }
    out = []
    for plane_index, name in planes:
        plane_lines = []
        for p, li, line_name in lines:
            if p == plane_index:
                n, total = counts.get((p, li), (0, 0))
                plane_lines.append({"name": line_name, "events": n, "sum_duration_ns": (total or 0) / 1000})
        out.append({"name": name, "lines": plane_lines})
    return out


def test_own_captures_exist_and_are_small():
    files = sorted(p for p in OWN_ROOT.rglob("*") if p.is_file())
    xplanes = [p for p in files if p.name.endswith(".xplane.pb")]
    assert len(xplanes) >= 3, "run sample_traces/capture_jax_cpu.py"
    for xplane in xplanes:
        assert xplane.with_name(xplane.name.replace(".xplane.pb", ".trace.json.gz")).is_file()
    assert sum(p.stat().st_size for p in files) < 3_000_000
    table = json.loads((OWN_ROOT / "expected_counts.json").read_text())
    assert sorted(table) == sorted(str(p.relative_to(OWN_ROOT)) for p in xplanes)
    assert all("error" not in entry and entry["total_events"] > 0 for entry in table.values())


@pytest.mark.parametrize("xplane", ALL_CAPTURES)
def test_database_counts_match_xprof(xplane: Path, ingested):
    expected = _expected_counts(xplane)
    con, run_id, summary = ingested(xplane)
    observed = _db_structure(con, run_id)
    assert [p["name"] for p in observed] == [p["name"] for p in expected["planes"]]
    for got, want in zip(observed, expected["planes"], strict=True):
        assert [(ln["name"], ln["events"]) for ln in got["lines"]] == [
            (ln["name"], ln["events"]) for ln in want["lines"]
        ], got["name"]
        for got_line, want_line in zip(got["lines"], want["lines"], strict=True):
            want_ns = want_line["sum_duration_ns"]
            assert got_line["sum_duration_ns"] == pytest.approx(want_ns, rel=1e-12, abs=1e-3), got_line
    assert summary.events == expected["total_events"]
    assert con.execute("SELECT num_events FROM runs WHERE run_id = ?", [run_id]).fetchone()[0] == (
        expected["total_events"]
    )


def _exported_planes(con, run_id: int) -> list[str]:
    """The planes XLA's trace-JSON converter exports: the host threads plane and one device family."""
    names = [n for (n,) in con.execute(
        "SELECT name FROM planes WHERE run_id = ? ORDER BY plane_index", [run_id]).fetchall()]
    exported = [n for n in names if n == HOST_PLANE]
    for prefix in DEVICE_PREFIXES:
        devices = [n for n in names if n.startswith(prefix)]
        if devices:
            exported += devices
            break
    return exported


def _event_rows(con, run_id: int, planes: list[str], zero_as_one_ps: bool) -> dict:
    """(plane, line) -> sorted [(name, start relative to the first of these events, duration)]."""
    marks = ", ".join("?" * len(planes))
    duration = "greatest(duration_ps, 1)" if zero_as_one_ps else "duration_ps"
    rows = con.execute(
        f"""
        WITH chosen AS (
            SELECT plane, line, coalesce(display_name, name) AS label, start_ps, {duration} AS dur
            FROM events WHERE run_id = ? AND plane IN ({marks}) AND line <> 'Async XLA Ops')
        SELECT plane, line, label, start_ps - (SELECT min(start_ps) FROM chosen), dur
        FROM chosen ORDER BY ALL
        """,
        [run_id, *planes],
    ).fetchall()
    out: dict = {}
    for plane, line, label, start, dur in rows:
        out.setdefault((plane, line), []).append((label, start, dur))
    return out


def _json_twin(xplane: Path) -> Path:
    return xplane.with_name(xplane.name.replace(".xplane.pb", ".trace.json.gz"))


@pytest.mark.parametrize("xplane", ALL_CAPTURES)
def test_trace_json_ingests_to_the_same_events_as_the_xspace(xplane: Path, ingested):
    twin = _json_twin(xplane)
    if not twin.is_file():
        pytest.skip(f"no trace.json.gz beside {xplane}")
    x_con, x_run, _ = ingested(xplane)
    j_con, j_run, j_summary = ingested(twin)

    exported = _exported_planes(x_con, x_run)
    x_events = _event_rows(x_con, x_run, exported, zero_as_one_ps=True)
    j_planes = [n for (n,) in j_con.execute(
        "SELECT DISTINCT plane FROM events WHERE run_id = ? ORDER BY plane", [j_run]).fetchall()]
    assert j_planes == sorted({plane for plane, _ in x_events})
    j_events = _event_rows(j_con, j_run, j_planes, zero_as_one_ps=False)

    assert sorted(j_events) == sorted(x_events)  # the same threads (plane, line names)
    for key in x_events:
        assert len(j_events[key]) == len(x_events[key]), key
        assert j_events[key] == x_events[key], key  # names, start times and durations, to the ps
    assert j_summary.events == sum(len(v) for v in x_events.values())

    # Step annotations keep their step numbers in both formats.
    step_sql = ("SELECT start_ps - (SELECT min(start_ps) FROM events WHERE run_id = ?), step_num "
                "FROM events WHERE run_id = ? AND name = 'train' ORDER BY 1")
    x_steps = x_con.execute(step_sql, [x_run, x_run]).fetchall()
    assert x_steps and [s for _, s in x_steps] == list(range(len(x_steps)))
    assert j_con.execute(step_sql, [j_run, j_run]).fetchall() == x_steps
