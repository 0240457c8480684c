"""The stamp every benchmark's figures carry, and the READMEs' figure lines written from a run.

Every bench prints ``stamp: bench=NAME commit=C date=D`` first and ends its figure line with
``(commit C, D)``: C is ``git rev-parse --short HEAD``, with ``-dirty`` when a tracked file
differs from it; D the UTC date and minute. ``python -m bench.final`` takes the commit once,
before its first bench, and hands it to each (``SPECFLEET_BENCH_COMMIT``).

    python -m bench.stamp bench/results/<commit>     (after python -m bench.final)
    python -m bench.stamp --check                    (the figure lines without a stamp)

puts each output's figure line after each ``<!-- figure: NAME -->`` marker of the figures
documents, and (converged, drills) its last table between ``<!-- table: NAME -->`` and
``<!-- /table -->``; what they replace goes to ``bench/results/HISTORY.md`` (the one history of the
figures: no document but that one and the CHANGELOG has a history section).
What a figure line is: below (``figure_lines``); ``tests/unit/test_figures_stamped.py`` fails on
one without a stamp.
"""

from __future__ import annotations

import argparse
import datetime
import functools
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


@functools.cache
def current_commit() -> str:
    """The checkout's short commit, ``-dirty`` when a tracked file differs from it (untracked
    files, e.g. bench/results/, do not count). Read once, at the bench's start (its stamp line):
    a commit made while it runs is not what it measured."""
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


def figure_line(bench: str, output: str) -> str:
    """A bench's figure line in its output: the last line ``BENCH: ...`` that ends with its
    stamp ("" when there is none: the bench failed before it)."""
    lines = [ln.strip() for ln in output.splitlines()
             if ln.startswith(f"{bench}: ") and STAMP_RE.search(ln)]
    return lines[-1] if lines else ""


# ----- the READMEs' figure lines --------------------------------------------------------------
# A figure line is a line of a figures document that reports a measurement:
# - anywhere in README.md and the figures files, a bench's own figure line as it prints it
#   (``NAME: key=<digit>...``, e.g. ``weights: rate/link=0.92``; a template such as
#   ``survived=S/N`` has no digit after its ``=`` and is not one);
# - in a figures section (README.md's sections named in FIGURE_SECTIONS, and the whole of each
#   bench/*/README.md and bench/*/RESULTS.md), a table row holding a measured number: a number
#   with a unit (s, ms, min, %, x, MB, MB/s, GiB, CPU-s) or a decimal number.
# Each must carry a stamp (STAMP_RE; never -dirty) naming a commit of the repository. What lies
# under a heading with "History (older code)" (to the next heading of its level or above) is
# history and exempt (only bench/results/HISTORY.md has one; tests/unit/test_figures_stamped.py
# fails on a history section elsewhere).
BENCHES = ("converged", "fanout", "weights", "sweep", "drills")
BENCH_LINE_RE = re.compile(r"\b(?:" + "|".join(BENCHES) + r"): [^`\n]*?=\d")
MEASURED_RE = re.compile(r"\b\d+(?:\.\d+)?\s?(?:s|ms|min|%|x|MB|MB/s|GiB|CPU-s)(?![\w/])"
                         r"|\b\d+\.\d+\b")
FIGURE_SECTIONS = ("Benchmarks", "Fault drills", "Benchmark and tuning sweep")
HISTORY = "History (older code)"
HEADING_RE = re.compile(r"^(#{1,6}) +(.*)$")
# bench/real_gpu is the device runs' (its results folders carry their commits: run1-26a22a6).
NOT_FIGURE_FILES = ("bench/real_gpu/",)


HISTORY_FILE = "bench/results/HISTORY.md"


def figures_documents(root: Path = REPO_ROOT) -> list[Path]:
    """The documents whose figure lines must carry stamps: the README (which should hold none),
    bench/README.md (every bench's current line) and each bench's own README / RESULTS."""
    docs = [root / "README.md", root / "bench" / "README.md"]
    for pattern in ("bench/*/README.md", "bench/*/RESULTS.md"):
        docs += sorted(p for p in root.glob(pattern)
                       if not str(p.relative_to(root)).startswith(NOT_FIGURE_FILES))
    return docs


def figure_lines(text: str, whole_is_figures: bool) -> list[tuple[int, str]]:
    """(line number, line) of each figure line outside the history sections."""
    found = []
    history_level = section_level = 0  # 0: not inside such a section
    in_figures = whole_is_figures
    for n, line in enumerate(text.splitlines(), start=1):
        heading = HEADING_RE.match(line)
        if heading:
            level, title = len(heading.group(1)), heading.group(2)
            if history_level and level <= history_level:
                history_level = 0
            if HISTORY in title:
                history_level = level
            if not whole_is_figures:
                if section_level and level <= section_level:
                    in_figures, section_level = False, 0
                if level == 2 and title.strip() in FIGURE_SECTIONS:
                    in_figures, section_level = True, level
            continue
        if history_level:
            continue
        is_row = line.lstrip().startswith("|") and not re.fullmatch(r"[\s|:-]*", line)
        if BENCH_LINE_RE.search(line) or (in_figures and is_row and MEASURED_RE.search(line)):
            found.append((n, line))
    return found


def unstamped(path: Path, root: Path = REPO_ROOT) -> list[str]:
    """Each figure line of a document without a clean stamp: 'path:line: text'."""
    whole = path != root / "README.md"
    bad = []
    for n, line in figure_lines(path.read_text(), whole_is_figures=whole):
        m = STAMP_RE.search(line)
        if not m or m.group("dirty"):
            bad.append(f"{path.relative_to(root)}:{n}: {line.strip()[:160]}")
    return bad


def stamped_commits(path: Path) -> set[str]:
    return {m.group("commit") for m in STAMP_RE.finditer(path.read_text())}


def commit_exists(commit: str, root: Path = REPO_ROOT) -> bool:
    return subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=root,
                          capture_output=True).returncode == 0


# ----- writing a run's figures into the documents ---------------------------------------------
# Where each bench's figure line and (for some) its table go, in any figures document:
#     <!-- figure: NAME -->           the next line is the figure line
#     <!-- table: NAME --> ... <!-- /table -->   the bench's last markdown table, a column added
FIGURE_MARK = "<!-- figure: {} -->"
TABLE_MARK, TABLE_END = "<!-- table: {} -->", "<!-- /table -->"
HISTORY_INTRO = ("Runs on earlier code, kept for how the figures moved; none of them is a figure "
                 "of the current code.")


def as_document_line(figure: str) -> str:
    """``NAME: k=v ... (commit C, DATE)`` as a document shows it: the figure quoted, the stamp
    after it."""
    m = STAMP_RE.search(figure)
    if not m:
        raise ValueError(f"no stamp on {figure!r}")
    return f"`{figure[:m.start()].strip()}` {m.group(0)}"


def last_table(output: str) -> list[str]:
    """The last markdown table of a bench's output (header, rule, rows)."""
    lines = output.splitlines()
    starts = [i for i in range(len(lines) - 1)
              if lines[i].startswith("|") and re.fullmatch(r"\|[\s|:-]+", lines[i + 1].strip())]
    if not starts:
        return []
    i = starts[-1]
    j = i + 2
    while j < len(lines) and lines[j].startswith("|"):
        j += 1
    return lines[i:j]


def with_stamp_column(table: list[str], stamp_text: str) -> list[str]:
    """Each row of a table stamped: a last column, ``measured``, holding ``(commit C, DATE)``."""
    if not table:
        return []
    out = [table[0].rstrip().rstrip("|").rstrip() + " | measured |",
           table[1].rstrip().rstrip("|").rstrip() + "|---|"]
    out += [row.rstrip().rstrip("|").rstrip() + f" | {stamp_text} |" for row in table[2:]]
    return out


def put_figures(text: str, bench: str, figure: str,
                table: list[str]) -> tuple[str, int, list[str]]:
    """The document with this bench's marked figure line (and table) replaced by the run's;
    (text, places replaced, the lines it replaced: for ``to_history``)."""
    lines = text.split("\n")
    replaced: list[str] = []
    places = 0
    stamp_text = STAMP_RE.search(figure).group(0)  # type: ignore[union-attr]
    for i, line in enumerate(lines):
        if line.strip() == FIGURE_MARK.format(bench) and i + 1 < len(lines):
            if STAMP_RE.search(lines[i + 1]):
                replaced.append(lines[i + 1])
            lines[i + 1] = as_document_line(figure)
            places += 1
    if table and TABLE_MARK.format(bench) in text:
        start = next(i for i, ln in enumerate(lines) if ln.strip() == TABLE_MARK.format(bench))
        end = next(i for i in range(start + 1, len(lines)) if lines[i].strip() == TABLE_END)
        old = [ln for ln in lines[start + 1:end] if ln.strip()]
        if old:
            replaced += ["", *old]
        lines[start + 1:end] = with_stamp_column(table, stamp_text)
        places += 1
    return "\n".join(lines), places, replaced


def to_history(history: str, source: str, bench: str, stamp_text: str, old: list[str]) -> str:
    """``history`` (bench/results/HISTORY.md's text) with ``old``, what a run replaced in the
    document ``source``, put first under that document's ``## source`` heading (made at the end
    when there is none), headed by what replaced it."""
    lines = history.rstrip("\n").split("\n") if history.strip() else [
        "# History (older code)", "", HISTORY_INTRO]
    heading = f"## {source}"
    at = next((i for i, ln in enumerate(lines) if ln.strip() == heading), None)
    if at is None:
        lines += ["", heading]
        at = len(lines) - 1
    entry = ["", f"### {bench}, until the run {stamp_text}", "", *old]
    return "\n".join(lines[:at + 1] + entry + lines[at + 1:]) + "\n"


def stamp_documents(results: Path, root: Path = REPO_ROOT) -> list[str]:
    """Put every bench output of ``results`` into the figures documents; what was done."""
    done = []
    for bench in BENCHES:
        log = results / f"{bench}.txt"
        if not log.exists():
            continue
        output = log.read_text()
        figure = figure_line(bench, output)
        if not figure:
            done.append(f"{bench}: no figure line in {log} (the bench failed?): nothing written")
            continue
        if STAMP_RE.search(figure).group("dirty"):  # type: ignore[union-attr]
            done.append(f"{bench}: measured on a dirty tree ({figure}): nothing written")
            continue
        table = last_table(output) if bench in ("converged", "drills") else []
        stamp_text = STAMP_RE.search(figure).group(0)  # type: ignore[union-attr]
        history_path = root / HISTORY_FILE
        for doc in figures_documents(root):
            text, places, old = put_figures(doc.read_text(), bench, figure, table)
            if places:
                doc.write_text(text)
                done.append(f"{bench}: {doc.relative_to(root)} ({places} place(s))")
            if old:
                history_path.parent.mkdir(parents=True, exist_ok=True)
                history = history_path.read_text() if history_path.exists() else ""
                history_path.write_text(to_history(history, str(doc.relative_to(root)), bench,
                                                   stamp_text, old))
    sweep = results / "sweep"
    if sweep.is_dir() and figure_line("sweep", (results / "sweep.txt").read_text()):
        for f in sweep.iterdir():
            (root / "bench" / "sweep" / f.name).write_bytes(f.read_bytes())
        done.append("sweep: its report and PNGs copied to bench/sweep/")
    return done


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.stamp", description=__doc__.split("\n")[0])
    ap.add_argument("results", type=Path, nargs="?",
                    help="a results folder of bench/final.py: bench/results/<commit>")
    ap.add_argument("--check", action="store_true",
                    help="only list the figure lines without a stamp (what the unit test fails on)")
    a = ap.parse_args(argv)
    if a.results and not a.check:
        for what in stamp_documents(a.results.resolve()):
            print(what)
    bad = [b for doc in figures_documents() for b in unstamped(doc)]
    for b in bad:
        print(f"no stamp: {b}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
