"""Trace inputs named by URL (``gs://bucket/logdir``, ``file:///...``, any fsspec protocol).

TPU profiles usually live in a bucket (the logdir of a training job). Discovery lists a URL's
files with fsspec under the same rules as a local path (docs/schema.md, "How paths become runs");
a host file is then read by streaming it into a local temporary file, because the readers
work on local files (the XSpace reader seeks to each plane's byte range, the Chrome-trace reader
is handed a file name). The copy lives only while its host is read; the run's ``source_path``
and the host's ``file_path`` stay the URL, and errors name the URL, never the copy.

fsspec is an optional dependency (``pip install 'tpuanalyze[cluster]'``); a protocol may need
its own package (``gcsfs`` for ``gs://``, ``s3fs`` for ``s3://``), named in the error.
"""

from __future__ import annotations

import gzip
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Any

from tpuanalyze.errors import TpuAnalyzeError, TraceFormatError

# ``scheme://``: what makes a user's path a URL. A Windows drive (``C:\``) or a plain name never matches.
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")
COPY_CHUNK = 8 << 20  # bytes streamed per read while copying a host file
INSTALL_HINT = "pip install 'tpuanalyze[cluster]'"


def is_url(path: str | os.PathLike[str]) -> bool:
    """True for ``protocol://...`` (the user named a URL, not a local path)."""
    return isinstance(path, str) and bool(_URL.match(path))


def filesystem(url: str) -> tuple[Any, str]:
    """The fsspec filesystem of ``url`` and the path inside it; a one-line error naming the URL when
    fsspec or the protocol's package is missing, or the protocol is unknown."""
    try:
        from fsspec.core import url_to_fs
    except ImportError:
        raise TpuAnalyzeError(f"reading URLs needs fsspec: {INSTALL_HINT}", url) from None
    try:
        return url_to_fs(url)
    except ImportError as exc:  # fsspec knows the protocol, its package is not installed
        raise TpuAnalyzeError(f"cannot read this URL: {exc}", url) from None
    except ValueError as exc:  # "Protocol not known: ..."
        raise TpuAnalyzeError(f"cannot read this URL: {exc}", url) from None


def url_name(url: str) -> str:
    """The last component of a URL's path (``gs://b/run/h.xplane.pb`` -> ``h.xplane.pb``)."""
    return PurePosixPath(url.rstrip("/")).name


def read_head(fs: Any, path: str, probe_bytes: int) -> bytes:
    """The first ``probe_bytes`` of a file (decompressed when it ends in ``.gz``); b"" when unreadable."""
    try:
        with fs.open(path, "rb") as raw:
            if path.endswith(".gz"):
                with gzip.GzipFile(fileobj=raw) as fh:
                    return fh.read(probe_bytes)
            return raw.read(probe_bytes)
    except (OSError, EOFError, ValueError):
        return b""


def _copy_reason(exc: BaseException) -> str:
    if isinstance(exc, FileNotFoundError):
        return "no such file"
    if isinstance(exc, OSError) and exc.strerror:
        return f"cannot read: {exc.strerror}"
    text = str(exc).strip().splitlines()
    return f"cannot read: {type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def copy_to_local(url: str, directory: Path) -> Path:
    """Stream the file at ``url`` into ``directory`` (same file name: readers tell ``.gz`` by it)."""
    fs, path = filesystem(url)
    target = directory / (url_name(url) or "input")
    try:
        source = fs.open(path, "rb")
    except Exception as exc:  # any backend's error (HTTP, auth) is a one-line read error
        raise TraceFormatError(_copy_reason(exc), url) from None
    with source:
        try:
            with target.open("wb") as out:
                while True:
                    try:
                        chunk = source.read(COPY_CHUNK)
                    except Exception as exc:
                        raise TraceFormatError(_copy_reason(exc), url) from None
                    if not chunk:
                        break
                    out.write(chunk)
        except OSError as exc:  # the local disk (full, read-only temporary folder)
            raise TraceFormatError(
                f"cannot copy to a local temporary file ({target.parent}): {exc.strerror or exc}", url
            ) from None
    return target


@contextmanager
def local_input(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A local file the readers can open for ``path``: the path itself, or for a URL a temporary copy
    removed on exit. A ``TpuAnalyzeError`` raised inside that names the copy is re-raised naming the
    URL. Set the reader's ``file_path`` to the URL too (it is what the database stores)."""
    if not is_url(path):
        yield Path(path)
        return
    url = str(path)
    folder = Path(tempfile.mkdtemp(prefix="tpuanalyze-url-"))
    try:
        local = copy_to_local(url, folder)
        try:
            yield local
        except TpuAnalyzeError as exc:
            if exc.path in (str(local), str(local.resolve())):
                raise type(exc)(exc.reason, url) from None
            raise
    finally:
        shutil.rmtree(folder, ignore_errors=True)
