"""The quizzes as a reader meets them: options that cannot be guessed by form, maths typeset,
questions numbered per chapter, and typed answers read (units included) the same way in Python
and in the widget's JavaScript."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess

import pytest

from attnbook.quiz import QUIZ_DIR, load_quiz, quiz_html, read_answer, typeset, visible_text

QUIZZES = sorted(path.stem for path in QUIZ_DIR.glob("*.json"))

#: At most this share of the multiple-choice questions may have the right option as the uniquely longest one.
LONGEST_RIGHT_LIMIT = 0.40


def _choice_questions() -> list[tuple[str, int, dict]]:
    return [(name, n, q) for name in QUIZZES for n, q in enumerate(load_quiz(name), 1) if q["type"] in ("multiple_choice", "many_choice")]


def _longest_is_right(question: dict) -> bool:
    lengths = [len(visible_text(a["answer"])) for a in question["answers"]]
    longest = [i for i, n in enumerate(lengths) if n == max(lengths)]
    return len(longest) == 1 and bool(question["answers"][longest[0]].get("correct"))


def test_the_longest_option_is_rarely_the_right_one() -> None:
    questions = _choice_questions()
    assert len(questions) >= 50
    flagged = [f"{name} Q{n}" for name, n, q in questions if _longest_is_right(q)]
    share = len(flagged) / len(questions)
    assert share <= LONGEST_RIGHT_LIMIT, (f"the right option is the uniquely longest in {len(flagged)} of {len(questions)} "
                                          f"multiple-choice questions ({share:.0%}): {flagged}")


def test_the_right_option_is_not_much_longer_than_the_others() -> None:
    """No question gives its answer away by a right option twice as long as every wrong one."""
    for name, n, q in _choice_questions():
        right = max(len(visible_text(a["answer"])) for a in q["answers"] if a.get("correct"))
        wrong = max(len(visible_text(a["answer"])) for a in q["answers"] if not a.get("correct"))
        assert right <= 1.5 * wrong, f"{name} Q{n}: right option {right} characters, longest wrong one {wrong}"


def test_every_numeric_question_has_a_default_feedback() -> None:
    for name in QUIZZES:
        for n, q in enumerate(load_quiz(name), 1):
            if q["type"] == "numeric":
                assert any(a.get("type") == "default" for a in q["answers"]), f"{name} Q{n} has no default feedback"


ASCII_MATHS = re.compile(r"(?<![\w.])sqrt\(|\^T\b|\^\d|(?<![\w.])(?:[A-Za-z]|sum)_[A-Za-z0-9]+(?:(?=ᵀ)|\b)"
                         r"|(?<=\w) [@*.] (?=\w)| -> | >= | <= ")


@pytest.mark.parametrize("name", QUIZZES)
def test_quiz_maths_is_typeset(name: str) -> None:
    """Questions, options and feedback show maths in Unicode and <sub>/<sup>, code as <code>."""
    markup = quiz_html(name, load_quiz(name))
    data = json.loads(re.search(r'<script type="application/json">(.*?)</script>', markup).group(1))
    shown = re.sub(r"<code>.*?</code>|<script.*?</script>|<style>.*?</style>", "CODE", markup)
    shown += " ".join(re.sub(r"<code>.*?</code>", "CODE", a["feedback"]) for q in data for a in q["answers"])
    leftovers = sorted(set(m.group(0) for m in ASCII_MATHS.finditer(html_unescape(shown))))
    assert not leftovers, f"{name}: ASCII maths left in the rendered quiz: {leftovers}"


def html_unescape(text: str) -> str:
    import html

    return html.unescape(re.sub(r"<[^>]+>", "", text))


def test_typeset_maths_and_leaves_code_alone() -> None:
    assert typeset("softmax(raw / sqrt(D_k)), raw = q @ k^T") == "softmax(raw / √D<sub>k</sub>), raw = q · kᵀ"
    assert typeset("H * S^2 * D_k; S x S; T -> 0; p . g") == "H × S² × D<sub>k</sub>; S × S; T → 0; p · g"
    assert typeset("attnlib.causal_mask(2, S_k=6) with is_causal=True") == \
        "<code>attnlib.causal_mask(2, S_k=6)</code> with <code>is_causal=True</code>"
    assert typeset("hidden_states, key_padding_mask, e.g. W^Q") == "hidden_states, key_padding_mask, e.g. W<sup>Q</sup>"
    assert typeset("<b>1 < 2</b>") == "&lt;b&gt;1 &lt; 2&lt;/b&gt;"  # escaped: quiz text is never HTML
    assert typeset("a top-left mask (is_causal=True)") == "a top-left mask (<code>is_causal=True</code>)"
    assert typeset("x.view(B, S, H, D_k) or dims=(0, 1))") == "<code>x.view(B, S, H, D_k)</code> or <code>dims=(0, 1)</code>)"


def test_questions_are_numbered_per_chapter() -> None:
    markup = quiz_html("03_scaling_and_temperature", load_quiz("03_scaling_and_temperature"))
    numbers = re.findall(r'class="aq-text"[^>]*>(Question [\d.]+)\. ', markup)
    assert numbers == [f"Question 3.{n}" for n in range(1, len(numbers) + 1)] and len(numbers) >= 5
    assert "Question 1 of 1. " in quiz_html("demo", [load_quiz("03_scaling_and_temperature")[0]])


# ---- typed answers with units and factors: Python and the widget's JavaScript agree ----------

ANSWERS: list[tuple[str, str, float | None, str | None]] = [
    # (question text, typed, number read, words the message must contain)
    ("How many MiB does the cache take?", "72 MiB", 72, None),
    ("How many MiB does the cache take?", "72MiB", 72, None),
    ("How many MiB does the cache take?", "72 MB", None, "\u201cMB\u201d"),
    ("How many MiB does the cache take?", "72 mib", None, "without"),
    ("What share, in %, is wasted?", "31.7 %", 31.7, None),
    ("What fraction is wasted?", "31.7%", None, "\u201c%\u201d"),
    ("How many times does it shrink?", "2x", 2, None),
    ("How many times does it shrink?", "2 \u00d7", 2, None),
    ("How many bytes?", "1,600 bytes", 1600, None),
    ("How many bytes?", "0,881", 0.881, None),
    ("How many bytes?", "abc", None, "Type a number"),
    ("How many bytes?", "", None, "Type a number"),
]


@pytest.mark.parametrize(("question", "typed", "number", "words"), ANSWERS)
def test_read_answer_reads_units_the_question_names(question: str, typed: str, number: float | None, words: str | None) -> None:
    x, message = read_answer({"question": question}, typed)
    if number is None:
        assert not math.isfinite(x) and message and words in message, (typed, x, message)
    else:
        assert math.isclose(x, number) and message is None, (typed, x, message)


def test_read_answer_is_the_same_in_javascript() -> None:
    from attnbook.quiz import _NUM_JS

    node = shutil.which("node")
    assert node, "Node.js is needed for this test (the Makefile and .ci/run install it)"
    assert _NUM_JS in quiz_html("demo", [load_quiz("09_flash_attention_on_gpus")[4]])
    cases = [[q, typed] for q, typed, _, _ in ANSWERS]
    script = f"{_NUM_JS}\nconsole.log(JSON.stringify({json.dumps(cases)}.map(function(c){{" \
             f"var r=readAns({{question:c[0]}},c[1]);return [isFinite(r[0])?r[0]:null,r[1]];}})));"
    got = json.loads(subprocess.run([node, "-e", script], capture_output=True, text=True, check=True).stdout)
    for (question, typed, _, _), (js_x, js_message) in zip(ANSWERS, got):
        py_x, py_message = read_answer({"question": question}, typed)
        assert (js_x is None and not math.isfinite(py_x)) or js_x == py_x, (typed, js_x, py_x)
        assert js_message == py_message, (typed, js_message, py_message)


def test_a_factor_typed_with_its_x_is_graded() -> None:
    """Chapter 8's question on K/V traffic asks "how many times": "2x" is the right answer, "4x" is not."""
    question = load_quiz("09_flash_attention_on_gpus")[4]
    assert "how many times" in question["question"]
    right = [a for a in question["answers"] if a.get("correct")][0]
    for typed, ok in (("2x", True), ("2 \u00d7", True), ("4x", False)):
        x, message = read_answer(question, typed)
        assert message is None and (x == right["value"]) == ok, typed


@pytest.mark.parametrize("name", sorted(p.stem for p in QUIZ_DIR.glob("*.json")))
def test_the_right_answer_does_not_sit_in_one_place(name: str) -> None:
    """A reader cannot learn where the right option shows: in no quiz does the one right answer of
    its multiple-choice questions show in the same position in more than half of them."""
    import re
    from collections import Counter

    questions = load_quiz(name)
    markup = quiz_html(name, questions)
    blocks = re.findall(r'<div class="aq-q".*?</div></div>', markup)
    assert len(blocks) == len(questions)
    shown = Counter()
    for block, q in zip(blocks, questions):
        right = [i for i, a in enumerate(q["answers"]) if a.get("correct")]
        if q["type"] != "multiple_choice" or len(right) != 1:
            continue
        shown[re.findall(r'data-a="(\d+)"', block).index(str(right[0]))] += 1
    total = sum(shown.values())
    if total >= 2:
        assert max(shown.values()) <= total / 2, f"{name}: right answer shown at positions {dict(shown)}"


def test_a_transposed_factor_is_typeset() -> None:
    assert visible_text("x_i M (x_j)^T with M = W^Q (W^K)^T") == "xi M (xj)ᵀ with M = WQ (WK)ᵀ"
    assert typeset("Q_h K_h^T") == "Q<sub>h</sub> K<sub>h</sub>ᵀ"  # a subscript before a transpose


def test_a_sum_index_is_typeset() -> None:
    assert typeset("sum_j w_ij f(x_j)") == "Σ<sub>j</sub> w<sub>ij</sub> f(x<sub>j</sub>)"


def test_stored_quiz_outputs_match_their_json() -> None:
    """The website shows a quiz's stored output: it must be what its cell displays now."""
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root / "tools"))
    import refresh_quizzes

    stale = {p.name: s for p in sorted((root / "book").glob("[0-9][0-9]_*.ipynb"))
             if (s := refresh_quizzes.stale_quizzes(p, write=False))}
    assert not stale, f"stored quiz outputs differ from their JSON: {stale}; run tools/refresh_quizzes.py"
