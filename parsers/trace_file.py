"""Opening or reading a trace file with the one-line errors every reader gives for the same failures."""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

from tpuanalyze.errors import TraceFormatError


def open_trace_file(path: Path, kind: str) -> tuple[BinaryIO, int]:
    """The open file and its size, or a ``TraceFormatError`` naming it: missing, a directory,
    unreadable, empty.

    ``kind`` says what the file should have been (e.g. "an XSpace file") in the directory message.
    Readers that stream (XSpace) read parts of it; the caller closes it."""
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        raise TraceFormatError("no such file", str(path)) from None
    except IsADirectoryError:
        raise TraceFormatError(f"is a directory, not {kind}", str(path)) from None
    except OSError as exc:
        raise TraceFormatError(f"cannot read: {exc.strerror or exc}", str(path)) from None
    size = os.fstat(handle.fileno()).st_size
    if not size:
        handle.close()
        raise TraceFormatError("empty file", str(path))
    return handle, size


def read_trace_file(path: Path, kind: str) -> bytes:
    """The whole file's bytes, with the errors of ``open_trace_file``."""
    handle, _ = open_trace_file(path, kind)
    with handle:
        try:
            data = handle.read()
        except OSError as exc:
            raise TraceFormatError(f"cannot read: {exc.strerror or exc}", str(path)) from None
    if not data:
        raise TraceFormatError("empty file", str(path))
    return data
