"""One rule for showing a string that came from a host or a peer (a process name, a journal or
stderr line, a lock holder's name, a file's first line) on the operator's terminal: control
characters and escapes become ``?``, so no raw escape sequence reaches the terminal."""

from __future__ import annotations


def printable(text: object, limit: int = 200) -> str:
    """``text`` with every non-printable character (ESC, CR, BEL, other controls
    and the like) replaced by ``?``, cut to ``limit`` characters (``...`` marks a cut)."""
    s = "".join(c if c.isprintable() else "?" for c in str(text))
    return s if len(s) <= limit else s[: max(0, limit - 3)] + "..."
