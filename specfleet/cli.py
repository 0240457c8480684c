"""The ``specfleet`` console script.

    specfleet plan --facts FACTS.json [--settings S] [--host H] [--json]   (anywhere)
    specfleet rollout INVENTORY DEPLOY [rollout and pyinfra options]       (a checkout)
    specfleet fanout INVENTORY [fan-out options]                           (a checkout)
    specfleet probe INVENTORY [python=... models_path=...]                 (a checkout)
    specfleet status INVENTORY [--limit HOST ...] [--json]                 (a checkout)
    specfleet remove INVENTORY [--limit HOST ...] [--dry] [--weights] [--venv]  (a checkout)
    specfleet bench INVENTORY [--limit HOST ...] [bench options]           (a checkout)
    specfleet sweep INVENTORY --host HOST [sweep options]                  (a checkout)
    specfleet monitoring INVENTORY --out DIR                               (Prometheus, Grafana)
    specfleet logs INVENTORY HOST [-n LINES]                               (redacted journal)

``plan`` needs nothing but this package. The others run the deploy files and facts of a
specfleet checkout (the current directory, ``--checkout PATH`` or ``$SPECFLEET_CHECKOUT``), by
path, as pyinfra's own CLI does: this floor never imports ``deploys``, ``operations`` or
``facts``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from specfleet import plan as plan_cli
from specfleet.core.errors import SpecfleetError
from specfleet.fleet import bench, fanout, monitoring, rollout, sweep
from specfleet.fleet.pyinfra_run import CHECKOUT_ENV, checkout_dir


def _in_checkout(argv: list[str], checkout: str | None, **kwargs) -> int:
    """Run ``argv`` (a Python module of the checkout) with the checkout as working directory and
    inventory paths made absolute."""
    where = checkout_dir(checkout)
    args = [os.path.abspath(a) if os.path.exists(a) else a for a in argv]
    return subprocess.run([sys.executable, *args], cwd=where, check=False, **kwargs).returncode


# operations.status writes its document there at exit (this floor does not import operations).
STATUS_JSON_ENV = "SPECFLEET_STATUS_JSON"


def status_json(rest: list[str], checkout: str | None) -> int:
    """``specfleet status INVENTORY --json``: one JSON document on stdout and nothing else
    (``{"hosts": {name: {..., "verdict": ...}}}``); pyinfra's own output goes to stderr. The
    exit code is pyinfra's."""
    with tempfile.TemporaryDirectory(prefix="specfleet-status-") as tmp:
        path = os.path.join(tmp, "status.json")
        env = {**os.environ, STATUS_JSON_ENV: path}
        rc = _in_checkout(["-m", "pyinfra", "-y", *rest[:1], "deploys/status.py", *rest[1:]],
                          checkout, stdout=sys.stderr, env=env)
        try:
            with open(path, encoding="utf-8") as f:
                document = json.load(f)
        except (OSError, ValueError):
            document = {"hosts": {}}
    document["exit_code"] = rc
    sys.stdout.write(json.dumps(document, indent=2) + "\n")
    sys.stdout.flush()
    return rc


def remove_argv(rest: list[str]) -> list[str]:
    """``specfleet remove INVENTORY [--weights] [--venv] [pyinfra options]`` as the pyinfra run
    of the deploy with ``present: False`` (and the removal options) over the inventory's
    ``specfleet`` data. ``--dry`` shows what would go and changes nothing."""
    removal = {"weights": "--weights" in rest, "venv": "--venv" in rest}
    rest = [a for a in rest if a not in ("--weights", "--venv")]
    data = json.dumps({"present": False, "removal": removal})
    # -y skips the change detection that --dry exists to show
    yes = [] if "--dry" in rest else ["-y"]
    return ["-m", "pyinfra", *yes, *rest[:1], "deploys/kimi_k26.py", *rest[1:],
            "--data", f"specfleet={data}"]


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
        ("remove", "take the deploy off the hosts (the weights and your venv stay)"),
        ("bench", "a smoke benchmark on every host, slow hosts flagged"),
        ("sweep", "tune the speculative settings on one host, restore the best"),
        ("monitoring", "Prometheus scrape config, alert rules and a Grafana dashboard"),
        ("logs", "a host's server journal, every secret redacted"),
    ):
        p = sub.add_parser(name, help=what, add_help=False)
        p.add_argument("rest", nargs=argparse.REMAINDER)
    # A sub-command's own options before its first argument (``specfleet rollout --help``,
    # ``specfleet fanout --dry INV``) are not the REMAINDER's: hand them on, in order.
    words = sys.argv[1:] if argv is None else list(argv)
    args, unknown = parser.parse_known_args(words)
    if unknown:
        before = words[: words.index(args.command)]
        if not hasattr(args, "rest") or any(u in before for u in unknown):
            parser.error(f"unrecognized arguments: {' '.join(unknown)}")
        args.rest = [*unknown, *args.rest]
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
        if args.command in ("bench", "sweep"):
            checkout_dir(args.checkout)
            return (bench if args.command == "bench" else sweep).main(args.rest)
        if args.command == "monitoring":
            return monitoring.main_monitoring(args.rest)
        if args.command == "logs":
            return monitoring.main_logs(args.rest)
        if args.command == "probe":
            return _in_checkout(["-m", "facts.probe", *args.rest], args.checkout)
        if args.command == "status" and "--json" in args.rest:
            return status_json([a for a in args.rest if a != "--json"], args.checkout)
        if args.command == "remove":
            return _in_checkout(remove_argv(args.rest), args.checkout)
        return _in_checkout(
            ["-m", "pyinfra", "-y", *args.rest[:1], "deploys/status.py", *args.rest[1:]],
            args.checkout,
        )
    except SpecfleetError as exc:
        print(f"specfleet: {exc.render()}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
