"""specfleet: the SGLang server's log formatter, which redacts API keys. Run IN the server's Python.

SGLang logs its ServerArgs at start, API key included (0.5.11 and 0.5.14:
``server_args=ServerArgs(..., api_key='...', ...)``; 0.5.23: ``server_args={..., 'api_key': ...}``).
Its supported way to shape its logging is ``SGLANG_LOGGING_CONFIG_PATH``: a JSON file that
``configure_logger`` hands to ``logging.config.dictConfig`` as it is, in every process of the
server. specfleet writes one whose formatter is ``specfleet_log_redact.RedactingFormatter`` and
puts this file's folder on the server's PYTHONPATH (both root's alone, beside the unit's files).

The formatter writes SGLang's own format (``[%(asctime)s{ms}{prefix}] %(message)s``; the
scheduler's `` DP0 TP3`` prefix read back from its process title), then redacts the whole text,
traceback included: ``api_key=``/``admin_api_key=`` values, ``'api_key': ...`` and ``"api_key":
...`` entries, ``api-key: ...`` (YAML), ``--api-key``/``--admin-api-key`` values in an argv
(``--api-key X``, ``--api-key=X``, ``['--api-key', 'X']``), in any quoting (Python's repr, which
escapes a quote inside, JSON, shell), and the keys in ``secret_files`` wherever they appear, as
they are and as repr, JSON and a shell would write them.

Python 3 stdlib only; it imports nothing of specfleet. ``specfleet/hostside/readiness_gate.py``
redacts its journal excerpt with the same rules (a test holds the two to the same output).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import sys

REDACTED = "<redacted>"
# A quoted string: Python's repr or JSON (backslash escapes), or a shell's single quotes.
_QUOTED = r"""'(?:\\.|[^'\\])*'|"(?:\\.|[^"\\])*"|'[^']*'"""
# A value: quoted segments run together (a shell's 'a'"'"'b'), or a bare word up to whitespace.
_VALUE = rf"""(?:(?:{_QUOTED})(?:{_QUOTED}|[^\s'",;)\]}}]+)*|(?!(?:None|null)\b)\S+)"""
SECRET_PATTERNS = (
    # --api-key X, --api-key=X, '--api-key', 'X' (an argv, its repr or JSON, a command line).
    re.compile(rf"""(?<![\w-])(--(?:admin-)?api-key)(=|['"]?,\s*|\s+)({_VALUE})""", re.I),
    # api_key=X, admin_api_key=X, 'api_key': X, "api_key": X, api-key: X.
    re.compile(rf"""(?<![\w-])((?:admin[_-])?api[_-]key)(['"]?\s*[=:]\s*)({_VALUE})""", re.I),
)


def _hide(match: re.Match) -> str:
    name, separator, value = match.groups()
    quote = value[0] if value[:1] in ("'", '"') else ""
    return f"{name}{separator}{quote}{REDACTED}{quote}"


def secret_forms(secret: str) -> list[str]:
    """``secret`` as it is and as Python's repr, JSON and a shell write it (longest first)."""
    forms = {secret, repr(secret)[1:-1], json.dumps(secret)[1:-1], shlex.quote(secret)}
    return sorted((f for f in forms if f), key=len, reverse=True)


def redact(text: str, secrets: list[str] | tuple[str, ...] = ()) -> str:
    """``text`` with every API key in it replaced by ``<redacted>``: the values of API key fields
    and flags first (their quoting kept), then ``secrets`` wherever else they are."""
    if "key" in text.lower():
        for pattern in SECRET_PATTERNS:
            text = pattern.sub(_hide, text)
    for secret in secrets:
        if secret:
            for form in secret_forms(secret):
                text = text.replace(form, REDACTED)
    return text


def read_secrets(paths: list[str] | tuple[str, ...]) -> list[str]:
    """The API keys in specfleet's ``--config`` YAML files (``api-key: "..."``); missing or
    unreadable files give none."""
    found = []
    for path in paths:
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
