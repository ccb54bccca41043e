"""Shared code of the JupyterLab tests (``make test-lab``): a JupyterLab server and a browser.

The server runs on 127.0.0.1 with a random token, on a copy of ``book/`` in a temporary folder
(so that nothing the test does, Run All included, can write into the checkout), with its own
temporary settings, runtime, data and workspace folders (so a reader's or developer's own
JupyterLab settings change nothing, and every notebook opens untrusted, as a fresh download does).
It is stopped by its process id when the tests end.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "site_tests"))
sys.path.insert(0, str(ROOT / "tests"))
from sitekit import CHROMIUM, CHROMIUM_ARGS  # noqa: E402,F401
from toc import toc_notebooks  # noqa: E402

#: The test server's own user settings (written into its own settings folder): no autosave (the
#: copy is thrown away anyway) and no requests for news or updates (the test runs offline). Nothing
#: here may change what a page shows: what a reader's JupyterLab renders differently (every cell
#: rendered, not only those in view) comes from the defaults that ``make lab`` installs
#: (tools/jupyterlab/overrides.json), which the server gets the way a reader's does.
LAB_SETTINGS = {
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false", "checkForUpdates": False},
}


def make_lab(folder: Path, app_settings: Path) -> list[str]:
    """Run ``make lab`` with a stand-in for JupyterLab (``setup`` taken as done): it copies the
    chapters into ``folder`` and installs JupyterLab's defaults into ``app_settings``; returns the
    arguments JupyterLab would get."""
    bin_dir = str(Path(sys.executable).parent)
    result = subprocess.run(["make", "-s", "-o", "setup", "lab", f"LAB_DIR={folder}", "JUPYTER_LAB=echo SERVE",
                             f"LAB_SETTINGS={app_settings}", f"BIN={bin_dir}"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
    line = next(line for line in result.stdout.splitlines() if line.startswith("SERVE"))
    return shlex.split(line)[1:]


@dataclass
class Lab:
    """A running JupyterLab server."""

    url: str  # http://127.0.0.1:PORT/
    token: str
    root: Path  # the folder it serves: a copy of book/
    process: subprocess.Popen

    def notebook_url(self, name: str) -> str:
        return f"{self.url}lab/tree/{name}?token={self.token}&reset"

    def api(self, path: str, method: str = "GET") -> Any:
        request = urllib.request.Request(f"{self.url}api/{path}", method=method,
                                         headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=30) as response:
            body = response.read()
        return json.loads(body) if body else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_lab(tmp: Path) -> Lab:
    """Start ``jupyter lab`` on the copy of ``book/`` that ``make lab`` makes in ``tmp``, with the
    defaults ``make lab`` installs; wait until it answers."""
    app_settings = tmp / "app-settings"
    served = make_lab(tmp / "book", app_settings)
    root = Path(served[-1])
    settings = tmp / "settings"
    for name, values in LAB_SETTINGS.items():
        path = settings / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values), encoding="utf-8")
    env = dict(os.environ)
    env.update({
        "JUPYTER_CONFIG_DIR": str(tmp / "config"), "JUPYTER_DATA_DIR": str(tmp / "data"),
        "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"), "JUPYTERLAB_SETTINGS_DIR": str(settings),
        "JUPYTERLAB_WORKSPACES_DIR": str(tmp / "workspaces"), "IPYTHONDIR": str(tmp / "ipython"),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    })
    port, token = _free_port(), secrets.token_hex(24)
    command = [sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--ServerApp.port={port}",
               "--ServerApp.ip=127.0.0.1", "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
               f"--ServerApp.root_dir={root}", "--LabApp.expose_app_in_browser=True",
               f"--LabApp.app_settings_dir={app_settings}"]
    if os.geteuid() == 0:
        command.append("--allow-root")
    log = open(tmp / "server.log", "w")
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp)
    lab = Lab(f"http://127.0.0.1:{port}/", token, root, process)
    deadline = time.monotonic() + 120
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"jupyter lab exited with {process.returncode}: {(tmp / 'server.log').read_text()[-3000:]}")
        try:
            lab.api("status")
            return lab
        except OSError:
            if time.monotonic() > deadline:
                stop_lab(lab)
                raise RuntimeError(f"jupyter lab did not answer within 120 s: {(tmp / 'server.log').read_text()[-3000:]}")
            time.sleep(0.5)


def stop_lab(lab: Lab) -> None:
    """Stop the server by its process id (it shuts its kernels down first); kill it if it hangs."""
    if lab.process.poll() is None:
        lab.process.send_signal(signal.SIGTERM)
        try:
            lab.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            lab.process.kill()
            lab.process.wait()


# --- pytest fixtures and browser helpers ------------------------------------------------------------

import pytest  # noqa: E402

from sitekit import browser  # noqa: E402,F401  (the session's headless Chromium)

#: Where the tests write what they measured (seconds per chapter) for the README.
REPORT = Path(os.environ.get("LAB_REPORT", ROOT / "_build" / "lab-report.json")).resolve()


@pytest.fixture(scope="session")
def lab() -> Iterator[Lab]:
    tmp = Path(tempfile.mkdtemp(prefix="attnbook-lab-"))
    REPORT.unlink(missing_ok=True)  # this run's measurements only
    server = start_lab(tmp)
    try:
        yield server
    finally:
        stop_lab(server)
        shutil.rmtree(tmp, ignore_errors=True)


def record(chapter: str, **values: Any) -> None:
    """Merge ``values`` into the report's entry for ``chapter``."""
    data = json.loads(REPORT.read_text(encoding="utf-8")) if REPORT.is_file() else {}
    data.setdefault(chapter, {}).update(values)
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")


#: Resolves once the notebook in the main area has loaded, its kernel has started and is idle.
NOTEBOOK_READY = """async () => {
  const app = window.jupyterapp;
  const wait = (ok) => new Promise(done => { const poll = () => ok() ? done() : setTimeout(poll, 100); poll(); });
  await app.started; await app.restored;
  await wait(() => app.shell.currentWidget && app.shell.currentWidget.content && app.shell.currentWidget.sessionContext);
  const panel = app.shell.currentWidget;
  await panel.context.ready; await panel.sessionContext.ready;
  await wait(() => panel.sessionContext.session && panel.sessionContext.session.kernel
                   && panel.sessionContext.session.kernel.status === 'idle');
  return panel.content.widgets.length;
}"""

#: Runs every cell (Run > Run All Cells) and resolves when all have run and the kernel is idle.
RUN_ALL = """async () => {
  const app = window.jupyterapp, panel = app.shell.currentWidget;
  const wait = (ok) => new Promise(done => { const poll = () => ok() ? done() : setTimeout(poll, 200); poll(); });
  await app.commands.execute('notebook:run-all-cells');
  const cells = panel.content.widgets.filter(c => c.model.type === 'code');
  await wait(() => panel.sessionContext.session.kernel.status === 'idle'
                   && cells.every(c => c.model.executionCount !== null && c.model.executionState !== 'running'));
  return cells.length;
}"""

#: True while the notebook has changes that File > Save would write (the dot on its tab).
DIRTY = "() => window.jupyterapp.shell.currentWidget.context.model.dirty"

#: Each code cell's outputs, as the notebook model holds them (what File > Save would write).
OUTPUTS = """() => window.jupyterapp.shell.currentWidget.content.widgets.map(
  c => c.model.type === 'code' ? c.model.outputs.toJSON() : null)"""


@dataclass
class Notebook:
    """A chapter open in JupyterLab in its own browser page."""

    name: str
    page: Any
    errors: list[str]  # uncaught exceptions of the page's scripts
    console: list[str] = field(default_factory=list)  # what the page logged as console errors


def open_notebook(browser: Any, lab: Lab, name: str) -> Notebook:
    """A new browser page with ``name`` open in JupyterLab, its kernel idle."""
    context = browser.new_context(viewport={"width": 1280, "height": 1000})
    context.set_default_timeout(120_000)
    page = context.new_page()
    opened = Notebook(name, page, [])
    page.on("pageerror", lambda e: opened.errors.append(e.message))
    page.on("console", lambda m: opened.console.append(m.text) if m.type == "error" else None)
    page.goto(lab.notebook_url(name), wait_until="load")
    page.wait_for_function("() => window.jupyterapp !== undefined")
    assert page.evaluate(NOTEBOOK_READY) > 0
    return opened
