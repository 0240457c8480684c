"""operations.sglang on real Debian hosts (tests.fleet), with real SGLang wheels (--no-deps) from the
fleet's wheelhouse, driven by the pyinfra CLI exactly as a user runs it.

The PR#20547 diffs here are test-authored against the real 0.5.11 files (read from the wheel): the
real PR cannot be fetched here, and it is expected to conflict with 0.5.11 anyway.
"""

from __future__ import annotations

import difflib
import hashlib
import re
import shlex
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from tests.harness import HostSpec
from tests.harness.wheelhouse import WHEELHOUSE_DIR

REPO = Path(__file__).resolve().parents[2]
PYINFRA = str(Path(sys.executable).parent / "pyinfra")
DEPLOY = str(REPO / "tests" / "deploys" / "deploy_op_sglang.py")
SITE = "lib/python3.11/site-packages"
ENVIRON = "python/sglang/srt/environ.py"
WORKER = "python/sglang/srt/speculative/dflash_worker_v2.py"


# --- the test-authored patches --------------------------------------------------------------------


def real_environ() -> str:
    wheel = next(WHEELHOUSE_DIR.glob("sglang-0.5.11-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        return z.read("sglang/srt/environ.py").decode()


def _modify(path: str, old: str, new: str) -> str:
    body = "".join(
        difflib.unified_diff(
            old.splitlines(keepends=True),
            new.splitlines(keepends=True),
            fromfile=f"a/{path}",
            tofile=f"b/{path}",
        )
    )
    return f"diff --git a/{path} b/{path}\nindex 1111111..2222222 100644\n{body}"


def _create(path: str, text: str) -> str:
    lines = text.splitlines(keepends=True)
    body = "".join(f"+{line}" for line in lines)
    return (
        f"diff --git a/{path} b/{path}\nnew file mode 100644\nindex 0000000..3333333\n"
        f"--- /dev/null\n+++ b/{path}\n@@ -0,0 +1,{len(lines)} @@\n{body}"
    )


def make_patch(*, conflict: bool = False, worker: bool = True) -> str:
    """A PR#20547-shaped diff: the v2 worker, its env var in environ.py, a benchmark script and a
    pyproject change (the last two must never land in site-packages)."""
    environ = real_environ()
    anchor = "    SGLANG_ENABLE_SPEC_V2 = EnvBool(True)\n"
    assert anchor in environ
    patched = environ.replace(
        anchor, anchor + "    SGLANG_ENABLE_DFLASH_SPEC_V2 = EnvBool(False)\n"
    )
    base = environ
    if conflict:
        # The diff was made against a different environ.py: its context is not in 0.5.11's.
        base = environ.replace(anchor, "    SGLANG_ENABLE_SPEC_V2 = EnvBool(False)\n")
        patched = patched.replace(anchor, "    SGLANG_ENABLE_SPEC_V2 = EnvBool(False)\n")
    parts = [
        _create("benchmark/dflash/bench_dflash_gsm8k_sweep.py", "print('sweep')\n"),
        _modify(
            "python/pyproject.toml",
            '[project]\nname = "sglang"\nversion = "0.5.10"\n',
            '[project]\nname = "sglang"\nversion = "0.5.10"\ndependencies = ["torch==2.9.1"]\n',
        ),
        _modify(ENVIRON, base, patched),
    ]
    if worker:
        parts.append(
            _create(
                WORKER,
                '"""DFlash spec-v2 (overlap) worker: test-authored stand-in for PR#20547."""\n\n\n'
                "class DFlashWorkerV2:\n    pass\n",
            )
        )
    return "".join(parts)


def write_patch(tmp_path: Path, name: str, text: str) -> tuple[str, str]:
    p = tmp_path / name
    p.write_text(text)
    return str(p), hashlib.sha256(text.encode()).hexdigest()


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
    fleet, venv: str, patch: tuple[str, str] | None = None, on_conflict: str | None = None, **over
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
        data["patch"] = {"source": patch[0], "sha256": patch[1]}
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
            if name.startswith(op_prefix):
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


def test_fresh_host_converges_then_changes_nothing(sw, tmp_path):
    venv = "/opt/specfleet/sglang"
    patch = write_patch(tmp_path, "pr20547.diff", make_patch())
    data = settings(sw, venv, patch)

    first = deploy(sw, tmp_path, "h1", data)
    assert first.rc == 0, first.output
    for op in ("SGLang 0.5.11 installed", "compressed-tensors pinned", "PR#20547"):
        assert first.status(op, "h1") == "Success", (op, first.output)
    print(f"timing: {'fresh converge (venv + sglang + c-t + patch)'}: {first.seconds:.1f}s")

    versions = pip_versions(sw, "h1", venv)
    assert versions["sglang"] == "0.5.11"
    assert versions["compressed-tensors"] == "0.18.0"
    site = f"{venv}/{SITE}"
    environ = sw.run("h1", f"cat {site}/sglang/srt/environ.py", check=True).stdout
    assert "SGLANG_ENABLE_DFLASH_SPEC_V2 = EnvBool(False)" in environ
    assert exists(sw, "h1", f"{site}/sglang/srt/speculative/dflash_worker_v2.py")
    # Only the package's hunks landed: no benchmark/, no pyproject.toml, no .orig/.rej.
    stray = sw.run(
        "h1",
        "find / -xdev \\( -name bench_dflash_gsm8k_sweep.py -o -path '*/site-packages/pyproject.toml' "
        "-o -name '*.orig' -o -name '*.rej' \\) -print",
        check=True,
    ).stdout
    assert stray == ""

    second = deploy(sw, tmp_path, "h1", data)
    assert second.rc == 0, second.output
    for op in ("SGLang 0.5.11 installed", "compressed-tensors pinned", "PR#20547"):
        assert second.status(op, "h1") == "No changes", (op, second.output)
    print(f"timing: {'second run (no changes)'}: {second.seconds:.1f}s")


def test_patch_applies_verifies_is_idempotent_and_reverts(sw, tmp_path):
    venv = "/opt/sf-patch"
    install_only(sw, tmp_path, "h1", venv)
    pristine = tree_sha(sw, "h1", venv)
    patch = write_patch(tmp_path, "pr20547.diff", make_patch())
    data = settings(sw, venv, patch)
    only = {"ops": ["pr20547"]}

    applied = deploy(sw, tmp_path, "h1", data, test=only)
    assert applied.rc == 0 and applied.status("sglang.pr20547", "h1") == "Success", applied.output
    print(f"timing: {'apply patch'}: {applied.seconds:.1f}s")
    patched = tree_sha(sw, "h1", venv)
    assert patched != pristine
    marker = sw.run("h1", f"cat {venv}/.specfleet/pr20547/sha256", check=True).stdout.strip()
    assert marker == patch[1]

    again = deploy(sw, tmp_path, "h1", data, test=only)
    assert again.status("sglang.pr20547", "h1") == "No changes", again.output
    assert tree_sha(sw, "h1", venv) == patched

    revert = {"ops": ["pr20547"], "pr20547_present": False}
    removed = deploy(sw, tmp_path, "h1", data, test=revert)
    assert removed.rc == 0 and removed.status("sglang.pr20547", "h1") == "Success", removed.output
    assert tree_sha(sw, "h1", venv) == pristine
    assert not exists(sw, "h1", f"{venv}/.specfleet/pr20547")
    gone = deploy(sw, tmp_path, "h1", data, test=revert)
    assert gone.status("sglang.pr20547", "h1") == "No changes", gone.output


def test_upgrade_removes_the_patch_first(sw, tmp_path):
    venv = "/opt/sf-upgrade"
    patch = write_patch(tmp_path, "pr20547.diff", make_patch())
    ops = {"ops": ["installed", "pr20547"]}
    first = deploy(sw, tmp_path, "h2", settings(sw, venv, patch), test=ops)
    assert first.rc == 0, first.output
    assert exists(sw, "h2", f"{venv}/.specfleet/pr20547/sha256")

    up = deploy(
        sw, tmp_path, "h2", settings(sw, venv, patch, sglang={"version": "0.5.14"}), test=ops
    )
    assert up.rc == 0, up.output
    assert "removes PR#20547 from the current SGLang first" in up.output
    assert up.status("sglang.installed", "h2") == "Success"
    # 0.5.14 ships its own v2 worker: the patch is gone and not re-applied.
    assert up.status("sglang.pr20547", "h2") == "No changes", up.output
    assert pip_versions(sw, "h2", venv)["sglang"] == "0.5.14"
    assert not exists(sw, "h2", f"{venv}/.specfleet/pr20547")
    worker = sw.run("h2", f"cat {venv}/{SITE}/sglang/srt/speculative/dflash_worker_v2.py").stdout
    assert "test-authored" not in worker and "class DFlashWorkerV2" in worker


def test_reinstall_under_the_patch_then_uninstall(sw, tmp_path):
    """pip reinstalls SGLang behind our back: the marker no longer reverses, the worker file the
    patch added is left over (not in RECORD). The op removes it and applies again. Uninstalling
    SGLang removes the patch first."""
    venv = "/opt/sf-stale"
    patch = write_patch(tmp_path, "pr20547.diff", make_patch())
    data = settings(sw, venv, patch)
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


def test_conflicting_patch_keep_v1_and_fail_leave_the_install_untouched(sw, tmp_path):
    venv = "/opt/sf-conflict"
    install_only(sw, tmp_path, "h2", venv)
    before = tree_sha(sw, "h2", venv)
    patch = write_patch(tmp_path, "conflict.diff", make_patch(conflict=True))
    only = {"ops": ["pr20547"]}

    keep = deploy(sw, tmp_path, "h2", settings(sw, venv, patch), test=only)
    assert keep.rc == 0, keep.output
    assert keep.status("sglang.pr20547", "h2") == "No changes"
    assert "sglang/srt/environ.py: hunk #1 FAILED" in keep.output
    assert "DFLASH runs v1 with overlap scheduling off" in keep.output
    assert ">=0.5.14 has the DFlash v2 worker built in" in keep.output
    assert tree_sha(sw, "h2", venv) == before
    assert not exists(sw, "h2", f"{venv}/.specfleet/pr20547")

    fail = deploy(sw, tmp_path, "h2", settings(sw, venv, patch, on_conflict="fail"), test=only)
    assert fail.rc != 0
    assert fail.status("sglang.pr20547", "h2") == "Error", fail.output
    assert "sglang/srt/environ.py: hunk #1 FAILED" in fail.output
    assert ">=0.5.14 has the DFlash v2 worker built in" in fail.output
    assert "fix: pin sglang.version to 0.5.14 or later" in fail.output
    assert "Traceback" not in fail.output
    assert tree_sha(sw, "h2", venv) == before


def test_patch_that_leaves_the_feature_missing_is_rolled_back(sw, tmp_path):
    venv = "/opt/sf-rollback"
    install_only(sw, tmp_path, "h2", venv)
    before = tree_sha(sw, "h2", venv)
    # Applies cleanly (environ.py only) but adds no v2 worker: the facts still say v1.
    patch = write_patch(tmp_path, "no-worker.diff", make_patch(worker=False))

    keep = deploy(sw, tmp_path, "h2", settings(sw, venv, patch), test={"ops": ["pr20547"]})
    assert keep.rc == 0, keep.output
    assert "still show no DFlash v2 worker; rolled back" in keep.output
    assert tree_sha(sw, "h2", venv) == before
    assert not exists(sw, "h2", f"{venv}/.specfleet/pr20547")

    fail = deploy(
        sw, tmp_path, "h2", settings(sw, venv, patch, on_conflict="fail"),
        test={"ops": ["pr20547"]},
    )  # fmt: skip
    assert fail.rc != 0 and fail.status("sglang.pr20547", "h2") == "Error", fail.output
    assert tree_sha(sw, "h2", venv) == before


def test_a_patch_with_the_wrong_sha256_fails_the_host_cleanly(sw, tmp_path):
    venv = "/opt/sf-sha"
    install_only(sw, tmp_path, "h2", venv)
    before = tree_sha(sw, "h2", venv)
    source, _ = write_patch(tmp_path, "pr20547.diff", make_patch())
    wrong = (source, "0" * 64)
    for flags in (("-y",), ("--dry",)):
        run = deploy(
            sw, tmp_path, "h2", settings(sw, venv, wrong), *flags, test={"ops": ["pr20547"]}
        )
        assert run.rc != 0, run.output
        assert f"the patch from {source} has sha256" in run.output
        assert "settings pin 0000000000000000000000000000000000000000000000000000000000000000" in (
            run.output
        )
        assert "fix: check that patch.source is the intended diff" in run.output
        assert "Traceback" not in run.output
    assert tree_sha(sw, "h2", venv) == before


def test_dry_run_on_a_fresh_host_says_what_and_why(sw, tmp_path):
    venv = "/opt/sf-dry"
    patch = write_patch(tmp_path, "pr20547.diff", make_patch())
    run = deploy(sw, tmp_path, "h2", settings(sw, venv, patch), "--dry")
    assert run.rc == 0, run.output
    assert f"would: creates venv {venv} with python3" in run.output
    assert "would: SGLang is not installed; installs SGLang 0.5.11" in run.output
    assert "would: compressed-tensors is not installed; SGLang 0.5.11 needs" in run.output
    assert "would: SGLang 0.5.11 (to be installed) has no DFlash v2 worker; applies PR#20547" in (
        run.output
    )
    assert "leaves out 2: benchmark/dflash/bench_dflash_gsm8k_sweep.py, python/pyproject.toml" in (
        run.output
    )
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
