"""Facts about the Hugging Face credentials on a host (never their contents)."""

from __future__ import annotations

from pyinfra.api import FactBase, QuoteString, StringCommand
from typing_extensions import override

# huggingface_hub's own lookup: HF_TOKEN_PATH, else $HF_HOME/token, HF_HOME defaulting to
# $XDG_CACHE_HOME/huggingface, XDG_CACHE_HOME to ~/.cache (huggingface_hub.constants).
DEFAULT_TOKEN_PATH = (
    "${HF_TOKEN_PATH:-${HF_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/huggingface}/token}"
)


def parse_token(output: list[str]) -> dict:
    """``exists PATH`` / ``absent PATH`` -> ``{"path": PATH, "exists": bool}``."""
    state, _, path = (output[0] if output else "").partition(" ")
    return {"path": path, "exists": state == "exists"}


class Token(FactBase[dict]):
    """
    Returns where the host's Hugging Face token file is and whether it exists and is not empty.
    The file is tested, never read. Without ``path``, huggingface_hub's default path for the
    connecting user (``HF_TOKEN_PATH``, ``HF_HOME``, ``~/.cache/huggingface/token``).

    + path: a token file to check instead of huggingface_hub's default

    .. code:: python

        {"path": "/root/.cache/huggingface/token", "exists": True}
    """

    @override
    def command(self, path: str | None = None) -> StringCommand:
        target = QuoteString(path) if path else f'"{DEFAULT_TOKEN_PATH}"'
        return StringCommand(
            "p=",
            target,
            '; if test -s "$p"; then echo "exists $p"; else echo "absent $p"; fi',
            _separator="",
        )

    @override
    def process(self, output: list[str]) -> dict:
        return parse_token(output)
