"""Render reports in headless Chromium (Debian's ``chromium``): every figure loads, the page logs no errors."""

from __future__ import annotations

import shutil

import pytest

from stealkit.report import Figure, Section, image_grid, line_plot, render_report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium)")


def check_page(path, width: int = 1366, screenshot=None) -> dict:
    sync_api = pytest.importorskip("playwright.sync_api")
    errors: list[str] = []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run"],
        )
        page = browser.new_page(viewport={"width": width, "height": 800})
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("requestfailed", lambda r: errors.append(f"request failed: {r.url}"))
        page.goto(path.as_uri())
        page.wait_for_load_state("load")
        images = page.evaluate(
            "Array.from(document.images).map(i => ({ok: i.complete && i.naturalWidth > 0, w: i.naturalWidth}))"
        )
        overflow = page.evaluate("document.documentElement.scrollWidth > window.innerWidth + 1")
        # the text a reader sees: the raw config.json is folded away in <details>, so leave it out
        if screenshot is not None:
            page.screenshot(path=str(screenshot), full_page=True)
        text = page.evaluate("(() => { document.querySelectorAll('details').forEach(d => d.remove()); "
                             "return document.body.innerText; })()")
        browser.close()
    return {"errors": errors, "images": images, "overflow": overflow, "text": text}


@pytest.mark.slow
def test_report_renders_in_chromium(tmp_path):
    import numpy as np

    uri = line_plot({"a": ([1, 10, 100], [0.2, 0.5, 0.9])}, xlabel="queries", ylabel="accuracy", logx=True)
    grid = image_grid(np.random.default_rng(0).random((12, 1, 8, 8)))
    html = render_report("test", {"accuracy": 0.9}, [
        Section("Curve", paragraphs=["text"], tables=[("t", [{"queries": 1, "accuracy": 0.5}])],
                figures=[Figure(uri, "curve")]),
        Section("Samples", figures=[Figure(grid, "samples")]),
    ], config={"seed": 0})
    path = tmp_path / "report.html"
    path.write_text(html)
    result = check_page(path)
    assert result["errors"] == []
    assert len(result["images"]) == 2 and all(i["ok"] for i in result["images"])
    assert not result["overflow"]


@pytest.mark.slow
def test_broken_figure_is_detected(tmp_path):
    path = tmp_path / "bad.html"
    path.write_text("<html><body><img src='data:image/png;base64,AAAA'></body></html>")
    result = check_page(path)
    assert not all(i["ok"] for i in result["images"])
