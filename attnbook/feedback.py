"""Feedback for auto-checked exercises.

A checker calls the reader's function on known inputs, compares with the right answer, and
returns a :class:`Feedback` that says *why* an answer is wrong when it can guess
("your rows sum to 1.3: did you apply softmax over the right axis?").
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import Tensor

__all__ = ["Feedback", "Mistake", "run_reader_code", "compare_tensors", "close", "diagnose", "as_cpu_float64", "ATOL", "RTOL"]

#: The tolerance every checker uses to call a float answer equal to the reference.
ATOL = RTOL = 1e-5


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


def as_cpu_float64(t: Tensor) -> Tensor:
    """``t`` detached, moved to the CPU *first* (Apple's MPS has no float64), then in float64."""
    return t.detach().cpu().to(torch.float64)


def close(got: Any, expected: Tensor, *, atol: float = ATOL, rtol: float = RTOL) -> bool:
    """True when ``got`` is a tensor with ``expected``'s shape and values (compared in float64 on the CPU)."""
    return (
        isinstance(got, Tensor)
        and tuple(got.shape) == tuple(expected.shape)
        and bool(torch.allclose(as_cpu_float64(got), as_cpu_float64(expected), atol=atol, rtol=rtol))
    )


@dataclass(frozen=True)
class Mistake:
    """One known wrong answer of an exercise: how to compute it, and the hint it earns.

    A checker keeps its mistakes in one table (a tuple of these); :func:`diagnose` tries them in
    order and the tests iterate over the same table, so a new mistake is added in one place.
    """

    name: str
    compute: Callable[..., Any]
    hint: str


def diagnose(got: Any, mistakes: Sequence[Mistake], *args: Any, **kwargs: Any) -> Feedback | None:
    """The hint of the first mistake whose result equals ``got`` (``None`` if none matches)."""
    for m in mistakes:
        try:
            expected = m.compute(*args, **kwargs)
        except Exception:  # a mistake that cannot be computed for these inputs does not match
            continue
        if close(got, expected):
            return wrong(m.hint)
    return None


def compare_tensors(got: Any, expected: Tensor, *, name: str = "result", atol: float = ATOL, rtol: float = RTOL) -> Feedback | None:
    """Generic comparison: type, shape, then values. ``None`` means "equal"."""
    if not isinstance(got, Tensor):
        return wrong(f"{name} should be a torch.Tensor, got {type(got).__name__}.")
    if tuple(got.shape) != tuple(expected.shape):
        return wrong(f"{name} has shape {tuple(got.shape)}, expected {tuple(expected.shape)}.")
    got_f, exp_f = as_cpu_float64(got), as_cpu_float64(expected)
    if not torch.allclose(got_f, exp_f, atol=atol, rtol=rtol, equal_nan=True):
        worst = float((got_f - exp_f).abs().nan_to_num(float("inf")).max())
        return wrong(f"{name} has the right shape but differs from the expected values (largest difference {worst:.3g}).")
    return None
