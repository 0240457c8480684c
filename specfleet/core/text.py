"""One rule for showing a string that came from a host or a peer (a process name, a journal or
stderr line, a lock holder's name, a file's first line) on the operator's terminal: control
characters and escapes become ``?``, so no raw escape sequence reaches the terminal."""

from __future__ import annotations

import re
from typing import Any


def printable(text: object, limit: int = 200) -> str:
    """``text`` with every non-printable character (ESC, CR, BEL, other controls
    and the like) replaced by ``?``, cut to ``limit`` characters (``...`` marks a cut)."""
    s = "".join(c if c.isprintable() else "?" for c in str(text))
    return s if len(s) <= limit else s[: max(0, limit - 3)] + "..."


# Credentials by their well-known shapes (Hugging Face, OpenAI-style keys, GitHub, GitLab,
# Slack, AWS access key ids, JWTs): a value of one of these shapes is never shown, wherever it
# was put by mistake (a path field, plan.extra_env, plan.extra_args).
_TOKEN_SHAPES = re.compile(
    r"(?<![A-Za-z0-9])(?:hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{16,}|gh[pousr]_[A-Za-z0-9]{20,}"
    r"|github_pat_[A-Za-z0-9_]{20,}|glpat-[A-Za-z0-9_-]{16,}|xox[abposr]-[A-Za-z0-9-]{10,}"
    r"|AKIA[0-9A-Z]{16}|eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,})")
TOKEN_MASK = "<token-shaped value, not shown>"


def mask_tokens(text: str) -> str:
    """``text`` with every token-shaped value replaced by ``TOKEN_MASK``."""
    return _TOKEN_SHAPES.sub(TOKEN_MASK, text)


def mask_tokens_in(value: Any) -> Any:
    """``mask_tokens`` over every string in plain data (dicts, lists), keys included."""
    if isinstance(value, str):
        return mask_tokens(value)
    if isinstance(value, dict):
        return {mask_tokens_in(k): mask_tokens_in(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(mask_tokens_in(v) for v in value)
    return value
