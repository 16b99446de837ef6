"""The CLI entry point: exit codes and one-line errors, whatever the verb."""

from __future__ import annotations

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
