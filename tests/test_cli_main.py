"""The CLI entry point: exit codes and one-line errors, whatever the verb."""

from __future__ import annotations

import signal
import subprocess
import sys

import click
import pytest

from tpuanalyze import cli as cli_module
from tpuanalyze.errors import TpuAnalyzeError


def _run_with(command: click.Command, monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setitem(cli_module.cli.commands, "probe", command)
    with pytest.raises(SystemExit) as exc:
        cli_module.main(["probe"])
    return exc.value.code


def test_verb_exit_code_reaches_the_shell(monkeypatch: pytest.MonkeyPatch) -> None:
    @click.command()
    def probe() -> None:
        raise click.exceptions.Exit(1)

    assert _run_with(probe, monkeypatch) == 1


def test_bad_input_is_one_line_and_exit_2(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    @click.command()
    def probe() -> None:
        raise TpuAnalyzeError("not a trace", "/x/y.pb")

    assert _run_with(probe, monkeypatch) == 2
    err = capsys.readouterr().err
    assert err.strip() == "tpuanalyze: error: /x/y.pb: not a trace"


def test_every_documented_verb_is_registered() -> None:
    out = subprocess.run([sys.executable, "-m", "tpuanalyze.cli", "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    for verb in cli_module.VERBS:
        assert verb in out.stdout, f"verb {verb} missing from the CLI"


def test_unknown_verb_exits_2() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tpuanalyze.cli", "no-such-verb"], capture_output=True, text=True
    )
    assert out.returncode == 2
    assert "Traceback" not in out.stderr


def test_a_bug_is_one_line_and_exit_70(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """An unexpected exception (a bug in a rule's SQL, say) is no traceback either: one line that says
    it is the tool's fault, exit status 70; TPUANALYZE_DEBUG=1 lets the traceback through."""
    @click.command()
    def probe() -> None:
        raise ValueError("Binder Error: Cannot mix aggregates\nwith non-aggregated columns!")

    monkeypatch.delenv("TPUANALYZE_DEBUG", raising=False)
    assert _run_with(probe, monkeypatch) == cli_module.INTERNAL_ERROR == 70
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tpuanalyze: internal error: ValueError: Binder Error")
    assert "TPUANALYZE_DEBUG=1" in err and "Traceback" not in err
    monkeypatch.setenv("TPUANALYZE_DEBUG", "1")
    monkeypatch.setitem(cli_module.cli.commands, "probe", probe)
    with pytest.raises(ValueError):
        cli_module.main(["probe"])


def test_bad_thresholds_are_the_files_fault_before_any_query(tmp_path) -> None:  # noqa: ANN001
    """A thresholds file with a pattern DuckDB cannot compile, or a value of the wrong kind, is bad input:
    one line naming the file and the key, exit 2, before the analysis (it used to fail mid-analysis as
    an attribution stage's error)."""
    from conftest import SAMPLE_TRACES

    run = str(SAMPLE_TRACES / "jax_cpu" / "single_jit_train")
    for text, reason in (("[patterns]\ndispatch = '(unclosed'\n", "patterns.dispatch is not a valid regular"),
                         ("[host_overhead]\nmedium = 'high'\n", "host_overhead.medium must be a number"),
                         ("[warmup]\nkeep = 1\n", "warmup.keep must be true or false")):
        bad = tmp_path / "t.toml"
        bad.write_text(text)
        proc = subprocess.run([sys.executable, "-m", "tpuanalyze.cli", "report", run, "--thresholds",
                               str(bad)], capture_output=True, text=True, timeout=300, check=False)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("tpuanalyze: error:")]
        assert line.startswith(f"tpuanalyze: error: {bad}: thresholds") and reason in line, line


PROBE_MODULE = '''
import time

import click

from tpuanalyze import cli


@click.command()
def probe() -> None:
    # Ctrl-C while ``exec`` runs code from a string (as dataclasses and namedtuple do on import)
    exec("import os, signal\\nos.kill(os.getpid(), signal.SIGINT)\\nfor _ in range(10**6): pass")
    time.sleep(30)


cli.cli.commands["probe"] = probe
if __name__ == "__main__":
    cli.main(["probe"])
'''


def test_ctrl_c_inside_exec_of_a_string_still_exits_130(tmp_path) -> None:  # noqa: ANN001
    """CPython marks a KeyboardInterrupt raised in code ``exec`` runs from a string as unhandled, and a
    process started with ``-m`` then kills itself with SIGINT at exit (-2) even though the CLI handled
    it: the handler waits until the exec is over."""
    (tmp_path / "sigprobe.py").write_text(PROBE_MODULE)
    result = subprocess.run([sys.executable, "-m", "sigprobe"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=60, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert result.returncode == 130, result.stderr
    assert result.stderr.strip().splitlines() == ["tpuanalyze: interrupted"]
