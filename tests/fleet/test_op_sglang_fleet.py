"""operations.sglang on real Debian hosts (tests.fleet), with real SGLang wheels (--no-deps) from the
fleet's wheelhouse, driven by the pyinfra CLI exactly as a user runs it.

PR#20547 is this project's port onto 0.5.11 (specfleet/patchdata/pr20547/sglang-0.5.11/), a
recipe whose upstream text comes from ../shared/fixtures/sglang-pr20547/ (the PR head) and the
wheelhouse (the 0.5.11 and 0.5.14 wheels), given as patch.source mirrors, as a user's would be. "The wheel back" is checked against the wheel's own
RECORD hashes, on the host.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.harness import HostSpec
from tests.harness.port_build import build_dflash_rope, port_patch, port_settings
from tests.harness.sources import PR20547_DIR, sglang_wheel

REPO = Path(__file__).resolve().parents[2]
PYINFRA = str(Path(sys.executable).parent / "pyinfra")
DEPLOY = str(REPO / "tests" / "deploys" / "deploy_op_sglang.py")
SITE = "lib/python3.11/site-packages"
PR = port_settings()  # opted in; upstream text from the shared fixtures and the wheelhouse
# 0.5.11's DFlash v1 files the port leaves as released (dflash_utils.py takes 0.5.14's verify-mask
# policy, which v1 reads too, as in 0.5.14).
V1_FILES = ("dflash_worker.py", "dflash_info.py")


def port_id() -> str:
    """The marker the port writes: the sha256 of the one diff it applies."""
    patch = port_patch()
    return hashlib.sha256(patch.text.encode()).hexdigest()


# Run on a host: every file of the installed sglang against the wheel's RECORD, and files
# that are not in it (bytecode aside). Prints JSON {"changed": [...], "added": [...], "missing":
# [...]}.
RECORD_CHECK = r"""
import base64, csv, glob, hashlib, json, os, sys
site = sys.argv[1]
(dist,) = glob.glob(os.path.join(site, "sglang-*.dist-info"))
rec = {}
with open(os.path.join(dist, "RECORD"), newline="") as f:
    for row in csv.reader(f):
        if row[0].startswith("sglang/") and row[1].startswith("sha256="):
            rec[row[0]] = row[1].split("=", 1)[1]
out = {"changed": [], "added": [], "missing": []}
for path, want in sorted(rec.items()):
    try:
        data = open(os.path.join(site, path), "rb").read()
    except OSError:
        out["missing"].append(path)
        continue
    got = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode().rstrip("=")
    if got != want:
        out["changed"].append(path)
for root, dirs, files in os.walk(os.path.join(site, "sglang")):
    dirs[:] = [d for d in dirs if d != "__pycache__"]
    for name in files:
        rel = os.path.relpath(os.path.join(root, name), site)
        if rel not in rec:
            out["added"].append(rel)
print(json.dumps(out))
"""


def against_record(fleet, host: str, venv: str) -> dict:
    r = fleet.run(host, f"python3 -c {shlex.quote(RECORD_CHECK)} {venv}/{SITE}", check=True)
    return json.loads(r.stdout)


def sglang_fact(fleet, tmp_path, host: str, venv: str) -> dict:
    """facts.sglang.SGLangInstall on the host, through pyinfra's own fact CLI."""
    inv = fleet.write_inventory(tmp_path / f"fact_{time.monotonic_ns()}.py")
    r = subprocess.run(
        [PYINFRA, "--limit", host, str(inv), "fact", "facts.sglang.SGLangInstall",
         f"python={venv}/bin/python", "--json"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads(r.stdout)
    name = "facts.sglang.SGLangInstall"
    # pyinfra keys a fact with arguments as "NAME (arg=value)".
    return next(value for key, value in data.items() if key.startswith(name))[host]


# --- running pyinfra ------------------------------------------------------------------------------


def parse_results(output: str) -> dict[str, dict[str, str]]:
    """``--> Starting operation: NAME`` then ``[host] Success|No changes|Error`` lines."""
    results: dict[str, dict[str, str]] = {}
    current = None
    for line in output.splitlines():
        if m := re.match(r"^--> Starting operation: (.*?)\s*$", line):
            current = m.group(1)
            results.setdefault(current, {})
        elif current and (m := re.match(r"^\s+\[([\w-]+)\] (Success|No changes|Error)\b", line)):
            results[current][m.group(1)] = m.group(2)
    return results


def settings(
    fleet, venv: str, patch: dict | None = None, on_conflict: str | None = None, **over
) -> dict:
    data = {
        "venv": venv,
        "sglang": {
            "version": "0.5.11",
            "find_links": fleet.wheelhouse_url,
            "trusted_hosts": [fleet.bridge_ip],
            "no_deps": True,
            **over.pop("sglang", {}),
        },
        **over,
    }
    if patch:
        data["patch"] = dict(patch)
        if on_conflict:
            data["patch"]["on_conflict"] = on_conflict
    return data


class Run:
    def __init__(self, proc: subprocess.CompletedProcess, seconds: float):
        self.rc = proc.returncode
        self.output = proc.stdout + proc.stderr
        self.results = parse_results(self.output)
        self.seconds = seconds

    def status(self, op_prefix: str, host: str) -> str | None:
        for name, hosts in self.results.items():
            # ensure_software is a @deploy: its operations are named "SGLang software | <op>".
            if name.split(" | ")[-1].startswith(op_prefix):
                return hosts.get(host)
        return None


def deploy(fleet, tmp_path, host: str, data: dict, *flags: str, test: dict | None = None) -> Run:
    inv = fleet.write_inventory(
        tmp_path / f"inventory_{time.monotonic_ns()}.py",
        host_data={host: {"specfleet": data, **({"sglang_test": test} if test else {})}},
    )
    start = time.monotonic()
    proc = subprocess.run(
        [PYINFRA, *(flags or ("-y",)), "--limit", host, str(inv), DEPLOY],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    return Run(proc, time.monotonic() - start)


def tree_sha(fleet, host: str, venv: str, sources_only: bool = False) -> str:
    """The sha256 of every file of the installed package (bytes and paths)."""
    skip = "-not -name '*.pyc' " if sources_only else ""
    r = fleet.run(
        host,
        f"cd {shlex.quote(venv)}/{SITE} && find sglang -type f {skip}-print0 | sort -z "
        "| xargs -0 sha256sum | sha256sum",
        check=True,
    )
    return r.stdout.split()[0]


def pip_versions(fleet, host: str, venv: str) -> dict[str, str]:
    r = fleet.run(host, f"{venv}/bin/python -m pip list --format=freeze", check=True)
    return dict(line.split("==", 1) for line in r.stdout.split() if "==" in line)


def exists(fleet, host: str, path: str) -> bool:
    return fleet.run(host, f"test -e {shlex.quote(path)}").returncode == 0


# --- fixtures -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sw(make_fleet):
    return make_fleet("software", [HostSpec("h1", disk="4G"), HostSpec("h2", disk="4G")])


def install_only(fleet, tmp_path, host, venv) -> Run:
    run = deploy(fleet, tmp_path, host, settings(fleet, venv), test={"ops": ["installed"]})
    assert run.rc == 0, run.output
    return run


# --- tests ----------------------------------------------------------------------------------------


def test_fresh_host_converges_with_the_port_then_changes_nothing(sw, tmp_path):
    venv = "/opt/specfleet/sglang"
    data = settings(sw, venv, PR)

    first = deploy(sw, tmp_path, "h1", data)
    assert first.rc == 0, first.output
    for op in ("SGLang 0.5.11 installed", "compressed-tensors pinned", "PR#20547"):
        assert first.status(op, "h1") == "Success", (op, first.output)
    assert "SGLang 0.5.11: applies the PR#20547 port for SGLang 0.5.11" in first.output
    print(f"timing: {'fresh converge (venv + sglang + c-t + port)'}: {first.seconds:.1f}s")

    versions = pip_versions(sw, "h1", venv)
    assert versions["sglang"] == "0.5.11"
    assert versions["compressed-tensors"] == "0.18.0"
    # The v2 worker is wired in (compiles, its sglang imports resolve, routed, overlap allowed).
    fact = sglang_fact(sw, tmp_path, "h1", venv)
    assert fact["features"]["dflash"] == "v2" and fact["features"]["dflash_pr20547"] is True
    assert "dflash_v2_missing" not in fact["features"]
    diff = against_record(sw, "h1", venv)
    assert not diff["missing"]
    assert not [p for p in diff["changed"] if p.rsplit("/", 1)[-1] in V1_FILES]  # v1 untouched
    assert "sglang/srt/speculative/dflash_worker_v2.py" in diff["added"]
    # The drafter RoPE patch (#52) beside the port: models/dflash.py is 0.5.14's reading, marked.
    assert first.status("DFlash drafter RoPE", "h1") == "Success", first.output
    assert "sglang/srt/models/dflash.py" in diff["changed"]
    rope = sw.run("h1", f"cat {venv}/lib/python3.11/site-packages/sglang/srt/models/dflash.py",
                  check=True).stdout  # fmt: skip
    assert rope == build_dflash_rope()["sglang/srt/models/dflash.py"]
    assert exists(sw, "h1", f"{venv}/.specfleet/dflash-rope/sha256")
    stray = sw.run(
        "h1", f"find {venv} -xdev \\( -name '*.orig' -o -name '*.rej' \\) -print", check=True
    ).stdout
    assert stray == ""

    second = deploy(sw, tmp_path, "h1", data)
    assert second.rc == 0, second.output
    for op in ("SGLang 0.5.11 installed", "compressed-tensors pinned", "PR#20547",
               "DFlash drafter RoPE"):
        assert second.status(op, "h1") == "No changes", (op, second.output)
    print(f"timing: {'second run (no changes)'}: {second.seconds:.1f}s")


def test_port_is_idempotent_and_removal_gives_the_wheel_back(sw, tmp_path):
    venv = "/opt/sf-patch"
    install_only(sw, tmp_path, "h1", venv)
    assert against_record(sw, "h1", venv) == {"changed": [], "added": [], "missing": []}
    data = settings(sw, venv, PR)
    only = {"ops": ["pr20547"]}

    applied = deploy(sw, tmp_path, "h1", data, test=only)
    assert applied.rc == 0 and applied.status("sglang.pr20547", "h1") == "Success", applied.output
    print(f"timing: {'apply the port'}: {applied.seconds:.1f}s")
    patched = tree_sha(sw, "h1", venv)
    marker = sw.run("h1", f"cat {venv}/.specfleet/pr20547/sha256", check=True).stdout.strip()
    assert marker == port_id()

    again = deploy(sw, tmp_path, "h1", data, test=only)
    assert again.status("sglang.pr20547", "h1") == "No changes", again.output
    assert f"PR#20547 port {marker[:12]} is applied" in again.output or again.rc == 0
    assert tree_sha(sw, "h1", venv) == patched

    revert = {"ops": ["pr20547"], "pr20547_present": False}
    removed = deploy(sw, tmp_path, "h1", data, test=revert)
    assert removed.rc == 0 and removed.status("sglang.pr20547", "h1") == "Success", removed.output
    assert against_record(sw, "h1", venv) == {"changed": [], "added": [], "missing": []}
    assert not exists(sw, "h1", f"{venv}/.specfleet/pr20547")
    gone = deploy(sw, tmp_path, "h1", data, test=revert)
    assert gone.status("sglang.pr20547", "h1") == "No changes", gone.output


def venv_sha(fleet, host: str, venv: str) -> str:
    """Every file of a whole venv, bytes and paths."""
    r = fleet.run(
        host, f"cd {shlex.quote(venv)} && find . -type f -print0 | sort -z | xargs -0 sha256sum "
        "| sha256sum", check=True,
    )  # fmt: skip
    return r.stdout.split()[0]


def test_side_by_side_switch_to_0514_and_back_keeps_the_old_venv(sw, tmp_path):
    venv = "/root/venv_sf211"
    sibling = f"{venv}-sglang-0.5.14"
    ops = {"ops": ["installed", "compressed_tensors", "pr20547"]}
    side = {"side_by_side": True}
    first = deploy(sw, tmp_path, "h2", settings(sw, venv, PR, sglang=side), test=ops)
    assert first.rc == 0, first.output
    old = venv_sha(sw, "h2", venv)

    up = deploy(sw, tmp_path, "h2", settings(sw, venv, PR, sglang={"version": "0.5.14", **side}),
                test=ops)  # fmt: skip
    assert up.rc == 0, up.output
    assert f"{venv} holds SGLang 0.5.11: SGLang 0.5.14 goes into {sibling} beside it" in up.output
    assert up.status("sglang.installed", "h2") == "Success"
    # 0.5.14 has its v2 worker built in: nothing to port.
    assert up.status("sglang.pr20547", "h2") == "No changes", up.output
    assert pip_versions(sw, "h2", sibling)["sglang"] == "0.5.14"
    assert venv_sha(sw, "h2", venv) == old
    settled = deploy(sw, tmp_path, "h2",
                     settings(sw, venv, PR, sglang={"version": "0.5.14", **side}),
                     test=ops)  # fmt: skip
    assert settled.rc == 0, settled.output
    assert all(settled.status(op, "h2") == "No changes"
               for op in ("sglang.installed", "sglang.compressed_tensors", "sglang.pr20547"))

    back = deploy(sw, tmp_path, "h2", settings(sw, venv, PR, sglang=side), test=ops)
    assert back.rc == 0, back.output
    assert all(back.status(op, "h2") == "No changes"
               for op in ("sglang.installed", "sglang.compressed_tensors", "sglang.pr20547"))
    assert venv_sha(sw, "h2", venv) == old
    assert pip_versions(sw, "h2", sibling)["sglang"] == "0.5.14"  # kept for the next switch


def test_in_place_upgrade_removes_the_port_first(sw, tmp_path):
    venv = "/opt/sf-upgrade"
    ops = {"ops": ["installed", "pr20547"]}
    first = deploy(sw, tmp_path, "h2", settings(sw, venv, PR), test=ops)
    assert first.rc == 0, first.output
    assert exists(sw, "h2", f"{venv}/.specfleet/pr20547/sha256")

    data = settings(sw, venv, PR, sglang={"version": "0.5.14", "side_by_side": False})
    up = deploy(sw, tmp_path, "h2", data, test=ops)
    assert up.rc == 0, up.output
    assert "removes PR#20547 from the current SGLang first" in up.output
    assert up.status("sglang.installed", "h2") == "Success"
    assert up.status("sglang.pr20547", "h2") == "No changes", up.output
    assert pip_versions(sw, "h2", venv)["sglang"] == "0.5.14"
    assert not exists(sw, "h2", f"{venv}/.specfleet/pr20547")
    assert against_record(sw, "h2", venv) == {"changed": [], "added": [], "missing": []}


def test_reinstall_under_the_port_then_uninstall(sw, tmp_path):
    """pip reinstalls SGLang behind our back: the marker's files changed, the worker the port
    added is left over (not in RECORD). The op forgets the marker and applies again.
    Uninstalling SGLang removes the port first."""
    venv = "/opt/sf-stale"
    data = settings(sw, venv, PR)
    ops = {"ops": ["installed", "pr20547"]}
    first = deploy(sw, tmp_path, "h1", data, test=ops)
    assert first.rc == 0, first.output
    # Sources only: a reinstall recompiles the .pyc files, with new timestamps inside.
    patched = tree_sha(sw, "h1", venv, sources_only=True)
    pip = " ".join(shlex.quote(a) for a in sw.pip_args())
    sw.run(
        "h1",
        f"{venv}/bin/pip install -q --no-deps --force-reinstall {pip} sglang==0.5.11",
        check=True,
        timeout=600,
    )
    worker = f"{venv}/{SITE}/sglang/srt/speculative/dflash_worker_v2.py"
    assert exists(sw, "h1", worker)  # the leftover

    again = deploy(sw, tmp_path, "h1", data, test=ops)
    assert again.rc == 0, again.output
    assert "no longer matches the files on disk" in again.output
    assert again.status("sglang.installed", "h1") == "No changes"
    assert again.status("sglang.pr20547", "h1") == "Success", again.output
    assert tree_sha(sw, "h1", venv, sources_only=True) == patched
    settled = deploy(sw, tmp_path, "h1", data, test=ops)
    assert settled.status("sglang.pr20547", "h1") == "No changes", settled.output

    gone = deploy(sw, tmp_path, "h1", data, test={"ops": ["installed"], "installed_present": False})
    assert gone.rc == 0 and gone.status("sglang.installed", "h1") == "Success", gone.output
    assert "sglang" not in pip_versions(sw, "h1", venv)
    assert not exists(sw, "h1", worker) and not exists(sw, "h1", f"{venv}/.specfleet/pr20547")
    none = deploy(sw, tmp_path, "h1", data, test={"ops": ["installed"], "installed_present": False})
    assert none.status("sglang.installed", "h1") == "No changes", none.output


def test_existing_venv_is_reused_and_compressed_tensors_moves_into_range(sw, tmp_path):
    venv = "/root/venv_sglang211"
    pip = " ".join(shlex.quote(a) for a in sw.pip_args())
    sw.run(
        "h2",
        f"rm -rf {venv} && python3 -m venv {venv} && {venv}/bin/pip install -q --no-deps {pip} "
        f"sglang==0.5.11 compressed-tensors==0.9.4 && echo keep > {venv}/SENTINEL",
        check=True,
        timeout=600,
    )
    inode = sw.run("h2", f"stat -c %i {venv}/bin/python3 {venv}/pyvenv.cfg", check=True).stdout
    data = settings(sw, venv)
    ops = {"ops": ["installed", "compressed_tensors"]}

    run = deploy(sw, tmp_path, "h2", data, test=ops)
    assert run.rc == 0, run.output
    assert run.status("sglang.installed", "h2") == "No changes"
    assert run.status("sglang.compressed_tensors", "h2") == "Success"
    assert "compressed-tensors 0.9.4 is outside" in run.output
    print(f"timing: {'compressed-tensors 0.9.4 -> in range'}: {run.seconds:.1f}s")
    assert pip_versions(sw, "h2", venv)["compressed-tensors"] == "0.18.0"
    assert sw.run("h2", f"cat {venv}/SENTINEL").stdout.strip() == "keep"
    assert sw.run("h2", f"stat -c %i {venv}/bin/python3 {venv}/pyvenv.cfg").stdout == inode

    again = deploy(sw, tmp_path, "h2", data, test=ops)
    assert again.status("sglang.installed", "h2") == "No changes", again.output
    assert again.status("sglang.compressed_tensors", "h2") == "No changes", again.output


def test_no_port_for_a_changed_tree_keeps_v1_or_fails_and_changes_nothing(sw, tmp_path):
    venv = "/opt/sf-conflict"
    install_only(sw, tmp_path, "h2", venv)
    spec_info = f"{venv}/{SITE}/sglang/srt/speculative/spec_info.py"
    sw.run("h2", f"echo '# a local edit' >> {spec_info}", check=True)
    before = tree_sha(sw, "h2", venv)
    only = {"ops": ["pr20547"]}

    keep = deploy(sw, tmp_path, "h2", settings(sw, venv, PR), test=only)
    assert keep.rc == 0, keep.output
    assert keep.status("sglang.pr20547", "h2") == "No changes"
    line = next(ln for ln in keep.output.splitlines() if "keeps DFLASH v1" in ln)
    assert "no port for this tree: 1 file(s) differ from the SGLang 0.5.11 wheel" in line
    assert "sglang/srt/speculative/spec_info.py" in line and "fix: reinstall sglang==0.5.11" in line
    assert tree_sha(sw, "h2", venv) == before
    assert not exists(sw, "h2", f"{venv}/.specfleet/pr20547")

    fail = deploy(sw, tmp_path, "h2", settings(sw, venv, PR, on_conflict="fail"), test=only)
    assert fail.rc != 0
    assert fail.status("sglang.pr20547", "h2") == "Error", fail.output
    assert "no port for this tree" in fail.output and "fix: reinstall sglang==0.5.11" in fail.output
    assert "Traceback" not in fail.output
    assert tree_sha(sw, "h2", venv) == before


def test_without_opting_in_v1_is_kept_and_said_at_normal_verbosity(sw, tmp_path):
    venv = "/opt/sf-conflict"
    run = deploy(sw, tmp_path, "h2", settings(sw, venv), test={"ops": ["pr20547"]})
    assert run.rc == 0 and run.status("sglang.pr20547", "h2") == "No changes", run.output
    assert "SGLang 0.5.11 keeps DFLASH v1 with overlap off: PR#20547 is not opted in" in run.output
    assert "(fix: set sglang.version >= 0.5.14" in run.output


def test_an_upstream_source_that_fails_its_hash_fails_the_host_before_anything_changes(
    sw, tmp_path
):
    venv = "/opt/sf-sha"
    install_only(sw, tmp_path, "h2", venv)
    before = tree_sha(sw, "h2", venv)
    # A mirror whose 0.5.11 wheel is not the one the recipe pins (one byte changed).
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    wheel = sglang_wheel("0.5.11")
    data = bytearray(wheel.read_bytes())
    data[-1] ^= 1
    (mirror / wheel.name).write_bytes(bytes(data))
    bad = {**PR, "source": [str(mirror), str(PR20547_DIR)]}
    for flags in (("-y",), ("--dry",)):
        run = deploy(
            sw, tmp_path, "h2", settings(sw, venv, bad), *flags, test={"ops": ["pr20547"]}
        )
        assert run.rc != 0, run.output
        assert f"{mirror / wheel.name} has sha256" in run.output
        assert "the port's recipe pins fe0748beaff2" in run.output
        assert f"fix: point patch.source at a folder holding the real {wheel.name}" in run.output
        assert "Traceback" not in run.output
    assert tree_sha(sw, "h2", venv) == before


def test_dry_run_on_a_fresh_host_says_what_and_why(sw, tmp_path):
    venv = "/opt/sf-dry"
    run = deploy(sw, tmp_path, "h2", settings(sw, venv, PR), "--dry")
    assert run.rc == 0, run.output
    assert f"would: creates venv {venv} with python3" in run.output
    assert "would: SGLang is not installed; installs SGLang 0.5.11" in run.output
    assert "would: compressed-tensors is not installed; SGLang 0.5.11 needs" in run.output
    assert ("would: SGLang 0.5.11 (to be installed): applies the PR#20547 port for SGLang 0.5.11"
            in run.output)  # fmt: skip
    assert "\n+class " not in run.output and "@@ -" not in run.output  # no patch text
    assert not exists(sw, "h2", venv)


TINY_BACKEND = '''\
"""A PEP 517 backend in the tree, so that a build needs nothing from an index."""
import base64, hashlib, os, zipfile

NAME, VERSION = "sglang", open(os.path.join(os.path.dirname(__file__), "VERSION")).read().strip()
DIST = f"{NAME}-{VERSION}"


def _files():
    for root, _, names in os.walk("sglang"):
        for n in sorted(names):
            if not n.endswith(".pyc"):
                yield os.path.join(root, n)


def _record(z, name, data):
    z.writestr(name, data)
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    path = os.path.join(wheel_directory, f"{DIST}-py3-none-any.whl")
    with zipfile.ZipFile(path, "w") as z:
        rec = [_record(z, f, open(f, "rb").read()) for f in _files()]
        info = f"{DIST}.dist-info"
        rec.append(_record(z, f"{info}/METADATA",
                           f"Metadata-Version: 2.1\\nName: {NAME}\\nVersion: {VERSION}\\n".encode()))
        rec.append(_record(z, f"{info}/WHEEL",
                           b"Wheel-Version: 1.0\\nGenerator: tiny\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"))
        rec.append(f"{info}/RECORD,,")
        z.writestr(f"{info}/RECORD", "\\n".join(rec) + "\\n")
    return os.path.basename(path)


def get_requires_for_build_wheel(config_settings=None):
    return []
'''


def test_git_install_keys_on_the_commit(sw, tmp_path):
    """A local bare repository holding a tiny package named sglang under python/, like SGLang's."""
    venv = "/opt/sf-git"
    repo, work = "/srv/git/sglang.git", "/srv/git/work"
    pyproject = (
        '[build-system]\nrequires = []\nbuild-backend = "tiny_backend"\nbackend-path = ["."]\n'
    )
    sw.run("h1", f"rm -rf /srv/git {venv} && mkdir -p {work}/python/sglang", check=True)
    files = {
        f"{work}/python/pyproject.toml": pyproject,
        f"{work}/python/tiny_backend.py": TINY_BACKEND,
        f"{work}/python/VERSION": "0.5.11.dev1\n",
        f"{work}/python/sglang/__init__.py": "__version__ = '0.5.11.dev1'\n",
    }
    for path, text in files.items():
        sw.run("h1", f"cat > {shlex.quote(path)}", input=text, check=True)
    git = f"git -C {work} -c user.name=t -c user.email=t@t"
    sw.run(
        "h1",
        f"git init -q --bare -b main {repo} && git init -q -b main {work} && {git} add -A && "
        f"{git} commit -q -m one && {git} push -q {repo} main",
        check=True,
    )
    first = sw.run("h1", f"git -C {work} rev-parse HEAD", check=True).stdout.strip()
    data = settings(
        sw,
        venv,
        sglang={
            "kind": "git",
            "git_url": f"git+file://{repo}#subdirectory=python",
            "git_ref": "main",
        },
    )
    ops = {"ops": ["installed"]}

    run = deploy(sw, tmp_path, "h1", data, test=ops)
    assert run.rc == 0 and run.status("sglang.installed", "h1") == "Success", run.output
    print(f"timing: {'git install (tiny package)'}: {run.seconds:.1f}s")
    direct = sw.run(
        "h1", f"cat {venv}/{SITE}/sglang-0.5.11.dev1.dist-info/direct_url.json", check=True
    ).stdout
    assert first in direct

    again = deploy(sw, tmp_path, "h1", data, test=ops)
    assert again.status("sglang.installed", "h1") == "No changes", again.output

    # A new commit on the branch, same version string: the commit is the key, so it reinstalls.
    sw.run(
        "h1",
        f"echo '# two' >> {work}/python/sglang/__init__.py && {git} commit -q -am two && "
        f"{git} push -q {repo} main",
        check=True,
    )
    second = sw.run("h1", f"git -C {work} rev-parse HEAD", check=True).stdout.strip()
    moved = deploy(sw, tmp_path, "h1", data, test=ops)
    assert moved.status("sglang.installed", "h1") == "Success", moved.output
    direct = sw.run(
        "h1", f"cat {venv}/{SITE}/sglang-0.5.11.dev1.dist-info/direct_url.json", check=True
    ).stdout
    assert second in direct and first not in direct
    settled = deploy(sw, tmp_path, "h1", data, test=ops)
    assert settled.status("sglang.installed", "h1") == "No changes", settled.output

    data["sglang"]["git_ref"] = "no-such-branch"
    wrong = deploy(sw, tmp_path, "h1", data, test=ops)
    assert wrong.rc != 0 and wrong.status("sglang.installed", "h1") == "Error", wrong.output
    assert f"git ref 'no-such-branch' is not in file://{repo}" in wrong.output
    assert "Traceback" not in wrong.output
    assert (
        second
        in sw.run(
            "h1", f"cat {venv}/{SITE}/sglang-0.5.11.dev1.dist-info/direct_url.json", check=True
        ).stdout
    )


# --- an existing venv changed in place -----------------------------------------------------------

FAKE = "/root/fakewheels"


def _put_fake_wheels(fleet, host: str, tmp_path) -> None:
    """tests/harness/fake_wheels.py's stand-ins (SGLang pinning torch and sgl-kernel) on the host,
    as a find-links folder."""
    from tests.harness.fake_wheels import build_upgrade_wheels

    fleet.run(host, f"rm -rf {FAKE} && mkdir -p {FAKE}", check=True)
    for wheel in build_upgrade_wheels(tmp_path / "fakewheels"):
        fleet.put(host, wheel, f"{FAKE}/{wheel.name}")


def _in_place(venv: str, version: str, **sglang) -> dict:
    return {"venv": venv, "sglang": {"version": version, "find_links": FAKE, "no_deps": False,
                                     "side_by_side": False, **sglang}}


def test_an_in_place_upgrade_never_replaces_torch_in_a_venv_it_did_not_create(sw, tmp_path):
    """A hand-made venv (SGLang 0.5.11, torch 2.8.0, sgl-kernel 0.3.9), upgraded in place to an
    SGLang that pins torch 2.9.1: pip's dry run on the host says so; --dry and the run refuse,
    naming the host, the venv, each package (from -> to) and the fix, and change nothing; with
    sglang.allow_replacing it goes ahead and says what else moved. A venv specfleet created
    (its marker) may change, and the run says how."""
    from tests.harness.fake_wheels import BEFORE

    _put_fake_wheels(sw, "h1", tmp_path)
    venv = "/root/venv_handmade"
    sw.run("h1", f"rm -rf {venv} && python3 -m venv {venv} && {venv}/bin/pip install -q "
                 f"--no-index --find-links {FAKE} {' '.join(BEFORE)}", check=True, timeout=600)
    before = pip_versions(sw, "h1", venv)
    ops = {"ops": ["installed"]}
    refused = ("installing sglang==0.5.14 into /root/venv_handmade, a venv specfleet did not "
               "create, would replace sgl-kernel 0.3.9 -> 0.3.16, torch 2.8.0 -> 2.9.1 (pip's dry "
               "run on the host); nothing was changed")
    fix = "sglang.allow_replacing: ['sgl-kernel', 'torch']"

    dry = deploy(sw, tmp_path, "h1", _in_place(venv, "0.5.14"), "--dry", test=ops)
    assert dry.rc != 0, dry.output
    assert f"[h1] {refused}" in dry.output and fix in dry.output, dry.output[-3000:]
    run = deploy(sw, tmp_path, "h1", _in_place(venv, "0.5.14"), test=ops)
    assert run.rc != 0 and refused in run.output and fix in run.output, run.output[-3000:]
    assert "Traceback" not in run.output
    assert pip_versions(sw, "h1", venv) == before

    allowed = _in_place(venv, "0.5.14", allow_replacing=["torch", "sgl-*"])
    dry = deploy(sw, tmp_path, "h1", allowed, "--dry", test=ops)
    said = (f"pip also changes {venv}: replaces sgl-kernel 0.3.9 -> 0.3.16, torch 2.8.0 -> "
            "2.9.1; adds newdep 1.0")
    assert dry.rc == 0 and said in dry.output, dry.output[-3000:]
    assert pip_versions(sw, "h1", venv) == before
    run = deploy(sw, tmp_path, "h1", allowed, test=ops)
    assert run.rc == 0, run.output[-3000:]
    after = pip_versions(sw, "h1", venv)
    assert (after["sglang"], after["torch"], after["sgl-kernel"]) == ("0.5.14", "2.9.1", "0.3.16")

    # A venv this op creates is marked as specfleet's: an upgrade in it may move torch.
    ours = "/opt/sf-ours"
    sw.run("h1", f"rm -rf {ours}", check=True)
    made = deploy(sw, tmp_path, "h1", _in_place(ours, "0.5.11"), test=ops)
    assert made.rc == 0, made.output[-3000:]
    assert exists(sw, "h1", f"{ours}/.specfleet/created-by-specfleet")
    up = deploy(sw, tmp_path, "h1", _in_place(ours, "0.5.14"), test=ops)
    assert up.rc == 0, up.output[-3000:]
    assert f"pip also changes {ours}: replaces sgl-kernel 0.3.9 -> 0.3.16, torch 2.8.0" in (
        up.output)
    assert pip_versions(sw, "h1", ours)["torch"] == "2.9.1"
