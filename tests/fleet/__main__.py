"""python -m tests.fleet up|down|status|list|wheelhouse|ssh"""

from __future__ import annotations

import argparse
import json
import os
import sys

from tests.harness import rootfs, wheelhouse
from tests.harness.core import Fleet, FleetError, default_specs, list_fleets, parse_hosts

DEFAULT_HOSTS = ",".join(f"{s.name}:{s.gpu}:disk={s.disk}" for s in default_specs())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.fleet", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="boot a fleet (an older fleet of the same name is torn down)")
    up.add_argument("--name", required=True)
    up.add_argument("--hosts", default=DEFAULT_HOSTS,
                    help=f"NAME:PROFILE:disk=SIZE,... (default {DEFAULT_HOSTS})")
    up.add_argument("--no-wheelhouse", action="store_true", help="do not serve the wheelhouse")
    down = sub.add_parser("down", help="stop a fleet and remove its namespaces and state")
    g = down.add_mutually_exclusive_group(required=True)
    g.add_argument("--name")
    g.add_argument("--tag", help="every fleet booted with SPECFLEET_FLEET_TAG=TAG")
    g.add_argument("--all", action="store_true", help="every fleet on this machine")
    st = sub.add_parser("status", help="JSON: hosts, addresses, liveness, memory")
    st.add_argument("--name", required=True)
    sub.add_parser("list", help="names of the fleets on this machine")
    sub.add_parser("wheelhouse", help="download the wheelhouse (once) and list it")
    sub.add_parser("prepare", help="build the rootfs and the wheelhouse (once; cached)")
    ssh = sub.add_parser("ssh", help="run a command on a host (or print the ssh command)")
    ssh.add_argument("--name", required=True)
    ssh.add_argument("host")
    ssh.add_argument("command", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    try:
        if a.cmd == "up":
            fleet = Fleet.up(a.name, parse_hosts(a.hosts), wheelhouse_needed=not a.no_wheelhouse)
            print(json.dumps(fleet.status(), indent=2))
        elif a.cmd == "down":
            if a.name:
                names = [a.name] if a.name in list_fleets() else []
            else:
                names = [n for n in list_fleets()
                         if a.all or Fleet.attach(n).state.get("tag") == a.tag]
            for n in names:
                Fleet.attach(n).down()
                print(f"fleet {n}: down")
        elif a.cmd == "status":
            print(json.dumps(Fleet.attach(a.name).status(), indent=2))
        elif a.cmd == "list":
            print("\n".join(list_fleets()))
        elif a.cmd == "wheelhouse":
            d = wheelhouse.ensure_wheelhouse()
            print(d)
            print("\n".join(wheelhouse.contents()))
        elif a.cmd == "prepare":
            print(rootfs.ensure_rootfs())
            print(wheelhouse.ensure_wheelhouse())
        elif a.cmd == "ssh":
            fleet = Fleet.attach(a.name)
            if not a.command:
                print(" ".join(fleet.ssh_argv(a.host)))
                return 0
            os.execvp("ssh", fleet.ssh_argv(a.host) + ["--", " ".join(a.command)])
    except FleetError as e:
        print(f"fleet: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
