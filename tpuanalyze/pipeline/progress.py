"""Progress of an ingest on stderr: hosts done of total, events per second and the time left.

Drawn only when asked (the verbs ask when stderr is a terminal), so piped output stays clean.
"""

from __future__ import annotations

import time

from tpuanalyze.safe_text import safe


class IngestProgress:
    """A rich bar per phase (``validating``, ``loading``); every call is a no-op when disabled."""

    def __init__(self, enabled: bool) -> None:
        self.bar = None
        self._task: int | None = None
        self._events = 0
        self._started = 0.0
        if enabled:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self.bar = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("hosts"),
                TextColumn("{task.fields[rate]}"),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=Console(stderr=True),  # stdout carries the result line
                transient=True,
            )

    def __enter__(self) -> IngestProgress:
        if self.bar:
            self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar:
            self.bar.stop()

    def phase(self, description: str, hosts: int) -> None:
        """Start a new bar of ``hosts`` steps (the previous one is finished)."""
        self._events, self._started = 0, time.perf_counter()
        if self.bar:
            self._task = self.bar.add_task(description, total=hosts, rate="")

    def host_done(self, name: str, events: int = 0) -> None:
        """One more host finished, with the events it loaded (0 while validating)."""
        self._events += events
        if self.bar and self._task is not None:
            elapsed = max(time.perf_counter() - self._started, 1e-9)
            rate = f"{self._events / elapsed:,.0f} events/s" if self._events else ""
            self.bar.update(self._task, advance=1, rate=rate, description=safe(name))
