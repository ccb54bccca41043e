"""Stand-in for ``google.colab.output``: JAX (on Colab's images until 2026-01) imports it when it sees Colab.

Nothing in the book calls it.
"""
