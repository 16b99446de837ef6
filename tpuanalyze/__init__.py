"""tpuanalyze: where each training step's time goes on a TPU pod, from profiler traces alone.

Pipeline: ``tpuanalyze.parsers`` (read) -> ``tpuanalyze.store`` (DuckDB) -> ``tpuanalyze.analyzer``
-> ``tpuanalyze.reports``; ``tpuanalyze.generator`` writes synthetic TPU-v3 pod traces.
"""

__version__ = "0.1.0"
