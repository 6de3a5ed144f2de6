"""One redaction function for everything chronolock prints: settings, errors, tracebacks, logs.

Two kinds of secret are removed from any text:

* **by shape** — the password in a URL's user info (``scheme://user:PASSWORD@host``),
  ``Bearer TOKEN``, and ``password=``/``token=``/``secret=`` pairs;
* **by value** — every secret a settings object or a store URL carried when it was
  loaded (:func:`register_secret`): a Cassandra password, leasewatch tokens. A password
  that shows up on its own (say, in a driver's error message) is caught this way.

:func:`redact` is used by the log renderer (every log line and rendered traceback),
by the ``settings`` commands, by the command-line entry points' last-resort error
handler, and wherever an error message quotes a store URL. Keep it the only one.
"""

from __future__ import annotations

import re
import threading
import traceback

__all__ = ["MASK", "redact", "redact_exception", "redacted_secrets", "register_secret", "strip_url_credentials"]

MASK = "***"

_MIN_SECRET = 4
"""Shorter values are not registered: masking every "abc" in a log line would garble it and
protect nothing (such a password is guessable anyway). They are still removed by shape."""


class _Registry:
    """The secret values seen so far, and one compiled pattern that matches any of them."""

    def __init__(self) -> None:
        self.secrets: set[str] = set()
        self.lock = threading.Lock()
        self.pattern: re.Pattern[str] | None = None


_registry = _Registry()

_URL_USERINFO = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]*://[^/\s:@]*):(?P<secret>[^\s/?#]*)@")
_BEARER = re.compile(r"(?i)\b(?P<head>bearer\s+)(?P<secret>[^\s,;\"']+)")
_PAIRS = re.compile(
    r"(?i)\b(?P<head>(?:password|passwd|pwd|token|tokens|secret|api_key|apikey)\s*[=:]\s*['\"]?)(?P<secret>[^\s&,;'\"]+)"
)


def register_secret(value: str | None) -> None:
    """Remember a secret value so that :func:`redact` masks it wherever it appears."""
    if value is None or len(value) < _MIN_SECRET:
        return
    with _registry.lock:
        if value in _registry.secrets:
            return
        _registry.secrets.add(value)
        # Longest first, so a secret that contains another is masked whole.
        ordered = sorted(_registry.secrets, key=len, reverse=True)
        _registry.pattern = re.compile("|".join(re.escape(s) for s in ordered))


def redacted_secrets() -> int:
    """How many secret values are registered (for tests and diagnostics)."""
    with _registry.lock:
        return len(_registry.secrets)


def redact(text: str) -> str:
    """``text`` without any registered secret value, URL password, bearer token or ``password=`` value."""
    if not text:
        return text
    # Shapes first, registered values after: a registered value can be part of a shape's
    # anchor (a password "cassandra" is the scheme of "cassandra://u:pw@h"), and masking it
    # first would hide the URL from its pattern and leave "pw" in the clear.
    text = _URL_USERINFO.sub(lambda m: f"{m.group('head')}:{MASK}@", text)
    text = _BEARER.sub(lambda m: f"{m.group('head')}{MASK}", text)
    text = _PAIRS.sub(lambda m: f"{m.group('head')}{MASK}", text)
    pattern = _registry.pattern
    if pattern is not None:
        text = pattern.sub(MASK, text)
    return text


def redact_exception(exc: BaseException) -> str:
    """A formatted traceback of ``exc`` (with its causes), redacted."""
    return redact("".join(traceback.format_exception(exc)))


def strip_url_credentials(url: str) -> str:
    """The URL without its user info (``scheme://user:pw@host`` -> ``scheme://host``)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority, slash, tail = rest.partition("/")
    if "@" in authority:
        authority = authority.rpartition("@")[2]
    return f"{scheme}://{authority}{slash}{tail}"
