"""Debian's chromium, headless, for the operator page: the DOM after the page ran, and screenshots.

No browser is downloaded: `make test` installs Debian's ``chromium`` package (DEBIAN_PACKAGES in
the Makefile). Where it is missing or cannot start (no sandbox support, missing libraries), the
tests that need it are skipped with the reason. ``--virtual-time-budget`` lets the page's timers
run that many (virtual) milliseconds, waiting for its fetches, before the DOM is dumped or the
screenshot taken: no sleep, and nothing depends on how fast the machine is.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

__all__ = ["Elements", "chromium", "dump_dom", "elements", "screenshot"]

RUN_TIMEOUT_S = 90


def _flags(profile: Path) -> list[str]:
    return [
        "--headless",
        "--no-sandbox",  # tests may run as root, where chromium's sandbox refuses to start
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
    ]


@functools.cache
def _usable() -> tuple[str | None, str]:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        return None, "chromium is not installed (`make test` installs Debian's chromium package)"
    profile = Path(f"/tmp/chronolock-chromium-probe-{id(_usable)}")
    try:
        done = subprocess.run(
            [browser, *_flags(profile), "--dump-dom", "data:text/html,<p id=probe>ok</p>"],
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"chromium cannot run here: {exc}"
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    if done.returncode != 0 or 'id="probe"' not in done.stdout:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        return None, f"chromium cannot run here (exit {done.returncode}): {tail}"
    return browser, ""


def chromium() -> str:
    """The browser's path, or skip the test saying why there is none."""
    browser, why = _usable()
    if browser is None:
        pytest.skip(why)
    return browser


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=True)


def dump_dom(url: str, profile: Path, *, budget_ms: int = 4000) -> str:
    """The page's DOM after its scripts ran for ``budget_ms`` of virtual time."""
    return _run([chromium(), *_flags(profile), f"--virtual-time-budget={budget_ms}", "--dump-dom", url]).stdout


def screenshot(
    url: str, path: Path, profile: Path, *, size: tuple[int, int] = (1400, 1800), budget_ms: int = 4000
) -> Path:
    _run(
        [
            chromium(),
            *_flags(profile),
            f"--virtual-time-budget={budget_ms}",
            f"--window-size={size[0]},{size[1]}",
            f"--screenshot={path}",
            url,
        ]
    )
    assert path.stat().st_size > 10_000, f"{path} looks empty"
    return path


Elements = list[tuple[str, dict[str, str], str]]
_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class _Collect(HTMLParser):
    """Every element as (tag, attributes, its text up to the first child element)."""

    def __init__(self) -> None:
        super().__init__()
        self.found: Elements = []
        self._open: list[int] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.found.append((tag, {k: v or "" for k, v in attrs}, ""))
        if tag not in _VOID:
            self._open.append(len(self.found) - 1)

    def handle_endtag(self, tag: str) -> None:
        while self._open:  # up to the element this closes (the DOM dump is well formed)
            if self.found[self._open.pop()][0] == tag:
                break

    def handle_data(self, data: str) -> None:
        if self._open:
            tag, attrs, text = self.found[self._open[-1]]
            self.found[self._open[-1]] = (tag, attrs, text + data)


def elements(dom: str) -> Elements:
    parser = _Collect()
    parser.feed(dom)
    return parser.found
