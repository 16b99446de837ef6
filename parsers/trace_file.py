"""Opening or reading a trace file with the one-line errors every reader gives for the same failures."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

from tpuanalyze.errors import TraceFormatError


def open_trace_file(path: Path, kind: str) -> tuple[BinaryIO, int]:
    """The open file and its size, or a ``TraceFormatError`` naming it: missing, a directory,
    unreadable, empty.

    ``kind`` says what the file should have been (e.g. "an XSpace file") in the directory message.
    Readers that stream (XSpace) read parts of it; the caller closes it."""
    try:
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
            # a FIFO would block the open forever, a device could be endless
            raise TraceFormatError(f"not a regular file ({file_kind(mode)}), not {kind}", str(path))
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


def check_utf8_name(path: Path) -> None:
    """Refuse a path whose name is not valid UTF-8 (the database stores names as UTF-8 text; Python
    carries such bytes as lone surrogates, which no writer accepts). The error shows the bytes."""
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        shown = os.fsencode(path).decode("utf-8", "backslashreplace")
        raise TraceFormatError("file name is not valid UTF-8 (rename it)", shown) from None


def file_kind(mode: int) -> str:
    """What a non-regular file is, in words."""
    kinds = (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISDIR, "a directory"),
    )
    for test, name in kinds:
        if test(mode):
            return name
    return "not a regular file"


def is_regular_file(path: Path) -> bool:
    """A regular file (after symlinks); False for FIFOs, devices, sockets, broken links and loops."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


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
