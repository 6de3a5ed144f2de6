"""What every command-line entry point does with an error that reaches it.

A bad setting becomes one line on stderr and exit status 78 (EX_CONFIG) — naming the
variable, never echoing its value; anything else becomes a traceback that went through
:func:`lockclient.redact.redact` (a store URL with a password, a token in an error
message) and exit status 1. Nothing is printed with local variables.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeGuard

from lockclient.errors import ConfigurationError
from lockclient.redact import redact, redact_exception

if TYPE_CHECKING:
    from pydantic import ValidationError
    from pydantic_settings import BaseSettings

__all__ = ["EXIT_CONFIG", "describe_validation_error", "guarded_main", "is_validation_error"]

EXIT_CONFIG = 78


def describe_validation_error(exc: ValidationError, settings_cls: type[BaseSettings] | None = None) -> str:
    """One line per problem, by environment variable name when the settings class is known."""
    from lockclient.settings import _env_name

    problems = []
    for error in exc.errors(include_input=False, include_url=False):
        loc = error.get("loc") or ()
        field = str(loc[0]) if loc else ""
        if settings_cls is not None and field in settings_cls.model_fields:
            where = _env_name(settings_cls, field)
        else:
            where = ".".join(str(part) for part in loc) or "settings"
        problems.append(f"{where}: {error['msg']}")
    return redact("; ".join(problems))


def is_validation_error(exc: BaseException) -> TypeGuard[ValidationError]:
    """A pydantic ``ValidationError`` (bad settings)? pydantic is not imported to tell: a program that
    never loaded it (``lockctl run``'s fast path, issue 25: start-up) cannot have raised one."""
    core = sys.modules.get("pydantic_core")
    return core is not None and isinstance(exc, core.ValidationError)


def guarded_main(run: Callable[[], object], *, program: str, settings_cls: type[BaseSettings] | None = None) -> None:
    """Run a command-line program; turn errors into clear, redacted messages and exit codes."""
    try:
        run()
    except (SystemExit, KeyboardInterrupt):
        raise
    except ConfigurationError as exc:
        print(f"{program}: configuration error: {redact(str(exc))}", file=sys.stderr)
        raise SystemExit(EXIT_CONFIG) from None
    except Exception as exc:
        if is_validation_error(exc):
            print(f"{program}: configuration error: {describe_validation_error(exc, settings_cls)}", file=sys.stderr)
            raise SystemExit(EXIT_CONFIG) from None
        print(f"{program}: unexpected error\n{redact_exception(exc)}", file=sys.stderr, end="")
        raise SystemExit(1) from None
