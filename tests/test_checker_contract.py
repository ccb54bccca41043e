"""The contract every exercise checker goes through (``attnbook.feedback``), tested over every exercise.

The exercises are discovered from the chapter modules: every function named ``check_*`` in
``attnbook/chNN.py`` (or in any module of a chapter package ``attnbook/chNN/``) must be registered with :func:`attnbook.feedback.exercise` (or listed in
``NOT_EXERCISES`` with the reason), so a new exercise is covered by these tests as soon as it exists:

* its right submission passes, and so do its generic right variants (float64, a list for a tuple,
  NumPy and 0-d tensor numbers);
* generic wrong variants (scaled, transposed, shifted, rolled, zeros, ``None``, a list, a crash,
  a wrong type) never pass, never raise, and never see the expected answer printed;
* in each mistake table, on the checker's own cases, no two mistakes give the same answer and none
  gives the right answer, and each mistake submitted as a reader's answer earns its own hint.
"""

from __future__ import annotations

import fractions
import importlib
import inspect
import math
import pkgutil
from typing import Any, Callable

import numpy as np
import pytest
import torch
from torch import Tensor

import attnbook
from attnbook import feedback
from attnbook.feedback import EXERCISES, NOT_EXERCISES, Exercise, Feedback

CHAPTERS = sorted(m.name for m in pkgutil.iter_modules(attnbook.__path__) if m.name.startswith("ch") and m.name[2:].isdigit())
for _name in CHAPTERS:
    importlib.import_module(f"attnbook.{_name}")


def _chapter_modules() -> list[tuple[str, Any]]:
    """``(chapter, module)`` for every chapter module, and for a chapter package (``attnbook/chNN/``) every
    module inside it, so a checker defined in ``attnbook/ch11/checkers.py`` is found as ``ch11.check_*``."""
    found = []
    for chapter in CHAPTERS:
        module = importlib.import_module(f"attnbook.{chapter}")
        found.append((chapter, module))
        for info in pkgutil.walk_packages(getattr(module, "__path__", []), f"{module.__name__}."):
            found.append((chapter, importlib.import_module(info.name)))
    return found


def _available(ex: Exercise) -> bool:
    for package in ex.needs:
        try:
            importlib.import_module(package)
        except ImportError:
            return False
    return True


def _exercise_params() -> list[Any]:
    return [pytest.param(ex, id=name, marks=() if _available(ex) else pytest.mark.skip(reason=f"needs {ex.needs}"))
            for name, ex in sorted(EXERCISES.items())]


# ---------------------------------------------------------------- discovery


def test_every_checker_of_every_chapter_is_registered() -> None:
    assert len(CHAPTERS) >= 9
    unregistered = []
    for chapter, module in _chapter_modules():
        for name, fn in vars(module).items():
            if name.startswith("check_") and callable(fn) and getattr(fn, "__module__", None) == module.__name__:
                key = f"{chapter}.{name}"
                if key in NOT_EXERCISES:
                    continue
                if key not in EXERCISES or EXERCISES[key].checker is not fn:
                    unregistered.append(key)
    assert not unregistered, (f"declare these checkers with @feedback.exercise(solution=..., tables=...) "
                              f"(or list them in feedback.NOT_EXERCISES with a reason): {unregistered}")
    assert all(key.split(".")[0] in CHAPTERS for key in EXERCISES)


# ---------------------------------------------------------------- the generic variants


class _NotApplicable(Exception):
    pass


def _map(value: Any, on_tensor: Callable[[Tensor], Any], on_number: Callable[[Any], Any] | None) -> Any:
    """Apply a change to every tensor (and number) inside a result; _NotApplicable if nothing changed."""
    changed = False

    def go(v: Any) -> Any:
        nonlocal changed
        if isinstance(v, Tensor):
            out = on_tensor(v)
            changed = changed or out is not v
            return out
        if isinstance(v, (bool, np.bool_)):
            if on_number is None:
                return v
            changed = True
            return on_number(v)
        if isinstance(v, (int, float, np.integer, np.floating)):
            if on_number is None:
                return v
            changed = True
            return on_number(v)
        if isinstance(v, tuple):
            return tuple(go(x) for x in v)
        if isinstance(v, list):
            return [go(x) for x in v]
        if isinstance(v, dict):
            return {k: go(x) for k, x in v.items()}
        return v

    out = go(value)
    if not changed:
        raise _NotApplicable
    return out


def _transpose(t: Tensor) -> Tensor:
    return t.transpose(-2, -1) if t.dim() >= 2 and t.shape[-1] > 1 and t.shape[-2] > 1 else t


def _transpose_numbers(value: Any) -> Any:
    if isinstance(value, tuple) and len(value) > 1 and all(isinstance(x, (int, np.integer)) for x in value):
        if tuple(value[::-1]) != tuple(value):
            return tuple(value[::-1])
    return _map(value, _transpose, None)


def _as_list(value: Any) -> Any:
    if isinstance(value, Tensor):
        return value.tolist()
    if isinstance(value, tuple):
        if not any(isinstance(x, Tensor) for x in value):  # a list for a tuple of numbers is a right answer
            raise _NotApplicable
        return [_as_list(x) if isinstance(x, Tensor) else x for x in value]
    if isinstance(value, dict):
        return list(value.values())
    if isinstance(value, (int, float, np.integer, np.floating, bool, np.bool_)):
        return [value]
    raise _NotApplicable


def _numpy_scalar(x: Any) -> Any:
    if isinstance(x, (bool, np.bool_)):
        return np.bool_(x)
    return np.int64(x) if isinstance(x, (int, np.integer)) else np.float64(x)


def _tuple_as_list(value: Any) -> Any:
    if not isinstance(value, tuple):
        raise _NotApplicable
    return list(value)


def _float_tensor(t: Tensor, f: Callable[[Tensor], Tensor]) -> Tensor:
    return f(t) if t.is_floating_point() else t


#: Generic wrong answers: ``name -> change(result)``. None of them may pass any checker.
WRONG_VARIANTS: dict[str, Callable[[Any], Any]] = {
    "scaled by 2": lambda r: _map(r, lambda t: t * 2 if t.dtype != torch.bool else t.long() * 2, lambda x: x * 2),
    "scaled by 0.5": lambda r: _map(r, lambda t: t * 0.5, lambda x: x * 0.5),
    "transposed": _transpose_numbers,
    "shifted by one": lambda r: _map(r, lambda t: t + 1 if t.dtype != torch.bool else t.long() + 1, lambda x: x + 1),
    "rolled by one": lambda r: _map(r, lambda t: t.roll(1, -1) if t.dim() and t.shape[-1] > 1 else t, None),
    "zeros": lambda r: _map(r, torch.zeros_like, lambda x: 0),
    "None": lambda r: None,
    "a list": _as_list,
    "a string": lambda r: "42",
    "NaN": lambda r: _map(r, lambda t: torch.full_like(t, float("nan")) if t.is_floating_point() else t, lambda x: float("nan")),
    "inf": lambda r: _map(r, lambda t: torch.full_like(t, float("inf")) if t.is_floating_point() else t, lambda x: float("inf")),
    "float16": lambda r: _map(r, lambda t: _float_tensor(t, lambda u: (u * 1.01).half()), None),
}

#: Generic right answers: ``name -> change(result)``. Each must pass every checker it applies to.
RIGHT_VARIANTS: dict[str, Callable[[Any], Any]] = {
    "float64": lambda r: _map(r, lambda t: _float_tensor(t, lambda u: u.double()), None),
    "a list instead of a tuple": lambda r: _tuple_as_list(r),
    "NumPy scalars": lambda r: _map(r, lambda t: t, _numpy_scalar),
    "0-d tensors": lambda r: _map(r, lambda t: t, lambda x: torch.tensor(x)),
    "a non-contiguous copy": lambda r: _map(r, lambda t: torch.stack([t.detach(), t.detach()], -1)[..., 0] if t.dim() else t, None),
    "fractions.Fraction numbers": lambda r: _map(r, lambda t: t, lambda x: x if isinstance(x, (bool, np.bool_)) else fractions.Fraction(x)),
}


def _variant(ex: Exercise, change: Callable[[Any], Any]) -> Any:
    """``ex``'s right submission, changed by ``change``; _NotApplicable when the change does nothing."""
    if ex.kind == "value":
        return change(ex.solution)
    probe_failed = []

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        def changed(*args: Any, **kwargs: Any) -> Any:
            try:
                return change(fn(*args, **kwargs))
            except _NotApplicable:
                probe_failed.append(True)
                return fn(*args, **kwargs)
        return changed

    if ex.kind == "functions":
        return tuple(wrap(f) for f in ex.solution), probe_failed
    return wrap(ex.solution), probe_failed


def _submit(ex: Exercise, change: Callable[[Any], Any]) -> Feedback:
    try:
        sub = _variant(ex, change)
    except _NotApplicable:
        pytest.skip("the change does not apply to this answer")
    if ex.kind == "value":
        return ex.submit(sub)
    submission, probe_failed = sub
    fb = ex.submit(submission)
    if probe_failed:
        pytest.skip("the change does not apply to this answer")
    return fb


@pytest.mark.parametrize("ex", _exercise_params())
def test_the_right_submission_passes(ex: Exercise) -> None:
    fb = ex.submit(ex.solution)
    assert isinstance(fb, Feedback) and fb.passed, fb


@pytest.mark.parametrize("variant", sorted(RIGHT_VARIANTS))
@pytest.mark.parametrize("ex", _exercise_params())
def test_generic_right_variants_pass(ex: Exercise, variant: str) -> None:
    if variant in ex.not_generic:
        pytest.skip(ex.not_generic[variant])
    fb = _submit(ex, RIGHT_VARIANTS[variant])
    assert fb.passed, fb


@pytest.mark.parametrize("variant", sorted(WRONG_VARIANTS))
@pytest.mark.parametrize("ex", _exercise_params())
def test_generic_wrong_variants_never_pass_and_never_raise(ex: Exercise, variant: str) -> None:
    if variant in ex.not_generic:
        pytest.skip(ex.not_generic[variant])
    fb = _submit(ex, WRONG_VARIANTS[variant])  # an exception here fails the test: the contract forbids one
    assert isinstance(fb, Feedback) and not fb.passed, f"{variant} was accepted: {fb}"
    assert "Traceback" not in fb.message


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("ex", _exercise_params())
def test_a_right_answer_in_half_precision_is_named(ex: Exercise, dtype: torch.dtype) -> None:
    """The contract of feedback.low_precision: a right answer rounded to float16 or bfloat16 passes or is
    named as low precision, never given the hint of an unrelated mistake."""
    fb = _submit(ex, lambda r: _map(r, lambda t: _float_tensor(t, lambda u: u.detach().to(dtype)), None))
    assert fb.passed or (str(dtype).split(".")[1] in fb.message and "significant digits" in fb.message), fb


@pytest.mark.parametrize("ex", _exercise_params())
def test_a_tuple_around_the_answer_is_named(ex: Exercise) -> None:
    """A reader who returns ``(answer, something)`` where one answer is asked for is told about the tuple."""
    fb = _submit(ex, lambda r: (_ for _ in ()).throw(_NotApplicable()) if isinstance(r, (tuple, list, dict)) else (r, r))
    assert not fb.passed and "tuple" in fb.message, fb


def _tensors_in(args: tuple[Any, ...]) -> list[Tensor]:
    found = []
    for a in args:
        if isinstance(a, Tensor):
            found.append(a)
        elif isinstance(a, (tuple, list)):
            found.extend(x for x in a if isinstance(x, Tensor))
    return found


@pytest.mark.parametrize("ex", _exercise_params())
def test_inputs_modified_in_place_are_refused_and_named(ex: Exercise) -> None:
    """Code that changes its input tensors in place (``q /= ...``, ``div_``, ``exp_``, ``unsqueeze_``)
    corrupts the reader's tensors even when what it returns is right: the checker must refuse it and say so."""
    if ex.kind == "value":
        pytest.skip("the reader types a value, not a function")
    touched = []

    def in_place(fn: Callable[..., Any]) -> Callable[..., Any]:
        def changed(*args: Any, **kwargs: Any) -> Any:
            out = fn(*args, **kwargs)
            with torch.no_grad():
                for t in _tensors_in(args):
                    if t.is_floating_point() and t.numel() and not t.requires_grad:
                        out = out.clone() if isinstance(out, Tensor) and out.data_ptr() == t.data_ptr() else out
                        t.mul_(2).add_(1)
                        touched.append(True)
            return out
        return changed

    sub = tuple(in_place(f) for f in ex.solution) if ex.kind == "functions" else in_place(ex.solution)
    fb = ex.submit(sub)
    if not touched:
        pytest.skip("the exercise passes no floating-point tensor to the reader's code")
    assert not fb.passed and "in place" in fb.message, fb


def _crashes(*args: Any, **kwargs: Any) -> Any:
    raise ZeroDivisionError("division by zero in the reader's code")


class _Hostile:
    """An object whose every use raises: comparing, converting or indexing it must not crash a checker."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # let pytest's own introspection through
            raise AttributeError(name)
        raise RuntimeError("hostile object")

    def __iter__(self) -> Any:
        raise RuntimeError("hostile object")

    def __len__(self) -> int:
        raise RuntimeError("hostile object")

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("hostile object")

    def __bool__(self) -> bool:
        raise RuntimeError("hostile object")

    def __float__(self) -> float:
        raise RuntimeError("hostile object")

    __hash__ = object.__hash__


@pytest.mark.parametrize("ex", _exercise_params())
def test_crashes_and_hostile_results_become_feedback(ex: Exercise) -> None:
    if ex.kind == "value":
        for answer in (_Hostile(), "a string", float("nan"), object()):
            fb = ex.submit(answer)
            assert isinstance(fb, Feedback) and not fb.passed, (answer, fb)
        return
    funcs: list[Any] = [_crashes, lambda *a, **k: _Hostile(), lambda *a, **k: object()]
    for f in funcs:
        sub = tuple(f for _ in ex.solution) if ex.kind == "functions" else f
        fb = ex.submit(sub)
        assert isinstance(fb, Feedback) and not fb.passed, fb


@pytest.mark.parametrize("ex", _exercise_params())
def test_a_forgotten_return_is_named(ex: Exercise) -> None:
    if ex.kind == "value":
        pytest.skip("the reader types a value, not a function")
    def no_return(*args: Any, **kwargs: Any) -> None:
        return None
    sub = tuple(no_return for _ in ex.solution) if ex.kind == "functions" else no_return
    fb = ex.submit(sub)
    assert fb.status == "wrong" and "did you forget `return`" in fb.message, fb


def _stub(*args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError


@pytest.mark.parametrize("ex", _exercise_params())
def test_the_stub_is_your_turn(ex: Exercise) -> None:
    if ex.kind == "value":
        fb = ex.submit(None)
    else:
        fb = ex.submit(tuple(_stub for _ in ex.solution) if ex.kind == "functions" else _stub)
    assert fb.status == "todo", fb


# ---------------------------------------------------------------- mistake tables


def _table_params() -> list[Any]:
    out = []
    for name, ex in sorted(EXERCISES.items()):
        for i, table in enumerate(ex.tables):
            marks = () if _available(ex) else pytest.mark.skip(reason=f"needs {ex.needs}")
            out.append(pytest.param(ex, table, id=f"{name}[{i}]", marks=marks))
    return out


def _compute(m: feedback.Mistake, case: tuple[Any, ...]) -> Any:
    try:
        return m.compute(*case)
    except Exception:  # the checker's diagnose skips a mistake that cannot be computed on a case
        return None


@pytest.mark.parametrize(("ex", "table"), _table_params())
def test_no_two_mistakes_collide_and_none_is_right(ex: Exercise, table: feedback.MistakeTable) -> None:
    cases = list(table.cases())
    assert len(cases) >= 1
    names = [m.name for m in table.mistakes]
    assert len(set(names)) == len(names), "mistake names must be unique"
    wrong_somewhere = {m.name: False for m in table.mistakes}
    for case in cases:
        right = table.reference(*case)
        outputs = [(m, _compute(m, case)) for m in table.mistakes]
        # A mistake may coincide with the right answer on one case (the checker then moves on to the
        # next case); where it is wrong, it must be told apart from every other mistake.
        outputs = [(m, out) for m, out in outputs if out is not None and not table.same(out, right)]
        for i, (a, out_a) in enumerate(outputs):
            wrong_somewhere[a.name] = True
            for b, out_b in outputs[i + 1:]:
                if a.hint != b.hint:
                    assert not table.same(out_a, out_b), f"mistakes {a.name!r} and {b.name!r} give the same answer on a checker case"
    right_everywhere = [n for n, w in wrong_somewhere.items() if not w and any(_compute(m, c) is not None for m in table.mistakes if m.name == n for c in cases)]
    assert not right_everywhere, f"these mistakes give the right answer on every checker case: {right_everywhere}"


def test_every_mistake_applies_to_some_checker_case() -> None:
    """A table may serve several exercises; each of its mistakes must be computable on one of their cases."""
    computable: dict[int, dict[str, bool]] = {}
    for name, ex in EXERCISES.items():
        if not _available(ex):
            continue
        for table in ex.tables:
            seen = computable.setdefault(id(table.mistakes), {m.name: False for m in table.mistakes})
            for case in table.cases():
                for m in table.mistakes:
                    seen[m.name] = seen[m.name] or _compute(m, case) is not None
    never = [n for seen in computable.values() for n, ok in seen.items() if not ok]
    assert not never, f"these mistakes cannot be computed on any checker case: {never}"


def test_every_exercise_has_a_table_or_says_why() -> None:
    for name, ex in EXERCISES.items():
        assert ex.tables or "no table" in ex.not_generic, f"{name} has no mistake table"


# ---------------------------------------------------------------- the number contract


@pytest.mark.parametrize("value", [3, 3.0, np.int64(3), np.int32(3), np.float32(3.0), np.float64(3.0),
                                   torch.tensor(3), torch.tensor(3.0, dtype=torch.float64), np.array(3), np.array([3.0])])
def test_as_number_reads_any_real_scalar(value: Any) -> None:
    assert feedback.as_number(value) == 3.0


@pytest.mark.parametrize("value", [True, np.bool_(True), "3", None, [3], (3,), torch.tensor([1.0, 2.0]),
                                   torch.tensor(1 + 2j), object(), _Hostile()])
def test_as_number_refuses_what_is_not_one_real_number(value: Any) -> None:
    assert feedback.as_number(value) is None


def test_check_number_tolerance_nan_and_counts() -> None:
    assert feedback.check_number(np.int64(7), 7, integer=True)[1] is None
    assert feedback.check_number(0.6417, 0.6439, abs_tol=0.01)[1] is None
    assert not feedback.check_number(0.62, 0.6439, abs_tol=0.01)[1].passed  # type: ignore[union-attr]
    for bad in (float("nan"), float("inf"), 7.5):
        value, fb = feedback.check_number(bad, 7, integer=True)
        assert fb is not None and fb.status == "wrong" and "7" not in fb.message.replace(str(bad), "")
    assert "got str" in feedback.check_number("7", 7)[1].message  # type: ignore[union-attr]


def test_run_reader_code_tells_the_stub_from_a_missing_return() -> None:
    assert feedback.run_reader_code(_stub)[1].status == "todo"  # type: ignore[union-attr]
    fb = feedback.run_reader_code(lambda: None)[1]
    assert fb is not None and fb.status == "wrong" and fb.message == feedback.RETURNED_NONE
    fb = feedback.run_reader_code(_crashes)[1]
    assert fb is not None and fb.message.startswith("your code raised ZeroDivisionError")


def test_the_guard_turns_a_checker_crash_into_feedback() -> None:
    @feedback.exercise(solution=None, kind="value", not_generic={"no table": "a test of the guard"})
    def check_demo(answer: Any) -> Feedback:
        return feedback.correct() if float(answer) == 1 else feedback.wrong("no")

    try:
        fb = check_demo(_Hostile())
        assert fb.status == "wrong" and "RuntimeError" in fb.message
        assert check_demo(1).passed
    finally:
        EXERCISES.pop(f"{__name__.rsplit('.', 1)[-1]}.check_demo", None)


def test_messages_never_reveal_a_numeric_answer() -> None:
    """Wrong numeric answers get hints that do not contain the expected number."""
    for name, ex in EXERCISES.items():
        if ex.kind != "value" or not _available(ex):
            continue
        right = ex.solution
        if not isinstance(right, (int, float)) or isinstance(right, bool):
            continue
        for wrong_answer in (right + 1, right * 3, 1, right - 17):
            fb = ex.submit(wrong_answer)
            assert not fb.passed
            assert f"{right:,}" not in fb.message and str(right) not in fb.message, (name, fb)


# ---------------------------------------------------------------- what the reader's code does, named


def _numbers_in(value: Any) -> list[float]:
    if isinstance(value, dict):
        return [x for v in value.values() for x in _numbers_in(v)]
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in _numbers_in(v)]
    if isinstance(value, Tensor):
        return [float(x) for x in value.flatten().tolist()]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return [float(value)]
    return []


def test_hints_never_give_the_answer_away() -> None:
    """A hint for a wrong answer to a value exercise does not state a value of the right answer (as
    chapter 4's fully masked rows did with "1/4")."""
    for name, ex in EXERCISES.items():
        if ex.kind != "value":
            continue
        forms = set()
        for x in _numbers_in(ex.solution):
            if x != int(x):
                forms.add(f"{x:g}")
                frac = fractions.Fraction(x).limit_denominator(64)
                if float(frac) == x:
                    forms.add(f"{frac.numerator}/{frac.denominator}")
        for table in ex.tables:
            for m in table.mistakes:
                leaked = [f for f in forms if f in m.hint]
                assert not leaked, f"{name}: the hint of {m.name!r} states {leaked}: {m.hint}"


def test_a_not_implemented_error_from_deeper_code_is_not_your_turn() -> None:
    def raises_not_implemented_from_a_library(x: Tensor) -> Tensor:
        return torch.utils.data.Dataset()[0]  # PyTorch's own `raise NotImplementedError` in its Python code

    fb = feedback.run_reader_code(raises_not_implemented_from_a_library, torch.ones(2))[1]
    assert fb is not None and fb.status == "wrong" and "NotImplementedError" in fb.message, fb
    assert feedback.run_reader_code(_stub, torch.ones(2))[1].status == "todo"  # type: ignore[union-attr]


def test_raw_errors_are_told_in_the_exercise_names() -> None:
    fb = feedback.call_reader(lambda s: s - s.amax(-1), (torch.ones(1, 2, 3, 4),), axes=("B", "H", "S_q", "S_k"))[1]
    assert fb is not None and "dimension 3 is S_k in [B, H, S_q, S_k]" in fb.message, fb


def test_check_number_cases_reads_every_number_form_and_names_the_rest() -> None:
    cases = ((3, 4), (5, 2))
    mistakes = (feedback.Mistake("upside down", lambda a, b: b / a, "upside down"),)
    check = lambda f: feedback.check_number_cases(f, cases, lambda a, b: a / b, mistakes, done="ok", generic="no")  # noqa: E731
    for right in (lambda a, b: a / b, lambda a, b: fractions.Fraction(a, b), lambda a, b: np.float64(a / b),
                  lambda a, b: torch.tensor(a / b)):
        assert check(right).passed
    assert check(lambda a, b: b / a).message == "upside down"
    assert "tuple" in check(lambda a, b: (a / b, 0)).message
    assert "finite" in check(lambda a, b: float("nan")).message
    assert check(lambda a, b: a * b).message == "no"


def test_as_index_takes_whole_fractions_but_not_floats_or_bools() -> None:
    assert feedback.as_index(fractions.Fraction(6, 2)) == 3 and feedback.as_index(np.int64(4)) == 4
    for bad in (2.0, True, fractions.Fraction(1, 2), "3"):
        with pytest.raises(TypeError):
            feedback.as_index(bad)
