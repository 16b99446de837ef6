"""The narrow op rows over the run's op kinds (analyzer/op_kinds.py) are stage att_ops exactly: the view
over them has the stage's rows, columns and types on every bundled and shared capture, through the fast
path (base tables) and through the stage's own SQL narrowed afterwards; events whose own typed stats
override their metadata's are kinds of their own; and a pod attributed batch of hosts by batch gets
the whole-run op_steps relation from its narrow scratch rows."""

from __future__ import annotations

from pathlib import Path
from string import Template

import duckdb
import pytest
from conftest import CaptureSet
from test_attribution_xspace import XSpaceBuilder, design_example_step, hlo_op
from test_per_host import ONE_HOST, four_host_pod
from tpuanalyze.analyzer import per_host
from tpuanalyze.analyzer.api import load_thresholds
from tpuanalyze.analyzer.attribution import _substitutions, load_stages, materialize_run, run_flags
from tpuanalyze.analyzer.op_kinds import KIND_COLUMNS, OpKinds, fast_path
from tpuanalyze.analyzer.resources import scratch_database

from tpuanalyze.pipeline import ingest_paths


def _differences(con: duckdb.DuckDBPyConnection, a: str, b: str) -> int:
    """Rows of a not in b plus rows of b not in a (bag semantics: duplicates count)."""
    return int(con.execute(f"SELECT (SELECT count(*) FROM (FROM {a} EXCEPT ALL FROM {b})) + "
                           f"(SELECT count(*) FROM (FROM {b} EXCEPT ALL FROM {a}))").fetchall()[0][0])


def _types(con: duckdb.DuckDBPyConnection, relation: str) -> list[tuple[str, str]]:
    return con.execute(f"SELECT column_name, column_type FROM (DESCRIBE {relation})").fetchall()


def _narrow_equals_stage(db: Path, run_ids: list[int]) -> dict[str, int]:
    """For each run: the whole-run stage att_ops, then the narrow view built by each path from the same
    run flags; returns how many runs each path was checked on (and how many op rows)."""
    config = load_thresholds(None)
    stages = dict(load_stages())
    checked = {"fast": 0, "stage": 0, "rows": 0}
    con = duckdb.connect(str(db), read_only=True)
    try:
        for run_id in run_ids:
            rel = materialize_run(con, run_id, config)
            flags = run_flags(con, rel["att_runs"])
            subs = _substitutions(config, f"run_id = {int(run_id)}", {"att_runs": rel["att_runs"]},
                                  flags=flags)
            stage_sql = Template(stages["att_ops"]).safe_substitute(subs)
            paths = {"fast": flags, "stage": None} if fast_path(flags) else {"stage": flags}
            for path, path_flags in paths.items():
                kinds = OpKinds(con, f"k_{path}")
                _, view, _ = kinds.narrow(subs, stage_sql, path_flags, f"n_{path}_")
                assert _types(con, view) == _types(con, rel["att_ops"]), (run_id, path)
                assert _differences(con, view, rel["att_ops"]) == 0, (run_id, path)
                n_kinds, distinct = con.execute(
                    f"SELECT count(*), count(DISTINCT kind_id) FROM {kinds.table}").fetchall()[0]
                assert n_kinds == distinct
                checked[path] += 1
            checked["rows"] += int(con.execute(f"SELECT count(*) FROM {rel['att_ops']}").fetchall()[0][0])
    finally:
        con.close()
    return checked


def _run_ids(captures: CaptureSet) -> list[int]:
    return sorted({captures.run_id(p) for p in captures.paths})


def test_narrow_att_ops_equal_the_stage_on_bundled_captures(sample_captures: CaptureSet) -> None:
    checked = _narrow_equals_stage(sample_captures.db, _run_ids(sample_captures))
    assert checked["fast"] >= 1 and checked["rows"] > 1000, checked


def test_narrow_att_ops_equal_the_stage_on_shared_captures(shared_captures: CaptureSet) -> None:
    checked = _narrow_equals_stage(shared_captures.db, _run_ids(shared_captures))
    assert checked["fast"] >= 1 and checked["stage"] > checked["fast"], checked


def test_an_events_own_stats_make_a_kind_of_its_own(tmp_path: Path) -> None:
    """Ops of one event metadata, some with their own hlo_category / tf_op stats (the event's value wins
    over its metadata's, as in the events view): those ops get their own kinds and classes."""
    run_dir = tmp_path / "logs" / "plugins" / "profile" / "r1"
    space = XSpaceBuilder()
    core = space.tpu_core(0)
    for step in range(3):
        design_example_step(core, 12.0 * step, step)
        o = 12.0 * step + 10
        # same metadata as design_example_step's fusion.2; the event says it is an all-reduce / optimizer
        core.event("XLA Ops", "%fusion.2 = f32[1024] fusion(...)", o, o + 0.5, display_name="fusion.2",
                   event_stats={"hlo_category": "all-reduce"} if step else {"tf_op": "train/Adam/update"},
                   hlo_category="loop fusion", program_id=1, shape_with_layout="f32[1024]", flops=2e8,
                   bytes_accessed=4e6)
        hlo_op(core, "copy-start.1", o + 0.5, o + 0.7, "copy-start")
    space.write(run_dir / "host0.xplane.pb")
    db = tmp_path / "own.duckdb"
    ingest_paths([run_dir], db)
    checked = _narrow_equals_stage(db, [1])
    assert checked["fast"] == 1
    con = duckdb.connect(str(db), read_only=True)
    try:
        rel = materialize_run(con, 1, load_thresholds(None))
        classes = con.execute(f"SELECT DISTINCT category, collective_kind FROM {rel['att_ops']} "
                              "WHERE short_name = 'fusion.2'").fetchall()
    finally:
        con.close()
    assert set(classes) == {("compute", None), ("collectives", "all-reduce"), ("weight_update", None)}


def test_per_host_op_steps_equal_the_whole_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A generated 4-host pod attributed one host per batch: the op_steps view over the narrow scratch rows
    and the run's kinds has the whole-run op_steps' rows and types, as has the att_ops relation."""
    db = four_host_pod(tmp_path, seed=2)
    config = load_thresholds(None)
    con = duckdb.connect(str(db), read_only=True)
    try:
        whole = materialize_run(con, 1, config, prefix="w_")
        batches = per_host.host_batches(con, 1, ONE_HOST)
        assert len(batches) >= 4
        with scratch_database(con):
            rel = per_host.materialize_per_host(con, 1, config, batches, prefix="b_")
            assert _types(con, rel["op_steps"]) == _types(con, whole["op_steps"])
            assert _differences(con, rel["op_steps"], whole["op_steps"]) == 0
            n = con.execute(f"SELECT count(*) FROM {rel['op_steps']}").fetchall()[0][0]
            assert n == con.execute(f"SELECT count(*) FROM {whole['att_ops']}").fetchall()[0][0] > 1000
            # one kind per distinct combination over the run: the hosts' batches share them
            kinds = con.execute(f"SELECT count(*) FROM {rel['op_kinds']}").fetchall()[0][0]
            distinct = con.execute(f"SELECT count(*) FROM (SELECT DISTINCT {', '.join(KIND_COLUMNS)} "
                                   f"FROM {whole['att_ops']})").fetchall()[0][0]
            assert kinds == distinct < n / 50
    finally:
        con.close()


@pytest.mark.parametrize("capture", ["host_only_xla_cpu", "kineto_nccl"])
def test_runs_off_the_fast_path_attributed_by_batch_equal_the_whole_run(
        capture: str, shared_traces: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs whose ops the stage's own SQL finds (host-only XLA CPU ops; Kineto GPU kernels), as 2-host
    runs attributed one host per batch: their kinds narrowed batch by batch give the whole run's tables
    and JSON."""
    import shutil

    from test_per_host import WHOLE_RUN, _analyse, _same

    run_dir = tmp_path / "logs" / "plugins" / "profile" / "r1"
    run_dir.mkdir(parents=True)
    if capture == "host_only_xla_cpu":  # two JAX CPU captures (other programs: kinds of their own)
        for host, name in (("hostA", "pmap8_train_eval"), ("hostB", "pmap8_input_bound")):
            shutil.copy(next((shared_traces / "jax_cpu" / name).rglob("*.xplane.pb")),
                        run_dir / f"{host}.xplane.pb")
    else:  # the two NCCL ranks of one job
        for rank in (0, 1):
            shutil.copy(shared_traces / "chrome_json" / f"kineto_nccl_rank{rank}.json.gz",
                        run_dir / f"rank{rank}.trace.json.gz")
    db = tmp_path / "two.duckdb"
    ingest_paths([tmp_path / "logs"], db)
    con = duckdb.connect(str(db), read_only=True)
    try:
        att_runs = Template(dict(load_stages())["att_runs"]).safe_substitute(
            _substitutions(load_thresholds(None), "run_id = 1", {}))
        flags = run_flags(con, f"({att_runs})")
        assert len(per_host.host_batches(con, 1, ONE_HOST)) == 2
    finally:
        con.close()
    assert not fast_path(flags)
    whole = _analyse(db, WHOLE_RUN, monkeypatch)
    batched = _analyse(db, ONE_HOST, monkeypatch)
    assert whole[0].summary["steps"] > 0 and not whole[0].ops.empty
    _same(whole, batched)
