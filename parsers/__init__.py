"""tpuanalyze.parsers"""
