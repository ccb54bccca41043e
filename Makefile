# Inside Self-Attention: two commands on a fresh clone, `make book` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
NOTEBOOKS = $(shell $(BIN)/python tests/toc.py)

.PHONY: setup book test test-site lab bench clean help

help:
	@echo "make book       build the website into _build/html"
	@echo "make test       unit tests + every notebook re-executed and compared (nbval)"
	@echo "make test-site  build the website, then open every page in headless Chromium, offline"
	@echo "make lab        open the book in JupyterLab"
	@echo "make bench      attention benchmark (timings and memory on this machine)"

$(STAMP): requirements.txt pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11+ is needed (found %s)" % sys.version.split()[0])'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $(STAMP)

setup: $(STAMP)

book: setup
	$(BIN)/jupyter-book build . -W -n --keep-going

test: setup
	$(BIN)/python -m pytest tests $(NOTEBOOKS) --nbval --nbval-current-env \
		--nbval-sanitize-with tests/nbval_sanitize.cfg --nbval-cell-timeout=900 -q

# Browser tests of the built site (site_tests/, not part of `make test`): every page of _toc.yml
# in headless Chromium with the network cut off, checked with axe-core (accessibility, light and
# dark mode), at phone width and against a page-weight budget. Rebuilds first (Sphinx only
# re-reads changed pages), so the site tested is the site of this checkout. Screenshots (light,
# dark, 390 px): _build/screenshots/; measurements: _build/site-report.json.
# axe-core comes from the npm registry, as package-lock.json pins it; `npm ci` runs again only
# when package.json or package-lock.json is newer than the installed copy.
NODE_STAMP := node_modules/.package-lock.json

$(NODE_STAMP): package.json package-lock.json
	npm ci --silent --no-audit --no-fund
	touch $(NODE_STAMP)

test-site: book $(NODE_STAMP)
	$(BIN)/python -m pytest site_tests -q

lab: setup
	$(BIN)/jupyter lab book

bench: setup
	$(BIN)/python benchmarks/bench_attention.py

clean:
	rm -rf _build node_modules
