"""Owner labels and payloads: who holds a lock, in words a person reads (issue 25, item 4).

An owner (``vm-3.4242.MainThread.a1b2c3``) says which process holds a lock, not what it is
doing. ``get_lock(..., label="billing-worker on web-3", payload='{"batch": 17}')`` stores a
short **label** and, optionally, a small **payload** with the holder record; ``status()``,
``lockctl list``, ``lockctl status`` and leasewatch's ``/locks`` and page show them.

* The label is at most :data:`MAX_LABEL_BYTES` bytes of UTF-8 without control characters (it
  is printed on terminals and in HTML; a newline or an escape sequence would forge a line). It
  travels in the holder record *and* the queue cell, so a waiter is labelled too.
* The payload is at most :data:`MAX_PAYLOAD_BYTES` bytes of UTF-8 text (JSON, for instance), in
  the holder record only: every renewal rewrites the record, and every look at the queue reads
  its cells — a kilobyte per waiter there would make 1,000 waiters a megabyte per look.

Both are refused, not truncated, when too long (:class:`ValueError` naming the limit): a
label silently cut would be a different label. ``lockctl run`` cuts its own default label
(the command line) with :func:`shorten_label`, marking the cut with "…".
"""

from __future__ import annotations

import unicodedata

__all__ = ["MAX_LABEL_BYTES", "MAX_PAYLOAD_BYTES", "check_label", "check_payload", "shorten_label"]

MAX_LABEL_BYTES = 200
"""A label's limit in bytes of UTF-8: a line on a terminal, a cell of a table."""
MAX_PAYLOAD_BYTES = 1024
"""A payload's limit in bytes of UTF-8 (1 KiB): stored in the holder record, rewritten at every renewal."""


def _utf8_size(text: str, what: str) -> int:
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:  # lone surrogates
        raise ValueError(f"{what} is not valid Unicode text") from exc


def check_label(label: object) -> str:
    """``label`` checked (None -> ""): text of at most :data:`MAX_LABEL_BYTES` bytes of UTF-8,
    without control characters. Raises TypeError / ValueError naming what is wrong."""
    if label is None:
        return ""
    if not isinstance(label, str):
        raise TypeError(f"label must be a string or None, not {type(label).__name__}")
    size = _utf8_size(label, "label")
    if size > MAX_LABEL_BYTES:
        raise ValueError(f"label is {size} bytes of UTF-8; the limit is {MAX_LABEL_BYTES}")
    bad = next((ch for ch in label if unicodedata.category(ch) == "Cc"), None)
    if bad is not None:
        raise ValueError(f"label must not contain control characters (found {bad!r})")
    return label


def check_payload(payload: object) -> str:
    """``payload`` checked (None -> ""): text of at most :data:`MAX_PAYLOAD_BYTES` bytes of UTF-8.
    Raises TypeError / ValueError naming what is wrong (bytes are refused: encode them, e.g. as
    JSON or base64, so that ``status()`` and leasewatch's JSON can show them as they are)."""
    if payload is None:
        return ""
    if not isinstance(payload, str):
        raise TypeError(f"payload must be a string or None, not {type(payload).__name__} (encode it, e.g. as JSON)")
    size = _utf8_size(payload, "payload")
    if size > MAX_PAYLOAD_BYTES:
        raise ValueError(f"payload is {size} bytes of UTF-8; the limit is {MAX_PAYLOAD_BYTES} (1 KiB)")
    return payload


def shorten_label(text: str, limit: int = MAX_LABEL_BYTES) -> str:
    """``text`` made a valid label: control characters become spaces, and text beyond ``limit``
    bytes is cut at a character boundary and ends with "…"."""
    cleaned = "".join(" " if unicodedata.category(ch) == "Cc" else ch for ch in text)
    cleaned = cleaned.encode("utf-8", "replace").decode("utf-8")
    if len(cleaned.encode("utf-8")) <= limit:
        return cleaned
    cut = cleaned.encode("utf-8")[: limit - len("…".encode())].decode("utf-8", "ignore")
    return cut + "…"
