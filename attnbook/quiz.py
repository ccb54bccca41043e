"""Quizzes: questions live as JSON files in ``attnbook/quizzes/`` (jupyterquiz's format); the
book draws them with its own small widget, :func:`quiz_html`.

The rendered quiz is plain HTML + CSS + JavaScript with everything inlined, so it works in
JupyterLab, in Colab and on the static website with no network. It is built to be usable by
keyboard and screen reader: answers are buttons or labelled fields, nothing is graded until the
reader clicks or presses Enter (arrow keys never answer), and feedback is read out from an
``aria-live`` region. Element ids come from the quiz name (not random), so a notebook's stored
output is the same on every run.
"""

from __future__ import annotations

import html
import json
import math
import random
from collections import Counter
import re
from pathlib import Path
from typing import Any

__all__ = ["QUIZ_DIR", "quiz_dir", "load_quiz", "quiz_html", "show_quiz", "validate_quiz", "parse_number", "split_unit", "read_answer",
           "typeset", "visible_text", "choice_hint"]

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
            if kind != "numeric" and not a.get("answer"):
                raise ValueError(f"{where}, answer {j}: a choice needs an 'answer' text")
            if kind == "numeric" and not ("value" in a or a.get("type") == "default"
                                          or (isinstance(a.get("range"), list) and len(a["range"]) == 2)):
                raise ValueError(f"{where}, answer {j}: a numeric answer needs a 'value', a 'range' [low, high] or type 'default'")
    return questions


def load_quiz(name: str) -> list[dict[str, Any]]:
    """Read and validate ``quizzes/<name>.json``."""
    path = quiz_dir() / f"{name}.json"
    if not path.is_file():
        raise FileNotFoundError(f"quiz {name!r} not found at {path}")
    return validate_quiz(json.loads(path.read_text(encoding="utf-8")), name)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "quiz"


# ---- reading a typed number (the same rules in Python and in the widget's JavaScript) ----------
#
# A typed answer is read as a number when it is a plain decimal ("1600", "-0.25", ".5", "1600.0"),
# scientific notation ("1.6e3"), a fraction ("3/4"), a number with thousands separators in groups of
# three ("1,600", "1,050,624", "1 600", also with a no-break or thin space), or a decimal comma
# ("0,5", "3,14", and "0,881": a comma not followed by groups of exactly three digits, or after a
# leading 0, which no thousands group starts with). A factor typed with its "x" ("2x", "2 x", "2×")
# is that number. Anything else is not a number; a number followed by a unit ("72 MiB", "88 %") is
# split off by :func:`split_unit`, so the widget can read it when the question asks in that unit and
# say so when it does not. tests/test_attnbook.py runs both implementations on the same table of inputs.

_DECIMAL = r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?"
_GROUPED = re.compile(r"^[+-]?(?!0)\d{1,3}([,\u00a0\u202f\u2009 ])\d{3}(?:\1\d{3})*(?:\.\d+)?$")
_FACTOR = re.compile(r"\s*[x\u00d7]$", re.IGNORECASE)
_DECIMAL_COMMA = re.compile(r"^[+-]?\d*,\d+$")


def parse_number(text: object) -> float:
    """A typed quiz answer as a number (``nan`` when it is not one), by the rules above."""
    s = _FACTOR.sub("", str(text).strip(), count=1)
    grouped = _GROUPED.match(s)
    if grouped:
        s = s.replace(grouped.group(1), "")
    elif _DECIMAL_COMMA.match(s):
        s = s.replace(",", ".")
    if s.find("/") > 0:
        parts = s.split("/")
        if len(parts) != 2 or not all(re.fullmatch(_DECIMAL, p.strip()) for p in parts):
            return float("nan")
        num, den = float(parts[0]), float(parts[1])
        if den == 0:  # as in JavaScript: a/0 is infinite, 0/0 is NaN; neither is an answer
            return float("nan") if num == 0 else math.copysign(math.inf, num)
        return num / den
    return float(s) if re.fullmatch(_DECIMAL, s) else float("nan")


_UNIT = re.compile(r"^(.*?\d\.?)\s*([A-Za-z%\u00b5][A-Za-z%\u00b5/]*)$")


def split_unit(text: object) -> tuple[float, str] | None:
    """``(number, unit)`` for a number typed with a unit ("72 MiB", "88%", "1,600 bytes"), else ``None``."""
    m = _UNIT.match(str(text).strip())
    if not m:
        return None
    x = parse_number(m.group(1))
    return (x, m.group(2)) if math.isfinite(x) else None


def read_answer(question: dict[str, Any], text: object) -> tuple[float, str | None]:
    """What the widget makes of a typed answer: ``(number, None)``, or ``(nan, message)`` that says why not.

    A number with a unit is read when the question's text names that unit ("72 MiB" for a question
    in MiB); with any other unit, the message names the unit and asks for the number alone.
    """
    x = parse_number(text)
    if math.isfinite(x):
        return x, None
    unit = split_unit(text)
    if unit is None:
        return math.nan, "Type a number, then press Enter or Check."
    if re.search(r"(?<![A-Za-z])" + re.escape(unit[1]) + r"(?![A-Za-z])", str(question.get("question", ""))):
        return unit[0], None
    return math.nan, f"Type the number alone, without \u201c{unit[1]}\u201d: the question says which unit it counts in."


# The same function in the widget's JavaScript (Number() alone would read "0x10" and "" too).
_NUM_JS = r"""function num(s){s=String(s).trim().replace(/\s*[x\u00d7]$/i,"");var D=/^[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?$/;
 var g=/^[+-]?(?!0)\d{1,3}([,\u00a0\u202f\u2009 ])\d{3}(?:\1\d{3})*(?:\.\d+)?$/.exec(s);
 if(g)s=s.split(g[1]).join("");else if(/^[+-]?\d*,\d+$/.test(s))s=s.replace(",",".");
 if(s.indexOf("/")>0){var p=s.split("/");if(p.length!==2||!D.test(p[0].trim())||!D.test(p[1].trim()))return NaN;
  return Number(p[0])/Number(p[1]);}
 return D.test(s)?Number(s):NaN;}
function readAns(q,s){var x=num(s);if(isFinite(x))return[x,null];
 var m=/^(.*?\d\.?)\s*([A-Za-z%\u00b5][A-Za-z%\u00b5\/]*)$/.exec(String(s).trim()),u=m?num(m[1]):NaN;
 if(!isFinite(u))return[NaN,"Type a number, then press Enter or Check."];
 var esc=m[2].replace(/[.*+?^${}()|[\]\\\/]/g,"\\$&");
 if(new RegExp("(?<![A-Za-z])"+esc+"(?![A-Za-z])").test(String(q.question||"")))return[u,null];
 return[NaN,"Type the number alone, without \u201c"+m[2]+"\u201d: the question says which unit it counts in."];}"""


# ---- maths in quiz text ------------------------------------------------------------------------
#
# Quiz files are written in plain text ("sqrt(D_k)", "q @ k^T", "S x S"). The widget shows them
# typeset with Unicode and <sub>/<sup>, which every browser draws without a maths renderer (the
# website, JupyterLab and Colab alike): "√D<sub>k</sub>", "q · kᵀ", "S × S". Code is left alone:
# a dotted name with its arguments ("attnlib.causal_mask(2, S_k=6)", "x.view(B, S, H, D_k)") or a
# keyword argument ("is_causal=True") is shown as <code>.

_CODE = re.compile(r"(?<![\w.])(?:[A-Za-z_]\w* @ )?(?:[A-Za-z_]\w*\.)+[A-Za-z_]\w*(?:\((?:[^()]|\([^()]*\))*\))?"
                   r"|(?<![\w.])[A-Za-z_]\w*=(?:[\w.\[\]]|\([^()]*\))+")  # a value's parentheses balance
_SUP = str.maketrans("0123456789+-()", "⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻⁽⁾")
_MATH = [
    (re.compile(r"(?<![\w.])sqrt\(([A-Za-z0-9]+(?:_[A-Za-z0-9]+)?)\)"), r"√\1"),
    (re.compile(r"(?<![\w.])sqrt\("), "√("),
    (re.compile(r"\^T\b"), "ᵀ"),
    (re.compile(r"\^(\d+)"), lambda m: m.group(1).translate(_SUP)),
    (re.compile(r"\^\(([^()]*)\)"), r"<sup>(\1)</sup>"),
    (re.compile(r"\^([A-Za-z])\b"), r"<sup>\1</sup>"),
    (re.compile(r"(?<![\w.])sum_([A-Za-z])\b"), r"Σ<sub>\1</sub>"),
    (re.compile(r"(?<![\w.])(lse|[A-Za-z])_([A-Za-z0-9]{1,3})(?:(?=ᵀ)|\b)(?![=(])"), r"\1<sub>\2</sub>"),
    (re.compile(r"(?<=[\w)\]>]) @ (?=[\w(\[])"), " · "),
    (re.compile(r"(?<=[\w)\]>]) \. (?=[\w(\[])"), " · "),
    (re.compile(r"(?<=[\w)\]>]) \* (?=[\w(\[])"), " × "),
    (re.compile(r"(?<=[0-9A-Z)\]>]) x (?=[0-9A-Z(\[])"), " × "),
    (re.compile(r"(?<=\d)x(?=\s|$|[,.;)])"), "×"),
    (re.compile(r" -&gt; "), " → "),
    (re.compile(r" &gt;= "), " ≥ "),
    (re.compile(r" &lt;= "), " ≤ "),
    (re.compile(r"(?<=[\w)\]>]) - (?=[\w(\[])"), " − "),
]


def _typeset_math(text: str) -> str:
    out = html.escape(text, quote=False)
    for pattern, repl in _MATH:
        out = pattern.sub(repl, out)
    return out


def typeset(text: str) -> str:
    """Quiz text as safe HTML with its maths typeset in Unicode and <sub>/<sup> (see above)."""
    parts, last = [], 0
    for m in _CODE.finditer(text):
        parts.append(_typeset_math(text[last:m.start()]))
        code = m.group(0)
        plain = all(len(piece) == 1 for piece in code.split("."))  # "e.g" is prose, not code
        parts.append(html.escape(code, quote=False) if plain else f"<code>{html.escape(code, quote=False)}</code>")
        last = m.end()
    parts.append(_typeset_math(text[last:]))
    return "".join(parts)


def visible_text(text: str) -> str:
    """What a reader sees of quiz text once typeset (tags removed, entities read)."""
    return html.unescape(re.sub(r"<[^>]+>", "", typeset(text)))


def choice_hint(kind: str) -> str:
    """What a choice question asks for, shown on screen and given to screen readers."""
    return "Select all that apply." if kind == "many_choice" else "Choose one answer."


# Styles use the surrounding text colour (currentColor), so the quiz reads in light and dark
# themes alike (the website, JupyterLab, Colab); verdicts are words, not only colours.
_CSS = """
.attnbook-quiz{margin:1em 0}
.attnbook-quiz .aq-q{margin:0 0 1.2em;padding:.6em .8em;border:1px solid;border-color:rgba(127,127,127,.6);border-radius:6px}
.attnbook-quiz .aq-text{font-weight:bold;margin:0 0 .5em}
.attnbook-quiz .aq-opts{display:flex;flex-direction:column;gap:.4em}
.attnbook-quiz button{font:inherit;color:inherit;background:transparent;text-align:left;cursor:pointer;
 border:1px solid currentColor;border-radius:4px;padding:.35em .6em;max-width:100%;overflow-wrap:anywhere}
.attnbook-quiz input{font:inherit;color:inherit;background:transparent;border:1px solid currentColor;border-radius:4px;padding:.25em .4em;width:9em}
.attnbook-quiz button:focus-visible,.attnbook-quiz input:focus-visible{outline:3px solid currentColor;outline-offset:2px}
.attnbook-quiz button:hover{border-width:2px;padding:calc(.35em - 1px) calc(.6em - 1px)}
.attnbook-quiz .aq-right{border-left:6px solid #1a7f37}
.attnbook-quiz .aq-wrong{border-left:6px solid #cf222e}
.attnbook-quiz .aq-fb:empty{display:none}
.attnbook-quiz .aq-fb{margin-top:.5em;padding:.35em .6em}
"""

# One handler per quiz box. Where it runs, it removes the note for notebooks that have not been
# run and enables the answers, which the markup leaves disabled (JupyterLab shows a notebook that
# has not been run without its scripts, and the answers would look alive but do nothing).
# Multiple choice: a click (or Enter/Space on the focused button)
# grades that answer; arrow keys do nothing. Numeric: Enter in the field or the Check button
# grades what was typed (an empty or unreadable field is not graded: it only says what to type) (a fraction a/b is accepted, and a unit the question names; with `precision`,
# both sides are rounded to that many significant digits, as jupyterquiz does). Feedback goes to an
# aria-live region; it is HTML written by :func:`typeset` (escaped, maths in Unicode and <sub>/<sup>).
_JS = """(function(){
var root=document.getElementById(%(uid)s);if(!root)return;
var note=root.querySelector(".aq-note");if(note)note.remove();
root.querySelectorAll("button,input").forEach(function(e){e.disabled=false;});
var data=JSON.parse(root.querySelector("script[type='application/json']").textContent);
function say(q,ok,html,extra){var fb=q.querySelector(".aq-fb");
 fb.className="aq-fb "+(ok===null?"aq-ask":ok?"aq-right":"aq-wrong");fb.textContent="";
 var b=document.createElement("strong");b.textContent=ok===null?"":ok?"Correct. ":"Not quite. ";
 var t=document.createElement("span");t.innerHTML=html;
 fb.appendChild(b);fb.appendChild(t);fb.appendChild(document.createTextNode(extra||""));
 if(window.MathJax&&MathJax.typesetPromise)MathJax.typesetPromise([fb]).catch(function(){});}
%(num)s
function gradeNumeric(q,d){var rd=readAns(d,q.querySelector("input").value),x=rd[0];
 if(!isFinite(x)){say(q,null,rd[1]);return;}
 var p=d.precision,r=function(v){return p?Number(Number(v).toPrecision(p)):v;},fallback="Not this one. Try again.";
 x=r(x);for(var i=0;i<d.answers.length;i++){var a=d.answers[i];
  if(a.type==="default"){fallback=a.feedback;continue;}
  var hit="value" in a?x===r(a.value):("range" in a&&x>=a.range[0]&&x<a.range[1]);
  if(hit){say(q,!!a.correct,a.feedback);return;}}
 say(q,false,fallback);}
root.querySelectorAll(".aq-q").forEach(function(q){var d=data[Number(q.dataset.q)];
 if(d.type==="numeric"){var inp=q.querySelector("input");
  inp.addEventListener("keydown",function(e){if(e.key==="Enter"){e.preventDefault();gradeNumeric(q,d);}});
  q.querySelector(".aq-check").addEventListener("click",function(){gradeNumeric(q,d);});return;}
 var total=d.answers.filter(function(a){return a.correct;}).length;
 q.querySelectorAll(".aq-opts button").forEach(function(btn){btn.addEventListener("click",function(){
  var a=d.answers[Number(btn.dataset.a)];
  if(d.type==="multiple_choice")q.querySelectorAll(".aq-opts button").forEach(function(o){o.setAttribute("aria-pressed","false");o.classList.remove("aq-right","aq-wrong");});
  btn.setAttribute("aria-pressed","true");btn.classList.add(a.correct?"aq-right":"aq-wrong");
  var found=q.querySelectorAll(".aq-opts button.aq-right").length;
  say(q,!!a.correct,a.feedback,d.type==="many_choice"?" ("+found+" of "+total+" correct answers found.)":"");});});});
})();"""


#: What the quiz says where its script has not run (removed by the script).
_NOTE = "Run this cell to take the quiz."


def quiz_html(name: str, questions: list[dict[str, Any]]) -> str:
    """The quiz as one self-contained block of HTML, CSS and JavaScript (no network, no kernel).

    Element ids derive from ``name`` and the answers' order from ``name`` and the question's
    number, so the output is the same on every run. Multiple-choice answers are buttons (Tab to
    reach, Enter, Space or a click to answer); a numeric answer is a labelled text field.
    """
    uid = f"attnbook-quiz-{_slug(name)}"
    chapter = re.match(r"(\d+)_", name)
    parts, data = [], []
    used: Counter[int] = Counter()  # where the right answer has been shown so far
    for n, q in enumerate(questions, 1):
        qid = f"{uid}-q{n}"
        number = f"Question {int(chapter.group(1))}.{n}" if chapter else f"Question {n} of {len(questions)}"
        head = f'<p class="aq-text" id="{qid}-text">{number}. {typeset(q["question"])}</p>'
        if q["type"] == "numeric":
            body = (f'<label for="{qid}-input">Your answer:</label> '
                    f'<input id="{qid}-input" type="text" inputmode="decimal" autocomplete="off" aria-describedby="{qid}-text" disabled> '
                    f'<button type="button" class="aq-check" disabled>Check</button>')
            data.append({"type": "numeric", "precision": q.get("precision"), "question": q["question"],
                         "answers": [{**a, "feedback": typeset(a["feedback"])} for a in q["answers"]]})
        else:
            order = list(range(len(q["answers"])))
            rng = random.Random(f"{name}-{n}")
            rng.shuffle(order)
            right = [i for i, a in enumerate(q["answers"]) if a.get("correct")]
            if len(right) == 1:  # show the one right answer where it has been shown least in this quiz
                fewest = min(used[p] for p in range(len(order)))
                free = [p for p in range(len(order)) if used[p] == fewest]
                target, at = free[rng.randrange(len(free))], order.index(right[0])
                order[at], order[target] = order[target], order[at]
                used[target] += 1
            hint = choice_hint(q["type"])
            buttons = "".join(f'<button type="button" aria-pressed="false" disabled data-a="{i}">{typeset(q["answers"][i]["answer"])}</button>'
                              for i in order)
            shown = f'<p class="aq-how">{hint}</p>' if q["type"] == "many_choice" else ""
            body = f'{shown}<div class="aq-opts" role="group" aria-label="{hint}">{buttons}</div>'
            data.append({"type": q["type"], "answers": [{"correct": bool(a.get("correct")), "feedback": typeset(a["feedback"])} for a in q["answers"]]})
        parts.append(f'<div class="aq-q" data-q="{n - 1}" role="group" aria-labelledby="{qid}-text">{head}{body}'
                     f'<div class="aq-fb" id="{qid}-fb" aria-live="polite"></div></div>')
    payload = json.dumps(data, separators=(",", ":"), ensure_ascii=False).replace("<", "\\u003c")
    script = _JS % {"uid": json.dumps(uid), "num": _NUM_JS}
    return (f'<div class="attnbook-quiz" id="{uid}"><style>{" ".join(_CSS.split())}</style>'
            f'<p class="aq-note" style="font-style:italic">{_NOTE}</p>{"".join(parts)}'
            f'<script type="application/json">{payload}</script><script>{script}</script></div>')


def show_quiz(name: str) -> None:
    """Display quiz ``name`` (``quizzes/<name>.json``) in the notebook or on the page.

    The quiz is inline HTML and JavaScript (:func:`quiz_html`), so it works in JupyterLab, in
    Colab and on the static website with no network, and its stored output is the same on every run.
    """
    from IPython.display import HTML, display

    display(HTML(quiz_html(name, load_quiz(name))))
