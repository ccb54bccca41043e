"""Checkers for the book's exercises, one module per chapter topic.

Each checker takes the reader's function (or value), runs it on known inputs and returns an
:class:`attnlib.learn.Feedback` with a specific hint for the usual mistakes.
"""
