"""The simulation's history: every event the checkers judge, in virtual-time order.

One line per event, ``<virtual ns> <kind> key=value ...`` with keys in a fixed order, so the
history is text that two runs of one seed reproduce byte for byte (``history sha256``)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

__all__ = ["History"]


@dataclass
class History:
    lines: list[str] = field(default_factory=list)
    keep: bool = True
    """False: only the digest is kept (long runs)."""
    _digest: Any = field(default_factory=hashlib.sha256)
    count: int = 0

    def record(self, now: int, what: str, /, **fields: object) -> None:
        line = f"{now} {what}" + "".join(f" {key}={value}" for key, value in fields.items())
        self._digest.update(line.encode())
        self._digest.update(b"\n")
        self.count += 1
        if self.keep:
            self.lines.append(line)

    def sha256(self) -> str:
        digest: str = self._digest.hexdigest()
        return digest

    def tail(self, n: int = 40) -> list[str]:
        return self.lines[-n:]
