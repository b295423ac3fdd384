"""Headless Chromium, driven from the command line only (no DevTools client, no network).

Used by the browser test and to take the README screenshot:

    python tests/browser.py report.html docs/report-screenshot.png [WIDTH HEIGHT]

Pages are opened as ``file://`` URLs; reports never fetch anything.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional, Sequence

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
BASE_FLAGS = ("--headless", "--disable-gpu", "--no-sandbox", "--no-first-run",
              "--disable-extensions", "--disable-dev-shm-usage", "--hide-scrollbars",
              "--mute-audio", "--force-device-scale-factor=1")


def find_chromium() -> Optional[str]:
    """Path of a Chromium/Chrome binary (``$KVSIM_CHROMIUM`` first), or None."""
    env = os.environ.get("KVSIM_CHROMIUM")
    if env:
        return env if Path(env).exists() else shutil.which(env)
    for name in CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


def _run(args: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess:
    binary = find_chromium()
    if binary is None:
        raise FileNotFoundError("no chromium binary found (apt-get install -y chromium)")
    with tempfile.TemporaryDirectory(prefix="kvsim-chromium-") as profile:
        cmd = [binary, *BASE_FLAGS, f"--user-data-dir={profile}", *args]
        return subprocess.run(cmd, capture_output=True, timeout=timeout_s, check=False,
                              text=True, stdin=subprocess.DEVNULL)


def dump_dom(html_path: str | os.PathLike, *, budget_ms: int = 5000,
             timeout_s: float = 90) -> str:
    """The page's DOM after load and ``budget_ms`` of virtual time, as HTML text."""
    url = Path(html_path).resolve().as_uri()
    proc = _run([f"--virtual-time-budget={budget_ms}", "--dump-dom", url], timeout_s)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise RuntimeError(f"chromium --dump-dom failed ({proc.returncode}): "
                           f"{proc.stderr[-2000:]}")
    return proc.stdout


def screenshot(html_path: str | os.PathLike, png_path: str | os.PathLike, *,
               width: int = 1400, height: int = 2000, budget_ms: int = 5000,
               timeout_s: float = 90) -> Path:
    """Save a ``width``×``height`` PNG of the page's top; returns the PNG path."""
    url = Path(html_path).resolve().as_uri()
    out = Path(png_path).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    proc = _run([f"--virtual-time-budget={budget_ms}", f"--window-size={width},{height}",
                 f"--screenshot={out}", url], timeout_s)
    if proc.returncode != 0 or not out.is_file():
        raise RuntimeError(f"chromium --screenshot failed ({proc.returncode}): "
                           f"{proc.stderr[-2000:]}")
    return out


def main(argv: Sequence[str]) -> int:
    """``python tests/browser.py PAGE.html OUT.png [WIDTH HEIGHT]``."""
    if len(argv) not in (2, 4):
        sys.stderr.write(__doc__ or "")
        return 2
    size = (int(argv[2]), int(argv[3])) if len(argv) == 4 else (1400, 2000)
    print(screenshot(argv[0], argv[1], width=size[0], height=size[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
