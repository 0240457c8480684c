"""The rollout's fleet-wide progress view: the batches, each host's step, and each step's time.

On a terminal it is a ``rich`` live table (to stderr, beside pyinfra's log); otherwise, and
with ``--json``, plain lines on stderr (stdout stays the result's).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any


class PlainView:
    """One line per step start and end, on stderr."""

    def __init__(self, rollout: Any) -> None:
        self.rollout = rollout
        self.started: dict[str, float] = {}

    def step(self, name: str, hosts: Sequence[str]) -> None:
        self.started[name] = time.monotonic()

    def done(self, name: str, step: Any) -> None:
        took = time.monotonic() - self.started.pop(name, time.monotonic())
        bad = [h for h, r in step.results.items() if not r.passed]
        words = f"{len(step.results) - len(bad)} passed" + (f", failed: {', '.join(bad)}"
                                                            if bad else "")
        print(f"rollout: {name}: {words} ({took:.1f} s)", file=sys.stderr, flush=True)

    def refresh(self) -> None:
        pass


class RichView(PlainView):
    """A live table of every host: its batch, the step it is in (and since when), its result."""

    def __init__(self, rollout: Any, live: Any) -> None:
        super().__init__(rollout)
        self.live = live
        self.current: dict[str, tuple[str, float]] = {}

    def step(self, name: str, hosts: Sequence[str]) -> None:
        self.started[name] = time.monotonic()
        for h in hosts:
            self.current[h] = (name, time.monotonic())
        self.refresh()

    def done(self, name: str, step: Any) -> None:
        super().done(name, step)
        for h, r in step.results.items():
            self.current[h] = (f"{name}: {r.status}", time.monotonic())
        self.refresh()

    def table(self) -> Any:
        from rich.table import Table

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
        return t

    def refresh(self) -> None:
        self.live.update(self.table(), refresh=True)


@contextmanager
def progress_view(rollout: Any, quiet: bool = False) -> Iterator[PlainView]:
    """The view for this terminal: rich's live table on a TTY (stderr), else plain lines."""
    if quiet or not sys.stderr.isatty():
        yield PlainView(rollout)
        return
    from rich.console import Console
    from rich.live import Live

    with Live(console=Console(stderr=True), auto_refresh=False, transient=False) as live:
        view = RichView(rollout, live)
        yield view
