"""Screenshot a report.html in headless Chromium (Debian's ``chromium``, driven by playwright) for the docs.

    python tools/screenshot_report.py runs/audit/report.html docs/img/audit-report.png --height 2400

The page is rendered at ``--width`` CSS pixels, cut at ``--height`` (the top of a long report: its headline), and
saved as an adaptive-palette PNG (``--colours``) so a docs image stays small; the script prints the file's size.
"""

from __future__ import annotations

import argparse
import io
import shutil
import tempfile
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("report", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--width", type=int, default=1280)
    ap.add_argument("--height", type=int, default=2400, help="cut the page here (CSS pixels; 0: the whole page)")
    ap.add_argument("--colours", type=int, default=128, help="palette size of the saved PNG")
    args = ap.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("error: needs Debian's chromium (apt-get install chromium)")
    from PIL import Image
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu",
                                                                    "--disable-background-networking",
                                                                    "--disable-component-update", "--no-first-run"])
        page = browser.new_page(viewport={"width": args.width, "height": 800})
        page.goto(args.report.resolve().as_uri())
        page.wait_for_load_state("load")
        full = page.evaluate("document.documentElement.scrollHeight")
        height = min(full, args.height) if args.height else full
        png = page.screenshot(full_page=True, clip={"x": 0, "y": 0, "width": args.width, "height": height})
        browser.close()
    image = Image.open(io.BytesIO(png)).convert("RGB").quantize(colors=args.colours, dither=Image.Dither.NONE)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=args.out.parent, suffix=".png", delete=False) as tmp:
        image.save(tmp, format="PNG", optimize=True)
    Path(tmp.name).replace(args.out)
    print(f"{args.out}: {args.width}x{height} of a {full}-pixel page, {args.out.stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
