"""Every benchmark and the drill suite, one after the other, in the configuration of the figures
the README reports (issue 40), each output in ``bench/results/<commit>/``.

    sudo .venv/bin/python -m bench.final [--only NAME,...] [--allow-dirty]

Run on a quiet machine (nothing else booting fleets): the benches' ratios are side by side in one
run, but the fleets share the machine's CPUs. The commit is taken once, before the first bench,
and every output's stamp names it (``SPECFLEET_BENCH_COMMIT``); the sweep's report goes to the
results folder, so the tree stays as it was. A tree with changes to tracked files is refused
unless ``--allow-dirty`` (its stamps then say ``-dirty``, and ``python -m bench.stamp`` refuses
them for the READMEs). The fleets are tagged ``final`` unless ``SPECFLEET_FLEET_TAG`` says
otherwise (``python -m tests.fleet down --tag final`` after an interrupted run).

At the end it prints each bench's figure line (the last ``NAME: ...`` line of its output, which
ends with its stamp), its exit status and its time; ``summary.txt`` in the results folder holds
the same. Then ``python -m bench.stamp bench/results/<commit>`` puts them in the READMEs.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.stamp import COMMIT_ENV, REPO_ROOT, current_commit, figure_line

PY = sys.executable


@dataclasses.dataclass(frozen=True)
class Bench:
    name: str  # also the prefix of its figure line ("converged: ...")
    argv: tuple[str, ...]  # from the repository root; RESULTS is the results folder
    minutes: int  # what it took on the 2-core machine beside others' fleets (bench/FINAL.md)
    limit_minutes: int  # killed past this (a hang must not eat the others' time)
    why: str  # the target this configuration measures


BENCHES = (
    Bench("converged", (PY, "bench/converged/run.py", "--hosts", "32", "--runs", "3"), 10, 20,
          "control CPU per host at or below stock pyinfra's for 15 no-op operations, at 32 hosts, "
          "2 SSH commands per host"),
    Bench("weights", (PY, "bench/weights/run.py"), 1, 10,
          "the download at >= 0.9 of the link (100 Mbit/s tbf); converged re-check / bare exec"),
    Bench("fanout", (PY, "bench/fanout/run.py", "--hosts", "16"), 4, 15,
          "1.00x upstream bytes and <= 1.3x one host's time, at 16 hosts"),
    Bench("sweep", (PY, "bench/sweep/run.py", "--copy-to", "RESULTS/sweep"), 3, 10,
          "the sweep finds the stand-in model's best point"),
    Bench("drills", (PY, "-m", "bench.drills.run"), 10, 30,
          "drills: survived=N/N (N >= 22) lost=0 leaks=0 tracebacks=0 bad_inputs >= 400"),
)


def results_dir(commit: str) -> Path:
    return REPO_ROOT / "bench" / "results" / commit


def run_one(bench: Bench, out: Path) -> tuple[int, float, str]:
    """Run one bench, its output (stdout and stderr) to ``out/NAME.txt`` and this terminal;
    (exit status, seconds, its figure line or "")."""
    argv = [a.replace("RESULTS", str(out)) for a in bench.argv]
    log = out / f"{bench.name}.txt"
    t0 = time.monotonic()
    print(f"==> {bench.name}: {' '.join(argv)} (about {bench.minutes} min; killed after "
          f"{bench.limit_minutes})", flush=True)
    killed = threading.Event()
    with log.open("w") as f:
        proc = subprocess.Popen(argv, cwd=REPO_ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)

        def stop() -> None:
            # SIGTERM first: each bench tears its fleet down on it; SIGKILL if it does not end.
            killed.set()
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)

        timer = threading.Timer(bench.limit_minutes * 60, stop)
        timer.start()
        try:
            for line in proc.stdout:  # type: ignore[union-attr]
                f.write(line)
                f.flush()
                sys.stdout.write(line)
            rc = proc.wait()
        finally:
            timer.cancel()
        if killed.is_set():
            f.write(f"\n(killed after {bench.limit_minutes} minutes)\n")
    seconds = time.monotonic() - t0
    return rc, seconds, figure_line(bench.name, log.read_text())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.final", description=__doc__.split("\n")[0])
    ap.add_argument("--only", help="comma-separated bench names: " + ",".join(
        b.name for b in BENCHES))
    ap.add_argument("--allow-dirty", action="store_true",
                    help="run on a tree whose tracked files differ from its commit")
    ap.add_argument("--list", action="store_true", help="the benches, their time and target")
    a = ap.parse_args(argv)
    chosen = [b for b in BENCHES if not a.only or b.name in a.only.split(",")]
    if a.list:
        for b in chosen:
            print(f"{b.name:10} ~{b.minutes:>2} min  {' '.join(b.argv[1:])}  ({b.why})")
        print(f"total ~{sum(b.minutes for b in chosen)} min")
        return 0
    if os.geteuid() != 0:
        ap.error("run as root (the benches boot systemd-nspawn hosts)")
    commit = current_commit()
    if commit.endswith("-dirty") and not a.allow_dirty:
        ap.error(f"the tree differs from {commit[:-6]} (git status): commit first, or "
                 "--allow-dirty (the figures then cannot go into the README)")
    os.environ[COMMIT_ENV] = commit
    os.environ.setdefault("SPECFLEET_FLEET_TAG", "final")
    out = results_dir(commit)
    out.mkdir(parents=True, exist_ok=True)
    summary = []
    t0 = time.monotonic()
    for bench in chosen:
        rc, seconds, line = run_one(bench, out)
        summary.append(f"{bench.name:10} rc={rc} {seconds / 60:5.1f} min  "
                       f"{line or '(no figure line)'}")
        (out / "summary.txt").write_text("\n".join(summary) + "\n")
    total = (time.monotonic() - t0) / 60
    summary.append(f"total {total:.1f} min; outputs in {out.relative_to(REPO_ROOT)}/; "
                   f"then: python -m bench.stamp {out.relative_to(REPO_ROOT)}")
    (out / "summary.txt").write_text("\n".join(summary) + "\n")
    print("\n==> summary\n" + "\n".join(summary), flush=True)
    return 0 if all(" rc=0 " in s for s in summary[:-1]) else 1


if __name__ == "__main__":
    sys.exit(main())
