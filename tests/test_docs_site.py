"""The built documentation site renders in a real browser: headless Chromium (Debian's
``chromium`` package) loads the home page and an API reference page, and the DOM it built
has the navigation and code blocks, and its screenshot is not blank.

Needs the site built by ``mkdocs build`` (``site/``, or the directory in
``JAXCLUSTER_DOCS_SITE``) and a ``chromium`` on the PATH (or ``JAXCLUSTER_CHROMIUM``); skipped
without them, unless ``JAXCLUSTER_REQUIRE_DOCS_SITE=1`` (what ``.ci/docs`` sets) makes that a
failure. Screenshots are kept in ``JAXCLUSTER_DOCS_SCREENSHOTS`` when it is set.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import zlib
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SITE = Path(os.environ.get("JAXCLUSTER_DOCS_SITE", ROOT / "site"))
CHROMIUM = os.environ.get("JAXCLUSTER_CHROMIUM") or shutil.which("chromium")
REQUIRED = os.environ.get("JAXCLUSTER_REQUIRE_DOCS_SITE") == "1"

# The home page, and the API page of the module most users read.
PAGES = {"home": "index.html", "api": "reference/coordinator/index.html"}


def _missing() -> str | None:
    if not (SITE / "index.html").is_file():
        return f"no built site at {SITE} (run mkdocs build)"
    if CHROMIUM is None:
        return "no chromium on the PATH (apt-get install chromium)"
    return None


@pytest.fixture(scope="module")
def chromium() -> str:
    reason = _missing()
    if reason is not None:
        if REQUIRED:
            pytest.fail(f"JAXCLUSTER_REQUIRE_DOCS_SITE=1 but {reason}")
        pytest.skip(reason)
    assert CHROMIUM is not None
    return CHROMIUM


def _run(chromium: str, *args: str) -> str:
    """Runs headless Chromium once; returns its stdout. ``--no-sandbox``: CI runs as root."""
    command = [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        "--window-size=1280,900",
        "--virtual-time-budget=5000",
        *args,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, f"{command} exited {done.returncode}: {done.stderr[-2000:]}"
    return done.stdout


def _png_pixels(data: bytes) -> list[bytes]:
    """The pixels of an 8-bit RGB or RGBA PNG (what Chromium writes), one ``bytes`` each."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, colour = struct.unpack(">IIBB", header[:10])
    assert depth == 8 and colour in (2, 6), f"unexpected PNG format {depth}/{colour}"
    bpp = 3 if colour == 2 else 4
    raw, stride = zlib.decompress(idat), width * bpp
    previous = bytearray(stride)
    pixels: list[bytes] = []
    for y in range(height):
        start = y * (stride + 1)
        kind, row = raw[start], bytearray(raw[start + 1 : start + 1 + stride])
        for i in range(stride):
            left = row[i - bpp] if i >= bpp else 0
            up = previous[i]
            corner = previous[i - bpp] if i >= bpp else 0
            if kind == 1:
                row[i] = (row[i] + left) & 0xFF
            elif kind == 2:
                row[i] = (row[i] + up) & 0xFF
            elif kind == 3:
                row[i] = (row[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                best = left if pa <= pb and pa <= pc else up if pb <= pc else corner
                row[i] = (row[i] + best) & 0xFF
        pixels.extend(bytes(row[i : i + 3]) for i in range(0, stride, bpp))
        previous = row
    return pixels


@pytest.mark.parametrize("page", sorted(PAGES))
def test_page_renders_navigation_and_code(chromium: str, page: str) -> None:
    dom = _run(chromium, "--dump-dom", (SITE / PAGES[page]).as_uri())
    # Material's navigation, with the site's sections in it.
    assert re.search(r'<nav[^>]*class="[^"]*md-nav', dom), f"{page}: no navigation"
    for title in ("Quickstart", "Concepts", "Troubleshooting", "coordinator"):
        assert re.search(rf">\s*{title}\s*<", dom), f"{page}: navigation lacks {title!r}"
    # A rendered code block: a <pre> holding a <code> with source in it (Material puts its
    # copy button in the <pre> before the <code>).
    blocks = re.findall(r"<pre[^>]*>(?:(?!</pre>).)*?<code[^>]*>(.*?)</code>", dom, re.S)
    assert blocks, f"{page}: no <pre><code> block"
    assert any(re.search(r"\w", re.sub(r"<[^>]+>", "", b)) for b in blocks)
    if page == "api":
        # mkdocstrings rendered the docstrings, not just the page title.
        assert "ClusterCoordinator" in dom and 'class="doc doc-' in dom


@pytest.mark.parametrize("page", sorted(PAGES))
def test_screenshot_is_not_blank(chromium: str, page: str, tmp_path: Path) -> None:
    keep = os.environ.get("JAXCLUSTER_DOCS_SCREENSHOTS")
    out = Path(keep) if keep else tmp_path
    out.mkdir(parents=True, exist_ok=True)
    png = out / f"{page}.png"
    _run(chromium, f"--screenshot={png}", (SITE / PAGES[page]).as_uri())
    pixels = _png_pixels(png.read_bytes())
    assert len(pixels) == 1280 * 900, f"{page}: screenshot has {len(pixels)} pixels"
    colours = Counter(pixels)
    top_share = colours.most_common(1)[0][1] / len(pixels)
    # A rendered page has a header bar, text and code: many colours, no one colour nearly
    # everywhere (a blank or error page is one colour, or two).
    assert len(colours) > 50, f"{page}: only {len(colours)} colours: blank?"
    assert top_share < 0.97, f"{page}: one colour covers {top_share:.1%}: blank?"
