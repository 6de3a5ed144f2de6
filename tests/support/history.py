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


def monotonic_read_violations(reads: list[Read]) -> list[tuple[Read, int]]:
    """Every read B must return >= the largest value of any read that *completed before B
    was invoked*. Overlapping reads may legally be out of order. Returns (read, required) pairs."""
    by_completion = sorted(reads, key=lambda r: r.completed_ns)
    completions = [r.completed_ns for r in by_completion]
    prefix_max: list[int] = []
    best = 0
    for r in by_completion:
        best = max(best, r.value)
        prefix_max.append(best)
    violations = []
    for b in reads:
        i = bisect.bisect_left(completions, b.invoked_ns)  # reads completed strictly before b was invoked
        if i and prefix_max[i - 1] > b.value:
            violations.append((b, prefix_max[i - 1]))
    return violations
