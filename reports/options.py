"""Options shared by the verbs that open a database."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Executor
from contextlib import contextmanager
from typing import Any

import click


def _set_wait(ctx: click.Context, param: click.Parameter, value: float | None) -> None:
    if value is not None:
        from tpuanalyze.store.database import set_wait_seconds

        set_wait_seconds(value)


def wait_option(command: Any) -> Any:
    """``--wait SECONDS``: how long to wait for another process holding the database (an ingest
    writing it; readers while ingesting), docs/concurrency.md."""
    return click.option(
        "--wait",
        type=click.FloatRange(min=0),
        default=None,
        expose_value=False,
        callback=_set_wait,
        metavar="SECONDS",
        help="Wait up to SECONDS for another process using the database (default 600, or TPUANALYZE_WAIT).",
    )(command)


def workers_option(command: Any) -> Any:
    """``--workers N``: processes for the per-host map (docs/pipeline.md)."""
    return click.option(
        "--workers",
        type=click.IntRange(min=1),
        default=None,
        metavar="N",
        help="Worker processes reading the host files in parallel (default: the machine's cores; "
        "small inputs are read in this process). 1: no worker processes.",
    )(command)


def scheduler_option(command: Any) -> Any:
    """``--scheduler ADDRESS``: run the per-host map on a Dask distributed cluster (docs/cluster.md)."""
    return click.option(
        "--scheduler",
        metavar="ADDRESS",
        default=None,
        help="Run the per-host map on the Dask cluster at ADDRESS (tcp://host:8786, or a scheduler "
        "file); inputs must be readable by its workers: shared paths or URLs (docs/cluster.md).",
    )(command)


@contextmanager
def map_executor(scheduler: str | None, workers: int | None = None) -> Iterator[Executor | None]:
    """The executor for the per-host map: the Dask cluster's with ``--scheduler``, else None (the
    orchestration's own local workers)."""
    if scheduler is None:
        yield None
        return
    if workers is not None:
        from tpuanalyze.errors import TpuAnalyzeError

        raise TpuAnalyzeError("--workers sets the local worker processes; with --scheduler the "
                              "cluster's workers read the hosts (give one or the other)")
    from tpuanalyze.pipeline.cluster import dask_executor

    with dask_executor(scheduler) as executor:
        yield executor
