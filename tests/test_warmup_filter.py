"""The findings' evidence SQL leaves warm-up steps out of "train steps" (``Ctx.train_only``); for op rows
the filter is an uncorrelated NOT IN (DuckDB runs the correlated NOT EXISTS as a join materializing every
op row). It must keep exactly the rows NOT EXISTS keeps, NULLs included: every combination of NULL and
matching hosts, devices and step starts, warm-up or not, with and without a table alias."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import duckdb
import pytest
from tpuanalyze.analyzer.findings.rules import Ctx

REFERENCE = ("NOT EXISTS (SELECT 1 FROM step_breakdown w WHERE w.run_id = 1 AND w.is_warmup "
             "AND w.host = {p}host AND w.device_ordinal = {p}device_ordinal AND w.start_ps = {p}step_start)")


@pytest.fixture(scope="module")
def con() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute("CREATE TABLE step_breakdown (run_id INT, host VARCHAR, device_ordinal INT, start_ps BIGINT, "
                "is_warmup BOOL)")
    con.execute("CREATE TABLE op_steps (run_id INT, host VARCHAR, device_ordinal INT, step_start BIGINT, "
                "step_is_eval BOOL, duration_ps BIGINT)")
    values = [None, 0, 1]
    steps = list(itertools.product([1, 2], ["a", "b"], values, values, [True, False, None]))
    con.executemany("INSERT INTO step_breakdown VALUES (?, ?, ?, ?, ?)", [list(r) for r in steps])
    ops = list(itertools.product([1], ["a", "b", "c"], values, values, [False, True]))
    con.executemany("INSERT INTO op_steps VALUES (?, ?, ?, ?, ?, 1)", [list(r) for r in ops])
    return con


@pytest.mark.parametrize("alias", ["", "o"])
def test_warmup_op_filter_keeps_what_not_exists_keeps(con: duckdb.DuckDBPyConnection, alias: str) -> None:
    ctx = SimpleNamespace(t={"warmup": {"keep": False}}, run_id=1)
    p = f"{alias}." if alias else ""
    source = f"op_steps {alias}".strip()
    sql = f"SELECT * FROM {source} WHERE {p}run_id = 1 AND NOT {p}step_is_eval"
    filtered = Ctx.train_only(ctx, sql)
    assert "NOT IN" in filtered and "NOT EXISTS" not in filtered
    reference = f"{sql} AND {REFERENCE.format(p=p or 'op_steps.')}"
    got = con.execute(f"{filtered} ORDER BY ALL").fetchall()
    want = con.execute(f"{reference} ORDER BY ALL").fetchall()
    assert got == want
    # the filter does something here: some rows are in warm-up steps, and rows with NULLs are kept
    total = con.execute(f"SELECT count(*) FROM ({sql})").fetchall()[0][0]
    assert 0 < len(want) < total
    assert any(r[2] is None for r in want) and any(r[3] is None for r in want)


def test_kept_warmup_leaves_the_sql_alone() -> None:
    ctx = SimpleNamespace(t={"warmup": {"keep": True}}, run_id=1)
    sql = "SELECT * FROM op_steps WHERE NOT step_is_eval"
    assert Ctx.train_only(ctx, sql) == sql
