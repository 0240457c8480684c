"""The GPU parsers on raw output captured on a real 2x H200 machine, against what the facts
returned there through `pyinfra @local fact ... --json` (tests/fixtures/device/h200x2-live)."""

import json
import re
from pathlib import Path

import pytest

from facts.gpu import parse_compute_apps, parse_query_gpu, parse_topology

LIVE = Path(__file__).parents[1] / "fixtures" / "device" / "h200x2-live"


def _raw(name: str) -> list[str]:
    lines = (LIVE / name).read_text().splitlines()
    assert lines[-1].startswith("# exit="), "capture.sh appends the exit status"
    return lines[:-1]


def _printed_by_pyinfra() -> dict[str, object]:
    text = (LIVE / "pyinfra-facts.txt").read_text()
    printed = {}
    for line in text.splitlines():
        if line.startswith('{"facts.'):
            ((name, by_host),) = json.loads(line).items()
            printed[name] = by_host["@local"]
    return printed


@pytest.mark.parametrize(
    ("fact", "raw", "parser"),
    [
        ("facts.gpu.Gpus", "query-gpu-nounits.csv", parse_query_gpu),
        ("facts.gpu.GpuTopology", "topo-m.txt", parse_topology),
        ("facts.gpu.GpuProcesses", "compute-apps.csv", parse_compute_apps),
    ],
)
def test_parser_on_raw_capture_matches_the_live_fact(fact, raw, parser):
    assert parser(_raw(raw)) == _printed_by_pyinfra()[fact]


def test_live_h200_values():
    gpus = _printed_by_pyinfra()["facts.gpu.Gpus"]
    assert [g["sm"] for g in gpus["gpus"]] == [90, 90]
    assert {g["memory_mib"] for g in gpus["gpus"]} == {143771}
    topo = _printed_by_pyinfra()["facts.gpu.GpuTopology"]
    assert topo["nvlink_all_pairs"] is True
    # The header row really carries ANSI underline codes on this driver.
    assert re.search(r"\x1b\[4m", (LIVE / "topo-m.txt").read_text())
