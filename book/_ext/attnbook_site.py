"""The book's own small Sphinx extension (listed in ``_config.yml``, ``sphinx.local_extensions``).

* Each inline script and script file appears once per page. sphinx-thebe 0.3.1 and
  sphinx-togglebutton 0.4.5 call ``app.add_js_file(None, body=...)`` after the HTML builder
  exists; Sphinx 7.4 then stores the script twice, once as filename ``None`` (the builder's copy)
  and once as ``''`` (copied again from the registry), which its duplicate check sees as two
  scripts. The second ``const THEBE_JS_URL`` threw "Identifier 'THEBE_JS_URL' has already been
  declared" on every page.
* Long inline code may wrap on a phone (:data:`LONG_LITERAL`).
* Search aliases (:data:`SEARCH_ALIASES`): "flash" finds every page about FlashAttention.
* The book's own static files (``book/_static``) are copied on every build, changed or not.
* A solution's ``# @title`` line (Colab's form title, written by ``tools/sync_notebooks.py``) is
  left out of the page (:func:`drop_colab_titles`): the website folds the solution its own way.
* A written solution's "Show the solution" dropdown and the HTML around its ``solution-end``
  fence (written by ``tools/sync_notebooks.py`` so that JupyterLab keeps it folded after Run All)
  are left out of the page (:func:`drop_lab_folds`): the website folds the whole solution in one dropdown.
* Exercises are numbered per chapter, "Exercise 3.1" (:func:`number_exercises_by_chapter`).
* ``fontawesome.js`` (1.45 MB, every icon of Font Awesome 6) is replaced by a few kilobytes
  holding only the icons the built pages use (see :func:`slim_fontawesome`).
* Code is highlighted without a ``<span>`` around the tokens that both the light and the dark
  Pygments style draw exactly like plain text (names, punctuation, whitespace in the a11y
  styles): the page looks the same and its code weighs about half as much
  (:func:`drop_plain_spans`).
* The Colab launch button of a chapter opens its Colab edition, ``colab/NAME.ipynb`` (written by
  ``tools/colab_edition.py``, MyST translated to what Colab renders), not the chapter notebook
  (:func:`colab_edition_button`).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from sphinx.util import logging

logger = logging.getLogger(__name__)

ICON_JS = Path(__file__).resolve().parent / "icons.js"
STATIC = Path(__file__).resolve().parent.parent / "_static"
COLAB_EDITION = Path(__file__).resolve().parents[2] / "colab"


def dedupe_scripts(app: Any, pagename: str, templatename: str, context: dict, doctree: Any) -> None:
    seen, unique = set(), []
    for script in context.get("script_files", []):
        key = (getattr(script, "filename", str(script)) or "", tuple(sorted((k, str(v)) for k, v in getattr(script, "attributes", {}).items())))
        if key not in seen:
            seen.add(key)
            unique.append(script)
    if "script_files" in context:
        context["script_files"][:] = unique


# Runs the theme's own fontawesome.js under Node with a stand-in `window`, and prints the
# [width, height, path] of the icons asked for (argv: the bundle, then the names), per icon set.
_EXTRACT_JS = """
global.window = {}; global.document = {documentElement: {}, head: null, readyState: "loading",
  addEventListener() {}, querySelector() { return null; }};
require(process.argv[1]);
const styles = window.___FONT_AWESOME___.styles, want = new Set(process.argv.slice(2)), out = {};
for (const set of ["fas", "far", "fab"]) {
  out[set] = {};
  for (const [name, icon] of Object.entries(styles[set] || {}))
    if (want.has(name)) out[set][name] = [icon[0], icon[1], icon[4]];
}
console.log(JSON.stringify(out));
"""


def slim_fontawesome(app: Any, exception: Exception | None) -> None:
    """Overwrite the built ``_static/scripts/fontawesome.js`` with the book's icon script.

    The icons are those named (``fa-NAME``) in the built HTML or the theme's scripts, with their
    paths taken from the theme's own fontawesome.js (read by Node), so the pages look the same.
    Without Node the theme's file stays as it is (the site works; it is only heavier).
    """
    if exception is not None or app.builder.format != "html":
        return
    out = Path(app.outdir)
    target = out / "_static" / "scripts" / "fontawesome.js"
    node = shutil.which("node")
    if not target.is_file() or node is None:
        logger.info("attnbook_site: fontawesome.js kept as the theme ships it (no Node found)")
        return
    bundle = target.read_text(encoding="utf-8")
    if bundle.startswith("/* attnbook icons"):  # already slimmed (an incremental build)
        return
    used: set[str] = set()
    for path in [*out.rglob("*.html"), *(out / "_static" / "scripts").glob("*.js")]:
        if path != target:
            used |= set(re.findall(r"\bfa-([a-z0-9-]+)", path.read_text(encoding="utf-8", errors="replace")))
    run = subprocess.run([node, "-e", _EXTRACT_JS, str(target), *sorted(used)], capture_output=True, text=True, check=True)
    icons = json.loads(run.stdout)
    script = ICON_JS.read_text(encoding="utf-8").replace("/*ICONS*/{}", json.dumps(icons, separators=(",", ":")))
    target.write_text("/* attnbook icons: the Font Awesome 6 Free icons this book uses (icons CC BY 4.0, "
                      "fontawesome.com/license/free) */\n" + script, encoding="utf-8")
    target.with_name("fontawesome.js.map").unlink(missing_ok=True)


#: Words a reader may type that a page does not spell out as a word of its own: search matches
#: whole words, so "flash" did not find the pages that only say "FlashAttention" or
#: ``flash_attention``. A page that mentions a key gets its alias as a search keyword.
SEARCH_ALIASES = {"flashattention": "flash", "flash_attention": "flash"}


#: Inline code at least this long may break anywhere on a phone (class ``attnbook-long``, see
#: attnbook.css): ``torch.nn.functional.scaled_dot_product_attention`` made pages 528 px wide.
#: Shorter code keeps the theme's no-wrap, so ``-inf`` is never split into ``-`` and ``inf``.
LONG_LITERAL = 16


def mark_long_literals(app: Any, doctree: Any) -> None:
    from docutils import nodes

    for node in doctree.findall(nodes.literal):
        if len(node.astext()) >= LONG_LITERAL:
            node["classes"].append("attnbook-long")


def add_search_aliases(app: Any, doctree: Any) -> None:
    from docutils import nodes

    text = doctree.astext().lower()
    words = sorted({alias for key, alias in SEARCH_ALIASES.items() if key in text})
    if words:
        doctree.append(nodes.meta("", name="keywords", content=", ".join(words)))


def drop_colab_titles(app: Any, doctree: Any) -> None:
    """Leave out the first line, ``# @title ...``, of a code cell in Colab's form view."""
    from docutils import nodes

    for cell in doctree.findall(nodes.container):
        if cell.get("nb_element") != "cell_code" or (cell.get("cell_metadata") or {}).get("cellView") != "form":
            continue
        for block in cell.findall(nodes.literal_block):
            first, _, rest = block.astext().partition("\n")
            if first.startswith("# @title "):
                block.children = [nodes.Text(rest)]
                block.rawsource = rest
            break


def drop_lab_folds(app: Any, doctree: Any) -> None:
    """Leave out what folds a written solution for JupyterLab: the "Show the solution" dropdown
    around its text (the text stays) and the HTML lines around its ``solution-end`` fence."""
    import sys

    from docutils import nodes

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
    from sync_notebooks import FOLD_TITLE, GATE_CLOSE, GATE_OPEN

    for node in list(doctree.findall(nodes.raw)):
        if "html" in node.get("format", "").split() and node.astext().strip() in (GATE_OPEN, GATE_CLOSE):
            node.parent.remove(node)
    for node in list(doctree.findall(nodes.admonition)):
        title = node.next_node(nodes.title)
        if "dropdown" in node["classes"] and title is not None and title.astext() == FOLD_TITLE:
            node.replace_self([child for child in node.children if not isinstance(child, nodes.title)])


def colab_edition_button(app: Any, pagename: str, templatename: str, context: dict, doctree: Any) -> None:
    """Point the theme's Colab launch button (``.../blob/BRANCH/book/NAME.ipynb``) at the chapter's
    Colab edition, ``.../blob/BRANCH/colab/NAME.ipynb``, where there is one."""
    edition = COLAB_EDITION / f"{Path(pagename).name}.ipynb"
    if not edition.is_file():
        return
    for group in context.get("header_buttons") or []:
        for button in group.get("buttons", []) if isinstance(group, dict) else []:
            if button.get("text") == "Colab" and "/blob/" in button.get("url", ""):
                head, _, rest = button["url"].partition("/blob/")
                button["url"] = f"{head}/blob/{rest.split('/', 1)[0]}/{COLAB_EDITION.name}/{edition.name}"


def refresh_static(app: Any, exception: Exception | None) -> None:
    """Copy the book's own static files again: an incremental Sphinx 7.4 build keeps an older
    copy already in ``_build/html/_static`` rather than overwrite it."""
    if exception is not None or app.builder.format != "html":
        return
    for source in STATIC.iterdir():
        target = Path(app.outdir) / "_static" / source.name
        if source.is_file() and (not target.is_file() or target.read_bytes() != source.read_bytes()):
            shutil.copyfile(source, target)


#: The theme's own defaults, used where ``_config.yml`` names no Pygments style.
DEFAULT_PYGMENTS_STYLES = {"pygments_light_style": "a11y-high-contrast-light", "pygments_dark_style": "a11y-high-contrast-dark"}


def plain_token_types(style_names: list[str]) -> frozenset:
    """Token types that every one of ``style_names`` draws exactly like plain text (``Text``)."""
    from pygments.styles import get_style_by_name
    from pygments.token import STANDARD_TYPES, Text

    styles = [get_style_by_name(name) for name in style_names]
    return frozenset(
        t for t in STANDARD_TYPES
        if t is not Text and all(style.style_for_token(t) == style.style_for_token(Text) for style in styles)
    )


def drop_plain_spans(app: Any) -> None:
    highlighter = getattr(app.builder, "highlighter", None)
    if highlighter is None or getattr(highlighter, "dest", None) != "html":
        return
    from pydata_sphinx_theme.utils import get_theme_options_dict
    from pygments.util import ClassNotFound

    options = get_theme_options_dict(app)
    names = [options.get(key) or default for key, default in DEFAULT_PYGMENTS_STYLES.items()]
    try:
        plain = plain_token_types(names)
    except ClassNotFound:  # a style the theme will not find either: keep every span
        return
    base = highlighter.formatter

    class PlainSpanFormatter(base):  # type: ignore[misc, valid-type]
        def _get_css_classes(self, ttype: Any) -> str:
            return "" if ttype in plain else super()._get_css_classes(ttype)

    highlighter.formatter = PlainSpanFormatter


def number_exercises_by_chapter(app: Any, env: Any) -> list[str]:
    """Number exercises per chapter, "Exercise 3.1", as JupyterLab and the Colab edition do, instead
    of through the whole book ("Exercise 6" for chapter 3's first). Runs after Sphinx has assigned
    its book-wide numbers (``env-get-updated``, late priority) and renumbers each chapter's
    exercises (``book/NN_slug``) in their order on the page; solution titles and references
    read the same numbers."""
    for docname, kinds in env.toc_fignumbers.items():
        match = re.match(r"book/(\d\d)_", docname)
        if not match or "exercise" not in kinds:
            continue
        ordered = sorted(kinds["exercise"].items(), key=lambda item: item[1])
        kinds["exercise"] = {ident: (int(match.group(1)), k) for k, (ident, _) in enumerate(ordered, 1)}
    return []


def accept_lab_exercise_numbers() -> None:
    """Let sphinx-exercise's exercise directives take the ``:enumerator: N.k`` option that
    ``tools/sync_notebooks.py`` writes for jupyterlab-myst, and ignore it: the website numbers the
    exercises per chapter itself (:func:`number_exercises_by_chapter`), with the same numbers."""
    from docutils.parsers.rst import directives
    from sphinx_exercise.directive import ExerciseDirective, ExerciseStartDirective

    for directive in (ExerciseDirective, ExerciseStartDirective):
        directive.option_spec = {**directive.option_spec, "enumerator": directives.unchanged}


def setup(app: Any) -> dict[str, Any]:
    accept_lab_exercise_numbers()
    app.connect("env-get-updated", number_exercises_by_chapter, priority=900)
    app.connect("builder-inited", drop_plain_spans)
    # Early: html-page-context stops at the first listener that returns a template name.
    app.connect("html-page-context", dedupe_scripts, priority=100)
    # After sphinx-book-theme's add_launch_buttons (priority 501) has made the button.
    app.connect("html-page-context", colab_edition_button, priority=600)
    app.connect("doctree-read", add_search_aliases)
    app.connect("doctree-read", mark_long_literals)
    app.connect("doctree-read", drop_colab_titles)
    app.connect("doctree-read", drop_lab_folds)
    app.connect("build-finished", refresh_static)
    app.connect("build-finished", slim_fontawesome)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
