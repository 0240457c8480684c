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
                     "move them to bench/results/HISTORY.md):\n" + "\n".join(bad))


@pytest.mark.local
def test_every_stamped_commit_is_in_the_history():
    # CI checks out the whole history (tests/unit/test_pr20547_recipe.py reads older commits too).
    missing = sorted(f"{doc.relative_to(ROOT)}: {c}" for doc in st.figures_documents(ROOT)
                     for c in st.stamped_commits(doc) if not st.commit_exists(c, ROOT))
    assert not missing, "stamps naming commits git does not have:\n" + "\n".join(missing)


def test_the_documents_are_the_readme_and_each_bench_readme_and_results():
    names = {str(p.relative_to(ROOT)) for p in st.figures_documents(ROOT)}
    assert {"README.md", "bench/README.md", "bench/weights/README.md", "bench/fanout/README.md",
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
    doc = DOC[:DOC.index("## History (older code)")]
    text, places, old = st.put_figures(doc, "converged", figure, st.last_table(OUTPUT))
    assert places == 2
    assert ("`converged: ratio=4.08 commands_per_host=2 hosts=32 rtt_ms=50 cpu_ratio=1.89 "
            f"vs_noop=0.71` {STAMP}") in text
    assert f"| 32 | 50 | 1.89 | {STAMP} |" in text and "1111111" not in text
    assert "History" not in text
    # The replaced line and table go to the one history file, first under their document's
    # heading, headed by what replaced them.
    history = st.to_history(DOC[DOC.index("## History"):].replace(
        "## History (older code)", "# History (older code)\n\n## bench/converged/RESULTS.md"),
        "bench/converged/RESULTS.md", "converged", STAMP, old)
    assert history.index("### converged, until the run " + STAMP) < history.index("1111111") \
        < history.index("### older")
    assert "| 32 | 1.98 | (commit 1111111" in history
    fresh = st.to_history("", "bench/weights/README.md", "weights", STAMP, ["`weights: x=1`"])
    assert fresh.startswith("# History (older code)") and "## bench/weights/README.md" in fresh
    (tmp_path / "RESULTS.md").write_text(text)
    assert st.unstamped(tmp_path / "RESULTS.md", tmp_path) == []


def test_a_run_written_into_a_checkout_puts_the_old_lines_into_the_history_file(tmp_path):
    (tmp_path / "bench" / "converged").mkdir(parents=True)
    (tmp_path / "README.md").write_text("# x\n")
    (tmp_path / "bench" / "README.md").write_text(DOC[:DOC.index("## History")])
    results = tmp_path / "results"
    results.mkdir()
    (results / "converged.txt").write_text(OUTPUT)
    done = st.stamp_documents(results, tmp_path)
    assert done == ["converged: bench/README.md (2 place(s))"]
    history = (tmp_path / "bench" / "results" / "HISTORY.md").read_text()
    assert "## bench/README.md" in history and "(commit 1111111" in history
    assert "1111111" not in (tmp_path / "bench" / "README.md").read_text()


def test_no_document_but_the_history_file_and_the_changelog_has_a_history_section():
    docs = [ROOT / "README.md", *ROOT.glob("docs/**/*.md"), *ROOT.glob("bench/**/*.md")]
    found = [str(d.relative_to(ROOT)) for d in docs
             if d != ROOT / st.HISTORY_FILE and not d.is_relative_to(ROOT / "bench" / "results")
             and any(st.HEADING_RE.match(ln) and "history" in ln.lower()
                     for ln in d.read_text().splitlines())]
    assert found == [], f"history sections outside {st.HISTORY_FILE}: {found}"


def test_a_placeholder_is_replaced_without_history_and_a_failed_run_has_no_figure_line():
    doc = "## Now\n\n<!-- figure: weights -->\n`weights:` not measured yet\n"
    text, places, old = st.put_figures(doc, "weights", f"weights: rate/link=0.93 {STAMP}", [])
    assert places == 1 and old == [] and "not measured" not in text
    assert st.figure_line("weights", "stamp: bench=weights ...\nTraceback ...\n") == ""


@pytest.mark.parametrize("line", ["(commit 3bc040a, 2026-12-02)",
                                  "(commit 3bc040a4f00dc0ffee, 2026-12-02 07:30 UTC)"])
def test_the_stamp_forms(line):
    assert st.STAMP_RE.search(line)
