"""Stand-in for Colab's ``google.colab`` module in ``make test-colab``.

The book's Colab cell only asks whether ``google.colab`` has been imported, which Colab's kernel
does at start-up; ``tests/colab/kernel.py`` imports this module the same way.
"""
