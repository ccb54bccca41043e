"""pytest's root configuration, loaded for every test run in this repository (unit tests and nbval alike).

It registers ``tests/nbval_numbers.py``: nbval compares the printed decimals of a notebook's outputs
to one unit in their last digit, so that stored outputs hold on any reader's CPU (CONTRIBUTING.md,
"Numbers and outputs").
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "tests"))

pytest_plugins = ["nbval_numbers"]
