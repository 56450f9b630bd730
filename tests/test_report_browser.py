"""`hpc report --html`'s page as a person sees it: drawn by a real headless Chromium (Debian's; the `chromium`
fixture installs it where it is missing), the screenshot's pixels checked. The page's content and arithmetic are
tested without a browser in tests/unit/test_report.py."""

import subprocess

from hpc.cluster import report_html
from tests.unit.test_report import _report, attempts  # noqa: F401 - the fixture, shared


def test_the_page_in_a_real_browser_shows_both_attempts_in_their_colours(attempts, tmp_path, chromium):
    """Headless Chromium draws the page: each attempt's rows hold training green, the first's redone red after
    its step-20 save, and the queue before the second is hatched grey."""
    from PIL import Image

    browser = chromium
    page, png = tmp_path / "report.html", tmp_path / "report.png"
    page.write_text(report_html.page(_report(attempts)))
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--window-size=1140,600", f"--screenshot={png}", page.as_uri()], capture_output=True,
                   timeout=60, cwd=tmp_path, check=True)
    image = Image.open(png).convert("RGB")

    def bands(rgb: str) -> int:  # horizontal bands of that colour wider than a legend swatch: timeline rows
        want = tuple(int(rgb[i:i + 2], 16) for i in (1, 3, 5))
        def run(y: int) -> bool:  # 20 pixels in a row: a bar (text and swatches have none so long)
            n = 0
            for x in range(image.width):
                n = n + 1 if all(abs(a - b) <= 6 for a, b in zip(image.getpixel((x, y)), want)) else 0
                if n > 20:
                    return True
            return False
        rows = [run(y) for y in range(image.height)]
        return sum(1 for y in range(1, len(rows)) if rows[y] and not rows[y - 1])

    # attempt 0 and attempt 1, on 2 nodes each: 4 rows that trained; the first attempt's 2 redid work
    assert bands(report_html.COLOURS["training"]) == 4
    assert bands(report_html.COLOURS["redone"]) == 2
