"""The examples a new user starts from work as the README says."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from specfleet.core.errors import SpecfleetError
from tests.unit.test_plan import gpus_fact, topology_fact

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_FACTS = REPO / "inventories" / "examples" / "rtx6000x8-facts.json"


@pytest.mark.local
def test_example_facts_are_what_the_facts_read_from_the_real_capture():
    """The shipped example is ``specfleet probe``'s output shape, and its GPU facts are what our
    parsers make of the real RTX PRO 6000 capture (tests/fixtures/nvidia/rtx6000x8), not a copy
    that could go stale."""
    (probe,) = json.loads(EXAMPLE_FACTS.read_text()).values()
    (facts,) = (entry["facts"] for entry in probe.values())
    assert facts["facts.gpu.Gpus"] == gpus_fact("rtx6000x8")
    assert facts["facts.gpu.GpuTopology"] == topology_fact("rtx6000x8")


@pytest.mark.local
def test_plan_reads_the_example_facts_and_probe_output_as_they_are():
    res = subprocess.run(
        [sys.executable, "-m", "specfleet.plan", "--facts", str(EXAMPLE_FACTS), "--predicted",
         "--json"], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    plan = json.loads(res.stdout)
    assert "--tp-size" in plan["argv"] and plan["argv"][plan["argv"].index("--tp-size") + 1] == "8"
    # The captured probe of a 2x H200 box (the other shape `specfleet probe` prints) is read too:
    # it is refused for what it is (too small for K2.6), not for its shape.
    res = subprocess.run(
        [sys.executable, "-m", "specfleet.plan", "--facts",
         str(REPO / "tests/fixtures/nvidia/h200x2-busy/probe.json"), "--predicted"],
        capture_output=True, text=True, cwd=REPO, timeout=60)
    assert res.returncode == 2 and "2 GPUs hold 281 GiB" in res.stdout + res.stderr
    assert "no GPUs" not in res.stdout + res.stderr


def test_first_host_inventory_fails_on_its_placeholders_with_the_fix():
    from pyinfra.api import State
    from pyinfra.context import ctx_state

    from specfleet.core.settings import settings_for_all_hosts
    from tests.unit.test_settings import make_inventory

    ctx_state.set(State())
    with pytest.raises(SpecfleetError) as err:
        settings_for_all_hosts(make_inventory(str(REPO / "inventories" / "first_host.py")))
    text = str(err.value)
    assert "gpu-box-1" in text and "target.revision" in text and "drafter.revision" in text
