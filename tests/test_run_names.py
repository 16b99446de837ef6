"""Run names people can read (`<logdir or parent>/<run>`, unique in a database), run ids that survive a
re-ingest, and references that still resolve by the bare run folder name."""

from __future__ import annotations

import shutil

import duckdb
from conftest import SAMPLE_TRACES, run_cli
from tpuanalyze.store.names import display_name_candidates

from tpuanalyze.pipeline import ingest_paths


def _names(db) -> dict[int, str]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return dict(con.execute("SELECT run_id, name FROM runs").fetchall())
    finally:
        con.close()


def test_two_jax_runs_with_the_same_timestamp_get_distinct_names(tmp_path) -> None:
    logdirs = sorted((SAMPLE_TRACES / "jax_cpu").iterdir())
    folders = {d.name: next((d / "plugins" / "profile").iterdir()) for d in logdirs if d.is_dir()}
    stamps = [f.name for f in folders.values()]
    assert len(set(stamps)) < len(stamps), "the bundled JAX runs no longer share a timestamp folder"
    summary = ingest_paths([SAMPLE_TRACES / "jax_cpu"], tmp_path / "db.duckdb")
    names = _names(tmp_path / "db.duckdb")
    assert sorted(names.values()) == sorted(f"{logdir}/{f.name}" for logdir, f in folders.items())
    assert summary.names == [names[i] for i in summary.run_ids]
    # notes name the run they are about
    assert summary.notes and all(n.split(": ", 1)[0] in names.values() for n in summary.notes)


def test_a_taken_name_grows_by_parent_folders(tmp_path) -> None:
    source = next((SAMPLE_TRACES / "jax_cpu" / "single_jit_train" / "plugins" / "profile").iterdir())
    for parent in ("a", "b"):
        target = tmp_path / parent / "logdir" / "plugins" / "profile" / "run1"
        target.mkdir(parents=True)
        shutil.copy(source / "vm.xplane.pb", target / "vm.xplane.pb")
    db = tmp_path / "db.duckdb"
    ingest_paths([tmp_path / "a"], db)
    ingest_paths([tmp_path / "b"], db)
    assert sorted(_names(db).values()) == ["b/logdir/run1", "logdir/run1"]
    assert display_name_candidates(str(tmp_path / "a/logdir/plugins/profile/run1"))[:2] == [
        "logdir/run1", "a/logdir/run1"]
    assert display_name_candidates("/x/real/tpu_v6e.xplane.pb")[0] == "real/tpu_v6e"


def test_reingest_keeps_run_id_and_name_so_saved_references_hold(tmp_path) -> None:
    db = tmp_path / "demo.duckdb"
    first = ingest_paths([SAMPLE_TRACES / "jax_cpu"], db)
    before = _names(db)
    middle = first.run_ids[1]
    again = ingest_paths([SAMPLE_TRACES / "jax_cpu" / before[middle].split("/")[0]], db)
    assert again.run_ids == [middle] and again.replaced_run_ids == [middle]
    assert _names(db) == before
    # DB:ID and DB:name name the same run; `report --run NAME` selects it
    full = run_cli("compare", f"{db}:{middle}", f"{db}:{before[middle]}", "--json", str(tmp_path / "c.json"))
    assert full.returncode == 0, full.stderr
    by_name = run_cli("report", str(db), "--run", before[middle], "--json", "-")
    assert by_name.returncode == 0, by_name.stderr
    import json

    assert [r["run_id"] for r in json.loads(by_name.stdout)["runs"]] == [middle]
