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
from attnbook.slider import unpack_slider_data


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
    assert run_reader_code(lambda: None)[1].message == "your function returned None: did you forget `return`?"
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


def test_show_quiz_output_is_deterministic(tmp_path, monkeypatch) -> None:
    (tmp_path / "demo.json").write_text(json.dumps(
        [{"question": "2+2?", "type": "numeric", "answers": [{"type": "value", "value": 4, "correct": True, "feedback": "yes"}]}]
    ))
    monkeypatch.setattr("attnbook.quiz.QUIZ_DIR", tmp_path)
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj, *a, **k: shown.append(obj))
    import random

    random.seed(1)
    show_quiz("demo")
    random.seed(2)
    show_quiz("demo")
    assert len(shown) == 2 and shown[0].data == shown[1].data
    assert 'id="attnbook-quiz-demo"' in shown[0].data


CHOICE = {"question": "Pick <b>", "type": "multiple_choice", "answers": [
    {"answer": f"option {i}", "correct": i == 2, "feedback": f"because {i}"} for i in range(4)]}
NUMERIC = {"question": "How many?", "type": "numeric", "precision": 2,
           "answers": [{"type": "value", "value": 8, "correct": True, "feedback": "yes"}, {"type": "default", "feedback": "no"}]}


def test_quiz_html_is_labelled_and_announces_feedback() -> None:
    from attnbook.quiz import quiz_html

    markup = quiz_html("Demo quiz", [CHOICE, NUMERIC])
    assert markup == quiz_html("Demo quiz", [CHOICE, NUMERIC])  # deterministic, ids included
    ids = re.findall(r'id="([^"]+)"', markup)
    assert len(ids) == len(set(ids)) and all(i.startswith("attnbook-quiz-demo-quiz") for i in ids)
    # every numeric field has a <label for> and every question a polite live region for its feedback
    for field in re.findall(r'<input id="([^"]+)"', markup):
        assert f'<label for="{field}">' in markup
    assert markup.count('aria-live="polite"') == 2
    assert "Pick &lt;b&gt;" in markup and "<b>" not in markup  # question text escaped
    # answers are buttons, in an order that depends only on the quiz name and question number
    order = re.findall(r'data-a="(\d)">option (\d)<', markup)
    assert sorted(order) == [(str(i), str(i)) for i in range(4)]
    assert order == re.findall(r'data-a="(\d)">option (\d)<', quiz_html("Demo quiz", [CHOICE]))
    assert 'type="radio"' not in markup  # radio groups answer on every arrow key
    # the answers' data: feedback and the correct flag, never the answer texts twice
    data = json.loads(re.search(r'<script type="application/json">(.*?)</script>', markup).group(1))
    assert data[0]["answers"][2] == {"correct": True, "feedback": "because 2"} and data[1]["precision"] == 2


def test_validate_quiz_checks_answer_fields() -> None:
    with pytest.raises(ValueError, match="a choice needs an 'answer' text"):
        validate_quiz([{**CHOICE, "answers": [{"correct": True, "feedback": "f"}]}])
    with pytest.raises(ValueError, match="a numeric answer needs a 'value', a 'range'"):
        validate_quiz([{**NUMERIC, "answers": [{"correct": True, "feedback": "f"}]}])


def test_every_quiz_file_is_valid_and_renders() -> None:
    from attnbook.quiz import QUIZ_DIR, load_quiz, quiz_html

    for path in sorted(QUIZ_DIR.glob("*.json")):
        questions = load_quiz(path.stem)
        assert quiz_html(path.stem, questions).count('class="aq-q"') == len(questions)


def demo_frame(t: int) -> Frame:
    return Frame(label=f"T = {t}", panels=[Panel(np.array([[0.25 * t, 1 - 0.25 * t]]), ["q"], ["a", "b"], title="w")],
                 caption=f"entropy {t:.2f}")


SETTINGS = [{"t": t} for t in (1, 2, 3)]


def _slider_data(markup: str) -> dict:
    return unpack_slider_data(markup)


def test_static_slider_stores_every_frame_as_data_and_shows_one() -> None:
    html = static_slider(demo_frame, SETTINGS, slider_label="temperature", title="Demo", alt="a demo", initial=1).data
    assert html.count('class="attnlib-frame"') == 1 and 'data-index="1"' in html  # the first frame, drawn
    data = _slider_data(html)
    assert [f["l"] for f in data["f"]] == ["T = 1", "T = 2", "T = 3"]
    assert data["f"][2]["p"][0]["v"] == ["0.75", "0.25"] and data["f"][2]["c"] == "entropy 3.00"
    assert 'max="2"' in html and 'value="1"' in html and 'aria-valuetext="T = 2"' in html
    assert '<label for="' in html and "entropy 2.00" in html
    uid = re.search(r'id="(attnlib-slider-[0-9a-f]+)"', html).group(1)
    assert static_slider(demo_frame, SETTINGS, slider_label="temperature", title="Demo", alt="a demo", initial=1).data == html
    assert all(i.startswith(uid) for i in re.findall(r' id="([^"]+)"', html))  # one deterministic id prefix
    with pytest.raises(ValueError, match="out of range"):
        static_slider(demo_frame, SETTINGS, slider_label="t", title="x", alt="y", initial=3)
    with pytest.raises(ValueError, match="at least one setting"):
        static_slider(demo_frame, [], slider_label="t", title="x", alt="y")


def test_static_slider_says_run_this_cell_until_its_script_runs() -> None:
    """Where scripts do not run (a notebook that has not been run), the slider is disabled and says
    what to do; its script removes the note, enables the slider and keeps the arrow keys to it."""
    html = static_slider(demo_frame, SETTINGS, slider_label="temperature", title="Demo", alt="a demo").data
    markup, script = html.split("<script>(function", 1)
    assert re.search(r'<input [^>]*type="range"[^>]* disabled>', markup), "the slider is not disabled before its script runs"
    assert re.search(r'<p class="attnlib-note"[^>]*>Run this cell to use the slider', markup)
    assert 'root.querySelector(".attnlib-note").remove();input.disabled=false;' in script
    assert 'input.onkeydown=function(e){if(/^(Arrow|Page|Home$|End$)/.test(e.key))e.stopPropagation();};' in script
    assert "function L(p)" not in script  # no line view, so no line-view renderer
    # every frame carries its setting, defaults included
    assert [f["a"] for f in unpack_slider_data(html)["f"]] == SETTINGS
    settings = [{"t": 1}, {"t": 2}]
    with_default = static_slider(lambda t, scaled=True: demo_frame(t), settings, slider_label="t", title="x", alt="y").data
    assert [f["a"] for f in unpack_slider_data(with_default)["f"]] == [{"t": 1, "scaled": True}, {"t": 2, "scaled": True}]


def test_live_slider_redraw_carries_its_setting_and_the_static_format(monkeypatch) -> None:
    from attnbook import live_slider

    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj, *a, **k: shown.append(obj))
    widget = live_slider(demo_frame, fmt="{:.0f}", t=(1, 3))
    widget.update()
    assert "attnlib-live" in widget._dom_classes
    markup = [o.data for o in shown if isinstance(getattr(o, "data", None), str)]
    assert any("window.attnlibLiveKeys" in m and "stopPropagation" in m for m in markup), "no arrow-key script"
    drawn = [m for m in markup if "attnlib-frame" in m]
    assert drawn and 'data-setting="{&quot;t&quot;: 2}"' in drawn[-1]
    assert ">0<" in drawn[-1] and "0.50" not in drawn[-1]  # fmt reaches the cells: 0.5 drawn as "0"


def test_quiz_says_run_this_cell_until_its_script_runs() -> None:
    from attnbook.quiz import quiz_html

    markup = quiz_html("Demo quiz", [CHOICE, NUMERIC])
    html_part = markup.split("<script>", 1)[0]
    assert re.search(r'<p class="aq-note"[^>]*>Run this cell to take the quiz', html_part)
    assert html_part.count("<button") == html_part.count(" disabled") - 1  # every button and the field
    assert 'root.querySelectorAll("button,input").forEach(function(e){e.disabled=false;});' in markup
    assert 'note=root.querySelector(".aq-note");if(note)note.remove();' in markup


def test_static_slider_draws_masked_cells_without_numbers() -> None:
    p = Panel(np.array([[1.0, 0.0]]), masked=np.array([[False, True]]))
    html = static_slider(lambda: Frame("one", [p]), [{}], slider_label="s", title="t", alt="a").data
    drawn = html.split("<script")[0]
    assert drawn.count('class="attnlib-masked"') == 1 and "1.00" in drawn and "0.00" not in html
    assert _slider_data(html)["f"][0]["p"][0]["i"][1] == -1


def test_heatmap_text_contrast_is_at_least_4_5_over_the_whole_colour_map() -> None:
    from attnbook.slider import contrast_ratio, palette

    def rgb(hex_colour: str) -> tuple[float, ...]:
        h = hex_colour.lstrip("#")
        h = "".join(c * 2 for c in h) if len(h) == 3 else h
        return tuple(int(h[i:i + 2], 16) / 255 for i in (0, 2, 4))

    for cmap in ("viridis", "cividis", "magma"):
        pairs = palette(cmap)
        assert len(pairs) == 256
        worst = min(contrast_ratio(rgb(bg), rgb(fg)) for bg, fg in pairs)
        assert worst >= 4.5, f"{cmap}: worst cell contrast {worst:.2f}"
    assert round(contrast_ratio(rgb("#777777"), rgb("#ffffff")), 2) == 4.48  # WCAG's own example value
    # the old rule (white below luminance 0.5) put white on mid-viridis teal: 3.4-3.9:1
    assert contrast_ratio(rgb("#21918c"), (1, 1, 1)) < 4.5 <= contrast_ratio(rgb("#21918c"), (0, 0, 0))


def test_heatmap_has_no_empty_header_cells() -> None:
    from attnbook import frame_html

    markup = frame_html(demo_frame(1)).data
    assert "<th></th>" not in markup and re.search(r"<th[^>]*>\s*</th>", markup) is None
    assert "row \\ column" in markup  # the corner cell names the axes for screen readers


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
    from attnbook.slider import _CELL_STYLE

    assert markup.startswith(_CELL_STYLE)  # the cells' shared style, once per output
    inner = markup.removeprefix(_CELL_STYLE).split(">", 1)[1].rsplit("</div>", 1)[0]
    assert inner in static_slider(lambda: frame, [{}], slider_label="T", title="t", alt="a").data


def _lines_frame(k: int) -> Frame:
    w = np.array([[0.5, 0.5, 0.0], [0.2, 0.7, 0.1], [0.005, 0.005, 0.99]]) ** k
    w = w / w.sum(axis=1, keepdims=True)
    toks = ["a", "b", "<c>"]
    return Frame(f"k = {k}", [Panel(w, toks, toks, title="one head", style="lines"),
                              Panel(w, toks, toks, title="weights", vmin=0, vmax=1)], caption=f"power {k}")


def test_line_view_panel_draws_one_line_per_visible_weight_with_a_text_alternative() -> None:
    from attnbook import frame_html

    markup = frame_html(_lines_frame(1)).data
    svg = re.search(r"<svg .*?</svg>", markup).group(0)
    assert svg.count("<line ") == 6  # 9 weights: no line for the 0 nor for the two of 0.005 (below 0.01)
    assert 'role="img"' in svg and "Strongest of each row: a to a 0.50; b to b 0.70; &lt;c&gt; to &lt;c&gt; 0.99" in svg
    assert svg.count("<text ") == 6 and "&lt;c&gt;" in svg  # labels escaped
    with pytest.raises(ValueError, match="style must be 'heatmap' or 'lines'"):
        frame_html(Frame("x", [Panel(np.eye(2), style="arrows")]))


def test_javascript_renderer_writes_the_same_markup_as_python(tmp_path) -> None:
    """Every frame the slider's script draws equals the frame Python draws (heatmap and line view)."""
    import shutil
    import subprocess

    from attnbook import slider as sl

    node = shutil.which("node")
    assert node, "Node.js is needed for this test (the Makefile and .ci/run install it)"
    settings = [{"k": k} for k in (1, 2, 3)]
    frames = [_lines_frame(**s) for s in settings]
    markup = static_slider(_lines_frame, settings, slider_label="k", title="t", alt="a").data
    (tmp_path / "data.json").write_text(json.dumps(sl.unpack_slider_data(markup)), encoding="utf-8")
    script = f"const d=JSON.parse(require('fs').readFileSync({str(tmp_path / 'data.json')!r},'utf8'));" \
             f"const render={sl._RENDER_JS};console.log(JSON.stringify(d.f.map((_,k)=>render(d,k))));"
    out = subprocess.run([node, "-e", script], capture_output=True, text=True, check=True).stdout
    pal = sl.palette("viridis")
    expected = [sl._frame_markup(sl._frame_data(f, "{:.2f}", len(pal)), pal) for f in frames]
    assert json.loads(out) == expected


# --- typed numbers in quizzes: the same rules in Python and in the widget's JavaScript -------

NUMBER_INPUTS: list[tuple[str, float | None]] = [
    ("1600", 1600), ("1,600", 1600), ("1 600", 1600), ("1\u00a0600", 1600), ("1\u202f600", 1600), ("1.6e3", 1600),
    ("1600.0", 1600), ("1,050,624", 1050624), ("1 050 624", 1050624), ("1,050,624.0", 1050624), (" 42 ", 42),
    ("-0.25", -0.25), (".5", 0.5), ("+3", 3), ("0,5", 0.5), ("3,14", 3.14), ("3/4", 0.75), ("1.6E+3", 1600),
    ("", None), ("abc", None), ("1,60", 1.6), ("1,6000", 1.6), ("1,600,60", None), ("1 60", None), ("0x10", None),
    ("1/0", None), ("1/2/3", None), ("1,600 bytes", None), ("1600,", None), ("Infinity", None), ("1e", None),
    # a leading zero makes the comma decimal (no thousands group starts with 0); a factor keeps its "x"
    ("0,881", 0.881), ("-0,5", -0.5), ("0,881,000", None), ("2x", 2), ("2 x", 2), ("1.5X", 1.5), ("2\u00d7", 2),
    ("x", None), ("2xx", None), ("x2", None), ("72 MiB", None),
]


def _same_number(got: float, expected: float | None) -> bool:
    import math

    if expected is None:
        return got is None or not math.isfinite(got)
    return got is not None and abs(got - expected) <= 1e-12 * max(1.0, abs(expected))


@pytest.mark.parametrize(("text", "expected"), NUMBER_INPUTS)
def test_quiz_parse_number_reads_separators_exponents_and_fractions(text: str, expected: float | None) -> None:
    from attnbook.quiz import parse_number

    assert _same_number(parse_number(text), expected), (text, parse_number(text))


def test_quiz_javascript_reads_numbers_as_python_does() -> None:
    import json as _json
    import shutil
    import subprocess

    from attnbook.quiz import _NUM_JS, parse_number, quiz_html

    node = shutil.which("node")
    assert node, "Node.js is needed for this test (the Makefile and .ci/run install it)"
    assert _NUM_JS in quiz_html("Demo quiz", [NUMERIC])  # the widget ships exactly this function
    texts = [t for t, _ in NUMBER_INPUTS]
    script = f"{_NUM_JS}\nconsole.log(JSON.stringify({_json.dumps(texts)}.map(function(t){{var x=num(t);return isFinite(x)?x:null;}})));"
    got = _json.loads(subprocess.run([node, "-e", script], capture_output=True, text=True, check=True).stdout)
    for text, js, (_, expected) in zip(texts, got, NUMBER_INPUTS):
        assert _same_number(js, expected), (text, js)
        py = parse_number(text)
        assert (js is None and not (py == py and abs(py) != float("inf"))) or js == py, (text, js, py)


def test_several_right_answers_are_announced_on_screen() -> None:
    from attnbook.quiz import quiz_html

    many = {**CHOICE, "type": "many_choice", "answers": [{**a, "correct": True} for a in CHOICE["answers"]]}
    markup = quiz_html("Demo quiz", [many, CHOICE])
    first, second = markup.split('data-q="1"')
    assert '<p class="aq-how">Select all that apply.</p>' in first
    assert "Select all that apply" not in second.split("<script")[0]


def _grade(question: dict, text: str) -> tuple[bool, str]:
    """The widget's numeric grading (quiz.py's gradeNumeric), in Python, on a typed answer."""
    import math

    from attnbook.quiz import parse_number

    x = parse_number(text)
    if not math.isfinite(x):
        return False, "Type a number"
    p = question.get("precision")
    r = (lambda v: float(f"{float(v):.{p}g}")) if p else (lambda v: v)
    x, fallback = r(x), "Not this one."
    for a in question["answers"]:
        if a.get("type") == "default":
            fallback = a["feedback"]
            continue
        hit = x == r(a["value"]) if "value" in a else a["range"][0] <= x < a["range"][1]
        if hit:
            return bool(a.get("correct")), a["feedback"]
    return False, fallback


@pytest.mark.parametrize(("quiz", "number", "typed", "right"), [
    ("01_attention_at_a_glance", 3, "1,600", True), ("01_attention_at_a_glance", 3, "1 600", True),
    ("01_attention_at_a_glance", 3, "1.6e3", True), ("01_attention_at_a_glance", 3, "1600.0", True),
    ("05_multi_head_attention", 2, "1,050,624", True),
    ("04_masks", 3, "21", True), ("04_masks", 3, "21.4", False),
    ("09_flash_attention_on_gpus", 3, "0.8808", True), ("09_flash_attention_on_gpus", 3, "0.5", False),
    ("09_flash_attention_on_gpus", 3, "0.881", True), ("09_flash_attention_on_gpus", 3, "0.88", True),
    ("10_kv_cache_decoding", 2, "1", True), ("10_kv_cache_decoding", 5, "512", True),
])
def test_flagged_numeric_quiz_items_grade_as_a_reader_expects(quiz: str, number: int, typed: str, right: bool) -> None:
    """Review items ch1 Q1, ch4 #23, ch5 #40, ch8 #18, ch9 #36."""
    from attnbook.quiz import load_quiz

    ok, feedback = _grade(load_quiz(quiz)[number - 1], typed)
    assert ok == right, feedback


def test_a_near_miss_is_not_misdiagnosed() -> None:
    """ch9 #36: 1.5 FLOP/byte is not 'one byte per number'; 0.5 (GiB) is named as GiB."""
    from attnbook.quiz import load_quiz

    ok, feedback = _grade(load_quiz("10_kv_cache_decoding")[1], "1.5")
    assert not ok and "one byte" not in feedback
    ok, feedback = _grade(load_quiz("10_kv_cache_decoding")[4], "0.5")
    assert not ok and "GiB" in feedback


def test_heatmap_only_renderer_writes_the_same_markup_as_python(tmp_path) -> None:
    """A slider without a line view carries the renderer without its line-view part; it draws the same."""
    import shutil
    import subprocess

    from attnbook import slider as sl

    node = shutil.which("node")
    assert node, "Node.js is needed for this test (the Makefile and .ci/run install it)"
    markup = static_slider(demo_frame, SETTINGS, slider_label="t", title="t", alt="a").data
    assert sl._HEATMAP_JS in markup and "function L(p)" not in markup and len(sl._HEATMAP_JS) < len(sl._RENDER_JS) - 800
    (tmp_path / "data.json").write_text(json.dumps(sl.unpack_slider_data(markup)), encoding="utf-8")
    script = f"const d=JSON.parse(require('fs').readFileSync({str(tmp_path / 'data.json')!r},'utf8'));" \
             f"const render={sl._HEATMAP_JS};console.log(JSON.stringify(d.f.map((_,k)=>render(d,k))));"
    out = subprocess.run([node, "-e", script], capture_output=True, text=True, check=True).stdout
    pal = sl.palette("viridis")
    assert json.loads(out) == [sl._frame_markup(sl._frame_data(demo_frame(**s), "{:.2f}", len(pal)), pal) for s in SETTINGS]
    assert "function L(p)" in static_slider(_lines_frame, [{"k": 1}], slider_label="k", title="t", alt="a").data
