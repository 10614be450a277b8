"""The docs site in a real browser: no code block cuts its text, every error's Hint shows without
scrolling, and argparse's help is wrapped once (issue #27 item 7).

The site is built once (`mkdocs build --strict`), served from its directory on 127.0.0.1, and each
page that shows errors or long commands is opened in headless Chromium at three widths: Material's
three-column layout (1280 px), its narrowest two-column one (960 px) and a phone's (412 px). All
assertions read the DOM; the screenshots (one per page and width, in a temporary directory named in
each failure) are for a human only. Chromium and its WebDriver are Debian's, installed by
tests/harness/setup.sh; selenium comes with the `test` extra.
"""

from __future__ import annotations

import functools
import http.server
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import scrubbed_environ
from tests.meta.test_docs import hooks

pytestmark = pytest.mark.slow  # out of a bare pytest's fast lane (tests/conftest.py)

REPO = Path(__file__).resolve().parents[2]

# The pages that show distenv's errors and long commands. Each of the first four holds at least
# one "Hint:" in a code block (asserted, so that the test cannot pass on a page that lost them).
PAGES_WITH_HINTS = ("errors", "troubleshooting", "start/slurm", "start/mpi")
PAGES = (*PAGES_WITH_HINTS, "cli")
WIDTHS = (1280, 960, 412)
HEIGHT = 900

# One pass over a page's code blocks, in the browser. For each block: its language classes, its
# text, whether it is shown at all, the code element's and the pre's sizes and overflow, how many
# lines it shows (its height over one line's), whether a line of arguments[0] characters fits its
# width, and each "Hint: ..." (to the end of its line) with whether all of it lies in the visible
# part of the code element and of every ancestor that clips (overflow other than visible), without
# scrolling.
FACTS_JS = r"""
const SLACK = 0.5;
function clipBox(el) {
  const r = el.getBoundingClientRect();
  const left = r.left + el.clientLeft, top = r.top + el.clientTop;
  return {left: left, right: left + el.clientWidth, top: top, bottom: top + el.clientHeight};
}
function inside(rect, box) {
  return rect.left >= box.left - SLACK && rect.right <= box.right + SLACK &&
         rect.top >= box.top - SLACK && rect.bottom <= box.bottom + SLACK;
}
function clippers(code) {
  const found = [code];
  for (let el = code.parentElement; el && el !== document.body; el = el.parentElement) {
    if (getComputedStyle(el).overflowX !== 'visible') found.push(el);
  }
  return found;
}
function hints(code) {
  const out = [];
  const walker = document.createTreeWalker(code, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const text = node.textContent;
    for (let at = text.indexOf('Hint:'); at >= 0; at = text.indexOf('Hint:', at + 1)) {
      const nl = text.indexOf('\n', at);
      const end = nl < 0 ? text.length : nl;
      const range = document.createRange();
      range.setStart(node, at);
      range.setEnd(node, end);
      const rects = Array.from(range.getClientRects()).filter(r => r.width > 0);
      const boxes = clippers(code).map(clipBox);
      const outside = rects.filter(r => !boxes.every(b => inside(r, b)));
      out.push({text: text.slice(at, Math.min(end, at + 60)), rects: rects.length,
                outside: outside.map(r => [Math.round(r.left), Math.round(r.right)])});
    }
  }
  return out;
}
function lineHeight(code) {
  const probe = document.createElement('span');
  probe.textContent = 'x';
  probe.style.whiteSpace = 'pre';
  probe.style.display = 'block';  // a block's height is the line's, an inline's its font's
  code.appendChild(probe);
  const height = probe.getBoundingClientRect().height;
  probe.remove();
  return height;
}
function columns(code, count) {
  const probe = document.createElement('span');
  probe.textContent = 'x'.repeat(count);
  probe.style.whiteSpace = 'pre';
  probe.style.display = 'inline-block';
  code.appendChild(probe);
  const width = probe.getBoundingClientRect().width;
  probe.remove();
  const s = getComputedStyle(code);
  return width <= code.clientWidth - parseFloat(s.paddingLeft) - parseFloat(s.paddingRight) + SLACK;
}
return Array.from(document.querySelectorAll('.md-content pre')).map(pre => {
  const code = pre.querySelector(':scope > code') || pre;
  const cs = getComputedStyle(code), ps = getComputedStyle(pre);
  // The text's height: less the padding, the borders and a horizontal scroll bar.
  const inner = code.getBoundingClientRect().height - parseFloat(cs.paddingTop) -
                parseFloat(cs.paddingBottom) - (code.offsetHeight - code.clientHeight);
  return {
    classes: pre.parentElement.className,
    text: code.textContent,
    shown: code.getClientRects().length > 0,
    code: {scroll: code.scrollWidth, client: code.clientWidth, overflow: cs.overflowX,
           whiteSpace: cs.whiteSpace},
    pre: {scroll: pre.scrollWidth, client: pre.clientWidth, overflow: ps.overflowX},
    renderedLines: Math.round(inner / lineHeight(code)),
    helpFits: columns(code, arguments[0]),
    hints: hints(code),
  };
});
"""

SHOW_JS = r"""
const blocks = Array.from(document.querySelectorAll('.md-content pre'));
const first = blocks.find(b => b.textContent.includes('Hint:')) || blocks[0];
first.scrollIntoView({block: 'center'});
"""


@dataclass(frozen=True)
class Page:
    """What the browser measured of one page at one width."""

    name: str
    width: int
    blocks: list[dict[str, Any]]
    screenshot: Path

    def where(self, block: dict[str, Any]) -> str:
        first = block["text"].strip().splitlines()[0][:70] if block["text"].strip() else ""
        return f"{self.name} at {self.width} px, block {first!r} (screenshot {self.screenshot})"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build the site once, as tests/run.sh does (strict)."""
    out = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(out)],
        cwd=REPO,
        env={**scrubbed_environ(), "NO_MKDOCS_2_WARNING": "1"},
        check=True,
        timeout=120,
    )
    return out


@pytest.fixture(scope="module")
def base_url(site: Path) -> Iterator[str]:
    """Serve the built site on 127.0.0.1 (a free port) for the module's tests."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(site))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        yield f"http://127.0.0.1:{server.server_address[1]}"
        server.shutdown()
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Chromium through Debian's chromedriver (no Selenium Manager, no network)."""
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium: the test extra")
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver is None:
        pytest.skip("chromium and chromium-driver missing: run tests/harness/setup.sh")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    # --no-sandbox: Chromium's sandbox refuses to run as root, as the test set-up runs.
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(arg)
    options.add_argument(f"--window-size={WIDTHS[0]},{HEIGHT}")
    chrome = webdriver.Chrome(service=webdriver.ChromeService(driver), options=options)
    chrome.set_page_load_timeout(30)
    try:
        yield chrome
    finally:
        chrome.quit()


@pytest.fixture(scope="module")
def measure(browser: Any, base_url: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Return a function that measures a page at a width, each page and width loaded once."""
    shots = tmp_path_factory.mktemp("docs-screenshots")
    seen: dict[tuple[str, int], Page] = {}

    def page(name: str, width: int) -> Page:
        if (name, width) not in seen:
            browser.set_window_size(width, HEIGHT)
            browser.get(f"{base_url}/{name}/")
            inner = browser.execute_script("return window.innerWidth")
            assert inner == width, f"window is {inner} px wide, not {width}"
            blocks = browser.execute_script(FACTS_JS, hooks.HELP_WIDTH)
            assert blocks, f"{name}: no code block found at {width} px"
            # The viewport, at the first block with a Hint (else the first block): a full-page
            # capture costs about 0.6 s a page.
            browser.execute_script(SHOW_JS)
            shot = shots / f"{name.replace('/', '_')}-{width}.png"
            browser.save_screenshot(str(shot))
            seen[name, width] = Page(name, width, blocks, shot)
        return seen[name, width]

    return page


PAGE_WIDTHS = [pytest.param(p, w, id=f"{p}-{w}") for p in PAGES for w in WIDTHS]


@pytest.mark.parametrize(("name", "width"), PAGE_WIDTHS)
def test_code_blocks_fit_or_scroll(measure: Any, name: str, width: int) -> None:
    """Each code block, and the pre around it, fits its box or scrolls: none cuts its text."""
    page = measure(name, width)
    for block in page.blocks:
        for part in ("code", "pre"):
            box = block[part]
            assert box["scroll"] <= box["client"] or box["overflow"] in ("auto", "scroll"), (
                f"{page.where(block)}: the {part} is cut ({box})"
            )


@pytest.mark.parametrize(("name", "width"), PAGE_WIDTHS)
def test_every_hint_shows_without_scrolling(measure: Any, name: str, width: int) -> None:
    """Every "Hint: ..." in a code block is shown whole, up to its line's end, inside the
    block's visible part (and of each ancestor that clips), without scrolling."""
    page = measure(name, width)
    hints = [(block, hint) for block in page.blocks for hint in block["hints"]]
    if name in PAGES_WITH_HINTS:
        assert hints, f"{name}: no Hint in any code block"
    for block, hint in hints:
        assert block["shown"], f"{page.where(block)}: the block is not shown"
        assert hint["rects"], f"{page.where(block)}: {hint['text']!r} not shown"
        assert not hint["outside"], (
            f"{page.where(block)}: {hint['text']!r} is cut: its boxes {hint['outside']} lie "
            f"outside the visible part ({block['code']})"
        )


def test_slurm_headline_error_wraps(measure: Any) -> None:
    """The Slurm page's first error, a console session (sbatch's batch script refused), wraps
    at the desktop width: its line is longer than the block."""
    page = measure("start/slurm", WIDTHS[0])
    (block,) = [b for b in page.blocks if "$ sbatch -n 4 --wrap 'distenv info'" in b["text"]]
    assert "language-console" in block["classes"], block["classes"]
    assert block["code"]["whiteSpace"] == "pre-wrap", page.where(block)
    assert block["renderedLines"] > len(block["text"].rstrip("\n").splitlines()), page.where(block)
    assert block["hints"], page.where(block)


@pytest.mark.parametrize("width", WIDTHS)
def test_cli_help_is_wrapped_once(measure: Any, width: int) -> None:
    """argparse's help blocks are not wrapped again by the browser: each shows as many lines as
    argparse wrote; where the site has a desktop layout, a line of HELP_WIDTH characters fits."""
    page = measure("cli", width)
    helps = [b for b in page.blocks if "cli-help" in b["classes"]]
    assert len(helps) == 1 + len(hooks.subcommands()), [b["classes"] for b in page.blocks]
    for block in helps:
        assert block["text"].startswith("usage: distenv"), page.where(block)
        lines = len(block["text"].rstrip("\n").splitlines())
        assert block["renderedLines"] == lines, (
            f"{page.where(block)}: {lines} lines shown as {block['renderedLines']}"
        )
        if width >= 960:
            assert block["helpFits"], f"{page.where(block)}: {hooks.HELP_WIDTH} columns do not fit"
