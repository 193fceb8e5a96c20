"""The report's tables never break a word: the stylesheet's rules, and in headless Chromium (where installed) no
header wraps and no word of a header or a cell is split across lines, even on a narrow page."""

from __future__ import annotations

import re
import shutil

import pytest

from stealkit.report import Section, render_report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

#: the audit's headline table, as narrow pages squeeze it
ROWS = [
    {"answers": a, "attacker": att, "defence": d, "served accuracy": 0.973, "fidelity @50": 0.147,
     "fidelity @100": 0.331, "fidelity @200": 0.482, "Q90": "not reached within 200",
     "Q95": "not reached within 2,000", "fidelity @2000": 0.782}
    for a in ("label", "topk", "probs") for att in ("like", "unrelated", "data-free")
    for d in ("none", "round:decimals=2", "noise:sigma=0.05")
]


def _page() -> str:
    return render_report("tables", {"method": "audit", "victim_accuracy": 0.973, "queries": 8519},
                         [Section("Extraction risk", tables=[("", ROWS)])])


def _rules(page: str) -> dict[str, str]:
    css = re.search(r"<style>(.*?)</style>", page, re.S).group(1).replace("\n", "")
    return {sel.strip(): body for sel, body in re.findall(r"([^{}]+)\{([^}]*)\}", css)}


def test_the_stylesheet_keeps_words_whole_and_scrolls_wide_tables():
    rules = _rules(_page())
    cells = rules["th,td"]
    for rule in ("word-break:normal", "overflow-wrap:normal", "hyphens:none"):
        assert rule in cells
    assert "white-space:nowrap" in rules["th"]
    assert "overflow-x:auto" in rules[".tablewrap"]
    assert "anywhere" not in "".join(rules.values()) and "break-all" not in "".join(rules.values())
    assert "<div class='tablewrap'><table>" in _page()


_BROKEN = """() => {
  const lines = range => new Set(Array.from(range.getClientRects()).filter(r => r.width > 0)
                                  .map(r => Math.round(r.top))).size;
  const split = [];
  for (const cell of document.querySelectorAll('th, td')) {
    const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      for (const m of node.data.matchAll(/\\S+/g)) {
        const r = document.createRange();
        r.setStart(node, m.index);
        r.setEnd(node, m.index + m[0].length);
        if (lines(r) > 1) split.push(m[0]);
      }
    }
  }
  const wrapped = Array.from(document.querySelectorAll('th')).filter(th => {
    const r = document.createRange();
    r.selectNodeContents(th);
    return lines(r) > 1 || th.scrollWidth > th.clientWidth;
  }).map(th => th.textContent);
  const pageOverflows = document.documentElement.scrollWidth > window.innerWidth + 1;
  return {split, wrapped, pageOverflows, headers: document.querySelectorAll('th').length};
}"""


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium)")
@pytest.mark.parametrize("width", [600, 1000, 1366])
@pytest.mark.slow
def test_no_header_or_cell_breaks_inside_a_word_in_chromium(tmp_path, width):
    sync_api = pytest.importorskip("playwright.sync_api")
    path = tmp_path / "report.html"
    path.write_text(_page())
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run"])
        page = browser.new_page(viewport={"width": width, "height": 800})
        page.goto(path.as_uri())
        page.wait_for_load_state("load")
        result = page.evaluate(_BROKEN)
        browser.close()
    assert result["headers"] >= 10
    assert result["split"] == []  # e.g. "unrelate|d", "noise:sigma=0|.05"
    assert result["wrapped"] == []  # every header on one line
    assert not result["pageOverflows"]  # a wide table scrolls in its own box
