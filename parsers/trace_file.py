"""Reading a trace file's bytes with the one-line errors every reader gives for the same failures."""

from __future__ import annotations

from pathlib import Path

from tpuanalyze.errors import TraceFormatError


def read_trace_file(path: Path, kind: str) -> bytes:
    """The file's bytes, or a ``TraceFormatError`` naming it: missing, a directory, unreadable, empty.

    ``kind`` says what the file should have been (e.g. "an XSpace file") in the directory message."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise TraceFormatError("no such file", str(path)) from None
    except IsADirectoryError:
        raise TraceFormatError(f"is a directory, not {kind}", str(path)) from None
    except OSError as exc:
        raise TraceFormatError(f"cannot read: {exc.strerror or exc}", str(path)) from None
    if not data:
        raise TraceFormatError("empty file", str(path))
    return data
