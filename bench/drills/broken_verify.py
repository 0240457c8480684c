"""Drill: a server whose speculative verify is broken serves wrong tokens at full speed; the
readiness gate's correctness probe must catch it, the rollout must roll the host back and count
it against its batch.

    python -m bench.drills.broken_verify [--keep]      (as root, like bench/drills/run.py)

Self-contained: it boots a fleet of its own (tests/demo.py's CT200-like host, 8x RTX PRO 6000
with its own SGLang 0.5.11 venv, opted in to the PR#20547 port less its verify-mask fix through
the test-only ``patch.test_recipe`` (tests.demo's ``stale_mask_port``: a recipe made at test time
from the shipped one; 0.5.11 + the port + triton + CUDA graphs, the tree whose verify reads a
stale mask), then runs
``specfleet rollout`` of ``deploys/kimi_k26.py`` with ct200 as the canary. The stand-in server
runs from the host's venv and decides from that installed tree that its verify mask is stale.

The figures never ask specfleet:
- served_wrong: a watcher on the host asks the server a question every 0.3 s during the rollout
  (curl on the loopback) and counts answers that are not the right one;
- caught: the rollout's report names the correctness probe as the reason the canary failed;
- rolled_back: the port's files are gone from the venv (the v2 worker), every file of the wheel
  matches its RECORD, and the next deploy serves right answers on v1;
- counted: the rollout stopped on the failed canary (exit 2, "the canary ct200 failed").

One row, as bench/drills/run.py prints them, then

    drills: broken-verify served_wrong=N caught=0|1 rolled_back=0|1 counted=0|1 survived=0|1
        (commit C, DATE)

It is also a row of the suite (``python -m bench.drills.run``, ``drill_broken_verify``), where it
boots the same one-host fleet beside the suite's: the suite's hosts are H200s without the user's
own 0.5.11 venv that this host has.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.drills.kit import Drill, DrillFailed, Env
from bench.stamp import stamp, stamp_line
from tests.demo import DEMO_TOKEN, REPO_ROOT, TEST_ENV, stale_mask_port, up
from tests.harness import HostSpec
from tests.harness.sources import RECORD_CHECK

HOST = "ct200"
SITE = "/root/venv_sglang211/lib/python3.11/site-packages"
QUESTION = "What is 17 + 25? Answer with the number only."
ASK = ("curl -s --max-time 5 http://127.0.0.1:30000/v1/chat/completions -H "
       "'Content-Type: application/json' -d " + json.dumps(json.dumps({
           "messages": [{"role": "user", "content": QUESTION}], "temperature": 0,
           "max_tokens": 16, "chat_template_kwargs": {"thinking": False}})))


def ask(demo) -> bool | None:
    """Whether the server on the host answers the question right (None: no answer)."""
    out = demo.fleet.run(HOST, ASK, timeout=30).stdout
    try:
        content = json.loads(out)["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    return content.strip().split()[:1] == ["42"]


def watch(demo, stop: threading.Event, seen: dict[str, int]) -> None:
    """Ask the server on the host, all along: count right and wrong answers it gives."""
    while not stop.is_set():
        right = ask(demo)
        if right is not None:
            seen["right" if right else "wrong"] += 1
        stop.wait(0.3)


@dataclasses.dataclass
class Outcome:
    survived: bool
    detail: str
    figures: str  # the drill's own line: served_wrong=N caught=... survived=...
    outputs: list[str]  # every controller's output (the suite counts tracebacks in them)
    leaked: list[str]  # where the demo's HF token was seen (a controller's output, the journal)


def run_broken_verify(work: Path, keep: bool = False) -> Outcome:
    """Boot the CT200-like host (a fleet of its own: the suite's hosts are H200s without the
    user's 0.5.11 venv), give it the broken tree, roll it out and judge from the host."""
    os.environ.update(TEST_ENV)
    work.mkdir(parents=True, exist_ok=True)
    demo = up(f"drillbv-{os.getpid() % 100000}", [HostSpec(HOST, gpu="rtx6000x8", disk="593G")],
              work, owner_pid=None if keep else os.getpid())
    # The broken tree: this inventory (the rollout's and the next deploy's) gives ct200 the port
    # without its mask fix.
    demo.write_inventory(**{HOST: stale_mask_port(work)})
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env["HF_TOKEN"] = DEMO_TOKEN
    try:
        report = work / "rollout.json"
        seen = {"right": 0, "wrong": 0}
        stop = threading.Event()
        watcher = threading.Thread(target=watch, args=(demo, stop, seen), daemon=True)
        watcher.start()
        done = subprocess.run(
            [sys.executable, "-m", "specfleet.cli", "rollout", str(demo.inventory),
             "deploys/kimi_k26.py", "--no-prefetch", "--report", str(report)],
            cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=1500)
        stop.set()
        watcher.join()
        (work / "rollout.txt").write_text(done.stdout + done.stderr)
        data = json.loads(report.read_text()) if report.exists() else {"hosts": {}}
        host = data["hosts"].get(HOST, {})
        why = " ".join(host.get("why", []))
        caught = "correctness probe" in why and "answers right" in why
        counted = done.returncode == 2 and data.get("stopped") == f"the canary {HOST} failed"
        gone = demo.fleet.run(HOST, f"test -e {SITE}/sglang/srt/speculative/dflash_worker_v2.py"
                                    " || echo gone").stdout.strip() == "gone"
        record = demo.fleet.run(HOST, ["python3", "-c", RECORD_CHECK, SITE]).stdout.strip()
        again = demo.pyinfra("-y", "--limit", HOST)
        (work / "deploy-again.txt").write_text(again.stdout + again.stderr)
        on_v1 = again.returncode == 0 and ask(demo) is True
        outputs = [done.stdout + done.stderr, again.stdout + again.stderr]
        journal = demo.fleet.run(HOST, "journalctl --no-pager -o cat").stdout
        leaked = [where for where, text in (("the rollout's output", outputs[0]),
                                            ("the next deploy's output", outputs[1]),
                                            (f"{HOST}'s journal", journal))
                  if DEMO_TOKEN in text]
        rolled_back = gone and record == "record: ok" and host.get("status") == "rolled back" \
            and on_v1
        survived = seen["wrong"] > 0 and caught and rolled_back and counted \
            and not any("Traceback" in o for o in outputs) and not leaked
        detail = (f"served {seen['wrong']} wrong / {seen['right']} right answers to the watcher; "
                  f"gate: {why[:160]}; {record}; next deploy on v1 answers right: {on_v1}")
        figures = (f"served_wrong={seen['wrong']} caught={int(caught)} "
                   f"rolled_back={int(rolled_back)} counted={int(counted)} "
                   f"survived={int(survived)}")
        return Outcome(survived, detail, figures, outputs, leaked)
    finally:
        if keep:
            print(f"left running: python -m tests.fleet down --name {demo.fleet.name}")
        else:
            demo.down()


FAULT = ("the verify reads a stale mask (0.5.11 + the PR#20547 port less its mask fix + triton + "
         "CUDA graphs): wrong tokens, no crash")
CHECKED = ("wrong answers seen on the host, the gate's reason, the wheel's RECORD, the rollout's "
           "stop")


def drill_broken_verify(env: Env, d: Drill) -> None:
    """The suite's row (bench/drills/run.py registers it): this drill's own host and hub, its
    controllers' output counted with the suite's (tracebacks), the demo's token looked for in
    its outputs and the host's journal (leaks)."""
    outcome = run_broken_verify(env.work / "broken-verify")
    env.outputs.extend(outcome.outputs)
    if outcome.leaked:
        raise DrillFailed(f"the HF token leaked into {', '.join(outcome.leaked)}")
    if not outcome.survived:
        raise DrillFailed(f"{outcome.figures}: {outcome.detail}")
    d.detail = f"{outcome.figures}; {outcome.detail}"


BROKEN_VERIFY = Drill(
    "broken-verify", FAULT, f"{HOST} (a fleet of its own), rollout canary", CHECKED,
    drill_broken_verify, "6156700^ (a gate without the correctness probe): the stale mask's "
    "wrong answers at full speed pass it")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.drills.broken_verify",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--keep", action="store_true", help="leave the fleet up")
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    print(stamp_line("drills: broken-verify"), flush=True)
    outcome = run_broken_verify(Path(f"/var/tmp/specfleet-drill-broken-verify-{os.getpid()}"),
                                keep=a.keep)
    result = ("survived" if outcome.survived else "FAILED") + f" ({outcome.detail})"
    if outcome.leaked:
        result += f"; the HF token leaked into {', '.join(outcome.leaked)}"
    print("| drill | fault | where | checked | result | time |")
    print("|---|---|---|---|---|---|")
    print(f"| broken-verify | {FAULT} | {HOST}, rollout canary | {CHECKED} | {result} | "
          f"{time.monotonic() - t0:.0f}s |")
    print(f"drills: broken-verify {outcome.figures} ({stamp()})", flush=True)
    return 0 if outcome.survived else 1


if __name__ == "__main__":
    sys.exit(main())
