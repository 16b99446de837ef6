"""Run the attribution SQL pipeline (analyzer/attribution.sql) for one run or as views over all runs.

The interval logic lives in DuckDB (boundary sweep with window sums), never in Python loops over events,
so it scales with the database rather than with Python memory.
"""

from __future__ import annotations

import re
from pathlib import Path
from string import Template
from typing import Any

import duckdb
from tpuanalyze.analyzer.classify import classified_sql, op_category_sql, sql_literal
from tpuanalyze.analyzer.sweep import numpy_elementary, sweep_in_sql

from tpuanalyze.errors import TpuAnalyzeError

SQL_PATH = Path(__file__).with_name("attribution.sql")
_STAGE_RE = re.compile(r"^-- stage: (\w+)\s*$", re.MULTILINE)


def load_stages() -> list[tuple[str, str]]:
    """(name, SELECT text) for every stage of attribution.sql, in order."""
    text = SQL_PATH.read_text()
    parts = _STAGE_RE.split(text)
    stages = []
    for i in range(1, len(parts), 2):
        body = parts[i + 1].strip().rstrip(";").strip()
        stages.append((parts[i], body))
    return stages


STAGE_NAMES = [name for name, _ in load_stages()]
LAZY_STAGES = {"op_steps"}
# att_runs' flags, placeholders $<flag> of the later stages
RUN_FLAGS = ("has_device_planes", "has_steps_line", "has_modules_line", "has_group_ids", "is_kineto")


def run_flags(con: duckdb.DuckDBPyConnection, att_runs: str) -> dict[str, bool] | None:
    """The flags of the one run in the relation ``att_runs`` (None unless it holds exactly one row)."""
    rows = con.execute(f"SELECT {', '.join(RUN_FLAGS)} FROM {att_runs}").fetchall()
    return dict(zip(RUN_FLAGS, (bool(v) for v in rows[0]), strict=True)) if len(rows) == 1 else None


def chrome_json_run(con: duckdb.DuckDBPyConnection, run_id: int) -> bool:
    """Whether the run came from Chrome-trace JSON (only those need att_runs' scan of the stats)."""
    rows = con.execute("SELECT source_format FROM runs WHERE run_id = ?", [int(run_id)]).fetchall()
    return bool(rows) and rows[0][0] == "chrome_json"


def _substitutions(config: dict[str, Any], run_filter: str, relation: dict[str, str],
                   hosts: tuple[str, str] | None = None,
                   flags: dict[str, bool] | None = None,
                   chrome_json: bool | None = None) -> dict[str, str]:
    pats = config["patterns"]
    warm = config["warmup"]
    subs = {
        "run_filter": run_filter,
        "op_category": op_category_sql(config),
        "classified_combos": classified_sql("combos", op_category_sql(config)),
        "pat_eval_program": sql_literal(pats["eval_program"]),
        "pat_eval_annotation": sql_literal(pats["eval_annotation"]),
        "pat_dispatch": sql_literal(pats["dispatch"]),
        "pat_dataloader": sql_literal(pats["dataloader"]),
        "pat_compile": sql_literal(pats["compile"]),
        "warmup_max_steps": str(int(warm["max_steps"])),
        "warmup_slow_factor": repr(float(warm["slow_factor"])),
        "warmup_compile_overlap": repr(float(warm["compile_overlap"])),
        "keep_warmup": "TRUE" if warm.get("keep") else "FALSE",
        "kineto_device_cats": "('Kernel', 'kernel', 'Memcpy', 'gpu_memcpy', 'Memset', 'gpu_memset')",
        # the events the stages after att_ops read (a batch's events off the device op lines: batch_engine)
        "events": "events",
    }
    subs.update(relation)
    # hosts: the (first, last) host names of a batch of consecutive hosts (analyzer/per_host.py)
    for alias in ("e", "l"):
        subs[f"{alias}_host"] = ("TRUE" if hosts is None else
                                 f"{alias}.host BETWEEN {sql_literal(hosts[0])} AND {sql_literal(hosts[1])}")
    if "att_programs" in relation:
        subs.setdefault("att_programs_run", relation["att_programs"])
    # FALSE for one run known not to be Chrome-trace JSON: att_runs' Kineto branch folds away before
    # it reads every event through the events view (two thirds of att_runs on a 512-host pod)
    subs["maybe_chrome_json"] = "FALSE" if chrome_json is False else "TRUE"
    # a known flag is a literal (its branches fold away); else the joined att_runs row's column
    for flag in RUN_FLAGS:
        subs[flag] = f"r.{flag}" if flags is None else ("TRUE" if flags[flag] else "FALSE")
    return subs


def stage_without_sql(con: duckdb.DuckDBPyConnection, name: str, relation: dict[str, str],
                   table: str) -> bool:
    """Create stage ``name`` as TEMP TABLE ``table`` without its SQL where an equivalent outside SQL
    exists (att_elementary: the numpy sweep, analyzer/sweep.py); False if the SQL must run."""
    if name != "att_elementary" or sweep_in_sql():
        return False
    numpy_elementary(con, relation["att_intervals"], relation["att_steps"], table)
    return True


def stage_error(stage: str, exc: duckdb.Error) -> Exception:
    """The exception for a failed attribution stage: the data's fault (files the database reads are
    missing or damaged: a moved or truncated Parquet dataset) or the machine's (out of memory) is a
    TpuAnalyzeError, one line for the user; anything else is a bug in the stage's SQL."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if isinstance(exc, (duckdb.IOException, duckdb.InvalidInputException)):
        return TpuAnalyzeError(f"cannot read the run's events (a Parquet dataset the database reads moved "
                               f"or damaged?): {first}")
    if isinstance(exc, duckdb.OutOfMemoryException):
        return TpuAnalyzeError(f"out of memory in attribution stage {stage}: {first}")
    return RuntimeError(f"attribution stage {stage} failed: {exc}")


def materialize_run(con: duckdb.DuckDBPyConnection, run_id: int, config: dict[str, Any],
                    prefix: str = "ta_") -> dict[str, str]:
    """Create TEMP tables ``<prefix><stage>`` for one run; return stage name -> table name."""
    relation: dict[str, str] = {}
    flags: dict[str, bool] | None = None
    chrome_json = chrome_json_run(con, run_id)
    for name, body in load_stages():
        table = f"{prefix}{name}"
        # e.run_id in joins is qualified by the USING clause; a bare run_id predicate is unambiguous
        subs = _substitutions(config, f"run_id = {int(run_id)}", relation, flags=flags,
                              chrome_json=chrome_json)
        sql = Template(body).safe_substitute(subs)
        # op_steps is one row per op: a view (filters push into it) rather than a copy of every op
        kind = "VIEW" if name in LAZY_STAGES else "TABLE"
        try:
            if not stage_without_sql(con, name, relation, table):
                con.execute(f"CREATE OR REPLACE TEMP {kind} {table} AS {sql}").fetchall()
        except duckdb.Error as exc:
            raise stage_error(name, exc) from exc
        relation[name] = table
        if name == "att_runs":
            flags = run_flags(con, table)
    return relation


def view_sql(config: dict[str, Any], run_filter: str = "TRUE") -> dict[str, str]:
    """Stage name -> one self-contained SELECT: the earlier stages it needs as MATERIALIZED CTEs, so a
    query over a view computes each stage once (views over views would re-expand them)."""
    relation = {name: f"_s_{name}" for name in STAGE_NAMES}
    subs = _substitutions(config, run_filter, relation)
    bodies = {name: Template(body).safe_substitute(subs) for name, body in load_stages()}
    out: dict[str, str] = {}
    for i, name in enumerate(STAGE_NAMES):
        ctes = [f"_s_{prev} AS MATERIALIZED ({bodies[prev]})" for prev in STAGE_NAMES[:i]
                if f"_s_{prev}" in "".join(bodies[n] for n in STAGE_NAMES[: i + 1])]
        out[name] = (f"WITH {', '.join(ctes)} SELECT * FROM ({bodies[name]}) AS _stage" if ctes
                     else bodies[name])
    return out


def install_views(con: duckdb.DuckDBPyConnection, config: dict[str, Any]) -> list[str]:
    """Create (or replace) persistent views named after the stages, over all runs of the database."""
    for name, sql in view_sql(config).items():
        con.execute(f"CREATE OR REPLACE VIEW {name} AS {sql}").fetchall()
    return list(STAGE_NAMES)
