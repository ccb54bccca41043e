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
* one dtype rule for every tensor exercise: compute in the inputs' dtype or wider. Upcasting float16 or
  bfloat16 inputs to float32 is fine, and so is returning such a result wider (where the exercise returns a
  stored cache, the cache keeps its own dtype). Computing narrower than the inputs is refused, float32
  inside a function given float64 (``.float()`` ... ``.double()``) included, even when the result is cast
  back and the digits it lost happen to fit the checker's tolerance (:func:`computed_narrower`);
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

import contextvars
import fractions
import functools
import html
import inspect
import linecache
import math
import numbers
import operator
import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import numpy as np

import torch
from torch import Tensor

__all__ = [
    "Feedback", "Mistake", "MistakeTable", "Exercise", "EXERCISES", "NOT_EXERCISES", "exercise",
    "run_reader_code", "call_reader", "check_number_cases", "as_index", "in_place_message", "list_changed_message", "compare_tensors", "computed_narrower", "close", "diagnose", "low_precision", "HALF_TOL", "as_cpu_float64", "as_number", "check_number",
    "as_tensor", "describe", "RETURNED_NONE", "ATOL", "RTOL", "mismatched_sizes",
    "not_a_tensor",
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


def _tensor_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[tuple[Any, Tensor]]:
    """``(where, tensor)`` for every tensor passed to the reader, also inside a list or tuple argument."""
    found: list[tuple[Any, Tensor]] = []
    for where, a in [*enumerate(args), *kwargs.items()]:
        if isinstance(a, Tensor):
            found.append((where, a))
        elif isinstance(a, (tuple, list)):
            found.extend((where, x) for x in a if isinstance(x, Tensor))
    return found


def _arg_name(fn: Callable[..., Any], where: Any) -> str:
    if isinstance(where, str):
        return where
    try:
        params = [p for p in inspect.signature(fn).parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        return params[where].name
    except Exception:  # a builtin or *args: say which argument by position
        return f"argument {where + 1}"


def _unchanged(before: Tensor, after: Tensor) -> bool:
    if before.shape != after.shape or before.dtype != after.dtype:
        return False
    try:
        return bool(torch.equal(before, after) or (before.is_floating_point() and torch.equal(before.nan_to_num(), after.nan_to_num())
                                                   and torch.equal(before.isnan(), after.isnan())))
    except Exception:  # a tensor that cannot be compared any more has been changed in some way
        return False


def in_place_message(name: str, container: str | None = None) -> str:
    """The hint for code that changed the reader's input ``name`` in place; ``container`` (``"list"`` or
    ``"tuple"``) when ``name`` holds tensors rather than being one, so the hint does not suggest ``name / ...``."""
    if container is not None:
        return (f"your function changed a tensor inside its input `{name}`, a {container} of tensors, in place (an "
                f"in-place operation on an item, such as `{name}[i] /= ...`, `{name}[i].mul_(...)` or `x.exp_()` in "
                f"`for x in {name}`), which silently corrupts the caller's tensors. Leave the items as they are and "
                f"compute new ones: build a new list (`[x * ... for x in {name}]`) or a new tensor "
                f"(`torch.stack({name}) * ...`).")
    return (f"your function changed its input `{name}` in place (an in-place operation such as `{name} /= ...`, "
            f"`{name}.div_(...)`, `{name}.exp_()` or `{name}.unsqueeze_(0)`), which silently corrupts the caller's tensor. "
            f"Compute on a new tensor instead: `{name} = {name} / ...`, `torch.exp({name})`, `{name}.unsqueeze(0)`.")


def list_changed_message(name: str) -> str:
    """The hint for code that changed the reader's input ``name``, a list of tensors, in place."""
    return (f"your function changed its input `{name}`, a list of tensors, in place (`{name}[i] = ...`, "
            f"`{name}.append(...)`, `{name}.pop()` or `{name}.sort()`), which silently changes the caller's list, "
            f"as an in-place operation on a tensor does. Build a new list instead (`[... for x in {name}]`), or a "
            "running sum.")


#: Where :func:`exercise`'s guard collects the reader's calls while a checker runs (``None``: not collecting).
_CALLS: contextvars.ContextVar[list[tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any], Any]] | None] = \
    contextvars.ContextVar("attnbook_reader_calls", default=None)


def _translate(err: BaseException, axes: Sequence[str] | None) -> str:
    """A raw error from the reader's code, with the axis it names translated into the exercise's own name."""
    text = _short(err)
    if axes:
        m = re.search(r"at non-singleton dimension (-?\d+)", text) or re.search(r"dimension (-?\d+)", text)
        if m:
            d = int(m.group(1))
            if -len(axes) <= d < len(axes):
                text += f" (dimension {d} is {axes[d]} in [{', '.join(axes)}])"
    return text


def mismatched_sizes(message: str) -> tuple[int, int] | None:
    """The two sizes a broadcasting error names ("The size of tensor a (4) must match the size of tensor b (3)"),
    or ``None``: a checker tells by them which of its axes met (the keys against the queries, say)."""
    m = re.search(r"size of tensor a \((\d+)\) must match the size of tensor b \((\d+)\)", message)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _tensor_names(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], *, lists: bool) -> list[str]:
    """The reader's own names for the tensors passed in (``lists``: for the lists of tensors instead)."""
    names = []
    for where, a in [*enumerate(args), *kwargs.items()]:
        is_list = isinstance(a, (tuple, list)) and any(isinstance(x, Tensor) for x in a)
        if (is_list if lists else isinstance(a, Tensor)):
            names.append(f"`{_arg_name(fn, where)}`")
    return names


def _listed(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _signature_misfits(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """True when the checker's arguments do not fit ``fn``'s own signature (the reader changed the stub's)."""
    try:
        inspect.signature(fn).bind(*args, **kwargs)
    except TypeError:
        return True
    except ValueError:  # no signature to read (a builtin)
        return False
    return False


def _parameters(fn: Callable[..., Any]) -> str:
    try:
        names = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return "other parameters"
    return f"({', '.join(names)})" if names else "no parameters"


def _signature_sentence(err: BaseException, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """A sentence for a TypeError raised because the reader's function no longer takes the stub's arguments, or ``""``."""
    if not isinstance(err, TypeError) or not _signature_misfits(fn, args, kwargs):
        return ""
    n = len(args) + len(kwargs)
    return (f" The checker calls your function with {n} argument{'s' if n != 1 else ''}, as the exercise's stub "
            f"declares them, and yours takes {_parameters(fn)}: keep the stub's parameters, in its order.")


def _idiom(err: BaseException, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """A sentence that translates a raw error several exercises share (a Python idiom applied to tensors) into
    the exercise's own names, or ``""``: math.exp of a tensor, torch.max's (values, indices) pair used as a
    tensor, a Python list where a tensor is needed."""
    text = str(err)
    if "only one element tensors can be converted to Python scalars" in text:
        names = _tensor_names(fn, args, kwargs, lists=False) or _tensor_names(fn, args, kwargs, lists=True)
        held = f"{_listed(names)} hold{'s' if len(names) == 1 else ''} many numbers" if names else "a tensor holds many numbers"
        return (f" The math module's functions (math.exp, math.log, math.sqrt) and float() take ONE Python number, "
                f"and {held}: use the torch functions of the same names (torch.exp, torch.log, torch.logaddexp, "
                "torch.sqrt), which work on every entry at once.")
    if re.search(r"math\.(ceil|floor)\(\) takes exactly one argument", text):
        f = re.search(r"math\.(ceil|floor)", text).group(1)
        return (f" math.{f} rounds ONE number, the quotient itself: it takes no divisor as a second argument.")
    no_dim = re.search(r"(\w+)\(\) missing 1 required positional arguments?: \"dim\"", text)
    if no_dim is not None:
        f = no_dim.group(1)
        return (f" torch.{f} has no default axis: it needs dim=..., the axis to reduce, because on a tensor of several "
                "axes it cannot guess which one holds the numbers to combine. Name that axis (torch.stack puts the "
                "axis it adds first).")
    kind = re.search(r"return_types\.(\w+)", text)
    if kind is not None:
        f = kind.group(1)
        alt = {"max": "amax", "min": "amin"}.get(f)
        return (f" torch.{f}(x, dim) returns a pair (values, indices), a torch.return_types.{f}, not a tensor: take "
                f"its .values" + (f", or use x.{alt}(dim), which returns the values only." if alt else "."))
    if re.search(r"must be Tensor, not (list|tuple)", text) or re.search(r"expected Tensor as element", text):
        names = _tensor_names(fn, args, kwargs, lists=True)
        what = f"{_listed(names)} {'is a list' if len(names) == 1 else 'are lists'} of tensors" if names else "a list of tensors"
        return (f" A Python list is not a tensor, and {what}: a torch function wants one tensor, so stack the list "
                "first, torch.stack(items) (a new leading axis, one entry per item), and reduce over that axis.")
    return ""


def run_reader_code(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, Feedback | None]:
    """Call the reader's function, turning the stub, a missing ``return``, crashes and in-place
    changes to its inputs into feedback.

    The tensors passed in (also inside a list or tuple argument) are compared before and after the
    call: code that changes them in place (``q /= ...``, ``div_``, ``exp_``, ``unsqueeze_``) is refused
    by name, even when what it returns is right, because it corrupts the caller's tensors; so is code
    that changes a list of tensors passed in (``outs[i] = ...``, ``append``, ``pop``).

    Returns:
        ``(result, None)`` when the call returned something, or ``(None, feedback)`` when it
        raised ``NotImplementedError`` (status ``todo``: still the stub), returned ``None``
        (status ``wrong``: :data:`RETURNED_NONE`), changed an input in place, or raised another
        error (status ``wrong``, with the error in the message).
    """
    return call_reader(fn, args, kwargs)


def call_reader(fn: Callable[..., Any], args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None, *,
                axes: Sequence[str] | None = None, idioms: bool = True) -> tuple[Any, Feedback | None]:
    """:func:`run_reader_code` with the arguments as a tuple, and ``axes`` naming the dimensions of the
    exercise's main tensor (``("B", "H", "S_q", "S_k")``) so a size mismatch is reported in its names.

    A raw error that several exercises share (``math.exp`` of a tensor, ``torch.max(x, dim)``'s pair used as a
    tensor, a list passed where a tensor is needed) gets a sentence in the reader's own argument names;
    ``idioms=False`` leaves it out for a checker that writes its own."""
    args, kwargs = tuple(args), dict(kwargs or {})
    inputs = _tensor_args(args, kwargs)
    snapshot = [t.detach().clone() for _, t in inputs]
    lists = [(where, a, list(a)) for where, a in [*enumerate(args), *kwargs.items()]
             if isinstance(a, list) and any(isinstance(x, Tensor) for x in a)]  # the items, to compare by identity
    try:
        result = fn(*args, **kwargs)
    except NotImplementedError as err:
        if _raised_by_stub(err):
            return None, todo()
        return None, wrong(f"your code raised NotImplementedError ({_short(err) or 'no message'}) from a function it calls, "
                           "not from its own `raise NotImplementedError`: something it calls is still a stub or is not supported.")
    except Exception as err:  # the reader's code may raise anything; report it instead of crashing
        extra = (_idiom(err, fn, args, kwargs) if idioms else "") or _signature_sentence(err, fn, args, kwargs)
        message = f"your code raised {type(err).__name__}: {_translate(err, axes)}"
        return None, wrong(message.rstrip(".") + "." + extra if extra else message)
    for (where, tensor), before in zip(inputs, snapshot):
        if not _unchanged(before, tensor.detach()):
            holder = kwargs[where] if isinstance(where, str) else args[where]
            container = None if isinstance(holder, Tensor) else "list" if isinstance(holder, list) else "tuple"
            return None, wrong(in_place_message(_arg_name(fn, where), container))
    for where, items, before in lists:
        if len(items) != len(before) or any(x is not y for x, y in zip(items, before)):
            return None, wrong(list_changed_message(_arg_name(fn, where)))
    calls = _CALLS.get()
    if calls is not None:
        calls.append((fn, tuple(snapshot_args(args, inputs, snapshot)), kwargs, result))
    if result is None:
        return None, wrong(RETURNED_NONE)
    return result, None


def snapshot_args(args: tuple[Any, ...], inputs: list[tuple[Any, Tensor]], snapshot: list[Tensor]) -> list[Any]:
    """``args`` with each tensor replaced by its copy taken before the call (lists and tuples rebuilt)."""
    copies = {id(t): c for (_, t), c in zip(inputs, snapshot)}
    out = []
    for a in args:
        if isinstance(a, Tensor):
            out.append(copies.get(id(a), a))
        elif isinstance(a, (tuple, list)):
            out.append(type(a)(copies.get(id(x), x) if isinstance(x, Tensor) else x for x in a))
        else:
            out.append(a)
    return out


def _raised_by_stub(err: BaseException) -> bool:
    """True when ``NotImplementedError`` came from a ``raise NotImplementedError`` in the reader's own code
    (the stub, or a helper of theirs still unwritten), not from PyTorch or another library it calls."""
    tb, last = err.__traceback__, None
    while tb is not None:
        last, tb = tb, tb.tb_next
    if last is None:
        return not str(err)
    filename = last.tb_frame.f_code.co_filename
    if any(part in filename for part in ("site-packages", "dist-packages", f"{os.sep}torch{os.sep}", f"{os.sep}numpy{os.sep}")):
        return False
    line = linecache.getline(filename, last.tb_lineno, last.tb_frame.f_globals)
    if line:
        return "NotImplementedError" in line  # else PyTorch raised it in C++ from a call on this line
    return not str(err)


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


def as_index(value: Any) -> int:
    """``value`` as an int when it is a whole number in an integer form (``operator.index``), or a
    ``fractions.Fraction`` with denominator 1; raises ``TypeError`` otherwise (2.0 and ``True`` are not indices)."""
    if isinstance(value, fractions.Fraction) and value.denominator == 1:
        return int(value)
    if isinstance(value, (bool, np.bool_)):
        raise TypeError("a bool is not an index")
    return operator.index(value)


def check_number_cases(fn: Callable[..., Any], cases: Sequence[tuple[Any, ...]], reference: Callable[..., float],
                       mistakes: Sequence[Mistake], *, done: str, generic: str | Callable[[list[float]], str],
                       what: str = "a number",
                       same: Callable[[float, float], bool] | None = None) -> Feedback:
    """The loop of a checker whose answer is one number per case (chapters 8-10 share it).

    Calls ``fn(*case)`` for every case through :func:`run_reader_code`; reads the number with
    :func:`as_number` (Python, NumPy, ``Fraction`` or 0-d tensor; anything else, a tuple included, is
    named); refuses inf and NaN, naming the case; then compares the answers of all cases together with
    ``reference`` and with each mistake in turn (``same``: relative 1e-6 by default). ``generic`` is
    the message for an answer no mistake explains, or a function of the answers that writes it.
    """
    same = same or (lambda a, b: abs(a - b) <= 1e-6 * max(1.0, abs(b)))
    got = []
    for case in cases:
        value, fb = run_reader_code(fn, *case)
        if fb is not None:
            return fb
        x = as_number(value)
        if x is None:
            return wrong(f"return {what} (an int or a float), got {describe(value)} for the arguments {case}.")
        if not math.isfinite(x):
            return wrong(f"for the arguments {case} you return {x}: return a finite number.")
        got.append(x)
    if all(same(g, reference(*c)) for g, c in zip(got, cases)):
        return correct(done)
    for m in mistakes:
        try:
            if all(same(g, float(m.compute(*c))) for g, c in zip(got, cases)):
                return wrong(m.hint)
        except Exception:  # a mistake that cannot be computed on these cases does not match
            continue
    return wrong(generic(got) if callable(generic) else generic)


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


def computed_narrower(got: Any, expected: Tensor, narrow: Tensor, *, name: str = "your result") -> Feedback | None:
    """The hint of the dtype rule (see the module's contract) for a result computed narrower than its inputs and cast
    back: ``got`` has ``expected``'s dtype, float64, and agrees with ``narrow`` (the right answer computed in
    float32, cast back) to float32's precision but not with ``expected`` to float64's; ``None`` otherwise."""
    if not (isinstance(got, Tensor) and isinstance(expected, Tensor) and expected.dtype == torch.float64
            and got.dtype == torch.float64 and tuple(got.shape) == tuple(expected.shape)):
        return None
    if close(got, expected, atol=1e-12, rtol=1e-10) or not close(got, narrow, atol=1e-6, rtol=1e-6):
        return None
    worst = float((as_cpu_float64(got) - as_cpu_float64(expected)).abs().max())
    return wrong(f"{name} carries only float32's precision, about 7 significant digits (off by up to {worst:.1g}), "
                 "though the inputs are torch.float64: a cast inside your function (.float(), .to(torch.float32)) "
                 "computed in a narrower dtype, and casting back does not restore the digits. Compute in the inputs' "
                 "dtype or wider; upcast only float16 or bfloat16.")


def not_a_tensor(got: Any, expected: Tensor, *, name: str = "your result") -> Feedback | None:
    """The hint for a result that is not a tensor (a NumPy array, a list), or ``None`` for a tensor. Its values are
    compared first, so a NumPy array of the right numbers is told that only its type is wrong, not that it differs."""
    if isinstance(got, Tensor):
        return None
    try:
        values = torch.as_tensor(np.asarray(got, dtype=np.float64))
        right = tuple(values.shape) == tuple(expected.shape) and close(values, as_cpu_float64(expected))
    except Exception:  # not numbers at all
        right = False
    if right:
        return wrong(f"{name} should be a torch.Tensor, got {describe(got)}: its values are right, but the exercise "
                     "returns a tensor, as the rest of the model uses it. Compute with the torch functions "
                     "throughout (or convert at the end with torch.from_numpy).")
    return wrong(f"{name} should be a torch.Tensor, got {describe(got)}.")


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

def _flat_tensors(value: Any) -> list[Tensor] | None:
    """The tensors of a result (a tensor, or a tuple/list of tensors and numbers), else ``None``."""
    if isinstance(value, Tensor):
        return [value]
    if isinstance(value, (tuple, list)) and all(isinstance(v, (Tensor, numbers.Number)) for v in value):
        return [v for v in value if isinstance(v, Tensor)]
    return None


def _second_look(ex: "Exercise", submitted: tuple[Any, ...], calls: list[Any]) -> Feedback | None:
    """What the generic contract adds to a checker's "wrong": a right answer in half precision is named
    as such, and a tuple that holds the right answer is named as a tuple. It recomputes the right
    answer with the exercise's solution on the inputs the reader's code received (copies taken
    before the call), so it never contradicts the checker on a wrong answer."""
    if ex.kind not in ("function", "functions") or not submitted:
        return None
    readers = list(submitted[0]) if ex.kind == "functions" and len(submitted) == 1 else list(submitted)
    solutions = list(ex.solution) if ex.kind == "functions" else [ex.solution]
    for fn, args, kwargs, got in calls:
        fn = getattr(fn, "__wrapped__", fn)  # a checker's wrapper around the reader's function
        if fn not in readers or readers.index(fn) >= len(solutions):
            continue
        try:
            expected = solutions[readers.index(fn)](*args, **kwargs)
        except Exception:  # the solution does not apply to this call (a helper call of the checker's own)
            continue
        exp = _flat_tensors(expected)
        if isinstance(got, tuple) and not isinstance(expected, (tuple, list)) and any(_same(g, expected) for g in got):
            what = f"a tensor of shape {tuple(expected.shape)}" if isinstance(expected, Tensor) else "one value"
            return wrong(f"your function returned a tuple of {len(got)} item{'s' if len(got) != 1 else ''} with the answer "
                         f"{'among them' if len(got) != 1 else 'in it'}: return "
                         f"only the answer, {what} (write `return x`, not `return x, y`).")
        mine = _flat_tensors(got)
        if exp and mine and len(exp) == len(mine) and any(g.dtype in (torch.float16, torch.bfloat16) for g in mine):
            if all(close(g, e, atol=HALF_TOL, rtol=HALF_TOL) for g, e in zip(mine, exp)):
                half = next(g for g in mine if g.dtype in (torch.float16, torch.bfloat16))
                full = next((e for e in exp if e.is_floating_point()), exp[0])
                return low_precision(half.to(full.dtype).to(half.dtype), full.to(full.dtype), name="your result") or None
    return None


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
            calls: list[Any] = []
            token = _CALLS.set(calls)
            try:
                result = check(*args, **kwargs)
            except NotImplementedError:
                return todo()
            except Exception as err:  # the contract: no traceback reaches the reader
                return wrong(_GUARD_MESSAGE.format(kind=type(err).__name__, detail=_short(err, 200)))
            finally:
                _CALLS.reset(token)
            if not isinstance(result, Feedback):  # pragma: no cover - a checker bug, caught by the tests
                raise TypeError(f"{check.__qualname__} returned {type(result).__name__}, not Feedback")
            if result.status == "wrong" and calls and name in EXERCISES and not re.search(r"float16|significant digits", result.message):
                return _second_look(EXERCISES[name], args, calls) or result
            return result

        parts = check.__module__.split(".")  # attnbook.chNN, or attnbook.chNN.checkers in a chapter package
        chapter = next((p for p in parts if p.startswith("ch") and p[2:].isdigit()), parts[-1])
        name = f"{chapter}.{check.__name__}"
        guarded.__wrapped_checker__ = check  # type: ignore[attr-defined]
        EXERCISES[name] = Exercise(name, guarded, solution, kind, tuple(tables), dict(not_generic or {}), tuple(needs))
        return guarded

    return wrap
