"""The launch plan: one host's facts and the settings in, SGLang's argv and environment out.

``make_plan`` is a pure function (no I/O): every choice it makes is recorded as a ``Reason`` with a
topic, the choice and why, so a person can read what would run on a box and why. Rules are those
of issue 4; the version-dependent parts (flag names, backend registries, DFLASH worker) come from
``deploys.versions`` when predicting and from the ``facts.sglang.SGLangInstall`` fact otherwise.

CLI, one host, no connection to it::

    python -m deploys.plan --facts FACTS.json [--settings SETTINGS.json]
        [--drafter-config CONFIG.json] [--weights-bytes N] [--predicted] [--json]

``FACTS.json`` maps fact names (``facts.gpu.Gpus``, ``facts.gpu.GpuTopology``,
``facts.sglang.SGLangInstall``, ...) to one host's values, or is the output of
``pyinfra INVENTORY fact NAME... --json`` itself, {fact: {host: value}} (``--host`` picks one host
where there are several). It may also carry ``drafter_config`` (the drafter's config.json) and
``weights_bytes``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from deploys import versions
from deploys.errors import SpecfleetError
from deploys.settings import Settings

GPUS = "facts.gpu.Gpus"
TOPOLOGY = "facts.gpu.GpuTopology"
SGLANG = "facts.sglang.SGLangInstall"

GIB = 1024**3
MIB = 1024**2
# moonshotai/Kimi-K2.6 safetensors (554.30 GiB) + z-lab/Kimi-K2.6-DFlash (6.48 GiB), sglang.md s3.
KIMI_K26_WEIGHTS_BYTES = int(554.3 * GIB) + int(6.5 * GIB)
KIMI_K26_TARGET = "moonshotai/Kimi-K2.6"
# Kimi-K2.6-DFlash's config.json block_size (sglang.md s3), used until the real file is read.
DEFAULT_BLOCK_SIZE = 8
# Above this, SGLang on SM120 has been seen to OOM with K2.6 (sglang.md s5 field notes).
SM120_MEM_FRACTION = 0.85
# z-lab's Kimi DFlash model card (a B200 recipe) uses 0.9.
SM100_MEM_FRACTION = 0.9

ReasonKind = Literal["rule", "override", "predicted", "assumed", "info"]


class PlanError(SpecfleetError):
    """A launch plan that cannot be made for this host, with the reason and the fix."""


@dataclass(frozen=True)
class Reason:
    """One decision of the plan: what it is about, what was chosen, and why."""

    topic: str
    choice: str
    why: str
    # "rule": issue 4's rules; "override": settings.plan overrode a rule; "predicted": from the
    # version table, SGLang not (yet) installed; "assumed": a default stood in for a missing input;
    # "info": reported, nothing added.
    kind: ReasonKind = "rule"

    def to_dict(self) -> dict[str, str]:
        return {"topic": self.topic, "choice": self.choice, "why": self.why, "kind": self.kind}

    def render(self, width: int = 24) -> str:
        tag = "" if self.kind == "rule" else f" [{self.kind}]"
        return f"{self.topic:<{width}} {self.choice}: {self.why}{tag}"


@dataclass(frozen=True)
class Plan:
    argv: list[str]
    env: dict[str, str]
    reasons: list[Reason]
    # True when SGLang's features came from the version table, not from the installed files.
    predicted: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "argv": list(self.argv),
            "env": dict(self.env),
            "reasons": [r.to_dict() for r in self.reasons],
            "predicted": self.predicted,
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def render(self) -> str:
        """One line per decision, then the environment and the command."""
        width = max((len(r.topic) for r in self.reasons), default=0)
        head = "plan (predicted: SGLang not installed yet)" if self.predicted else "plan"
        lines = [head + ":"]
        lines += ["  " + r.render(width) for r in self.reasons]
        lines.append("  env: " + " ".join(f"{k}={v}" for k, v in self.env.items()))
        lines.append("  argv: " + " ".join(_shell_quote(a) for a in self.argv))
        return "\n".join(lines)

    def reason(self, topic: str) -> Reason | None:
        return next((r for r in self.reasons if r.topic == topic), None)


def _shell_quote(arg: str) -> str:
    if arg and re.fullmatch(r"[A-Za-z0-9_@%+=:,./-]+", arg):
        return arg
    return "'" + arg.replace("'", "'\"'\"'") + "'"


# --------------------------------------------------------------------------------------------------
# GPU architecture rules
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ArchRule:
    family: str
    # Target (MLA) backends in preference order; the first the registry has is chosen.
    target: tuple[str, ...]
    target_why: str
    draft: tuple[str, ...]
    draft_why: str
    # Target backends that pass SGLang's argument checks but fail at runtime here.
    target_broken: tuple[str, ...] = ()
    mem_fraction: float | None = None
    mem_fraction_why: str = ""


SM90 = ArchRule(
    family="SM90",
    target=("fa3",),
    target_why="Hopper: fa3 is SGLang's own MLA default there",
    draft=("fa3", "flashinfer"),
    draft_why="the drafter is GQA; fa3 runs it on Hopper (flashinfer is the alternative)",
    target_broken=("trtllm_mla", "cutlass_mla"),
    mem_fraction=None,
    mem_fraction_why="SM90: left to SGLang's own default",
)
SM100 = ArchRule(
    family="SM100",
    target=("trtllm_mla",),
    target_why="Blackwell datacenter: trtllm_mla is what SGLang picks for DeepseekV3/KimiK25 and "
    "what the Kimi DFlash card uses",
    draft=("fa4",),
    draft_why="the drafter is GQA; fa4 is the Kimi DFlash card's draft backend on B200/B300",
    target_broken=("fa3",),
    mem_fraction=SM100_MEM_FRACTION,
    mem_fraction_why="SM100: 0.9, as the Kimi DFlash model card uses",
)
SM120 = ArchRule(
    family="SM120",
    target=("triton", "flashinfer"),
    target_why="RTX PRO 6000: triton is SGLang's MLA default on SM120 (flashinfer if chosen); "
    "trtllm_mla, cutlass_mla and fa3 fail there at runtime",
    draft=("flashinfer",),
    draft_why="the drafter is GQA; flashinfer drafting is known to work on SM120",
    target_broken=("trtllm_mla", "cutlass_mla", "fa3", "fa4"),
    mem_fraction=SM120_MEM_FRACTION,
    mem_fraction_why="SM120: at most 0.85, more has been seen to OOM with K2.6",
)


def arch_rule(major: int, minor: int) -> ArchRule | None:
    if major == 9:
        return SM90
    if major == 10:  # SM100 (B200) and SM103 (B300)
        return SM100
    if major == 12:  # SM120 (RTX PRO 6000); SM121 (GB10) shares the family
        return SM120
    return None


def _capability(gpu: Mapping[str, Any]) -> tuple[int, int] | None:
    cc = gpu.get("compute_capability")
    if cc is not None:
        m = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", str(cc))
        if m:
            return int(m.group(1)), int(m.group(2))
    sm = gpu.get("sm")
    if sm is not None:
        m = re.search(r"(\d+)", str(sm))
        if m:
            digits = m.group(1)
            return int(digits[:-1] or 0), int(digits[-1])
    return None


# --------------------------------------------------------------------------------------------------
# The plan
# --------------------------------------------------------------------------------------------------


class _Builder:
    def __init__(self) -> None:
        self.flags: list[tuple[str, str | None]] = []
        self.env: dict[str, str] = {}
        self.reasons: list[Reason] = []

    def flag(self, name: str, value: str | int | float | None = None) -> None:
        self.flags.append((name, None if value is None else str(value)))

    def why(self, topic: str, choice: Any, why: str, kind: ReasonKind = "rule") -> None:
        self.reasons.append(Reason(topic, str(choice), why, kind))


def make_plan(
    facts: Mapping[str, Any],
    settings: Settings,
    drafter_config: Mapping[str, Any] | None = None,
    predicted: bool = False,
    *,
    weights_bytes: int | None = None,
    host: str | None = None,
) -> Plan:
    """The SGLang launch plan for one host.

    ``facts`` maps fact names (``facts.gpu.Gpus``, ``facts.gpu.GpuTopology``,
    ``facts.sglang.SGLangInstall``, ...) to their values; a missing fact is unknown.
    ``drafter_config`` is the drafter's config.json (its block size); without it the plan assumes
    Kimi-K2.6-DFlash's. ``predicted`` takes SGLang's features from ``deploys.versions`` for
    ``settings.sglang.version`` (a fresh host, before install). ``weights_bytes`` is the size of
    target + drafter weights; by default Kimi K2.6's for the default target, else unchecked.
    Raises ``PlanError`` when no working plan exists.
    """
    b = _Builder()
    ov = settings.plan

    def error(problem: str, fix: str) -> PlanError:
        return PlanError(problem, host=host, fix=fix)

    # -- GPUs ----------------------------------------------------------------------------------
    gpus_fact = facts.get(GPUS)
    gpus: list[Mapping[str, Any]] = list((gpus_fact or {}).get("gpus") or [])
    if not gpus:
        detail = (gpus_fact or {}).get("error") if isinstance(gpus_fact, Mapping) else None
        if gpus_fact is None:
            problem = "no GPUs: the facts carry no facts.gpu.Gpus (GPU inventory unknown)"
        elif detail:
            problem = f"no GPUs: nvidia-smi failed: {detail.strip()}"
        else:
            problem = "no GPUs: no nvidia-smi on the host, or it lists none"
        raise error(
            problem,
            "run on a host with NVIDIA GPUs and a working driver (nvidia-smi must list them), "
            "or remove this host from the SGLang group",
        )
    caps = [_capability(g) for g in gpus]
    if any(c is None for c in caps):
        detail = (gpus_fact or {}).get("error")
        raise error(
            "GPU compute capability unknown (facts.gpu.Gpus has no compute_capability)"
            + (f": nvidia-smi said: {detail.strip()}" if detail else ""),
            "update the NVIDIA driver: nvidia-smi --query-gpu=compute_cap needs driver >= 510",
        )
    archs = sorted({c for c in caps if c is not None})
    if len({arch_rule(*c) for c in archs}) > 1:
        raise error(
            "mixed GPU architectures on one host: " + ", ".join(f"SM{ma}{mi}" for ma, mi in archs),
            "serve from GPUs of one architecture: set plan.extra_env CUDA_VISIBLE_DEVICES and "
            "plan.tp_size to one kind",
        )
    major, minor = archs[0]
    sm = f"SM{major}{minor}"
    rule = arch_rule(major, minor)
    names = sorted({str(g.get("name", "?")) for g in gpus})
    b.why("gpus", f"{len(gpus)}x {', '.join(names)} ({sm})", "from facts.gpu.Gpus")
    if rule is None and ov.attention_backend and ov.draft_attention_backend:
        # No rule for this arch, but both backends are given: the plan follows them.
        rule = ArchRule(
            family=sm,
            target=(ov.attention_backend,),
            target_why="",
            draft=(ov.draft_attention_backend,),
            draft_why="",
            mem_fraction_why=f"{sm}: no rule, left to SGLang's own default",
        )
    if rule is None:
        raise error(
            f"no usable attention backend for {sm} ({', '.join(names)}): specfleet's rules cover "
            "SM90 (fa3), SM100/103 (trtllm_mla) and SM120 (triton/flashinfer)",
            "run on H100/H200, B200/B300 or RTX PRO 6000 GPUs, or set plan.attention_backend "
            "and plan.draft_attention_backend to backends known to work on this GPU",
        )

    # -- SGLang ----------------------------------------------------------------------------------
    install, row, predicted_kind = _sglang(facts, settings, predicted, error)
    features = install.get("features") or {}
    pr20547 = bool(features.get("dflash_pr20547"))
    version = install.get("version") or (
        "(unknown version)" if not predicted_kind else settings.sglang.version
    )
    if pr20547:
        version = f"PR#20547 build {version}"
    registry = set(install.get("attention_backends") or [])
    src: ReasonKind = "predicted" if predicted_kind else "rule"
    if predicted_kind:
        b.why(
            "sglang",
            version,
            "not installed yet: features from deploys.versions for settings.sglang",
            "predicted",
        )
    else:
        b.why("sglang", version, f"installed at {install.get('location') or '?'}")
    if not registry:
        registry = set(row.attention_backends)
        b.why(
            "attention-registry",
            f"sglang {version} table",
            "the install reported no attention registry; using the version table's",
            "assumed",
        )

    dflash = features.get("dflash")
    algos = install.get("speculative_algorithms")
    if not dflash or (algos is not None and algos and "DFLASH" not in algos):
        raise error(
            f"SGLang {version} has no DFLASH speculative decoding",
            "install sglang >= 0.5.11 (set specfleet sglang.version, e.g. '0.5.23'), or a build "
            "of sgl-project/sglang PR#20547",
        )

    # -- tensor parallel -------------------------------------------------------------------------
    if ov.tp_size is not None:
        tp = ov.tp_size
        b.why("tensor-parallel", tp, f"plan.tp_size (rule: all {len(gpus)} GPUs)", "override")
    else:
        tp = len(gpus)
        b.why("tensor-parallel", tp, "one shard per GPU")
    if tp > len(gpus):
        raise error(
            f"--tp-size {tp} needs {tp} GPUs, the host has {len(gpus)}",
            f"set plan.tp_size to at most {len(gpus)} or leave it unset to use every GPU",
        )

    # -- memory ----------------------------------------------------------------------------------
    mib = [int(g.get("memory_mib") or 0) for g in gpus[:tp]]
    total = sum(mib) * MIB
    size = weights_bytes
    if size is None and settings.target.repo_id == KIMI_K26_TARGET:
        size = KIMI_K26_WEIGHTS_BYTES
    if size is None:
        b.why("gpu-memory", f"{total / GIB:.0f} GiB", "weights size unknown: not checked", "info")
    elif total and total < size:
        raise error(
            f"{tp} GPUs hold {total / GIB:.0f} GiB in all, far below the {size / GIB:.0f} GiB of "
            f"weights ({settings.target.repo_id} + {settings.drafter.repo_id})",
            "use a host with more GPU memory (Kimi K2.6 needs 8x H200, 8x B200 or 8x RTX PRO "
            "6000), or a smaller target",
        )
    else:
        b.why(
            "gpu-memory",
            f"{total / GIB:.0f} GiB",
            f"{size / GIB:.0f} GiB of weights fit, {(total - size) / GIB / max(tp, 1):.0f} GiB "
            "per GPU left for KV cache and activations",
        )

    # -- model paths -----------------------------------------------------------------------------
    target_dir = settings.target.serve_path(settings.models_root)
    drafter_dir = settings.drafter.serve_path(settings.models_root)
    b.flag("--model-path", target_dir)
    b.flag("--trust-remote-code")
    b.flag("--tp-size", tp)
    b.why("model-paths", target_dir, "local directories, never Hub ids; HF_HUB_OFFLINE=1")
    b.env["HF_HUB_OFFLINE"] = "1"

    # -- target attention backend ----------------------------------------------------------------
    if ov.attention_backend:
        att = ov.attention_backend
        if att in rule.target_broken:
            raise error(
                f"plan.attention_backend {att!r} fails at runtime on {sm}",
                f"unset plan.attention_backend (the rule picks {rule.target[0]}) or choose one of "
                f"{', '.join(rule.target)}",
            )
        if att not in registry:
            raise error(
                f"plan.attention_backend {att!r} is not in SGLang {version}'s attention registry",
                f"choose one of: {', '.join(sorted(registry))}",
            )
        b.why(
            "attention-backend", att, f"plan.attention_backend (rule: {rule.target[0]})", "override"
        )
    else:
        prefs = rule.target
        if rule is SM120 and ov.sm120_target_backend in prefs:
            prefs = (ov.sm120_target_backend,) + tuple(
                p for p in prefs if p != ov.sm120_target_backend
            )
        att = next((p for p in prefs if p in registry), None)
        if att is None:
            raise error(
                f"no usable attention backend for {sm}: SGLang {version}'s registry has none of "
                f"{', '.join(prefs)}",
                f"install an SGLang whose attention registry has {prefs[0]}, or set "
                "plan.attention_backend",
            )
        if rule is SM120 and att == ov.sm120_target_backend and att != "triton":
            b.why(
                "attention-backend",
                att,
                f"plan.sm120_target_backend chose {att} (rule: triton)",
                "override",
            )
        else:
            b.why("attention-backend", att, rule.target_why, src)
    b.flag("--attention-backend", att)

    # -- speculative decoding: DFLASH ------------------------------------------------------------
    b.flag("--speculative-algorithm", "DFLASH")
    b.flag("--speculative-draft-model-path", drafter_dir)
    block, block_kind, block_why = _block_size(drafter_config)
    b.flag("--speculative-num-draft-tokens", block)
    b.why("speculative-algorithm", "DFLASH", f"drafter {settings.drafter.repo_id} at {drafter_dir}")
    b.why("block-size", block, block_why, block_kind)

    if ov.draft_attention_backend:
        datt = ov.draft_attention_backend
        if datt not in row.dflash_draft_backends:
            raise error(
                f"plan.draft_attention_backend {datt!r} is not one DFLASH accepts on SGLang "
                f"{version} (it would silently fall back to flashinfer)",
                f"choose one of: {', '.join(row.dflash_draft_backends)}",
            )
        b.why(
            "draft-attention-backend",
            datt,
            f"plan.draft_attention_backend (rule: {rule.draft[0]})",
            "override",
        )
    else:
        datt = next(
            (d for d in rule.draft if d in row.dflash_draft_backends and d in registry), None
        )
        if datt is None:
            raise error(
                f"no draft attention backend for {sm}: DFLASH on SGLang {version} accepts "
                f"{', '.join(row.dflash_draft_backends)}, the {sm} rule wants "
                f"{', '.join(rule.draft)}",
                "set plan.draft_attention_backend, or install an SGLang whose DFLASH accepts "
                f"{rule.draft[0]}",
            )
        b.why("draft-attention-backend", datt, rule.draft_why, src)
    b.flag("--speculative-draft-attention-backend", datt)

    window = ov.draft_window_size
    window_flag = row.draft_window_flag or versions.DRAFT_WINDOW_FLAG
    if window < block:
        raise error(
            f"draft window {window} is smaller than the block size {block}",
            f"set plan.draft_window_size to at least {block} (default 4096)",
        )
    b.flag(window_flag, window)
    window_kind: ReasonKind = "override" if window != 4096 else src
    b.why(
        "draft-window",
        f"{window_flag} {window}",
        ("plan.draft_window_size (default 4096)" if window != 4096 else "default 4096")
        + f", >= block size {block}; flag name for SGLang {version}",
        window_kind,
    )

    if pr20547:
        b.env.update(versions.PR20547_ENV)
        b.why(
            "dflash-worker",
            "v2 (PR#20547)",
            "the PR#20547 overlap worker runs only with SGLANG_ENABLE_SPEC_V2=1 "
            "SGLANG_ENABLE_DFLASH_SPEC_V2=1: set both",
            src,
        )
    elif dflash == "v2":
        b.why(
            "dflash-worker",
            "v2",
            "the overlap (spec v2) DFLASH worker is SGLang's default here",
            src,
        )
    else:
        b.why(
            "dflash-worker",
            dflash,
            "the v1 DFLASH worker: SGLang turns the overlap scheduler off",
            src,
        )

    if features.get("ddtree"):
        b.why(
            "ddtree",
            "present, not enabled",
            "DDTree code is installed but its flag names differ between the open PRs; a "
            "guessed flag would crash-loop the server, so nothing is added",
            "info",
        )

    # -- memory fraction -------------------------------------------------------------------------
    if ov.mem_fraction_static is not None:
        mfs: float | None = ov.mem_fraction_static
        rule_txt = "SGLang default" if rule.mem_fraction is None else str(rule.mem_fraction)
        note = ""
        if rule is SM120 and ov.mem_fraction_static > SM120_MEM_FRACTION:
            note = "; above 0.85 has been seen to OOM on SM120"
        b.why(
            "mem-fraction-static",
            mfs,
            f"plan.mem_fraction_static (rule: {rule_txt}){note}",
            "override",
        )
    else:
        mfs = rule.mem_fraction
        b.why(
            "mem-fraction-static", "SGLang default" if mfs is None else mfs, rule.mem_fraction_why
        )
    if mfs is not None:
        b.flag("--mem-fraction-static", _num(mfs))
        if size is not None and total and size > mfs * total:
            b.why(
                "kv-cache-room",
                "none",
                f"the weights ({size / GIB:.0f} GiB) exceed mem-fraction-static x GPU memory "
                f"({mfs * total / GIB:.0f} GiB): SGLang will find no room for the KV cache",
                "info",
            )

    # -- all-reduce over PCIe --------------------------------------------------------------------
    topo = facts.get(TOPOLOGY)
    nvlink = None
    if isinstance(topo, Mapping) and not topo.get("error") and topo.get("gpus"):
        nvlink = bool(topo.get("nvlink_all_pairs"))
    if tp > 2 and nvlink is not True:
        b.flag("--disable-custom-all-reduce")
        if nvlink is None:
            why = (
                f"GPU topology unknown with {tp} GPUs: the custom all-reduce kernel needs "
                "NVLink/P2P, so it is off to be safe"
            )
            b.why("custom-all-reduce", "disabled", why, "assumed")
        else:
            b.why(
                "custom-all-reduce",
                "disabled",
                f"PCIe-only ({tp} GPUs, not every pair on NVLink): the custom all-reduce kernel "
                "needs NVLink/P2P there",
            )
    else:
        link = "NVLink between all pairs" if nvlink else f"{tp} GPU(s)"
        b.why("custom-all-reduce", "SGLang default", f"{link}: custom all-reduce stays on")

    # -- Kimi ------------------------------------------------------------------------------------
    if "kimi" in settings.target.repo_id.lower():
        b.flag("--reasoning-parser", "kimi_k2")
        b.flag("--tool-call-parser", "kimi_k2")
        b.why("parsers", "kimi_k2", "Kimi K2.x reasoning and tool-call formats")
    b.env["SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"] = "1"
    b.why(
        "context-length",
        "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1",
        "the drafter's context is shorter than the target's",
    )

    b.flag("--host", settings.listen_host)
    b.flag("--port", settings.port)
    b.why("listen", f"{settings.listen_host}:{settings.port}", "settings listen_host and port")

    # -- overrides -------------------------------------------------------------------------------
    flags = b.flags
    for name, value in ov.extra_args.items():
        if not name.startswith("--"):
            raise error(
                f"plan.extra_args key {name!r} is not a long flag",
                f"write it as '--{name.lstrip('-')}'",
            )
        if name in row.dflash_forbidden_flags and value not in (None, False):
            raise error(
                f"{name} must not be passed with DFLASH on SGLang {version}",
                f"remove {name} from plan.extra_args",
            )
        if value is None or value is False:
            flags = [(n, v) for n, v in flags if n != name]
            b.why(name, "removed", "plan.extra_args", "override")
            continue
        rendered = None if value is True else _num(value)
        if any(n == name for n, _ in flags):
            flags = [(n, rendered if n == name else v) for n, v in flags]
        else:
            flags.append((name, rendered))
        b.why(name, "set" if rendered is None else rendered, "plan.extra_args", "override")
    for key, value in ov.extra_env.items():
        b.env[key] = str(value)
        b.why(f"env {key}", value, "plan.extra_env", "override")

    argv = (
        list(settings.launcher)
        if settings.launcher
        else [
            f"{settings.venv.rstrip('/')}/bin/python",
            "-m",
            "sglang.launch_server",
        ]
    )
    for name, value in flags:
        argv.append(name)
        if value is not None:
            argv.append(value)
    return Plan(argv=argv, env=dict(b.env), reasons=list(b.reasons), predicted=predicted_kind)


def _num(value: Any) -> str:
    return str(value)


def _block_size(drafter_config: Mapping[str, Any] | None) -> tuple[int, ReasonKind, str]:
    if drafter_config is None:
        return (
            DEFAULT_BLOCK_SIZE,
            "assumed",
            f"drafter config.json not read yet: Kimi-K2.6-DFlash's block_size {DEFAULT_BLOCK_SIZE}",
        )
    dflash_cfg = drafter_config.get("dflash_config")
    raw = None
    if isinstance(dflash_cfg, Mapping):
        raw = dflash_cfg.get("block_size")
    if raw is None:
        raw = drafter_config.get("block_size")
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
        raise PlanError(
            f"the drafter's config.json has no usable block_size (got {raw!r})",
            fix="check the drafter download (its config.json needs dflash_config.block_size or "
            "block_size), or pass --speculative-num-draft-tokens in plan.extra_args",
        )
    return raw, "rule", "the drafter's config.json block_size"


def _sglang(facts, settings: Settings, predicted: bool, error) -> tuple[dict, Any, bool]:
    """The SGLang install (fact or prediction), its version-table row, and whether predicted."""
    if predicted:
        s = settings.sglang
        pr = bool(s.kind == "git" and s.git_ref and "20547" in s.git_ref)
        try:
            if pr:
                row = versions.PR20547
                install = {
                    "version": s.version,
                    "location": None,
                    "features": row.features(),
                    "speculative_algorithms": list(row.speculative_algorithms),
                    "attention_backends": sorted(row.attention_backends),
                }
            else:
                install = versions.predicted_install(s.version)
                row = versions.version_row(s.version)
        except ValueError as exc:
            raise error(
                f"settings sglang.version {s.version!r} is not a version ({exc})",
                "set specfleet sglang.version to a release such as '0.5.23'",
            ) from None
        return install, row, True
    install = facts.get(SGLANG)
    if not isinstance(install, Mapping):
        raise error(
            "SGLang is not installed in the venv (facts.sglang.SGLangInstall is empty)",
            f"install it first (the deploy does), or plan with --predicted for sglang "
            f"{settings.sglang.version}",
        )
    features = install.get("features") or {}
    pr = bool(features.get("dflash_pr20547"))
    try:
        if install.get("version") is None and not pr:
            raise ValueError("no version")
        row = versions.row_for_install(install.get("version"), pr)
    except ValueError:
        # An install whose version cannot be read: go by the DFLASH worker it has.
        stand_in = {"v1": "0.5.11", "v2": "0.5.14"}.get(features.get("dflash") or "", "0")
        row = versions.version_row(stand_in)
    return dict(install), row, False


# --------------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------------


class _InputError(Exception):
    pass


def _load_json(path: str, what: str) -> Any:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except OSError as exc:
        raise _InputError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise _InputError(f"{what} {path} is not JSON: {exc}") from None


# A key every value of these facts has: tells a fact's own value from pyinfra's {host: value}.
_VALUE_KEYS = {GPUS: "gpus", TOPOLOGY: "links", SGLANG: "features"}


def one_host_facts(facts: dict[str, Any], host: str | None = None) -> dict[str, Any]:
    """``facts`` as {fact: value} for one host.

    Takes either that shape or the one ``pyinfra INVENTORY fact NAME... --json`` prints,
    {fact: {host: value}}; from the latter it picks ``host``, or the only host there is.
    """
    per_host = {
        name: value
        for name, value in facts.items()
        if name.startswith("facts.")
        and isinstance(value, dict)
        and (name not in _VALUE_KEYS or _VALUE_KEYS[name] not in value)
        and all(v is None or isinstance(v, (dict, list)) for v in value.values())
    }
    if not per_host or (set(per_host) != {k for k in facts if k.startswith("facts.")}):
        return facts
    hosts = sorted({h for value in per_host.values() for h in value})
    if host is None:
        if len(hosts) != 1:
            raise _InputError(
                f"the facts file holds facts of {len(hosts)} hosts ({', '.join(hosts)}): "
                "choose one with --host"
            )
        host = hosts[0]
    if host not in hosts:
        raise _InputError(f"the facts file has no host {host!r} (it has: {', '.join(hosts)})")
    out = {k: v for k, v in facts.items() if k not in per_host}
    for name, value in per_host.items():
        if host in value:
            out[name] = value[host]
    return out


def main(argv: list[str] | None = None) -> int:
    from deploys.settings import settings_from_dict

    parser = argparse.ArgumentParser(
        prog="python -m deploys.plan",
        description="What specfleet would launch on one host, from its facts (no connection).",
    )
    parser.add_argument("--facts", required=True, help="JSON: fact name -> value")
    parser.add_argument("--settings", help="JSON: the specfleet settings (defaults: Kimi K2.6)")
    parser.add_argument("--drafter-config", help="JSON: the drafter's config.json")
    parser.add_argument("--weights-bytes", type=int, help="target + drafter weights size")
    parser.add_argument(
        "--predicted",
        action="store_true",
        help="SGLang not installed yet: predict from settings.sglang.version",
    )
    parser.add_argument("--host", help="the host's name, for messages")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)

    def fail(message: str) -> int:
        if args.json:
            print(json.dumps({"error": message}))
        else:
            print(f"error: {message}", file=sys.stderr)
        return 2

    try:
        facts = _load_json(args.facts, "facts file")
        if not isinstance(facts, dict):
            raise _InputError(f"facts file {args.facts} must hold a JSON object of fact names")
        facts = one_host_facts(facts, args.host)
        settings_data = _load_json(args.settings, "settings file") if args.settings else None
        if settings_data is not None and not isinstance(settings_data, dict):
            raise _InputError(f"settings file {args.settings} must hold a JSON object")
        drafter_config = facts.get("drafter_config")
        if args.drafter_config:
            drafter_config = _load_json(args.drafter_config, "drafter config")
        if drafter_config is not None and not isinstance(drafter_config, dict):
            raise _InputError("drafter_config must be a JSON object (the drafter's config.json)")
        weights = (
            args.weights_bytes if args.weights_bytes is not None else facts.get("weights_bytes")
        )
        if weights is not None and (isinstance(weights, bool) or not isinstance(weights, int)):
            raise _InputError(f"weights_bytes must be an integer, got {weights!r}")
        settings = settings_from_dict(settings_data, host=args.host or "")
        plan = make_plan(
            facts,
            settings,
            drafter_config,
            predicted=args.predicted,
            weights_bytes=weights,
            host=args.host,
        )
    except _InputError as exc:
        return fail(str(exc))
    except SpecfleetError as exc:
        return fail(exc.render())
    if args.json:
        print(json.dumps(plan.to_dict(), indent=2))
    else:
        print(plan.render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
