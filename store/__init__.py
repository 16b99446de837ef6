"""tpuanalyze.store"""
