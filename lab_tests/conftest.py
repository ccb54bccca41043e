"""Fixtures for the JupyterLab tests (``make test-lab``); the shared code is in ``labkit.py``."""

from labkit import browser, lab  # noqa: F401  (pytest fixtures)
