"""The README and every verb's --help, run as a newcomer would: from a fresh clone, nothing beside it.

The repository's HEAD is cloned into a temporary folder that holds nothing else (no ../shared), the
clone's own code is put on a fresh interpreter (its ``pyproject.toml`` package-dir mapping, the
dependencies of the running interpreter), and then the quick start, every example line of the
README and every example of every verb's ``--help`` run in the clone with the shell. Each must
exit 0; ``compare --fail-if-slower`` may exit 1 (it is a gate and says so on stderr).
"""

from __future__ import annotations

import os
import re
import shutil
import site as site_module
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PROJECT_ROOT

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

pytestmark = pytest.mark.slow

# Installs the clone's packages the way setuptools' package-dir does (tpuanalyze.parsers -> parsers/),
# without building a wheel: a meta-path finder read from the clone's own pyproject.toml.
FINDER = '''
import importlib.abc, importlib.util, sys
try:
    import tomllib
except ModuleNotFoundError:
    import tomli as tomllib
from pathlib import Path
ROOT = Path({root!r})
MAPPING = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
class CloneFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        folder = MAPPING.get(name)
        if folder is None:
            return None
        init = ROOT / folder / "__init__.py"
        return importlib.util.spec_from_file_location(
            name, init, submodule_search_locations=[str(init.parent)])
sys.meta_path.insert(0, CloneFinder())
'''


def _install_clone(clone: Path, venv: Path) -> Path:
    """A venv whose python imports tpuanalyze from the clone only; returns its bin folder."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()
    site = Path(purelib)
    # The dependencies come from this interpreter's site-packages as plain path entries: their own .pth
    # files (among them the editable install of the working tree) are not processed there.
    (site / "deps.pth").write_text("".join(f"{p}\n" for p in site_module.getsitepackages()))
    (site / "clone_finder.py").write_text(FINDER.format(root=str(clone)))
    (site / "clone_finder.pth").write_text("import clone_finder\n")
    scripts = tomllib.loads((clone / "pyproject.toml").read_text())["project"]["scripts"]
    for name, target in scripts.items():
        module, func = target.split(":")
        script = venv / "bin" / name
        script.write_text(f"#!{python}\nimport sys\nfrom {module} import {func}\nsys.exit({func}())\n")
        script.chmod(0o755)
    return venv / "bin"


def readme_commands(readme: str) -> list[str]:
    """The indented command lines of the README: the quick start (after its pip install) and examples.

    The test-suite line (``pip install -e '.[test]' && python -m pytest``) is this test's own caller,
    so it is the one line left out."""
    commands = []
    for line in readme.splitlines():
        if not line.startswith("    "):
            continue
        text = line.strip()
        if text.startswith("pip install -e . && "):
            text = text.removeprefix("pip install -e . && ")
        if text.startswith("tpuanalyze "):
            commands.append(text)
    return commands


def help_examples(help_text: str) -> list[str]:
    """The command lines under a help text's 'Examples' heading."""
    lines = help_text.splitlines()
    out, inside = [], False
    for line in lines:
        if re.match(r"\s*Examples\b", line):
            inside = True
            continue
        if inside:
            text = line.strip()
            if text.startswith("tpuanalyze "):
                out.append(text)
            elif not text or not line.startswith("    "):
                inside = False
    return out


def _run(command: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=240)


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    head = subprocess.run(["git", "-C", str(PROJECT_ROOT), "rev-parse", "HEAD"], capture_output=True,
                          text=True)
    if head.returncode:
        pytest.skip(f"{PROJECT_ROOT} is not a git checkout")
    alone = tmp_path_factory.mktemp("alone")  # the clone's parent holds the clone only
    repo = alone / "tpuanalyze"
    subprocess.run(["git", "clone", "-q", str(PROJECT_ROOT), str(repo)], check=True)
    assert sorted(p.name for p in alone.iterdir()) == ["tpuanalyze"]
    bin_dir = _install_clone(repo, tmp_path_factory.mktemp("venv") / "venv")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", COLUMNS="100", NO_COLOR="1")
    found = _run("python -c 'import tpuanalyze.reports.html as m; print(m.__file__)'", repo, env)
    assert found.stdout.strip().startswith(str(repo)), found.stdout + found.stderr
    return repo, env


def _check(command: str, result: subprocess.CompletedProcess) -> None:
    gate = " compare " in f" {command} " and "--fail-if-slower" in command
    allowed = {0, 1} if gate else {0}
    assert result.returncode in allowed, (
        f"`{command}` exited {result.returncode}\nstdout:\n{result.stdout[-2000:]}\n"
        f"stderr:\n{result.stderr[-2000:]}"
    )
    if result.returncode == 1:
        assert "slower than A" in result.stderr
    assert "Traceback" not in result.stderr, result.stderr


def test_readme_and_help_examples_run_from_a_fresh_clone(clone):
    repo, env = clone
    readme = readme_commands((repo / "README.md").read_text(encoding="utf-8"))
    assert len(readme) >= 8, readme  # quick start + the things to try
    verbs_help = _run("tpuanalyze --help", repo, env)
    assert verbs_help.returncode == 0, verbs_help.stderr
    verbs = re.findall(r"^  (\w+)\s", verbs_help.stdout.split("Commands:")[1], re.MULTILINE)
    assert {"ingest", "sql", "report", "scaling", "compare", "mlperf", "generate"} <= set(verbs)
    examples: dict[str, list[str]] = {}
    for verb in verbs:
        text = _run(f"tpuanalyze {verb} --help", repo, env)
        assert text.returncode == 0, text.stderr
        examples[verb] = help_examples(text.stdout)
        assert examples[verb], f"`tpuanalyze {verb} --help` has no example"
        assert all(e.startswith(f"tpuanalyze {verb} ") or e.startswith("tpuanalyze ingest ")
                   for e in examples[verb]), examples[verb]
    done: set[str] = set()
    for command in [*readme, *[e for verb in verbs for e in examples[verb]]]:
        assert "../" not in command, f"`{command}` reaches outside the clone"
        if command in done:
            continue
        done.add(command)
        _check(command, _run(command, repo, env))
    # what the examples promise to write is there
    for written in ("report.html", "demo.duckdb", "report.json", "scaling.html", "runs.html", "mlperf.json"):
        assert (repo / written).stat().st_size > 0, written


def test_sql_help_names_the_relations(clone):
    repo, env = clone
    text = _run("tpuanalyze sql --help", repo, env).stdout
    for relation in ("runs", "planes", "lines", "events", "step_breakdown", "device_breakdown",
                     "collective_time", "op_steps", "mlperf_results"):
        assert re.search(rf"\b{relation}\b", text), relation


def test_help_examples_parse_the_examples_block():
    text = "Usage: x\n\n  Examples:\n    tpuanalyze a b\n    tpuanalyze c\n\nOptions:\n  --x\n"
    assert help_examples(text) == ["tpuanalyze a b", "tpuanalyze c"]
    assert readme_commands("    pip install -e . && tpuanalyze r x\n    tpuanalyze s\n  tpuanalyze no\n") == [
        "tpuanalyze r x", "tpuanalyze s"]
