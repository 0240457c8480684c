"""PR#20547's decision and detection on the real releases, with the real PR diff.

For each SGLang wheel (0.5.11 to 0.5.14, unpacked) the real host-side collector reads the tree and
the real parser says what it has; the decision table, fed the port verdict for that tree (its
files hashed here as facts.sglang.FileHashes hashes them on a host), says what a run does. Two
trees the old detection was fooled by: a 0.5.11 holding only the PR's files that apply cleanly
(a v2 worker nothing calls), and one where model_runner.py does not compile.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from operations.pr20547 import load_port
from specfleet.core.sglang.patch import filter_patch
from specfleet.core.sglang.pr20547.decision import APPLY, BUILT_IN, KEEP_V1, decide_pr20547
from specfleet.core.sglang.pr20547.portdata import no_port_verdict, port_verdict
from tests.harness.port_build import port_patch
from tests.harness.sources import PR20547_DIFF_SHA256, pr20547_diff, sglang_wheel
from tests.unit.test_facts_sglang import collect

# The PR's files that apply to 0.5.11 (shared/fixtures/sglang-pr20547/README.md).
CLEAN_ON_0511 = (
    "sglang/srt/environ.py", "sglang/srt/managers/schedule_batch.py",
    "sglang/srt/managers/scheduler.py", "sglang/srt/models/qwen3_next.py",
    "sglang/srt/speculative/dflash_info_v2.py", "sglang/srt/speculative/dflash_worker_v2.py",
)  # fmt: skip


@pytest.fixture(scope="module")
def trees(tmp_path_factory) -> dict[str, Path]:
    out = {}
    for version in ("0.5.11", "0.5.12", "0.5.13", "0.5.14"):
        site = tmp_path_factory.mktemp(f"site-{version}")
        with zipfile.ZipFile(sglang_wheel(version)) as wheel:
            wheel.extractall(site, [n for n in wheel.namelist() if n.startswith("sglang/")])
        out[version] = site
    return out


def hashes(site: Path, paths) -> dict[str, str | None]:
    return {
        p: hashlib.sha256((site / p).read_bytes()).hexdigest() if (site / p).is_file() else None
        for p in paths
    }


def decide(site: Path, version: str):
    install = collect(site)
    port = load_port(version)
    if port is None:
        verdict = no_port_verdict(version)
    else:
        patch = port_patch()
        verdict = port_verdict(
            port, version, PR20547_DIFF_SHA256, hashes(site, port.hashed_paths), patch.text
        )
    return install, decide_pr20547(install, None, present=True, opted_in=True, port=verdict)


@pytest.mark.local
@pytest.mark.parametrize(
    "version,dflash,row,words",
    [
        ("0.5.11", "v1", APPLY, "applies the PR#20547 port for SGLang 0.5.11"),
        ("0.5.12", "v1", KEEP_V1, "no port of PR#20547 for SGLang 0.5.12"),
        ("0.5.13", "v1", KEEP_V1, "no port of PR#20547 for SGLang 0.5.13"),
        ("0.5.14", "v2", BUILT_IN, "SGLang 0.5.14 has the DFlash v2 worker"),
    ],
)
def test_each_release(trees, version, dflash, row, words):
    install, decision = decide(trees[version], version)
    assert install["version"] == version
    assert install["features"]["dflash"] == dflash
    assert install["features"]["dflash_pr20547"] is False
    assert decision.row == row and words in decision.reason
    if row == KEEP_V1:
        assert decision.fix and "0.5.14" in decision.fix


@pytest.mark.local
def test_the_whole_pr_does_not_apply_to_any_release(trees):
    """The reason ports exist: GNU patch (no fuzz) refuses the real PR on each release."""
    text = filter_patch(pr20547_diff().decode()).text
    for version, site in trees.items():
        done = subprocess.run(
            ["patch", "--dry-run", "-p1", "--forward", "--batch", "--fuzz=0", "-d", str(site)],
            input=text, capture_output=True, text=True,
        )  # fmt: skip
        assert done.returncode != 0 and "FAILED" in done.stdout, version


def copy_tree(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


@pytest.mark.local
def test_0511_with_only_the_clean_files_is_v1(trees, tmp_path):
    site = copy_tree(trees["0.5.11"], tmp_path / "site")
    sections = pr20547_diff().decode().split("diff --git ")
    keep = [s for s in sections[1:] if s.split()[0][len("a/python/"):] in CLEAN_ON_0511]
    clean = filter_patch("".join("diff --git " + s for s in keep)).text
    # As a user would have it by hand: GNU patch with its default fuzz.
    subprocess.run(["patch", "-p1", "--forward", "--batch", "-d", str(site)], input=clean,
                   capture_output=True, text=True, check=True)  # fmt: skip
    assert (site / "sglang/srt/speculative/dflash_worker_v2.py").is_file()
    install, decision = decide(site, "0.5.11")
    features = install["features"]
    assert features["dflash"] == "v1" and features["dflash_pr20547"] is False
    missing = " | ".join(features["dflash_v2_missing"])
    assert "apply_dflash_verify_logits_adjustments" in missing
    assert "spec_info.py does not route DFLASH to DFlashWorkerV2" in missing
    assert "server_args.py still turns the overlap scheduler off for DFLASH" in missing
    # Its files are no longer the wheel's: no port for this tree, v1 is kept and said.
    assert decision.row == KEEP_V1 and "no port for this tree" in decision.reason


@pytest.mark.local
def test_0511_with_the_port_but_a_broken_model_runner_is_v1(trees, tmp_path):
    site = copy_tree(trees["0.5.11"], tmp_path / "site")
    patch = port_patch()
    subprocess.run(["patch", "-p1", "--forward", "--batch", "--fuzz=0", "-d", str(site)],
                   input=patch.text, capture_output=True, text=True, check=True)  # fmt: skip
    assert collect(site)["features"]["dflash_pr20547"] is True
    runner = site / "sglang/srt/model_executor/model_runner.py"
    runner.write_text(runner.read_text() + "\ndef broken(:\n")
    features = collect(site)["features"]
    assert features["dflash"] == "v1" and features["dflash_pr20547"] is False
    assert features["dflash_v2_missing"][0].startswith(
        "srt/model_executor/model_runner.py does not compile: "
    )
