"""Text from a submission made inert for every reader: the terminal, Markdown, CSV and Gradescope.

A submission names its folder, raises exceptions with messages of its own
and prints what it likes; all of it reaches reports that people read and
spreadsheets that evaluate cells. :func:`clean` is the one function every
renderer passes such text through:

* control characters (Unicode category Cc) and line or paragraph separators
  (Zl, Zp, U+2028/9) become a space, so the text stays on one line;
* format characters (Cf: bidi overrides and isolates, zero-width spaces and
  joiners, the byte-order mark, soft hyphens, tag characters) are removed, so
  nothing can display in another order than it is stored;
* text past the limit is cut by :func:`shorten`, at a whole word, with an
  ellipsis, never leaving a bracket open.

Each output then adds what its own format needs: :func:`md` escapes Markdown
and puts anything GitHub's autolink extension would link (``https://``,
``www.``, an ``@`` address) in a code span; :func:`csv_cell` keeps a cell
from starting a spreadsheet formula (OWASP's CSV-injection advice: a leading
``=``, ``+``, ``-``, ``@``, tab or carriage return gets a single quote first).
"""
from __future__ import annotations

import re
import unicodedata

ELLIPSIS = " ..."
_OPENERS = {"(": ")", "[": "]", "{": "}"}
_CLOSERS = {v: k for k, v in _OPENERS.items()}
_NOT_PLAIN = re.compile(r"[^\x20-\x7e]+")  # only these can be of the categories removed
_BREAKS = frozenset({"Cc", "Zl", "Zp"})
_FORMAT = "Cf"
_MARKDOWN = re.compile(r"([\\`*_\[\]<>|#&~$])")  # what could open a link, code, emphasis, HTML, a cell or math
_LINE_START = re.compile(r"^(\d*)([-+=.)])")  # a list item, a setext underline, an ordered item
_LINKABLE = re.compile(r"://|www\.|@", re.IGNORECASE)  # what GFM's autolink extension starts a link from
_FORMULA = tuple("=+-@\t\r") + ("\uff1d", "\uff0b", "\uff0d", "\uff20")  # and their full-width forms


def _inert_run(match: re.Match) -> str:
    out, spaced = [], False
    for ch in match.group():
        category = unicodedata.category(ch)
        if category in _BREAKS:
            if not spaced:
                out.append(" ")
            spaced = True
        elif category != _FORMAT:
            out.append(ch)
            spaced = False
    return "".join(out)


def strip(text) -> str:
    """``text`` (any value: ``str()`` of it) without format characters, each run of control characters
    and line or paragraph separators one space. Nothing is cut."""
    return _NOT_PLAIN.sub(_inert_run, str(text))


def clean(text, limit: int = 2000) -> str:
    """``text`` as one inert line of at most ``limit`` characters: :func:`strip`, then :func:`shorten`."""
    return shorten(strip(text), limit)


def _open_brackets(text: str) -> list[int]:
    """Positions of the brackets ``text`` opens and does not close, outermost first."""
    stack: list[int] = []
    for i, ch in enumerate(text):
        if ch in _OPENERS:
            stack.append(i)
        elif ch in _CLOSERS and stack and text[stack[-1]] == _CLOSERS[ch]:
            stack.pop()
    return stack


def _closers(text: str) -> str:
    return "".join(_OPENERS[text[i]] for i in reversed(_open_brackets(text)))


def _cut_at_word(text: str, room: int) -> str:
    """The longest run of whole words of ``text`` within ``room`` characters (a word longer than the
    room is cut, there being no whole one), without trailing separators."""
    if room <= 0:
        return ""
    head = text[:room + 1]
    cut = head.rfind(" ")
    head = head[:cut] if cut > 0 else text[:room]
    return head.rstrip(" ,;:")


def shorten(text: str, limit: int) -> str:
    """``text`` itself when it has at most ``limit`` characters; else cut at a whole word or record with
    an ellipsis, never leaving a bracket open that the kept text opened.

    The cut is made before the outermost bracket left open when that keeps a third of ``limit`` or
    more; otherwise the brackets are closed after the ellipsis (``... (NotImplementedError: a ...)``).
    """
    text = str(text)
    if len(text) <= limit:
        return text
    head = _cut_at_word(text, limit - len(ELLIPSIS))
    opened = _open_brackets(head)
    if opened:
        before = head[:opened[0]]
        if not before.endswith(" "):  # the bracket opens inside a word: keep none of that word
            before = before[:max(before.rfind(" "), 0)]
        before = before.rstrip(" ,;:")
        if len(before) >= limit // 3:
            head = before
    while head:
        closing = _closers(head)
        if len(head) + len(ELLIPSIS) + len(closing) <= limit:
            return head + ELLIPSIS + closing
        head = _cut_at_word(head, len(head) - 1)
    return ELLIPSIS.strip()[:limit]


def join(parts: list[str], limit: int, sep: str = "; ") -> str:
    """Whole ``parts`` joined by ``sep`` while they fit in ``limit`` characters, then ``and N more``:
    a list is cut between its records, never inside one (a first part longer than ``limit`` alone is
    shortened)."""
    kept: list[str] = []
    for i, part in enumerate(parts):
        more = len(parts) - i - 1
        tail = f"{sep}and {more} more" if more else ""
        candidate = sep.join(kept + [part])
        if len(candidate) + len(tail) <= limit:
            kept.append(part)
            continue
        if not kept:
            return shorten(part, max(limit - len(tail), 0)) + tail
        return sep.join(kept) + f"{sep}and {len(parts) - len(kept)} more"
    return sep.join(kept)


def _code_span(token: str) -> str:
    """``token`` as a Markdown code span (never linked, never formatted); ``|`` escaped for table cells."""
    fence = "`" * (max((len(run) for run in re.findall(r"`+", token)), default=0) + 1)
    pad = " " if token.startswith("`") or token.endswith("`") else ""
    return f"{fence}{pad}{token.replace('|', chr(92) + '|')}{pad}{fence}"


def md(text, limit: int = 2000) -> str:
    """``text`` cleaned for Markdown: no table cell, heading, emphasis, HTML or link can be forged from it.

    Markdown's punctuation is escaped; a word that GitHub's autolink extension would turn into a link
    (a URL, a ``www.`` name, an address with ``@``) is put in a code span instead.
    """
    words = re.split(r"( +)", clean(text, limit))
    out = "".join(_code_span(w) if _LINKABLE.search(w) else _MARKDOWN.sub(r"\\\1", w) for w in words)
    return _LINE_START.sub(r"\1\\\2", out, count=1)


def csv_cell(value, limit: int = 2000):
    """A CSV cell: a number as it is; any other value cleaned, with a single quote before a leading
    ``=``, ``+``, ``-``, ``@``, tab or carriage return (or white space before one), so that no spreadsheet
    reads it as a formula."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    text = clean("" if value is None else value, limit)
    return "'" + text if text.lstrip().startswith(_FORMULA) else text
