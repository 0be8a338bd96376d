""""Did you mean": the known name closest to a mistyped one, for every message that refuses a
name (a stage or model name, a choice, a command, a pipeline key)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def close_match(word: str, known: Iterable[str]) -> str | None:
    """The name of ``known`` closest to ``word`` (difflib's similarity ratio at least 0.6), else
    the only one that starts with it (``acc``: ``accuracy``), or None."""
    known = [str(k) for k in known]
    found = difflib.get_close_matches(str(word), known, n=1)
    if found:
        return found[0]
    starting = [k for k in known if word and k.startswith(str(word))]
    return starting[0] if len(starting) == 1 else None


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """``"did you mean 'grid'?"`` for the closest name of ``known`` to ``word``, or ``""``."""
    match = close_match(word, known)
    return f"did you mean {match!r}?" if match else ""
