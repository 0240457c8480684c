"""Where the control machine's secrets come from, without reading them: one rule, used by the
deploy that reads the Hub token (``operations.weights.read_control_token``) and by
``specfleet settings``, which says where it comes from and whether it is set."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class ControlTokenSource:
    """Where the control machine's Hub token comes from, without its value: the file
    (``kind="file"``, never read here) or the environment variable (``kind="env"``); ``named``
    when the settings named it (a file or a variable named there that gives no token is an
    error, not "no token"); ``is_set`` of a variable, whether it holds a token (non-empty after
    stripping)."""

    kind: str
    name: str
    named: bool
    is_set: bool = False


def control_token_source(
    token_file: str | None, token_env: str | None, environ: Mapping[str, str] | None = None
) -> ControlTokenSource:
    """The one rule for where the token comes from: ``weights.token_file``, else the variable
    ``weights.token_env`` names, else ``HF_TOKEN``."""
    env = os.environ if environ is None else environ
    if token_file:
        return ControlTokenSource("file", token_file, named=True)
    name = token_env or "HF_TOKEN"
    return ControlTokenSource(
        "env", name, named=bool(token_env), is_set=bool((env.get(name) or "").strip())
    )
