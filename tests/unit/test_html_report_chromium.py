"""The fleet report in a real browser: Debian's headless Chromium loads the page from its file, offline (no proxy
reachable, every host name unresolvable, background networking off), and dumps the DOM it built and a screenshot.
Every host and every failure is in the DOM; the screenshot, decoded with matplotlib, is not blank and shows the
matrix's pass green and fail red. The screenshot is kept as test-artifacts/fleet-report.png under the repository
root. Chromium is installed with apt-get where it is missing and the test runs as root (CI)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers.fleet_reports import T0, fleet_folder

from gpuprov.validation.html_report import write_report

# apt-get may install chromium: in the engine's queue, so that it never waits on the lab's own apt-get
pytestmark = [pytest.mark.tool, pytest.mark.xdist_group("engine")]

ARTIFACT = Path(__file__).resolve().parents[2] / "test-artifacts" / "fleet-report.png"
WINDOW = (1280, 1000)
OFFLINE = ("--headless", "--disable-gpu", "--no-sandbox", "--no-first-run", "--no-default-browser-check",
           "--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-extensions",
           "--disable-default-apps", "--proxy-server=127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND",
           "--hide-scrollbars")


def chromium(binary: str, profile: Path, *arguments: str) -> str:
    done = subprocess.run([binary, *OFFLINE, f"--user-data-dir={profile}", *arguments], capture_output=True,
                          text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def chromium_binary() -> str:
    """Debian's chromium: installed with apt-get when it is missing and this runs as root (CI's fresh machine),
    else the test is skipped."""
    found = shutil.which("chromium")
    if found is None and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "install", "-y", "-q", "-o", "DPkg::Lock::Timeout=600", "--no-install-recommends",
                        "chromium"], env=env, capture_output=True, timeout=900, check=False)
        found = shutil.which("chromium")
    if found is None:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    return found


def test_the_report_renders_in_headless_chromium(tmp_path):
    import matplotlib.image

    binary = chromium_binary()
    expected = fleet_folder(tmp_path / "reports")
    page, _ = write_report(tmp_path / "reports", tmp_path / "fleet.html", now=T0 + 3 * 86400)
    url = page.resolve().as_uri()

    dom = chromium(binary, tmp_path / "profile", "--dump-dom", url)
    assert "gpuprov fleet report" in dom
    for host in expected["hosts"]:
        assert f">{host}</td>" in dom, host
    for host, check, reason in expected["failures"]:
        assert f"<td class=\"host\">{host}</td><td>{check}</td><td class=\"reason\">{reason}" in dom, (host, check)

    ARTIFACT.parent.mkdir(parents=True, exist_ok=True)
    ARTIFACT.unlink(missing_ok=True)
    chromium(binary, tmp_path / "profile", f"--screenshot={ARTIFACT}", f"--window-size={WINDOW[0]},{WINDOW[1]}", url)
    image = (matplotlib.image.imread(ARTIFACT)[:, :, :3] * 255).round().astype("uint8")   # RGB(A) floats 0..1
    height, width = image.shape[:2]
    assert (width, height) == WINDOW
    pixels = [bytes(p) for p in image.reshape(-1, 3)]
    colours = set(pixels)
    assert len(colours) > 50, "a blank screenshot"
    assert sum(1 for p in pixels if p != b"\xff\xff\xff") > width * height // 20
    # the matrix in the window: at least 20 rows of 17 passing cells (green, about 16 x 16 pixels inside the
    # cell's border) and the two failed cells (red)
    green = sum(1 for r, g, b in pixels if g > 140 and r < 90 and b < 110)
    red = sum(1 for r, g, b in pixels if r > 170 and g < 80 and b < 90)
    assert green > 20 * 17 * 16 * 16 and red > 2 * 16 * 16, (green, red)
