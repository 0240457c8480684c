"""The sweep's report: PNG plots (matplotlib) and one HTML page that holds them with the table.

- ``tokens_per_s.png``: output tokens/s against concurrency (one category per level measured),
  one line per grid point, each its own colour and marker, the legend beside the data;
- ``accept_length.png``: the acceptance length the server reported, one horizontal bar per point;
- ``heatmap.png``: output tokens/s at the top concurrency over the grid's first two axes (the
  best over any further axes), the best cell outlined;
- ``ddtree_budget.png`` (a sweep with a DDTree budget axis): acceptance length and output
  tokens/s at the top concurrency against the budget, one line per setting of the other axes,
  the best point marked.

Importing this module needs matplotlib (``pip install 'specfleet[plots]'``); the sweep runs
without it and says so.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, never a window
import matplotlib.pyplot as plt  # noqa: E402 (after choosing the backend)
from matplotlib.figure import Figure  # noqa: E402

from specfleet.core import bench as core  # noqa: E402

SHORT = {"num_draft_tokens": "draft tokens", "ddtree_budget": "budget",
         "draft_window": "draft window",
         "draft_attention_backend": "draft attn", "attention_backend": "attn"}


def _label(point: Mapping[str, Any]) -> str:
    return " ".join(f"{SHORT.get(k, k)}={v}" for k, v in point.items())


def standin_note(state: Mapping[str, Any]) -> str | None:
    """A warning for every figure whose numbers came from the stand-in server (the bench client
    records ``meta.server``), else ``None``."""
    if any((r.get("meta") or {}).get("server") == "stand-in" for _, _, r in _done(state)):
        return "stand-in server: modelled numbers, not a real SGLang measurement"
    return None


def _title(ax, state: Mapping[str, Any], text: str) -> None:
    note = standin_note(state)
    ax.set_title(f"{state['host']}: {text}" + (f"\n[{note}]" if note else ""), fontsize=10)


def _styles(n: int) -> list[dict[str, Any]]:
    """``n`` distinct line styles: 20 colours, then markers and dashes that tell repeats apart."""
    colours = plt.get_cmap("tab20").colors
    markers, dashes = "osD^vP*Xh<>", ["-", "--", ":", "-."]
    return [{"color": colours[i % len(colours)], "marker": markers[i % len(markers)],
             "linestyle": dashes[(i // len(colours)) % len(dashes)]} for i in range(n)]


def _done(state: Mapping[str, Any]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    return [(k, r["point"], r["result"]) for k, r in state["points"].items()
            if r.get("status") == "done" and r.get("result")]


def plot_tokens(state: Mapping[str, Any]) -> Figure:
    done = _done(state)
    # Concurrency levels are categories (1, 4, 16 ...), evenly spaced: never ticks at 1.5.
    levels = sorted({lv["concurrency"] for _, _, r in done for lv in r["levels"]
                     if lv.get("completed")})
    fig, ax = plt.subplots(figsize=(10, 5))
    for (key, point, result), style in zip(done, _styles(len(done)), strict=True):
        seen = sorted((lv["concurrency"], lv["output_tokens_per_s"])
                      for lv in result["levels"] if lv.get("completed"))
        best = key == state.get("best")
        ax.plot([levels.index(c) for c, _ in seen], [t for _, t in seen],
                label=("BEST " if best else "") + _label(point),
                linewidth=3.5 if best else 1.3, zorder=3 if best else 2, **style)
    ax.set_xticks(range(len(levels)), [str(c) for c in levels])
    ax.set_xlabel("concurrency (requests in flight)")
    ax.set_ylabel("output tokens/s")
    _title(ax, state, "output tokens/s vs concurrency (thick: best)")
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout()
    return fig


def plot_accept(state: Mapping[str, Any]) -> Figure:
    done = _done(state)
    # One horizontal bar per point: long point labels read level on the y axis.
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.35 * max(len(done), 1)))
    values = [r.get("accept_length") or 0.0 for _, _, r in done]
    colors = ["tab:orange" if k == state.get("best") else "tab:blue" for k, _, _ in done]
    ax.barh(range(len(done)), values, color=colors)
    ax.set_yticks(range(len(done)), [_label(p) for _, p, _ in done], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("acceptance length (accepted tokens per verify step)")
    ax.set_ylabel("grid point")
    _title(ax, state, "acceptance length per point (orange: best)")
    fig.tight_layout()
    return fig


def heat_grid(state: Mapping[str, Any]) -> tuple[str, str, list, list, list[list[float | None]]]:
    """The first two axes of the grid and the best top tokens/s of each cell."""
    axes = [k for k in core.AXES if any(k in p for p in state["grid"])]
    ax_y, ax_x = (axes + [None, None])[:2]
    ys = list(dict.fromkeys(p.get(ax_y) for p in state["grid"]))
    xs = list(dict.fromkeys(p.get(ax_x) for p in state["grid"]))
    cells: list[list[float | None]] = [[None] * len(xs) for _ in ys]
    for _, point, result in _done(state):
        i, j = ys.index(point.get(ax_y)), xs.index(point.get(ax_x))
        tps = core.top_tps(result)
        if tps is not None and (cells[i][j] is None or tps > cells[i][j]):
            cells[i][j] = tps
    return str(ax_y), str(ax_x), ys, xs, cells


def _cell(point, ax_y, ax_x, ys, xs) -> tuple[int, int] | None:
    if point is None:
        return None
    return ys.index(point.get(ax_y)), xs.index(point.get(ax_x))


def plot_heatmap(state: Mapping[str, Any]) -> Figure:
    ax_y, ax_x, ys, xs, cells = heat_grid(state)
    fig, ax = plt.subplots(figsize=(6, 4.5))
    data = [[float("nan") if v is None else v for v in row] for row in cells]
    im = ax.imshow(data, cmap="viridis", aspect="auto", origin="lower")
    ax.set_xticks(range(len(xs)), [str(x) for x in xs])
    ax.set_yticks(range(len(ys)), [str(y) for y in ys])
    ax.set_xlabel(SHORT.get(ax_x, ax_x))
    ax.set_ylabel(SHORT.get(ax_y, ax_y))
    best = state.get("best")
    best_point = state["points"][best]["point"] if best else None
    finite = [v for row in cells for v in row if v is not None]
    middle = (min(finite) + max(finite)) / 2 if finite else 0.0
    for i, row in enumerate(cells):
        for j, v in enumerate(row):
            # viridis is bright at the top: dark text on bright cells, light text on dark ones.
            ax.text(j, i, "-" if v is None else f"{v:.0f}", ha="center", va="center",
                    color="black" if v is not None and v > middle else "white", fontsize=9,
                    fontweight="bold" if (i, j) == _cell(best_point, ax_y, ax_x, ys, xs)
                    else "normal")
    if best_point is not None:
        i, j = _cell(best_point, ax_y, ax_x, ys, xs)
        ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="red",
                                   linewidth=3))
    fig.colorbar(im, ax=ax, label="output tokens/s (top concurrency)")
    _title(ax, state, "the grid (red: best)")
    fig.tight_layout()
    return fig


def has_budget_axis(state: Mapping[str, Any]) -> bool:
    return any("ddtree_budget" in p for p in state["grid"])


def plot_budget(state: Mapping[str, Any]) -> Figure:
    """Acceptance length and output tokens/s (top concurrency) against the DDTree budget."""
    done = [(k, p, r) for k, p, r in _done(state) if "ddtree_budget" in p]
    budgets = sorted({int(p["ddtree_budget"]) for p in state["grid"] if "ddtree_budget" in p})
    lines: dict[str, list[tuple[int, str, dict[str, Any]]]] = {}
    for key, point, result in done:
        rest = {k: v for k, v in point.items() if k != "ddtree_budget"}
        lines.setdefault(_label(rest) or "budget", []).append(
            (int(point["ddtree_budget"]), key, result))
    fig, (acc, tps) = plt.subplots(1, 2, figsize=(12, 4.5))
    for (label, seen), style in zip(sorted(lines.items()), _styles(len(lines)), strict=True):
        seen.sort()
        xs = [budgets.index(b) for b, _, _ in seen]
        acc.plot(xs, [r.get("accept_length") or 0.0 for _, _, r in seen], label=label, **style)
        tps.plot(xs, [core.top_tps(r) or 0.0 for _, _, r in seen], label=label, **style)
        for b, key, r in seen:
            if key == state.get("best"):
                tps.plot([budgets.index(b)], [core.top_tps(r)], marker="*", markersize=18,
                         color="tab:red", zorder=4, linestyle="none", label="BEST")
    for ax, ylabel in ((acc, "acceptance length (tokens per verify step)"),
                       (tps, "output tokens/s at the top concurrency")):
        # Budgets are categories (8, 16, 32 ...: doublings), evenly spaced.
        ax.set_xticks(range(len(budgets)), [str(b) for b in budgets])
        ax.set_xlabel("DDTree budget (tree nodes verified per step)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    _title(acc, state, "acceptance length vs DDTree budget")
    _title(tps, state, "output tokens/s vs DDTree budget (star: best)")
    if tps.lines:
        tps.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout()
    return fig


def write_report(state: Mapping[str, Any], folder: Path) -> Path:
    """The PNGs and ``report.html`` in ``folder``; the HTML's path."""
    folder.mkdir(parents=True, exist_ok=True)
    pngs = {"tokens_per_s.png": plot_tokens, "accept_length.png": plot_accept,
            "heatmap.png": plot_heatmap}
    if has_budget_axis(state):
        pngs["ddtree_budget.png"] = plot_budget
    for name, plot in pngs.items():
        fig = plot(state)
        fig.savefig(folder / name, dpi=110, bbox_inches="tight")
        plt.close(fig)
    best = state.get("best")
    rows = []
    for key, rec in state["points"].items():
        result = rec.get("result") or {}
        level = core.top_level(result) if result else None
        cells = [_label(rec["point"]), rec["status"],
                 "-" if level is None else f"{level['output_tokens_per_s']:.1f}",
                 "-" if level is None else str(level.get("mean_ttft_ms")),
                 "-" if result.get("accept_length") is None else f"{result['accept_length']:.2f}",
                 "BEST" if key == best else rec.get("why", "")]
        rows.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    note = standin_note(state)
    plan = core.point_overrides(state["points"][best]["point"]) if best else None
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>specfleet sweep: {html.escape(state['host'])}</title>
<style>body{{font-family:sans-serif;margin:2em}}
td,th{{padding:4px 10px;border-bottom:1px solid #ddd}}
img{{max-width:48%;margin:4px}}</style></head><body>
<h1>specfleet sweep: {html.escape(state['host'])}</h1>
{f'<p style="color:#a00"><b>{html.escape(note)}</b></p>' if note else ''}
<p>Host now on: <b>{html.escape(str(state.get('current')))}</b>.
Winning <code>plan</code> overrides: <code>{html.escape(str(plan))}</code></p>
{''.join(f'<img src="{n}" alt="{n}">' for n in pngs)}
<table><tr><th>point</th><th>status</th><th>tok/s (top concurrency)</th><th>TTFT ms</th>
<th>accept length</th><th></th></tr>
{''.join(rows)}
</table></body></html>
"""
    path = folder / "report.html"
    path.write_text(page)
    return path
