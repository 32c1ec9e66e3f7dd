"""A headless Chromium driven by Playwright for the chat page's test and screenshots.

Debian's ``chromium`` package is the browser (Playwright's own downloads are not
used: ``executable_path`` points at the system one). :func:`missing` says in one
line what is absent, for a test to report it.
"""

from __future__ import annotations

import importlib.util
import os
import shutil

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def chromium_path() -> str | None:
    """The system Chromium ($LOCALFLASH_CHROMIUM, else chromium / chromium-browser on PATH)."""
    return os.environ.get("LOCALFLASH_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


def missing() -> str | None:
    """None when a browser test can run, else why not (one line)."""
    if importlib.util.find_spec("playwright") is None:
        return "playwright is not installed (pip install -e '.[dev]')"
    if chromium_path() is None:
        return "no chromium on PATH (Debian: apt-get install chromium; CI's .ci/run installs it)"
    return None


def launch(playwright):
    """A headless Chromium browser from a started ``sync_playwright()``."""
    return playwright.chromium.launch(executable_path=chromium_path(), args=ARGS)
