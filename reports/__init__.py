"""tpuanalyze.reports"""
