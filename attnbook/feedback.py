"""Feedback for auto-checked exercises, and the one contract every checker goes through.

A checker calls the reader's function on known inputs, compares with the right answer, and
returns a :class:`Feedback` that says *why* an answer is wrong when it can guess
("your rows sum to 1.3: did you apply softmax over the right axis?").

The contract (enforced for every checker by ``tests/test_checker_contract.py``):

* every checker is declared with :func:`exercise`, which wraps it in a guard: nothing the
  reader's code does (a crash, a wrong type, shape, dtype or device, NaN) escapes as a
  traceback, and the generic message never reveals the expected answer;
* the reader's function is called through :func:`run_reader_code`: ``raise NotImplementedError``
  is the stub ("Your turn"), ``return``-ing ``None`` gets "did you forget `return`?";
* a right answer returned in float16 or bfloat16 is named as such (:func:`low_precision`), not
  mistaken for a known wrong one: a checker asks before it diagnoses;
* a number is read with :func:`as_number` / :func:`check_number`: a Python, NumPy or 0-d tensor
  real scalar, compared with a tolerance that matches the precision the exercise asks for;
* a checker's known mistakes live in :class:`Mistake` tables, registered with their test cases
  (:class:`MistakeTable`), so the tests can prove that no two mistakes of a table give the same
  answer on those cases and none gives the right one;
* :data:`EXERCISES` holds every checker with a right submission, so the generic misjudgement
  test (scaled, transposed, shifted, zeros, ``None``, a list ... never pass; float64, a list for
  a tuple, NumPy scalars always do) runs over every exercise, including the next one added.
"""

from __future__ import annotations

import functools
import html
import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import numpy as np

import torch
from torch import Tensor

__all__ = [
    "Feedback", "Mistake", "MistakeTable", "Exercise", "EXERCISES", "NOT_EXERCISES", "exercise",
    "run_reader_code", "compare_tensors", "close", "diagnose", "low_precision", "HALF_TOL", "as_cpu_float64", "as_number", "check_number",
    "as_tensor", "describe", "RETURNED_NONE", "ATOL", "RTOL",
]

#: The tolerance every checker uses to call a float answer equal to the reference.
ATOL = RTOL = 1e-5

#: How close a float16/bfloat16 answer must be to an answer computed in full precision to count as
#: that answer rounded: float16 keeps 11 significant bits, bfloat16 8, and a few operations in
#: either add up to about 1e-2.
HALF_TOL = 1e-2


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


def todo(message: str = "replace the `raise NotImplementedError` with your code, then run the cell again.") -> Feedback:
    return Feedback("todo", message)


#: What a reader's function that returns ``None`` is told (the stub raises ``NotImplementedError`` instead).
RETURNED_NONE = "your function returned None: did you forget `return`?"


def describe(value: Any) -> str:
    """A short, unambiguous description of what the reader returned: its qualified type, and a shape."""
    kind = type(value)
    module = kind.__module__
    name = kind.__qualname__ if module in ("builtins", "") else f"{module.split('.')[0]}.{kind.__qualname__}"
    if isinstance(value, Tensor):
        return f"a torch.Tensor of shape {tuple(value.shape)} ({value.dtype})"
    if isinstance(value, np.ndarray):
        return f"a numpy.ndarray of shape {value.shape}"
    if isinstance(value, (tuple, list)):
        return f"a {name} of {len(value)} item{'s' if len(value) != 1 else ''}"
    return name


def _short(err: BaseException, limit: int = 300) -> str:
    text = str(err).strip().splitlines()[0] if str(err).strip() else ""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def run_reader_code(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, Feedback | None]:
    """Call the reader's function, turning the stub, a missing ``return`` and crashes into feedback.

    Returns:
        ``(result, None)`` when the call returned something, or ``(None, feedback)`` when it
        raised ``NotImplementedError`` (status ``todo``: still the stub), returned ``None``
        (status ``wrong``: :data:`RETURNED_NONE`) or raised another error (status ``wrong``, with
        the error in the message).
    """
    try:
        result = fn(*args, **kwargs)
    except NotImplementedError:
        return None, todo()
    except Exception as err:  # the reader's code may raise anything; report it instead of crashing
        return None, wrong(f"your code raised {type(err).__name__}: {_short(err)}")
    if result is None:
        return None, wrong(RETURNED_NONE)
    return result, None


def as_number(value: Any) -> float | None:
    """``value`` as a Python float when it is one real number in any form, else ``None``.

    Accepted: ``int`` and ``float`` (not ``bool``), NumPy integer and floating scalars and
    one-element arrays, and one-element real tensors (on any device, with or without grad).
    NaN and infinities come back as floats; the caller decides what they mean.
    """
    try:
        if isinstance(value, (bool, np.bool_)):
            return None
        if isinstance(value, Tensor):
            if value.numel() != 1 or value.is_complex() or value.dtype == torch.bool:
                return None
            return float(value.detach().cpu().reshape(()).item())
        if isinstance(value, np.ndarray):
            if value.size != 1 or value.dtype.kind not in "iuf":
                return None
            return float(value.reshape(()).item())
        if isinstance(value, numbers.Real):
            return float(value)
    except Exception:  # an exotic object whose conversion fails is simply not a number
        return None
    return None


def check_number(got: Any, expected: float, *, rel: float = 1e-9, abs_tol: float = 0.0, integer: bool = False,
                 what: str = "a number") -> tuple[float | None, Feedback | None]:
    """Read the reader's number and compare it with ``expected``.

    Args:
        rel, abs_tol: the tolerance; choose it to match the precision the exercise asks for
            (an exact count: the defaults; a value typed by hand to two decimals: ``abs_tol=0.01``).
        integer: the answer is a count, so a non-integral value is a mistake of its own.

    Returns:
        ``(value, None)`` when the answer equals ``expected``; ``(value, feedback)`` when it is a
        number but not the right one (a generic "not it" that the caller may replace with a
        specific hint, and that never shows ``expected``); ``(None, feedback)`` when it is not
        one real number at all.
    """
    x = as_number(got)
    if x is None:
        return None, wrong(f"return {what} (an int or a float), got {describe(got)}.")
    if math.isnan(x) or math.isinf(x):
        return x, wrong(f"your answer is {x}: return a finite number.")
    if integer and not float(x).is_integer():
        return x, wrong(f"your answer {x:g} is not a whole number, and this one is a count.")
    if math.isclose(x, expected, rel_tol=rel, abs_tol=abs_tol):
        return x, None
    return x, wrong(f"{x:,.6g} is not it.")


def as_tensor(value: Any) -> Tensor | None:
    """``value`` as a tensor when it is one (a NumPy array is converted), else ``None``."""
    if isinstance(value, Tensor):
        return value
    if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
        return torch.from_numpy(np.ascontiguousarray(value))
    return None


def as_cpu_float64(t: Tensor) -> Tensor:
    """``t`` detached, moved to the CPU *first* (Apple's MPS has no float64), then in float64."""
    return t.detach().cpu().to(torch.float64)


def close(got: Any, expected: Tensor, *, atol: float = ATOL, rtol: float = RTOL) -> bool:
    """True when ``got`` is a tensor with ``expected``'s shape and values (compared in float64 on the CPU).

    Never raises: a tensor that cannot be compared (complex, a broken subclass) is not close.
    """
    try:
        return (
            isinstance(got, Tensor)
            and isinstance(expected, Tensor)
            and tuple(got.shape) == tuple(expected.shape)
            and not got.is_complex()
            and bool(torch.allclose(as_cpu_float64(got), as_cpu_float64(expected), atol=atol, rtol=rtol))
        )
    except Exception:
        return False


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
    """The hint of the first mistake whose result equals ``got`` (``None`` if none matches).

    A float16 or bfloat16 ``got`` is compared to half precision (``HALF_TOL``), so a known mistake
    computed in half precision still earns its hint.
    """
    tol = HALF_TOL if isinstance(got, Tensor) and got.dtype in (torch.float16, torch.bfloat16) else ATOL
    for m in mistakes:
        try:
            expected = m.compute(*args, **kwargs)
        except Exception:  # a mistake that cannot be computed for these inputs does not match
            continue
        if close(got, expected, atol=tol, rtol=tol):
            return wrong(m.hint)
    return None


def low_precision(got: Any, expected: Tensor, *, name: str = "the result") -> Feedback | None:
    """The hint for a right answer in half precision: ``got`` is float16 or bfloat16 and equals
    ``expected`` to that precision (``HALF_TOL``); ``None`` otherwise.

    Checkers call it before their table of mistakes, so a reader who computed the right thing
    in the wrong dtype is told so, not given the hint of an unrelated mistake.

    >>> ref = torch.tensor([0.1234567, 2.5], dtype=torch.float64)
    >>> low_precision(ref.half(), ref).message
    'the result is torch.float16, which keeps only about 3 significant digits: compute it and return it in the dtype of the inputs (torch.float64).'
    >>> low_precision(ref.float(), ref) is None
    True
    """
    if not (isinstance(got, Tensor) and got.dtype in (torch.float16, torch.bfloat16)):
        return None
    if not close(got, expected, atol=HALF_TOL, rtol=HALF_TOL):
        return None
    digits = 3 if got.dtype == torch.float16 else 2
    return wrong(f"{name} is {got.dtype}, which keeps only about {digits} significant digits: compute it and "
                 f"return it in the dtype of the inputs ({expected.dtype}).")


def compare_tensors(got: Any, expected: Tensor, *, name: str = "result", atol: float = ATOL, rtol: float = RTOL) -> Feedback | None:
    """Generic comparison: type, shape, then values. ``None`` means "equal"."""
    if not isinstance(got, Tensor):
        return wrong(f"{name} should be a torch.Tensor, got {describe(got)}.")
    if tuple(got.shape) != tuple(expected.shape):
        return wrong(f"{name} has shape {tuple(got.shape)}, expected {tuple(expected.shape)}.")
    if got.is_complex():
        return wrong(f"{name} is complex ({got.dtype}); the answer is real.")
    got_f, exp_f = as_cpu_float64(got), as_cpu_float64(expected)
    if not torch.allclose(got_f, exp_f, atol=atol, rtol=rtol, equal_nan=True):
        worst = float((got_f - exp_f).abs().nan_to_num(float("inf")).max())
        return wrong(f"{name} has the right shape but differs from the expected values (largest difference {worst:.3g}).")
    return None


# ---------------------------------------------------------------- the registry of exercises


def _same(a: Any, b: Any) -> bool:
    """Equality for mistake outputs: tensors with :func:`close` (NaN equal to NaN), anything else with ``==``."""
    if isinstance(a, Tensor) or isinstance(b, Tensor):
        if not (isinstance(a, Tensor) and isinstance(b, Tensor)) or tuple(a.shape) != tuple(b.shape):
            return False
        fa, fb = as_cpu_float64(a), as_cpu_float64(b)
        return bool(torch.allclose(fa, fb, atol=ATOL, rtol=RTOL, equal_nan=True))
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    try:
        return bool(a == b)
    except Exception:
        return False


@dataclass(frozen=True)
class MistakeTable:
    """A table of known mistakes with the cases its checker tries them on.

    Attributes:
        mistakes: the table, as the checker uses it.
        cases: returns the argument tuples the checker passes to ``Mistake.compute``.
        reference: the right answer for the same arguments.
        same: how the checker decides that two answers are equal (default: :func:`close` for
            tensors, ``==`` for anything else).
    """

    mistakes: Sequence[Mistake]
    cases: Callable[[], Iterable[tuple[Any, ...]]]
    reference: Callable[..., Any]
    same: Callable[[Any, Any], bool] = _same


@dataclass(frozen=True)
class Exercise:
    """One auto-checked exercise: its guarded checker, a right submission and its mistake tables.

    Attributes:
        name: ``"chNN.check_name"``.
        checker: the guarded checker (what the notebooks call).
        solution: a right submission: what a reader who solved it passes to the checker (a
            function, or a value for exercises that ask for a number or a tuple).
        kind: ``"function"`` (the checker receives the reader's function), ``"value"`` (it
            receives the answer itself) or ``"functions"`` (a tuple of functions, passed as
            separate arguments).
        tables: the checker's mistake tables with their cases.
        not_generic: generic variants that do not apply to this exercise, each with the reason
            (for example ``{"transposed": "the answer is a vector"}``).
        needs: optional packages the exercise needs (the tests skip it when one is missing).
    """

    name: str
    checker: Callable[..., Feedback]
    solution: Any
    kind: str = "function"
    tables: tuple[MistakeTable, ...] = ()
    not_generic: dict[str, str] = field(default_factory=dict)
    needs: tuple[str, ...] = ()

    def submit(self, submission: Any) -> Feedback:
        """Run the checker on ``submission`` as a reader would."""
        if self.kind == "functions":
            return self.checker(*submission)
        return self.checker(submission)


#: Every exercise checker of the book, by ``"chNN.check_name"``; filled as the chapter modules are imported.
EXERCISES: dict[str, Exercise] = {}

#: Functions named ``check_*`` in the chapter modules that are not exercise checkers, with the reason.
NOT_EXERCISES: dict[str, str] = {
    "ch07.check_layer": "compares attnlib with the model layer by layer for the chapter's text; the reader writes nothing",
}

_GUARD_MESSAGE = (
    "your answer could not be checked: handling it raised {kind} ({detail}). Return the type and shape the "
    "exercise asks for, on the CPU, as a torch.Tensor or a number."
)


def exercise(solution: Any, *, kind: str = "function", tables: Sequence[MistakeTable] = (),
             not_generic: dict[str, str] | None = None, needs: Sequence[str] = ()) -> Callable[[Callable[..., Feedback]], Callable[..., Feedback]]:
    """Declare a checker: guard it and register it in :data:`EXERCISES` with a right submission.

    The guard turns anything that escapes the checker (an exception raised while converting or
    inspecting the reader's result, or by a reader's object such as a module whose forward
    crashes) into a "Not yet" feedback that names the error and never the expected answer.

    Example::

        @exercise(solution=lambda q, k, v: torch.softmax(k @ q, -1) @ v,
                  tables=(MistakeTable(LOOKUP_MISTAKES, lookup_cases, reference_lookup),))
        def check_soft_lookup(fn): ...
    """

    def wrap(check: Callable[..., Feedback]) -> Callable[..., Feedback]:
        @functools.wraps(check)
        def guarded(*args: Any, **kwargs: Any) -> Feedback:
            try:
                result = check(*args, **kwargs)
            except NotImplementedError:
                return todo()
            except Exception as err:  # the contract: no traceback reaches the reader
                return wrong(_GUARD_MESSAGE.format(kind=type(err).__name__, detail=_short(err, 200)))
            if not isinstance(result, Feedback):  # pragma: no cover - a checker bug, caught by the tests
                raise TypeError(f"{check.__qualname__} returned {type(result).__name__}, not Feedback")
            return result

        parts = check.__module__.split(".")  # attnbook.chNN, or attnbook.chNN.checkers in a chapter package
        chapter = next((p for p in parts if p.startswith("ch") and p[2:].isdigit()), parts[-1])
        name = f"{chapter}.{check.__name__}"
        guarded.__wrapped_checker__ = check  # type: ignore[attr-defined]
        EXERCISES[name] = Exercise(name, guarded, solution, kind, tuple(tables), dict(not_generic or {}), tuple(needs))
        return guarded

    return wrap
