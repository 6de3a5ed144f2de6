"""How the three commands' ``--help`` shows options (lockctl, timesvc, leasewatch; typer).

Recent typer (0.2x) prints each option's type after it, flags included: ``--try  -n  <bool>``
reads as if ``--try`` took a value (``--try true``), which it does not (issue 25); ``-v <int>``
the same for a counted flag. :func:`flags_without_a_type` makes typer's rich help print nothing
there for flags and counters, as click and older typer do; options that take a value keep their
type (``--timeout <float>``). Help rendering only: parsing is typer's, unchanged.
"""

from __future__ import annotations

from typing import Any

__all__ = ["flags_without_a_type"]


def flags_without_a_type() -> None:
    """Idempotent; does nothing on a typer without the per-option type column."""
    from typer import core

    option: Any = getattr(core, "TyperOption", None)
    show = getattr(option, "display_type_rich", None)
    if show is None or getattr(show, "flags_without_a_type", False):
        return

    def display_type_rich(self: Any, ctx: Any) -> str | None:
        if getattr(self, "is_flag", False) or getattr(self, "count", False):
            return None  # a flag takes no value: nothing to show
        result: str | None = show(self, ctx)
        return result

    display_type_rich.flags_without_a_type = True  # type: ignore[attr-defined]
    option.display_type_rich = display_type_rich
