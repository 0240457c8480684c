"""An error raised by the user's own Python (an inventory, its group data, a config file), said as
theirs: the file and line where it happened and the exception, one line, exit 3; never "a bug in
specfleet", never a traceback. pyinfra's own loader wraps such an error in its
``UnexpectedExternalError`` (which prints a traceback); specfleet's commands unwrap it here."""

from __future__ import annotations

import os
import traceback
from collections.abc import Iterable
from typing import Any

from specfleet.core.errors import SpecfleetError


def _where(exc: BaseException, files: Iterable[str]) -> tuple[str, int | None]:
    """The innermost frame of ``exc`` in one of ``files`` (else the innermost frame whose file
    is not this project's or pyinfra's), as (file, line)."""
    wanted = {os.path.realpath(f) for f in files}
    if isinstance(exc, SyntaxError) and exc.filename:
        return exc.filename, exc.lineno
    tb = getattr(exc, "_traceback", None) or exc.__traceback__
    frames = traceback.extract_tb(tb) if tb is not None else []
    for frame in reversed(frames):
        if os.path.realpath(frame.filename) in wanted:
            return frame.filename, frame.lineno
    for frame in reversed(frames):
        if not any(part in frame.filename for part in ("/pyinfra", "/specfleet/", "<frozen")):
            return frame.filename, frame.lineno
    return (next(iter(files), "?"), None)


def user_code_error(exc: BaseException, files: Iterable[str] = ()) -> SpecfleetError:
    """``exc`` (or the error pyinfra's ``UnexpectedExternalError`` wraps) as the user's error,
    naming the file and line of ``files`` (or pyinfra's ``filename``) where it was raised."""
    inner = getattr(exc, "exception", None)
    files = list(files)
    if isinstance(inner, BaseException):
        if getattr(exc, "filename", None):
            files.insert(0, exc.filename)
        exc = inner
    path, line = _where(exc, files)
    where = f"{path}:{line}" if line else path
    text = exc.msg if isinstance(exc, SyntaxError) else str(exc)
    return SpecfleetError(
        f"{where}: {type(exc).__name__}: {text}",
        fix=f"fix {os.path.basename(path)} at that line (the error is raised by its own Python, "
        "as pyinfra runs it)")


def is_user_code_error(exc: Any) -> bool:
    """pyinfra's wrapper of an error in user code."""
    try:
        from pyinfra_cli.exceptions import UnexpectedExternalError
    except ImportError:  # pragma: no cover - pyinfra_cli ships with pyinfra
        return False
    return isinstance(exc, UnexpectedExternalError)
