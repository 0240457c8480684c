"""Every figure the READMEs report carries the commit it was measured on and the date (issue 40).

What a figure line is, and what a stamp looks like: ``bench/stamp.py`` (one home for both; the
runner and ``python -m bench.stamp`` use the same definitions).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import stamp as st

ROOT = Path(__file__).resolve().parents[2]


def test_every_figure_line_of_the_readmes_carries_a_commit_stamp():
    bad = [b for doc in st.figures_documents(ROOT) for b in st.unstamped(doc, ROOT)]
    assert not bad, ("figure lines without '(commit SHA, YYYY-MM-DD[ HH:MM UTC])' (measure them "
                     "with python -m bench.final and write them with python -m bench.stamp, or "
                     "move them under a 'History (older code)' heading):\n" + "\n".join(bad))


@pytest.mark.local
def test_every_stamped_commit_is_in_the_history():
    # CI checks out the whole history (tests/unit/test_pr20547_recipe.py reads older commits too).
    missing = sorted(f"{doc.relative_to(ROOT)}: {c}" for doc in st.figures_documents(ROOT)
                     for c in st.stamped_commits(doc) if not st.commit_exists(c, ROOT))
    assert not missing, "stamps naming commits git does not have:\n" + "\n".join(missing)


def test_the_documents_are_the_readme_and_each_bench_readme_and_results():
    names = {str(p.relative_to(ROOT)) for p in st.figures_documents(ROOT)}
    assert {"README.md", "bench/weights/README.md", "bench/fanout/README.md",
            "bench/converged/RESULTS.md"} <= names
    assert not any(n.startswith("bench/real_gpu/") for n in names)


README = """# x

## Settings

| key | default |
|---|---|
| `weights.margin_percent` | 2.0 |

## Benchmarks

The template ``converged: ratio=R.RR cpu_ratio=C.CC`` is not a figure.

{figure}

| hosts | s |
|---:|---:|
{row}

## History (older code)

`weights: rate/link=0.88 recheck/bare=1.12` on older code

### an older table

| 8 | 2.13 s |

## Fault drills

ok
"""
STAMP = "(commit 3bc040a, 2026-12-02 07:30 UTC)"


def lint(tmp_path: Path, figure: str, row: str) -> list[str]:
    (tmp_path / "README.md").write_text(README.format(figure=figure, row=row))
    return st.unstamped(tmp_path / "README.md", tmp_path)


def test_a_figure_line_or_a_measured_table_row_without_a_stamp_fails(tmp_path):
    bad = lint(tmp_path, "`weights: rate/link=0.92 recheck/bare=1.16`", "| 32 | 4.08 s |")
    assert [b.split(": ", 1)[0] for b in bad] == ["README.md:13", "README.md:17"]


def test_stamped_lines_pass_and_history_and_other_sections_are_exempt(tmp_path):
    assert lint(tmp_path, f"`weights: rate/link=0.92 recheck/bare=1.16` {STAMP}",
                f"| 32 | 4.08 s | {STAMP} |") == []


def test_a_stamp_of_a_dirty_tree_does_not_count(tmp_path):
    dirty = STAMP.replace("3bc040a", "3bc040a-dirty")
    assert len(lint(tmp_path, f"`weights: rate/link=0.92` {dirty}", "| 1 | x |")) == 1


def test_a_bench_line_anywhere_in_the_readme_is_a_figure_line(tmp_path):
    (tmp_path / "README.md").write_text("## Tour\n\nit printed `fanout: upstream_bytes/model=1.00"
                                        " fleet/single=1.22 hosts=16` once\n")
    assert len(st.unstamped(tmp_path / "README.md", tmp_path)) == 1


@pytest.mark.local
def test_a_commit_that_is_not_in_git_is_found():
    assert st.commit_exists(st.git("rev-parse", "HEAD"))
    assert not st.commit_exists("0000000")


OUTPUT = f"""stamp: bench=converged commit=3bc040a date=2026-12-02 07:30 UTC
| hosts | RTT ms | cpu_ratio |
|---:|---:|---:|
| 1 | 50 | 1.19 |
| 32 | 50 | 1.89 |
converged: ratio=4.08 commands_per_host=2 hosts=32 rtt_ms=50 cpu_ratio=1.89 vs_noop=0.71 {STAMP}
"""
DOC = """# bench/converged

## Current figures

<!-- figure: converged -->
`converged: ratio=4.20 cpu_ratio=1.98` (commit 1111111, 2026-12-01 22:32 UTC)

<!-- table: converged -->
| hosts | cpu_ratio | measured |
|---:|---:|---|
| 32 | 1.98 | (commit 1111111, 2026-12-01 22:32 UTC) |
<!-- /table -->

## History (older code)

Runs on earlier code.

### older

| 8 | 2.13 | (commit 2222222, 2026-12-01) |
"""


def test_a_runs_output_replaces_the_marked_figures_and_the_old_go_to_history(tmp_path):
    figure = st.figure_line("converged", OUTPUT)
    assert figure.startswith("converged: ratio=4.08") and figure.endswith(STAMP)
    text, places = st.put_figures(DOC, "converged", figure, st.last_table(OUTPUT))
    assert places == 2
    current, history = text.split("## History (older code)")
    assert ("`converged: ratio=4.08 commands_per_host=2 hosts=32 rtt_ms=50 cpu_ratio=1.89 "
            f"vs_noop=0.71` {STAMP}") in current
    assert f"| 32 | 50 | 1.89 | {STAMP} |" in current and "1111111" not in current
    # The replaced line and table, first in the history, under what replaced them.
    assert history.index("### converged, until the run " + STAMP) < history.index("1111111") \
        < history.index("### older")
    assert "| 32 | 1.98 | (commit 1111111" in history
    (tmp_path / "RESULTS.md").write_text(text)
    assert st.unstamped(tmp_path / "RESULTS.md", tmp_path) == []


def test_a_placeholder_is_replaced_without_history_and_a_failed_run_has_no_figure_line():
    doc = "## Now\n\n<!-- figure: weights -->\n`weights:` not measured yet\n"
    text, places = st.put_figures(doc, "weights", f"weights: rate/link=0.93 {STAMP}", [])
    assert places == 1 and "History" not in text and "not measured" not in text
    assert st.figure_line("weights", "stamp: bench=weights ...\nTraceback ...\n") == ""


@pytest.mark.parametrize("line", ["(commit 3bc040a, 2026-12-02)",
                                  "(commit 3bc040a4f00dc0ffee, 2026-12-02 07:30 UTC)"])
def test_the_stamp_forms(line):
    assert st.STAMP_RE.search(line)
