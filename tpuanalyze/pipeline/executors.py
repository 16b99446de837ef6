"""Where the per-host map runs: any ``concurrent.futures.Executor``.

By default a pool of worker processes (``--workers N``, the machine's cores); one worker means the
calling process itself, no pool. A distributed engine plugs in by passing its own executor (a
Dask ``Client.get_executor()``): tasks and their arguments and results are top-level, picklable
and name files by path strings.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import platform
import signal
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from typing import Any


def default_workers() -> int:
    """The machine's cores (what ``--workers`` defaults to)."""
    return os.cpu_count() or 1


class InlineExecutor(Executor):
    """Runs each task at submit, in the calling process (``--workers 1``): no pool to start, and
    a task's exception travels in its future exactly as from a pool."""

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future:
        future: Future = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # noqa: B036 (delivered through the future, as a pool does)
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            future.set_exception(exc)
        return future


def _worker_started() -> None:
    """A pool worker leaves Ctrl-C and SIGTERM to the main process, which cleans up and stops the
    pool (the CLI's handlers, inherited or not, must not raise inside a worker)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    global pool_worker
    pool_worker = True
    keep_freed_memory()


# glibc's mallopt parameters (malloc.h) and the values a pool worker sets
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
_WORKER_MALLOPT = (
    (_M_MMAP_THRESHOLD, 32 << 20),  # glibc's largest: arrays below it come from the heap, kept when freed
    (_M_TRIM_THRESHOLD, 1 << 30),  # the heap's top is not returned to the system after each task
    (_M_TOP_PAD, 64 << 20),  # and grows in large steps
)
memory_kept = False  # whether this process keeps freed memory (``keep_freed_memory``)
pool_worker = False  # whether this process is a worker of ``make_executor``'s pool


def keep_freed_memory() -> bool:
    """A pool worker keeps the memory its tasks free for the next task (glibc only; elsewhere a no-op
    returning False).

    Why: each map task allocates and frees ~250 MB of numpy arrays (640K events), and with glibc's
    defaults the freed memory goes back to the system (the heap's top trimmed, larger arrays unmapped),
    so the next task page-faults all of it in again. Measured at 512 hosts (benchmarks/results/pod.md):
    12-13% fewer page faults at the same peak RSS (a worker's peak is one task's); the system CPU
    saved (1-2 s of ~55 CPU s in one alternated test) was within this machine's noise in another.
    Not all of it: DuckDB (opening or closing a database, changing its threads or memory limit) and
    protobuf's upb (every 10,000 arena blocks freed) call ``malloc_trim(0)``, which returns free heap
    memory whatever these settings. So a pool worker keeps one DuckDB instance for its tasks
    (``tasks._map_database``), and a reader with the compiled kernels loaded leaves event bytes and
    repeated event metadata out of upb (parsers/xspace.py ``_Plane``)."""
    global memory_kept
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    memory_kept = all(mallopt(param, value) == 1 for param, value in _WORKER_MALLOPT)
    return memory_kept


def make_executor(workers: int) -> Executor:
    """An executor of ``workers`` processes (``spawn``: no fork of a process holding DuckDB's
    threads), or the inline executor for one."""
    if workers <= 1:
        return InlineExecutor()
    return ProcessPoolExecutor(
        max_workers=workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_worker_started,
    )
