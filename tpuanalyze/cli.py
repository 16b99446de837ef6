"""The ``tpuanalyze`` command: a click group whose verbs live in ``tpuanalyze.reports.cmd_*`` modules.

Each verb module exposes one click command named ``command``; a verb whose module is missing is
simply not offered, so the pieces land independently. A verb's module is imported only when that
verb runs (or help lists the verbs): ``report`` needs pandas and altair, ``ingest`` must not pay
for them (importing every verb up front cost ~50 MB of peak memory and 0.5 s per ingest).
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import threading

import click

from tpuanalyze import __version__
from tpuanalyze.errors import TpuAnalyzeError

VERBS = ["ingest", "sql", "generate", "report", "scaling", "compare", "mlperf"]


def _load_verb(verb: str) -> click.Command | None:
    """The verb's click command, or None when its module is not there."""
    module_name = f"tpuanalyze.reports.cmd_{verb}"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        return None
    return module.command


class LazyVerbs(click.Group):
    """A group that imports a verb's module on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [verb for verb in VERBS if self.get_command(ctx, verb) is not None]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in VERBS:
            command = _load_verb(cmd_name)
            if command is not None:
                self.add_command(command, name=cmd_name)
        return self.commands.get(cmd_name)


@click.group(
    cls=LazyVerbs,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(__version__, prog_name="tpuanalyze")
def cli() -> None:
    """Trace-driven performance analysis of ML training on TPU pods."""


class _Terminated(BaseException):
    """SIGTERM, raised in the main thread so every ``with``/``finally`` cleans up (temporary
    databases and report folders, the open transaction) before the process exits."""


INTERNAL_ERROR = 70  # exit status of an unexpected exception (sysexits.h EX_SOFTWARE)
_SIGTERM_RECEIVED = threading.Event()
_SIGINT_RECEIVED = threading.Event()


def _in_ignored_context(frame: object) -> bool:
    """Whether the signal landed where raising is unsafe: code whose exceptions Python prints and
    ignores (a weakref callback of the import machinery's module locks, a ``__del__``), where the
    exception would print a traceback and be lost; or code ``exec``/``eval`` runs from a string
    (dataclasses and namedtuple build their methods so while a module is imported), where CPython
    (``PyRun_StringFlags``) marks a KeyboardInterrupt as unhandled even once we have handled it, and
    the process then kills itself with SIGINT at exit (status -2, not 130)."""
    code = getattr(frame, "f_code", None)
    if code is None:
        return False
    return (code.co_name == "__del__" or (code.co_name == "cb" and "importlib" in code.co_filename)
            or (code.co_name == "<module>" and code.co_filename == "<string>"))


def _again_soon(signum: int) -> None:
    """Send ``signum`` to this process again in a moment (out of the context that could not take it)."""
    threading.Timer(0.02, os.kill, (os.getpid(), signum)).start()


def _on_sigterm(signum: int, frame: object) -> None:
    # Remembered first: when the signal lands inside a DuckDB query, DuckDB swallows this exception
    # and raises its own "interrupted" error, which must still exit 143, not 130.
    _SIGTERM_RECEIVED.set()
    if _in_ignored_context(frame):
        _again_soon(signum)
        return
    raise _Terminated()


def _on_sigint(signum: int, frame: object) -> None:
    # As for SIGTERM: an error that a swallowed KeyboardInterrupt leaves behind is still Ctrl-C.
    _SIGINT_RECEIVED.set()
    if _in_ignored_context(frame):
        _again_soon(signum)
        return
    raise KeyboardInterrupt()


def _interrupted(exc: BaseException) -> bool:
    """Ctrl-C: Python's KeyboardInterrupt, or DuckDB's interrupted query (which it may re-raise
    as its own error type, or as a RuntimeError "Query interrupted")."""
    if isinstance(exc, KeyboardInterrupt):
        return True
    import duckdb

    return isinstance(exc, duckdb.InterruptException) or (
        isinstance(exc, RuntimeError) and "interrupted" in str(exc).lower()
    )


def main(argv: list[str] | None = None) -> None:
    """Entry point: bad input becomes one line on stderr and exit status 2; Ctrl-C exits 130 and
    SIGTERM 143, both without a traceback and after cleaning up; an unexpected exception (a bug) is one
    line too, exit status 70 (its traceback with TPUANALYZE_DEBUG=1)."""
    database = sys.modules.get("tpuanalyze.store.database")
    if database is not None:  # a --wait of an earlier in-process call does not carry over
        database.set_wait_seconds(None)
    previous = previous_int = None
    _SIGTERM_RECEIVED.clear()
    _SIGINT_RECEIVED.clear()
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            previous_int = signal.signal(signal.SIGINT, _on_sigint)
    try:
        # Without standalone mode click returns a verb's exit code (e.g. compare's 1) instead of exiting.
        rc = cli.main(args=argv, prog_name="tpuanalyze", standalone_mode=False)
    except TpuAnalyzeError as exc:
        if _signalled():  # the error is what the signal left behind, not the input's fault
            _exit_interrupted()
        click.echo(f"tpuanalyze: error: {_one_line(str(exc))}", err=True)
        sys.exit(2)
    except click.exceptions.Abort:  # click's form of Ctrl-C (KeyboardInterrupt inside a verb)
        _exit_interrupted()
    except click.ClickException as exc:
        if _signalled():
            _exit_interrupted()
        exc.show()
        sys.exit(2 if exc.exit_code == 2 else exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except _Terminated:
        _exit_interrupted()
    except BaseException as exc:
        if _interrupted(exc) or _signalled():
            _exit_interrupted()
        if isinstance(exc, (SystemExit, GeneratorExit)) or os.environ.get("TPUANALYZE_DEBUG"):
            raise
        # a bug, not the input's fault: one line all the same, and a distinct status (sysexits'
        # EX_SOFTWARE) so scripts tell it from bad input (2) and from compare's regression (1)
        click.echo(f"tpuanalyze: internal error: {type(exc).__name__}: {_one_line(str(exc))} (a bug in "
                   f"tpuanalyze, not in the input: TPUANALYZE_DEBUG=1 shows the traceback)", err=True)
        sys.exit(INTERNAL_ERROR)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if previous_int is not None:
            signal.signal(signal.SIGINT, previous_int)
    if _signalled():  # a signal DuckDB swallowed while the verb still finished
        _exit_interrupted()
    if isinstance(rc, int) and rc:
        sys.exit(rc)


def _signalled() -> bool:
    return _SIGTERM_RECEIVED.is_set() or _SIGINT_RECEIVED.is_set()


def _exit_interrupted() -> None:
    """Exit 143 when SIGTERM arrived (whatever exception it surfaced as), else 130 (Ctrl-C)."""
    if _SIGTERM_RECEIVED.is_set():
        click.echo("tpuanalyze: terminated", err=True)
        sys.exit(143)
    click.echo("tpuanalyze: interrupted", err=True)
    sys.exit(130)


def _one_line(text: str) -> str:
    """An error as one terminal line: control characters (newlines, escape codes) made visible."""
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


if __name__ == "__main__":
    main()
