"""The stand-in server's SGLang rules on a real fleet host: SGLang installed ``--no-deps`` from the
fleet's wheelhouse (as every fleet test and the demo install it), the stand-in started by that
venv's python beside sglang_rules.py (as the demo starts it), nvidia-smi the host's stand-in.

0.5.11's rules need nothing past the stdlib: the stand-in judges there (the plan starts, a flag
SGLang refuses stops it with SGLang's message) and its record says the rules ran. 0.5.23's
ServerArgs is a msgspec record, and msgspec is not installed with ``--no-deps``: there the stand-in
cannot judge and its record says so, so no test can read that start as "SGLang accepts it". (No
fleet test nor the demo starts the stand-in on a 0.5.23 tree: they pin 0.5.11 or 0.5.14.)
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from specfleet.core.plan import make_plan
from specfleet.core.settings import settings_from_dict
from tests.harness import HostSpec
from tests.unit.test_plan import DRAFTER_CONFIG, host_facts

HARNESS = Path(__file__).resolve().parents[1] / "harness"
STANDIN_DIR = "/opt/specfleet-standin"
TARGET, DRAFTER = "/srv/models/target", "/srv/models/drafter"
RECORD = "/run/standin-rules.json"
PROFILE = "b200x8"
RELEASES = ("0.5.11", "0.5.23")


def venv(release: str) -> str:
    return f"/opt/sg-{release}"


@pytest.fixture(scope="module")
def rules_host(make_fleet):
    fleet = make_fleet("rules", [HostSpec("r1", gpu=PROFILE, disk="8G")])
    pip = " ".join(fleet.pip_args())
    target = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
              "text_config": {"architectures": ["DeepseekV3ForCausalLM"], "kv_lora_rank": 512}}
    setup = " && ".join([
        *(f"python3 -m venv {venv(r)} && {venv(r)}/bin/pip install -q "
          f"--disable-pip-version-check --no-deps {pip} sglang=={r}" for r in RELEASES),
        f"mkdir -p {STANDIN_DIR} {TARGET} {DRAFTER}",
        f"echo {shlex.quote(json.dumps(target))} > {TARGET}/config.json",
        f"echo {shlex.quote(json.dumps(DRAFTER_CONFIG))} > {DRAFTER}/config.json",
        f"head -c 1048576 /dev/zero > {TARGET}/model-00001-of-00001.safetensors",
    ])  # fmt: skip
    res = fleet.run("r1", setup, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    for name in ("standin_sglang_server.py", "sglang_rules.py", "releases.py"):
        fleet.put("r1", HARNESS / name, f"{STANDIN_DIR}/{name}")
    return fleet


def plan_flags(release: str) -> list[str]:
    facts = host_facts(PROFILE, PROFILE, sglang=release)
    argv = make_plan(facts, settings_from_dict({"sglang": {"version": release}}),
                     DRAFTER_CONFIG, weights_bytes=1).argv[3:]  # fmt: skip
    argv[argv.index("--model-path") + 1] = TARGET
    argv[argv.index("--speculative-draft-model-path") + 1] = DRAFTER
    return argv


def start(fleet, release: str, flags: list[str]):
    """The stand-in as the unit starts it, exiting right after its checks; (result, record)."""
    argv = [f"{venv(release)}/bin/python", f"{STANDIN_DIR}/standin_sglang_server.py",
            "--standin-record", RECORD, "--standin-exit", "0", *flags]  # fmt: skip
    res = fleet.run("r1", f"rm -f {RECORD}; {shlex.join(argv)}", timeout=120)
    record = json.loads(fleet.run("r1", f"cat {RECORD}", check=True).stdout)
    return res, record["sglang_rules"]


def test_0_5_11_is_judged_on_a_no_deps_install(rules_host):
    flags = plan_flags("0.5.11")
    res, rules = start(rules_host, "0.5.11", flags)
    assert res.returncode == 0, res.stderr[-2000:]
    tree = f"{venv('0.5.11')}/lib/python3.11/site-packages/sglang"
    assert rules == {"tree": tree, "ran": True, "refusal": None, "why_not": None}, rules
    # The same plan with a flag 0.5.11 refuses under DFLASH: SGLang's own message, exit 1.
    res, rules = start(rules_host, "0.5.11", [*flags, "--enable-dp-attention", "--dp-size", "2"])
    refusal = "Currently DFLASH speculative decoding does not support dp attention."
    assert res.returncode == 1 and refusal in res.stderr, res.stderr[-2000:]
    assert rules["ran"] is True and rules["refusal"] == refusal, rules


def test_0_5_23_says_it_is_not_judged_without_msgspec(rules_host):
    short = plan_flags("0.5.23")
    short[short.index("--speculative-draft-window-size") + 1] = "4"  # refused where judged
    res, rules = start(rules_host, "0.5.23", short)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "standin: SGLang's rules not run on " in res.stderr, res.stderr[-2000:]
    assert rules["ran"] is False and rules["refusal"] is None, rules
    assert "No module named 'msgspec'" in rules["why_not"], rules
