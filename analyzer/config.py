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


def _wrong_type(base: Mapping, override: Mapping, prefix: str = "") -> tuple[str, str] | None:
    """The first dotted key of ``override`` whose value is not of its default's kind (a number for a
    number, true/false for a flag, text for a pattern), with that kind."""
    for key, value in override.items():
        default, dotted = base[key], f"{prefix}{key}"
        if isinstance(default, dict):
            found = _wrong_type(default, value, f"{dotted}.")
            if found:
                return found
        elif isinstance(default, bool):
            if not isinstance(value, bool):
                return dotted, "true or false"
        elif isinstance(default, (int, float)):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                return dotted, "a number"
        elif isinstance(default, str) and not isinstance(value, str):
            return dotted, "text"
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
    wrong = _wrong_type(config, override)
    if wrong:
        raise TpuAnalyzeError(f"thresholds key {wrong[0]} must be {wrong[1]}", source)
    merged = _merge(copy.deepcopy(config), override)
    _check_patterns(override.get("patterns") or {}, merged, source)
    return merged


def _check_patterns(given: Mapping[str, Any], config: dict[str, Any], source: str | None) -> None:
    """The overridden patterns compile as DuckDB's regular expressions (RE2) and are strings: a bad one
    is the thresholds file's fault, said before any query runs, not an attribution stage failing."""
    import duckdb

    con = duckdb.connect()
    try:
        for name in given:
            pattern = config["patterns"][name]
            try:
                con.execute("SELECT regexp_matches('', ?)", [pattern]).fetchall()
            except duckdb.Error as exc:
                reason = str(exc).split(": ", 1)[-1]
                raise TpuAnalyzeError(f"thresholds patterns.{name} is not a valid regular expression "
                                      f"({reason})", source) from exc
    finally:
        con.close()
