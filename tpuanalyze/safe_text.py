"""Trace-derived text made safe for the terminal: one helper for every verb that prints.

Names in a trace (ops, runs, hosts, categories, notes, SQL results) are data, never markup or
terminal commands: ``[/x]`` would crash rich, ``[memory]`` vanish, ``[link=...]`` become a
hyperlink, and an escape code would drive the user's terminal. ``safe`` is for text rich parses
(str cells, titles, ``console.print``); ``plain`` for text printed as is (``click.echo``, rich
``Text`` objects): control characters shown as ``\\xNN`` escapes.
"""

from __future__ import annotations

import re
from typing import Any

from rich.markup import escape

# C0/C1 controls, DEL, line/paragraph separators, bidirectional overrides ("trojan source").
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def plain(value: Any) -> str:
    """``str(value)`` with control characters replaced by visible escapes."""
    text = value if isinstance(value, str) else str(value)
    return _CONTROL.sub(_visible, text)


def safe(value: Any) -> str:
    """``plain(value)`` with rich markup escaped: prints literally as a rich str renderable (a cell,
    a title) or before more text; never put a markup tag right after it (a trailing backslash
    would escape the tag: build such lines as ``rich.text.Text``)."""
    text = plain(value)
    body = text.rstrip("\\")
    return escape(body) + text[len(body):]


_JSON_CONTROL = re.compile("[\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def json_escape_controls(text: str) -> str:
    """JSON text with the controls ``json.dumps(ensure_ascii=False)`` leaves raw (DEL, C1, bidi)
    written as ``\\uXXXX`` escapes: the same JSON value, nothing a terminal acts on."""
    return _JSON_CONTROL.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
