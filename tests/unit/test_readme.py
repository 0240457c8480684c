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
