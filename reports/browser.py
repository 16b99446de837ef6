"""Open a report in headless Chromium, offline: the rendered DOM (for checks) and screenshots (for docs).

No Python browser driver needed: Chromium's own ``--dump-dom`` prints the DOM after scripts ran
(``--virtual-time-budget`` lets every vega-embed promise settle), and the report's script writes its
render status (charts rendered, errors, CSP violations) into ``#render-status``, so console errors
are visible in the dumped DOM. The network is cut twice: a dead proxy and a resolver that resolves
nothing, on top of the report's own Content-Security-Policy.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")
OFFLINE_FLAGS = [
    "--headless",
    "--no-sandbox",  # root in containers/CI
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--hide-scrollbars",
    "--proxy-server=127.0.0.1:9",
    "--proxy-bypass-list=<-loopback>",
    "--host-resolver-rules=MAP * ~NOTFOUND",
]


def find_chromium() -> str | None:
    """The Chromium binary: $CHROMIUM, then the usual Debian paths, then PATH."""
    env = os.environ.get("CHROMIUM")
    if env and Path(env).exists():
        return env
    for candidate in CHROMIUM_CANDIDATES:
        if Path(candidate).exists():
            return candidate
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    chromium = find_chromium()
    if chromium is None:
        raise FileNotFoundError("no chromium binary found (apt-get install chromium)")
    with tempfile.TemporaryDirectory(prefix="tpuanalyze-chromium-") as profile:
        return subprocess.run(
            [chromium, *OFFLINE_FLAGS, f"--user-data-dir={profile}", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


@dataclass
class RenderedPage:
    dom: str
    status: dict  # the report's #render-status: charts, rendered, errors, warnings, done
    stderr: str

    def chart_containers(self) -> dict[str, str]:
        """Each chart container's id -> its rendered inner HTML (up to the next container)."""
        pieces = re.split(r'(<div class="chart[^"]*" id="[^"]+")', self.dom)
        found = {}
        for marker, body in zip(pieces[1::2], pieces[2::2], strict=False):
            chart_id = re.search(r'id="([^"]+)"', marker).group(1)
            found[chart_id] = body.split("</figure>", 1)[0]
        return found


def render(html_path: str | Path, budget_ms: int = 15000, timeout: float = 120,
           window: tuple[int, int] | None = None) -> RenderedPage:
    """Load the report, let its scripts run for ``budget_ms`` of virtual time, return the DOM.

    ``window`` (width, height) sets the browser window, e.g. a laptop's 1280 x 800; the page's
    status then tells whether it fits (``scrollWidth``)."""
    if not Path(html_path).is_file():
        raise FileNotFoundError(html_path)
    url = Path(html_path).resolve().as_uri()
    size = [f"--window-size={window[0]},{window[1]}"] if window else []
    proc = _run([*size, f"--virtual-time-budget={budget_ms}", "--dump-dom", url], timeout)
    if proc.returncode != 0 or not proc.stdout:
        raise RuntimeError(f"chromium failed ({proc.returncode}): {proc.stderr[-2000:]}")
    match = re.search(r'<pre id="render-status"[^>]*>(.*?)</pre>', proc.stdout, re.S)
    status = json.loads(html.unescape(match.group(1))) if match and match.group(1).strip() else {}
    return RenderedPage(dom=proc.stdout, status=status, stderr=proc.stderr)


def screenshot(
    html_path: str | Path,
    png_path: str | Path,
    width: int = 1400,
    height: int = 2400,
    budget_ms: int = 15000,
    timeout: float = 120,
) -> Path:
    """A PNG of the report's top ``height`` pixels at a laptop-to-desktop width."""
    if not Path(html_path).is_file():
        raise FileNotFoundError(html_path)
    png = Path(png_path).resolve()
    url = Path(html_path).resolve().as_uri()
    proc = _run(
        [f"--virtual-time-budget={budget_ms}", f"--window-size={width},{height}", f"--screenshot={png}", url],
        timeout,
    )
    if proc.returncode != 0 or not png.exists():
        raise RuntimeError(f"chromium screenshot failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return png


def main(argv: list[str] | None = None) -> int:
    """Usage: ``python -m tpuanalyze.reports.browser screenshot REPORT OUT.png [WIDTH HEIGHT]``
    or ``python -m tpuanalyze.reports.browser check REPORT``."""
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) >= 3 and args[0] == "screenshot":
        size = [int(v) for v in args[3:5]] or [1400, 2400]
        print(screenshot(args[1], args[2], *size))
        return 0
    if len(args) == 2 and args[0] == "check":
        page = render(args[1])
        print(json.dumps(page.status, indent=2))
        return 0 if page.status.get("done") and not page.status.get("errors") else 1
    print(main.__doc__)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
