"""Smoke benchmark results, the speed gate, and the speculative-settings sweep: pure.

A result is what ``specfleet/hostside/bench_client.py`` writes on a host (one JSON per run)::

    {"host": "h1", "client": "specfleet stdlib", "meta": {"arch": "sm90", ...},
     "levels": [{"concurrency": 1, "output_tokens_per_s": 88.5, "mean_ttft_ms": 46.3, ...},
                {"concurrency": 4, "output_tokens_per_s": 190.6, ...}],
     "accept_length": 2.2, "accept_length_source": "/server_info internal_states"}

Its headline figure is the output tokens/s at its highest concurrency (``top_tps``).
"""

from __future__ import annotations

import itertools
import math
import pprint
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from specfleet.core.errors import SpecfleetError

# A host below this fraction of its arch's fleet median (output tokens/s) is flagged.
SLOW_FRACTION = 0.7
# The rollout's speed gate: a host's new result keeps at least this fraction of its previous one.
GATE_FRACTION = 0.85


def top_level(result: Mapping[str, Any]) -> Mapping[str, Any] | None:
    levels = [lv for lv in result.get("levels") or [] if lv.get("completed")]
    return max(levels, key=lambda lv: lv.get("concurrency", 0)) if levels else None


def top_tps(result: Mapping[str, Any]) -> float | None:
    level = top_level(result)
    return float(level["output_tokens_per_s"]) if level else None


# --------------------------------------------------------------------------------------------------
# The fleet table
# --------------------------------------------------------------------------------------------------


@dataclass
class HostRow:
    host: str
    arch: str
    tps: dict[int, float] = field(default_factory=dict)
    ttft_ms: float | None = None
    accept_length: float | None = None
    error: str | None = None
    flag: str | None = None

    @property
    def top(self) -> float | None:
        return self.tps[max(self.tps)] if self.tps else None


def fleet_rows(results: Mapping[str, Mapping[str, Any] | None],
               slow_fraction: float = SLOW_FRACTION) -> list[HostRow]:
    """One row per host; a host whose top tokens/s is below ``slow_fraction`` of its arch's
    median (over the hosts of that arch with a result, itself included) is flagged."""
    rows = []
    for host, result in results.items():
        if not result:
            rows.append(HostRow(host, "?", error="no result"))
            continue
        row = HostRow(host, str((result.get("meta") or {}).get("arch") or "?"))
        if result.get("error"):
            row.error = str(result["error"])
        for lv in result.get("levels") or []:
            if lv.get("completed"):
                row.tps[int(lv["concurrency"])] = float(lv["output_tokens_per_s"])
        level = top_level(result)
        row.ttft_ms = level.get("mean_ttft_ms") if level else None
        row.accept_length = result.get("accept_length")
        rows.append(row)
    by_arch: dict[str, list[float]] = {}
    for row in rows:
        if row.top is not None:
            by_arch.setdefault(row.arch, []).append(row.top)
    for row in rows:
        peers = by_arch.get(row.arch, [])
        if row.top is None or len(peers) < 2:
            continue
        median = statistics.median(peers)
        if row.top < slow_fraction * median:
            row.flag = (f"SLOW: {row.top:.1f} tok/s is {row.top / median:.0%} of the {row.arch} "
                        f"median {median:.1f} (threshold {slow_fraction:.0%})")
    return rows


def _fmt(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def fleet_table(rows: Sequence[HostRow]) -> str:
    levels = sorted({c for r in rows for c in r.tps})
    head = ["host", "arch", *(f"tok/s@{c}" for c in levels), "TTFT ms", "accept", "verdict"]
    body = [
        [r.host, r.arch, *(_fmt(r.tps.get(c)) for c in levels), _fmt(r.ttft_ms),
         _fmt(r.accept_length, ".2f"), r.error or r.flag or "ok"]
        for r in rows
    ]
    return text_table(head, body)


def text_table(head: list[str], body: list[list[str]]) -> str:
    """Columns padded to their widest cell, one line a row (the sweep and the bench print it)."""
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body, strict=False)]
    lines = ["  ".join(str(x).ljust(w) for x, w in zip(line, widths, strict=False)).rstrip()
             for line in [head, *body]]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])


# --------------------------------------------------------------------------------------------------
# The rollout's speed gate
# --------------------------------------------------------------------------------------------------


def _finite(value: Any) -> bool:
    """A real number: NaN, an infinity, None or text is no figure to pass a gate with."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


@dataclass(frozen=True)
class GateVerdict:
    passed: bool
    why: str


def speed_gate(new: Mapping[str, Any] | None, previous: Mapping[str, Any] | None,
               fraction: float = GATE_FRACTION) -> GateVerdict:
    """Whether a host's new smoke benchmark keeps ``fraction`` of its previous one, in output
    tokens/s at the top concurrency and in acceptance length. No previous result passes (there
    is nothing to compare); no new result, or a failed one, does not."""
    if not 0 < fraction <= 1:
        raise SpecfleetError(f"speed gate fraction {fraction!r} is not in (0, 1]",
                             fix="pass a fraction such as 0.85")
    if not new or new.get("error") or top_tps(new) is None:
        why = (new or {}).get("error") or "no benchmark result"
        return GateVerdict(False, f"no new benchmark: {why}")
    if not _finite(top_tps(new)):
        return GateVerdict(False, f"the new benchmark's tokens/s is {top_tps(new)!r}, no number")
    if not previous or top_tps(previous) is None or not _finite(top_tps(previous)):
        return GateVerdict(True, f"no earlier benchmark; now {top_tps(new):.1f} tok/s")
    now, before = top_tps(new), top_tps(previous)
    problems = []
    if now < fraction * before:
        problems.append(f"{now:.1f} tok/s is {now / before:.0%} of the earlier {before:.1f}")
    acc_now, acc_before = new.get("accept_length"), previous.get("accept_length")
    if _finite(acc_before) and acc_before and not _finite(acc_now):
        # The server stopped reporting it (or reports no number): nothing shows it kept it.
        problems.append(f"accept length {acc_now!r} now, {acc_before:.2f} before")
    elif acc_now is not None and acc_before and acc_now < fraction * acc_before:
        problems.append(f"accept length {acc_now:.2f} is {acc_now / acc_before:.0%} of the "
                        f"earlier {acc_before:.2f}")
    if problems:
        return GateVerdict(False, "; ".join(problems) + f" (gate: {fraction:.0%})")
    return GateVerdict(True, f"{now:.1f} tok/s, {now / before:.0%} of the earlier {before:.1f}")


# --------------------------------------------------------------------------------------------------
# The sweep
# --------------------------------------------------------------------------------------------------

# Grid axis name -> how a value becomes ``plan`` overrides (settings.PlanOverrides).
AXES = ("num_draft_tokens", "ddtree_budget", "draft_window", "draft_attention_backend",
        "attention_backend")
INTEGER_AXES = ("num_draft_tokens", "ddtree_budget", "draft_window")
NUM_DRAFT_TOKENS_FLAG = "--speculative-num-draft-tokens"


def point_overrides(point: Mapping[str, Any]) -> dict[str, Any]:
    """The ``plan`` overrides that put a host on ``point``."""
    plan: dict[str, Any] = {}
    if "num_draft_tokens" in point:
        plan["extra_args"] = {NUM_DRAFT_TOKENS_FLAG: str(point["num_draft_tokens"])}
    if "ddtree_budget" in point:
        plan["ddtree_budget"] = int(point["ddtree_budget"])
    if "draft_window" in point:
        plan["draft_window_size"] = int(point["draft_window"])
    if "draft_attention_backend" in point:
        plan["draft_attention_backend"] = str(point["draft_attention_backend"])
    if "attention_backend" in point:
        plan["attention_backend"] = str(point["attention_backend"])
    return plan


def point_key(point: Mapping[str, Any]) -> str:
    """A stable key of a grid point (the state file's key)."""
    return ",".join(f"{k}={point[k]}" for k in AXES if k in point)


def parse_grid(spec: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """Every point of a grid given as axis -> values, in a stable order."""
    unknown = [k for k in spec if k not in AXES]
    if unknown:
        raise SpecfleetError(f"unknown sweep axis {', '.join(unknown)}",
                             fix=f"use axes among {', '.join(AXES)}")
    axes = [(k, list(spec[k])) for k in AXES if k in spec and list(spec[k])]
    if not axes:
        raise SpecfleetError("the sweep grid is empty", fix="give at least one axis with values")
    for k, values in axes:
        if len(set(map(str, values))) != len(values):
            raise SpecfleetError(f"sweep axis {k} repeats a value: {values}",
                                 fix="list each value once")
        if k in INTEGER_AXES:
            for v in values:
                if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                    raise SpecfleetError(f"sweep axis {k} value {v!r} is not a positive integer",
                                         fix=f"give {k} as integers, e.g. 4,8,16")
    names = [k for k, _ in axes]
    if "ddtree_budget" in names and "num_draft_tokens" in names:
        raise SpecfleetError(
            "the sweep has both a num_draft_tokens and a ddtree_budget axis: with DDTree the "
            "plan sets the draft tokens from the budget (the fork's design carries the budget in "
            "--speculative-num-draft-tokens)",
            fix="sweep --ddtree-budgets alone (with --draft-window), or --num-draft-tokens alone",
        )
    if any(v < 2 for v in spec.get("ddtree_budget") or []):
        raise SpecfleetError(f"sweep axis ddtree_budget {list(spec['ddtree_budget'])} has a "
                             "value below 2", fix="give budgets such as 8,16,32,64,128")
    return [dict(zip(names, combo, strict=False))
            for combo in itertools.product(*(v for _, v in axes))]


def parse_axis(text: str, integer: bool) -> list[Any]:
    values = [v.strip() for v in text.split(",") if v.strip()]
    if not integer:
        return values
    try:
        return [int(v) for v in values]
    except ValueError:
        raise SpecfleetError(f"not a list of integers: {text!r}", fix="write e.g. 4,8,16") from None


def score(result: Mapping[str, Any] | None) -> float | None:
    """What the sweep maximises: output tokens/s at the top concurrency."""
    return top_tps(result) if result and not result.get("error") else None


def best_key(points: Mapping[str, Mapping[str, Any]]) -> str | None:
    """The key of the done point with the highest score (ties: the first in grid order)."""
    best, best_score = None, -math.inf
    for key, rec in points.items():
        s = score(rec.get("result")) if rec.get("status") == "done" else None
        if s is not None and s > best_score:
            best, best_score = key, s
    return best


def group_data_text(arch: str, plan: Mapping[str, Any]) -> str:
    """A group data file (``group_data/<group>.py``) holding the winning ``plan`` overrides."""
    return (f'"""Winning speculative settings of `specfleet sweep` for {arch}."""\n\n'
            f"specfleet = {pprint.pformat({'plan': dict(plan)}, sort_dicts=True)}\n")



# The block a sweep adds to a group data file that exists already: it changes only the plan keys
# the sweep decides (merged into whatever ``specfleet`` the file sets above it, dicts key by key),
# and a later sweep replaces its own block, never the rest of the file.
SWEEP_BEGIN = "# >>> specfleet sweep: the winning plan overrides (the next sweep rewrites this)"
SWEEP_END = "# <<< specfleet sweep"


def group_data_merged(existing: str | None, arch: str, plan: Mapping[str, Any]) -> str:
    """``existing`` (a group data file's text; None or blank: none) with the winning ``plan``
    overrides merged into its ``specfleet["plan"]``, everything else of it kept as it is."""
    if existing is None or not existing.strip():
        return group_data_text(arch, plan)
    lines = existing.rstrip("\n").split("\n")
    if SWEEP_BEGIN in lines and SWEEP_END in lines[lines.index(SWEEP_BEGIN):]:
        start = lines.index(SWEEP_BEGIN)
        stop = lines.index(SWEEP_END, start)
        lines = lines[:start] + lines[stop + 1:]
        while lines and not lines[-1].strip():
            lines.pop()
    over = pprint.pformat({"plan": dict(plan)}, sort_dicts=True)
    block = [
        SWEEP_BEGIN,
        f"# for {arch}: merged into the settings above, only these keys change",
        "def _specfleet_sweep_merge(base, over):",
        "    out = dict(base or {})",
        "    for key, value in over.items():",
        "        old = out.get(key)",
        "        out[key] = (_specfleet_sweep_merge(old, value)",
        "                    if isinstance(value, dict) and isinstance(old, dict) else value)",
        "    return out",
        "",
        "",
        f"specfleet = _specfleet_sweep_merge(globals().get('specfleet'), {over})",
        "del _specfleet_sweep_merge",
        SWEEP_END,
    ]
    return "\n".join([*lines, "", *block]) + "\n"

def sweep_ending(best: str | None, restored: bool, restore_label: str, failed: int,
                 left: int) -> tuple[str, int]:
    """The sweep's last line and exit code (``specfleet --help``'s codes: 0 ok; 1 a host failed
    or a point failed or was left; never 2, a usage error). A failed restore is said as such:
    the host's plan is then not known, whatever the points did."""
    if not restored:
        return (f"the restore of {restore_label} FAILED: the host runs an unknown plan (state.json "
                "'current' says which one was being deployed); run the sweep again to restore it, "
                "or deploy the inventory", 1)
    if best is None:
        return f"no point could be measured; {restore_label} is back", 1
    if failed or left:
        parts = [f"{failed} point(s) failed"] if failed else []
        parts += [f"{left} point(s) left for the next run"] if left else []
        return f"best {best} restored; {', '.join(parts)}", 1
    return f"best {best} restored", 0
