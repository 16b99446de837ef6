"""Errors users see as one line (``tpuanalyze: <path>: <reason>``) with exit status 2, never a traceback."""

from __future__ import annotations


class TpuAnalyzeError(Exception):
    """Bad input or a bad request: the CLI prints it on one line and exits with status 2."""

    def __init__(self, reason: str, path: str | None = None) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}" if path else reason)


class TraceFormatError(TpuAnalyzeError):
    """A trace file that cannot be read (truncated, corrupt, empty, wrong format)."""
