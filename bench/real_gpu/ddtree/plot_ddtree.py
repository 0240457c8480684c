#!/usr/bin/env python3
"""``ddtree_budget.png`` from a DDTree run's record (issue 51), here, after the run:

    python bench/real_gpu/ddtree/plot_ddtree.py bench/real_gpu/results/<run>/   # the folder
        [--out FILE.png]                       # holding ddtree-record.json; default FOLDER/...

The record's summary is recomputed with ``lab_ddtree.summary`` (the code the machine ran), then
three panels against the DDTree budget (categories, evenly spaced): SGLang's acceptance length
(``meta_info``, the prompts alone), output tokens/s at batch 1 and at batch 8 (the median of the
timed passes), one line per drafter on triton, the fa3 experiment as its own markers, DFLASH
without DDTree (D0) and the plain server (P0) as horizontal lines. A point whose greedy output
differs from P0's is crossed in red; a budget the plan refused is marked "refused".

The figure says what it measures: a 4M-parameter pair on one GPU (named from the record's
facts), where tokens/s is SGLang's per-step overhead, not K2.6's verify cost, so the best budget
here does not transfer. Needs
matplotlib (``pip install 'specfleet[plots]'``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
LABEL = ("a 4M-parameter pair on one {gpu} (tokens/s measures SGLang's per-step overhead, "
         "not K2.6's verify cost; the best budget does not transfer)")


def record_gpus(servers: dict) -> str:
    """The GPU the servers ran on, as their live facts name it (a record whose calls ran on
    different machines names each)."""
    names = sorted({g.get("name") for s in servers.values()
                    for g in (((s.get("facts") or {}).get("facts.gpu.Gpus") or {}).get("gpus")
                              or []) if g.get("name")})
    return " / ".join(names) or "GPU (not in the record)"


def load_summary(folder: Path) -> dict:
    """``lab_ddtree.summary()`` of ``folder/ddtree-record.json``."""
    if not (folder / "ddtree-record.json").is_file():
        raise SystemExit(f"no ddtree-record.json in {folder}")
    os.environ["RG_WORK"] = str(folder)  # lab_run reads its record from there at import
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    import lab_ddtree

    return {**lab_ddtree.summary(), "gpu": record_gpus(lab_ddtree.RECORD["servers"])}


def plot(summary: dict, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = summary["servers"]
    budgets = sorted({r["budget"] for r in rows.values() if r.get("budget")})
    x = {b: i for i, b in enumerate(budgets)}
    fig, axes = plt.subplots(1, 3, figsize=(16, 5))
    panels = [(axes[0], "accept", "acceptance length (SGLang's, tokens per verify step)"),
              (axes[1], "1", "output tokens/s, each prompt alone (batch 1)"),
              (axes[2], "8", "output tokens/s, the 8 prompts in one batch")]

    def value(r: dict, what: str):
        if what == "accept":
            return r.get("accept_length")
        return (r.get("tokens_per_s") or {}).get(what)

    lines = {}
    for r in rows.values():
        if r.get("budget") and r.get("backend"):
            name = (f"{r['drafter']}, {r['backend']}" + (" (experiment: the plan refuses it)"
                                                         if r.get("experiment") else ""))
            lines.setdefault(name, []).append(r)
    colours = plt.get_cmap("tab10").colors
    for ax, what, ylabel in panels:
        for i, (name, rs) in enumerate(sorted(lines.items())):
            rs = sorted(rs, key=lambda r: r["budget"])
            fa3 = "fa3" in name
            pts = [(x[r["budget"]], value(r, what), r) for r in rs if value(r, what) is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], label=name,
                        color=colours[i % 10], marker="^" if fa3 else "o",
                        linestyle=":" if fa3 else "-", markerfacecolor="none" if fa3 else None)
            for px, py, r in pts:
                if r.get("identical_to_reference") is False:
                    ax.plot([px], [py], marker="x", color="tab:red", markersize=13, mew=2.5,
                            linestyle="none", zorder=5)
            for r in rs:
                if r["status"] in ("refused", "dropped"):
                    ax.annotate(f"{name.split(',')[0]}: refused", (x[r["budget"]], 0),
                                textcoords="offset points", xytext=(0, 4 + 10 * i), ha="center",
                                fontsize=7, color=colours[i % 10],
                                xycoords=("data", "axes fraction"))
        for tag, style, text in (("D0", "--", "DFLASH, no DDTree (block 8, main)"),
                                 ("P0", ":", "plain, no speculation")):
            v = value(rows.get(tag) or {}, what)
            if v is not None and not (tag == "P0" and what == "accept"):
                ax.axhline(v, color="black", linestyle=style, linewidth=1, label=text)
        ax.set_xticks(range(len(budgets)), [str(b) for b in budgets])
        ax.set_xlim(-0.3, len(budgets) - 0.7)
        ax.set_xlabel("DDTree budget (--speculative-num-draft-tokens: tree nodes + root)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[0].plot([], [], marker="x", color="tab:red", linestyle="none", mew=2.5,
                 label="output differs from the plain server's")
    handles, labels = axes[0].get_legend_handles_labels()
    for ax in axes[1:]:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=False):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, frameon=False)
    commit = summary.get("commit") or "?"
    fig.suptitle(f"DDTree budget sweep, the fork (DB-Guo/sglang-ddtree-dev 514ea1f3e), commit "
                 f"{commit[:10]}\n{LABEL.format(gpu=summary.get('gpu') or 'GPU')}"
                 + ("\n[DRY REHEARSAL: no measurement]" if summary.get("dry") else ""),
                 fontsize=10)
    fig.tight_layout(rect=(0, 0.1, 1, 0.93))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path, help="the folder holding ddtree-record.json")
    ap.add_argument("--out", type=Path, help="default FOLDER/ddtree_budget.png")
    args = ap.parse_args(argv)
    summary = load_summary(args.folder.resolve())
    print(plot(summary, args.out or args.folder / "ddtree_budget.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
