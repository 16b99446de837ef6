"""The reader of each trace format, and a database-free pass over a run (benchmarks, checks)."""

from __future__ import annotations

from dataclasses import dataclass

from tpuanalyze.parsers.chrome_json import ChromeJsonReader
from tpuanalyze.parsers.discover import RunSource
from tpuanalyze.parsers.xspace import XSpaceReader

READERS = {"xspace": XSpaceReader, "chrome_json": ChromeJsonReader}


@dataclass
class ParsedRun:
    """A run decoded without a database (``read_run``): counts only."""

    name: str
    source_path: str
    hosts: int
    planes: int
    num_events: int


def read_run(source: RunSource) -> ParsedRun:
    """Parse and decode every event batch of a run without touching a database."""
    planes = events = 0
    for host, path in source.files:
        reader = READERS[source.source_format](path, host)
        for plane in reader.planes():
            planes += 1
            events += sum(batch.num_rows for batch in plane.batches)
    return ParsedRun(source.name, source.source_path, len(source.files), planes, events)
