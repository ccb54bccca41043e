"""Feedback for auto-checked exercises.

A checker calls the reader's function on known inputs, compares with the right answer, and
returns a :class:`Feedback` that says *why* an answer is wrong when it can guess
("your rows sum to 1.3: did you apply softmax over the right axis?").
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor

__all__ = ["Feedback", "run_reader_code", "compare_tensors"]


@dataclass(frozen=True)
class Feedback:
    """The verdict of a checker.

    Attributes:
        status: ``"correct"``, ``"wrong"`` or ``"todo"`` (the function is still the stub).
        message: one or two sentences for the reader.
    """

    status: str
    message: str

    # No __bool__: a Feedback is always truthy, so ``compare_tensors(...) or correct()`` keeps a
    # "wrong" verdict. Ask ``feedback.passed`` for the verdict.

    @property
    def passed(self) -> bool:
        return self.status == "correct"

    def _label(self) -> str:
        return {"correct": "Correct", "wrong": "Not yet", "todo": "Your turn"}[self.status]

    def __repr__(self) -> str:
        return f"[{self._label()}] {self.message}"

    def _repr_html_(self) -> str:
        colours = {"correct": "#1a7f37", "wrong": "#b35900", "todo": "#0969da"}
        colour = colours[self.status]
        return (
            f'<div class="attnlib-feedback attnlib-{self.status}" role="status" '
            f'style="border-left:4px solid {colour};padding:4px 10px;margin:4px 0">'
            f"<strong>{self._label()}:</strong> {html.escape(self.message)}</div>"
        )


def correct(message: str = "well done.") -> Feedback:
    return Feedback("correct", message)


def wrong(message: str) -> Feedback:
    return Feedback("wrong", message)


def todo(message: str = "replace the `raise NotImplementedError` / `return None` with your code, then run the cell again.") -> Feedback:
    return Feedback("todo", message)


def run_reader_code(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, Feedback | None]:
    """Call the reader's function, turning the usual stubs and crashes into feedback.

    Returns:
        ``(result, None)`` when the call returned something, or ``(None, feedback)`` when it
        raised ``NotImplementedError`` / returned ``None`` (status ``todo``) or raised another
        error (status ``wrong``, with the error in the message).
    """
    try:
        result = fn(*args, **kwargs)
    except NotImplementedError:
        return None, todo()
    except Exception as err:  # the reader's code may raise anything; report it instead of crashing
        return None, wrong(f"your code raised {type(err).__name__}: {err}")
    if result is None:
        return None, todo()
    return result, None


def compare_tensors(got: Any, expected: Tensor, *, name: str = "result", atol: float = 1e-5, rtol: float = 1e-5) -> Feedback | None:
    """Generic comparison: type, shape, then values. ``None`` means "equal"."""
    if not isinstance(got, Tensor):
        return wrong(f"{name} should be a torch.Tensor, got {type(got).__name__}.")
    if tuple(got.shape) != tuple(expected.shape):
        return wrong(f"{name} has shape {tuple(got.shape)}, expected {tuple(expected.shape)}.")
    got_f = got.detach().to(torch.float64).cpu()
    exp_f = expected.detach().to(torch.float64).cpu()
    if not torch.allclose(got_f, exp_f, atol=atol, rtol=rtol, equal_nan=True):
        worst = float((got_f - exp_f).abs().nan_to_num(float("inf")).max())
        return wrong(f"{name} has the right shape but differs from the expected values (largest difference {worst:.3g}).")
    return None
