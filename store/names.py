"""Run names people can read: ``<logdir or parent>/<run>``, unique within a database.

A JAX logdir names every run folder by its timestamp (``plugins/profile/2026_11_30_16_29_18``), so two
captures made the same second in two logdirs would read alike; the folder above says which is which.
When even that is taken by another source, more parent folders are added, then ``#2``, ``#3``...
"""

from __future__ import annotations

from pathlib import Path

import duckdb

_TRACE_SUFFIXES = (".xplane.pb", ".trace.json.gz", ".trace.json", ".json.gz", ".json")


def _components(source_path: str) -> list[str]:
    """Path components that name the run: ``plugins/profile`` dropped, a file's trace suffix dropped."""
    path = Path(source_path)
    parts = [p for p in path.parts if p not in ("/", "")]
    if parts:
        last = parts[-1]
        for suffix in _TRACE_SUFFIXES:
            if last.endswith(suffix) and len(last) > len(suffix):
                parts[-1] = last[: -len(suffix)]
                break
    out = []
    for i, part in enumerate(parts):
        before, after = parts[i - 1] if i else None, parts[i + 1] if i + 1 < len(parts) else None
        if (part, after) == ("plugins", "profile") or (before, part) == ("plugins", "profile"):
            continue
        out.append(part)
    return out


def display_name_candidates(source_path: str) -> list[str]:
    """``parent/run``, then ``grandparent/parent/run``, ... up to the whole path."""
    parts = _components(source_path)
    if len(parts) <= 1:
        return ["/".join(parts) or source_path]
    return ["/".join(parts[-k:]) for k in range(2, len(parts) + 1)]


def unique_run_name(con: duckdb.DuckDBPyConnection, source_path: str) -> str:
    """The shortest candidate no other source in the database uses (call after removing the run's old
    rows: a re-ingested source gets its name back)."""
    taken = {
        row[0]
        for row in con.execute("SELECT name FROM runs WHERE source_path <> ?", [source_path]).fetchall()
    }
    candidates = display_name_candidates(source_path)
    for name in candidates:
        if name not in taken:
            return name
    k = 2
    while f"{candidates[0]}#{k}" in taken:
        k += 1
    return f"{candidates[0]}#{k}"
