"""The pipeline's direction holds: `lint-imports` (import-linter) passes the contracts in pyproject.toml.

grimp, import-linter's import graph, reads one directory per package, while the folders install as
subpackages of ``tpuanalyze`` (pyproject package-dir). So the sources are laid out as the installed
package in a scratch folder first; the contracts then run on exactly the installed module names.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent


def _installed_layout(target: Path) -> None:
    """Copy each mapped folder's modules to where they install (store/ -> tpuanalyze/store/)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    for package, folder in config["tool"]["setuptools"]["package-dir"].items():
        source = ROOT / folder
        for file in source.rglob("*.py"):
            destination = target / package.replace(".", "/") / file.relative_to(source)
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(file, destination)
    shutil.copy2(ROOT / "pyproject.toml", target / "pyproject.toml")


def _lint_imports() -> str:
    beside = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    found = beside or shutil.which("lint-imports")
    if found is None:
        pytest.skip("import-linter is not installed (pip install 'tpuanalyze[test]')")
    return found


def test_lint_imports_passes(tmp_path: Path) -> None:
    lint = _lint_imports()
    _installed_layout(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    done = subprocess.run([lint, "--no-cache"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Contracts: 3 kept, 0 broken" in done.stdout, done.stdout


def test_a_reader_writing_the_database_breaks_the_contract(tmp_path: Path) -> None:
    """The check is real: a parser importing the store is reported."""
    lint = _lint_imports()
    _installed_layout(tmp_path)
    offender = tmp_path / "tpuanalyze" / "parsers" / "writes.py"
    offender.write_text("from tpuanalyze.store.database import connect  # noqa\n", encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    done = subprocess.run([lint, "--no-cache"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode != 0
    assert "tpuanalyze.parsers.writes -> tpuanalyze.store.database" in done.stdout, done.stdout
