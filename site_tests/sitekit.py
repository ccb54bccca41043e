"""Shared code of the browser tests of the built website (``make test-site``).

The built site (``_build/html``, or ``$SITE_HTML``) is served on 127.0.0.1 from a thread, and
headless Chromium (``/usr/bin/chromium``, or ``$CHROMIUM``) opens every page of the table of
contents (``_toc.yml``, or ``$SITE_TOC``). Every request that would leave 127.0.0.1 is blocked
and recorded, so a passing run proves the site reads correctly with no network.
"""

from __future__ import annotations

import functools
import http.server
import os
import re
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlparse

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from toc import _walk  # noqa: E402

SITE = Path(os.environ.get("SITE_HTML", ROOT / "_build" / "html")).resolve()
TOC = Path(os.environ.get("SITE_TOC", ROOT / "_toc.yml")).resolve()
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
SCREENSHOTS = Path(os.environ.get("SITE_SCREENSHOTS", ROOT / "_build" / "screenshots")).resolve()
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--no-first-run", "--disable-sync", "--disable-quic",
]
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))


@dataclass(frozen=True)
class TocPage:
    """One page of the table of contents: ``source`` relative to the repository root."""

    source: Path

    @property
    def is_notebook(self) -> bool:
        return self.source.suffix == ".ipynb"

    @property
    def url_path(self) -> str:
        return self.source.with_suffix(".html").as_posix()

    def __str__(self) -> str:
        return self.source.with_suffix("").as_posix()


def toc_pages() -> list[TocPage]:
    """Every page listed in the table of contents, in order."""
    toc = yaml.safe_load(TOC.read_text(encoding="utf-8"))
    pages = []
    for entry in _walk(toc):
        matches = [p for p in (ROOT / f"{entry}.ipynb", ROOT / f"{entry}.md") if p.is_file()]
        if not matches:
            raise FileNotFoundError(f"{TOC.name} lists {entry!r} but no such page exists")
        pages.append(TocPage(matches[0].relative_to(ROOT)))
    return pages


PAGES = toc_pages()
NOTEBOOK_PAGES = [p for p in PAGES if p.is_notebook]


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        pass


@pytest.fixture(scope="session")
def base_url() -> Iterator[str]:
    if not (SITE / "index.html").is_file():
        pytest.exit(f"no built site at {SITE}: run `make book` first (make test-site does)", returncode=1)
    REPORT.unlink(missing_ok=True)  # this run's measurements only
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(SITE)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).is_file():
        pytest.exit(f"Chromium not found at {CHROMIUM} (apt-get install chromium, or set CHROMIUM)", returncode=1)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@dataclass
class Visit:
    """A page opened in the browser, with everything it reported."""

    page: Any
    url: str
    errors: list[str] = field(default_factory=list)  # console errors and uncaught exceptions
    blocked: list[str] = field(default_factory=list)  # requests that tried to leave 127.0.0.1
    failed: list[str] = field(default_factory=list)  # local requests that failed or returned >= 400


def _where(stack: str | None) -> str:
    """`` @ URL:LINE:COL`` of the innermost stack frame that has a location, or ``""``."""
    match = re.search(r"\(?(https?://[^\s()]+:\d+:\d+)\)?", stack or "")
    return f" @ {match.group(1)}" if match else ""


def open_page(browser: Any, url: str, *, width: int = 1280, height: int = 900, touch: bool = False) -> Visit:
    """Open ``url`` with all non-local requests blocked; wait until MathJax (if any) is done.

    ``touch``: a touch screen (a phone or tablet), so that the test can tap as its reader does."""
    context = browser.new_context(viewport={"width": width, "height": height}, service_workers="block",
                                  has_touch=touch, is_mobile=touch and width < 600)
    # Generous timeouts: a waiting test only fails later, never passes wrongly, and a loaded
    # two-core CI machine can take many seconds to lay out a long chapter.
    context.set_default_timeout(60_000)
    context.set_default_navigation_timeout(120_000)
    page = context.new_page()
    visit = Visit(page, url)

    def route(r: Any) -> None:
        host = urlparse(r.request.url).hostname
        if r.request.url.startswith(("data:", "blob:")) or host == "127.0.0.1":
            r.continue_()
        else:
            visit.blocked.append(f"{r.request.resource_type} {r.request.url}")
            r.abort("blockedbyclient")

    context.route("**/*", route)
    page.on("console", lambda m: visit.errors.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: visit.errors.append(f"uncaught: {e.message}" + _where(e.stack)))
    page.on("requestfailed", lambda r: visit.failed.append(f"{r.url} ({r.failure})")
            if urlparse(r.url).hostname == "127.0.0.1" else None)
    page.on("response", lambda r: visit.failed.append(f"{r.url} (HTTP {r.status})")
            if r.status >= 400 and urlparse(r.url).hostname == "127.0.0.1" else None)
    response = page.goto(url, wait_until="load")
    assert response is not None and response.ok, f"{url} answered {response.status if response else 'nothing'}"
    # tex-chtml.js is a deferred script, so it has run by the load event; wait for its first typeset.
    page.evaluate("async () => { const mj = window.MathJax;"
                  " if (mj && mj.startup && mj.startup.promise) await mj.startup.promise; }")
    page.evaluate("() => document.fonts.ready.then(() => true)")
    return visit


#: Console messages that are known to be harmless, each with the reason. Keep it short.
#: An entry (pattern, reason, marker): the error matches ``pattern``; when ``marker`` is given, the
#: error must also have been thrown on a line of the page's HTML that contains ``marker``.
ALLOWED_CONSOLE_ERRORS: list[tuple[str, str, str | None]] = []


# --- Accessibility (axe-core) -------------------------------------------------------------------

#: axe-core, installed from the npm registry by ``make test-site`` (``npm ci``; pinned in package.json).
AXE = ROOT / "node_modules" / "axe-core" / "axe.min.js"
#: The rules checked: WCAG 2.0/2.1 A and AA, plus axe's best practices.
AXE_TAGS = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "best-practice"]
#: Impacts that fail a page. Moderate and minor findings are reported, not failed.
AXE_FAILING = ("critical", "serious")
#: The one list of axe rules that cannot be fixed in this book, each with the reason and the
#: upstream issue. A rule listed here is not run. Empty: every critical and serious finding,
#: whatever its origin (the book, the theme), is fixed.
AXE_EXEMPT: dict[str, str] = {}


def run_axe(page: Any, selector: str | None = None) -> list[dict[str, Any]]:
    """axe-core's violations on the page (or inside ``selector``): ``id``, ``impact``, ``nodes``, ``help``."""
    if not page.evaluate("() => typeof window.axe !== 'undefined'"):
        if not AXE.is_file():
            pytest.exit(f"axe-core is not installed ({AXE}): run `npm ci` (make test-site does)", returncode=1)
        page.add_script_tag(path=str(AXE))
    options = {"runOnly": {"type": "tag", "values": AXE_TAGS},
               "rules": {rule: {"enabled": False} for rule in AXE_EXEMPT}}
    return page.evaluate(
        """async ([selector, options]) => {
          const r = await axe.run(selector ? document.querySelector(selector) : document, options);
          return r.violations.map(v => ({id: v.id, impact: v.impact, help: v.help,
            nodes: v.nodes.map(n => n.target.join(' ') + ' :: ' + (n.failureSummary || '').split(String.fromCharCode(10)).slice(1, 2).join('').trim())}));
        }""",
        [selector, options],
    )


def failing(violations: list[dict[str, Any]]) -> list[str]:
    """One line per critical or serious violation node."""
    return [f"{v['impact']} {v['id']} ({v['help']}): {n}" for v in violations if v["impact"] in AXE_FAILING for n in v["nodes"]]


def set_mode(page: Any, mode: str) -> None:
    """Switch the theme to ``light`` or ``dark`` the way its colour-mode button does (and without
    CSS transitions, so colours are final when axe reads them)."""
    page.evaluate(
        """mode => {
          if (!document.getElementById('attnbook-no-transitions')) {
            const s = document.createElement('style'); s.id = 'attnbook-no-transitions';
            s.textContent = '*, *::before, *::after { transition: none !important; animation: none !important; }';
            document.head.appendChild(s);
          }
          document.documentElement.dataset.mode = mode; document.documentElement.dataset.theme = mode;
          localStorage.setItem('mode', mode); localStorage.setItem('theme', mode);
        }""",
        mode,
    )


#: Where the site tests write what they measured (page weights, axe counts) for the README.
REPORT = Path(os.environ.get("SITE_REPORT", ROOT / "_build" / "site-report.json")).resolve()


def record(page: str, **values: Any) -> None:
    """Merge ``values`` into the report's entry for ``page``."""
    import json

    data = json.loads(REPORT.read_text(encoding="utf-8")) if REPORT.is_file() else {}
    data.setdefault(page, {}).update(values)
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def _thrown_on_line_with(error: str, marker: str) -> bool:
    match = re.search(r" @ (https?://[^\s]+?):(\d+):\d+$", error)
    if not match:
        return False
    path = SITE / urlparse(match.group(1)).path.lstrip("/")
    if not path.is_file():
        return False
    lines = path.read_text(encoding="utf-8").splitlines()
    line = int(match.group(2))
    return 0 < line <= len(lines) and marker in lines[line - 1]


def unexpected_errors(errors: list[str]) -> list[str]:
    """The errors not covered by :data:`ALLOWED_CONSOLE_ERRORS`."""
    return [
        e for e in errors
        if not any(re.search(pattern, e) and (marker is None or _thrown_on_line_with(e, marker))
                   for pattern, _why, marker in ALLOWED_CONSOLE_ERRORS)
    ]
