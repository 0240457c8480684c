"""Where the files specfleet ships live: the jinja2 templates and the host-side programs.

A wheel carries them as package data (``templates/`` is mapped to ``specfleet.templates``); a
checkout used in place (pyinfra puts the working directory on ``sys.path``) has them in its own
``templates/`` and ``specfleet/hostside/``. Both are found with ``importlib.resources``. Reading
them is left to the caller.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

_CHECKOUT_TEMPLATES = Path(__file__).resolve().parents[2] / "templates"


def template_path(name: str) -> Path:
    """A template by file name (``sglang.service.j2``)."""
    try:
        found = resources.files("specfleet.templates") / name
        if found.is_file():
            return Path(str(found))
    except ModuleNotFoundError:
        pass
    return _CHECKOUT_TEMPLATES / name


def hostside_path(name: str) -> Path:
    """A host-side program by file name (``weights_agent.py``)."""
    return Path(str(resources.files("specfleet.hostside") / name))
