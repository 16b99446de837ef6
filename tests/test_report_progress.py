"""Progress on long ingests and analyses: drawn on a terminal, silent when piped."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time

from test_report_pipeline import cli, generated_run
from tpuanalyze.reports import progress


def test_quiet_progress_counts_without_drawing(capsys) -> None:
    with progress.progress_bar(3, "work", enabled=False) as bar:
        for _ in range(3):
            bar.advance(1, note="item")
    assert isinstance(bar, progress.QuietProgress) and bar.completed == 3 and bar.note == "item"
    with progress.phase("thinking", enabled=False):
        pass
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""


def test_automatic_mode_follows_stderr_being_a_terminal() -> None:
    # Under pytest stderr is captured (not a terminal): automatic means off.
    assert progress.resolve_enabled(None) is progress.stderr_is_terminal()
    assert progress.resolve_enabled(True) is True and progress.resolve_enabled(False) is False


def _read_all(fd: int, proc: subprocess.Popen, timeout: float) -> bytes:
    chunks, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                data = os.read(fd, 65536)
            except OSError:  # the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    return b"".join(chunks)


def test_report_draws_progress_on_a_terminal_and_nothing_when_piped(tmp_path) -> None:
    run = generated_run()
    piped = cli("report", str(run), "--quiet", "--json", str(tmp_path / "a.json"))
    assert piped.returncode == 0, piped.stderr
    assert "analysing" not in piped.stderr and "\x1b[" not in piped.stderr

    # stderr on a pseudo-terminal: rich sees a terminal and draws the bars there.
    master, slave = os.openpty()
    env = {**os.environ, "COLUMNS": "100", "TERM": "xterm-256color"}
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tpuanalyze.cli",
            "report",
            str(run),
            "--quiet",
            "--html",
            str(tmp_path / "r.html"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=slave,
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=tmp_path,
    )
    os.close(slave)
    output = _read_all(master, proc, timeout=180).decode("utf-8", "replace")
    os.close(master)
    assert proc.wait(timeout=60) == 0, output
    assert "analysing" in output  # the analysis bar (the ingest draws its own)
    assert "\x1b[" in output  # drawn with terminal control codes
    assert (tmp_path / "r.html").is_file()
