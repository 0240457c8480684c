"""Which venv a run installs SGLang into and the unit runs from: the host's settings with their
``venv`` resolved (``specfleet.core.sglang.install.choose_venv``) from what that venv holds."""

from __future__ import annotations

from pyinfra import host, logger

from facts.cache import cached_fact
from facts.python import Packages
from facts.sglang import Venv
from specfleet.core.settings import Settings
from specfleet.core.sglang.install import (
    VenvChoice,
    choose_venv,
    sibling_venv,
    source_label,
    venv_python,
)

_SAID: set[tuple[str, str]] = set()


def venv_choice(settings: Settings) -> VenvChoice:
    base = settings.venv
    sg = settings.sglang
    if not sg.side_by_side or sg.kind == "git":
        return VenvChoice(base)  # no fact asked: the converged run stays at its two commands
    state = cached_fact(host, Venv, path=base)
    packages = (
        cached_fact(host, Packages, python=venv_python(base)) or {}
        if state and state.get("python")
        else {}
    )
    sg = settings.sglang
    return choose_venv(
        base, packages, version=sg.version, git=sg.kind == "git", side_by_side=sg.side_by_side,
        source_path=sg.source_path if sg.kind == "source" else None,
    )


def effective_settings(settings: Settings) -> Settings:
    """``settings`` with ``venv`` the one this run uses. Said once per host at normal verbosity
    when it is not the configured one."""
    s = settings
    choice = venv_choice(s)
    if choice.venv == s.venv:
        return s
    if (host.name, choice.venv) not in _SAID:
        _SAID.add((host.name, choice.venv))
        logger.info(f"{host.print_prefix}{choice.reason}")
    return s.model_copy(update={"venv": choice.venv})


def candidate_venvs(settings: Settings) -> list[str]:
    """The venvs a probe asks about: the configured one and the one beside it for this release."""
    out = [settings.venv]
    sg = settings.sglang
    if sg.side_by_side and sg.kind == "source" and sg.source_path:
        out.append(sibling_venv(settings.venv, source_label(sg.source_path)))
    elif sg.side_by_side and sg.kind != "git":
        out.append(sibling_venv(settings.venv, sg.version))
    return out
