"""Writing a verb's output files: checked before the work (a missing folder fails in a second, not
after a long analysis) and written with the reason on one line when the write fails (docs/report.md)."""

from __future__ import annotations

from pathlib import Path

from tpuanalyze.errors import TpuAnalyzeError


def check_output_paths(*targets: Path | str | None) -> None:
    """Each given output path's folder exists and the path is no folder ('-' is stdout)."""
    for target in targets:
        if target is None or str(target) == "-":
            continue
        path = Path(target)
        if not path.resolve().parent.is_dir():
            raise TpuAnalyzeError("cannot write here: no such directory", str(target))
        if path.is_dir():
            raise TpuAnalyzeError("cannot write here: a directory of that name exists", str(target))


def write_output(target: Path | str, text: str, what: str) -> None:
    """Write ``text`` to ``target``; an OS error (disk full, permissions) is one line naming the file."""
    try:
        Path(target).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise TpuAnalyzeError(f"cannot write the {what}: {exc.strerror or exc}", str(target)) from exc
