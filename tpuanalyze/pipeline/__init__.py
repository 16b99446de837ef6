"""Orchestration, the one place that knows every layer: discover -> map (per host, in an
executor) -> store (one transaction) -> analysis -> report. The CLI verbs and the Python API call
it; below it, readers never write, the store never analyses, the analyzer never ingests."""

from tpuanalyze.pipeline.ingest import IngestSummary, ingest_paths

__all__ = ["IngestSummary", "ingest_paths"]
