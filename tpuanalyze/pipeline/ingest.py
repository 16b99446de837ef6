"""Ingest, end to end: discover -> map (per host, in an executor) -> store (one transaction) -> views.

The map has two rounds. ``probe_host`` validates every file and finds its time zero (the run's t0
is the earliest host's, and hosts more than ``MAX_SPAN_NS`` apart are refused), a task per host
file; ``load_host`` reads each file again, shifted to the run's t0, into Parquet parts in a
staging folder, a task per host or per several consecutive small hosts of a run
(``GROUP_EVENTS``). Only then is the database opened for writing: every host's parts go in with one
transaction, so a bad file or a dead worker leaves the database exactly as it was.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import BrokenExecutor, Executor, Future, wait
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb

from tpuanalyze.errors import TpuAnalyzeError, TraceFormatError
from tpuanalyze.parsers.discover import RunSource, discover_inputs
from tpuanalyze.parsers.remote import is_url
from tpuanalyze.parsers.staging import MAX_SPAN_NS
from tpuanalyze.parsers.xspace import COMPILED_SHARE_EVENTS, COMPILED_SHARE_FILES
from tpuanalyze.pipeline.executors import default_workers, make_executor
from tpuanalyze.pipeline.progress import IngestProgress
from tpuanalyze.pipeline.tasks import (
    HostInput,
    Loaded,
    LoadTask,
    Mapped,
    MapTask,
    Probe,
    forget_kept,
    load_direct,
    load_host,
    map_hosts,
    probe_host,
)
from tpuanalyze.pipeline.views import install_default_views, seed_new_database
from tpuanalyze.store.commit import RunToStore, check_layout, store_runs
from tpuanalyze.store.database import connect
from tpuanalyze.store.parts import HostParts, make_hive, remove_tree

if TYPE_CHECKING:
    from tpuanalyze.parsers.mlperf import MlperfTables

# Without an explicit worker count, inputs smaller than this are read in the calling process:
# starting a pool of fresh interpreters (~0.5 s each) costs more than it saves on small runs.
POOL_MIN_BYTES = 64 << 20


# The decoder of the direct load's files (unless TPUANALYZE_DECODER says otherwise, or the process reads
# enough hosts for the compiled kernels, ``_compiled_share``): numpy, whatever a file's size. The load
# inserts on one thread while a second decodes, so the inserts set the pace and the compiled kernels'
# faster decoding gains nothing, while loading numba costs ~0.5 s of start-up that holds the GIL and
# ~120 MB of RSS. Measured (2026-12-03, alternated, benchmarks/results/bench_ingest.md): generated TPU
# files of 6M and 12M events, and GPU-like files of 1M and 2M events of 4.3 stats each (106, 212 MB):
# the same or less time with numpy, 120-125 MB less peak RSS.
DIRECT_LOAD_DECODER = "numpy"


def direct_load() -> bool:
    """Whether a map in this process loads its hosts straight into the database (inside the commit's
    transaction) rather than through Parquet parts written and read back: 6M events 10.3 -> 6.3 CPU s
    (benchmarks/results/bench_ingest.md). ``TPUANALYZE_DIRECT_LOAD=0``: parts, as a pool's workers
    write them (the tests of that path run it in one process)."""
    return os.environ.get("TPUANALYZE_DIRECT_LOAD", "1").strip() not in ("0", "false", "no")


@dataclass
class IngestSummary:
    """What one ``ingest_paths`` call loaded."""

    runs: int = 0  # trace runs + MLPerf result folders
    hosts: int = 0
    planes: int = 0
    events: int = 0
    seconds: float = 0.0
    run_ids: list[int] = field(default_factory=list)
    names: list[str] = field(default_factory=list)  # display names of the trace runs, as run_ids
    replaced_run_ids: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    mlperf_runs: int = 0  # result folders (each one run, counted in ``runs`` too)
    mlperf_results: int = 0  # result files
    mlperf_intervals: int = 0  # init/run/block/eval/epoch intervals (not counted in ``events``)
    views: list[str] = field(default_factory=list)  # attribution views installed after the load
    run_notes: list[str] = field(default_factory=list)  # the runs' own notes, each naming its run
    workers: int = 1  # processes the map ran in (1: the calling process)
    parquet: str | None = None  # the Parquet dataset holding the events, if any
    # with ``analyze``: run id -> its batches' results (analyzer/batch_map.py), for the runs attributed
    # where they were read; the staging folder holding their op rows stays until ``close``
    mapped: dict[int, list] = field(default_factory=dict)
    staging: str | None = None

    def close(self) -> None:
        """Remove what an ``analyze`` ingest kept for the report (the batches' op rows)."""
        if self.staging is not None:
            remove_tree(self.staging)
            self.staging = None


def ingest_paths(
    paths: Sequence[str | Path],
    db_path: str | Path,
    progress: bool = False,
    workers: int | None = None,
    executor: Executor | None = None,
    parquet: str | Path | None = None,
    analyze: dict[str, Any] | None = None,
    store_op_events: bool = True,
) -> IngestSummary:
    """Ingest the runs the paths name into ``db_path``; re-ingesting a source path replaces its run.

    ``workers``: processes for the per-host map (default: the machine's cores, or the calling
    process alone for small inputs); ``executor``: run the map there instead (any
    ``concurrent.futures.Executor``, e.g. a Dask client's). ``parquet``: keep the event rows as a
    Parquet dataset in that folder (hive layout), read by the database through views.
    ``analyze``: the analyzer's thresholds: each load task also attributes its hosts where it read
    them (analyzer/batch_map.py); the results are ``summary.mapped`` (call ``summary.close()`` when
    the report is done). ``store_op_events`` False (with ``analyze``): the events of device op lines of
    the runs attributed in the map are not stored (a report's temporary database: the analysis has
    their op rows and partials from the map).
    """
    started = time.perf_counter()
    if not paths:
        raise TpuAnalyzeError("no paths given")
    inputs = discover_inputs(list(paths))
    sources = inputs.runs
    hosts = [[HostInput(host, str(path), s.source_format) for host, path in s.files] for s in sources]
    flat = [item for run_hosts in hosts for item in run_hosts]
    summary = IngestSummary()
    mlperf = None
    if inputs.mlperf_files:  # parsed whole before any write: a bad log leaves the database untouched
        from tpuanalyze.parsers.mlperf import load_mlperf

        mlperf = load_mlperf(inputs.mlperf_files)
    dataset = _dataset_of(db_path, parquet)
    own_executor = executor is None
    if executor is None:
        count = _worker_count(workers, flat)
        executor = make_executor(count)
        summary.workers = count
    else:
        summary.workers = 0  # unknown: the caller's executor
    staging = _staging_dir(db_path, dataset)
    direct = own_executor and summary.workers == 1 and dataset is None and direct_load() and analyze is None
    if direct:  # read as the direct load reads best (DIRECT_LOAD_DECODER)
        hosts = [[replace(item, decoder=DIRECT_LOAD_DECODER) for item in run_hosts] for run_hosts in hosts]
        flat = [item for run_hosts in hosts for item in run_hosts]
    keep_staging = False
    released = False
    try:
        with IngestProgress(progress) as bar:
            probes = _probe_all(executor, flat, bar)
            per_run = _split(probes, hosts)
            _check_host_offsets(sources, hosts, per_run)
            t0s = [_run_t0(run_probes) for run_probes in per_run]
            compiled = _compiled_share(probes, summary.workers)

            def load_parts() -> list[list[Loaded]]:
                return _load_all(executor, hosts, per_run, t0s, staging, dataset is not None, bar, compiled,
                                 summary.workers)

            mapped_results: list[list | None] = []
            if analyze is not None and dataset is None:
                loaded, mapped_results = _map_all(executor, sources, hosts, per_run, t0s, staging, bar,
                                                  compiled, summary.workers, analyze, store_op_events)
            else:
                loaded = None if direct else load_parts()
            runs = [
                RunToStore(
                    name=s.name,
                    source_path=s.source_path,
                    source_format=s.source_format,
                    t0_ns=t0,
                    files=[p.file for p in run_probes if p.file is not None],
                    parts=_host_parts(run_loaded or []),
                    notes=list(s.notes),
                    load=_direct_load(run_hosts, t0, compiled, bar) if direct else None,
                )
                for s, t0, run_probes, run_loaded, run_hosts in zip(
                    sources, t0s, per_run, loaded or [None] * len(sources), hosts, strict=True)
            ]
            worker_notes = [p.retried for run_loaded in loaded or [] for item in run_loaded
                            for p in item.parts or [] if p.retried]
            if own_executor and not direct:
                # the map is over: the pool's workers exit (freeing their memory, ~0.4 s at 512 hosts)
                # while the commit and the caller's analysis run, not before them
                executor.shutdown(wait=False)
                released = True
            if direct:
                bar.phase("loading", len(flat))
            _commit(db_path, runs, mlperf, parquet, dataset, summary, load_parts if direct else None)
            for run_id, results in zip(summary.run_ids, mapped_results, strict=False):
                if results is not None:
                    summary.mapped[run_id] = results
            keep_staging = bool(summary.mapped)
        summary.notes.extend(dict.fromkeys(worker_notes))
    except BaseException as exc:
        if own_executor and not isinstance(exc, Exception):  # Ctrl-C, SIGTERM: stop the workers now
            _stop_now(executor)
        raise
    finally:
        if own_executor and not released:
            executor.shutdown(wait=True, cancel_futures=True)
        forget_kept()
        if keep_staging:
            summary.staging = str(staging)
        else:
            remove_tree(staging)
    summary.runs = len(sources) + summary.mlperf_runs
    summary.hosts = len(flat)
    summary.notes = inputs.notes + summary.run_notes + summary.notes
    summary.parquet = str(dataset) if dataset is not None else None
    summary.seconds = time.perf_counter() - started
    return summary


def _worker_count(workers: int | None, flat: list[HostInput]) -> int:
    if workers is not None:
        if workers < 1:
            raise TpuAnalyzeError(f"--workers must be at least 1 (got {workers})")
        return min(workers, max(len(flat), 1))
    total = 0
    for item in flat:
        if is_url(item.path):  # size unknown without a request; several hosts download in parallel
            total += POOL_MIN_BYTES
            continue
        try:
            total += os.stat(item.path).st_size
        except OSError:
            pass
    if total < POOL_MIN_BYTES:
        return 1
    return min(default_workers(), max(len(flat), 1))


def _dataset_of(db_path: str | Path, parquet: str | Path | None) -> Path | None:
    """Where this ingest's event parts go: ``parquet``, or the dataset an existing database keeps
    its events in (re-ingests go there too), or None (the database file). A layout the database
    refuses (``store.commit.check_layout``) is refused here already, before the map's work.

    A glance without waiting: while another process writes the database the map goes ahead (as it
    would anyway before the write lock), and the commit adapts the parts should the layout differ."""
    explicit = Path(parquet).resolve() if parquet is not None else None
    path = Path(db_path)
    if not path.is_file():
        return explicit
    try:
        con = duckdb.connect(str(path), read_only=True)
    except duckdb.Error:  # held by a writer, or not a database: the write connection deals with it
        return explicit
    try:
        return check_layout(con, db_path, Path(parquet) if parquet is not None else None)
    except duckdb.Error:  # not a tpuanalyze database: the write connection says so
        return explicit
    finally:
        con.close()


def _staging_dir(db_path: str | Path, dataset: Path | None) -> Path:
    """Scratch folder for the workers' parts: inside the dataset (the event parts are moved, not
    copied, into it), else beside the database file (its disk has room for the database anyway)."""
    parent = dataset if dataset is not None else Path(db_path).resolve().parent
    if dataset is not None:
        try:
            dataset.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            reason = f"cannot create the Parquet folder: {exc.strerror or exc}"
            raise TpuAnalyzeError(reason, str(dataset)) from None
    if not parent.is_dir():
        parent = Path(tempfile.gettempdir())
    _remove_orphaned_staging(parent)
    staging = parent / f"{STAGING_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}"
    try:
        staging.mkdir()
    except OSError:
        staging = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{os.getpid()}-"))
    return staging


STAGING_PREFIX = ".tpuanalyze-staging-"  # then the owning process id, then a random suffix


def _remove_orphaned_staging(parent: Path) -> None:
    """Remove the staging folders that an ingest killed with -9 left in ``parent``: those whose
    owning process (the id in the name) no longer exists. A live owner's folder, or a name without
    an id, is left alone: it may be another ingest's, still running."""
    for folder in parent.glob(f"{STAGING_PREFIX}*"):
        pid_text = folder.name[len(STAGING_PREFIX):].split("-", 1)[0]
        if not pid_text.isdigit() or int(pid_text) == os.getpid():
            continue
        try:
            os.kill(int(pid_text), 0)
        except ProcessLookupError:  # the owner is gone: nobody writes there any more
            remove_tree(folder)
        except OSError:  # exists but not ours to signal: alive
            continue


def _map(executor: Executor, fn, tasks: list, items: list[HostInput], bar: IngestProgress, counted) -> list:
    """``fn`` over ``tasks`` in the executor (``items``: each task's first host, which a failure of
    the whole task names); results in task order, the bar advanced by the hosts of each task as it
    finishes (``counted(task, result)``: (file name, events) of each). The first failed host (in
    discovery order) raises, once every other task has stopped (none writes to the staging folder
    after we return). Submission stops at a failure already known (the inline executor runs each
    task as it is submitted)."""
    futures: list[Future] = []
    try:
        for task in tasks:
            future = executor.submit(fn, task)
            future.add_done_callback(lambda f, task=task: _advance(bar, f, lambda r: counted(task, r)))
            futures.append(future)
            if _failed_already(future):
                break
        results: list = []
        for i, future in enumerate(futures):
            try:
                result = future.result()
            except BrokenExecutor:
                raise TraceFormatError(
                    "a worker process died while reading this host (out of memory?)", items[i].path
                ) from None
            except Exception as exc:
                if not _engine_failure(exc):
                    raise  # a bug in a task: its traceback is the report
                raise TraceFormatError(
                    f"the worker reading this host failed ({type(exc).__name__}: {exc})", items[i].path
                ) from None
            if result.error is not None:
                raise TraceFormatError(result.error.reason, result.error.path)
            results.append(result)
        return results
    except Exception:
        for future in futures:
            future.cancel()
        wait(futures)  # the tasks still running finish (a bad host stops the call, not them mid-write)
        raise
    # Ctrl-C or SIGTERM (BaseException) propagates at once: ``ingest_paths`` ends its pool's workers
    # (cancelling their futures first would make the pool's own thread fail on them).


def _stop_now(executor: Executor) -> None:
    """Ctrl-C or SIGTERM: end our pool's worker processes at once (a host may take minutes); the
    staging folder they wrote to is removed after."""
    processes = getattr(executor, "_processes", None) or {}
    for process in list(processes.values()):
        try:
            process.terminate()
        except (OSError, AttributeError):
            pass
    for process in list(processes.values()):
        try:
            process.join(timeout=5)
        except (OSError, AttributeError, AssertionError):
            pass


def _engine_failure(exc: BaseException) -> bool:
    """An executor's own failure (a distributed engine's lost or killed worker), not a task's."""
    module = type(exc).__module__ or ""
    return module.split(".")[0] in ("distributed", "dask")


def _failed_already(future: Future) -> bool:
    if not future.done() or future.cancelled():
        return False
    return future.exception() is not None or future.result().error is not None


def _advance(bar: IngestProgress, future: Future, counted) -> None:
    if future.cancelled() or future.exception() is not None:
        return
    for name, events in counted(future.result()):
        bar.host_done(name, events)


def _probe_all(executor: Executor, flat: list[HostInput], bar: IngestProgress) -> list[Probe]:
    bar.phase("validating", len(flat))
    return _map(executor, probe_host, flat, flat, bar, _probe_counted)


def _split(results: list, hosts: list[list[HostInput]]) -> list[list]:
    out, start = [], 0
    for run_hosts in hosts:
        out.append(results[start : start + len(run_hosts)])
        start += len(run_hosts)
    return out


def _run_t0(probes: Iterable[Probe]) -> int | None:
    """The run's time zero: the earliest host's."""
    t0s = [p.t0_ns for p in probes if p.t0_ns is not None]
    return min(t0s) if t0s else None


def _check_host_offsets(
    sources: list[RunSource], hosts: list[list[HostInput]], probes: list[list[Probe]]
) -> None:
    """Refuse a run whose hosts start more than ``MAX_SPAN_NS`` apart (time policy, docs/input.md):
    the far host would shift the run's time zero and every other host's events."""
    for source, run_hosts, run_probes in zip(sources, hosts, probes, strict=True):
        pairs = zip(run_hosts, run_probes, strict=True)
        timed = sorted((p.t0_ns, h.path) for h, p in pairs if p.t0_ns is not None)
        if len(timed) < 2 or timed[-1][0] - timed[0][0] <= MAX_SPAN_NS:
            continue
        median = timed[len(timed) // 2][0]
        far = timed[0] if median - timed[0][0] > timed[-1][0] - median else timed[-1]
        days = abs(far[0] - median) / 86_400e9
        raise TraceFormatError(
            f"starts {days:,.1f} days away from the other hosts of run {source.name!r} "
            "(the hosts of a run must start within 7 days of each other)",
            far[1],
        )


def _compiled_share(probes: list[Probe], workers: int) -> bool:
    """Whether each worker process reads enough events (``COMPILED_SHARE_EVENTS``) in enough host
    files (``COMPILED_SHARE_FILES``) for the compiled decoder to pay back loading it: decided per
    process, not per file, for the many small hosts of a pod (64 hosts of 37K events are 2.4M
    events for one process). A few large files keep the reader's own choice by file size: loading
    numba adds ~120 MB of RSS, which a single file's memory budget has no room for. Unknown worker
    count (a caller's executor, ``workers`` 0): the reader's choice."""
    if workers < 1 or len(probes) < COMPILED_SHARE_FILES * workers:
        return False
    return sum(p.num_events for p in probes) / workers >= COMPILED_SHARE_EVENTS


# Events of the host files one load task reads together at most: a task's fixed costs (a Parquet
# statement per table, ~7 ms each however few its rows; mkdir; the commit's files) are paid once
# for several small hosts. Its rows are still written every ``store.load.FLUSH_EVENTS`` events,
# so memory stays that of one host. A task's share of the work is bounded too (``TASKS_PER_WORKER``
# tasks for each worker at least, while hosts allow), so the pool's processes stay evenly busy.
GROUP_EVENTS = 1 << 20
TASKS_PER_WORKER = 4


def _load_groups(run_probes: list[Probe], run_hosts: list[HostInput], cap: int) -> list[list[int]]:
    """Consecutive hosts of a run (indexes) for each load task: XSpace hosts together up to ``cap``
    events; a Chrome-trace JSON host (its reader holds every event) alone."""
    groups: list[list[int]] = []
    events = 0
    for index, (probe, item) in enumerate(zip(run_probes, run_hosts, strict=True)):
        together = item.source_format == "xspace" and run_hosts[index - 1].source_format == "xspace"
        if groups and together and events + probe.num_events <= cap:
            groups[-1].append(index)
            events += probe.num_events
        else:
            groups.append([index])
            events = probe.num_events
    return groups


# Events of the hosts one map task (a load that also attributes its batch, ``_map_all``) reads
# together at most: its worker holds the batch's rows and their attribution at once (~600 bytes an
# event at the peak: a 1M-event batch took a worker to 0.89 GB, 640K to ~0.7 GB), and each task
# pays ~0.25 CPU s of fixed statements, so a cluster's tasks take several small hosts too.
MAP_GROUP_EVENTS = 640_000
# A run with a host of more events than this is not attributed in the map: a worker would hold the
# whole host (0.89 GB at 1M events); it is loaded as parts, streamed, and analysed from its database.
MAP_MAX_HOST_EVENTS = 1 << 20


def _map_group_cap(probes: list[list[Probe]], workers: int) -> int:
    """``_group_cap`` for map tasks: ``MAP_GROUP_EVENTS``, less when the pool has few tasks per
    worker, and ``MAP_GROUP_EVENTS`` on a caller's executor (a cluster) too."""
    if workers < 1:
        return MAP_GROUP_EVENTS
    return min(MAP_GROUP_EVENTS, _group_cap(probes, workers) or MAP_GROUP_EVENTS)


def _group_cap(probes: list[list[Probe]], workers: int) -> int:
    """The events a load task may take: ``GROUP_EVENTS``, less when the pool has few tasks per
    worker; 0 (a task per host) on a caller's executor (a cluster: its size unknown here)."""
    if workers < 1:
        return 0
    if workers == 1:
        return GROUP_EVENTS
    total = sum(p.num_events for run_probes in probes for p in run_probes)
    return min(GROUP_EVENTS, total // (TASKS_PER_WORKER * workers))


def _load_all(
    executor: Executor,
    hosts: list[list[HostInput]],
    probes: list[list[Probe]],
    t0s: list[int | None],
    staging: Path,
    hive_events: bool,
    bar: IngestProgress,
    compiled: bool = False,
    workers: int = 0,
) -> list[list[Loaded]]:
    tasks: list[LoadTask] = []
    per_run: list[int] = []
    cap = _group_cap(probes, workers)
    for run_index, (run_hosts, run_probes, t0) in enumerate(zip(hosts, probes, t0s, strict=True)):
        run_staging = str(staging / f"run-{run_index}")
        groups = _load_groups(run_probes, run_hosts, cap)
        tasks.extend(
            LoadTask(tuple(run_hosts[i] for i in group), t0, run_staging, hive_events, compiled=compiled)
            for group in groups
        )
        per_run.append(len(groups))
    bar.phase("loading", sum(len(run_hosts) for run_hosts in hosts))
    results = _map(executor, load_host, tasks, [t.input for t in tasks], bar, _load_counted)
    out, start = [], 0
    for count in per_run:
        out.append(results[start : start + count])
        start += count
    return out


def _map_all(
    executor: Executor,
    sources: list[RunSource],
    hosts: list[list[HostInput]],
    probes: list[list[Probe]],
    t0s: list[int | None],
    staging: Path,
    bar: IngestProgress,
    compiled: bool,
    workers: int,
    config: dict[str, Any],
    store_op_events: bool = True,
) -> tuple[list[list[Mapped]], list[list | None]]:
    """Round 2 with the analysis: each load task also attributes its hosts (``map_hosts``). Then, per
    run, the batches' guesses of the run's flags and dominant program are checked (analyzer/
    batch_map.py): batches whose dominant program was not the run's are attributed again with the
    run's programs; a run whose batches' flags differ gets no results (the report attributes it from
    the database). Returns each run's tasks' results and each run's batch results (or None)."""
    tasks: list[MapTask] = []
    per_run: list[int] = []
    cap = _map_group_cap(probes, workers)
    for run_index, (source, run_hosts, run_probes, t0) in enumerate(
            zip(sources, hosts, probes, t0s, strict=True)):
        run_staging = str(staging / f"run-{run_index}")
        # a run is attributed in the map if its hosts are XSpace and none is larger than a worker holds
        # at once (a larger host is loaded as parts, streamed, and analysed from the database)
        mapped = source.source_format == "xspace" and max(
            (p.num_events for p in run_probes), default=0) <= MAP_MAX_HOST_EVENTS
        groups = _load_groups(run_probes, run_hosts, cap if mapped else _group_cap(probes, workers))
        for index, group in enumerate(groups):
            load = LoadTask(tuple(run_hosts[i] for i in group), t0, run_staging, False, compiled=compiled)
            tasks.append(MapTask(load, config, index, source.source_format,
                                 store_op_events=store_op_events or not mapped, analyze=mapped))
        per_run.append(len(groups))
    bar.phase("loading", sum(len(run_hosts) for run_hosts in hosts))
    done = _map(executor, map_hosts, tasks, [t.input for t in tasks], bar, _load_counted)
    loaded: list[list] = []
    results: list[list | None] = []
    start = 0
    for run_index, count in enumerate(per_run):
        run_done, run_tasks = done[start : start + count], tasks[start : start + count]
        start += count
        settled = _settle(executor, run_tasks, run_done)
        if settled is None and not all(t.store_op_events for t in run_tasks):
            # attributed from the database after all: it needs every event (loaded again, in full)
            remove_tree(staging / f"run-{run_index}")
            run_done = _load_all(executor, [hosts[run_index]], [probes[run_index]], [t0s[run_index]],
                                 staging / f"rerun-{run_index}", False, IngestProgress(False), compiled,
                                 workers)[0]
        loaded.append(run_done)
        results.append(settled)
    return loaded, results


def _settle(executor: Executor, tasks: list[MapTask], done: list[Mapped]) -> list | None:
    """The run's batch results once its batches agree with the run (``_map_all``), or None."""
    if not tasks or not tasks[0].analyze or not done:
        return None
    results = [m.result for m in done]
    flags = results[0].flags
    if flags is None or any(r.flags != flags for r in results):
        return None
    if flags["has_steps_line"] or flags["has_group_ids"]:  # the steps do not depend on the programs
        return results
    import pyarrow as pa

    from tpuanalyze.analyzer.batch_map import dominant_program

    programs = pa.concat_tables([r.relations["att_programs"] for r in results])
    con = duckdb.connect(":memory:")
    try:
        con.register("programs", programs)
        dominant = dominant_program(con, "programs")
    finally:
        con.close()
    redo = [i for i, r in enumerate(results) if r.dominant != dominant]
    if not redo:
        return results
    again = [dataclasses.replace(tasks[i], programs_run=programs) for i in redo]
    for i, mapped in zip(redo, _map(executor, map_hosts, again, [t.input for t in again],
                                    IngestProgress(False), _load_counted), strict=True):
        results[i] = mapped.result
    return results


def _probe_counted(item: HostInput, result: Probe) -> list[tuple[str, int]]:
    return [(Path(item.path).name, 0)]


def _load_counted(task: LoadTask | MapTask, result: Loaded | Mapped) -> list[tuple[str, int]]:
    """(file name, events) of each host of a load (or map) task, for the progress bar."""
    if result.parts is None:  # a failed host: the call stops
        return []
    return [(Path(item.path).name, host.events) for item, host in zip(task.inputs, result.parts, strict=True)]


def _host_parts(run_loaded: list[Loaded]) -> list[HostParts]:
    """A run's hosts' parts, in order, from its load tasks' results."""
    return [host for item in run_loaded for host in item.parts or []]


def _direct_load(run_hosts: list[HostInput], t0: int | None, compiled: bool, bar: IngestProgress):
    """The run's ``RunToStore.load``: its hosts read into the database inside the commit."""

    def load(con: duckdb.DuckDBPyConnection, run_id: int) -> list[HostParts]:
        return load_direct(con, run_id, run_hosts, t0, compiled, bar.host_done)

    return load


def _commit(
    db_path: str | Path,
    runs: list[RunToStore],
    mlperf: MlperfTables | None,
    parquet: str | Path | None,
    dataset: Path | None,
    summary: IngestSummary,
    load_parts: Callable[[], list[list[Loaded]]] | None = None,
) -> None:
    """One connection for the load and the views: the write lock is held from the first statement
    to the last, so no other process can slip in between (and make an ingest that committed fail
    on its views). A new database starts as a copy of the empty template (schema and views).
    ``load_parts``: the runs are loaded directly (``RunToStore.load``); should the database turn out
    to keep its events in a Parquet dataset, they are loaded as parts with it instead. A direct load
    that fails in a database this call created removes the file: it did not exist before."""
    created = seed_new_database(db_path)
    con = connect(db_path)
    remove = False
    try:
        layout = check_layout(con, db_path, Path(parquet) if parquet is not None else None)
        if layout is not None and load_parts is not None:
            for run, run_loaded in zip(runs, load_parts(), strict=True):
                run.load = None
                run.parts = _host_parts(run_loaded)
        if layout is not None and dataset is None:
            # the database turned out to keep its events in a dataset (it was busy at the glance):
            # the event parts become hive parts first
            for run in runs:
                make_hive(run.parts)
        elif layout != dataset:  # another process moved the events between the glance and now
            raise TpuAnalyzeError(
                "another process changed where the database keeps its events during this ingest; "
                "run it again",
                str(db_path),
            )
        direct = any(run.load is not None for run in runs)
        if direct:  # one DuckDB thread: the events' statement runs beside the loader and the decoding
            # thread (two made a 6M-event file slower, 2.1-2.2 s against 2.0-2.1, with 150 MB more RSS)
            con.execute("SET threads = 1")
        try:
            stored = store_runs(con, db_path, runs, mlperf, layout)
        except BaseException:
            remove = created and direct  # a new file: as before a failed ingest, no database at all
            raise
        finally:
            if direct:
                try:
                    con.execute("RESET threads")  # (after the commit or the rollback)
                except duckdb.Error:
                    pass
        summary.run_ids, summary.names = stored.run_ids, stored.names
        summary.replaced_run_ids, summary.run_notes = stored.replaced_run_ids, stored.run_notes
        summary.planes, summary.events = stored.planes, stored.events
        summary.mlperf_runs, summary.mlperf_results = stored.mlperf_runs, stored.mlperf_results
        summary.mlperf_intervals = stored.mlperf_intervals
        summary.notes.extend(stored.notes)
        summary.views, note = install_default_views(con)
        if note:
            summary.notes.append(note)
    finally:
        con.close()
        if remove:
            for leftover in (Path(db_path), Path(f"{db_path}.wal")):
                leftover.unlink(missing_ok=True)
