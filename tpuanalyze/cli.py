"""The ``tpuanalyze`` command: a click group whose verbs live in ``tpuanalyze.reports.cmd_*`` modules.

Each verb module exposes one click command named ``command``; a verb whose module is missing is
simply not offered, so the pieces land independently.
"""

from __future__ import annotations

import importlib
import sys

import click

from tpuanalyze import __version__
from tpuanalyze.errors import TpuAnalyzeError

VERBS = ["ingest", "sql", "generate", "report", "scaling", "compare", "mlperf"]


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="tpuanalyze")
def cli() -> None:
    """Trace-driven performance analysis of ML training on TPU pods."""


for _verb in VERBS:
    try:
        _module = importlib.import_module(f"tpuanalyze.reports.cmd_{_verb}")
    except ModuleNotFoundError as exc:
        if exc.name != f"tpuanalyze.reports.cmd_{_verb}":
            raise
        continue
    cli.add_command(_module.command, name=_verb)


def main(argv: list[str] | None = None) -> None:
    """Entry point: bad input becomes one line on stderr and exit status 2."""
    try:
        # Without standalone mode click returns a verb's exit code (e.g. compare's 1) instead of exiting.
        rc = cli.main(args=argv, prog_name="tpuanalyze", standalone_mode=False)
    except TpuAnalyzeError as exc:
        click.echo(f"tpuanalyze: error: {exc}", err=True)
        sys.exit(2)
    except click.exceptions.Abort:
        click.echo("tpuanalyze: aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(2 if exc.exit_code == 2 else exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    if isinstance(rc, int) and rc:
        sys.exit(rc)


if __name__ == "__main__":
    main()
