"""Start an IPython kernel as Colab's runtime does: with ``google.colab`` already imported.

``tests/colab/run_colab.py`` launches it with the Python of the Colab environment
(``.venv-colab/bin/python``). The stand-in module comes from ``stub/`` beside this file; nothing
else of the repository is put on the kernel's path.
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]  # not tests/colab itself
sys.path.append(str(HERE / "stub"))

import google.colab  # noqa: E402,F401  (the stand-in; Colab's kernel imports the real one)
from ipykernel import kernelapp  # noqa: E402

kernelapp.launch_new_instance()
