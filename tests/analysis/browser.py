"""Headless Chromium for the report's browser test: find it, screenshot a page, and read the layout numbers a
small probe script measures in a copy of the page (the report itself holds no script)."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import tempfile
from pathlib import Path

NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-extensions",
         "--hide-scrollbars", "--mute-audio", "--host-resolver-rules=MAP * ~NOTFOUND")  # no name resolves: no network
TIMEOUT_S = 90

# Runs on load (images decoded): the rectangles of what the test asks about, in page coordinates, the elements
# that reach past the page's width outside a box that scrolls (`overflowing`) and anywhere (`wide`), the boxes
# whose content is wider than they are (`scrolling`), and every resource the page fetched.
PROBE = """<script>
window.addEventListener('load', () => {
  const box = el => { if (!el) return null; const r = el.getBoundingClientRect();
    return {top: r.top + scrollY, bottom: r.bottom + scrollY, left: r.left, right: r.right, width: r.width}; };
  const clipped = el => { for (let p = el.parentElement; p; p = p.parentElement) {
    if (['auto', 'scroll', 'hidden'].includes(getComputedStyle(p).overflowX)) return true; } return false; };
  const over = [...document.body.querySelectorAll('*')].filter(el => el.id !== 'layout-probe'
    && el.getBoundingClientRect().right > innerWidth + 1 && !clipped(el))
    .slice(0, 20).map(el => `${el.tagName.toLowerCase()}#${el.id}.${el.className} right=${
      Math.round(el.getBoundingClientRect().right)}`);
  const name = el => `${el.tagName.toLowerCase()}#${el.id}.${el.className} in #${(el.closest('section') || {}).id}`;
  const wide = [...document.body.querySelectorAll('*')].filter(el => el.id !== 'layout-probe'
    && el.getBoundingClientRect().right > innerWidth + 1)
    .slice(0, 20).map(el => `${name(el)} right=${Math.round(el.getBoundingClientRect().right)}`);
  const scrolling = [...document.body.querySelectorAll('*')].filter(el =>
    ['auto', 'scroll'].includes(getComputedStyle(el).overflowX) && el.scrollWidth > el.clientWidth + 1)
    .slice(0, 20).map(el => `${name(el)} ${el.scrollWidth}px in ${el.clientWidth}px`);
  const img = document.querySelector('#roofline img');
  const out = {width: innerWidth, scrollWidth: document.documentElement.scrollWidth,
    answer: box(document.querySelector('#headline .answer')),
    blocks: [...document.querySelectorAll('#headline .hl-block')].map(box),
    roofline: Object.assign(box(img) || {}, {natural: img ? img.naturalWidth : 0}),
    firstTable: box(document.querySelector('section:not(#headline) table')),
    overflowing: over, wide: wide, scrolling: scrolling, tables: document.querySelectorAll('table').length,
    linearTable: box(document.querySelector('#linear table')),
    resources: performance.getEntriesByType('resource').map(e => e.name.slice(0, 60))};
  const pre = document.createElement('pre'); pre.id = 'layout-probe';
  pre.textContent = JSON.stringify(out); document.body.appendChild(pre);
});
</script>"""


def find_browser() -> tuple[str | None, str]:
    """(PHASEBENCH_CHROMIUM, else the first Chromium or Chrome on the PATH, "") when it starts; else (None, why)."""
    chosen = os.environ.get("PHASEBENCH_CHROMIUM") or next((p for name in NAMES if (p := shutil.which(name))), None)
    if chosen is None:
        return None, "no Chromium or Chrome on the PATH (Debian: apt-get install chromium; or set PHASEBENCH_CHROMIUM)"
    try:
        proc = subprocess.run([chosen, "--version"], capture_output=True, text=True, timeout=30,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as err:
        return None, f"{chosen} does not start: {err}"
    if proc.returncode != 0:  # a half-installed package, say
        return None, f"{chosen} --version exited {proc.returncode}: {(proc.stderr or proc.stdout)[-300:]}"
    return chosen, ""


def _run(browser: str, *args: str) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="phasebench-chromium-") as profile:
        proc = subprocess.run([browser, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True,
                              text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise RuntimeError(f"{browser} exited {proc.returncode}: {proc.stderr[-1500:]}")
    return proc


def screenshot(browser: str, page: Path, png: Path, width: int, height: int) -> Path:
    """The first `height` pixels of the page at `width` as a PNG."""
    _run(browser, f"--window-size={width},{height}", f"--screenshot={png}", page.resolve().as_uri())
    return png


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()[:24]
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


def layout(browser: str, page: Path, width: int, height: int = 900) -> dict:
    """The probe's numbers for `page` rendered at `width` (a probed copy is written beside it)."""
    text = page.read_text(encoding="utf-8")
    assert "</body>" in text
    probed = page.with_name(f"{page.stem}.probe-{width}.html")
    probed.write_text(text.replace("</body>", PROBE + "</body>"), encoding="utf-8")
    dom = _run(browser, f"--window-size={width},{height}", "--dump-dom", probed.resolve().as_uri()).stdout
    found = re.search(r'<pre id="layout-probe">(.*?)</pre>', dom, re.S)
    assert found, f"the probe wrote nothing; the DOM ends: {dom[-500:]}"
    return json.loads(found.group(1).replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">")
                      .replace("&amp;", "&"))
