"""The ``specfleet`` console script.

    specfleet plan --facts FACTS.json [--settings S] [--host H] [--json]   (anywhere)
    specfleet rollout INVENTORY DEPLOY [rollout options]                   (a checkout)
    specfleet fanout INVENTORY [fan-out options]                           (a checkout)
    specfleet probe INVENTORY [python=... models_path=...]                 (a checkout)
    specfleet status INVENTORY [--limit HOST ...]                          (a checkout)
    specfleet monitoring INVENTORY --out DIR                               (Prometheus, Grafana)
    specfleet logs INVENTORY HOST [-n LINES]                               (redacted journal)

``plan`` needs nothing but this package. The others run the deploy files and facts of a
specfleet checkout (the current directory, ``--checkout PATH`` or ``$SPECFLEET_CHECKOUT``), by
path, as pyinfra's own CLI does: this floor never imports ``deploys``, ``operations`` or
``facts``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from specfleet import plan as plan_cli
from specfleet.core.errors import SpecfleetError
from specfleet.fleet import fanout, monitoring, rollout
from specfleet.fleet.pyinfra_run import CHECKOUT_ENV, checkout_dir


def _in_checkout(argv: list[str], checkout: str | None) -> int:
    """Run ``argv`` (a Python module of the checkout) with the checkout as working directory and
    inventory paths made absolute."""
    where = checkout_dir(checkout)
    args = [os.path.abspath(a) if os.path.exists(a) else a for a in argv]
    return subprocess.run([sys.executable, *args], cwd=where, check=False).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="specfleet", description="Provision SGLang speculative-decoding servers with pyinfra."
    )
    parser.add_argument(
        "--checkout", help=f"the specfleet checkout to run deploys from (or ${CHECKOUT_ENV})"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    plan_cli.add_arguments(sub.add_parser("plan", help="the launch plan of one host's facts"))
    for name, what in (
        ("rollout", "roll a deploy across a fleet: canary, batches, gates, rollback"),
        ("fanout", "fetch the weights once per fleet, then host to host"),
        ("probe", "every host's facts, one SSH command per host"),
        ("status", "what each host runs, read-only"),
        ("monitoring", "Prometheus scrape config, alert rules and a Grafana dashboard"),
        ("logs", "a host's server journal, every secret redacted"),
    ):
        p = sub.add_parser(name, help=what, add_help=False)
        p.add_argument("rest", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    try:
        if args.checkout:
            os.environ[CHECKOUT_ENV] = os.path.abspath(args.checkout)
        if args.command == "plan":
            return plan_cli.run(args)
        if args.command == "rollout":
            checkout_dir(args.checkout)
            return rollout.main(args.rest)
        if args.command == "fanout":
            checkout_dir(args.checkout)
            return fanout.main(args.rest)
        if args.command == "monitoring":
            return monitoring.main_monitoring(args.rest)
        if args.command == "logs":
            return monitoring.main_logs(args.rest)
        if args.command == "probe":
            return _in_checkout(["-m", "facts.probe", *args.rest], args.checkout)
        return _in_checkout(
            ["-m", "pyinfra", "-y", *args.rest[:1], "deploys/status.py", *args.rest[1:]],
            args.checkout,
        )
    except SpecfleetError as exc:
        print(f"specfleet: {exc.render()}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
