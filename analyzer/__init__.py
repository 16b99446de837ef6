"""tpuanalyze.analyzer"""
