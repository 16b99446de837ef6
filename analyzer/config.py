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


def load_thresholds(override: Mapping[str, Any] | str | Path | None = None) -> dict[str, Any]:
    """Defaults from thresholds.toml, deep-merged with a dict or a TOML file of the same shape."""
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
    return _merge(copy.deepcopy(config), override)
