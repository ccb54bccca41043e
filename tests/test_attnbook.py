"""The learning tools: feedback, quizzes, sliders and figures."""

from __future__ import annotations

import json
import re

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest
import torch

from attnbook import (
    Frame,
    Panel,
    compare_tensors,
    redraw_ms,
    run_reader_code,
    static_slider,
)
from attnbook.feedback import Feedback
from attnbook.figures import attention_heatmap
from attnbook.quiz import show_quiz, validate_quiz


def test_feedback_repr_and_truth() -> None:
    ok = Feedback("correct", "rows sum to 1.")
    assert ok.passed and repr(ok) == "[Correct] rows sum to 1."
    wrong = Feedback("wrong", "x")
    assert not wrong.passed and "Not yet" in wrong._repr_html_()
    assert (wrong or "fallback") is wrong  # a wrong verdict must survive `feedback or correct()`
    assert "<b>" not in Feedback("wrong", "<b>")._repr_html_()  # escaped


def test_run_reader_code_turns_stubs_and_crashes_into_feedback() -> None:
    def stub() -> None:
        raise NotImplementedError

    def crash() -> None:
        raise IndexError("dimension out of range")

    assert run_reader_code(stub)[1].status == "todo"
    assert run_reader_code(lambda: None)[1].status == "todo"
    result, fb = run_reader_code(crash)
    assert fb.status == "wrong" and "IndexError: dimension out of range" in fb.message
    assert run_reader_code(lambda x: x + 1, 1) == (2, None)


def test_compare_tensors() -> None:
    t = torch.ones(2, 3)
    assert compare_tensors(t.clone(), t) is None
    assert "shape (3, 2)" in compare_tensors(t.T, t).message
    assert "torch.Tensor" in compare_tensors([1], t).message
    assert "largest difference 0.5" in compare_tensors(t + 0.5, t).message


def test_validate_quiz_requires_feedback_and_a_correct_answer() -> None:
    good = [{"question": "2+2?", "type": "numeric", "answers": [{"type": "value", "value": 4, "correct": True, "feedback": "yes"}]}]
    assert validate_quiz(good) == good
    with pytest.raises(ValueError, match="question 1, answer 1: every answer needs 'feedback'"):
        validate_quiz([{"question": "q", "type": "numeric", "answers": [{"value": 4, "correct": True}]}])
    with pytest.raises(ValueError, match="no answer is marked correct"):
        validate_quiz([{"question": "q", "type": "multiple_choice", "answers": [{"answer": "a", "correct": False, "feedback": "f"}]}])
    with pytest.raises(ValueError, match="precision is a number of significant digits >= 1"):
        validate_quiz([{**good[0], "precision": 0}])
    with pytest.raises(ValueError, match="type must be"):
        validate_quiz([{"question": "q", "type": "essay", "answers": []}])


def test_show_quiz_output_is_deterministic(tmp_path, monkeypatch, capsys) -> None:
    (tmp_path / "demo.json").write_text(json.dumps(
        [{"question": "2+2?", "type": "numeric", "answers": [{"type": "value", "value": 4, "correct": True, "feedback": "yes"}]}]
    ))
    monkeypatch.setattr("attnbook.quiz.QUIZ_DIR", tmp_path)
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj, *a, **k: shown.append(obj))
    monkeypatch.setattr("jupyterquiz.dynamic.display.display", lambda obj, *a, **k: shown.append(obj), raising=False)
    import random

    random.seed(1)
    show_quiz("demo")
    first = [getattr(o, "data", o) for o in shown]
    shown.clear()
    random.seed(2)
    show_quiz("demo")
    assert [getattr(o, "data", o) for o in shown] == first
    assert first, "nothing was displayed"


def demo_frame(t: int) -> Frame:
    return Frame(label=f"T = {t}", panels=[Panel(np.array([[0.25 * t, 1 - 0.25 * t]]), ["q"], ["a", "b"], title="w")],
                 caption=f"entropy {t:.2f}")


SETTINGS = [{"t": t} for t in (1, 2, 3)]


def test_static_slider_renders_every_frame_and_hides_all_but_one() -> None:
    html = static_slider(demo_frame, SETTINGS, slider_label="temperature", title="Demo", alt="a demo", initial=1).data
    assert html.count('class="attnlib-frame"') == 3
    assert html.count('style="display:none"') == 2
    assert 'max="2"' in html and 'value="1"' in html
    assert "0.75" in html and "entropy 3.00" in html
    uid = re.search(r'id="(attnlib-slider-[0-9a-f]+)"', html).group(1)
    assert static_slider(demo_frame, SETTINGS, slider_label="temperature", title="Demo", alt="a demo", initial=1).data.count(uid) == 2
    with pytest.raises(ValueError, match="out of range"):
        static_slider(demo_frame, SETTINGS, slider_label="t", title="x", alt="y", initial=3)
    with pytest.raises(ValueError, match="at least one setting"):
        static_slider(demo_frame, [], slider_label="t", title="x", alt="y")


def test_static_slider_draws_masked_cells_without_numbers() -> None:
    p = Panel(np.array([[1.0, 0.0]]), masked=np.array([[False, True]]))
    html = static_slider(lambda: Frame("one", [p]), [{}], slider_label="s", title="t", alt="a").data
    assert html.count("attnlib-masked") == 1 and "1.00" in html and "0.00" not in html


def test_heatmap_checks_labels() -> None:
    with pytest.raises(ValueError, match="2 row labels and 2 column labels do not match weights of shape \\(3, 3\\)"):
        attention_heatmap(np.eye(3), ["a", "b"], title="x")


def test_redraw_ms_times_one_redraw_per_setting() -> None:
    calls = []

    def frame(t: int) -> Frame:
        calls.append(t)
        return demo_frame(t)

    ms = redraw_ms(frame, SETTINGS)
    assert len(ms) == 3 and all(m > 0 for m in ms) and calls == [1, 2, 3]


def test_live_slider_draws_the_frame_function(monkeypatch) -> None:
    from attnbook import live_slider

    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj, *a, **k: shown.append(obj))
    widget = live_slider(demo_frame, t=(1, 3))
    widget.update()  # what moving the slider does
    markup = [getattr(o, "data", "") for o in shown if isinstance(getattr(o, "data", None), str)]
    assert any("entropy 2.00" in m for m in markup), markup


def test_frame_html_shows_one_frame_like_the_static_slider() -> None:
    from attnbook import frame_html

    frame = Frame("T = 1", [Panel(np.array([[0.25, 0.75]]), ["q"], ["a", "b"], title="w", vmin=0, vmax=1)], caption="H = 0.56")
    markup = frame_html(frame).data
    assert "H = 0.56" in markup and "0.75" in markup and ">a<" in markup
    assert "input" not in markup  # no slider around a single frame
    assert markup.split('class="attnlib-caption"')[1] in static_slider(lambda: frame, [{}], slider_label="T", title="t", alt="a").data
