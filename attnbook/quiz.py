"""Quizzes: questions live as JSON files in ``attnbook/quizzes/``; ``jupyterquiz`` renders them.

The rendered quiz is plain HTML + JavaScript with everything inlined, so it works in JupyterLab,
in Colab and on the static website with no network. Element ids are derived from the quiz name
(not random), so a notebook's stored output is the same on every run.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

__all__ = ["QUIZ_DIR", "quiz_dir", "load_quiz", "show_quiz", "validate_quiz"]

#: The quiz files ship inside this package: ``attnbook/quizzes/NN_slug.json``.
QUIZ_DIR = Path(__file__).resolve().parent / "quizzes"


def quiz_dir() -> Path:
    """The folder of the quiz files, inside the installed package (independent of the working directory)."""
    return QUIZ_DIR


def validate_quiz(questions: Any, name: str = "quiz") -> list[dict[str, Any]]:
    """Check a quiz's structure: every question has text, answers and feedback for each answer.

    Raises:
        ValueError: naming the question and what is missing.
    """
    if not isinstance(questions, list) or not questions:
        raise ValueError(f"{name}: expected a non-empty list of questions, got {type(questions).__name__}")
    for i, q in enumerate(questions, 1):
        where = f"{name} question {i}"
        if not isinstance(q, dict) or not q.get("question"):
            raise ValueError(f"{where}: needs a 'question' text")
        kind = q.get("type")
        if kind not in ("multiple_choice", "many_choice", "numeric"):
            raise ValueError(f"{where}: type must be multiple_choice, many_choice or numeric, got {kind!r}")
        if "precision" in q and (isinstance(q["precision"], bool) or not isinstance(q["precision"], int) or q["precision"] < 1):
            raise ValueError(
                f"{where}: precision is a number of significant digits >= 1 (JavaScript toPrecision), "
                f"got {q['precision']!r}; leave it out to compare exact values"
            )
        answers = q.get("answers")
        if not isinstance(answers, list) or not answers:
            raise ValueError(f"{where}: needs a non-empty 'answers' list")
        if not any(a.get("correct") for a in answers):
            raise ValueError(f"{where}: no answer is marked correct")
        for j, a in enumerate(answers, 1):
            if not a.get("feedback"):
                raise ValueError(f"{where}, answer {j}: every answer needs 'feedback' that explains why")
    return questions


def load_quiz(name: str) -> list[dict[str, Any]]:
    """Read and validate ``quizzes/<name>.json``."""
    path = quiz_dir() / f"{name}.json"
    if not path.is_file():
        raise FileNotFoundError(f"quiz {name!r} not found at {path}")
    return validate_quiz(json.loads(path.read_text(encoding="utf-8")), name)


def show_quiz(name: str, **options: Any) -> None:
    """Display quiz ``name`` (``quizzes/<name>.json``) with jupyterquiz.

    Extra keyword arguments go to ``jupyterquiz.display_quiz``. Answers are shuffled in the
    browser, so the stored notebook output does not depend on Python's random state.
    """
    from jupyterquiz import display_quiz

    questions = load_quiz(name)
    state = random.getstate()
    random.seed(f"attnlib-quiz-{name}")  # jupyterquiz draws its element id from `random`
    try:
        display_quiz(questions, **{"colors": "fdsp", **options})
    finally:
        random.setstate(state)
