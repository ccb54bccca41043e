"""The reader's learning tools: quizzes, exercise feedback, sliders and figures."""

from .check import Feedback, compare_tensors, run_reader_code
from .plots import attention_heatmap, bar_weights, heads_grid, to_numpy
from .quiz import load_quiz, show_quiz, validate_quiz
from .slider import Frame, Panel, frame_html, live_slider, redraw_ms, static_slider

__all__ = [
    "Feedback", "compare_tensors", "run_reader_code",
    "attention_heatmap", "bar_weights", "heads_grid", "to_numpy",
    "load_quiz", "show_quiz", "validate_quiz",
    "Frame", "Panel", "frame_html", "live_slider", "redraw_ms", "static_slider",
]
