"""Facts about the SGLang in a Python environment, read from its files, never by importing it."""

from __future__ import annotations

import ast
import functools
import re
import shlex
from typing import Any

from pyinfra.api import FactBase, QuoteString, StringCommand
from typing_extensions import override

from facts.hostpy import ISOLATED, PythonJob, parse_printed, script_source
from specfleet.core.layout import rope_state_dir, sglang_python, source_key_path
from specfleet.core.settings import Settings
from specfleet.core.sglang.install import PATCH_OPTS, patch_state_dir, venv_python
from specfleet.core.tables import ddtree_designs
from specfleet.core.tables import sglang_versions as versions

# The interpreter of the default venv (``Settings.venv``).
DEFAULT_PYTHON = sglang_python(Settings())
# PR#20547's opt-in switch for the DFlash v2 (overlap) worker.
V2_SWITCH = "SGLANG_ENABLE_DFLASH_SPEC_V2"

SPEC = "srt/speculative"
REGISTRY = "srt/layers/attention/attention_registry.py"

# What the host sends back, paths relative to the package directory. The host only lists and
# reads; every decision is made by ``parse_install`` here.
DIRS = [SPEC, "srt/models", "srt/layers/quantization", "srt/arg_groups", "srt/arg_groups/fields"]
TEXTS = [f"{SPEC}/spec_info.py", REGISTRY]
# Every spelling of DDTree in a line (the collector matches substrings, case and all).
DDTREE_NEEDLES = ["ddtree", "DDTREE", "DDTree", "DDtree", "Ddtree"]
# Where a tree declares its DDTree flags, fields and environment knobs.
SERVER_ARGS = "srt/server_args.py"
SPEC_FIELDS = "srt/arg_groups/fields/spec.py"
ENVIRON = "srt/environ.py"
SPEC_HOOK = "srt/arg_groups/speculative_hook.py"
LINES = {
    "_version.py": ["__version__"],
    "version.py": ["__version__"],
    ENVIRON: ["SGLANG_ENABLE_DFLASH_SPEC_V2", *DDTREE_NEEDLES],
    "srt/models/kimi_k25.py": ["class KimiK25ForConditionalGeneration"],
    "srt/models/deepseek_v2.py": ["class DeepseekV3ForCausalLM"],
    "srt/models/deepseek_v3.py": ["class DeepseekV3ForCausalLM"],
    SERVER_ARGS: [V2_SWITCH, *DDTREE_NEEDLES],
    SPEC_FIELDS: DDTREE_NEEDLES,
    SPEC_HOOK: DDTREE_NEEDLES,
}
# Where a v2 worker file is installed, the host also checks that it is wired in: the files below
# compile, and the v2 modules' `from sglang... import NAME` resolve in the same tree. Detection by
# file names alone was fooled (a v2 worker copied into 0.5.11 is never called).
V2_WORKER = f"{SPEC}/dflash_worker_v2.py"
V2_IMPORTS = [V2_WORKER, f"{SPEC}/dflash_info_v2.py"]
V2_COMPILES = [
    *V2_IMPORTS,
    f"{SPEC}/spec_info.py",
    "srt/server_args.py",
    "srt/model_executor/model_runner.py",
    "srt/model_executor/cuda_graph_runner.py",
    "srt/model_executor/model_runner_kv_cache_mixin.py",
]

# Runs in the target interpreter with -I -S (no cwd, no PYTHONPATH, no user site, no .pth file's
# code: ``specfleet.hostside.dists.site_paths`` finds the site folders). find_spec of a
# top-level name locates the package without executing its __init__ (which imports torch).
# argv[1]: the request (``collect_request``); argv[2] (tests only): a directory to search first.
# Prints the Python literal of what it found (``None`` without SGLang).
COLLECT = script_source("sglang_install.py")

_DDTREE_FIELD = re.compile(r"^\s*(\w*ddtree\w*)\s*:", re.IGNORECASE)
_DDTREE_FLAG = re.compile(r"""["'](--[\w-]*ddtree[\w-]*)["']""", re.IGNORECASE)
_DDTREE_ENV = re.compile(r"\b(SGLANG_\w*DDTREE\w*)\b")
_DECORATOR = re.compile(r"""@register_attention_backend\(\s*["']([^"']+)["']""")
# `__version__ = version = '0.5.11'` (vcs-versioning), or a plain literal assignment.
_VERSION = re.compile(r"""^__version__\s*=\s*(?:\w+\s*=\s*)?['"]([^'"]+)['"]\s*$""")


def collect_request() -> str:
    """The request the host-side collector is given: one tab-separated row per wanted item
    (``dir REL``, ``text REL``, ``line REL NEEDLE...``); the collector imports no parser."""
    rows = [f"dir\t{rel}" for rel in DIRS] + [f"text\t{rel}" for rel in TEXTS]
    rows += ["\t".join(["line", rel, *needles]) for rel, needles in LINES.items()]
    rows += [f"when\t{V2_WORKER}"] + [f"compile\t{rel}" for rel in V2_COMPILES]
    rows += [f"import\t{rel}" for rel in V2_IMPORTS]
    return "\n".join(rows)


def enum_members(source: str, class_name: str) -> list[str]:
    """The member names of ``class class_name(Enum)`` in ``source``, in source order."""
    return list(_enum_members(source, class_name))


@functools.lru_cache(maxsize=64)
def _enum_members(source: str, class_name: str) -> tuple[str, ...]:
    # One parse per distinct source: the hosts of a fleet send the same files.
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            names = []
            for stmt in node.body:
                targets = stmt.targets if isinstance(stmt, ast.Assign) else []
                if isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
                    targets = [stmt.target]
                names += [t.id for t in targets if isinstance(t, ast.Name) and t.id.isupper()]
            return tuple(names)
    return ()


def attention_backends(registry_source: str) -> list[str]:
    """The names registered with ``@register_attention_backend("...")``, sorted."""
    return sorted(set(_DECORATOR.findall(registry_source)))


def parse_install(collected: dict | None) -> dict | None:
    """Build the ``SGLangInstall`` value from what the host-side collector sent back."""
    if not collected:
        return None
    dirs = collected.get("dirs") or {}
    texts = collected.get("texts") or {}
    lines = collected.get("lines") or {}

    def has(rel_dir: str, name: str) -> bool:
        return name in (dirs.get(rel_dir) or [])

    def found(rel: str, needle: str) -> bool:
        return any(needle in line for line in lines.get(rel) or [])

    version = collected.get("dist_version")
    if not version:
        for rel in ("_version.py", "version.py"):
            match = next(
                (m for m in map(_VERSION.search, lines.get(rel) or []) if m is not None), None
            )
            if match:
                version = match.group(1)
                break

    speculative = dirs.get(SPEC) or []
    spec_info = texts.get(f"{SPEC}/spec_info.py") or ""
    algorithms = enum_members(spec_info, "SpeculativeAlgorithm")
    ddtree = ddtree_declared(lines, algorithms, speculative)
    v1 = has(SPEC, "dflash_worker.py")
    wiring = v2_wiring(
        collected,
        spec_info,
        environ_has_switch=found("srt/environ.py", V2_SWITCH),
        server_args_has_switch=found("srt/server_args.py", V2_SWITCH),
    )
    wired = wiring is not None and not wiring["missing"]
    features = {
        "dflash": "v2" if wired else "v1" if v1 else None,
        "dflash_pr20547": wired and wiring["switch"],
        "ddtree": bool(ddtree),
        "kimi_k25_model": found("srt/models/kimi_k25.py", "class KimiK25ForConditionalGeneration"),
        "deepseek_v3_model": found("srt/models/deepseek_v2.py", "class DeepseekV3ForCausalLM")
        or found("srt/models/deepseek_v3.py", "class DeepseekV3ForCausalLM"),
        "compressed_tensors_quant": has("srt/layers/quantization", "compressed_tensors"),
    }
    if wiring is not None and wiring["missing"]:
        # A v2 worker is installed but not wired in: what is missing, for the plan and status.
        features["dflash_v2_missing"] = wiring["missing"]
    out = {
        "version": version,
        "location": collected.get("location"),
        "features": features,
        "speculative_algorithms": algorithms,
        "attention_backends": attention_backends(texts.get(REGISTRY) or ""),
    }
    if ddtree is not None:
        out["ddtree"] = ddtree  # absent where nothing in the tree mentions DDTree
    if versions.is_placeholder(version):
        # A source build (setuptools-scm's fallback version): the release its files match.
        def holds(rel: str) -> bool:
            if rel.endswith("/"):
                return bool(dirs.get(rel.rstrip("/")))
            folder, _, name = rel.rpartition("/")
            return has(folder, name)

        found = versions.release_by_layout(holds)
        out["layout_release"] = (
            {"release": found[0], "marker": found[1]} if found is not None else None
        )
    return out


def ddtree_declared(
    lines: dict, algorithms: list[str], speculative_files: list[str]
) -> dict | None:
    """What the tree declares about DDTree (None: nothing mentions it), and the design row of
    specfleet.core.tables.ddtree_designs those declarations match (``"unknown"`` for none).
    Flags are the exact strings of the tree's add_argument calls, or (0.5.23-style field files)
    derived from the field names as arg_utils._field_to_cli_name does."""
    declared: set[str] = set()
    mentions = []
    for rel in (SERVER_ARGS, SPEC_FIELDS, ENVIRON, SPEC_HOOK):
        found = lines.get(rel) or []
        if found and any("ddtree" in line.lower() for line in found):
            mentions.append(rel)
        for line in found:
            if rel in (SERVER_ARGS, SPEC_FIELDS):
                declared |= {f"flag:{m}" for m in _DDTREE_FLAG.findall(line)}
                field = _DDTREE_FIELD.match(line)
                if field:
                    declared.add(f"field:{field.group(1)}")
                    if rel == SPEC_FIELDS:
                        declared.add("flag:--" + field.group(1).replace("_", "-"))
            if rel == ENVIRON:
                declared |= {f"env:{m}" for m in _DDTREE_ENV.findall(line)}
    declared |= {f"algorithm:{a}" for a in algorithms if "DDTREE" in a.upper()}
    files = [f"{SPEC}/{n}" for n in speculative_files if "ddtree" in n.lower()]
    declared |= {f"file:{f}" for f in files}
    mentions += files
    if not declared and not mentions:
        return None
    design = ddtree_designs.match_design(declared)
    out: dict[str, Any] = {
        "design": design.name if design else ddtree_designs.UNKNOWN,
        "declared": sorted(declared),
        "mentions": sorted(set(mentions)),
    }
    if design is not None:
        out["flags"] = {"algorithm": design.algorithm, "switch": design.switch_flag,
                        "budget": design.budget_flag}  # fmt: skip
        out["env"] = sorted(k.env for k in design.knobs if k.env)
    return out


@functools.lru_cache(maxsize=64)
def routes_to_v2(spec_info: str) -> bool:
    """Whether spec_info.py hands DFLASH to ``DFlashWorkerV2`` (an import of it from the v2
    worker module anywhere in the file: both the PR and 0.5.14 import it where they route)."""
    try:
        tree = ast.parse(spec_info)
    except SyntaxError:
        return False
    return any(
        isinstance(node, ast.ImportFrom)
        and node.module == "sglang.srt.speculative.dflash_worker_v2"
        and any(a.name == "DFlashWorkerV2" for a in node.names)
        for node in ast.walk(tree)
    )


def v2_wiring(
    collected: dict, spec_info: str, *, environ_has_switch: bool, server_args_has_switch: bool
) -> dict | None:
    """Whether an installed DFlash v2 worker is wired in: ``None`` without one, else
    ``{"switch": bool, "missing": [why it would not run, ...]}``. ``switch``: routed only under
    PR#20547's opt-in switch (``SGLANG_ENABLE_DFLASH_SPEC_V2``), as the PR does; 0.5.14 and later
    route DFLASH to v2 unconditionally."""
    if "compile_errors" not in collected:
        return None  # the host found no v2 worker file
    missing = [
        f"{rel} does not compile: {why}"
        for rel, why in sorted((collected.get("compile_errors") or {}).items())
    ]
    for rel, names in sorted((collected.get("unresolved") or {}).items()):
        missing.append(f"{rel} imports {', '.join(names)}, which this SGLang does not define")
    switch = V2_SWITCH in spec_info
    if not routes_to_v2(spec_info):
        missing.append("spec_info.py does not route DFLASH to DFlashWorkerV2 (v1 runs)")
    if switch and not environ_has_switch:
        missing.append(f"environ.py does not define {V2_SWITCH}")
    # PR-style (the switch in spec_info.py or environ.py): server_args must honour it too.
    if (switch or environ_has_switch) and not server_args_has_switch:
        missing.append("server_args.py still turns the overlap scheduler off for DFLASH")
    return {"switch": switch, "missing": missing}


def parse_collected_output(output: list[str]) -> dict | None:
    """The collector prints one literal (``None`` when SGLang is not installed)."""
    text = "\n".join(output).strip()
    if not text:
        return None
    return parse_install(parse_printed(text))


class SGLangInstall(FactBase[dict | None]):
    """
    Returns the SGLang installed for ``python`` (a venv's ``bin/python``), read from its files
    without importing it, or ``None`` where the interpreter or SGLang is absent.

    + python: the interpreter whose environment is inspected

    .. code:: python

        {
            "version": "0.5.11",
            "location": "/opt/specfleet/sglang/lib/python3.11/site-packages/sglang",
            "features": {
                "dflash": "v1",  # None | "v1" (dflash_worker.py) | "v2" (dflash_worker_v2.py)
                "dflash_pr20547": False,
                "ddtree": False,
                "kimi_k25_model": True,
                "deepseek_v3_model": True,
                "compressed_tensors_quant": True,
            },
            "speculative_algorithms": ["DFLASH", "EAGLE", "EAGLE3", "STANDALONE", "NGRAM", "NONE"],
            "attention_backends": ["aiter", "ascend", ..., "trtllm_mla", "wave"],
            # Only where the tree mentions DDTree: what it declares and the design row of
            # specfleet.core.tables.ddtree_designs it matches ("unknown" for none).
            "ddtree": {
                "design": "dflash-switch (DB-Guo/sglang-ddtree-dev)",
                "declared": ["field:speculative_dflash_enable_ddtree",
                             "flag:--speculative-dflash-enable-ddtree"],
                "mentions": ["srt/arg_groups/speculative_hook.py", "srt/server_args.py"],
                "flags": {"algorithm": "DFLASH", "switch": "--speculative-dflash-enable-ddtree",
                          "budget": "--speculative-num-draft-tokens"},
                "env": [],
            },
            # Only for a placeholder version (a source build's 0.0.0.dev0): the release whose
            # files the tree has (sglang_versions.LAYOUT_MARKERS).
            "layout_release": {"release": "0.5.13", "marker": "srt/arg_groups/speculative_hook.py"},
        }
    """

    def python_job(self, python: str = DEFAULT_PYTHON) -> PythonJob:
        return PythonJob(python, ISOLATED, COLLECT, (collect_request(),))

    @override
    def command(self, python: str = DEFAULT_PYTHON) -> StringCommand:
        # command -v: the interpreter may be a path (a venv's bin/python) or a bare name.
        return StringCommand("!", "command", "-v", QuoteString(python), ">/dev/null", "||",
                             *self.python_job(python).words())

    @override
    def process(self, output: list[str]) -> dict | None:
        return parse_collected_output(output)


# --------------------------------------------------------------------------------------------------
# The venv, a git ref's commit, and the state of an applied PR#20547 patch
# --------------------------------------------------------------------------------------------------


class Venv(FactBase[dict | None]):
    """Whether ``path`` is a venv: None if nothing is there, ``{"python": None}`` for a path that is
    not a venv, else the interpreter's version.

    .. code:: python

        {"path": "/opt/specfleet/sglang", "python": "3.11.2"}
    """

    def python_job(self, path: str) -> PythonJob:
        # -I -S as the SGLang facts of the same interpreter: a probe runs them in one process.
        return PythonJob(venv_python(path), ISOLATED,
                         "import sys; print('python=%d.%d.%d' % sys.version_info[:3])")

    def command(self, path: str) -> StringCommand:
        py = venv_python(path)
        return StringCommand(
            "if", "test", "-x", QuoteString(py), ";", "then", *self.python_job(path).words(), ";",
            "elif", "test", "-e", QuoteString(path), ";", "then", "echo", "python=", ";", "fi",
        )  # fmt: skip

    def process(self, output: list[str]) -> dict | None:
        for line in output:
            if line.startswith("python="):
                return {"python": line[len("python=") :].strip() or None}
        return None


class GitRemoteRefs(FactBase[list[str]]):
    """The raw ``git ls-remote URL REF`` lines, for ``parse_ls_remote``.

    .. code:: python

        ["e67a0d4880f1d6a1c4e0b9a3f1b2c3d4e5f60718\trefs/heads/dflash_v2"]
    """

    default = list

    def requires_command(self, *args: Any, **kwargs: Any) -> str:
        return "git"

    def command(self, url: str, ref: str) -> StringCommand:
        # No prompt for credentials: a private URL fails instead of hanging the deploy.
        return StringCommand(
            "GIT_TERMINAL_PROMPT=0", "git", "ls-remote", "--", QuoteString(url), QuoteString(ref),
            QuoteString(f"{ref}^{{}}"),
        )  # fmt: skip

    def process(self, output: list[str]) -> list[str]:
        return list(output)


class PatchState(FactBase[dict | None]):
    """An applied PR#20547 in a venv: the marker's sha256, the site it patched, and whether the
    files the apply wrote are still as it left them (``intact``: their sha256 were recorded).
    None if no patch was applied; ``partial`` for an apply that never reached its marker (its
    journal says what to restore); ``leftovers``, for a marker whose files changed, the files it
    added that are still exactly as it added them; ``rejected``, a port that failed the
    readiness gate here.

    .. code:: python

        {"sha256": "9f2c...", "site": "/opt/v/lib/python3.11/site-packages",
         "intact": True, "partial": False}
    """

    def requires_command(self, *args: Any, **kwargs: Any) -> str:
        return "patch"

    def command(self, venv: str) -> str:
        return self._command(patch_state_dir(venv))

    def _command(self, state_dir: str) -> str:
        d = shlex.quote(state_dir)
        return (
            f"d={d}; "
            'if [ -f "$d/sha256" ]; then '
            'echo "sha256=$(cat "$d/sha256")"; echo "site=$(cat "$d/site")"; '
            # Intact: every file the apply wrote is still as it left it.
            'if (cd "$(cat "$d/site")" && sha256sum --status -c "$d/applied.sha256") '
            ">/dev/null 2>&1; then echo intact=ok; else echo intact=no; "
            'if [ -f "$d/created.sha256" ]; then (cd "$(cat "$d/site")" && '
            'sha256sum -c "$d/created.sha256" 2>/dev/null '
            '| sed -n "s/^\\(.*\\): OK$/leftover=\\1/p"); '
            "fi; fi; "
            'elif [ -d "$d" ]; then echo partial=1; '
            'if [ -f "$d/conflict" ]; then sed "s/^/conflict:/" "$d/conflict"; fi; fi; '
            'if [ -f "$d.rejected" ]; then echo "rejected=$(cat "$d.rejected")"; fi'
        )

    def process(self, output: list[str]) -> dict | None:
        if not any(line.strip() for line in output):
            return None
        out: dict[str, Any] = {
            "sha256": None, "site": None, "intact": False, "partial": False,
            "conflict": [], "leftovers": [], "rejected": None,
        }  # fmt: skip
        for line in output:
            if line.startswith("sha256="):
                out["sha256"] = line[len("sha256=") :].strip() or None
            elif line.startswith("site="):
                out["site"] = line[len("site=") :].strip() or None
            elif line.startswith("intact="):
                out["intact"] = line.strip() == "intact=ok"
            elif line.startswith("partial="):
                out["partial"] = True
            elif line.startswith("leftover="):
                out["leftovers"].append(line[len("leftover=") :])
            elif line.startswith("conflict:"):
                out["conflict"].append(line[len("conflict:") :])
            elif line.startswith("rejected="):
                out["rejected"] = line[len("rejected=") :].strip() or None
        return out


class RopePatchState(PatchState):
    """The drafter RoPE patch (#52) in a venv, kept as PR#20547's is, in its own folder
    (``<venv>/.specfleet/dflash-rope``): the same fields as PatchState."""

    def command(self, venv: str) -> str:
        return self._command(rope_state_dir(venv))


class SourceTree(FactBase[dict]):
    """An SGLang source tree on the host (``sglang.source_path``): its pyproject.toml (None where
    absent) and whether ``cargo`` is on the PATH (a Rust extension needs it to build).

    .. code:: python

        {"pyproject": "[build-system]\nrequires = [...]\n...", "cargo": False}
    """

    def command(self, path: str) -> str:
        p = shlex.quote(path.rstrip("/") + "/pyproject.toml")
        return (
            f"if [ -f {p} ]; then echo '##pyproject'; cat {p}; echo; fi; "
            "if command -v cargo >/dev/null 2>&1; then echo '##cargo=1'; fi; true"
        )

    def process(self, output: list[str]) -> dict:
        out: dict[str, Any] = {"pyproject": None, "cargo": False}
        lines: list[str] | None = None
        for line in output:
            if line == "##pyproject":
                lines = []
            elif line == "##cargo=1":
                out["cargo"] = True
            elif lines is not None:
                lines.append(line)
        if lines is not None:
            out["pyproject"] = "\n".join(lines)
        return out


SOURCE_TREE_SCRIPT = script_source("source_tree.py")


class SourceTreeKey(FactBase[dict]):
    """The content of an SGLang source tree on the host (``sglang.source_path``) as one sha256,
    what a build writes into it left out, and the key ``sglang.installed`` recorded in ``venv``
    when it last built SGLang from a tree (``specfleet.core.layout.source_key_path``): a changed
    tree is rebuilt, an unchanged one is not. Read by the system python3 (-I -S), which runs
    nothing of the tree. ``sha256`` is None where no such folder is.

    .. code:: python

        {"sha256": "5d1c...e0", "files": 1712,
         "recorded": "5d1c...e0 /opt/src/sglang/python\n"}
    """

    @override
    def requires_command(self, *args: Any, **kwargs: Any) -> str:
        return "python3"

    @staticmethod
    def default() -> dict:
        return {"sha256": None, "files": 0, "recorded": None}

    def python_job(self, path: str, venv: str) -> PythonJob:
        return PythonJob("python3", ISOLATED, SOURCE_TREE_SCRIPT, (path, source_key_path(venv)))

    @override
    def command(self, path: str, venv: str) -> StringCommand:
        return StringCommand(*self.python_job(path, venv).words())

    @override
    def process(self, output: list[str]) -> dict:
        value = parse_printed("\n".join(output)) if output else None
        return value if isinstance(value, dict) else self.default()


class PatchCheck(FactBase[dict]):
    """A dry run of the diff given on stdin (``_stdin=``) in ``directory``: nothing is written.

    .. code:: python

        {"applies": False, "output": ["checking file sglang/srt/environ.py",
                                      "Hunk #1 FAILED at 57."]}
    """

    default = dict

    def requires_command(self, *args: Any, **kwargs: Any) -> str:
        return "patch"

    def command(self, directory: str) -> str:
        opts = " ".join(PATCH_OPTS)
        return (
            f"if cd {shlex.quote(directory)}; then "
            f"if patch --dry-run {opts} 2>&1; then echo '##applies=1'; "
            "else echo '##applies=0'; fi; else echo '##applies=0'; fi"
        )

    def process(self, output: list[str]) -> dict:
        applies = "##applies=1" in output
        return {"applies": applies, "output": [x for x in output if not x.startswith("##applies")]}


class FileHashes(FactBase[dict]):
    """The sha256 of each of ``paths`` under ``directory`` (None where absent): does a tree still
    hold a release's own files (a port of PR#20547 is keyed to them).

    .. code:: python

        {"sglang/srt/environ.py": "5a1f...", "sglang/srt/speculative/spec_info.py": None}
    """

    default = dict

    def command(self, directory: str, paths: tuple[str, ...] = ()) -> str:
        files = " ".join(shlex.quote(p) for p in paths)
        return (
            f"cd {shlex.quote(directory)} && for f in {files}; do "
            'if [ -f "$f" ]; then sha256sum -- "$f"; else printf "absent  %s\\n" "$f"; fi; done'
        )

    def process(self, output: list[str]) -> dict:
        out: dict[str, str | None] = {}
        for line in output:
            digest, _, path = line.partition("  ")
            if path:
                out[path] = None if digest == "absent" else digest.strip().lower()
        return out
