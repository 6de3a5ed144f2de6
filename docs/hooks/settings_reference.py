"""MkDocs hook: the configuration reference, generated from the settings classes at build time.

``docs/configuration.md`` holds the line ``<!-- settings-reference -->``; this hook replaces it with
one table per component — every environment variable the component reads (:func:`env_names`), its
type and accepted range, its default and its description, all taken from the pydantic-settings
classes (``Field(description=...)``). The classes are the only source, so the reference cannot
drift from the code; ``tests/test_docs.py`` checks that it lists every variable.
"""

from __future__ import annotations

import html
import re
import types
import typing
from typing import TYPE_CHECKING, Any, Literal

import annotated_types
from pydantic import AliasChoices, SecretStr
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

from leasewatch.settings import LeasewatchSettings
from lockclient.settings import ClientSettings, StoreSettings
from lockclient.settings import _env_name as env_name  # the name env_names() gives a field
from timesvc.settings import TimesvcSettings

if TYPE_CHECKING:
    from mkdocs.config.defaults import MkDocsConfig
    from mkdocs.structure.files import Files
    from mkdocs.structure.pages import Page

MARKER = "<!-- settings-reference -->"

COMPONENTS: list[tuple[str, type[BaseSettings], type[BaseSettings] | None]] = [
    ("Shared by every component", StoreSettings, None),
    ("The lock client (`RemoteLocker.from_env()`, `lockctl`)", ClientSettings, StoreSettings),
    ("timesvc (`timesvc serve`)", TimesvcSettings, StoreSettings),
    ("leasewatch (`leasewatch serve`)", LeasewatchSettings, StoreSettings),
]
"""(heading, settings class, the class whose variables are listed elsewhere and left out here)."""


def _deprecated_names(field: FieldInfo) -> list[str]:
    alias = field.validation_alias
    if isinstance(alias, AliasChoices):
        return [str(choice).upper() for choice in alias.choices[1:]]
    return []


def _is_secret(annotation: Any) -> bool:
    return annotation is SecretStr or any(_is_secret(arg) for arg in typing.get_args(annotation))


def _type(field: FieldInfo) -> str:
    annotation = field.annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        annotation = next(arg for arg in typing.get_args(annotation) if arg is not type(None))
    if typing.get_origin(annotation) is Literal:
        return "one of " + ", ".join(f"`{value}`" for value in typing.get_args(annotation))
    names: dict[Any, str] = {str: "text", int: "integer", float: "number", bool: "`true` / `false`"}
    base = "secret text" if annotation is SecretStr else names.get(annotation) or str(annotation)
    bounds = []
    for item in field.metadata:
        for attr, symbol in (("gt", ">"), ("ge", "≥"), ("lt", "<"), ("le", "≤")):
            if getattr(item, attr, None) is not None:
                bounds.append(f"{symbol} {getattr(item, attr)}")
        if isinstance(item, annotated_types.MinLen):
            bounds.append(f"at least {item.min_length} character{'s' if item.min_length > 1 else ''}")
        if isinstance(item, annotated_types.MaxLen):
            bounds.append(f"at most {item.max_length} characters")
    return f"{base}, {' and '.join(bounds)}" if bounds else base


def _default(field: FieldInfo) -> str:
    value = field.default
    if field.default_factory is not None:
        doc = (field.default_factory.__doc__ or "").split(":", 1)[0].strip().strip("`")
        shown = f"`{doc}` (per process)" if doc else "computed per process"
    elif field.validate_default and value == "":
        shown = "none: required"
    elif value is None:
        shown = "unset"
    elif _is_secret(field.annotation):
        shown = "(secret)"
    elif value == "":
        shown = "empty"
    else:
        shown = f"`{str(value).lower() if isinstance(value, bool) else value}`"
    return shown


CODE = re.compile(
    r"(?P<url>\b[a-z]+://[^\s,;)]+(?:,[^\s,;)]+)*)"  # sqlite:////path, cassandra://h1,h2:9042/ks?dc=x
    r"|(?P<env>\b[A-Z][A-Z0-9]*(?:_(?:[A-Z0-9]+|\*))+)"  # CHRONOLOCK_LEASE, CHRONOLOCK_CASSANDRA_SSL_*
    r"|(?P<path>(?<![\w:/])/[A-Za-z#{][\w/{}#=<>.-]*[\w}>])"  # /status, /revoke/{id}, /#token=<token>
    r"|(?P<call>\b\w+\([^()\s]*\))"  # TimeServiceClock(max_skew=...), PRAGMA wal_checkpoint(TRUNCATE)
)
"""What a description says in code: URLs, variable names, HTTP paths, calls."""


def _escaped(text: str) -> str:
    return html.escape(text, quote=False).replace("*", "\\*")


def _plain(text: str) -> str:
    return html.escape(text, quote=False).replace("|", "\\|")


def _cell(text: str) -> str:
    """A description as one Markdown table cell: code in code spans, nothing read as HTML or emphasis."""
    text = " ".join(text.split())
    out, last = [], 0
    for match in CODE.finditer(text):
        out += [_escaped(text[last : match.start()]), f"`{match[0]}`"]
        last = match.end()
    out.append(_escaped(text[last:]))
    return "".join(out).replace("|", "\\|")


def reference() -> str:
    """The Markdown of the whole reference: one table per component."""
    out: list[str] = []
    for heading, cls, shared in COMPONENTS:
        skip = set(shared.model_fields) if shared else set()
        own = [name for name in cls.__annotations__ if name in cls.model_fields and name not in skip]
        names = own + [name for name in cls.model_fields if name not in skip and name not in own]
        out += [f"### {heading}", "", "| variable | type | default | meaning |", "|---|---|---|---|"]
        for name in names:
            field = cls.model_fields[name]
            notes = [field.description or ""]
            if _is_secret(field.annotation):
                notes.append("a secret: masked in every output, removed from the environment of lockctl run's command")
            notes += [f"also read under its deprecated name {old}" for old in _deprecated_names(field)]
            meaning = "; ".join(note for note in notes if note)
            out.append(
                f"| `{env_name(cls, name)}` | {_plain(_type(field))} | {_plain(_default(field))} | {_cell(meaning)} |"
            )
        out.append("")
    return "\n".join(out)


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    """Put the reference where ``docs/configuration.md`` asks for it."""
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, reference())
