"""An SGLang source tree on the host (sglang.kind "source"): the fork's real pyproject.toml needs a
Rust extension whose sources are not in the tarball, said before anything changes; the folder pip
recorded and the tree's content are the idempotence key; a tree goes beside a release venv."""

from __future__ import annotations

import shutil
import subprocess
import tarfile

import pytest

from facts.sglang import FileHashes, SourceTree, SourceTreeKey
from specfleet.core.errors import SettingsError
from specfleet.core.settings import settings_from_dict
from specfleet.core.sglang.install import (
    choose_venv,
    decide_source_install,
    rust_extensions,
    source_build_problem,
    source_label,
    source_record,
    source_url,
)
from tests.harness.sources import DDTREE_FORK_TARBALL, ddtree_fork_host_script

TREE = "/opt/src/sglang-ddtree-fork/python"


@pytest.fixture(scope="module")
def fork_python(tmp_path_factory):
    """The fork's python/ folder's build files, from the shared tarball."""
    root = tmp_path_factory.mktemp("fork")
    with tarfile.open(DDTREE_FORK_TARBALL) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith("python/pyproject")]
        tar.extractall(root, members=members, filter="data")
    return root / "python"


def run_fact(fact, **kwargs):
    cmd = fact.command(**kwargs)
    done = subprocess.run(["sh", "-c", str(cmd)], capture_output=True, text=True, check=True)
    return fact.process(done.stdout.splitlines())


@pytest.mark.local
def test_the_forks_rust_extension_is_read_from_its_pyproject(fork_python):
    rust = rust_extensions((fork_python / "pyproject.toml").read_text())
    assert rust == [{"target": "sglang.srt.grpc._core", "path": "../rust/sglang-grpc/Cargo.toml",
                     "binding": "PyO3"}]  # fmt: skip


@pytest.mark.local
def test_no_cargo_is_a_clear_error_before_anything_changes(fork_python):
    tree = run_fact(SourceTree(), path=str(fork_python))
    assert tree["pyproject"].strip() == (fork_python / "pyproject.toml").read_text().strip()
    assert tree["cargo"] is bool(shutil.which("cargo"))
    problem, fix = source_build_problem(str(fork_python), tree["pyproject"], cargo=False,
                                        missing=[])  # fmt: skip
    assert "sglang.srt.grpc._core" in problem and "no Rust toolchain (cargo not found)" in problem
    assert "nothing was changed" in problem and "Rust toolchain" in fix


@pytest.mark.local
def test_cargo_but_no_rust_sources_is_named(fork_python):
    found = run_fact(FileHashes(), directory=str(fork_python),
                     paths=("../rust/sglang-grpc/Cargo.toml", "pyproject.toml"))  # fmt: skip
    assert found["../rust/sglang-grpc/Cargo.toml"] is None and found["pyproject.toml"]
    problem, fix = source_build_problem(
        str(fork_python), (fork_python / "pyproject.toml").read_text(), cargo=True,
        missing=["../rust/sglang-grpc/Cargo.toml"],
    )  # fmt: skip
    assert "../rust/sglang-grpc/Cargo.toml, which is not on the host" in problem
    assert "whole repository" in fix


@pytest.mark.local
def test_a_folder_without_pyproject(tmp_path):
    tree = run_fact(SourceTree(), path=str(tmp_path))
    assert tree["pyproject"] is None
    problem, _ = source_build_problem(str(tmp_path), None, cargo=True, missing=[])
    assert "no pyproject.toml" in problem


@pytest.mark.local
def test_a_pure_python_tree_builds(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[build-system]\nrequires = ["setuptools"]\n')
    tree = run_fact(SourceTree(), path=str(tmp_path))
    assert source_build_problem(str(tmp_path), tree["pyproject"], cargo=False, missing=[]) is None


KEY, OLD = "5d1c" + "0" * 60, "9a7e" + "0" * 60


def test_the_recorded_folder_and_the_trees_content_are_the_key():
    """Issue 55: the folder alone was the key, so a changed tree (a pull, an edit, another
    branch) was never rebuilt. Its content (facts.sglang.SourceTreeKey) is the key too."""
    same = {"url": f"file://{TREE}"}
    built = {"sha256": KEY, "recorded": source_record(KEY, TREE) + "\n"}
    assert decide_source_install(None, None, TREE, built).action == "install"
    decision = decide_source_install("0.0.0.dev0", same, TREE, built)
    assert decision.action == "noop" and "as it is now (content 5d1c00000000)" in decision.reason
    assert decide_source_install("0.5.23", None, TREE, built).action == "reinstall"
    other = {"url": "file:///opt/src/other/python"}
    assert decide_source_install("0.0.0.dev0", other, TREE, built).action == "reinstall"
    assert source_url(TREE + "/") == f"file://{TREE}"
    # The same folder, other content: rebuilt.
    changed = {"sha256": KEY, "recorded": source_record(OLD, TREE)}
    decision = decide_source_install("0.0.0.dev0", same, TREE, changed)
    assert decision.action == "reinstall", decision
    assert "changed since SGLang 0.0.0.dev0 was built from it (content 9a7e00000000 -> " \
           "5d1c00000000)" in decision.reason
    # Built before the content was recorded: rebuilt once, then recorded.
    decision = decide_source_install("0.0.0.dev0", same, TREE, {"sha256": KEY, "recorded": None})
    assert decision.action == "reinstall" and "is not recorded" in decision.reason
    # The record of another folder's tree with the same content is not this one's.
    moved = {"sha256": KEY, "recorded": source_record(KEY, "/opt/src/other/python")}
    assert decide_source_install("0.0.0.dev0", same, TREE, moved).action == "reinstall"
    # The tree gone from the host: what is installed stays (nothing to build from).
    gone = decide_source_install("0.0.0.dev0", same, TREE, {"sha256": None, "recorded": None})
    assert gone.action == "noop" and "not on the host now" in gone.reason
    assert source_record(KEY, TREE + "/") == f"{KEY} {TREE}"


def _tree_key(tree, venv) -> dict:
    return run_fact(SourceTreeKey(), path=str(tree), venv=str(venv))


@pytest.mark.local
def test_the_trees_key_changes_with_its_content_not_with_a_build(tmp_path):
    tree, venv = tmp_path / "python", tmp_path / "venv"
    (tree / "sglang" / "srt").mkdir(parents=True)
    (tree / "pyproject.toml").write_text("[build-system]\n")
    (tree / "sglang" / "__init__.py").write_text("x = 1\n")
    (tree / "sglang" / "srt" / "server_args.py").write_text("y = 2\n")
    first = _tree_key(tree, venv)
    assert first["files"] == 3 and len(first["sha256"]) == 64 and first["recorded"] is None
    assert _tree_key(tree, venv) == first
    # What a build (pip's in-tree build, Python's bytecode) and git leave in the tree: no change.
    for d in ("build/lib/sglang", "sglang.egg-info", "sglang/__pycache__", ".git/objects"):
        (tree / d).mkdir(parents=True)
        (tree / d / "f").write_text("built")
    (tree / "sglang" / "srt" / "x.cpython-311.pyc").write_bytes(b"\0")
    assert _tree_key(tree, venv) == first
    # An edit, a new file, a mode, a link: each changes the key.
    seen = {first["sha256"]}
    (tree / "sglang" / "srt" / "server_args.py").write_text("y = 3\n")
    seen.add(_tree_key(tree, venv)["sha256"])
    (tree / "sglang" / "new.py").write_text("")
    seen.add(_tree_key(tree, venv)["sha256"])
    (tree / "sglang" / "new.py").chmod(0o755)
    seen.add(_tree_key(tree, venv)["sha256"])
    (tree / "sglang" / "link").symlink_to("/etc")
    seen.add(_tree_key(tree, venv)["sha256"])
    assert len(seen) == 5
    # The venv's record comes back with the key; no tree, no key.
    (venv / ".specfleet").mkdir(parents=True)
    (venv / ".specfleet" / "sglang-source").write_text(f"{KEY} {tree}\n")
    assert _tree_key(tree, venv)["recorded"] == f"{KEY} {tree}\n"
    assert _tree_key(tmp_path / "none", venv)["sha256"] is None


@pytest.mark.local
def test_the_forks_tree_laid_in_as_the_fleet_tests_do_is_converged(tmp_path):
    """The fleet tests lay the fork's tree and a venv as a source install of it looks
    (tests/harness/sources.py): the record they write is what sglang.installed would have
    written after a build, so the deploy keeps it (no rebuild, which the host could not do)."""
    src, venv = tmp_path / "src" / "python", tmp_path / "venv"
    script = ddtree_fork_host_script(str(DDTREE_FORK_TARBALL), str(venv), str(src))
    subprocess.run(["sh", "-c", script], check=True, capture_output=True, timeout=300)
    tree = _tree_key(src, venv)
    assert tree["recorded"].strip() == source_record(tree["sha256"], str(src))
    direct = {"url": source_url(str(src))}
    assert decide_source_install("0.0.0.dev0", direct, str(src), tree).action == "noop"


def test_a_tree_goes_beside_a_release_venv():
    release = {"sglang": "0.5.23"}
    choice = choose_venv("/opt/v", release, version="0.5.23", git=False, side_by_side=True,
                         source_path=TREE)  # fmt: skip
    assert choice.venv == "/opt/v-sglang-src-sglang-ddtree-fork"
    assert "kept as it is" in choice.reason
    assert source_label(TREE) == "src-sglang-ddtree-fork"
    laid = {"sglang": "0.0.0.dev0", "direct_urls": {"sglang": {"url": f"file://{TREE}"}}}
    assert choose_venv("/opt/v", laid, version="0.5.23", git=False, side_by_side=True,
                       source_path=TREE).venv == "/opt/v"  # fmt: skip
    assert choose_venv("/opt/v", {}, version="0.5.23", git=False, side_by_side=True,
                       source_path=TREE).venv == "/opt/v"  # fmt: skip


def test_source_settings_are_checked():
    s = settings_from_dict({"sglang": {"kind": "source", "source_path": TREE}})
    assert s.sglang.source_path == TREE
    with pytest.raises(SettingsError, match="sglang.source_path"):
        settings_from_dict({"sglang": {"kind": "source"}})
    with pytest.raises(SettingsError, match="sglang.source_path"):
        settings_from_dict({"sglang": {"kind": "source", "source_path": "relative/python"}})


def test_the_deploy_probe_asks_the_trees_key_as_the_install_does():
    """The tree's key rides in the deploy's one probe, with the arguments sglang.installed asks
    it with (a converged host asks nothing more live), and the trust check holds the tree."""
    from facts.cache import fact_key, keyed_specs
    from operations.probe import deploy_specs
    from operations.venvs import candidate_venvs

    s = settings_from_dict({"sglang": {"kind": "source", "source_path": TREE, "version": "0.5.13"},
                            "target": {"revision": "a" * 40},
                            "drafter": {"revision": "b" * 40}}, host="h1")
    specs = deploy_specs(s, "/var/lib/specfleet/run.lock")
    keyed = keyed_specs(specs)
    for venv in candidate_venvs(s):
        assert fact_key(SourceTreeKey, {"path": TREE, "venv": venv}) in keyed
    release = settings_from_dict({"sglang": {"version": "0.5.11"}, "target": {"revision": "a" * 40},
                                  "drafter": {"revision": "b" * 40}}, host="h1")
    assert not any(cls is SourceTreeKey for cls, _ in deploy_specs(release, "/l"))
