"""The rollout's fleet-wide progress view: the batches, each host's step and for how long (a
gate's wait is its time in the gate step), and the weights prefetch across the fleet (bytes,
rate, ETA, from each host's download progress as ``operations.weights`` leaves it on pyinfra's
Host object, ``PROGRESS_ATTR``).

On a terminal it is a ``rich`` live table (on stderr, beside pyinfra's log); otherwise, and with
``--json``, plain lines on stderr (stdout stays the result's).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from specfleet.core.errors import PROGRESS_ATTR


def fleet_download(progress: Iterable[dict]) -> dict[str, float]:
    """The downloads of every host added up: bytes done and total, the summed rate, the ETA in
    seconds (None while no rate is known) and how many hosts download now."""
    done = total = rate = 0.0
    active = 0
    for p in progress:
        done += float(p.get("bytes_done") or 0)
        total += float(p.get("bytes_total") or 0)
        if p.get("state") == "downloading":
            rate += float(p.get("rate_bps") or 0)
            active += 1
    eta = (total - done) / rate if rate > 0 and total > done else None
    return {"done": done, "total": total, "rate": rate, "eta": eta, "active": active}


def download_words(d: dict[str, float], hosts: int) -> str:
    """``412.0 of 4480.0 GiB across 8 hosts, 1.9 GB/s, 38 min left``."""
    if not d["total"]:  # nothing listed yet: zeros would say a size
        return f"no size known yet on {hosts} host{'s' * (hosts != 1)}" if hosts \
            else "no host downloading"
    gib = 1024**3
    words = f"{d['done'] / gib:.1f} of {d['total'] / gib:.1f} GiB across {hosts} hosts"
    if d["rate"]:
        words += f", {d['rate'] / 1e9:.2f} GB/s"
    if d["eta"] is not None:
        words += f", {d['eta'] / 60:.0f} min left"
    return words


class PlainView:
    """One line per step end, on stderr."""

    def __init__(self, rollout: Any) -> None:
        self.rollout = rollout
        self.started: dict[str, float] = {}
        self.current: dict[str, tuple[str, float]] = {}

    def step(self, name: str, hosts: Sequence[str]) -> None:
        now = time.monotonic()
        self.started[name] = now
        for h in hosts:
            self.current[h] = (name, now)
        self.refresh()

    def done(self, name: str, step: Any) -> None:
        took = time.monotonic() - self.started.pop(name, time.monotonic())
        bad = [h for h, r in step.results.items() if not r.passed]
        words = f"{len(step.results) - len(bad)} passed"
        if bad:
            words += f", not passed: {', '.join(bad)}"
        if "prefetch" in name:
            words += f"; {self.download_line()}"
        print(f"rollout: {name}: {words} ({took:.1f} s)", file=sys.stderr, flush=True)
        now = time.monotonic()
        for h, r in step.results.items():
            self.current[h] = (f"{name}: {r.status}", now)
        self.refresh()

    def download_line(self) -> str:
        progress, hosts = [], 0
        session = getattr(self.rollout, "session", None)
        for h in self.rollout.reports:
            seen = getattr(session.host(h), PROGRESS_ATTR, None) if session else None
            if isinstance(seen, dict) and seen:
                hosts += 1
                progress.extend(seen.values())
        return download_words(fleet_download(progress), hosts)

    def refresh(self) -> None:
        pass


class RichView(PlainView):
    """A live table of every host (its batch, the step it is in and since when, its result)
    under a line for the fleet's prefetch; redrawn twice a second."""

    def table(self) -> Any:
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        t = Table(title="specfleet rollout", expand=False)
        for col in ("batch", "host", "step", "for", "result"):
            t.add_column(col)
        now = time.monotonic()
        for i, batch in enumerate(self.rollout.batches):
            for h in batch:
                r = self.rollout.reports[h]
                what, since = self.current.get(h, ("waiting", now))
                t.add_row("canary" if i == 0 else str(i), h, what, f"{now - since:.0f} s",
                          r.status)
        return Group(Text(f"prefetch: {self.download_line()}"), t)


@contextmanager
def progress_view(rollout: Any, quiet: bool = False) -> Iterator[PlainView]:
    """The view for this terminal: rich's live table on a TTY (stderr), else plain lines."""
    if quiet or not sys.stderr.isatty():
        yield PlainView(rollout)
        return
    from rich.console import Console
    from rich.live import Live

    view = RichView(rollout)
    with Live(get_renderable=view.table, console=Console(stderr=True), refresh_per_second=2,
              transient=False):
        yield view
