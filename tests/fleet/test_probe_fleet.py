"""The readiness gate's correctness probe and the rollout's speed gate on real hosts (the demo's
stand-ins, tests/demo.py; the stand-in server runs from the host's SGLang venv, so it sees the
tree the deploy installed).

- The CT200-like host given the PR#20547 port without its verify-mask fix (tests.demo's
  ``stale_mask_port``: 0.5.11, triton, CUDA graphs: a stale verify mask): the gate fails on the
  answers, the port is rolled back, v1 serves and passes, and a second run changes nothing.
- A user's probe file replaces the default questions; a malformed one is a settings error.
- A rollout with --speed-gate holds back a host whose stand-in was made slow, rolls it back and
  counts it; without the option the same change goes through as today.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.demo import DEMO_TOKEN, REPO_ROOT, TEST_ENV, stale_mask_port, up
from tests.harness import HostSpec
from tests.harness.sources import PR20547_TARBALL

pytestmark = pytest.mark.timeout(2400)

HOSTS = [
    HostSpec("ct200", gpu="rtx6000x8", disk="593G"),
    HostSpec("g1", gpu="h200x2", disk="64G"),
    HostSpec("g2", gpu="h200x2", disk="64G"),
]
UNIT = "specfleet-sglang.service"
PATCH_DIR = "/root/venv_sglang211/.specfleet/pr20547"
# Loading takes no time on the stand-in: the gate's own overhead is what is left.
GATE_TIME = re.compile(r"probe passed in ([0-9.]+) s")


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    d = up(f"gateprobe-{os.getpid()}"[:31], HOSTS, tmp_path_factory.mktemp("gateprobe"))
    try:
        yield d
    finally:
        d.down()


def deploy(demo, name: str, *hosts: str, **per_host_over) -> tuple[int, str]:
    inv = demo.write_inventory(demo.workdir / f"{name}.py", **per_host_over)
    limit = [a for h in hosts for a in ("--limit", h)]
    res = demo.pyinfra("-y", *limit, inventory=inv)
    return res.returncode, res.stdout + res.stderr


def changed_ops(out: str) -> list[str]:
    return re.findall(r"\[\S+\] (?:Success|Changed).*", out)


def test_ct200_with_the_port_less_its_mask_fix_fails_on_the_answers_and_goes_back_to_v1(demo):
    assert PR20547_TARBALL.is_file()
    broken = stale_mask_port(demo.workdir)
    rc, out = deploy(demo, "ct200-1", "ct200", ct200=broken)
    assert rc != 0, out[-3000:]
    assert "applies the PR#20547 port for SGLang 0.5.11" in out
    assert "the correctness probe" in out and "0/8 answers right (need 7)" in out, out[-3000:]
    assert "SUSPICIOUS: every draft token was accepted" in out
    assert "mean acceptance length 8.00" in out
    assert "rolled back the PR#20547 port applied in this run" in out
    assert "Traceback" not in out
    assert demo.fleet.run("ct200", f"test -e {PATCH_DIR}.rejected && echo yes").stdout.strip() \
        == "yes"

    rc, out = deploy(demo, "ct200-2", "ct200", ct200=broken)
    assert rc == 0, out[-3000:]
    assert "failed the readiness gate on this host and was rolled back" in out
    assert "8/8 answers right" in out
    env = demo.fleet.run("ct200", "cat /etc/specfleet/specfleet-sglang.env").stdout
    assert "SGLANG_ENABLE_DFLASH_SPEC_V2" not in env
    seconds = [float(x) for x in GATE_TIME.findall(out)]
    assert seconds and max(seconds) <= 10.0, seconds
    print(f"probe on a healthy gate (ct200, v1): {max(seconds):.1f} s")

    rc, out = deploy(demo, "ct200-3", "ct200", ct200=broken)
    assert rc == 0, out[-3000:]
    assert "No changes" in out and "Changed" not in " ".join(changed_ops(out)), out[-3000:]


def test_a_users_probe_file_replaces_the_defaults_and_a_bad_one_is_a_settings_error(demo):
    mine = demo.workdir / "probe.json"
    mine.write_text(json.dumps({
        "questions": [{"prompt": "What is 6 * 7? Answer with the number only.",
                       "answer": r"\b42\b"},
                      {"prompt": "What is the capital of Japan? Answer with one word.",
                       "answer": "Tokyo"},
                      {"prompt": "What colour is the sky on a clear day? Answer with one word.",
                       "answer": "blue"}],
        "min_correct": 3, "min_accept_length": 1.5}))
    rc, out = deploy(demo, "g1-probe", "g1", g1={"probe": {"file": str(mine)}})
    assert rc == 0, out[-3000:]
    assert "probing 3 questions" in out and "3/3 answers right (need 3)" in out
    seconds = [float(x) for x in GATE_TIME.findall(out)]
    assert seconds and max(seconds) <= 10.0, seconds

    bad = demo.workdir / "bad-probe.json"
    bad.write_text('{"questions": [{"prompt": "x", "answer": "("}]}')
    rc, out = deploy(demo, "g1-bad", "g1", g1={"probe": {"file": str(bad)}})
    assert rc != 0
    assert f"probe file {bad}: key 'questions[0].answer' is '('" in out, out[-3000:]
    assert "expected a regular expression" in out and "fix:" in out, out[-3000:]
    assert "Traceback" not in out


def rollout(demo, name: str, *flags: str, **per_host_over) -> tuple[int, str, dict]:
    inv = demo.write_inventory(demo.workdir / f"{name}.py", **per_host_over)
    report = demo.workdir / f"{name}.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env["HF_TOKEN"] = DEMO_TOKEN
    env.update(TEST_ENV)
    res = subprocess.run(
        [sys.executable, "-m", "specfleet.cli", "rollout", str(inv), "deploys/kimi_k26.py",
         "--limit", "g1", "--limit", "g2", "--canary", "g1", "--max-fail-percent", "100",
         "--no-prefetch", "--report", str(report), *flags],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=1500,
    )
    data = json.loads(report.read_text()) if report.exists() else {}
    return res.returncode, res.stdout + res.stderr, data


def test_the_speed_gate_holds_back_a_host_made_slow_and_without_it_nothing_changes(demo):
    rc, out = deploy(demo, "g-base", "g1", "g2")
    assert rc == 0, out[-3000:]
    launcher = demo.settings("g2")["launcher"]
    slow = {"g2": {"launcher": [*launcher, "--standin-slowdown", "3"]},
            "g1": {"metrics": {"relay_port": 30092}}}  # g1 changes too, and keeps its speed
    rc, out, data = rollout(demo, "speed", "--speed-gate", "0.85", **slow)
    assert rc == 1, out[-4000:]
    hosts = data["hosts"]
    assert hosts["g2"]["status"] == "rolled back", hosts["g2"]
    assert any(w.startswith("speed gate: ") and "% of the earlier" in w
               for w in hosts["g2"]["why"]), hosts["g2"]["why"]
    assert hosts["g1"]["status"] == "changed", hosts["g1"]
    assert "--standin-slowdown" not in demo.fleet.run(
        "g2", f"systemctl cat {UNIT}").stdout  # back on its earlier unit
    # Without the option: the same slow change goes through, as today.
    rc, out, data = rollout(demo, "nospeed", **slow)
    assert rc == 0, out[-4000:]
    assert data["hosts"]["g2"]["status"] == "changed"
    assert "benchmarking" not in out
