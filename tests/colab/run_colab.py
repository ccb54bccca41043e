"""Run every chapter as a reader does in Google Colab's CPU runtime, and compare with the stored outputs.

Usage (``make test-colab`` builds the environment first, then runs this with the book's Python)::

    .venv/bin/python tests/colab/run_colab.py [--venv .venv-colab] [book/NN_slug.ipynb ...]

``--venv DIR --requirements FILE`` runs the chapters in another recorded image, built from FILE.

First the Colab edition of those chapters (``colab/NN_slug.ipynb``, what the website's Colab button
opens; ``tools/colab_edition.py`` writes it) is checked as Colab renders its markdown
(``tests/colab/check_edition.py``): no raw MyST, every written solution folded in ``<details>``,
the setup cell folded, the edition in step with the chapters. Any problem there fails the run
before a kernel starts. Then each chapter's edition runs.

For each notebook of ``_toc.yml`` (or those named: ``book/`` or ``colab/`` paths, the edition
runs either way), in a fresh kernel started from the Colab
environment (``tests/colab/requirements-colab.txt``, installed in ``--venv``), top to bottom:

* The kernel starts as Colab's does, with ``google.colab`` imported (a stand-in, ``stub/``).
* The first cell, the Colab cell written by ``tools/sync_colab.py`` (in the edition under a
  ``# @title`` line that folds it), runs as it stands, except that
  its ``/content`` becomes a fresh temporary folder (one per chapter, as each Colab runtime has its
  own). Its ``git clone`` of the repository URL of ``_config.yml`` is redirected, by git's
  ``url.<base>.insteadOf`` in a temporary git configuration, to a snapshot of this working tree
  (tracked and untracked files that git does not ignore, committed on the configured branch), so
  the chapter runs the code of this checkout, installed by pip as in Colab.
* Before each chapter the environment is put back to the recorded image: what an earlier chapter's
  cell installed (attnlib, the model package) is uninstalled.

A chapter FAILS when a cell raises, when anything is written to stderr (log lines and warnings a
reader would have to ignore; no stored output has any), when the Colab cell prints anything, or when
the Colab cell replaces a package that Colab ships. Outputs that differ from the stored ones, after
the sanitizers of ``tests/nbval_sanitize.cfg`` and masking version strings (``5.15.0``,
``2.13.0+cpu``), are REPORTED per chapter (cell index in the notebook, counting from 0, and the
first differing line), not failed: the stored outputs come from the book's pinned environment.
Images and widget views are not compared.
"""

from __future__ import annotations

import argparse
import configparser
import difflib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tools"))
import sync_colab  # noqa: E402
import check_edition  # noqa: E402
import colab_edition  # noqa: E402
from toc import toc_notebooks  # noqa: E402

REQUIREMENTS = HERE / "requirements-colab.txt"
KERNEL = "colab-simulated"
#: Version strings, masked before outputs are compared: "5.15.0", "2.13.0+cpu", "1.2.3rc1".
VERSION = re.compile(r"(?<![\w.])\d+\.\d+\.\d+(?:\.?(?:post|dev|a|b|rc)\d+)*(?:\+[\w.]+)?(?![\w.])")
#: MIME types compared; images (whose bytes change with matplotlib's version) and widget views are not.
COMPARED = ("text/plain", "text/html", "text/markdown", "text/latex")
IGNORE_TAGS = {"nbval-ignore-output"}
#: Environment variables of this machine's Python setup that a Colab kernel would not have.
DROPPED_ENV = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PIP_DISABLE_PIP_VERSION_CHECK", "MPLBACKEND", "JUPYTER_PATH",
               "JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "IPYTHONDIR")


@dataclass
class Result:
    notebook: Path
    seconds: float = 0.0
    setup_seconds: float = 0.0
    failures: list[str] = field(default_factory=list)
    differences: list[str] = field(default_factory=list)
    installed: list[str] = field(default_factory=list)
    slowest: list[str] = field(default_factory=list)


# --- the environment -------------------------------------------------------------------------------

def image_pins(requirements: Path = REQUIREMENTS) -> dict[str, Requirement]:
    """The recorded Colab packages, by normalised name."""
    pins = {}
    for line in requirements.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            pins[canonicalize_name(req.name)] = req
    return pins


def installed(python: Path) -> dict[str, str]:
    """{normalised name: version} of every distribution in the environment of ``python``."""
    code = ("import importlib.metadata as m, json; "
            "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))")
    out = subprocess.run([str(python), "-c", code], check=True, capture_output=True, text=True).stdout
    return {canonicalize_name(k): v for k, v in json.loads(out).items()}


def restore_image(python: Path, pins: dict[str, Requirement]) -> tuple[list[str], list[str]]:
    """Uninstall what is not in the image. Returns (removed "name==version", image packages changed)."""
    now = installed(python)
    extra = sorted(name for name in now if name not in pins and name not in ("pip", "setuptools", "wheel"))
    changed = [f"{name} {now.get(name, 'missing')} (Colab: {req.specifier})"
               for name, req in sorted(pins.items()) if name not in now or not req.specifier.contains(now[name], prereleases=True)]
    if extra:
        subprocess.run([str(python), "-m", "pip", "uninstall", "--yes", "--quiet", *extra], check=True, capture_output=True)
    return [f"{name}=={now[name]}" for name in extra], changed


# --- the repository, "cloned" from this checkout ---------------------------------------------------

def snapshot_repository(dest: Path, branch: str) -> None:
    """Commit this working tree (tracked and untracked, not ignored) on ``branch`` of a new repository."""
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            check=True, capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = ROOT / rel
        if src.is_symlink() or src.is_file():  # a tracked file deleted in the working tree is skipped
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel, follow_symlinks=False)
    git = ["git", "-C", str(dest), "-c", "user.name=make test-colab", "-c", "user.email=test-colab@localhost"]
    subprocess.run(["git", "init", "--quiet", "--initial-branch", branch, str(dest)], check=True)
    subprocess.run([*git, "add", "--all"], check=True)
    subprocess.run([*git, "commit", "--quiet", "--no-verify", "-m", "working tree for make test-colab"], check=True)


def kernel_environment(venv: Path, work: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV}
    system_path = [p for p in env.get("PATH", "/usr/bin:/bin").split(os.pathsep)
                   if not (Path(p) / "activate").exists() and "pyenv" not in p]
    env["PATH"] = os.pathsep.join([str(venv / "bin"), *system_path])  # `!pip` and `python` are the runtime's
    env["GIT_CONFIG_GLOBAL"] = str(work / "gitconfig")
    env["GIT_CONFIG_NOSYSTEM"] = "1"
    env["MPLCONFIGDIR"] = str(venv / "mplconfig")  # the image's matplotlib font cache, built once
    env["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"  # ipykernel 6's debugger would log a warning on start
    return env


# --- comparing outputs -----------------------------------------------------------------------------

def sanitizers() -> list[tuple[re.Pattern[str], str]]:
    """The regex/replace pairs of tests/nbval_sanitize.cfg, as nbval applies them."""
    config = configparser.ConfigParser()
    config.read(ROOT / "tests" / "nbval_sanitize.cfg", encoding="utf-8")
    return [(re.compile(config[s]["regex"]), config[s]["replace"]) for s in config.sections()]


def comparable(cell: nbformat.NotebookNode, subs: list[tuple[re.Pattern[str], str]]) -> list[str]:
    """The cell's compared outputs as lines of text, sanitized, streams of one name joined."""
    parts: list[tuple[str, str]] = []
    for out in cell.get("outputs", []):
        if out.output_type == "stream":
            if parts and parts[-1][0] == out.name:
                parts[-1] = (out.name, parts[-1][1] + out.text)
            else:
                parts.append((out.name, out.text))
        elif out.output_type in ("execute_result", "display_data"):
            parts += [(mime, out.data[mime]) for mime in COMPARED if mime in out.data]
        elif out.output_type == "error":
            parts.append(("error", f"{out.ename}: {out.evalue}"))
    lines = []
    for kind, text in parts:
        text = "".join(text) if isinstance(text, list) else text
        for pattern, replace in subs:
            text = pattern.sub(replace, text)
        text = VERSION.sub("<version>", text)
        lines += [f"[{kind}] {line}" for line in text.splitlines()]
    return lines


def first_difference(stored: list[str], fresh: list[str]) -> str:
    matcher = difflib.SequenceMatcher(None, stored, fresh, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag != "equal":
            a = stored[i1] if i1 < i2 else "(nothing)"
            b = fresh[j1] if j1 < j2 else "(nothing)"
            changed = max(i2 - i1, j2 - j1)
            more = f" (+{changed - 1} more lines)" if changed > 1 else ""
            return f"stored {_short(a)} | colab {_short(b)}{more}"
    return "identical"


def _short(text: str, width: int = 90) -> str:
    return repr(text if len(text) <= width else text[: width - 3] + "...")


def ignored(cell: nbformat.NotebookNode) -> bool:
    return bool(IGNORE_TAGS & set(cell.metadata.get("tags", []))) or "NBVAL_IGNORE_OUTPUT" in cell.source


# --- one chapter -----------------------------------------------------------------------------------

def is_colab_cell(cell: nbformat.NotebookNode) -> bool:
    """The install cell of tools/sync_colab.py, as in the chapter or under the edition's ``# @title``."""
    lines = cell.source.split("\n")
    if lines[0].startswith("# @title "):
        lines = lines[1:]
    return cell.cell_type == "code" and lines[0].startswith(sync_colab.MARKER) and sync_colab.CLONE_DIR in cell.source


def run_notebook(path: Path, venv: Path, work: Path, timeout: int) -> Result:
    result = Result(path)
    stored = nbformat.read(ROOT / path, as_version=4)
    nb = nbformat.read(ROOT / path, as_version=4)
    first = nb.cells[0]
    if not is_colab_cell(first):
        result.failures.append("cell 0 is not the Colab cell of tools/sync_colab.py")
        return result
    content = work / f"runtime-{path.stem}" / "content"  # this chapter's fresh /content
    content.mkdir(parents=True)
    first.source = first.source.replace(sync_colab.CLONE_DIR, str(content / Path(sync_colab.CLONE_DIR).name))

    started: dict[int, float] = {}
    client = NotebookClient(nb, kernel_name=KERNEL, timeout=timeout, resources={"metadata": {"path": str(content)}},
                            on_cell_start=lambda cell, cell_index: started.setdefault(cell_index, time.perf_counter()))
    env = kernel_environment(venv, work)
    env["IPYTHONDIR"] = str(content.parent / "ipython")  # a fresh profile, no startup files
    start = time.perf_counter()
    try:
        client.execute(env=env)
    except (CellExecutionError, CellTimeoutError, DeadKernelError) as exc:
        failed = next((i for i, c in enumerate(nb.cells) if c.cell_type == "code"
                       and any(o.output_type == "error" for o in c.get("outputs", []))), None)
        if failed is None or isinstance(exc, (CellTimeoutError, DeadKernelError)):
            failed = max(started) if started else None
        if isinstance(exc, CellExecutionError):
            summary = f"{exc.ename}: {exc.evalue}"
        else:
            summary = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        summary = re.sub(r"\x1b\[[0-9;]*m", "", summary)  # IPython's colours
        ran = sum(1 for i in started if nb.cells[i].cell_type == "code")
        total = sum(1 for c in nb.cells if c.cell_type == "code")
        result.failures.append(f"cell {failed} raised: {_short(summary, 160)} ({total - ran} of {total} code cells never ran)")
    result.seconds = time.perf_counter() - start
    started[len(nb.cells)] = start + result.seconds
    ends = sorted(started)
    durations = {i: started[j] - started[i] for i, j in zip(ends, ends[1:])}
    result.slowest = sorted(durations, key=durations.get, reverse=True)[:3]
    result.slowest = [f"cell {i} {durations[i]:.1f} s" for i in result.slowest]
    if 1 in started and 0 in started:
        result.setup_seconds = started[1] - started[0]

    subs = sanitizers()
    if nb.cells[0].get("outputs"):
        result.failures.append(f"cell 0 (the Colab cell) printed: {first_difference([], comparable(nb.cells[0], []))}")
    for index, (old, new) in enumerate(zip(stored.cells, nb.cells)):
        if new.cell_type != "code" or index == 0 or index not in started:
            continue
        for out in new.get("outputs", []):
            if out.output_type == "stream" and out.name == "stderr":
                text = out.text.strip().splitlines()
                result.failures.append(f"cell {index} wrote to stderr ({len(text)} lines): {_short(text[0] if text else '', 160)}")
                break
        if ignored(new) or any(out.output_type == "error" for out in new.get("outputs", [])):
            continue  # an error is a failure, reported above
        a, b = comparable(old, subs), comparable(new, subs)
        if a != b:
            result.differences.append(f"cell {index}: {first_difference(a, b)}")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: every notebook in _toc.yml")
    parser.add_argument("--venv", type=Path, default=ROOT / ".venv-colab", help="the Colab environment (make test-colab builds it)")
    parser.add_argument("--requirements", type=Path, default=REQUIREMENTS,
                        help="the exact list --venv was built from (default: %(default)s)")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per cell")
    args = parser.parse_args()
    venv = args.venv.resolve()
    python = venv / "bin" / "python"
    if not python.exists():
        sys.exit(f"{python} not found: run `make test-colab`, which creates the Colab environment")
    chapters = [Path("book") / p.name for p in args.notebooks] or toc_notebooks()
    problems = check_edition.edition_problems(chapters)
    for chapter, found in problems.items():
        for line in found:
            print(f"FAIL {colab_edition.edition_path(chapter)}: {line}")
    if any(problems.values()):
        print(f"test-colab: the Colab edition of {sum(1 for f in problems.values() if f)} chapter(s) fails its checks (above); "
              "no chapter was run")
        return 1
    print(f"Colab edition: {len(chapters)} chapter(s) render cleanly (no raw MyST, solutions folded, setup cell folded)", flush=True)
    notebooks = [colab_edition.edition_path(p) for p in chapters]
    pins = image_pins(args.requirements)
    url, branch = sync_colab.repository()

    removed, changed = restore_image(python, pins)
    if changed:
        (venv / ".installed").unlink(missing_ok=True)
        sys.exit(f"{venv} does not hold the recorded Colab packages ({'; '.join(changed)}); run `make test-colab` to rebuild it")
    if not (venv / "mplconfig").exists():  # Colab's image comes with matplotlib's font cache built
        subprocess.run([str(python), "-c", "import matplotlib.font_manager"], check=True, capture_output=True,
                       env={**os.environ, "MPLCONFIGDIR": str(venv / "mplconfig")})
    versions = installed(python)
    runtime_python = subprocess.run([str(python), "-c", "import platform; print(platform.python_version())"],
                                    check=True, capture_output=True, text=True).stdout.strip()
    print(f"Colab CPU runtime, simulated ({os.path.relpath(args.requirements)}): Python {runtime_python} and "
          + ", ".join(f"{name} {versions[name]}" for name in ("torch", "numpy", "transformers", "ipython", "ipykernel", "ipywidgets", "matplotlib")),
          flush=True)

    results = []
    with tempfile.TemporaryDirectory(prefix="test-colab-") as tmp:
        work = Path(tmp)
        origin = work / "origin"
        snapshot_repository(origin, branch)
        (work / "gitconfig").write_text(f'[url "file://{origin}"]\n\tinsteadOf = {url}\n', encoding="utf-8")
        kernels = work / "jupyter" / "kernels"
        (kernels / KERNEL).mkdir(parents=True)
        os.environ["JUPYTER_PATH"] = str(work / "jupyter")  # where nbclient finds the kernel below
        spec = {"argv": [str(python), str(HERE / "kernel.py"), "-f", "{connection_file}"],
                "display_name": "Python 3 (Colab, simulated)", "language": "python"}
        (kernels / KERNEL / "kernel.json").write_text(json.dumps(spec), encoding="utf-8")

        for path in notebooks:
            result = run_notebook(path, venv, work, args.timeout)
            result.installed, changed = restore_image(python, pins)
            if changed:
                result.failures.append("the Colab cell replaced packages Colab ships: " + "; ".join(changed))
                (venv / ".installed").unlink(missing_ok=True)  # rebuild the environment next time
            results.append(result)
            status = "FAIL" if result.failures else "ok"
            print(f"{status:4} {path}  {result.seconds:5.1f} s (Colab cell {result.setup_seconds:.1f} s; slowest: "
                  f"{', '.join(result.slowest)})  the Colab cell installed {', '.join(result.installed) or 'nothing'}", flush=True)
            for line in result.failures:
                print(f"       FAIL {line}")
            if result.differences:
                print(f"       {len(result.differences)} cell(s) differ from the stored outputs:")
                for line in result.differences:
                    print(f"         {line}")
            if changed:
                break

    failed = [r for r in results if r.failures]
    total = sum(r.seconds for r in results)
    differing = sum(len(r.differences) for r in results)
    print(f"\n{len(results)} chapters in {total:.0f} s; {differing} cell(s) with outputs that differ from the stored ones "
          "(reported above, not failures)")
    print(f"test-colab: {len(results) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed or len(results) < len(notebooks) else 0


if __name__ == "__main__":
    sys.exit(main())
