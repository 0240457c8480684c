"""The sweep's report: PNG plots (matplotlib) and one HTML page that holds them with the table.

- ``tokens_per_s.png``: output tokens/s against concurrency, one line per grid point;
- ``accept_length.png``: the acceptance length the server reported, one bar per point;
- ``heatmap.png``: output tokens/s at the top concurrency over the grid's first two axes (the
  best over any further axes), the best cell outlined.

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

from specfleet.core import bench as core  # noqa: E402

SHORT = {"num_draft_tokens": "draft tokens", "draft_window": "draft window",
         "draft_attention_backend": "draft attn", "attention_backend": "attn"}


def _label(point: Mapping[str, Any]) -> str:
    return " ".join(f"{SHORT.get(k, k)}={v}" for k, v in point.items())


def _done(state: Mapping[str, Any]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    return [(k, r["point"], r["result"]) for k, r in state["points"].items()
            if r.get("status") == "done" and r.get("result")]


def plot_tokens(state: Mapping[str, Any], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, point, result in _done(state):
        levels = sorted((lv["concurrency"], lv["output_tokens_per_s"])
                        for lv in result["levels"] if lv.get("completed"))
        style = dict(linewidth=3) if key == state.get("best") else dict(linewidth=1, alpha=0.8)
        ax.plot([c for c, _ in levels], [t for _, t in levels], marker="o", label=_label(point),
                **style)
    ax.set_xlabel("concurrency")
    ax.set_ylabel("output tokens/s")
    ax.set_title(f"{state['host']}: output tokens/s vs concurrency (thick: best)")
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_accept(state: Mapping[str, Any], path: Path) -> None:
    done = _done(state)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    values = [r.get("accept_length") or 0.0 for _, _, r in done]
    colors = ["tab:orange" if k == state.get("best") else "tab:blue" for k, _, _ in done]
    ax.bar(range(len(done)), values, color=colors)
    ax.set_xticks(range(len(done)), [_label(p) for _, p, _ in done], rotation=35, ha="right",
                  fontsize=7)
    ax.set_ylabel("acceptance length (tokens per step)")
    ax.set_title(f"{state['host']}: acceptance length per point (orange: best)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


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


def plot_heatmap(state: Mapping[str, Any], path: Path) -> None:
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
    for i, row in enumerate(cells):
        for j, v in enumerate(row):
            ax.text(j, i, "-" if v is None else f"{v:.0f}", ha="center", va="center",
                    color="white", fontsize=9)
    if best_point is not None:
        i, j = ys.index(best_point.get(ax_y)), xs.index(best_point.get(ax_x))
        ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="red",
                                   linewidth=3))
    fig.colorbar(im, ax=ax, label="output tokens/s (top concurrency)")
    ax.set_title(f"{state['host']}: the grid (red: best)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(state: Mapping[str, Any], folder: Path) -> Path:
    """The three PNGs and ``report.html`` in ``folder``; the HTML's path."""
    folder.mkdir(parents=True, exist_ok=True)
    pngs = {"tokens_per_s.png": plot_tokens, "accept_length.png": plot_accept,
            "heatmap.png": plot_heatmap}
    for name, plot in pngs.items():
        plot(state, folder / name)
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
    plan = core.point_overrides(state["points"][best]["point"]) if best else None
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>specfleet sweep: {html.escape(state['host'])}</title>
<style>body{{font-family:sans-serif;margin:2em}}
td,th{{padding:4px 10px;border-bottom:1px solid #ddd}}
img{{max-width:48%;margin:4px}}</style></head><body>
<h1>specfleet sweep: {html.escape(state['host'])}</h1>
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
