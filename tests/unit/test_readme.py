"""The tour (docs/tour.md, linked from the README) stays true where a test can tell: it names every
module."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TOURED = ("specfleet", "operations", "facts", "deploys")


def tour_rows() -> dict[str, str]:
    """``{folder path: what cell}`` of the tour's table (docs/tour.md, its first section)."""
    text = (REPO / "docs" / "tour.md").read_text()
    tour = text[text.index("\n| floor |"):]
    tour = tour[:tour.index("\n\n", 1)]
    rows = {}
    for line in tour.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[1].startswith("`"):
            rows[cells[1].strip("`")] = cells[2]
    return rows


def modules() -> list[Path]:
    return sorted(p.relative_to(REPO) for top in TOURED for p in (REPO / top).rglob("*.py")
                  if p.name != "__init__.py" and "__pycache__" not in p.parts)


def test_the_tour_names_every_module_in_its_own_folders_row():
    rows = tour_rows()
    missing = []
    for module in modules():
        row = rows.get(f"{module.parent.as_posix()}/")
        if row is None or not re.search(rf"`{re.escape(module.name)}`", row):
            missing.append(module.as_posix())
    assert missing == [], f"docs/tour.md does not name these modules in their row: {missing}"


def test_the_tour_names_no_module_that_is_gone():
    names = {(m.parent.as_posix() + "/", m.name) for m in modules()}
    stale = [f"{folder}{name}" for folder, row in tour_rows().items()
             if folder.rstrip("/") in {m.parent.as_posix() for m in modules()}
             for name in re.findall(r"`([a-z_0-9]+\.py)`", row) if (folder, name) not in names]
    assert stale == []


def test_the_readme_is_a_front_door():
    """At most 250 lines, its quickstart marked (tests/fleet/test_cli_fleet.py runs it), the two
    commands of this repository named as they are, and no history (bench/results/HISTORY.md)."""
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    assert text.index("<!-- quickstart -->") < text.index("<!-- /quickstart -->")
    assert "`.ci/demo`" in text and "`.ci/test`" in text and "`.ci/run`" in text
    assert "History" not in text


def test_every_relative_link_of_the_docs_leads_to_a_file():
    broken = []
    for doc in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")),
                REPO / "bench" / "README.md"]:
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = (doc.parent / target.split("#", 1)[0]).resolve()
            if not path.exists():
                broken.append(f"{doc.relative_to(REPO)}: {target}")
    assert broken == []
