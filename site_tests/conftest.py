"""Fixtures for the browser tests (``make test-site``); the shared code is in ``sitekit.py``."""

from sitekit import base_url, browser  # noqa: F401  (pytest fixtures)
