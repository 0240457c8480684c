"""PR#20547's DFlash v2 worker ported onto the SGLang 0.5.11 wheel, kept as a recipe in
``specfleet/patchdata/pr20547/sglang-0.5.11``: built from the shared fixtures and the wheelhouse
through the recipe, applied to the real wheel with GNU patch and checked without torch (compile,
imports resolved by reading the tree, the routing and the overlap switch run from the patched
files with the rest of SGLang stubbed), and its key against the wheel's RECORD. The recipe
itself: tests/unit/test_pr20547_recipe.py; the #29 fixes: tests/unit/test_pr20547_fixes.py."""

from __future__ import annotations

import ast
import base64
import csv
import hashlib
import io
import json
import os
import py_compile
import shutil
import subprocess
import sys
import zipfile
from functools import cache
from pathlib import Path
from typing import Optional

import pytest

from specfleet.core.sglang.pr20547.port import (
    HASH_FORMAT,
    check_port,
    hashed_paths,
    load_ports,
    port_for,
    read_port_file,
    select_pr_hunks,
    split_hunks,
)
from tests.harness.port_build import port_patch
from tests.harness.sources import PR20547_DIFF_SHA256, pr20547_diff, sglang_wheel

ROOT = Path(__file__).resolve().parents[2]
NAME = "pr20547/sglang-0.5.11"
DATA = ROOT / "specfleet" / "patchdata" / "pr20547" / "sglang-0.5.11"
GNU_PATCH = "/usr/bin/patch"
# What an apply does, and never fuzz: every hunk must match its context exactly.
PATCH_ARGS = ("-p1", "--forward", "--batch", "--fuzz=0", "--no-backup-if-mismatch",
              "--reject-file=-")  # fmt: skip
PR_HEAD = ("modal-labs/sglang", "e67a0d488d905661e621342912874bc7893f1d94")
# 0.5.11's DFlash v1, which the port must leave exactly as released (dflash_utils.py aside: it
# takes 0.5.14's verify-mask policy, which v1 reads too, as in 0.5.14).
V1_FILES = (
    "sglang/srt/speculative/dflash_worker.py",
    "sglang/srt/speculative/dflash_info.py",
    "sglang/srt/models/dflash.py",
    "sglang/srt/speculative/triton_ops/__init__.py",
    "sglang/srt/speculative/triton_ops/fused_kv_materialize.py",
)


# --------------------------------------------------------------------------------------------------
# Helpers: the wheel, the upstream sources, GNU patch, the static import check
# --------------------------------------------------------------------------------------------------


@cache
def wheel_record(version: str) -> dict[str, str]:
    """{path: sha256 hex} from the wheel's RECORD (which writes urlsafe base64, unpadded)."""
    with zipfile.ZipFile(sglang_wheel(version)) as zf:
        text = zf.read(f"sglang-{version}.dist-info/RECORD").decode()
    out = {}
    for row in csv.reader(io.StringIO(text)):
        if len(row) >= 2 and row[1].startswith("sha256="):
            b64 = row[1][len("sha256=") :]
            out[row[0]] = base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4)).hex()
    return out


def unpack_sglang(version: str, dest: Path) -> Path:
    """The wheel's ``sglang/`` package under ``dest`` (a site-packages of one package)."""
    with zipfile.ZipFile(sglang_wheel(version)) as zf:
        zf.extractall(dest, [n for n in zf.namelist() if n.startswith("sglang/")])
    return dest


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run_patch(tree: Path, text: str) -> subprocess.CompletedProcess:
    return subprocess.run([GNU_PATCH, *PATCH_ARGS, "-d", str(tree)], input=text,
                          capture_output=True, text=True)  # fmt: skip


def patched_paths(text: str) -> set[str]:
    return {h.path for h in split_hunks(text)}


def _module_file(root: Path, dotted: str) -> Path | None:
    base = root.joinpath(*dotted.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return base if base.is_dir() else None  # a namespace package


def _package_of(root: Path, file: Path) -> str:
    parts = list(file.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1])  # a package's __init__ and a module both: drop the last part


def _absolute(root: Path, file: Path, node: ast.ImportFrom) -> str | None:
    if node.level == 0:
        return node.module
    package = _package_of(root, file).split(".")
    if node.level - 1 > len(package):
        return None
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _bound(target: ast.expr) -> set[str]:
    if isinstance(target, ast.Name):
        return {target.id}
    if isinstance(target, (ast.Tuple, ast.List)):
        return set().union(*(_bound(e) for e in target.elts)) if target.elts else set()
    if isinstance(target, ast.Starred):
        return _bound(target.value)
    return set()


@cache
def module_names(root: Path, file: Path) -> tuple[frozenset[str], tuple[str, ...]]:
    """The names a module binds at import (in its top level, and in the if/try/with blocks there),
    and the modules it star-imports."""
    tree = ast.parse(file.read_text(encoding="utf-8"), str(file))
    names: set[str] = set()
    stars: list[str] = []

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    names.update(_bound(target))
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                names.update(_bound(node.target))
            elif isinstance(node, ast.Import):
                names.update(a.asname or a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if alias.name == "*":
                        stars.append(_absolute(root, file, node) or "")
                    else:
                        names.add(alias.asname or alias.name)
            elif isinstance(node, ast.If):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)
                visit(node.finalbody)
            elif isinstance(node, (ast.With, ast.For, ast.While)):
                visit(node.body)

    visit(tree.body)
    return frozenset(names), tuple(stars)


def _has_name(root: Path, module: str, name: str, seen: frozenset[str] = frozenset()) -> bool:
    file = _module_file(root, module)
    if file is None or module in seen:
        return False
    if _module_file(root, f"{module}.{name}") is not None:
        return True  # a submodule
    if file.is_dir():
        return False
    names, stars = module_names(root, file)
    if name in names or "__getattr__" in names:
        return True
    return any(_has_name(root, star, name, seen | {module}) for star in stars if star)


def unresolved_imports(root: Path, files: list[Path]) -> list[str]:
    """Every ``from sglang... import X`` / ``import sglang...`` in ``files`` (anywhere in them,
    TYPE_CHECKING and function bodies included) whose module file is missing from the tree or
    does not bind X."""
    problems = []
    for file in files:
        tree = ast.parse(file.read_text(encoding="utf-8"), str(file))
        where = file.relative_to(root).as_posix()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "sglang" and not _module_file(root, alias.name):
                        problems.append(f"{where}:{node.lineno}: no module {alias.name}")
            elif isinstance(node, ast.ImportFrom):
                module = _absolute(root, file, node)
                if not module or module.split(".")[0] != "sglang":
                    continue
                if _module_file(root, module) is None:
                    problems.append(f"{where}:{node.lineno}: no module {module}")
                    continue
                for alias in node.names:
                    if alias.name != "*" and not _has_name(root, module, alias.name):
                        problems.append(f"{where}:{node.lineno}: {module} has no {alias.name}")
    return problems


# The routing and the overlap switch, run from the patched files: sglang's packages are stubbed
# (their __init__ would import torch) so that only environ.py (stdlib only), spec_info.py and the
# server_args statements that set disable_overlap_schedule run; the two DFLASH workers are stubs
# that name the module create_worker imported them from.
ROUTE_SCRIPT = r"""
import ast, json, logging, sys, types
root = sys.argv[1]
for name in ("sglang", "sglang.srt", "sglang.srt.debug_utils", "sglang.srt.speculative"):
    mod = types.ModuleType(name)
    mod.__path__ = [root + "/" + name.replace(".", "/")]
    sys.modules[name] = mod
for name, cls in (("sglang.srt.speculative.dflash_worker", "DFlashWorker"),
                  ("sglang.srt.speculative.dflash_worker_v2", "DFlashWorkerV2")):
    mod = types.ModuleType(name)
    setattr(mod, cls, type(cls, (), {"__module__": name}))
    sys.modules[name] = mod
from sglang.srt.environ import envs
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

src = open(root + "/sglang/srt/server_args.py", encoding="utf-8").read()
def sets_overlap(stmt):
    return any(isinstance(t, ast.Attribute) and t.attr == "disable_overlap_schedule"
               for n in ast.walk(stmt) if isinstance(n, ast.Assign) for t in n.targets)
block = next(
    n for n in ast.walk(ast.parse(src))
    if isinstance(n, ast.If) and ast.unparse(n.test) == "self.speculative_algorithm == 'DFLASH'"
    and any(sets_overlap(s) for s in n.body)
)
stmts = [s for s in block.body if sets_overlap(s)]
import os
args = types.SimpleNamespace(disable_overlap_schedule=os.environ.get("_off") == "1",
                             enable_multi_layer_eagle=False)
code = compile(ast.Module(body=stmts, type_ignores=[]), "server_args.py", "exec")
exec(code, {"self": args, "envs": envs, "logger": logging.getLogger("server_args")})
out = {"statements": len(stmts), "disable_overlap_schedule": args.disable_overlap_schedule,
       "supports_spec_v2": SpeculativeAlgorithm.DFLASH.supports_spec_v2()}
try:
    worker = SpeculativeAlgorithm.DFLASH.create_worker(args)
    out["worker"] = worker.__module__ + "." + worker.__name__
except ValueError as exc:
    out["worker"] = "ValueError: " + str(exc)
print(json.dumps(out))
"""


def route(tree: Path, env: dict[str, str]) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "SGL_"))}
    done = subprocess.run([sys.executable, "-c", ROUTE_SCRIPT, str(tree)], env={**clean, **env},
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------------------------------
# Fixtures
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def port() -> dict:
    return load_ports()[NAME]


@pytest.fixture(scope="module")
def patches(port) -> tuple[str]:
    return (port_patch().text,)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    return unpack_sglang("0.5.11", tmp_path_factory.mktemp("sglang-0.5.11"))


@pytest.fixture(scope="module")
def ported(tmp_path_factory, pristine, patches):
    """An unpacked 0.5.11 wheel with the port applied, and GNU patch's words for each part."""
    tree = tmp_path_factory.mktemp("ported")
    shutil.copytree(pristine / "sglang", tree / "sglang")
    outputs = []
    for text in patches:
        done = run_patch(tree, text)
        outputs.append(done)
    return tree, outputs


@pytest.fixture(scope="module")
def touched(patches) -> list[str]:
    return sorted(patched_paths(patches[0]))


# --------------------------------------------------------------------------------------------------
# The data and its key
# --------------------------------------------------------------------------------------------------


def test_the_data_folder_is_found_as_package_data_and_complete(port):
    assert NAME in load_ports()
    assert check_port(port) == []
    assert port["hash"] == HASH_FORMAT
    assert port["pr_diff_sha256"] == PR20547_DIFF_SHA256
    assert port["sglang_version"] == "0.5.11"
    for name in ("NOTICE", "port.json", port["recipe"], port["provenance"]):
        assert (DATA / name).is_file(), name
    notice = read_port_file(NAME, "NOTICE")
    for needed in ("Apache License", "Version 2.0", "SGLang", PR_HEAD[1], PR20547_DIFF_SHA256):
        assert needed in notice


@pytest.mark.local
def test_the_key_is_the_0511_wheels_record(port, touched):
    record = wheel_record("0.5.11")
    assert port["targets"] == {p: record[p] for p in port["targets"]}
    # models/dflash.py is left as released by the port but not required: the drafter RoPE patch
    # (#52) changes it on every 0.5.11 host, port or not.
    assert port["requires"] == {p: record[p] for p in V1_FILES if p != "sglang/srt/models/dflash.py"}
    assert "sglang/srt/speculative/dflash_utils.py" in port["targets"]  # the verify-mask policy
    assert not set(port["creates"]) & set(record)
    # The key covers exactly the files the port touches: modified (in the wheel) or created.
    assert set(touched) == set(port["targets"]) | set(port["creates"])
    assert set(port["targets"]) == {p for p in touched if p in record}


@pytest.mark.local
def test_port_for_finds_the_port_only_for_a_tree_like_the_wheel(port):
    ports = load_ports()
    record = wheel_record("0.5.11")
    hashes = {p: record.get(p) for p in hashed_paths(port)}
    assert port_for("0.5.11", PR20547_DIFF_SHA256, hashes, ports) == NAME

    def without_port(path: str, digest: str | None) -> bool:
        tree = {**hashes, path: digest}
        return port_for("0.5.11", PR20547_DIFF_SHA256, tree, ports) is None

    other = "0" * 64
    for path in port["targets"]:
        assert without_port(path, other), path  # a file the port modifies differs
        assert without_port(path, None), path  # or is missing
    for path in port["requires"]:
        assert without_port(path, other), path  # a v1 file it relies on differs
    # The drafter RoPE patch's file (#52) may be either: the port fits beside it.
    rope = "sglang/srt/models/dflash.py"
    assert port_for("0.5.11", PR20547_DIFF_SHA256, {**hashes, rope: other}, ports) == NAME
    for path in port["creates"]:
        assert without_port(path, other), path  # a file it creates is already there
    assert port_for("0.5.12", PR20547_DIFF_SHA256, hashes, ports) is None
    assert port_for("0.5.11", other, hashes, ports) is None
    assert port_for("0.5.11", PR20547_DIFF_SHA256, hashes, {}) is None


def test_a_bad_port_json_is_refused(port):
    bad = {**port, "targets": {"sglang/srt/environ.py": "not-a-hash"}}
    assert check_port(bad)
    assert check_port({k: v for k, v in port.items() if k != "recipe"})
    assert check_port({**port, "hash": "sha256-b64"})


@pytest.mark.local
def test_the_port_applies_to_the_0511_wheel_without_fuzz(ported):
    _, outputs = ported
    for done in outputs:
        words = done.stdout + done.stderr
        assert done.returncode == 0, words
        for bad in ("fuzz", "FAILED", "Reversed", "Skipping", "already exists"):
            assert bad not in words, words


@pytest.mark.local
def test_only_the_keyed_files_change(ported, pristine, port):
    tree, _ = ported
    changed = set()
    for file in (tree / "sglang").rglob("*"):
        rel = file.relative_to(tree).as_posix()
        if file.is_file():
            before = pristine / rel
            if not before.is_file() or before.read_bytes() != file.read_bytes():
                changed.add(rel)
    assert changed == set(port["targets"]) | set(port["creates"])


@pytest.mark.local
def test_v1_files_stay_byte_identical(ported):
    tree, _ = ported
    record = wheel_record("0.5.11")
    for rel in V1_FILES:
        assert sha256_file(tree / rel) == record[rel], rel


@pytest.mark.local
def test_touched_modules_compile(ported, touched, tmp_path):
    tree, _ = ported
    for rel in touched:
        py_compile.compile(str(tree / rel), cfile=str(tmp_path / "x.pyc"), doraise=True)


@pytest.mark.local
def test_imports_in_touched_modules_resolve_in_the_tree(ported, touched, pristine, tmp_path):
    tree, _ = ported
    assert unresolved_imports(tree, [tree / rel for rel in touched]) == []
    # The check bites: the PR's v2 worker on 0.5.11 without the adaptation does not resolve.
    bare = tmp_path / "pr-hunks-only"
    shutil.copytree(pristine / "sglang", bare / "sglang")
    assert run_patch(bare, select_pr_hunks(pr20547_diff().decode(), [57, 60])).returncode == 0
    missing = unresolved_imports(bare, [bare / "sglang/srt/speculative/dflash_worker_v2.py"])
    assert missing == [
        "sglang/srt/speculative/dflash_worker_v2.py:18: sglang.srt.speculative.dflash_utils "
        "has no apply_dflash_verify_logits_adjustments"
    ]


@pytest.mark.local
def test_the_v2_worker_gets_what_it_uses_from_the_pr_v1_base(ported):
    tree, _ = ported
    spec = tree / "sglang/srt/speculative"
    v2 = ast.parse((spec / "dflash_worker_v2.py").read_text())
    (cls,) = [n for n in v2.body if isinstance(n, ast.ClassDef) and n.name == "DFlashWorkerV2"]
    used = {
        n.attr for n in ast.walk(cls)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self"
    }  # fmt: skip
    provided = set()
    for name in ("dflash_worker.py", "dflash_worker_pr20547_base.py", "dflash_worker_v2.py"):
        for node in ast.walk(ast.parse((spec / name).read_text())):
            if isinstance(node, ast.FunctionDef):
                provided.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                provided.add(node.attr)
    assert used - provided == set()
    # 0.5.11's overlap scheduler reads these from the spec-v2 worker.
    assert {"speculative_num_draft_tokens", "draft_runner"} <= provided


@pytest.mark.local
def test_environ_has_the_pr_switch(ported, pristine):
    def flags(root: Path) -> dict[str, str]:
        tree = ast.parse((root / "sglang/srt/environ.py").read_text())
        envs = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Envs")
        return {
            t.id: ast.unparse(n.value)
            for n in envs.body if isinstance(n, ast.Assign) for t in n.targets
            if isinstance(t, ast.Name)
        }  # fmt: skip

    assert flags(ported[0])["SGLANG_ENABLE_DFLASH_SPEC_V2"] == "EnvBool(False)"
    assert "SGLANG_ENABLE_DFLASH_SPEC_V2" not in flags(pristine)
    assert flags(pristine)["SGLANG_ENABLE_SPEC_V2"] == "EnvBool(True)"  # 0.5.11's default


V2 = "sglang.srt.speculative.dflash_worker_v2.DFlashWorkerV2"
V1 = "sglang.srt.speculative.dflash_worker.DFlashWorker"


@pytest.mark.local
@pytest.mark.parametrize(
    ("env", "overlap_off", "worker"),
    [
        ({"SGLANG_ENABLE_SPEC_V2": "1", "SGLANG_ENABLE_DFLASH_SPEC_V2": "1"}, False, V2),
        # 0.5.11 defaults SGLANG_ENABLE_SPEC_V2 to true: the DFLASH switch alone turns v2 on.
        ({"SGLANG_ENABLE_DFLASH_SPEC_V2": "1"}, False, V2),
        ({"SGLANG_ENABLE_SPEC_V2": "0", "SGLANG_ENABLE_DFLASH_SPEC_V2": "1"}, True, V1),
        ({"SGLANG_ENABLE_SPEC_V2": "1"}, True, V1),
        ({}, True, V1),
        # --disable-overlap-schedule given: honoured under both switches, DFLASH stays v1.
        ({"SGLANG_ENABLE_SPEC_V2": "1", "SGLANG_ENABLE_DFLASH_SPEC_V2": "1", "_off": "1"}, True,
         V1),
    ],
)  # fmt: skip
def test_dflash_runs_v2_with_overlap_only_under_the_switches(ported, env, overlap_off, worker):
    got = route(ported[0], env)
    assert got["statements"] == 1
    assert got["disable_overlap_schedule"] is overlap_off
    assert got["worker"] == worker
    assert got["supports_spec_v2"] is (env.get("SGLANG_ENABLE_DFLASH_SPEC_V2") == "1")


@pytest.mark.local
def test_stock_0511_forces_overlap_off_for_dflash(pristine):
    got = route(pristine, {"SGLANG_ENABLE_SPEC_V2": "1", "SGLANG_ENABLE_DFLASH_SPEC_V2": "1"})
    assert got["disable_overlap_schedule"] is True
    assert got["worker"] == V1
    assert got["supports_spec_v2"] is False


@pytest.mark.local
def test_dflash_overlap_results_commit_what_the_v2_worker_materialised(ported):
    """0.5.11's spec-v2 result processing subtracts the bonus slot EAGLE pre-claims; DFLASH's
    prepare_for_decode pre-claims none, so DFLASH must commit all accept_lens."""
    tree, _ = ported
    src = (tree / "sglang/srt/managers/scheduler_output_processor_mixin.py").read_text()
    fn = next(
        n for n in ast.walk(ast.parse(src))
        if isinstance(n, ast.FunctionDef) and n.name == "_resolve_spec_overlap_token_ids"
    )  # fmt: skip
    branch = next(n for n in ast.walk(fn) if isinstance(n, ast.If))
    assert ast.unparse(branch.test) == "batch.spec_algorithm.is_dflash()"
    assert ast.unparse(branch.body[0]) == "req.kv_committed_len += accept_lens[i]"
    assert ast.unparse(branch.orelse[0]) == "req.kv_committed_len += accept_lens[i] - 1"
    info = (tree / "sglang/srt/speculative/dflash_info_v2.py").read_text()
    assert "kv_committed_len +=" not in info


def _decode_estimate(root: Path, algo: str, is_spec_v2: bool, bs: int, page_size: int) -> int:
    """Run ScheduleBatch.new_tokens_required_next_decode from the tree's schedule_batch.py on a
    stub batch (block of 16 draft tokens); the tight spec-v2 estimate answers -1."""
    from types import SimpleNamespace

    src = (root / "sglang/srt/managers/schedule_batch.py").read_text()
    fn = next(
        n for n in ast.walk(ast.parse(src))
        if isinstance(n, ast.FunctionDef) and n.name == "new_tokens_required_next_decode"
    )  # fmt: skip
    args = SimpleNamespace(
        speculative_num_steps=1, speculative_eagle_topk=1, speculative_num_draft_tokens=16
    )
    scope = {
        "Optional": Optional, "List": list, "get_global_server_args": lambda: args,
        "ceil_align": lambda x, n: (x + n - 1) // n * n,
    }  # fmt: skip
    exec(compile(ast.Module(body=[fn], type_ignores=[]), "schedule_batch.py", "exec"), scope)
    batch = SimpleNamespace(
        token_to_kv_pool_allocator=SimpleNamespace(page_size=page_size),
        reqs=[SimpleNamespace(kv_committed_len=100)] * bs,
        spec_algorithm=SimpleNamespace(is_none=lambda: False, is_dflash=lambda: algo == "DFLASH"),
        is_spec_v2=is_spec_v2,
        _new_tokens_required_next_decode_spec_v2=lambda reqs, page: -1,
    )
    return scope["new_tokens_required_next_decode"](batch)


@pytest.mark.local
def test_dflash_v2_keeps_the_pr_branch_decode_memory_estimate(ported, pristine):
    """The PR's DFlashDraftInputV2 reserves up to 2 blocks per request from the GPU seq_lens;
    0.5.11's tight host-side estimate matches only EAGLE's reservation."""
    tree, _ = ported
    assert _decode_estimate(tree, "DFLASH", True, bs=3, page_size=1) == 2 * 16 * 3
    assert _decode_estimate(tree, "DFLASH", True, bs=3, page_size=64) == 2 * 64 * 3
    assert _decode_estimate(tree, "DFLASH", False, bs=3, page_size=1) == 16 * 3  # v1 as before
    assert _decode_estimate(tree, "EAGLE", True, bs=3, page_size=1) == -1  # EAGLE as before
    assert _decode_estimate(pristine, "DFLASH", True, bs=3, page_size=1) == -1


# --------------------------------------------------------------------------------------------------
# Provenance
# --------------------------------------------------------------------------------------------------
