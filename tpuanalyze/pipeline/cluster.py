"""The per-host map on a running Dask distributed cluster (``--scheduler ADDRESS``).

``dask_executor(address)`` connects a ``distributed.Client`` and yields a
``concurrent.futures.Executor`` whose tasks run on the cluster's workers, so the orchestration
hands it the same per-host tasks it hands a local process pool. Scheduling, retries of lost
workers and data transfer are Dask's; this module only connects, checks that workers are
there, and turns every way a remote task can fail into the one-line ``TpuAnalyzeError`` the CLI
prints (exit 2): an error the task raised itself (a bad trace file) arrives as it was raised; a
worker that died or could not run the task is named with the reason.

Results come back as bytes, not as paths: a host's load (``tasks.load_host``) writes its Parquet
parts into a scratch folder on the worker, and what returns to this process is those files'
bytes, written here where the orchestration's staging folder expects them. So workers need no
filesystem shared with the client (a cluster reading a ``gs://`` logdir rarely has one), and
the data crosses the network once, as it must anyway to reach the one DuckDB writer. Parts are
zstd-compressed Parquet, a fraction of the trace file.

Dask is an optional dependency (``pip install 'tpuanalyze[cluster]'``); it is imported only here.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import os
import shutil
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpuanalyze.errors import TpuAnalyzeError
from tpuanalyze.pipeline.tasks import (
    HostInput,
    Loaded,
    LoadTask,
    Mapped,
    MapTask,
    Probe,
    forget_kept,
    load_host,
    map_hosts,
    probe_host,
)

if TYPE_CHECKING:
    from tpuanalyze.store.parts import HostParts

INSTALL_HINT = "pip install 'tpuanalyze[cluster]'"
# Seconds to reach the scheduler, then for a first worker to be connected to it (a cluster being
# started may still be adding its workers). The environment variables override them.
CONNECT_SECONDS = float(os.environ.get("TPUANALYZE_DASK_CONNECT_TIMEOUT", "10"))
WORKERS_SECONDS = float(os.environ.get("TPUANALYZE_DASK_WORKERS_TIMEOUT", "60"))


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _task_subject(args: tuple[Any, ...]) -> str | None:
    """The file a task works on, for its error: a string argument, or the ``path`` of an argument
    (``HostInput``) or of its ``input`` (``LoadTask``)."""
    for arg in args:
        for candidate in (arg, getattr(arg, "input", None)):
            path = candidate if isinstance(candidate, str) else getattr(candidate, "path", None)
            if isinstance(path, str):
                return path
    return None


@dataclasses.dataclass
class ShippedParts:
    """A load task's result as it travels back from a worker: the result, and its part files'
    bytes by the path each must have in the client's staging folder."""

    loaded: Loaded
    blobs: dict[str, bytes]


def _shipper(scratch: str, staging: str, blobs: dict[str, bytes]) -> Callable[[str], str]:
    """A function that takes a file a task wrote under ``scratch`` (on the worker) into ``blobs``, by
    the path it must have under ``staging`` (the client's), and returns that path."""

    def ship(path: str) -> str:
        target = str(Path(staging) / Path(path).relative_to(scratch))
        blobs[target] = Path(path).read_bytes()
        return target

    return ship


def _ship_parts(parts: list[HostParts] | None, ship: Callable[[str], str]) -> None:
    """Ship every part file of the hosts' parts, each host's files renamed to their client paths."""
    for host in parts or []:
        for table, paths in host.files.items():
            host.files[table] = [ship(path) for path in paths]


def load_host_shipped(task: LoadTask) -> ShippedParts:
    """``load_host`` on a worker, into a scratch folder of the worker's own; the parts come back as
    bytes (the scratch folder is removed)."""
    scratch = tempfile.mkdtemp(prefix="tpuanalyze-parts-")
    try:
        loaded = load_host(dataclasses.replace(task, staging=scratch, compact=True))
        blobs: dict[str, bytes] = {}
        _ship_parts(loaded.parts, _shipper(scratch, task.staging, blobs))
        return ShippedParts(loaded, blobs)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


@dataclasses.dataclass
class ShippedMap:
    """A map task's result as it travels back from a worker (``ShippedParts``' way): the result, and
    its files' bytes (its parts and its op rows' Parquet file) by their paths in the client's staging."""

    mapped: Mapped
    blobs: dict[str, bytes]


def map_hosts_shipped(task: MapTask) -> ShippedMap:
    """``map_hosts`` on a worker, into a scratch folder of the worker's own; its parts and op rows come
    back as bytes (the scratch folder is removed)."""
    scratch = tempfile.mkdtemp(prefix="tpuanalyze-map-")
    try:
        load = dataclasses.replace(task.load, staging=scratch, compact=True)
        mapped = map_hosts(dataclasses.replace(task, load=load))
        blobs: dict[str, bytes] = {}
        ship = _shipper(scratch, task.load.staging, blobs)
        _ship_parts(mapped.parts, ship)
        if mapped.result is not None and mapped.result.op_rows:
            mapped.result.op_rows = ship(mapped.result.op_rows)
        return ShippedMap(mapped, blobs)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _write_blobs(blobs: dict[str, bytes]) -> None:
    """Write shipped files where the client's staging folder expects them."""
    for target, data in blobs.items():
        path = Path(target)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        except OSError as exc:
            reason = f"cannot write a host's Parquet part: {exc.strerror or exc}"
            raise TpuAnalyzeError(reason, target) from None


def unpack_map(shipped: ShippedMap) -> Mapped:
    """Write a shipped map task's files where the client's staging folder expects them."""
    _write_blobs(shipped.blobs)
    return shipped.mapped


def unpack_parts(shipped: ShippedParts) -> Loaded:
    """Write a shipped host's parts where the client's staging folder expects them."""
    _write_blobs(shipped.blobs)
    return shipped.loaded


def probe_host_unkept(item: HostInput) -> Probe:
    """``probe_host`` without keeping the reader for a later load: on a long-lived Dask worker a
    kept reader would outlive the call (and could answer for a file changed since, same size)."""
    try:
        return probe_host(item)
    finally:
        forget_kept()


# Tasks that keep state or write files on the worker, and how they run on a cluster instead: the
# variant to run there, and what turns its result into the original task's (None: as it is).
SHIPPED = {load_host: (load_host_shipped, unpack_parts), probe_host: (probe_host_unkept, None),
           map_hosts: (map_hosts_shipped, unpack_map)}


class DaskExecutor(concurrent.futures.Executor):
    """A ``concurrent.futures.Executor`` over ``client.submit``: each task runs once on some worker
    (``pure=False``: the same path submitted twice is read twice), its result comes back to this
    process, and a failure arrives as a ``TpuAnalyzeError`` from ``Future.result()``. A task that
    writes files (``load_host``) or keeps state (``probe_host``) runs as its variant in ``SHIPPED``."""

    def __init__(self, client: Any, address: str) -> None:
        self._client = client
        self._address = address
        self._pending: set[Any] = set()
        self._lock = threading.Lock()
        self._shutdown = False

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future:
        if self._shutdown:
            raise RuntimeError("cannot submit after shutdown")
        result: concurrent.futures.Future = concurrent.futures.Future()
        fn, unpack = SHIPPED.get(fn, (fn, None))
        remote = self._client.submit(fn, *args, pure=False, **kwargs)
        with self._lock:
            self._pending.add(remote)
        subject = _task_subject(args)

        def settle(done: Any) -> None:
            with self._lock:
                self._pending.discard(done)
            if not result.set_running_or_notify_cancel():
                return
            try:
                value = done.result()
                result.set_result(unpack(value) if unpack is not None else value)
            except BaseException as exc:  # noqa: B036 - every failure reaches the caller as one line
                result.set_exception(self._translate(exc, subject))

        remote.add_done_callback(settle)
        return result

    def _translate(self, exc: BaseException, subject: str | None) -> BaseException:
        """The task's own error as raised; any other failure as one line naming the task's input."""
        if isinstance(exc, TpuAnalyzeError | KeyboardInterrupt):
            return exc
        name = type(exc).__name__
        if name == "KilledWorker":
            reason = "a Dask worker died while running this task (KilledWorker; see the worker's log)"
        elif name in ("CancelledError", "FutureCancelledError"):
            reason = f"the Dask task was cancelled (scheduler {self._address} lost or restarted?)"
        elif isinstance(exc, ImportError) or "deserializ" in str(exc):
            reason = (
                f"a Dask worker cannot load the task ({_first_line(exc)}): install the same tpuanalyze "
                "on the workers"
            )
        else:
            reason = f"failed on a Dask worker: {_first_line(exc)}"
        return TpuAnalyzeError(reason, subject or self._address)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._shutdown = True
        with self._lock:
            pending = list(self._pending)
        if cancel_futures and pending:
            self._client.cancel(pending)
        elif wait and pending:
            from distributed import wait as wait_for

            wait_for(pending)


@contextmanager
def _quiet_distributed() -> Iterator[None]:
    """distributed logs connection retries and worker losses to stderr; the CLI's message is the one
    line the user sees, so its client-side loggers are silenced meanwhile (workers log as usual)."""
    logger = logging.getLogger("distributed")
    level = logger.level
    logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        logger.setLevel(level)


@contextmanager
def dask_executor(address: str) -> Iterator[DaskExecutor]:
    """An Executor running tasks on the Dask cluster at ``address`` (``tcp://host:8786``, or a
    scheduler file ``*.json``), closed on exit. One-line errors: Dask not installed, scheduler
    unreachable, no workers."""
    try:
        from distributed import Client
    except ImportError:
        raise TpuAnalyzeError(f"--scheduler needs Dask distributed: {INSTALL_HINT}") from None
    with _quiet_distributed():
        try:
            with warnings.catch_warnings():  # version-mismatch warnings are pages long; a task that
                warnings.simplefilter("ignore")  # cannot load says what to install instead
                if address.endswith(".json") and os.path.isfile(address):
                    client = Client(scheduler_file=address, timeout=CONNECT_SECONDS, set_as_default=False)
                else:
                    client = Client(address, timeout=CONNECT_SECONDS, set_as_default=False)
        except Exception as exc:  # OSError (unreachable, timed out), ValueError (bad address)
            raise TpuAnalyzeError(f"cannot reach the Dask scheduler: {_first_line(exc)}", address) from None
        executor = DaskExecutor(client, address)
        try:
            try:
                client.wait_for_workers(1, timeout=WORKERS_SECONDS)
            except Exception:
                raise TpuAnalyzeError(
                    f"no Dask worker is connected to the scheduler (waited {WORKERS_SECONDS:g} s)", address
                ) from None
            yield executor
        finally:
            executor.shutdown(wait=False, cancel_futures=True)
            try:
                client.close(timeout=CONNECT_SECONDS)
            except Exception:  # a scheduler already gone: nothing left to close
                pass
