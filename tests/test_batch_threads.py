"""Batches attributed in threads (analyzer/per_host.py, ``in_threads``): each on a cursor of its own,
the results those of one connection attributing the batches in turn (same rows, stored batch after
batch in batch order, same JSON), and a failing batch reported as itself, once the batches beside it
have stopped."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import duckdb
import pytest
from test_per_host import four_host_pod
from tpuanalyze.analyzer import per_host
from tpuanalyze.analyzer.api import analyze_run, report_json
from tpuanalyze.analyzer.config import load_thresholds
from tpuanalyze.analyzer.resources import scratch_database


def test_results_come_in_batch_order_each_thread_on_its_own_cursor() -> None:
    con = duckdb.connect()
    seen: dict[int, int] = {}
    threads: set[int] = set()

    def work(cur: duckdb.DuckDBPyConnection, i: int) -> int:
        time.sleep(0.02 * (5 - i % 5))  # later batches finish first
        # a TEMP table of the same name on every cursor: each cursor has its own
        cur.execute(f"CREATE OR REPLACE TEMP TABLE t AS SELECT {i} AS i")
        seen[i] = id(cur)
        threads.add(threading.get_ident())
        return int(cur.execute("SELECT i FROM t").fetchall()[0][0])

    assert per_host.in_threads(con, 2, 10, work) == list(range(10))
    assert len(threads) == 2
    assert len(set(seen.values())) == 2  # one cursor per thread, none of them the caller's connection
    assert id(con) not in seen.values()
    assert per_host.in_threads(con, 1, 3, lambda cur, i: (cur is con, i)) == [(True, 0), (True, 1), (True, 2)]


def test_the_first_failing_batch_is_raised_after_the_others_stop() -> None:
    con = duckdb.connect()
    finished: list[int] = []
    running = threading.Event()

    def work(cur: duckdb.DuckDBPyConnection, i: int) -> int:
        if i == 1:
            running.wait(5)
            raise RuntimeError("attribution stage att_steps failed: batch 1")
        if i == 0:
            running.set()
            time.sleep(0.2)  # still running when batch 1 fails: waited for, not abandoned
        finished.append(i)
        return i

    with pytest.raises(RuntimeError, match="batch 1"):
        per_host.in_threads(con, 2, 50, work)
    assert 0 in finished  # the batch beside the failed one ran to its end before the error came out
    assert len(finished) < 49  # the batches not started yet never ran


def test_ctrl_c_comes_out_as_itself_and_stops_the_statements_beside_it() -> None:
    """Ctrl-C (a KeyboardInterrupt in the main thread, as the signal gives it) is what the caller gets,
    not the error of a statement it interrupted; a long statement of a batch is interrupted, no new
    batch starts."""
    con = duckdb.connect()
    started: list[int] = []
    running = threading.Event()

    def work(cur: duckdb.DuckDBPyConnection, i: int) -> None:
        started.append(i)
        if i == 0:
            running.wait(5)
            time.sleep(0.2)  # batch 1's statement is running by now
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C
            return
        if i == 1:
            running.set()
            try:  # tens of seconds unless interrupted
                cur.execute("SELECT count(*) FROM range(10000000000) t(x) WHERE x % 7 = 3").fetchall()
            except duckdb.Error as exc:
                raise RuntimeError(f"attribution stage att_steps failed: {exc}") from exc
        time.sleep(0.5)

    # Python's own SIGINT handler (a test runner's worker may have set another, or ignore SIGINT)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        began = time.perf_counter()
        with pytest.raises(KeyboardInterrupt):
            per_host.in_threads(con, 2, 20, work)
        elapsed = time.perf_counter() - began
    finally:
        signal.signal(signal.SIGINT, previous)
    assert elapsed < 8  # the statement alone runs for tens of seconds
    assert len(started) <= 3


def test_a_failing_sql_statement_in_a_thread_names_its_stage(tmp_path: Path) -> None:
    con = duckdb.connect()

    def work(cur: duckdb.DuckDBPyConnection, i: int) -> None:
        try:
            cur.execute("SELECT * FROM no_such_table" if i == 3 else "SELECT 1").fetchall()
        except duckdb.Error as exc:
            raise RuntimeError(f"attribution stage op_steps failed: {exc}") from exc

    with pytest.raises(RuntimeError, match="op_steps failed.*no_such_table"):
        per_host.in_threads(con, 2, 6, work)


def test_batch_threads_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TPUANALYZE_BATCH_THREADS", raising=False)
    assert per_host.batch_threads(10) == min(per_host.BATCH_THREADS, os.cpu_count() or 1)
    monkeypatch.setattr(os, "cpu_count", lambda: 1)  # one core: one batch at a time
    assert per_host.batch_threads(10) == 1
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    assert per_host.batch_threads(10) == per_host.BATCH_THREADS
    assert per_host.batch_threads(1) == 1
    monkeypatch.setenv("TPUANALYZE_BATCH_THREADS", "1")
    assert per_host.batch_threads(10) == 1
    monkeypatch.setenv("TPUANALYZE_BATCH_THREADS", "3")
    assert per_host.batch_threads(10) == 3
    monkeypatch.setenv("TPUANALYZE_BATCH_THREADS", "zero")
    assert per_host.batch_threads(10) == per_host.BATCH_THREADS
    # a host larger than a batch: one batch at a time, as memory is bounded by the largest host
    assert per_host.batch_threads(10, per_host.BATCH_EVENTS) == per_host.BATCH_THREADS
    assert per_host.batch_threads(10, per_host.BATCH_EVENTS + 1) == 1


def _kept_rows(con: duckdb.DuckDBPyConnection, rel: dict[str, str]) -> dict[str, list[tuple]]:
    """Every kept relation's rows and op_steps' rows, sorted (within a batch, a parallel statement's row
    order is DuckDB's, on one connection too)."""
    names = [*per_host.KEPT_STAGES, "op_steps"]
    return {name: sorted(con.execute(f"SELECT * FROM {rel[name]}").fetchall(), key=repr) for name in names}


def _hosts_in_stored_order(con: duckdb.DuckDBPyConnection, rel: dict[str, str]) -> dict[str, list[str]]:
    """The host of each row of the kept relations with hosts, in their stored order."""
    out = {}
    for name in per_host.KEPT_STAGES:
        columns = [r[0] for r in con.execute(f"DESCRIBE {rel[name]}").fetchall()]
        if "host" in columns:
            out[name] = [r[0] for r in con.execute(f"SELECT host FROM {rel[name]} ORDER BY rowid").fetchall()]
    return out


def test_threads_write_what_one_connection_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A generated 4-host pod attributed one host per batch on 1 and on 3 threads: the same rows in
    every kept table and in op_steps, the batches' rows stored in batch order, the same report JSON."""
    db = four_host_pod(tmp_path, seed=3)
    config = load_thresholds(None)
    con = duckdb.connect(str(db), read_only=True)
    try:
        batches = per_host.host_batches(con, 1, 1)
        assert len(batches) >= 4
        results = {}
        for threads in (1, 3):
            with scratch_database(con):
                rel = per_host.materialize_per_host(con, 1, config, batches, prefix=f"t{threads}_",
                                                    threads=threads)
                results[threads] = _kept_rows(con, rel)
                # the batches' rows one batch after the other, in batch (host) order
                stored = _hosts_in_stored_order(con, rel)
                for name, hosts in stored.items():
                    assert hosts == sorted(hosts), name
                assert len(set(stored["att_steps"])) >= 4
        assert results[1] == results[3]
        assert len(results[1]["step_breakdown"]) and len(results[1]["op_steps"]) > 1000
        monkeypatch.setattr(per_host, "BATCH_EVENTS", 1)
        documents = {}
        for threads in ("1", "2"):
            monkeypatch.setenv("TPUANALYZE_BATCH_THREADS", threads)
            documents[threads] = report_json([analyze_run(con, 1)])
        for document in documents.values():
            document.pop("generated_at", None)
        assert documents["1"] == documents["2"]
    finally:
        con.close()
