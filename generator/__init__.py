"""tpuanalyze.generator"""
