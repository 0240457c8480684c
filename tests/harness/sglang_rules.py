"""SGLang's own rules, run on a plan: each release's rule modules loaded standalone from its wheel.

``import sglang`` pulls in torch, triton, orjson and transformers, none of which is here. So this
harness reads the modules that hold the rules in that release (0.5.11-0.5.18:
``sglang/srt/server_args.py``, 0.5.13+ ``arg_groups/speculative_hook.py``, 0.5.15+
``arg_groups/overrides.py``, 0.5.17+ ``arg_groups/kimi_k3_hook.py``; 0.5.19 on:
``server_args.py`` (0.5.20 on with ``arg_groups/fields/*``) for the record and the command line,
and the resolution hooks ``arg_groups/{cuda_graph,memory,attention,speculative}_hook.py``, see
PIPELINE_MODULES and PIPELINE_STEPS) straight out of the real PyPI wheel and executes them as
they are, with these stand-ins and nothing else:

- every name the module imports from another ``sglang`` module gets a ``Missing`` object that
  raises ``StubCalled`` the moment it is called or read from. A rule that reaches a name nobody
  stubbed fails the test loudly rather than taking a quiet False;
- the per-machine hardware predicates (``is_cuda``, ``is_hip``, ``is_sm90_supported`` ...,
  ``get_device_memory_capacity``, ``get_device_sm``) answer for the machine profile (0.5.23 reads
  them through its own ``runtime_context.get_platform()``);
- ``sglang/srt/environ.py`` (``envs``) is the wheel's own, loaded the same way;
- the model config (``get_model_config``) is built from the Kimi K2.6 config fields listed in
  ``KIMI_K26_MODEL``, each with its source.

Each plan's argv is parsed with that release's own ``ServerArgs.add_cli_args``; the
``ServerArgs`` object is filled field by field as ``from_cli_args`` does, but ``__post_init__`` is
never run whole: its dozens of steps under stubs would mostly exercise the stubs. Only the rule
methods are called, in ``__post_init__``'s order: the piecewise CUDA graph decision, the GPU
memory settings (``mem_fraction_static``, ``chunked_prefill_size``, CUDA graph sizes), the
attention-backend compatibility rule (``page_size`` for trtllm_mla ...), and the
speculative-decoding checks (DFLASH: dp attention, pp size, draft window, ``max_running_requests``,
overlap schedule); from 0.5.15 after ``_handle_missing_default_values`` (the DFLASH check reads
the device it fills in). 0.5.19 on have no such ``__post_init__`` (``resolve_once`` runs
``arg_groups/pipeline.py``): its ``from_cli_args`` runs as it is, then only the pipeline steps in
PIPELINE_STEPS that the release's own pipeline.py calls, through its own ``run_hook`` (0.5.20 on;
0.5.19 calls them directly), on the record sealed as ``resolve_once`` seals it (0.5.20 on).

"Not enough memory" is raised by SGLang at model load (``pool_configurator.py``), not by
``ServerArgs``: ``Verdict.kv_room_gib`` models it from the fraction SGLang's code computed here,
the GPU memory and the weights per GPU. That step is modelled, not executed.
"""

from __future__ import annotations
import __future__

import argparse
import ast
import copy
import dataclasses
import decimal
import enum
import importlib.abc
import importlib.machinery
import inspect
import os
import re
import sys
import types
import zipfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from typing import Any

try:
    from tests.harness.releases import WHEELHOUSE
except ImportError:  # on a fleet host, beside the stand-in server: releases.py is uploaded with it
    from releases import WHEELHOUSE

GIB = 1024**3
MIB = 1024**2

# The releases of the version table the harness runs, and the module that holds the memory rule.
MEMORY_RULE_MODULE = {
    "0.5.11": "sglang/srt/server_args.py",
    "0.5.12": "sglang/srt/server_args.py",
    "0.5.13": "sglang/srt/server_args.py",
    "0.5.14": "sglang/srt/server_args.py",
    "0.5.15": "sglang/srt/server_args.py",
    "0.5.16": "sglang/srt/server_args.py",
    "0.5.17": "sglang/srt/server_args.py",
    "0.5.18": "sglang/srt/server_args.py",
    "0.5.19": "sglang/srt/arg_groups/memory_hook.py",
    "0.5.20": "sglang/srt/arg_groups/memory_hook.py",
    "0.5.21": "sglang/srt/arg_groups/memory_hook.py",
    "0.5.22": "sglang/srt/arg_groups/memory_hook.py",
    "0.5.23": "sglang/srt/arg_groups/memory_hook.py",
}
RELEASES = WHEELHOUSE
if set(MEMORY_RULE_MODULE) != set(RELEASES):
    raise RuntimeError(f"sglang_rules: the memory rule's module is known for {sorted(MEMORY_RULE_MODULE)}"
                       f", the wheelhouse has {sorted(RELEASES)}: add the release's module here")


class StubCalled(RuntimeError):
    """A rule reached an imported name the harness did not stand in for."""


class Missing:
    """An imported name nobody stood in for: any use raises StubCalled."""

    def __init__(self, qualname: str):
        object.__setattr__(self, "_qualname", qualname)

    def __call__(self, *args, **kwargs):
        raise StubCalled(f"{self._qualname}() called: not stood in for by the harness")

    def __getattr__(self, name):
        if name.startswith("__"):
            # Python's own probes (typing, copy, repr) are not a rule reading the name.
            raise AttributeError(name)
        raise StubCalled(f"{self._qualname}.{name} read: not stood in for by the harness")

    def __repr__(self):
        return f"<Missing {self._qualname}>"


class _FakeModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return Missing(f"{self.__name__}.{name}")


class ArgumentRefused(Exception):
    """The release's own parser refused the argv (argparse's message)."""


class _RefusingParser(argparse.ArgumentParser):
    def error(self, message):
        raise ArgumentRefused(f"{self.prog}: error: {message}")


class AttentionArch(enum.Enum):
    """Stands in for sglang.srt.configs.model_config.AttentionArch (the two members read)."""

    MLA = enum.auto()
    MHA = enum.auto()


# Kimi K2.6's config.json fields the rules read, and where each comes from.
KIMI_K26_MODEL = {
    # "architectures" (sglang.md section 2: KimiK25ForConditionalGeneration wraps
    # DeepseekV3ForCausalLM(text_config) plus the MoonViT vision tower).
    "architectures": ["KimiK25ForConditionalGeneration"],
    # text_config.kv_lora_rank is set (DeepseekV3 MLA): ModelConfig's attention_arch is MLA.
    "mla": True,
    # vision_config: sglang/srt/configs/kimi_k25.py KimiK25VisionConfig defaults (MoonViT, 27
    # layers, 1152 wide), read by adjust_mem_fraction_for_vlm as num_hidden_layers / hidden_size.
    "vision_config": {"num_hidden_layers": 27, "hidden_size": 1152},
    # text_config.max_position_embeddings of K2.x.
    "context_len": 262144,
}
# The same target as a text-only checkpoint: the config the real-GPU run of issue 30 used (Kimi
# K2's text dimensions, DeepseekV3ForCausalLM).
KIMI_K2_TEXT_MODEL = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "mla": True,
    "vision_config": None,
    "context_len": 262144,
}
# z-lab/Kimi-K2.6-DFlash config.json fields the rules read (sglang.md section 3).
KIMI_K26_DFLASH = {"architectures": ["DFlashDraftModel"], "block_size": 8}

# ModelConfig's flags, each an "arch in <list>" test over a list literal of the wheel's own
# sglang/srt/configs/model_config.py (is_multimodal also holds with a vision_config).
ARCH_LISTS = {
    "is_multimodal": "multimodal_model_archs",
    "is_piecewise_cuda_graph_disabled_model": "piecewise_cuda_graph_disabled_model_archs",
    "is_multimodal_piecewise_cuda_graph_supported": (
        "multimodal_piecewise_cuda_graph_supported_model_archs"
    ),
    # 0.5.23 (cuda_graph_hook.py: a multimodal model keeps the breakable prefill graph only here).
    "is_multimodal_breakable_cuda_graph_supported": (
        "multimodal_breakable_cuda_graph_supported_model_archs"
    ),
}


def model_config(version: str, fields: Mapping[str, Any]) -> types.SimpleNamespace:
    """A stand-in for ModelConfig: the fields given, the flags from the wheel's own arch lists."""
    lists = _literal_constants(version, "sglang.srt.configs.model_config")
    archs = list(fields["architectures"])
    vision = fields.get("vision_config")
    hf = types.SimpleNamespace(architectures=archs)
    if vision is not None:
        hf.vision_config = types.SimpleNamespace(**vision)
    flags = {
        flag: any(a in lists.get(name, ()) for a in archs) for flag, name in ARCH_LISTS.items()
    }
    flags["is_multimodal"] = flags["is_multimodal"] or vision is not None
    return _ModelConfig(
        hf_config=hf,
        attention_arch=AttentionArch.MLA if fields["mla"] else AttentionArch.MHA,
        context_len=fields["context_len"],
        # Kimi K2.6 is a decoder only (config.json has no is_encoder_decoder).
        is_encoder_decoder=False,
        **flags,
    )


class _ModelConfig(types.SimpleNamespace):
    """The model config stand-in: a field it was not given fails loudly."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise StubCalled(f"ModelConfig.{name} read: not given to the harness")


@dataclass(frozen=True)
class Machine:
    """The hardware predicates of one machine profile."""

    memory_mib: int
    sm: tuple[int, int]
    device_count: int

    def predicates(self) -> dict[str, Any]:
        major = self.sm[0]
        return {
            "get_device_memory_capacity": lambda device=None: self.memory_mib,
            "get_device_sm": lambda: major * 10 + self.sm[1],
            "get_device_name": lambda device_id=0: "stand-in GPU",
            "get_device": lambda device_id=None: "cuda",
            "is_cuda": lambda: True,
            "is_cuda_alike": lambda: True,
            "is_hip": lambda: False,
            "is_npu": lambda: False,
            "is_cpu": lambda: False,
            "is_mps": lambda: False,
            "is_xpu": lambda: False,
            "is_hpu": lambda: False,
            "is_musa": lambda: False,
            "is_sm90_supported": lambda device=None: major == 9,
            "is_sm100_supported": lambda device=None: major == 10,
            "is_sm120_supported": lambda device=None: major == 12,
            "is_blackwell_supported": lambda device=None: major in (10, 11, 12),
            "is_blackwell": lambda: major in (10, 11, 12),
            # 0.5.23's runtime_context.get_platform() reads these probes of utils.common.
            "is_sm100_or_sm110_supported": lambda device=None: major in (10, 11),
            "is_sm110_supported": lambda device=None: major == 11,
            # Hopper under the CUDA of every torch these releases pin (12.8 and later).
            "is_hopper_with_cuda_12_3": lambda: major == 9,
            "get_device_capability": lambda device_id=0: self.sm,
            # flashinfer-python is a dependency of every release's wheel.
            "is_flashinfer_available": lambda: True,
            "cpu_has_amx_support": lambda: False,
        }


def wheel_text(source: str, path: str) -> str:
    return _wheel_files(source)[path]


@cache
def _wheel_files(source: str) -> dict[str, str]:
    """{``sglang/...py``: text} of a release's PyPI wheel (``source`` a version), or of an
    installed tree (``source`` the absolute path of its ``sglang`` package folder)."""
    out = {}
    if os.path.isabs(source):
        root = os.path.dirname(source)
        for folder, _dirs, files in os.walk(source):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    with open(path, encoding="utf-8", errors="replace") as f:
                        out[os.path.relpath(path, root).replace(os.sep, "/")] = f.read()
        return out
    from tests.harness.sources import sglang_wheel  # the wheel cache; absent on a fleet host

    with zipfile.ZipFile(sglang_wheel(source)) as z:
        for name in z.namelist():
            if name.startswith("sglang/") and name.endswith(".py"):
                out[name] = z.read(name).decode("utf-8")
    return out


# The wheel's modules executed as they are (in this order, where the release has them): the
# rule modules and the stdlib-only ones they import at the top or inside the rule methods.
# 0.5.11-0.5.14: server_args.py holds the parser and the rule methods.
WHEEL_MODULES = (
    "sglang.srt.environ",
    "sglang.jit_kernel.kv_canary.consts",
    "sglang.kernels.ops.kv_canary.consts",  # 0.5.17 on
    "sglang.srt.arg_groups.overrides",  # 0.5.15 on: resolved_view
    "sglang.srt.arg_groups.argparse_actions",
    "sglang.srt.arg_groups.arg_utils",
    "sglang.srt.model_executor.cuda_graph_config",
    "sglang.srt.arg_groups.kimi_k3_hook",  # 0.5.17 on: _handle_cuda_graph_config calls it
    "sglang.srt.arg_groups.speculative_hook",
    "sglang.srt.server_args",
)
# 0.5.23: a msgspec record built from the arg_groups/fields/ namespaces, resolved by the hooks of
# arg_groups/pipeline.py (each one writes through declare_resolution); the hardware facts come
# from runtime_context.get_platform(), whose probes are utils.common's predicates.
PIPELINE_MARKER = "sglang/srt/arg_groups/pipeline.py"
PIPELINE_MODULES = (
    "sglang.srt.environ",
    "sglang.kernels.ops.kv_canary.consts",
    "sglang.srt.arg_groups.prefill_buffer_ceiling",
    "sglang.srt.runtime_context",
    "sglang.srt.model_executor.cuda_graph_config",
    "sglang.srt.arg_groups.argparse_actions",
    "sglang.srt.arg_groups.arg_utils",
    "sglang.srt.arg_groups.choices",
    "sglang.srt.arg_groups.field_order",
    "sglang.srt.arg_groups.fields",
    "sglang.srt.arg_groups.fields.device",
    "sglang.srt.arg_groups.fields.disagg",
    "sglang.srt.arg_groups.fields.exec_",
    "sglang.srt.arg_groups.fields.lora",
    "sglang.srt.arg_groups.fields.memory",
    "sglang.srt.arg_groups.fields.mm",
    "sglang.srt.arg_groups.fields.model",
    "sglang.srt.arg_groups.fields.observability",
    "sglang.srt.arg_groups.fields.parallel",
    "sglang.srt.arg_groups.fields.schedule",
    "sglang.srt.arg_groups.fields.serving",
    "sglang.srt.arg_groups.fields.spec",
    "sglang.srt.arg_groups.model_override_base",
    "sglang.srt.arg_groups.model_overrides.qwen3_vl",  # memory_hook calls one of its functions
    "sglang.srt.arg_groups.overrides",
    "sglang.srt.arg_groups.resolution_hooks",
    "sglang.srt.arg_groups.parallel_hook",
    "sglang.srt.arg_groups.cuda_graph_hook",
    "sglang.srt.arg_groups.serving_hook",
    "sglang.srt.arg_groups.memory_hook",
    "sglang.srt.arg_groups.attention_hook",
    "sglang.srt.arg_groups.speculative_hook",
    "sglang.srt.server_args",
)

# (module, file in the wheel, class, registry attribute) whose keys are the CLI's parser choices.
PARSER_REGISTRIES = (
    ("sglang.srt.parser.reasoning_parser", "sglang/srt/parser/reasoning_parser.py",
     "ReasoningParser", "DetectorMap"),
    ("sglang.srt.function_call.function_call_parser",
     "sglang/srt/function_call/function_call_parser.py", "FunctionCallParser", "ToolCallParserEnum"),
)  # fmt: skip


@cache
def _parsed(source: str) -> ast.Module:
    """A wheel module's syntax tree, parsed once per process: every machine profile's Release
    reads the same files, and parsing them again is most of what a new profile would cost."""
    return ast.parse(source)


@cache
def _compiled(source: str, filename: str):
    """A wheel module's code object, compiled once per process; each Release still executes it
    into its own fresh module, so the machine predicates it binds at import stay its own."""
    return compile(source, filename, "exec")


@cache
def _top_level_code(source: str) -> tuple[tuple[str, bool, Any], ...]:
    """(name, is a class, code object) of each module-level ``def`` and ``class`` of ``source``
    in order, each compiled alone under ``from __future__ import annotations`` and without its
    decorators (the statement from its ``def``/``class`` line on), to run in the caller's names."""
    out = []
    for node in _parsed(source).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            bare = copy.copy(node)
            bare.decorator_list = []
            code = compile(
                ast.Module(body=[bare], type_ignores=[]), f"<{node.name}>", "exec",
                flags=__future__.annotations.compiler_flag, dont_inherit=True,
            )  # fmt: skip
            out.append((node.name, isinstance(node, ast.ClassDef), code))
    return tuple(out)


@cache
def _class_dict_keys(source: str, cls: str, attr: str) -> tuple[str, ...]:
    """The string keys of the dict literal ``attr`` in class ``cls`` of ``source``."""
    for node in ast.walk(_parsed(source)):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for stmt in node.body:
                target = getattr(stmt, "target", None) or (getattr(stmt, "targets", None) or [None])[0]
                if isinstance(target, ast.Name) and target.id == attr and isinstance(stmt.value, ast.Dict):
                    return tuple(k.value for k in stmt.value.keys if isinstance(k, ast.Constant))
    raise StubCalled(f"{cls}.{attr} not found as a dict literal")


def _exec_class(source: str, cls: str, names: Mapping[str, Any]) -> type:
    """Execute only class ``cls`` of a wheel module (whose other imports cannot load here)."""
    for name, is_class, code in _top_level_code(source):
        if is_class and name == cls:
            namespace = {"Enum": enum.Enum, "IntEnum": enum.IntEnum, "auto": enum.auto, **names}
            exec(code, namespace)
            return namespace[cls]
    raise StubCalled(f"class {cls} not found")


def _exec_functions(source: str, names: Mapping[str, Any]) -> dict[str, Any]:
    """The module-level functions of a wheel module whose imports cannot load here (0.5.23's
    configs/model_config.py imports torch): each ``def`` executed alone, beside the module's
    literal constants, so its predicates over an HF config (is_deepseek_v4 ...) are the wheel's."""
    namespace: dict[str, Any] = dict(names)
    for _name, is_class, code in _top_level_code(source):
        if not is_class:
            try:
                exec(code, namespace)
            except NameError:
                continue  # a default naming what is not here: not a predicate
    return {k: v for k, v in namespace.items() if callable(v) and k not in names}


# utils.common's argparse value types (0.5.11-0.5.14: --context-length's human_readable_int):
# stdlib only, so the wheel's own functions parse the flags, not stand-ins.
COMMON_ARG_TYPES = ("human_readable_int",)


def _common_arg_types(version: str) -> dict[str, Any]:
    source = _wheel_files(version).get("sglang/srt/utils/common.py")
    if source is None:
        return {}
    namespace: dict[str, Any] = {"re": re, "argparse": argparse, "Decimal": decimal.Decimal}
    for name, _is_class, code in _top_level_code(source):
        if name in COMMON_ARG_TYPES:
            exec(code, namespace)
    return {name: namespace[name] for name in COMMON_ARG_TYPES if name in namespace}


def _literal_constants(version: str, dotted: str) -> dict[str, Any]:
    """Module-level ``NAME = <literal>`` of a wheel module (nothing when it is not a file); a
    copy, so a rule that changes a list it was handed cannot reach the next Release."""
    return copy.deepcopy(_literal_constants_once(version, dotted))


@cache
def _literal_constants_once(version: str, dotted: str) -> dict[str, Any]:
    source = _wheel_files(version).get(dotted.replace(".", "/") + ".py")
    out: dict[str, Any] = {}
    if source is None:
        return out
    for node in _parsed(source).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name):
                try:
                    out[target.id] = ast.literal_eval(node.value)
                except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                    pass
    return out


@cache
def _imports(source: str, top_level: bool = False) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """(module, names) of every ``from sglang... import`` and ``import sglang...``: anywhere, or
    only at module level."""
    found = []
    tree = _parsed(source)
    for node in tree.body if top_level else ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sglang"):
            found.append((node.module, tuple(a.name for a in node.names)))
        elif isinstance(node, ast.Import):
            found.extend((a.name, ()) for a in node.names if a.name.startswith("sglang"))
    return tuple(found)


class _WheelFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports a release's wheel modules (WHEEL_MODULES / PIPELINE_MODULES) on first use."""

    def __init__(self, release: Release):
        self.release = release

    def find_spec(self, fullname, path=None, target=None):
        release = self.release
        if fullname in release.wheel_modules and release._has(fullname):
            return importlib.machinery.ModuleSpec(fullname, self)
        return None

    def create_module(self, spec):
        return self.release._load(spec.name)

    def exec_module(self, module):
        pass


class Release:
    """One release's rule modules, loaded standalone from its wheel for one machine."""

    def __init__(self, version: str, machine: Machine):
        self.version = version
        self.machine = machine
        self.modules: dict[str, types.ModuleType] = {}
        self._depth = 0
        self.pipeline = PIPELINE_MARKER in _wheel_files(version)
        self.wheel_modules = PIPELINE_MODULES if self.pipeline else WHEEL_MODULES
        self._fake("sglang.srt.platforms").current_platform = types.SimpleNamespace(
            apply_server_args_defaults=lambda server_args: None,
            is_out_of_tree=lambda: False,
        )
        model_config_module = self._fake("sglang.srt.configs.model_config")
        model_config_module.AttentionArch = AttentionArch
        if self.pipeline or self._has("sglang.srt.arg_groups.overrides"):
            # The hooks (0.5.18's breakable-graph rules too) call model_config.py's predicates
            # over the HF config (is_deepseek_v4, uses_kda_attention ...): the wheel's own.
            source = wheel_text(version, "sglang/srt/configs/model_config.py")
            constants = _literal_constants(version, "sglang.srt.configs.model_config")
            for name, fn in _exec_functions(source, constants).items():
                setattr(model_config_module, name, fn)
        # check_gguf_file reads the model folder: the plan's target is never a GGUF file.
        self._fake("sglang.srt.utils.hf_transformers_utils").check_gguf_file = lambda p: False
        self._fake("sglang.srt.debug_utils.cuda_coredump")
        common = self._fake("sglang.srt.utils.common")
        for name, fn in {**_common_arg_types(version), **machine.predicates()}.items():
            setattr(common, name, fn)
            # sglang/srt/utils/__init__.py re-exports common's names (0.5.23 imports both ways).
            setattr(self.modules["sglang.srt.utils"], name, fn)
        # get_config reads a model folder's config.json: answered from the fields given to judge().
        self.configs: dict[str, Mapping[str, Any]] = {}
        self._fake("sglang.srt.utils.hf_transformers_utils").get_config = self._get_config
        # The parser registries: only their names are read (the CLI's choices), taken from the
        # wheel's own class bodies rather than importing the parsers.
        for module, path, cls, attr in PARSER_REGISTRIES:
            keys = _class_dict_keys(wheel_text(version, path), cls, attr)
            setattr(self._fake(module), cls, type(cls, (), {attr: dict.fromkeys(keys)}))
        # spec_info.py imports torch (0.5.14): its SpeculativeAlgorithm class alone is executed
        # from the wheel's text; no custom algorithm is registered (get_spec finds none).
        if self._has("sglang.srt.speculative.spec_info"):
            registry = self._fake("sglang.srt.speculative.spec_registry")
            registry.CustomSpecAlgo = type("CustomSpecAlgo", (), {})
            registry.get_spec = lambda name: None
            spec_info = self._fake("sglang.srt.speculative.spec_info")
            # 0.5.23: handle_server_args reads resolving_view (overrides.py, loaded below).
            self._spec_info_names = {
                "_get_registered_spec": registry.get_spec,
                "CustomSpecAlgo": registry.CustomSpecAlgo,
            }
            spec_info.SpeculativeAlgorithm = _exec_class(
                wheel_text(version, "sglang/srt/speculative/spec_info.py"),
                "SpeculativeAlgorithm",
                self._spec_info_names,
            )
        for dotted in self.wheel_modules:
            if self._has(dotted):
                self._load(dotted)
        if self.pipeline:
            self._spec_info_names["resolving_view"] = self.modules[
                "sglang.srt.arg_groups.overrides"
            ].resolving_view
        if self._has("sglang.srt.speculative.ragged_verify"):
            # 0.5.16 on: handle_server_args validates SGLANG_RAGGED_VERIFY_MODE first
            # (ragged_verify.py imports torch): its enum and reader executed from the wheel's text.
            source = wheel_text(version, "sglang/srt/speculative/ragged_verify.py")
            ragged = self._fake("sglang.srt.speculative.ragged_verify")
            ragged.RaggedVerifyMode = _exec_class(source, "RaggedVerifyMode", {})
            names = {"envs": self.modules["sglang.srt.environ"].envs,
                     "RaggedVerifyMode": ragged.RaggedVerifyMode}  # fmt: skip
            ragged.read_ragged_verify_mode = _exec_functions(source, names)["read_ragged_verify_mode"]
        self.server_args = self.modules["sglang.srt.server_args"]

    def _path(self, dotted: str) -> str | None:
        """The wheel file of module ``dotted`` (a package's ``__init__.py``), None if absent."""
        files = _wheel_files(self.version)
        base = dotted.replace(".", "/")
        return next((p for p in (base + ".py", base + "/__init__.py") if p in files), None)

    def _has(self, dotted: str) -> bool:
        return self._path(dotted) is not None

    def _get_config(self, path, **kwargs):
        fields = self.configs.get(path)
        if fields is None:
            raise StubCalled(f"get_config({path!r}): no config fields given for that folder")
        return types.SimpleNamespace(**fields)

    def _fake(self, dotted: str) -> types.ModuleType:
        parts = dotted.split(".")
        for i in range(1, len(parts) + 1):
            name = ".".join(parts[:i])
            if name not in self.modules:
                mod = _FakeModule(name)
                mod.__path__ = []
                self.modules[name] = mod
                if i > 1:
                    setattr(self.modules[".".join(parts[: i - 1])], parts[i - 1], mod)
        return self.modules[dotted]

    def _load(self, dotted: str) -> types.ModuleType:
        """Execute the wheel's own module ``dotted``; what it imports from sglang is stood in for,
        except the stdlib-only modules of WHEEL_MODULES, which are loaded the same way first."""
        if dotted in self.modules and not isinstance(self.modules[dotted], _FakeModule):
            return self.modules[dotted]
        path = self._path(dotted)
        source = wheel_text(self.version, path)
        top_level = {m for m, _ in _imports(source, top_level=True)}
        for module, names in _imports(source):
            for sub in names:
                # ``from sglang.srt.arg_groups import model_override_base``: a module, not a name.
                if f"{module}.{sub}" in self.wheel_modules and module in top_level:
                    self._load(f"{module}.{sub}")
            if module in self.wheel_modules and self._has(module):
                # Imports inside functions (speculative_hook <-> server_args) find the module
                # loaded by the time the function runs.
                if module in top_level:
                    self._load(module)
                continue
            fake = self._fake(module)
            # Constants (a literal list, string, number) come from the imported module's own text.
            constants = _literal_constants(self.version, module)
            for name in names:
                if name in constants and name not in fake.__dict__:
                    setattr(fake, name, constants[name])
        parent, _, leaf = dotted.rpartition(".")
        self._fake(parent)
        mod = types.ModuleType(dotted)
        mod.__file__ = f"<{self.version} wheel>/{path}"
        if path.endswith("/__init__.py"):
            mod.__path__ = []
        with self.installed():
            sys.modules[dotted] = mod
            exec(_compiled(source, mod.__file__), mod.__dict__)
        setattr(self.modules[parent], leaf, mod)
        self.modules[dotted] = mod
        return mod

    @contextmanager
    def installed(self) -> Iterator[None]:
        """This release's modules in sys.modules while a rule runs (its imports inside functions);
        a wheel module of this release imported there and not loaded yet is loaded then (0.5.23's
        runtime_context imports arg_utils inside functions it calls while it loads)."""
        if self._depth:
            sys.modules.update(self.modules)
            yield
            return
        saved = {k: v for k, v in sys.modules.items() if k == "sglang" or k.startswith("sglang.")}
        for k in saved:
            del sys.modules[k]
        sys.modules.update(self.modules)
        finder = _WheelFinder(self)
        sys.meta_path.insert(0, finder)
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            sys.meta_path.remove(finder)
            for k in [k for k in sys.modules if k == "sglang" or k.startswith("sglang.")]:
                del sys.modules[k]
            sys.modules.update(saved)

    # ---------------------------------------------------------------------------------------------

    def parse(self, argv: list[str]) -> argparse.Namespace:
        """The argv after ``python -m sglang.launch_server``, parsed by this release's own parser."""
        parser = _RefusingParser()
        with self.installed():
            self.server_args.ServerArgs.add_cli_args(parser)
            return parser.parse_args(argv)

    def server_args_from(self, args: argparse.Namespace, model: Mapping[str, Any]):
        """The release's own ``from_cli_args`` on ``args``, minus ``__post_init__``.

        ``from_cli_args`` builds ``cls(**fields)``; it is handed a subclass whose only change is
        an empty ``__post_init__``, so its own field mapping (``tp_size`` from
        ``tensor_parallel_size`` ...) runs and the rule methods stay the release's own.
        """
        cls = self.server_args.ServerArgs
        if self.pipeline:
            # 0.5.23's __post_init__ resolves nothing ("launchers call resolve_once"): its own
            # from_cli_args as it is; the model config goes where model_config_of memoizes it
            # (a configuration with no _model_config_built_from is handed back as it is).
            with self.installed():
                sa = cls.from_cli_args(args)
            sa._model_config = model_config(self.version, model)
            return sa
        unchecked = type("ServerArgsWithoutPostInit", (cls,), {"__post_init__": lambda self: None})
        with self.installed():
            sa = cls.from_cli_args.__func__(unchecked, args)
        object.__setattr__(sa, "model_config", model_config(self.version, model))
        return sa


@dataclass
class Verdict:
    """What one release's own code made of one plan on one machine."""

    version: str
    refused: str | None
    mem_fraction_static: float | None = None
    max_running_requests: int | None = None
    disable_overlap_schedule: bool | None = None
    chunked_prefill_size: int | None = None
    cuda_graph_max_bs: int | None = None
    changed: dict[str, Any] = field(default_factory=dict)

    def kv_room_gib(self, gpu_memory_mib: int, weights_per_gpu_bytes: int) -> float:
        """Modelled, not executed: GiB per GPU left for the KV cache after the weights."""
        return (self.mem_fraction_static * gpu_memory_mib * MIB - weights_per_gpu_bytes) / GIB


# The ServerArgs fields a plan decides, compared before and after the rules ran.
WATCHED = (
    "mem_fraction_static", "max_running_requests", "disable_overlap_schedule", "page_size",
    "attention_backend", "speculative_draft_attention_backend", "speculative_num_draft_tokens",
    "speculative_num_steps", "speculative_eagle_topk", "chunked_prefill_size", "tp_size",
)  # fmt: skip


def judge(
    version: str,
    machine: Machine,
    argv: list[str],
    model: Mapping[str, Any] = KIMI_K26_MODEL,
    drafter: Mapping[str, Any] = KIMI_K26_DFLASH,
) -> Verdict:
    """Run ``version``'s own rules on ``argv`` (the flags after ``-m sglang.launch_server``);
    ``version`` a release (its wheel) or an installed tree (its ``sglang`` folder's path)."""
    release = _release(version, machine)
    try:
        args = release.parse(argv)
    except ArgumentRefused as exc:
        return Verdict(version, refused=str(exc))
    release.configs = {
        args.model_path: {"architectures": list(model["architectures"])},
        args.speculative_draft_model_path: dict(drafter),
    }
    sa = release.server_args_from(args, model)
    before = {k: getattr(sa, k, None) for k in WATCHED}
    try:
        with release.installed():
            _run_rules(release, sa)
    except (ValueError, AssertionError) as exc:
        return Verdict(version, refused=str(exc))
    after = {k: _resolved(release, sa, k) for k in WATCHED}
    decode_max_bs = getattr(sa, "cuda_graph_max_bs", None)
    graphs = _resolved(release, sa, "cuda_graph_config")
    if decode_max_bs is None and graphs is not None:
        decode_max_bs = graphs.decode.max_bs
    return Verdict(
        version,
        refused=None,
        mem_fraction_static=after["mem_fraction_static"],
        max_running_requests=after["max_running_requests"],
        disable_overlap_schedule=after["disable_overlap_schedule"],
        chunked_prefill_size=after["chunked_prefill_size"],
        cuda_graph_max_bs=decode_max_bs,
        changed={k: (before[k], after[k]) for k in WATCHED if before[k] != after[k]},
    )


# 0.5.23: the steps of arg_groups/pipeline.py run_resolution_pipeline that decide what a plan
# sets (module, function; in the pipeline's order), through its own run_hook. The steps between
# them concern features a plan never turns on (PD disaggregation, hicache, LoRA, MoE a2a, DLLM,
# platform backends of NPU/HPU/XPU/CPU/MPS ...) or, for handle_model_specific_adjustments, write
# only what the plan sets explicitly (the Kimi K2.5 provider in model_overrides/deepseek_v2.py picks
# an attention backend only when none is given).
PIPELINE_STEPS = (
    ("parallel_hook", "handle_deprecated_dp_attention"),  # --enable-dp-attention: --attn-dp-size
    ("serving_hook", "handle_missing_default_values"),  # device, tokenizer path, draft quant
    ("cuda_graph_hook", "handle_cuda_graph_config"),  # decode/prefill graph backends and sizes
    ("memory_hook", "handle_gpu_memory_settings"),  # chunked prefill, graph max bs, the fraction
    ("attention_hook", "handle_attention_backend_compatibility"),  # backends, MLA page sizes
    ("overrides", "_page_size_default"),  # a post-process pass: page_size 1 when unset
    ("overrides", "_pipeline_parallel_overlap_disable"),  # a post-process pass
    ("speculative_hook", "handle_speculative_decoding"),  # DFLASH checks, max_running_requests
)


def pipeline_steps(version: str) -> tuple[tuple[str, str], ...]:
    """The PIPELINE_STEPS this release's own ``arg_groups/pipeline.py`` runs, in its order: a step
    it does not call is not one of its steps (``handle_deprecated_dp_attention`` is first called
    in 0.5.22, ``run_hook`` wraps the calls from 0.5.20)."""
    called = {
        node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
        for node in ast.walk(_parsed(wheel_text(version, PIPELINE_MARKER)))
        if isinstance(node, ast.Call)
    }
    # run_hook(fn, server_args) and run_post_process_pass(server_args, fn) name the step as an
    # argument, not as the callee.
    named = {
        arg.id
        for node in ast.walk(_parsed(wheel_text(version, PIPELINE_MARKER)))
        if isinstance(node, ast.Call)
        for arg in node.args
        if isinstance(arg, ast.Name)
    }
    return tuple((m, n) for m, n in PIPELINE_STEPS if n in called or n in named)


def _run_pipeline_rules(release: Release, sa) -> None:
    """The resolution steps (PIPELINE_STEPS, those the release's pipeline.py runs) on the record,
    as resolve_once runs them: decisions declared on top of the raw input; from 0.5.20 the
    record sealed (a step that assigns a field directly fails) and each step through run_hook
    (0.5.19 calls them directly, and hands handle_gpu_memory_settings the GPU memory)."""
    mods = release.modules
    overrides = mods["sglang.srt.arg_groups.overrides"]
    hooks = mods.get("sglang.srt.arg_groups.resolution_hooks")
    arg_utils = mods["sglang.srt.arg_groups.arg_utils"]
    if hasattr(arg_utils, "record_fields"):
        fields = arg_utils.record_fields(type(sa))
    else:
        fields = dataclasses.fields(sa)  # 0.5.19's run_resolution_pipeline
    sa._raw_input = {f.name: getattr(sa, f.name) for f in fields}
    sa._resolved_overrides = []
    sa._input_frozen = True
    try:
        for module, name in pipeline_steps(release.version):
            fn = getattr(mods[f"sglang.srt.arg_groups.{module}"], name)
            extra = ()
            if name == "handle_gpu_memory_settings" and len(inspect.signature(fn).parameters) == 2:
                # 0.5.19: gpu_mem = get_device_memory_capacity(cfg.device), passed in.
                extra = (release.machine.memory_mib,)
            if module == "overrides":
                overrides.run_post_process_pass(sa, fn)
            elif hooks is not None:
                hooks.run_hook(fn, sa, *extra)
            else:
                fn(sa, *extra)
    finally:
        sa._input_frozen = False


def _resolved(release: Release, sa, name: str):
    """A field's value after the rules: 0.5.23's last declaration over the raw input."""
    if release.pipeline:
        return release.modules["sglang.srt.arg_groups.overrides"].resolution_result(sa, name)
    return getattr(sa, name, None)


def _run_rules(release: Release, sa) -> None:
    """The rule methods, in ``__post_init__``'s order, wherever this release keeps them."""
    if release.pipeline:
        _run_pipeline_rules(release, sa)
        return
    gpu_mem = release.machine.memory_mib
    if "sglang.srt.arg_groups.overrides" in release.modules and hasattr(
        sa, "_handle_missing_default_values"
    ):
        # 0.5.15-0.5.18 (__post_init__ starts the stash, and _handle_dflash reads the device
        # that _handle_missing_default_values fills in).
        sa._resolved_overrides = []
        sa._handle_missing_default_values()
    if hasattr(sa, "_handle_cuda_graph_config"):
        sa._handle_cuda_graph_config()  # 0.5.14: --cuda-graph-config into decode/prefill parts
    if hasattr(sa, "_handle_piecewise_cuda_graph"):
        sa._handle_piecewise_cuda_graph()
    sa._handle_gpu_memory_settings(gpu_mem)
    sa._handle_attention_backend_compatibility()
    if hasattr(sa, "_handle_speculative_decoding"):
        sa._handle_speculative_decoding()  # 0.5.11, 0.5.12
    else:
        # 0.5.13 on: arg_groups/speculative_hook.py
        release.modules["sglang.srt.arg_groups.speculative_hook"].handle_speculative_decoding(sa)


@cache
def _release(version: str, machine: Machine) -> Release:
    return Release(version, machine)


# --------------------------------------------------------------------------------------------------
# On a host: the stand-in server's verdict from the installed tree (standin_sglang_server.py)
# --------------------------------------------------------------------------------------------------

# Architectures whose text model is DeepseekV3's MLA (sglang.md section 2).
MLA_ARCHITECTURES = ("DeepseekV3ForCausalLM", "KimiK25ForConditionalGeneration")
# KimiK25Config builds KimiK25VisionConfig() when config.json has no vision_config
# (sglang/srt/configs/kimi_k25.py): its defaults.
KIMI_K25_VISION_DEFAULTS = {"num_hidden_layers": 27, "hidden_size": 1152}
# pool_configurator.py's message when no KV cache fits (0.5.11-0.5.23).
NOT_ENOUGH_MEMORY = "Not enough memory. Please try to increase --mem-fraction-static."


def model_fields(config: Mapping[str, Any]) -> dict[str, Any]:
    """The fields the rules read, from a model folder's config.json."""
    archs = list(config.get("architectures") or [])
    vision = config.get("vision_config")
    if vision is None and "KimiK25ForConditionalGeneration" in archs:
        vision = KIMI_K25_VISION_DEFAULTS
    if vision is not None:
        vision = {
            "num_hidden_layers": vision.get("num_hidden_layers", 24),
            "hidden_size": vision.get("hidden_size", 1024),
        }
    text = config.get("text_config") or config
    return {
        "architectures": archs,
        "mla": "kv_lora_rank" in text or any(a in MLA_ARCHITECTURES for a in archs),
        "vision_config": vision,
        "context_len": text.get("max_position_embeddings", 262144),
    }


def folder_bytes(folder: str) -> int:
    """Bytes of a model folder's *.safetensors (what the model load puts on the GPUs)."""
    total = 0
    for name in os.listdir(folder):
        if name.endswith(".safetensors"):
            total += os.path.getsize(os.path.join(folder, name))
    return total


def machine_from_nvidia_smi() -> Machine | None:
    import subprocess

    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.total,compute_cap", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=30,
        ).stdout  # fmt: skip
        rows = [[x.strip() for x in line.split(",")] for line in out.splitlines() if line.strip()]
        sm = tuple(int(x) for x in rows[0][1].split("."))
        return Machine(min(int(r[0]) for r in rows), sm, len(rows))
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return None


class RulesNotRun(Exception):
    """The harness could not run a tree's rules here (e.g. 0.5.23's msgspec is not importable):
    no verdict, which the caller must not take for "it would start"."""


def tree_refusal(tree: str, argv: list[str], machine: Machine) -> str | None:
    """What the SGLang at ``tree`` (its ``sglang`` folder) would stop with on ``argv``: its own
    parser's or rule methods' message, or (modelled from the fraction its code computed and the
    weights in the model folders) pool_configurator.py's "Not enough memory"; None when it would
    start. Anything the harness cannot run on this tree is not a verdict: RulesNotRun."""
    import json

    try:
        args = _release(tree, machine).parse(argv)
        with open(os.path.join(args.model_path, "config.json")) as f:
            model = model_fields(json.load(f))
        drafter = {"architectures": []}
        if args.speculative_draft_model_path:
            with open(os.path.join(args.speculative_draft_model_path, "config.json")) as f:
                drafter = json.load(f)
        verdict = judge(tree, machine, argv, model=model, drafter=drafter)
    except ArgumentRefused as exc:
        return str(exc)
    except Exception as exc:  # noqa: BLE001 - a rule the harness cannot run here is no verdict
        raise RulesNotRun(
            f"SGLang's rules not run on {tree}: {type(exc).__name__}: {exc}"
        ) from exc
    if verdict.refused is not None:
        return verdict.refused
    weights = folder_bytes(args.model_path)
    if args.speculative_draft_model_path:
        weights += folder_bytes(args.speculative_draft_model_path)
    tp = max(int(args.tp_size or 1), 1) if hasattr(args, "tp_size") else 1
    tp = int(getattr(args, "tensor_parallel_size", tp) or tp)
    if verdict.kv_room_gib(machine.memory_mib, weights // tp) <= 0:
        return f"{NOT_ENOUGH_MEMORY} Current value: mem_fraction_static={verdict.mem_fraction_static}"
    return None
