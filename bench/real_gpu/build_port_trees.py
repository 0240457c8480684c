"""Builds the two PR#20547-port trees the real-GPU run compares, as small tarballs of the files
the port touches (run here, before the run; the tarballs travel in the carried folder).

- ``port-unfixed.tar.gz``: SGLang 0.5.11's wheel with this project's PR#20547 port applied
  exactly as the deploy applies it (``operations.sglang_commands.load_port`` -> ``Port.patch``
  on the PR diff from ``../shared/fixtures/sglang-pr20547/``, GNU patch with the project's
  ``PATCH_OPTS``).
- ``port-fixed.tar.gz``: the same, plus the verify-mask fix as SGLang 0.5.14 has it:
  ``TritonAttnBackend`` in ``_DFLASH_VERIFY_SKIP_CUSTOM_MASK_BACKENDS``
  (``sglang/srt/speculative/dflash_utils.py``; 0.5.14's set is read from its wheel and checked).

Usage: python bench/real_gpu/build_port_trees.py WHEEL_0_5_11 WHEEL_0_5_14 OUTDIR
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from operations.sglang_commands import load_port  # noqa: E402
from specfleet.core.sglang.install import PATCH_OPTS  # noqa: E402
from tests.harness.sources import PR20547_DIFF  # noqa: E402

SKIP_SET = "_DFLASH_VERIFY_SKIP_CUSTOM_MASK_BACKENDS"
UTILS = "sglang/srt/speculative/dflash_utils.py"


def skip_set(text: str) -> set[str]:
    m = re.search(SKIP_SET + r" = frozenset\(\s*\{(.*?)\}", text, re.S)
    if not m:
        raise SystemExit(f"{SKIP_SET} not found")
    return set(re.findall(r'"(\w+)"', m.group(1)))


def main(wheel_511: str, wheel_514: str, outdir: str) -> None:
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    port = load_port("0.5.11")
    pr_text = PR20547_DIFF.read_text()
    patch = port.patch(pr_text)
    touched = sorted(set(patch.touched) | set(port.hashed_paths) | {UTILS})
    record = {"port": port.describe(), "pr_diff": str(PR20547_DIFF.name),
              "pr_diff_sha256": hashlib.sha256(PR20547_DIFF.read_bytes()).hexdigest(),
              "patch_sha256": hashlib.sha256(patch.text.encode()).hexdigest(), "files": touched}
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(wheel_511) as whl:
        site = Path(tmp)
        for name in whl.namelist():
            if name.startswith("sglang/"):
                whl.extract(name, site)
        res = subprocess.run(["patch", *PATCH_OPTS], input=patch.text, text=True, cwd=site,
                             capture_output=True)
        record["patch_output"] = res.stdout + res.stderr
        if res.returncode != 0:
            raise SystemExit(f"the port does not apply:\n{res.stdout}{res.stderr}")

        def tar(name: str) -> None:
            with tarfile.open(out / name, "w:gz") as t:
                for rel in touched:
                    if (site / rel).exists():
                        t.add(site / rel, arcname=rel)

        tar("port-unfixed.tar.gz")
        utils = site / UTILS
        before = utils.read_text()
        with zipfile.ZipFile(wheel_514) as w514:
            want = skip_set(w514.read(UTILS).decode())
        have = skip_set(before)
        if want - have != {"TritonAttnBackend"}:
            raise SystemExit(f"0.5.14 adds {sorted(want - have)} to the skip set, not triton only")
        anchor = '        "FlashAttentionBackend",\n'
        after = before.replace(anchor, anchor + '        "TritonAttnBackend",\n', 1)
        if skip_set(after) != want:
            raise SystemExit("the fix did not give 0.5.14's skip set")
        utils.write_text(after)
        tar("port-fixed.tar.gz")
        record["fix"] = {"file": UTILS, "skip_set_0_5_11": sorted(have),
                         "skip_set_0_5_14": sorted(want), "added": ["TritonAttnBackend"]}
    (out / "port-trees.json").write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps({k: v for k, v in record.items() if k != "patch_output"}, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:4])
