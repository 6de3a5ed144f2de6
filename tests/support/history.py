"""Small checkers over recorded histories (shared/TESTING.md: no Knossos/Porcupine port exists)."""

from __future__ import annotations

import bisect
from dataclasses import dataclass


@dataclass(frozen=True)
class Read:
    client: int
    invoked_ns: int
    completed_ns: int
    value: int
    replica: str = ""


def monotonic_read_violations(reads: list[Read]) -> list[tuple[Read, Read]]:
    """Every read B must return >= the largest value of any read that *completed before B
    was invoked*. Overlapping reads may legally be out of order. Returns (B, the earlier read
    with the largest value) pairs."""
    by_completion = sorted(reads, key=lambda r: r.completed_ns)
    completions = [r.completed_ns for r in by_completion]
    prefix_best: list[Read] = []
    best: Read | None = None
    for r in by_completion:
        if best is None or r.value > best.value:
            best = r
        prefix_best.append(best)
    violations = []
    for b in reads:
        i = bisect.bisect_left(completions, b.invoked_ns)  # reads completed strictly before b was invoked
        if i and prefix_best[i - 1].value > b.value:
            violations.append((b, prefix_best[i - 1]))
    return violations
