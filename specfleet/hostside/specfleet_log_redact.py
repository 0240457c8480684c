"""specfleet's one redaction module: the rules that keep API keys and tokens out of every log.

Run IN the server's Python as its log formatter, and the single source of those rules for every
other reader of a log: the readiness gate's journal excerpt (``readiness_gate.py``, shipped to
the host with this file's source ahead of it in the same script, ``operations.serving``) and
``specfleet logs`` (``specfleet.fleet.monitoring``, likewise). Python 3.8+ stdlib only; it imports
nothing of specfleet.

SGLang logs its ServerArgs at start, API key included (0.5.11 and 0.5.14:
``server_args=ServerArgs(..., api_key='...', ...)``; 0.5.23: ``server_args={..., 'api_key': ...}``).
Its supported way to shape its logging is ``SGLANG_LOGGING_CONFIG_PATH``: a JSON file that
``configure_logger`` hands to ``logging.config.dictConfig`` as it is, in every process of the
server. specfleet writes one whose formatter is ``specfleet_log_redact.RedactingFormatter`` and
puts this file's folder on the server's PYTHONPATH (both root's alone, beside the unit's files).
The formatter writes SGLang's own format (``[%(asctime)s{ms}{prefix}] %(message)s``; the
scheduler's `` DP0 TP3`` prefix read back from its process title), then redacts the whole text,
traceback included.

``redact`` works in two passes, in this order:

1. **Exact secrets**: every configured secret (the API key file's keys, the Hugging Face token)
   wherever it is, as it is and in every escaped form a log shows it in: Python's repr, JSON,
   both twice (a JSON string inside a JSON string, a repr of a repr), and a shell's quoting; a
   line break (with a journal line's prefix) may fall anywhere inside it (a record split over
   two journal lines). First, so that no pattern can cut a known key in pieces that then no
   longer match.
2. **Patterns**, for keys it does not know: the values of ``api_key``-like names (``api_key``,
   ``admin_api_key``, ``apiKey``, ``x-api-key``, ``api-key``, prefixed environment names such as
   ``SGLANG_API_KEY`` or ``OPENAI_API_KEY``) after ``=`` or ``:``; ``--api-key``/``--api_key``/
   ``--admin-api-key`` values in an argv (``--api-key X``, ``--api-key=X``, ``['--api-key',
   'X']``, ``{"--api-key": "X"}``); ``Bearer`` credentials; in any quoting (repr, JSON, JSON
   inside JSON, shell), a bare word up to whitespace otherwise (``None``/``null`` alone are no
   key). A flag at the end of a line takes its value from the next line.

A key with whitespace or a control character is refused by the settings' validation: its words
could not all be told from the text around them.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import shlex
import sys

REDACTED = "<redacted>"

# A journal line break inside a record: a newline, and with ``journalctl -o short*`` the next
# line's prefix (``2026-12-02T03:00:00+0000 host sglang[42]: ``).
_BREAK = r"(?:\n(?:[^\n]{0,200}?\]: )?)"
# A quoted string: Python's repr or JSON (backslash escapes), or a shell's single quotes.
_QUOTED = r"""'(?:\\.|[^'\\])*'|"(?:\\.|[^"\\])*"|'[^']*'"""
# A string inside a string (JSON in JSON, a repr in a repr): its quotes are escaped (\" or \\\"),
# the same on both ends.
_ESCAPED_QUOTED = r"""(?P<esc>\\+)(?P<q>['"])(?:.*?)(?<!\\)(?P=esc)(?P=q)"""
# A bare value: a word up to whitespace; ``None`` or ``null`` alone (then a delimiter) is no key.
_BARE = r"""(?!(?:None|null)(?:[\s,;)\]}'"]|$))[^\s]+"""
# A value: one already redacted (by the exact pass), a JSON string in JSON, quoted segments run
# together (a shell's 'a'"'"'b'), or a bare word.
_VALUE = (rf"""(?:{re.escape(REDACTED)}|{_ESCAPED_QUOTED}|"""
          rf"""(?:{_QUOTED})(?:{_QUOTED}|[^\s'",;)\]}}]+)*|{_BARE})""")
SECRET_PATTERNS = (
    # --api-key X, --api-key=X, --api_key X, '--api-key', 'X' (an argv, its repr or JSON),
    # {"--api-key": "X"}; the value may be on the next line.
    re.compile(rf"""(?<![\w-])(--(?:admin[-_])?api[-_]key)"""
               rf"""(=|\\*['"]?\s*[,:]\s*|[ \t]*{_BREAK}[ \t]*|[ \t]+)({_VALUE})""", re.I),
    # api_key=X, admin_api_key=X, 'api_key': X, "api_key": X, api-key: X, apiKey: X,
    # x-api-key: X, SGLANG_API_KEY=X, OPENAI_API_KEY=X, \"api_key\": \"X\" (JSON in JSON).
    re.compile(rf"""(?<![\w-])((?:[a-z0-9]+[_-])*api[_-]?key)(\\*['"]?\s*[=:]\s*)({_VALUE})""",
               re.I),
    # Authorization: Bearer X (and any other bearer credential).
    re.compile(rf"""(?<![\w-])(bearer)(\s+)({_VALUE})""", re.I),
)
# Cheap words that every pattern's text holds (most log lines hold none).
_HINTS = ("key", "bearer")


_BREAKS = re.compile(f"({_BREAK})")


def _mask(found: str) -> str:
    """``<redacted>`` for ``found``, its line breaks (and the next lines' journal prefixes) kept:
    a caller that split a text into lines gets as many back."""
    parts = _BREAKS.split(found)
    return "".join(part if i % 2 else REDACTED for i, part in enumerate(parts))


def _hide(match: re.Match) -> str:
    name, separator, value = match.group(1), match.group(2), match.group(3)
    if value == REDACTED:  # the exact pass found it
        return match.group(0)
    quote = ""
    escapes = value[: len(value) - len(value.lstrip("\\"))]
    if value[len(escapes):][:1] in ("'", '"') and len(value) > len(escapes) + 1:
        quote = value[: len(escapes) + 1]
    return f"{name}{separator}{quote}{_mask(value)}{quote}"


# How deep a secret may be quoted: a repr or JSON string inside another, inside a third (a JSON
# log record holding a JSON message that holds a repr).
_DEPTH = 3
_MARK = "\x00"  # escaped by both repr and JSON, and no quote: it leaves repr's choice of quote


def _nested(secret: str, encoders: tuple) -> str:
    """``secret`` as it shows when quoted by ``encoders`` in turn (each quoting the whole output
    of the one before, quotes included): the part between the escaped marks around it."""
    full, token = _MARK + secret + _MARK, _MARK
    for encode in encoders:
        full, token = encode(full), encode(token)[1:-1]
    return full.split(token)[1]


def secret_forms(secret: str) -> list[str]:
    """``secret`` as it is and in the escaped forms a log shows it in: Python's repr and JSON,
    each inside the other or itself up to three deep (the quoting of an inner one changes the
    escaping of the outer), and a shell's quoting (longest first)."""
    forms, chains = {secret}, [()]
    for _ in range(_DEPTH):
        chains = [chain + (encode,) for chain in chains for encode in (repr, json.dumps)]
        forms |= {_nested(secret, chain) for chain in chains}
    # A shell's quoting, where it is more than the secret in single quotes (the secret alone
    # covers that, and leaves the quotes around <redacted>).
    shell = shlex.quote(secret)
    forms |= {shell} if shell not in (secret, f"'{secret}'") else set()
    return sorted((f for f in forms if f), key=len, reverse=True)


@functools.lru_cache(maxsize=32)
def _exact(secrets: tuple[str, ...]):
    """One regex for every form of every secret, a journal line break allowed between any two
    of its characters; None for no secrets."""
    forms = sorted({f for s in secrets if s for f in secret_forms(s)}, key=len, reverse=True)
    if not forms:
        return None
    return re.compile("|".join(f"{_BREAK}?".join(map(_char, f)) for f in forms))


def _char(c: str) -> str:
    # journald drops a line's trailing whitespace: a space of the secret right before a line
    # break may be gone.
    return f"(?:{re.escape(c)}|(?=\n))" if c.isspace() else re.escape(c)


def redact(text: str, secrets=()) -> str:
    """``text`` (one line, a record, or a journal's lines joined) with every secret in it replaced
    by ``<redacted>``: first ``secrets`` (a list, or one secret) in every form, then the values of
    API key fields, flags and bearer credentials (their quoting kept). Line breaks stay."""
    if isinstance(secrets, str):
        secrets = [secrets]
    exact = _exact(tuple(s for s in (secrets or ()) if s))
    if exact is not None:
        text = exact.sub(lambda m: _mask(m.group(0)), text)
    lower = text.lower()
    if any(hint in lower for hint in _HINTS):
        for pattern in SECRET_PATTERNS:
            text = pattern.sub(_hide, text)
    return text


def redact_lines(lines, secrets=()) -> list[str]:
    """``lines`` (a journal's, in order) redacted as one text: a secret or a flag's value split
    over two of them is found too. As many lines come back."""
    lines = [line.rstrip("\n") for line in lines]
    return redact("\n".join(lines), secrets).split("\n") if lines else []


def read_secrets(paths) -> list[str]:
    """The API keys in specfleet's ``--config`` YAML files (``api-key: "..."``); missing or
    unreadable files give none."""
    found = []
    for path in paths:
        if not path:
            continue
        try:
            with open(path, encoding="utf-8") as f:
                lines = f.read().splitlines()
        except (OSError, UnicodeDecodeError):
            continue
        for line in lines:
            name, _, value = line.partition(":")
            value = value.strip()
            if name.strip().replace("_", "-") not in ("api-key", "admin-api-key") or not value:
                continue
            try:
                found.append(json.loads(value) if value.startswith('"') else value)
            except ValueError:
                found.append(value)
    return found


_DOCSTRING = re.compile(r'\A(?:#![^\n]*\n)?\s*(""".*?"""\n)', re.S)
_FUTURE = "from __future__ import annotations\n"


def ship_ahead_of(script: str) -> str:
    """This module's source ahead of ``script`` (another host-side program's, or a filter's), as
    one script a host runs from stdin or ``-c``: the way these rules reach a host together with
    the program that uses them (the readiness gate, ``specfleet logs``' filter), never copied.
    ``script``'s docstring stays first (its ``__doc__``); this module's stays here."""
    with open(__file__, encoding="utf-8") as f:
        mine = _DOCSTRING.sub("", f.read(), count=1)
    found = _DOCSTRING.match(script)
    doc, rest = (found.group(1), script[found.end():]) if found else ("", script)
    rest = rest.replace(_FUTURE, "", 1)
    return f"{doc}{mine}\n\n# ---- the program ----\n{rest}"


def _sglang_prefix() -> str:
    """The prefix SGLang's scheduler gives ``configure_logger`` (`` DP0 TP3``), read back from the
    process title it sets just before (``sglang::scheduler_DP0_TP3``); elsewhere none."""
    title_module = sys.modules.get("setproctitle")
    try:
        title = str(title_module.getproctitle()) if title_module is not None else ""
    except Exception:  # noqa: BLE001 - a title is a nicety, never a reason not to log
        return ""
    head = "sglang::scheduler"
    if not title.startswith(head):
        return ""
    ranks = re.findall(r"(?:ATTN_CP|MOE_DP|DP|PP|TP|EP)\d+", title[len(head) :])
    return "".join(f" {rank}" for rank in ranks)


def sglang_format() -> str:
    """SGLang's log format (``configure_logger``), with milliseconds under SGLANG_LOG_MS."""
    log_ms = os.environ.get("SGLANG_LOG_MS", "").lower() in ("true", "1", "yes", "y")
    return f"[%(asctime)s{'.%(msecs)03d' if log_ms else ''}{_sglang_prefix()}] %(message)s"


class RedactingFormatter(logging.Formatter):
    """A ``logging.Formatter`` (SGLang's format unless ``fmt`` is given) whose every output, the
    traceback included, has its API keys redacted; ``secret_files`` are read once, here."""

    def __init__(
        self,
        fmt: str | None = None,
        datefmt: str | None = "%Y-%m-%d %H:%M:%S",
        style: str = "%",
        secret_files: list[str] | tuple[str, ...] = (),
    ) -> None:
        super().__init__(fmt if fmt is not None else sglang_format(), datefmt, style)
        self._secrets = read_secrets(secret_files)

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record), self._secrets)
