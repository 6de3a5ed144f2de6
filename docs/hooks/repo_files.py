"""MkDocs hook: pages made of the repository's own files, and links out of ``docs/`` that resolve.

Some documents must stay where they are — ``SECURITY.md`` and ``BENCHMARKS.md`` at the root (the
bench code and the tests name them), ``k8s/README.md`` beside its manifests, ``CHANGELOG.md`` — and
MkDocs reads only ``docs/``. A page includes one of them whole with a line of its own::

    <!-- include: k8s/README.md shift=1 -->

(``shift=1`` demotes its headings one level, under the page's own title). The text is read at build
time, so the site never holds a stale copy.

Relative links, in a page or in an included file, are resolved against the file they were written in:

* to a page of the site: linked from the page they end up in;
* to an included file: linked to the page that includes it (``k8s/README.md#tls`` → ``kubernetes.md#tls``);
* to an image elsewhere in the repository (``bench/results/*.png``): the image is copied into the
  site (``repo/<path>``) and linked there;
* to any other file that exists in the repository (``tests/faults/README.md``, a module): shown as
  its path in code, since the site has no copy of it;
* to nothing: left as written, so that ``mkdocs build --strict`` fails on it.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mkdocs.config.defaults import MkDocsConfig
    from mkdocs.structure.files import Files
    from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parents[2]
INCLUDE = re.compile(r"^<!-- include: (?P<path>\S+)(?: shift=(?P<shift>\d))? -->$", re.MULTILINE)
LINK = re.compile(r"(?P<bang>!?)\[(?P<text>[^\]\n]*)\]\((?P<target>[^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,5}) ")
IMAGE_SUFFIXES = (".png", ".svg", ".jpg", ".jpeg", ".gif")
ASSETS = "repo"
"""Where images from outside ``docs/`` are put in the site."""


def _docs_dir(config: MkDocsConfig) -> Path:
    return Path(config.docs_dir).resolve()


def _includes(docs_dir: Path) -> dict[str, str]:
    """Included file (repository path) → the page (docs path) that includes it."""
    found: dict[str, str] = {}
    for page in sorted(docs_dir.rglob("*.md")):
        for match in INCLUDE.finditer(page.read_text(encoding="utf-8")):
            found[match["path"]] = page.relative_to(docs_dir).as_posix()
    return found


def _outside_code(text: str) -> list[tuple[bool, str]]:
    """``text`` cut into runs of lines, each marked True when it lies inside a fenced code block."""
    runs: list[tuple[bool, str]] = []
    fenced = False
    current: list[str] = []
    for line in text.splitlines(keepends=True):
        if FENCE.match(line):
            if not fenced:
                runs.append((False, "".join(current)))
                current = [line]
                fenced = True
            else:
                current.append(line)
                runs.append((True, "".join(current)))
                current = []
                fenced = False
            continue
        current.append(line)
    runs.append((fenced, "".join(current)))
    return runs


def _shift_headings(text: str, shift: int) -> str:
    out = []
    for fenced, run in _outside_code(text):
        out.append(run if fenced else HEADING.sub(lambda m: "#" * (len(m[1]) + shift) + " ", run))
    return "".join(out)


def _repo_path(target: str, source_dir: str) -> tuple[str, str]:
    """A relative link target → (its path in the repository, its ``#fragment`` or "")."""
    path, _, fragment = target.partition("#")
    return posixpath.normpath(posixpath.join(source_dir, path)), f"#{fragment}" if fragment else ""


def _images(text: str, source_dir: str) -> set[str]:
    """Repository paths of the images outside ``docs/`` that ``text`` links to."""
    found = set()
    for fenced, run in _outside_code(text):
        if fenced:
            continue
        for match in LINK.finditer(run):
            target = match["target"]
            if "://" in target or target.startswith(("#", "mailto:")):
                continue
            path, _ = _repo_path(target, source_dir)
            if path.lower().endswith(IMAGE_SUFFIXES) and not path.startswith("docs/") and (ROOT / path).is_file():
                found.add(path)
    return found


def _rewrite(text: str, source_dir: str, page_path: str, includes: dict[str, str]) -> str:
    """Resolve the relative links of ``text`` (written in ``source_dir``) for the page ``page_path``."""
    page_dir = posixpath.dirname(page_path)

    def relink(match: re.Match[str]) -> str:
        target = match["target"]
        if "://" in target or target.startswith(("#", "mailto:")):
            return match[0]
        path, fragment = _repo_path(target, source_dir)
        if not (ROOT / path).exists():
            return match[0]  # broken: left for --strict to report
        if path.startswith("docs/"):
            new = posixpath.relpath(path.removeprefix("docs/"), page_dir or ".")
        elif path in includes:
            new = posixpath.relpath(includes[path], page_dir or ".")
        elif path.lower().endswith(IMAGE_SUFFIXES):
            new = posixpath.relpath(f"{ASSETS}/{path}", page_dir or ".")
        else:
            text = match["text"]
            shown = f"`{path}{fragment}`"
            return shown if text.strip("`") in (path, posixpath.basename(path), target) else f"{text} ({shown})"
        return f"{match['bang']}[{match['text']}]({new}{fragment})"

    return "".join(run if fenced else LINK.sub(relink, run) for fenced, run in _outside_code(text))


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add the images that pages and included files link to from outside ``docs/``."""
    from mkdocs.structure.files import File

    docs_dir = _docs_dir(config)
    wanted: set[str] = set()
    for page in docs_dir.rglob("*.md"):
        wanted |= _images(page.read_text(encoding="utf-8"), posixpath.dirname(f"docs/{page.relative_to(docs_dir)}"))
    for included in _includes(docs_dir):
        wanted |= _images((ROOT / included).read_text(encoding="utf-8"), posixpath.dirname(included))
    for path in sorted(wanted):
        files.append(File.generated(config, f"{ASSETS}/{path}", abs_src_path=str(ROOT / path)))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    """Expand ``<!-- include: PATH -->`` lines and resolve every relative link."""
    includes = _includes(_docs_dir(config))
    page_path = page.file.src_uri
    page_source_dir = posixpath.dirname(f"docs/{page_path}")
    pieces = []
    last = 0
    for match in INCLUDE.finditer(markdown):
        pieces.append(_rewrite(markdown[last : match.start()], page_source_dir, page_path, includes))
        included = (ROOT / match["path"]).read_text(encoding="utf-8")
        included = _shift_headings(included, int(match["shift"] or 0))
        pieces.append(_rewrite(included, posixpath.dirname(match["path"]), page_path, includes))
        last = match.end()
    pieces.append(_rewrite(markdown[last:], page_source_dir, page_path, includes))
    return "".join(pieces)
