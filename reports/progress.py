"""Progress feedback for long ingests and analyses: a rich bar on a terminal, silence when piped.

Long work (ingesting a 256-host run, analysing many runs) should show that it moves, but a piped
or redirected run (CI logs, `| less`, `> out.txt`) must stay clean. Everything here draws on
stderr, so stdout (tables, JSON) is never mixed with progress output.

Usage::

    with progress_bar(total=len(files), description="ingest", enabled=None) as bar:
        for f in files:
            ...
            bar.advance(1, note=f.name)

    with phase("analysing run 3"):
        ...
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from tpuanalyze.safe_text import safe


class ProgressSink(Protocol):
    """What a long-running loop reports to; the quiet and the rich variants both satisfy it."""

    def advance(self, steps: float = 1, note: str | None = None) -> None: ...

    def set_total(self, total: float | None) -> None: ...


def stderr_is_terminal() -> bool:
    """True when a person watches stderr (progress is worth drawing)."""
    stream = sys.stderr
    return bool(getattr(stream, "isatty", None) and stream.isatty())


def resolve_enabled(enabled: bool | None) -> bool:
    """``None`` means automatic: on for a terminal, off when piped or redirected."""
    return stderr_is_terminal() if enabled is None else bool(enabled)


class QuietProgress:
    """Counts silently; used when stderr is not a terminal."""

    def __init__(self, total: float | None = None) -> None:
        self.total = total
        self.completed = 0.0
        self.note: str | None = None

    def advance(self, steps: float = 1, note: str | None = None) -> None:
        self.completed += steps
        if note is not None:
            self.note = note

    def set_total(self, total: float | None) -> None:
        self.total = total


class RichProgress(QuietProgress):
    """A rich progress bar on stderr; the note shows the item being worked on."""

    def __init__(self, progress: Progress, task_id: int, total: float | None) -> None:
        super().__init__(total)
        self._progress = progress
        self._task_id = task_id

    def advance(self, steps: float = 1, note: str | None = None) -> None:
        super().advance(steps, note)
        fields = {"note": safe(note)} if note is not None else {}  # a run name: data, not markup
        self._progress.update(self._task_id, advance=steps, **fields)

    def set_total(self, total: float | None) -> None:
        super().set_total(total)
        self._progress.update(self._task_id, total=total)


def _stderr_console() -> Console:
    return Console(stderr=True)


@contextmanager
def progress_bar(
    total: float | None, description: str, enabled: bool | None = None
) -> Iterator[QuietProgress]:
    """A progress bar for a loop of known (or unknown, ``total=None``) length.

    ``enabled=None`` draws only when stderr is a terminal. The bar disappears when done
    (``transient``) so the final report is not pushed off screen by finished bars.
    """
    if not resolve_enabled(enabled):
        yield QuietProgress(total)
        return
    columns = [
        SpinnerColumn(),
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[note]}", style="dim"),
    ]
    with Progress(*columns, console=_stderr_console(), transient=True) as progress:
        task_id = progress.add_task(description, total=total, note="")
        yield RichProgress(progress, task_id, total)


@contextmanager
def phase(description: str, enabled: bool | None = None) -> Iterator[None]:
    """A spinner for one step of unknown length (e.g. "analysing run 2 of 5")."""
    if not resolve_enabled(enabled):
        yield
        return
    with _stderr_console().status(description):
        yield
