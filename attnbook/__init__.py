"""attnbook: the machinery of the textbook *Inside Self-Attention* (not part of the library).

``attnlib`` is the attention library a reader can use anywhere; ``attnbook`` is what the book
itself needs around it:

* :mod:`attnbook.feedback`: verdicts and hints for auto-checked exercises;
* :mod:`attnbook.quiz`: the quizzes (JSON files shipped in ``attnbook/quizzes/``);
* :mod:`attnbook.slider`: live (ipywidgets) and kernel-free sliders driven by one frame function;
* :mod:`attnbook.figures`: matplotlib figures of attention weights;
* :mod:`attnbook.measure`: timers, peak memory, saved tensors, ATen op traces;
* :mod:`attnbook.toy_lm`: the tiny character-level language model and its text;
* :mod:`attnbook.examples`: the book's example sentences and toy token vectors;
* :mod:`attnbook.ch01` ... :mod:`attnbook.ch11`: each chapter's checkers, experiments and figures.

It needs IPython, ipywidgets and matplotlib (``pip install "attnlib[book]"``).
"""

from .feedback import Feedback, compare_tensors, run_reader_code
from .quiz import show_quiz
from .slider import Frame, Panel, frame_html, live_slider, redraw_ms, static_slider


def _in_ipython() -> bool:
    from IPython import get_ipython

    return get_ipython() is not None


if _in_ipython():
    # Figures drawn for a phone's column, and every inline figure's PNG carries the size of its
    # smallest text there (attnbook.figures).
    from .figures import install_png_text_size, use_book_style

    use_book_style()
    install_png_text_size()

__all__ = [
    "Feedback", "compare_tensors", "run_reader_code", "show_quiz",
    "Frame", "Panel", "frame_html", "live_slider", "redraw_ms", "static_slider",
]
