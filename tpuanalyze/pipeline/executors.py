"""Where the per-host map runs: any ``concurrent.futures.Executor``.

By default a pool of worker processes (``--workers N``, the machine's cores); one worker means the
calling process itself, no pool. A distributed engine plugs in by passing its own executor (a
Dask ``Client.get_executor()``): tasks and their arguments and results are top-level, picklable
and name files by path strings.
"""

from __future__ import annotations

import multiprocessing
import os
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
