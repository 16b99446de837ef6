"""Every option of every verb is documented: in the README or a page of docs/ (the CLI is a contract)."""

from __future__ import annotations

import re

import click
import pytest
from conftest import PROJECT_ROOT

from tpuanalyze.cli import VERBS, cli


def _documentation() -> str:
    pages = [PROJECT_ROOT / "README.md", *sorted((PROJECT_ROOT / "docs").glob("*.md"))]
    return "\n".join(page.read_text(encoding="utf-8") for page in pages)


@pytest.mark.parametrize("verb", VERBS)
def test_every_flag_of_the_verb_is_documented(verb: str) -> None:
    command = cli.get_command(click.Context(cli), verb)
    assert command is not None, f"verb {verb} is not registered"
    documentation = _documentation()
    flags = [
        flag
        for param in command.params
        if isinstance(param, click.Option)
        for flag in (*param.opts, *param.secondary_opts)
        if flag.startswith("--") and flag != "--help"
    ]
    assert flags or verb == "sql", f"{verb} has no options at all?"
    undocumented = [  # the whole flag: `--progress` is not documented by `--progress-bar`
        flag for flag in flags if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", documentation)
    ]
    assert not undocumented, f"tpuanalyze {verb}: {undocumented} documented nowhere in README.md or docs/"
