"""The report of the committed samples in a real browser (headless Chromium): the answer on the first screen,
nothing past the page's width, no network. Skipped where no Chromium is installed (Debian: apt-get install chromium)."""

from __future__ import annotations

import pytest
from phasebench.bench.cli.main import main

from ..conftest import REPO
from . import browser as chromium

SAMPLES = sorted(p for p in (REPO / "analysis" / "sample").iterdir() if p.is_dir())
FIRST_SCREEN = 900  # px: what a 1400x900 window shows before any scrolling
BROWSER, NO_BROWSER = chromium.find_browser()
needs_browser = pytest.mark.skipif(BROWSER is None, reason=NO_BROWSER)


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """`phasebench report` of every committed sample, the phases sample included."""
    assert any((p / "phases.json").is_file() for p in SAMPLES), "the phases sample is committed"
    out = tmp_path_factory.mktemp("report")
    assert main(["report", *map(str, SAMPLES), "--out", str(out)]) == 0
    return out / "report.html"


def one_machine() -> list:
    """The phases sample and the samples measured on its machine in the same headline groups (device, mode, dtype,
    timer): one user's report of one host and setting (each other group adds a headline block, as a second host
    does)."""
    from phasebench.analysis import load

    group = ["device", "mode", "dtype", "timer"]
    phases = next(p for p in SAMPLES if (p / "phases.json").is_file())
    mine = set(map(tuple, load(phases / "ops")[group].drop_duplicates().to_numpy()))
    return [p for p in SAMPLES if p == phases or ((p / "results.csv").is_file() and set(
        map(tuple, load(p)[group].drop_duplicates().to_numpy())) <= mine)]


@pytest.fixture(scope="module")
def machine_page(tmp_path_factory):
    out = tmp_path_factory.mktemp("machine-report")
    assert main(["report", *map(str, one_machine()), "--out", str(out)]) == 0
    return out / "report.html"


@needs_browser
def test_the_first_screen_holds_the_headline_and_the_roofline(machine_page, tmp_path):
    from phasebench.analysis import load

    shot = chromium.screenshot(BROWSER, machine_page, tmp_path / "first-screen-1400x900.png", 1400, FIRST_SCREEN)
    assert chromium.png_size(shot) == (1400, FIRST_SCREEN)  # kept: the first screen, as a reader sees it
    print(f"first screen: {shot}")
    found = chromium.layout(BROWSER, machine_page, 1400)
    blocks = found["blocks"]
    # one block per device, mode, dtype and timer of the rows, and one for the phases folder: all on screen
    rows = load(*[p / "ops" if (p / "phases.json").is_file() else p for p in one_machine()])
    assert len(blocks) == len(rows[["device", "mode", "dtype", "timer"]].drop_duplicates()) + 1, found
    assert found["answer"]["top"] < 200 and all(block["bottom"] <= FIRST_SCREEN for block in blocks), found
    roof = found["roofline"]
    assert roof["natural"] > 0 and roof["top"] < 200 and roof["bottom"] <= FIRST_SCREEN, roof
    assert roof["width"] >= 400 and roof["left"] > found["answer"]["right"] - 1, roof  # beside the headline
    assert found["firstTable"]["top"] > FIRST_SCREEN  # the tables come after the figures


@needs_browser
@pytest.mark.parametrize("width", [1000, 1400, 1600])
def test_nothing_reaches_past_the_page_width_and_nothing_is_fetched(page, width):
    found = chromium.layout(BROWSER, page, width)
    assert found["width"] == width
    assert found["scrollWidth"] <= width and not found["overflowing"], found["overflowing"]
    assert all(name.startswith("data:") for name in found["resources"]), found["resources"]
    if width < 1180:  # one column: the roofline follows the headline at the column's width
        assert found["roofline"]["top"] >= found["answer"]["bottom"] - 1


@needs_browser
def test_at_1400_px_every_table_fits_the_page_without_scrolling(page):
    """Wide tables (the linear crossings: 23 columns) fold their one-value columns into a line and break their
    column names, so at 1400 px no element, in a scroll box or not, is wider than the page."""
    found = chromium.layout(BROWSER, page, 1400)
    assert found["tables"] >= 10, found["tables"]  # the sample's tables
    assert found["linearTable"]["right"] <= 1400, found["linearTable"]  # 2328 px wide before it folded
    assert not found["wide"], found["wide"]
    assert not found["scrolling"], found["scrolling"]


def test_the_page_names_nothing_outside_itself(page):
    text = page.read_text(encoding="utf-8")
    assert "<script" not in text and "http://" not in text and "https://" not in text
    assert 'src="data:image/png;base64,' in text
