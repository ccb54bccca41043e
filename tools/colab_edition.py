"""Write the Colab edition of the book: one notebook per chapter, in ``colab/``, that Colab renders cleanly.

Usage: .venv/bin/python tools/colab_edition.py [--check]

Colab renders CommonMark with HTML and math, but not MyST: a chapter opened there as it is shows
``{term}`` roles and ``:::`` fences as text and its written solutions unfolded. This tool reads
every chapter notebook of ``_toc.yml`` (after ``tools/sync_notebooks.py`` has split and marked
its solutions) and writes ``colab/<the same name>.ipynb`` with the same cells and the same stored
outputs, the markdown translated:

* ``{term}`x``` (and ``{term}`text <x>```) becomes a plain link to ``x`` on the website's glossary
  page; ``{doc}``, ``{ref}`` and ``{numref}`` become links to the page or section on the website.
  The website's address is ``html.baseurl`` of ``_config.yml`` when set, else the GitHub Pages
  address of ``repository.url`` (``https://OWNER.github.io/REPO/``).
* An exercise becomes a heading, "Exercise N.k: title" (chapter N, its k-th exercise), one level
  below the section it is in; an admonition becomes a headed block, and a folded one (``:class:
  dropdown``, such as every "Going further") a ``<details>`` block with its title as the summary.
* A solution's written part becomes a ``<details>`` block ("Solution to Exercise N.k: title"),
  one per cell, since Colab renders each cell on its own; a cell that held only a fence is left
  out (JupyterLab's "Show the solution" fold, :func:`sync_notebooks.unfold_written_solution`, is
  removed first: one fold, not two). A solution's code cell keeps Colab's form view (``cellView: form``), its ``# @title``
  naming the exercise by number.
* MyST comments (``%`` lines), targets (``(label)=``) and ``<script>`` elements are removed.
* An image given by a relative path (the diagrams, ``diagrams/NAME.svg``) points at the file in
  the repository on GitHub: ``https://raw.githubusercontent.com/OWNER/REPO/BRANCH/book/...``,
  with ``?sanitize=true`` on an SVG, which makes GitHub send it as an image (``image/svg+xml``)
  rather than as text. A link, not an embedded copy: Colab shows no SVG given as a ``data:`` URI
  (googlecolab/colabtools#2092), and the file on the branch the setup cell clones is the one the
  notebook was generated with. Where it cannot load, the diagram's alt text shows.
* The setup cell (``tools/sync_colab.py``'s install cell) stays first, folded in form view with
  a ``# @title``; the title cell gets one line that says so and links the chapter's website page.
* An optional code cell (tagged ``hide-cell``, first line ``# Going further (optional): ...``, the
  code of a folded "Going further" block) gets Colab's form view, titled "Going further (optional)".

Everything else (code, outputs, cell ids, metadata) is copied unchanged. The result depends on
nothing but the notebooks, ``_config.yml``, ``_toc.yml`` and the book's pages (glossary terms,
page titles, labels), so the same input always gives the same files; ``--check`` writes nothing
and exits 1, naming the stale files, when ``colab/`` is out of step (``tests/test_colab_edition.py``
fails then too). It also writes README.md's list of links that open each chapter's edition in
Colab (between two marker comments). ``make colab`` and ``make book`` run it.
"""

from __future__ import annotations

import copy
import html
import os
import re
import sys
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import nbformat
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tools"))
import sync_colab  # noqa: E402
import sync_notebooks  # noqa: E402
from toc import toc_files, toc_notebooks  # noqa: E402

EDITION = ROOT / "colab"
COLAB = "https://colab.research.google.com"
SETUP_TITLE = "# @title Setup: run this cell first (it fetches the book's code and installs it)"
SOLUTION_TITLE = "# @title Solution: "
README = Path("README.md")
MAX_LINE = 88  # the book's longest code line
LINKS_START = "<!-- colab-edition-links: written by tools/colab_edition.py -->"
LINKS_END = "<!-- /colab-edition-links -->"

#: ``:::{name} argument`` or ```` ```{name} argument ````, with its indentation and fence.
FENCE_OPEN = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>:{3,}|`{3,}|~{3,})\{(?P<name>[\w:-]+)\}[ \t]*(?P<arg>.*?)[ \t]*$")
CODE_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})")
OPTION = re.compile(r"^[ \t]*:(?P<key>[\w-]+):[ \t]*(?P<value>.*?)[ \t]*$")
TARGET = re.compile(r"^[ \t]*\((?P<label>[^()\s]+)\)=[ \t]*$")
COMMENT = re.compile(r"^[ \t]*%")
ROLE_OR_CODE = re.compile(r"(?P<role>\{(?P<name>[\w:-]+)\}`(?P<body>[^`]+)`)|(?P<code>(?P<ticks>`+)[\s\S]*?[^`](?P=ticks)(?!`))")
EXPLICIT = re.compile(r"^(?P<text>[\s\S]*?)\s*<(?P<target>[^<>]+)>$")
HTML_IMG = re.compile(r"(?P<head><img\b[^>]*?\bsrc=[\"'])(?P<path>[^\"']+)(?P<tail>[\"'])", re.I)
#: A markdown link or image (``bang``), or inline code (left alone).
LINK_OR_CODE = re.compile(r"(?P<head>(?P<bang>!?)\[[^\]]*\]\()(?P<path>[^)\s]+)(?P<tail>(?:\s+\"[^\"]*\")?\))"
                          r"|(?P<code>(?P<ticks>`+)[\s\S]*?[^`](?P=ticks)(?!`))")
SCRIPT = re.compile(r"<script\b[^>]*>[\s\S]*?</script>[ \t]*\n?", re.I)
HEADING = re.compile(r"^(#{1,6})[ \t]+\S", re.M)
ADMONITIONS = {"note", "tip", "hint", "important", "warning", "caution", "attention", "danger", "error", "seealso"}
FOLDED_CLASSES = {"dropdown", "toggle"}


# --- where things are -----------------------------------------------------------------------------

def _config() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))


def repository() -> tuple[str, str, str]:
    """(owner, repo, branch) of ``_config.yml``'s repository."""
    url, branch = sync_colab.repository()
    owner, repo = url.removeprefix("https://github.com/").split("/")[:2]
    return owner, repo, branch


def site_url() -> str:
    """The website's address, ending in ``/``."""
    base = ((_config().get("html") or {}).get("baseurl") or "").strip()
    if base:
        return base.rstrip("/") + "/"
    owner, repo, _ = repository()
    if repo.lower() == f"{owner.lower()}.github.io":
        return f"https://{repo}/"
    return f"https://{owner}.github.io/{repo}/"


def raw_url(path: str) -> str:
    """A file of the repository (path from its root) on GitHub, as an image or download source."""
    owner, repo, branch = repository()
    url = f"https://raw.githubusercontent.com/{owner}/{repo}/{branch}/{path}"
    return url + "?sanitize=true" if path.lower().endswith(".svg") else url


def blob_url(path: str) -> str:
    """A file of the repository (path from its root) as GitHub shows it, for a link to read it."""
    owner, repo, branch = repository()
    return f"https://github.com/{owner}/{repo}/blob/{branch}/{path}"


def colab_url(notebook: Path) -> str:
    """Where Colab opens ``notebook`` (a path from the repository root) from GitHub."""
    owner, repo, branch = repository()
    return f"{COLAB}/github/{owner}/{repo}/blob/{branch}/{Path(notebook).as_posix()}"


def edition_path(notebook: Path) -> Path:
    """``book/NN_slug.ipynb`` -> ``colab/NN_slug.ipynb`` (both from the repository root)."""
    return Path(EDITION.name) / Path(notebook).name


def page_url(docname: str, anchor: str = "") -> str:
    """A page of the website (``docname`` from the repository root, no suffix)."""
    return f"{site_url()}{docname}.html" + (f"#{anchor}" if anchor else "")


def sphinx_id(text: str) -> str:
    """The id Sphinx gives a term or section: ``sphinx.util.nodes._make_id`` (case kept)."""
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^a-zA-Z0-9._]+", "-", " ".join(text.split()))
    return re.sub(r"^[-0-9._]+|-+$", "", text)


# --- the book's pages: glossary terms, titles, labels ---------------------------------------------

def _markdown_of(path: Path) -> str:
    if path.suffix == ".ipynb":
        nb = nbformat.read(path, as_version=4)
        return "\n\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    return path.read_text(encoding="utf-8")


def _plain(text: str) -> str:
    """A title as the website shows it in a link: roles and markup reduced to their text."""
    text = re.sub(r"\{[\w:-]+\}`([^`<]*?)\s*(?:<[^>]*>)?`", r"\1", text)
    return re.sub(r"[*_`]", "", text).strip()


@dataclass
class Book:
    """What the translation needs to know about the whole book."""

    terms: dict[str, str] = field(default_factory=dict)          # lower-case term -> its spelling
    anchors: dict[str, dict[str, str]] = field(default_factory=dict)  # docname -> {MyST slug: section id}
    titles: dict[str, str] = field(default_factory=dict)         # docname -> page title
    labels: dict[str, tuple[str, str]] = field(default_factory=dict)  # label -> (docname, link text)

    @classmethod
    def read(cls) -> "Book":
        book = cls()
        glossary = (ROOT / "book" / "glossary.md").read_text(encoding="utf-8")
        block = re.search(r"^:{3,}\{glossary\}.*?\n(.*?)^:{3,}[ \t]*$", glossary, re.M | re.S)
        for line in (block.group(1) if block else "").splitlines():
            if line.strip() and not line[0].isspace() and not line.startswith(":"):
                book.terms.setdefault(line.strip().lower(), line.strip())
        for path in toc_files():
            docname = path.with_suffix("").as_posix()
            text = _markdown_of(ROOT / path)
            title = re.search(r"^#[ \t]+(.+)$", text, re.M)
            book.titles[docname] = _plain(title.group(1)) if title else docname
            book.anchors[docname] = heading_anchors(text)
            for match in re.finditer(r"^\(([^()\s]+)\)=[ \t]*\n+#{1,6}[ \t]+(.+)$", text, re.M):
                book.labels[match.group(1)] = (docname, _plain(match.group(2)))
            if path.suffix == ".ipynb":
                for label, (number, title_) in exercise_numbers(text, chapter_number(path)).items():
                    book.labels[label] = (docname, f"Exercise {number}")
        return book

    def term_link(self, text: str, term: str) -> str:
        spelling = self.terms.get(" ".join(term.split()).lower())
        if spelling is None:
            raise ValueError(f"{{term}}`{term}` is not a term of book/glossary.md")
        return f"[{text}]({page_url('book/glossary', sphinx_id('term-' + spelling))})"


def anchor_levels() -> int:
    """The deepest heading level MyST gives an anchor (``myst_heading_anchors``; all when unset)."""
    config = _config()
    sphinx = ((config.get("sphinx") or {}).get("config") or {})
    return int(sphinx.get("myst_heading_anchors") or (config.get("parse") or {}).get("myst_heading_anchors") or 6)


def heading_anchors(markdown: str, levels: int | None = None) -> dict[str, str]:
    """{slug: id} for every heading of a page down to ``levels`` (default: :func:`anchor_levels`):
    a link ``page.ipynb#slug`` (MyST's heading anchors, as GitHub makes them) reaches the section
    whose id on the website is ``id`` (docutils' id of the heading's text). Each is computed as
    myst-parser computes it."""
    from docutils.nodes import fully_normalize_name, make_id
    from markdown_it import MarkdownIt
    from mdit_py_plugins.dollarmath import dollarmath_plugin

    parser = MarkdownIt("commonmark").use(dollarmath_plugin)
    anchors: dict[str, str] = {}
    tokens = parser.parse(markdown)
    levels = anchor_levels() if levels is None else levels
    for token in [t for before, t in zip(tokens, tokens[1:]) if before.type == "heading_open" and int(before.tag[1]) <= levels]:
        children = token.children or []
        slug = re.sub(r"[^\w\u4e00-\u9fff\- ]", "", "".join(
            c.content for c in children if c.type in ("text", "code_inline")).lower().replace(" ", "-"))
        base, k = slug, 1
        while slug in anchors:
            slug, k = f"{base}-{k}", k + 1
        anchors[slug] = make_id(fully_normalize_name("".join(
            c.content for c in children if c.type in ("text", "code_inline", "math_inline"))))
    return anchors


def chapter_number(path: Path) -> str:
    match = re.match(r"(\d+)_", Path(path).name)
    return str(int(match.group(1))) if match else Path(path).stem


def exercise_numbers(text: str, chapter: str) -> dict[str, tuple[str, str]]:
    """label -> ("N.k", title) for every exercise of a chapter's markdown, in order."""
    numbers = {}
    for k, match in enumerate(re.finditer(r"^:{3,}\{exercise(?:-start)?\}[ \t]*(.*)\n((?:[ \t]*:[\w-]+:.*\n)*)", text + "\n", re.M), 1):
        label = re.search(r":label:[ \t]*(\S+)", match.group(2))
        numbers[label.group(1) if label else f"#{k}"] = (f"{chapter}.{k}", match.group(1).strip())
    return numbers


# --- markdown ---------------------------------------------------------------------------------------

@dataclass
class Chapter:
    """One chapter being translated: its place in the book and the state carried from cell to cell."""

    book: Book
    path: Path                      # book/NN_slug.ipynb, from the repository root
    exercises: dict[str, tuple[str, str]]
    heading_level: int = 1          # of the last heading seen
    exercise_count: int = 0

    @property
    def docname(self) -> str:
        return self.path.with_suffix("").as_posix()

    def resolve_doc(self, target: str) -> str:
        target = target.strip()
        path = target.lstrip("/") if target.startswith("/") else os.path.normpath(Path(self.docname).parent / target)
        return Path(path).as_posix().removesuffix(".md").removesuffix(".ipynb").removesuffix(".html")


def _split_explicit(body: str) -> tuple[str | None, str]:
    match = EXPLICIT.match(body.strip())
    if match and match.group("text"):
        return match.group("text"), match.group("target").strip()
    return None, body.strip()


def translate_role(name: str, body: str, chapter: Chapter) -> str:
    """The plain markdown of one MyST role."""
    text, target = _split_explicit(body)
    book = chapter.book
    if name == "term":
        return book.term_link(text or target, target)
    if name == "doc":
        docname = chapter.resolve_doc(target)
        if docname not in book.titles:
            raise ValueError(f"{{doc}}`{body}`: no page {docname!r} in _toc.yml")
        return f"[{text or book.titles[docname]}]({page_url(docname)})"
    if name in ("ref", "numref", "prf:ref"):
        if target not in book.labels:
            raise ValueError(f"{{{name}}}`{body}`: no label {target!r} in the book")
        docname, default = book.labels[target]
        if text and ("%s" in text or "{number}" in text):  # numref's "Section %s": the target's number
            number = re.match(r"(?:Exercise )?(\d+(?:\.\d+)*)", default)
            text = text.replace("%s", number.group(1) if number else default).replace("{number}", number.group(1) if number else default)
        return f"[{text or default}]({page_url(docname, target)})"
    if name == "math":
        return f"${body}$"
    if name in ("sub", "sup"):
        return f"<{name}>{html.escape(body)}</{name}>"
    if name == "kbd":
        return f"<kbd>{html.escape(body)}</kbd>"
    if name == "abbr":
        return re.sub(r"\s*\([^)]*\)$", "", body)
    if name == "download":
        path = (Path(chapter.docname).parent / target).as_posix()
        return f"[{text or Path(target).name}]({raw_url(path)})"
    raise ValueError(f"{chapter.path}: the role {{{name}}} has no Colab translation; add one to tools/colab_edition.py")


def outside_code_blocks(text: str, change: Callable[[str], str]) -> str:
    """``text`` with ``change`` applied to every part outside fenced code blocks."""
    parts, plain, fence = [], [], None
    for line in text.split("\n"):
        stripped = line.strip()
        if fence is None and (code := CODE_FENCE.match(line)):
            parts.append(change("\n".join(plain)))
            plain, fence = [line], code.group(1)
        elif fence is not None:
            plain.append(line)
            if stripped and set(stripped) == {fence[0]} and len(stripped) >= len(fence):
                parts.append("\n".join(plain))
                plain, fence = [], None
        else:
            plain.append(line)
    parts.append("\n".join(plain) if fence is not None else change("\n".join(plain)))
    return "\n".join(parts)


def translate_roles(text: str, chapter: Chapter) -> str:
    """Every role outside code replaced by its plain markdown."""
    def one(match: re.Match[str]) -> str:
        if match.group("code"):
            return match.group()
        return translate_role(match.group("name"), match.group("body"), chapter)
    return outside_code_blocks(text, lambda part: ROLE_OR_CODE.sub(one, part))


def summary_html(text: str, chapter: Chapter) -> str:
    """A title (of a dropdown or an exercise) as the HTML of a ``<summary>``."""
    return inline_html(translate_roles(text, chapter))


def inline_html(text: str) -> str:
    """A one-line title as HTML (for a ``<summary>``, where markdown is not parsed): code, bold, simple math."""
    out, pos = [], 0
    for match in re.finditer(r"`([^`]+)`|\*\*([^*]+)\*\*|\$([^$]+)\$|\[([^\]]+)\]\(([^)\s]+)\)", text):
        out.append(html.escape(text[pos:match.start()], quote=False))
        code, bold, math, link, url = match.groups()
        if link is not None:
            out.append(f'<a href="{html.escape(url)}">{inline_html(link)}</a>')
        elif code is not None:
            out.append(f"<code>{html.escape(code, quote=False)}</code>")
        elif bold is not None:
            out.append(f"<b>{html.escape(bold, quote=False)}</b>")
        else:
            simple = re.fullmatch(r"([A-Za-z])(?:_\{?(\w+)\}?)?", math.strip())
            if simple:
                out.append(f"<i>{simple.group(1)}</i>" + (f"<sub>{simple.group(2)}</sub>" if simple.group(2) else ""))
            else:
                out.append(f"${math}$")
        pos = match.end()
    out.append(html.escape(text[pos:], quote=False))
    return "".join(out)


def details(summary: str, body: str) -> str:
    """A folded block: the summary line, then the body as markdown (blank lines around it)."""
    return f"<details>\n<summary><b>{summary}</b></summary>\n\n{body.strip()}\n\n</details>"


def _find_close(lines: list[str], start: int, fence: str) -> int:
    """The index of the line that closes the directive opened at ``start`` with ``fence``."""
    char, count = fence[0], len(fence)
    in_code: str | None = None
    for i in range(start + 1, len(lines)):
        stripped = lines[i].strip()
        code = CODE_FENCE.match(lines[i])
        if in_code is not None:
            if stripped and set(stripped) == {in_code[0]} and len(stripped) >= len(in_code):
                in_code = None
            continue
        if stripped and set(stripped) == {char} and len(stripped) >= count:
            return i
        if code and char == ":":  # a code block (or a backtick directive) inside: skip to its end
            in_code = code.group(1)
    raise ValueError(f"the directive {lines[start].strip()!r} is never closed")


def _options(lines: list[str]) -> tuple[dict[str, str], list[str]]:
    options, i = {}, 0
    if lines and lines[0].strip() == "---":  # a YAML block of options
        end = next(j for j in range(1, len(lines)) if lines[j].strip() == "---")
        options = {k: str(v) for k, v in (yaml.safe_load("\n".join(lines[1:end])) or {}).items()}
        return options, lines[end + 1:]
    while i < len(lines) and (match := OPTION.match(lines[i])):
        options[match.group("key")] = match.group("value")
        i += 1
    return options, lines[i:]


def translate_directive(name: str, arg: str, options: dict[str, str], body: str, chapter: Chapter) -> str:
    """The plain markdown of one directive (its body already translated)."""
    classes = set(options.get("class", "").split())
    if name in ("exercise", "exercise-start"):
        chapter.exercise_count += 1
        label = options.get("label", f"#{chapter.exercise_count}")
        number, title = chapter.exercises.get(label, (f"{chapter_number(chapter.path)}.{chapter.exercise_count}", arg))
        level = "#" * min(chapter.heading_level + 1, 6)
        return f"{level} Exercise {number}: {title}\n\n{body}".strip()
    if name == "exercise-end":
        return body
    if name in ("admonition", "dropdown") or name in ADMONITIONS:
        title = arg if name in ("admonition", "dropdown") else name.capitalize().replace("Seealso", "See also")
        if name not in ("admonition", "dropdown") and arg:
            body = f"{arg}\n{body}"
        if name == "dropdown" or classes & FOLDED_CLASSES:
            return details(summary_html(title, chapter), body)
        return f"---\n\n**{title}**\n\n{body.strip()}\n\n---"
    if name in ("math",):
        return f"$$\n{body.strip()}\n$$"
    if name in ("code-block", "code", "sourcecode"):
        return f"```{arg}\n{body.rstrip()}\n```"
    if name in ("figure", "image"):
        alt = options.get("alt", "")
        image = f"![{alt}]({arg})"
        return f"{image}\n\n{body}".strip() if name == "figure" else image
    if name in ("margin", "sidebar", "epigraph", "topic"):
        return f"---\n\n{('**' + arg + '**') if arg else ''}\n\n{body.strip()}\n\n---"
    raise ValueError(f"{chapter.path}: the directive {{{name}}} has no Colab translation; add one to tools/colab_edition.py")


def translate_lines(lines: list[str], chapter: Chapter) -> list[str]:
    """Markdown lines with every directive, comment and target translated (code blocks untouched)."""
    out: list[str] = []
    i, in_code, in_math = 0, None, False
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if in_code is not None:
            out.append(line)
            if stripped and set(stripped) == {in_code[0]} and len(stripped) >= len(in_code):
                in_code = None
            i += 1
            continue
        if in_math:
            out.append(line)
            in_math = not stripped.endswith("$$")
            i += 1
            continue
        opened = FENCE_OPEN.match(line)
        if opened:
            close = _find_close(lines, i, opened.group("fence"))
            options, body = _options(lines[i + 1:close])
            name = opened.group("name")
            verbatim = name in ("code-block", "code", "sourcecode", "math")
            inner = "\n".join(body if verbatim else translate_lines(body, chapter))
            block = translate_directive(name, opened.group("arg"), options, inner, chapter)
            indent = opened.group("indent")
            out += ["", *[indent + part if part else part for part in block.split("\n")], ""]
            i = close + 1
            continue
        code = CODE_FENCE.match(line)
        if code:
            in_code = code.group(1)
            out.append(line)
        elif stripped.startswith("$$"):
            in_math = stripped == "$$" or not stripped[2:].endswith("$$")
            out.append(line)
        elif COMMENT.match(line) or TARGET.match(line):
            pass
        else:
            if HEADING.match(line):
                chapter.heading_level = len(line) - len(line.lstrip("#"))
            out.append(line)
        i += 1
    return out


def resolve_paths(text: str, chapter: Chapter) -> str:
    """Relative image sources -> the file on GitHub; relative links -> the page on the website."""
    folder = Path(chapter.docname).parent

    def relative(path: str) -> bool:
        return not re.match(r"^[a-z][a-z0-9+.-]*:|^#|^/", path, re.I)

    def image(match: re.Match[str]) -> str:
        path = match.group("path")
        if relative(path):
            path = raw_url(Path(os.path.normpath(folder / path)).as_posix())
        return match.group("head") + path + match.group("tail")

    def link(match: re.Match[str]) -> str:
        path = match.group("path")
        if relative(path):
            target, _, anchor = path.partition("#")
            docname = chapter.resolve_doc(target) if target else chapter.docname
            if docname in chapter.book.titles:
                path = page_url(docname, chapter.book.anchors.get(docname, {}).get(anchor, anchor))
            else:
                path = blob_url(Path(os.path.normpath(folder / target)).as_posix()) + (f"#{anchor}" if anchor else "")
        elif path.startswith("#"):
            path = page_url(chapter.docname, chapter.book.anchors.get(chapter.docname, {}).get(path[1:], path[1:]))
        return match.group("head") + path + match.group("tail")

    def part(text: str) -> str:
        def one(match: re.Match[str]) -> str:
            if match.group("code"):
                return match.group()
            return (image if match.group("bang") else link)(match)
        return HTML_IMG.sub(image, LINK_OR_CODE.sub(one, text))

    return outside_code_blocks(text, part)


def _tidy(text: str) -> str:
    """No trailing spaces or runs of blank lines left by removed lines (code blocks kept as they are)."""
    def part(text: str) -> str:
        return re.sub(r"\n{3,}", "\n\n", re.sub(r"[ \t]+$", "", text, flags=re.M))
    return outside_code_blocks(text, part).strip("\n")


def translate_markdown(source: str, chapter: Chapter) -> str:
    """A markdown cell of the book as Colab should show it."""
    text = "\n".join(translate_lines(source.split("\n"), chapter))
    text = translate_roles(text, chapter)
    text = SCRIPT.sub("", text)
    return _tidy(resolve_paths(text, chapter))


# --- notebooks --------------------------------------------------------------------------------------

def _without_fence(source: str, pattern: re.Pattern[str]) -> str:
    """``source`` less the solution-start/-end fence (with its options and closing line)."""
    match = pattern.search(source)
    if match is None:
        return source
    close = sync_notebooks._fence_end(source, match.start(), len(match.group(1)))
    return source[:match.start()] + source[close:]


def optional_cell_source(lines: list[str]) -> str:
    """An optional code cell (``# Going further (optional): ...`` first) titled for Colab's form view,
    its code unchanged: Colab shows the title and hides the code until "Show code" is clicked."""
    return "\n".join(["# @title Going further (optional)", *lines])


def edition(path: Path, book: Book | None = None) -> Any:
    """The Colab edition of the chapter notebook ``path`` (from the repository root)."""
    book = book or Book.read()
    nb = nbformat.read(ROOT / path, as_version=4)
    markdown = "\n\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    chapter = Chapter(book, Path(path), exercise_numbers(markdown, chapter_number(path)))
    roles = sync_notebooks.solution_roles(nb)
    out = copy.deepcopy(nb)
    cells = []
    solution: tuple[str, str] = ("", "")  # (number, title) of the solution being written
    folded_text = 0                        # text cells of that solution so far
    title_done = False
    for cell, role in zip(out.cells, roles):
        if cell.cell_type == "code":
            lines = cell.source.split("\n")
            if not cells and cell.source.startswith(sync_colab.MARKER):
                cell.source = "\n".join([SETUP_TITLE, *lines])
                cell.metadata["cellView"] = "form"
            elif role == "body" and lines[0].startswith(SOLUTION_TITLE):
                number, title = solution
                heading = f"# @title Solution to Exercise {number}: {title}"
                if len(heading) > MAX_LINE:  # the exercise's heading just above names it in full
                    heading = f"# @title Solution to Exercise {number}"
                cell.source = "\n".join([heading, *lines[1:]])
            elif "hide-cell" in cell.metadata.get("tags", []) and lines[0].startswith(sync_notebooks.OPTIONAL):
                cell.source, cell.metadata["cellView"] = optional_cell_source(lines), "form"
            cells.append(cell)
            continue
        if cell.cell_type != "markdown":
            cells.append(cell)
            continue
        if "remove-cell" in cell.metadata.get("tags", []):
            continue  # JupyterLab's own cells (the chapter's glossary), which the website drops too
        # A written solution's fold for JupyterLab: this edition folds it its own way, once.
        source = sync_notebooks.unfold_written_solution(cell.source) if role is not None else cell.source
        if role == "start":
            match = sync_notebooks.START.search(source)
            label = source[match.end():].split("\n", 1)[0].strip()
            if label not in chapter.exercises:
                raise ValueError(f"{path}: a solution of {label!r}, which is no exercise's label")
            solution, folded_text = chapter.exercises[label], 0
            source = _without_fence(source, sync_notebooks.START)
        elif role in ("end", "end-fence"):
            source = _without_fence(source, sync_notebooks.END)
        elif sync_notebooks.START.search(source) or sync_notebooks.END.search(source):
            raise ValueError(f"{path}: a solution fence in a cell with other text; run tools/sync_notebooks.py")
        text = translate_markdown(source, chapter)
        if role is not None and text:
            number, title = solution
            summary = (f"Solution to Exercise {number}: {summary_html(title, chapter)}" if folded_text == 0
                       else f"Solution to Exercise {number}, continued")
            folded_text += 1
            text = details(summary, text)
        if not text:
            continue  # it held only a fence, a target or a comment
        if not title_done and re.match(r"^#[ \t]", text):
            head, _, rest = text.partition("\n")
            note = (f"*The Colab edition of this chapter; the same chapter is on [the book's website]({page_url(chapter.docname)}). "
                    "The folded first cell sets up the book's code: run it first, or use Runtime > Run all.*")
            text = f"{head}\n\n{note}\n\n{rest.lstrip()}".rstrip()
            title_done = True
        cell.source = text
        cells.append(cell)
    out.cells = cells
    out.metadata["colab"] = {"toc_visible": True}
    nbformat.validate(out)
    return out


def render(nb: Any) -> str:
    """The file text nbformat writes for ``nb``."""
    text = nbformat.writes(nb)
    return text if text.endswith("\n") else text + "\n"


def readme(notebooks: list[Path], book: Book) -> str:
    """README.md with its list of Colab links (between the two marker comments) rewritten."""
    text = (ROOT / README).read_text(encoding="utf-8")
    if LINKS_START not in text or LINKS_END not in text:
        raise ValueError(f"README.md has lost the marker comments {LINKS_START!r} and {LINKS_END!r}")
    head, rest = text.split(LINKS_START, 1)
    _, tail = rest.split(LINKS_END, 1)
    links = [f"* [{book.titles[p.with_suffix('').as_posix()]}]({colab_url(edition_path(p))})" for p in notebooks]
    return "\n".join([head + LINKS_START, *links, LINKS_END + tail])


def build(notebooks: list[Path] | None = None) -> dict[Path, str]:
    """{path from the repository root: its text}: the edition of every chapter (or of those named)
    and, when every chapter is built, README.md with its Colab links."""
    book = Book.read()
    files = {edition_path(p): render(edition(p, book)) for p in (notebooks or toc_notebooks())}
    if notebooks is None:
        files[README] = readme(toc_notebooks(), book)
    return files


def stale(files: dict[Path, str]) -> list[str]:
    """What differs between ``files`` and ``colab/`` (a file out of step, missing or left over)."""
    problems = [str(p) for p, text in files.items()
                if not (ROOT / p).is_file() or (ROOT / p).read_text(encoding="utf-8") != text]
    extra = sorted(str(p.relative_to(ROOT)) for p in EDITION.glob("*.ipynb") if p.relative_to(ROOT) not in files)
    return problems + [f"{p} (no such chapter in _toc.yml)" for p in extra]


def main(argv: list[str]) -> int:
    files = build()
    problems = stale(files)
    if "--check" in argv:
        print("colab edition: " + ("out of step: " + ", ".join(problems) + "; run tools/colab_edition.py" if problems else "in step"))
        return 1 if problems else 0
    EDITION.mkdir(exist_ok=True)
    for path, text in files.items():
        if not (ROOT / path).is_file() or (ROOT / path).read_text(encoding="utf-8") != text:
            (ROOT / path).write_text(text, encoding="utf-8")
    for path in EDITION.glob("*.ipynb"):
        if path.relative_to(ROOT) not in files:
            path.unlink()
    print("updated: " + (", ".join(p for p in problems) if problems else "nothing"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
