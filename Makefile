# Inside Self-Attention: two commands on a fresh clone, `make book` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
NOTEBOOKS = $(shell $(BIN)/python tests/toc.py)

.PHONY: setup book colab colab-check explorer test test-cpus test-site test-colab test-lab lab bench bench-explorer clean help

help:
	@echo "make book       build the website into _build/html (needs npm for the attention explorer)"
	@echo "make test       unit tests + every notebook re-executed and compared (nbval)"
	@echo "make test-cpus  the notebooks again as a CPU without AVX-512 and as one thread run them"
	@echo "make test-site  build the website, then open every page in headless Chromium, offline"
	@echo "make colab      write the Colab edition (colab/: each chapter with its MyST translated for Colab)"
	@echo "make test-colab the Colab edition checked as Colab renders it, then run as in Colab's CPU runtime"
	@echo "make test-lab   every chapter in JupyterLab in headless Chromium: opening, Run All, sliders, quiz, solutions"
	@echo "make lab        open your own copy of the chapters in JupyterLab: $(LAB_DIR)/, made from book/ on"
	@echo "                the first run (later runs add new chapters and keep your edits; delete a file"
	@echo "                there to get the book's current version). Autosave writes only there, never to book/"
	@echo "make bench      attention, decoding, serving and fresh-memory benchmarks (timings, memory, page faults)"
	@echo "make bench-explorer  the attention explorer's load and run times in headless Chromium"

$(STAMP): requirements.txt pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11+ is needed (found %s)" % sys.version.split()[0])'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $(STAMP)

setup: $(STAMP)

# JavaScript packages (package.json, exact pins in package-lock.json): the WebAssembly build of
# onnxruntime-web for the attention explorer. npm writes node_modules/.package-lock.json, so a
# changed lock file reinstalls. --ignore-scripts: no package needs its install scripts here.
NODE_STAMP := node_modules/.package-lock.json
$(NODE_STAMP): package.json package-lock.json
	@command -v npm >/dev/null || { echo "npm (Node.js 18+) is needed: sudo apt-get install nodejs npm"; exit 1; }
	npm ci --no-audit --no-fund --ignore-scripts
	touch $(NODE_STAMP)

# The attention explorer's files in the built site: the ONNX export of all-MiniLM-L6-v2 (cached
# in _build/explorer-cache), its vocabulary and the runtime (attnbook/explorer.py).
explorer: setup $(NODE_STAMP)
	$(BIN)/python -m attnbook.explorer _build/html

# The Colab edition (colab/, tools/colab_edition.py): what the website's Colab buttons open. Written
# from the chapter notebooks; tests/test_colab_edition.py fails while it is out of step with them.
colab: setup
	$(BIN)/python tools/colab_edition.py

book: setup colab explorer
	$(BIN)/jupyter-book build . -W -n --keep-going

NBVAL = --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg --nbval-cell-timeout=900

# nbval compares printed decimals to one unit in their last digit (tests/nbval_numbers.py, loaded by
# conftest.py), so that the stored outputs hold on other CPUs; everything else exactly.
test: setup
	$(BIN)/python -m pytest tests $(NOTEBOOKS) $(NBVAL) -q

# The notebooks again as two other kinds of machine run them (the unit tests do not depend on it):
# a CPU without AVX-512 (PyTorch, MKL and oneDNN each restricted to AVX2), then one thread (reductions
# split differently). CONTRIBUTING.md, "Outputs on any CPU", says what is and is not covered.
AVX2 = ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2
test-cpus: setup
	$(AVX2) $(BIN)/python -m pytest $(NOTEBOOKS) $(NBVAL) -q
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(BIN)/python -m pytest $(NOTEBOOKS) $(NBVAL) -q

# Browser tests of the built site (site_tests/, not part of `make test`): every page of _toc.yml
# in headless Chromium with the network cut off, checked with axe-core (accessibility, light and
# dark mode), at phone width and against a page-weight budget. Rebuilds first (Sphinx only
# re-reads changed pages), so the site tested is the site of this checkout. Screenshots (light,
# dark, 390 px): _build/screenshots/; measurements: _build/site-report.json.
# axe-core comes from the npm registry, pinned in package-lock.json, installed with the explorer's
# packages by the $(NODE_STAMP) rule above (again only when the lock file changes).
test-site: book
	$(BIN)/python -m pytest site_tests -q

# Every chapter as a reader runs it in Google Colab (tests/colab/run_colab.py): a second environment,
# .venv-colab/, holds the packages of a recorded Colab CPU image (tests/colab/requirements-colab.txt,
# exact pins, installed with --no-deps so that nothing else comes in); the notebooks run in kernels
# of that environment, each with its Colab cell executed. Rebuilt from scratch when the list changes.
COLAB_VENV  := .venv-colab
COLAB_STAMP := $(COLAB_VENV)/.installed
$(COLAB_STAMP): tests/colab/requirements-colab.txt
	rm -rf $(COLAB_VENV)
	$(PYTHON) -m venv $(COLAB_VENV)
	$(COLAB_VENV)/bin/python -m pip install --quiet --disable-pip-version-check --no-deps -r tests/colab/requirements-colab.txt
	touch $(COLAB_STAMP)

# First the edition's markdown as Colab renders it (seconds; fails before the environment is built),
# then the edition of every chapter run in that environment.
# COLAB_NOTEBOOKS=book/NN_slug.ipynb runs only those chapters (default: every notebook in _toc.yml).
colab-check: setup
	$(BIN)/python tests/colab/check_edition.py $(COLAB_NOTEBOOKS)

test-colab: setup colab-check $(COLAB_STAMP)
	$(BIN)/python tests/colab/run_colab.py --venv $(COLAB_VENV) $(COLAB_NOTEBOOKS)

# Every chapter of _toc.yml in JupyterLab, driven by headless Chromium (lab_tests/, not part of
# `make test`): a server of its own on 127.0.0.1 with a random token, on a temporary copy of book/,
# stopped by its process id. Opening changes nothing, the Colab cell folded, MyST rendered, glossary
# links resolved (console errors counted), solutions folded under named lines with no gate titles or
# empty boxes, a live slider's note (not a widget repr) before it runs; Run All with no error and no
# solution output, each slider once; every live control moved by keyboard and its redraw compared
# with the static slider's frame, the quiz answered; `make lab` serving a working copy.
# Seconds and console errors per chapter: _build/lab-report.json.
test-lab: setup
	$(BIN)/python -m pytest lab_tests -q

# A reader's working copy: JupyterLab saves a notebook every two minutes, so serving book/ would
# write the reader's attempts into the tracked notebooks. The copy (git-ignored) is made on the
# first run; later runs copy only files it does not have yet, so nothing the reader changed is
# overwritten. lab_tests/test_make_lab.py checks this with JUPYTER_LAB set to a stand-in.
# Jupyter refuses to run as root unless told to; containers often run as root.
# JupyterLab 4 renders only the cells near the view by default (windowingMode
# "contentVisibility"), so jupyterlab-myst cannot see a chapter's glossary cell (its last cell)
# while it renders the {term} links above it: every link logs "Cross reference target was not
# found". tools/jupyterlab/overrides.json (windowingMode "none": every cell rendered) is
# installed as the default of the venv's JupyterLab; a reader's own settings still win.
LAB_DIR      ?= my-book
JUPYTER_LAB  ?= $(BIN)/jupyter lab
LAB_SETTINGS ?= $(BIN)/../share/jupyter/lab/settings
lab: setup
	$(BIN)/python -c 'import os, shutil, sys; shutil.copytree("book", sys.argv[1], dirs_exist_ok=True, \
	  ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__", "_ext", "_static"), \
	  copy_function=lambda src, dst: None if os.path.exists(dst) else shutil.copy2(src, dst))' $(LAB_DIR)
	mkdir -p $(LAB_SETTINGS) && cp tools/jupyterlab/overrides.json $(LAB_SETTINGS)/overrides.json
	$(JUPYTER_LAB) $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_DIR)

bench: setup
	$(BIN)/python benchmarks/bench_attention.py && $(BIN)/python benchmarks/bench_decode.py && $(BIN)/python benchmarks/bench_serving.py && $(BIN)/python benchmarks/bench_fresh_memory.py

bench-explorer: book
	$(BIN)/python benchmarks/bench_explorer.py

clean:
	rm -rf _build node_modules
