"""Topics of DFLASH speculative decoding: drafter, block size, draft backend and window, worker."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from specfleet.core.layout import serve_path
from specfleet.core.plan.context import PlanContext
from specfleet.core.plan.ddtree import announce_ddtree, apply_ddtree, choose_ddtree
from specfleet.core.plan.model import PlanError, ReasonKind
from specfleet.core.tables import sglang_versions as versions
from specfleet.core.tables.models import DEFAULT_BLOCK_SIZE

DEFAULT_DRAFT_WINDOW = 4096


def plan_ddtree(c: PlanContext) -> None:
    """Whether DDTree is asked for and installed (before the target backend, which it may
    change: ``ddtree.ddtree_backend``)."""
    c.ddtree = choose_ddtree(c, block_size(c.drafter_config)[0])


def plan_dflash(c: PlanContext) -> None:
    b, ov, rule, row, s = c.b, c.overrides, c.rule, c.row, c.settings
    drafter_dir = serve_path(s, "drafter")
    block, block_kind, block_why = block_size(c.drafter_config)
    ddtree = c.ddtree
    if ddtree:
        announce_ddtree(c, ddtree)
    algorithm = ddtree.design.algorithm if ddtree else "DFLASH"
    # The draft tokens: the drafter's block, or the tree budget where the design carries it there.
    tokens = ddtree.budget if ddtree and ddtree.design.budget_is_draft_tokens else block
    b.flag("--speculative-algorithm", algorithm)
    b.flag("--speculative-draft-model-path", drafter_dir)
    b.flag("--speculative-num-draft-tokens", tokens)
    b.why("speculative-algorithm", algorithm, f"drafter {s.drafter.repo_id} at {drafter_dir}")
    b.why("block-size", block, block_why, block_kind)
    c.block = tokens

    if ov.draft_attention_backend:
        datt = ov.draft_attention_backend
        if datt not in row.dflash_draft_backends:
            raise b.error(
                f"plan.draft_attention_backend {datt!r} is not one DFLASH accepts on SGLang "
                f"{c.version} (it would silently fall back to flashinfer)",
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
            (d for d in rule.draft if d in row.dflash_draft_backends and d in c.registry), None
        )
        if datt is None:
            raise b.error(
                f"no draft attention backend for {c.sm}: DFLASH on SGLang {c.version} accepts "
                f"{', '.join(row.dflash_draft_backends)}, the {c.sm} rule wants "
                f"{', '.join(rule.draft)}",
                "set plan.draft_attention_backend, or install an SGLang whose DFLASH accepts "
                f"{rule.draft[0]}",
            )
        b.why("draft-attention-backend", datt, rule.draft_why, c.src)
    b.flag("--speculative-draft-attention-backend", datt)

    window = ov.draft_window_size
    window_flag = row.draft_window_flag or versions.DRAFT_WINDOW_FLAG
    if window < tokens:
        what = "the block size" if tokens == block else "the DDTree budget (draft tokens)"
        raise b.error(
            f"draft window {window} is smaller than {what} {tokens}",
            f"set plan.draft_window_size to at least {tokens} (default {DEFAULT_DRAFT_WINDOW})",
        )
    b.flag(window_flag, window)
    default = window == DEFAULT_DRAFT_WINDOW
    window_kind: ReasonKind = c.src if default else "override"
    b.why(
        "draft-window",
        f"{window_flag} {window}",
        (
            f"default {DEFAULT_DRAFT_WINDOW}"
            if default
            else f"plan.draft_window_size (default {DEFAULT_DRAFT_WINDOW})"
        )
        + f", >= {'block size' if tokens == block else 'draft tokens'} {tokens}; flag name for "
        f"SGLang {c.version}",
        window_kind,
    )
    if ddtree:
        apply_ddtree(c, ddtree)
    _worker(c)


def _worker(c: PlanContext) -> None:
    b, dflash = c.b, c.features.get("dflash")
    if c.ddtree:
        b.why("dflash-worker", "no overlap (DDTree)", c.ddtree.design.overlap_rule, "rule")
        return
    overlap_off = c.overrides.extra_args.get("--disable-overlap-schedule") not in (None, False)
    if c.pr20547 and overlap_off:
        # The port honours the flag under the switches (server_args), so they would be dead.
        b.why(
            "dflash-worker",
            "v1 (--disable-overlap-schedule)",
            "plan.extra_args turns the overlap scheduler off, which the PR#20547 port honours: "
            "DFLASH runs the v1 worker, and the v2 switches are left out",
            "override",
        )
    elif c.pr20547:
        b.env.update(versions.PR20547_ENV)
        b.why(
            "dflash-worker",
            "v2 (PR#20547)",
            "the PR#20547 overlap worker runs only with SGLANG_ENABLE_SPEC_V2=1 "
            "SGLANG_ENABLE_DFLASH_SPEC_V2=1: set both",
            c.src,
        )
    elif dflash == "v2":
        b.why("dflash-worker", "v2", "the overlap (spec v2) DFLASH worker is SGLang's default here",
              c.src)  # fmt: skip
    else:
        missing = c.features.get("dflash_v2_missing") or []
        why = "the v1 DFLASH worker: SGLang turns the overlap scheduler off"
        if missing:
            why += f"; a v2 worker is installed but not wired in ({missing[0]})"
        b.why("dflash-worker", dflash, why, c.src)


def block_size(drafter_config: Mapping[str, Any] | None) -> tuple[int, ReasonKind, str]:
    """The drafter's block size from its config.json (assumed Kimi-K2.6-DFlash's without one)."""
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


def plan_refused_requests(c: PlanContext) -> None:
    """The requests this release's DFLASH server refuses (the version table's
    ``dflash_refused_requests``): users get an error for them, not an answer, so the plan says
    which, and how a chat request with tools becomes one."""
    row = c.row
    refused = row.dflash_refused_requests if row is not None else ()
    if not refused:
        c.b.why("refused-requests", "none", f"DFLASH on SGLang {c.version} serves every request "
                f"({row.dflash_refusals_source if row else 'version table'})", c.src)
        return
    parser = next((v for k, v in c.b.flags if k == "--tool-call-parser"), None)
    what = "; ".join(f"{name}: {versions.DFLASH_REFUSAL_WHAT[name]}" for name in refused)
    tools = ""
    if "grammar" in refused and parser:
        tools = (f"; so with --tool-call-parser {parser} only tool_choice \"auto\" or \"none\" "
                 "with non-strict tools is served")
    c.b.why(
        "refused-requests",
        ", ".join(refused),
        f"DFLASH on SGLang {c.version} answers these with an error (HTTP 400), not an answer: "
        f"{what}{tools} ({row.dflash_refusals_source})",
        c.src,
    )

