"""Analyzer thresholds and name patterns: one documented TOML file, overridable per call."""

from __future__ import annotations

import copy
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tpuanalyze.errors import TpuAnalyzeError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 (dependency tomli, see pyproject)
    import tomli as tomllib

DEFAULT_THRESHOLDS_PATH = Path(__file__).with_name("thresholds.toml")


def _merge(base: dict, override: Mapping) -> dict:
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value
    return base


def _unknown_key(base: Mapping, override: Mapping, prefix: str = "") -> str | None:
    """The first dotted key of ``override`` that thresholds.toml does not have (a typo would otherwise
    be ignored silently and the default used)."""
    for key, value in override.items():
        dotted = f"{prefix}{key}"
        if key not in base:
            return dotted
        if isinstance(base[key], dict):
            if not isinstance(value, Mapping):
                return dotted
            found = _unknown_key(base[key], value, f"{dotted}.")
            if found:
                return found
    return None


def load_thresholds(override: Mapping[str, Any] | str | Path | None = None) -> dict[str, Any]:
    """Defaults from thresholds.toml, deep-merged with a dict or a TOML file of the same shape. A key the
    defaults do not have is an error (TpuAnalyzeError naming the file and the key)."""
    with DEFAULT_THRESHOLDS_PATH.open("rb") as fh:
        config = tomllib.load(fh)
    if override is None:
        return config
    if isinstance(override, (str, Path)):
        path = Path(override)
        try:
            with path.open("rb") as fh:
                override = tomllib.load(fh)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise TpuAnalyzeError(f"cannot read thresholds: {exc}", str(path)) from exc
        source = str(path)
    else:
        source = None
    unknown = _unknown_key(config, override)
    if unknown:
        raise TpuAnalyzeError(f"unknown thresholds key '{unknown}' (not in analyzer/thresholds.toml)", source)
    return _merge(copy.deepcopy(config), override)
