"""The stamp every benchmark's figures carry, and the README lines rewritten from a run's outputs.

Every bench prints ``stamp: commit=C date=D`` first and ends its figure line with
``(commit C, D)``: C is ``git rev-parse --short HEAD``, with ``-dirty`` when a tracked file
differs from it; D the UTC date and minute. ``bench/final.sh`` takes the stamp once before its
first bench (``SPECFLEET_BENCH_COMMIT``): the sweep rewrites tracked files under ``bench/sweep/``,
which would make every later bench's tree "dirty".

    python -m bench.stamp bench/results/<commit>     (after bench/final.sh)

puts each output's figure line into the README tables it belongs to (see ``FIGURE_LINES``):
the line between ``<!-- figure: NAME -->`` and ``<!-- /figure -->`` is replaced, and the lines
it replaces go to the file's "History (older code)" section.
"""

from __future__ import annotations

import datetime
import os
import re
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
COMMIT_ENV = "SPECFLEET_BENCH_COMMIT"
# What a stamp looks like in a README: a commit (7 to 40 hex, never -dirty there) and a date.
STAMP_RE = re.compile(r"\(commit (?P<commit>[0-9a-f]{7,40})(?P<dirty>-dirty)?, "
                      r"(?P<date>\d{4}-\d{2}-\d{2})(?: \d{2}:\d{2} UTC)?\)")


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()


def current_commit() -> str:
    """The checkout's short commit, ``-dirty`` when a tracked file differs from it (untracked
    files, e.g. bench/results/, do not count)."""
    fixed = os.environ.get(COMMIT_ENV)
    if fixed:
        return fixed
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return git("rev-parse", "--short", "HEAD") + ("-dirty" if dirty else "")


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def stamp() -> str:
    """``commit C, DATE``: what a figure line ends with, in parentheses."""
    return f"commit {current_commit()}, {utc_now()}"


def stamp_line(bench: str) -> str:
    """The first line of a bench's output."""
    return f"stamp: bench={bench} commit={current_commit()} date={utc_now()}"
