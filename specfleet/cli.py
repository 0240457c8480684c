"""The ``specfleet`` console script, on click (pyinfra's own CLI framework).

    specfleet plan --facts FACTS.json [--settings S] [--host H] [--json]   (anywhere)
    specfleet settings INVENTORY [HOST] [--json]                            (anywhere)
    specfleet rollout INVENTORY DEPLOY [rollout options] [connection options]
    specfleet fanout INVENTORY [--sshd-port P] [fan-out options] [connection options]
    specfleet probe INVENTORY [connection options]
    specfleet status INVENTORY [--json] [--fail-on-drift] [connection options]
    specfleet remove INVENTORY [--dry] [--weights] [--venv] [connection options]
    specfleet bench INVENTORY [bench options] [connection options]
    specfleet sweep INVENTORY --host HOST [sweep options] [connection options]
    specfleet monitoring INVENTORY --out DIR                                (no connection)
    specfleet logs INVENTORY HOST [-n LINES] [connection options]           (redacted journal)

INVENTORY is what pyinfra takes: an inventory file, ``@local``, a host name, or a comma list of
host names. The connection options are pyinfra's, with pyinfra's names and one meaning each, on
every subcommand that connects: ``--ssh-user --key --port --sudo --sudo-user --data --config -v
--parallel --limit`` (``--port`` is always the SSH port).

Exit codes (every subcommand):

    0   done; every host in play ok (or, dry, the plan shown)
    1   a host failed or was unreachable (each one listed with why)
    2   a usage error (an unknown option, a missing argument); ``plan``: facts it cannot plan from
    3   bad input, found before any host is touched: the inventory, settings (every bad key of
        every host at once), a deploy file, no checkout
    4   ``status --fail-on-drift``: a reachable host is not what the deploy would make it
    70  a bug in specfleet: one line naming it, no traceback
    128+N  stopped by signal N (130: Ctrl-C); what was held on the hosts was released first

Nothing but click is imported before a subcommand runs: every ``--help`` works anywhere, without
pyinfra, gevent or matplotlib. The fleet subcommands run the deploy files and facts of a specfleet
checkout (the current directory, ``--checkout PATH`` or ``$SPECFLEET_CHECKOUT``), by path, as
pyinfra's own CLI does: this floor never imports ``deploys``, ``operations`` or ``facts``.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import click

CHECKOUT_ENV = "SPECFLEET_CHECKOUT"  # one home: specfleet.fleet.pyinfra_run reads it too
# operations.status writes its document there at exit (this floor does not import operations).
STATUS_JSON_ENV = "SPECFLEET_STATUS_JSON"

EXIT_OK, EXIT_HOSTS, EXIT_USAGE, EXIT_INPUT, EXIT_DRIFT, EXIT_BUG = 0, 1, 2, 3, 4, 70


def _version() -> str:
    try:
        return version("specfleet")
    except PackageNotFoundError:  # a checkout on sys.path, not installed
        return "unknown (not installed)"


# --------------------------------------------------------------------------------------------------
# The one way a subcommand ends: its exit code, or an error line (never a traceback)
# --------------------------------------------------------------------------------------------------


def guarded(fn: Callable[..., int]) -> Callable[..., int]:
    """A subcommand's body: its return value is the exit code; a SpecfleetError (bad input) is
    its message and exit 3; anything else is a bug, said in one line with exit 70."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> int:
        try:
            rc = fn(*args, **kwargs)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except KeyboardInterrupt:
            click.echo("specfleet: interrupted", err=True)
            rc = 130
        except BrokenPipeError:  # the reader went away (`| head`): nothing more to say
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            rc = 141
        except SystemExit as exc:  # a library's own sys.exit (pyinfra's on a broken config)
            rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except Exception as exc:  # noqa: BLE001 - the CLI's promise: an error line, no traceback
            from specfleet.core.errors import SpecfleetError

            if isinstance(exc, SpecfleetError):
                click.echo(f"specfleet: {exc.render()}", err=True)
                rc = EXIT_INPUT
            else:
                click.echo(
                    f"specfleet: unexpected {type(exc).__name__}: {exc}\n  fix: this is a bug in "
                    "specfleet; please report it with the command line", err=True)
                rc = EXIT_BUG
        sys.stdout.flush()
        raise click.exceptions.Exit(rc or 0)

    return wrapper


# --------------------------------------------------------------------------------------------------
# pyinfra's connection options: one decorator, the same names and meaning on every subcommand
# --------------------------------------------------------------------------------------------------

_CONNECTION_OPTIONS = (
    click.option("--ssh-user", "--user", "ssh_user", help="SSH user to connect as."),
    click.option("--key", "--ssh-key", "key", help="SSH private key file."),
    click.option("--port", "--ssh-port", "port", type=click.IntRange(1, 65535),
                 help="SSH port to connect to."),
    click.option("--sudo", is_flag=True, help="Run every command with sudo."),
    click.option("--sudo-user", help="The user sudo runs as."),
    click.option("--data", multiple=True, metavar="KEY=VALUE",
                 help="Override host data for every host (repeatable)."),
    click.option("--config", help="A pyinfra config.py to exec (default: ./config.py if any)."),
    click.option("-v", "verbosity", count=True,
                 help="Print more (-v noop/fact info, -vv input, -vvv output)."),
    click.option("--parallel", type=click.IntRange(min=1),
                 help="At most this many hosts at once per operation."),
    click.option("--limit", multiple=True, metavar="HOST|GROUP|GLOB",
                 help="Only these hosts or groups (repeatable, or comma separated)."),
)
CONNECTION_KEYS = ("ssh_user", "key", "port", "sudo", "sudo_user", "data", "config",
                   "verbosity", "parallel", "limit")


def connection_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(_CONNECTION_OPTIONS):
        fn = option(fn)
    return fn


# The smoke benchmark's load, as `bench` and each point of `sweep` give it.
_LOAD_OPTIONS = [
    click.option("--concurrency", default="1,4", show_default=True, help="Concurrency levels."),
    click.option("--requests", type=int, default=0, help="Per level (default 2x concurrency)."),
    click.option("--max-tokens", type=int, default=64, show_default=True,
                 help="Output tokens per request."),
]


def load_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(_LOAD_OPTIONS):
        fn = option(fn)
    return fn


def gevent_patched() -> None:
    """The process patched with gevent, as pyinfra's own CLI patches it, before anything of
    pyinfra, ``ssl`` or ``paramiko`` is imported: the controllers run hosts in gevent greenlets,
    and an unpatched socket would block every other host, the run locks' heartbeats and every
    timeout. Here, at the entry point, never as an import's side effect (``specfleet.fleet``)."""
    from gevent import monkey

    if not monkey.is_module_patched("socket"):
        monkey.patch_all()


def _patched_first(fn: Callable[..., int]) -> Callable[..., int]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> int:
        gevent_patched()
        return fn(*args, **kwargs)

    return wrapper


def fleet_options(fn: Callable[..., int]) -> Callable[..., int]:
    """What every fleet command is wrapped in: pyinfra's connection options, click's context
    (the checkout), ``guarded``'s exit codes, and gevent's patching before its body runs."""
    return connection_options(click.pass_context(guarded(_patched_first(fn))))


def pop_connection(kwargs: dict[str, Any]) -> Any:
    """The connection options of a subcommand's keyword arguments, as ``PyinfraOptions``."""
    from specfleet.fleet.pyinfra_run import PyinfraOptions

    given = {k: kwargs.pop(k) for k in CONNECTION_KEYS}
    given["data"], given["limit"] = list(given["data"]), list(given["limit"])
    return PyinfraOptions(**given)


def _flags_class(command: str) -> type:
    """The dataclass a subcommand hands its options to (its fields: the command's parameters)."""
    if command == "plan":
        from specfleet.plan import PlanFlags

        return PlanFlags
    if command == "rollout":
        from specfleet.fleet.rollout import RolloutFlags

        return RolloutFlags
    if command == "bench":
        from specfleet.fleet.bench import BenchFlags

        return BenchFlags
    from specfleet.fleet.sweep import SweepFlags

    return SweepFlags


def to_flags(command: str, params: dict[str, Any], connection: Any = None) -> Any:
    """A subcommand's parsed options as the typed options of the code that runs it (``--json``
    is the field ``json``), pyinfra's connection options as its ``connection``."""
    values = {("json" if k == "as_json" else k): v for k, v in params.items()}
    if connection is not None:
        values["connection"] = connection
    return _flags_class(command)(**values)


def flags(command: str, argv: list[str]) -> Any:
    """``specfleet COMMAND ARGV``'s options, parsed by the command itself, as its typed options
    (``plan``, ``rollout``, ``bench``, ``sweep``): how a caller or a test gets them with the
    CLI's defaults, without running the command."""
    with cli.commands[command].make_context(command, list(argv)) as ctx:
        params = dict(ctx.params)
    connection = pop_connection(params) if "ssh_user" in params else None
    return to_flags(command, params, connection)


def _slow_fraction() -> float:
    """``bench --slow-fraction``'s default, read when the command runs (not for ``--help``)."""
    from specfleet.core.bench import SLOW_FRACTION

    return SLOW_FRACTION


def _checkout(ctx: click.Context) -> Any:
    from specfleet.fleet.pyinfra_run import checkout_dir

    return checkout_dir(ctx.obj.get("checkout"))


def _in_checkout(argv: list[str], checkout: Any, **kwargs: Any) -> int:
    """Run ``argv`` (a Python module of the checkout) with the checkout as working directory and
    file paths made absolute."""
    args = [_absolute(a) for a in argv]
    return subprocess.run([sys.executable, *args], cwd=checkout, check=False,
                          **kwargs).returncode


def check_inventory(inventory: str, options: Any) -> Any:
    """The inventory loaded and every host in play's settings checked, before any connection:
    every bad key of every host at once (exit 3), never pyinfra's "No hosts remaining"."""
    from specfleet.fleet.pyinfra_run import load_inventory, select_hosts

    full = load_inventory(inventory, options.override_data())
    groups = {name: [h.name for h in hosts] for name, hosts in full.groups.items()}
    in_play = select_hosts([h.name for h in full], groups, options.limit)
    inv = load_inventory(inventory, options.override_data(), only=in_play)
    check_settings(inv)
    return inv


def fleet_command(ctx: click.Context, inventory: str, kw: dict[str, Any]) -> tuple[Any, Any, Any]:
    """What every fleet command starts from: its connection options (popped from ``kw``), the
    checkout it runs in, and the inventory with every host in play's settings checked."""
    options = pop_connection(kw)
    where = _checkout(ctx)
    return options, where, check_inventory(inventory, options)


def _reachable(inventory: str, options: Any, inv: Any) -> tuple[list[str], dict[str, str]]:
    """The hosts in play, and those of them that cannot be reached (``{host: why}``)."""
    from specfleet.fleet import inventory_view as view

    hosts = [h.name for h in inv]
    return hosts, view.reachable_hosts(inventory, options, hosts)


def check_settings(inventory: Any) -> Any:
    """The one call of the settings checker (every bad key of every host, one error)."""
    from specfleet.core.settings import check_inventory_settings

    return check_inventory_settings(inventory)


# --------------------------------------------------------------------------------------------------
# The group
# --------------------------------------------------------------------------------------------------

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.group(context_settings=CONTEXT, help=(
    "Provision SGLang speculative-decoding servers with pyinfra.\n\n"
    "INVENTORY is what pyinfra takes: a file, @local, a host name or a comma list. The "
    "subcommands that connect take pyinfra's connection options, with pyinfra's names.\n\n"
    "Exit codes: 0 ok; 1 a host failed or was unreachable; 2 a usage error; 3 bad input "
    "(inventory, settings, deploy file, no checkout), before any host is touched; 4 drift "
    "(status --fail-on-drift); 70 a bug in specfleet; 128+N stopped by signal N."))
@click.version_option(_version(), "--version", prog_name="specfleet")
@click.option("--checkout", type=click.Path(file_okay=False),
              help=f"The specfleet checkout to run deploys from (or ${CHECKOUT_ENV}).")
@click.pass_context
def cli(ctx: click.Context, checkout: str | None) -> None:
    ctx.ensure_object(dict)
    if checkout:
        os.environ[CHECKOUT_ENV] = os.path.abspath(checkout)
    ctx.obj["checkout"] = checkout


INVENTORY = click.argument("inventory", metavar="INVENTORY")


@cli.command(context_settings=CONTEXT)
@click.option("--facts", help="JSON: fact name -> value (or pyinfra fact --json).")
@click.option("--profile", help="Plan a machine type instead of a host's facts (real nvidia-smi "
              "captures; --list-profiles), SGLang predicted from the settings.")
@click.option("--list-profiles", is_flag=True, help="List the machine profiles and exit.")
@click.option("--settings", help="JSON: the specfleet settings (defaults: Kimi K2.6).")
@click.option("--drafter-config", help="JSON: the drafter's config.json.")
@click.option("--weights-bytes", type=int, help="Target + drafter weights size.")
@click.option("--predicted", is_flag=True,
              help="SGLang not installed yet: predict from settings.sglang.version.")
@click.option("--host", help="The host to plan, from a facts file of several; named in messages.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@guarded
def plan(**kw: Any) -> int:
    """The launch plan of one host's facts (no connection). Exit 2: facts it cannot plan from."""
    from specfleet import plan as plan_cli

    if kw.pop("list_profiles"):
        from specfleet import profiles

        click.echo(profiles.listing())
        return EXIT_OK
    if bool(kw["facts"]) == bool(kw["profile"]):
        raise click.UsageError("give --facts FILE (a host's facts) or --profile NAME (a machine "
                               "type), one of them")
    return plan_cli.run(to_flags("plan", kw))


@cli.command(context_settings=CONTEXT)
@INVENTORY
@click.argument("host", required=False)
@click.option("--data", multiple=True, metavar="KEY=VALUE",
              help="Override host data for every host (as pyinfra's --data).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--check-access", is_flag=True,
              help="Ask the Hub (or weights.hf_endpoint) whether the token may read each gated "
              "model, before any download.")
@guarded
def settings(inventory: str, host: str | None, data: tuple[str, ...], as_json: bool,
             check_access: bool = False) -> int:
    """Each host's merged settings (group data, host data, --data), checked; secrets are shown
    as references, never their values. Refused too: a model without a pinned revision, an SGLang
    release the version table does not know, a secret file that is not there, an inventory with
    no hosts. No connection to any host."""
    from specfleet.fleet.inventory_view import merged_settings, render_settings
    from specfleet.fleet.pyinfra_run import PyinfraOptions, load_inventory

    options = PyinfraOptions(data=list(data))
    inv = load_inventory(inventory, options.override_data())
    names = [h.name for h in inv]
    if host is not None and host not in names:
        from specfleet.core.errors import SpecfleetError

        raise SpecfleetError(f"there is no host {host!r} in {inventory}",
                             fix=f"name one of: {', '.join(names) or '(none)'}")
    if not names:
        from specfleet.core.errors import SpecfleetError

        raise SpecfleetError(f"there are no hosts in {inventory}",
                             fix="define a list of hosts in it (inventories/first_host.py shows "
                             "the least a host needs)")
    good = check_settings(inv)
    shown = merged_settings(inv, [host] if host else names)
    click.echo(json.dumps(shown, indent=2) if as_json else render_settings(shown))
    # Shown first, then what would stop the deploy (on stderr, exit 3).
    from specfleet.fleet.settings_ready import check_ready

    check_ready({n: good[n] for n in ([host] if host else names)}, check_access=check_access)
    return EXIT_OK


@cli.command(context_settings=CONTEXT)
@INVENTORY
@click.argument("deploy")
@click.option("--canary", help="The host that goes first, alone (default: the first).")
@click.option("--order", help="Hosts in this order first, e.g. h3,h1 (others follow).")
@click.option("--batch-size", type=click.IntRange(min=1), help="Hosts per batch.")
@click.option("--batch-percent", type=float, help="Percent of the fleet per batch.")
@click.option("--max-fail-percent", type=float,
              help="Failures allowed per batch, in percent (more stops the rollout).")
@click.option("--speed-gate", type=float, metavar="FRACTION",
              help="Benchmark each batch before and after the change; a host below this "
              "fraction of its earlier tokens/s or acceptance length fails (rolled back, "
              "counted). Default: rollout.speed_gate, else off.")
@click.option("--no-prefetch", is_flag=True, help="Skip the weights prefetch stage.")
@click.option("--no-fanout", is_flag=True,
              help="Prefetch with the weights-only deploy on each host, not host to host.")
@click.option("--prefetch-deploy",
              help="A weights-only deploy for the prefetch stage (default: the fan-out; with "
              "--no-fanout, deploys/weights_only.py).")
@click.option("--dry", is_flag=True,
              help="Show the batches and what each host's deploy would change; change nothing.")
@click.option("--json", "as_json", is_flag=True,
              help="The result as one JSON document on stdout (nothing else there).")
@click.option("--pre-hook", help="A command run before each host is changed (a failure: the "
              "host is not started), e.g. to drain it from a load balancer.")
@click.option("--post-hook", help="A command run after each host passes its gate.")
@click.option("--hook-on", type=click.Choice(["control", "host"]), default="control",
              show_default=True, help="Where the hooks run.")
@click.option("--report", help="Write the per-host results as JSON here.")
@fleet_options
def rollout(ctx: click.Context, inventory: str, deploy: str, **kw: Any) -> int:
    """Roll a deploy across a fleet: canary, batches, failure budget, readiness gates,
    automatic rollback."""
    if kw["batch_size"] is not None and kw["batch_percent"] is not None:
        raise click.UsageError("give --batch-size or --batch-percent, not both")
    options, _, _ = fleet_command(ctx, inventory, kw)
    from specfleet.fleet import rollout as rollout_mod

    return rollout_mod.main(to_flags("rollout", {"inventory": inventory, "deploy": deploy, **kw},
                                     options))


@cli.command(context_settings=CONTEXT)
@INVENTORY
@click.option("--order", help="Hosts in this order first (the first seeds the target).")
@click.option("--degree", type=click.IntRange(min=1),
              help="Peers each host serves (default: the smallest, from 2, that keeps every "
              "host within two hops of its seed).")
@click.option("--sshd-port", type=click.IntRange(1, 65535),
              help="The fan-out's temporary sshd's port on serving peers (not the SSH port).")
@click.option("--report", help="Write the per-host results and the plan as JSON here.")
@fleet_options
def fanout(ctx: click.Context, inventory: str, **kw: Any) -> int:
    """Fetch the weights once per fleet from upstream, then host to host over the LAN."""
    options, _, _ = fleet_command(ctx, inventory, kw)
    from specfleet.fleet import fanout as fanout_mod

    return fanout_mod.run_fanout(inventory, options, order=kw["order"], degree=kw["degree"],
                                 sshd_port=kw["sshd_port"], report=kw["report"])


def _pyinfra_cli(ctx: click.Context, inventory: str, deploy: str, options: Any,
                 extra: list[str], **kwargs: Any) -> int:
    """pyinfra's own CLI on a deploy file of the checkout, the inventory checked first."""
    where = _checkout(ctx)
    check_inventory(inventory, options)
    return _in_checkout(["-m", "pyinfra", *extra, inventory, deploy, *options.argv()],
                        where, **kwargs)


@cli.command(context_settings=CONTEXT)
@INVENTORY
@click.argument("fact_args", nargs=-1, metavar="[KEY=VALUE]...")
@click.option("--json", "as_json", is_flag=True,
              help="pyinfra's fact document ({fact: {host: value}}) on stdout.")
@fleet_options
def probe(ctx: click.Context, inventory: str, fact_args: tuple[str, ...], as_json: bool,
          **kw: Any) -> int:
    """Every host's facts, one SSH command per host (the fact's arguments as KEY=VALUE, e.g.
    python=/root/venv/bin/python models_path=/srv/models); unreachable hosts listed with their
    error."""
    import dataclasses

    options, where, inv = fleet_command(ctx, inventory, kw)
    hosts, unreachable = _reachable(inventory, options, inv)
    reachable = [h for h in hosts if h not in unreachable]
    rc = EXIT_HOSTS if unreachable else EXIT_OK
    if reachable:
        run = dataclasses.replace(options, limit=reachable)
        done = subprocess.run(
            [sys.executable, "-m", "pyinfra", *run.argv(), _absolute(inventory), "fact",
             "facts.probe.Probe", *fact_args, "--json"],
            cwd=where, capture_output=True, text=True, check=False)
        start = done.stdout.find("{")
        if done.returncode != 0 or start < 0:
            sys.stderr.write(done.stderr)
            return done.returncode or EXIT_HOSTS
        document = done.stdout[start:]
        if as_json:
            click.echo(document.rstrip())
        else:
            with tempfile.NamedTemporaryFile("w", suffix=".json") as tmp:
                tmp.write(document)
                tmp.flush()
                rc = _in_checkout(["-m", "facts.probe", "--json-file", tmp.name], where) or rc
    for h, why in unreachable.items():
        click.echo(f"{h}: unreachable: {why}", err=as_json)
    return rc


def _absolute(path: str) -> str:
    return os.path.abspath(path) if os.path.exists(path) else path


@cli.command(context_settings=CONTEXT)
@INVENTORY
@click.option("--json", "as_json", is_flag=True,
              help="One JSON document on stdout: every host, unreachable ones with their error.")
@click.option("--fail-on-drift", is_flag=True,
              help="Exit 4 when a reachable host is not what the deploy would make it.")
@fleet_options
def status(ctx: click.Context, inventory: str, as_json: bool, fail_on_drift: bool,
           **kw: Any) -> int:
    """What each host runs, read-only; unreachable hosts listed with their error."""
    import dataclasses

    from specfleet.fleet import inventory_view as view

    options, where, inv = fleet_command(ctx, inventory, kw)
    hosts, unreachable = _reachable(inventory, options, inv)
    reachable = [h for h in hosts if h not in unreachable]
    document: dict[str, Any] = {"hosts": {}}
    rc = 0
    if reachable:
        with tempfile.TemporaryDirectory(prefix="specfleet-status-") as tmp:
            path = os.path.join(tmp, "status.json")
            env = {**os.environ, STATUS_JSON_ENV: path}
            run = dataclasses.replace(options, limit=reachable)
            rc = _in_checkout(["-m", "pyinfra", "-y", inventory, "deploys/status.py",
                               *run.argv()], where, env=env,
                              stdout=sys.stderr if as_json else None)
            try:
                with open(path, encoding="utf-8") as f:
                    document = json.load(f)
            except (OSError, ValueError):
                pass
    document = view.status_document(document, hosts, unreachable)
    rc = view.status_exit(rc, document, fail_on_drift)
    if as_json:
        click.echo(json.dumps({**document, "exit_code": rc}, indent=2))
    elif unreachable:
        click.echo(view.unreachable_table(document))
    return rc


@cli.command(context_settings=CONTEXT)
@INVENTORY
@click.option("--dry", is_flag=True, help="Show what would go; change nothing.")
@click.option("--weights", is_flag=True, help="Remove the model weights too.")
@click.option("--venv", is_flag=True, help="Remove the SGLang venv too.")
@fleet_options
def remove(ctx: click.Context, inventory: str, dry: bool, weights: bool, venv: bool,
           **kw: Any) -> int:
    """Take the deploy off the hosts (the weights and your venv stay unless asked)."""
    options = pop_connection(kw)
    data = json.dumps({"present": False, "removal": {"weights": weights, "venv": venv}})
    options.data.append(f"specfleet={data}")
    # -y skips the change detection that --dry exists to show
    extra = ["--dry"] if dry else ["-y"]
    return _pyinfra_cli(ctx, inventory, "deploys/kimi_k26.py", options, extra)


@cli.command(context_settings=CONTEXT)
@INVENTORY
@load_options
@click.option("--out", default="bench-results", show_default=True,
              help="Folder for <host>.json and the summary.")
@click.option("--slow-fraction", type=float, default=_slow_fraction, show_default="0.7",
              help="A host below this fraction of its arch's median tokens/s is flagged SLOW.")
@fleet_options
def bench(ctx: click.Context, inventory: str, **kw: Any) -> int:
    """A smoke benchmark on every host, slow hosts flagged."""
    options, _, _ = fleet_command(ctx, inventory, kw)
    from specfleet.fleet import bench as bench_mod

    return bench_mod.main(to_flags("bench", {"inventory": inventory, **kw}, options))


@cli.command(context_settings=CONTEXT)
@INVENTORY
@click.option("--host", required=True, help="The one host to tune.")
@click.option("--num-draft-tokens", default=None,
              help="--speculative-num-draft-tokens values (default 4,8,16 without "
              "--ddtree-budgets).")
@click.option("--ddtree-budgets", default="",
              help="plan.ddtree_budget values (DDTree's tree budget), e.g. 8,16,32,64,128.")
@click.option("--draft-window", default="2048,4096", show_default=True,
              help="plan.draft_window_size values.")
@click.option("--draft-backends", default="",
              help="plan.draft_attention_backend values (default: the arch rule's).")
@click.option("--attention-backends", default="", help="plan.attention_backend values.")
@load_options
@click.option("--max-minutes", type=float, default=120.0, show_default=True,
              help="The sweep's time budget; the points left are recorded, the best restored.")
@click.option("--out", help="The sweep's folder (default: sweep-HOST).")
@click.option("--allow-serving", is_flag=True, help="Sweep a host that serves traffic.")
@click.option("--restore", type=click.Choice(["best", "previous"]), default="best",
              show_default=True, help="What the host runs after the sweep: the best point, or "
              "the inventory's own plan.")
@click.option("--write-group-data", help="Write the winning plan as this group data file.")
@click.option("--no-report", is_flag=True, help="Skip the PNG/HTML report.")
@fleet_options
def sweep(ctx: click.Context, inventory: str, **kw: Any) -> int:
    """Tune the speculative settings on one host, restore the best."""
    options, _, _ = fleet_command(ctx, inventory, kw)
    from specfleet.fleet import sweep as sweep_mod

    return sweep_mod.main(to_flags("sweep", {"inventory": inventory, **kw}, options))


@cli.command(context_settings=CONTEXT)
@INVENTORY
@click.option("--out", required=True, help="The folder to write the files to.")
@click.option("--scrape-interval", type=click.IntRange(min=1), default=15, show_default=True,
              help="Prometheus' scrape interval, in seconds.")
@click.option("--alert-for", help="Every alert's `for` (e.g. 0s in a test).")
@guarded
def monitoring(inventory: str, out: str, scrape_interval: int, alert_for: str | None) -> int:
    """Prometheus scrape config, alert rules and a Grafana dashboard (no connection)."""
    from specfleet.fleet import monitoring as monitoring_mod
    from specfleet.fleet.pyinfra_run import PyinfraOptions

    check_inventory(inventory, PyinfraOptions())
    return monitoring_mod.main_monitoring(inventory, out, scrape_interval, alert_for)


@cli.command(context_settings=CONTEXT)
@INVENTORY
@click.argument("host")
@click.option("-n", "--lines", type=click.IntRange(min=1), default=200, show_default=True,
              help="How many of the journal's last lines to show.")
@click.option("--since", help="journalctl's --since (e.g. '-1h', '2026-12-01 14:00').")
@click.option("--timeout", type=click.FloatRange(min=1), default=60.0, show_default=True,
              help="Seconds for the connection and the journal together.")
@connection_options
@guarded
@_patched_first
def logs(inventory: str, host: str, lines: int, since: str | None, timeout: float,
         **kw: Any) -> int:
    """A host's server journal, every secret redacted, over pyinfra's connection."""
    options = pop_connection(kw)
    from specfleet.fleet import monitoring as monitoring_mod

    return monitoring_mod.fetch_logs(inventory, host, options, lines, since, timeout)


def main(argv: list[str] | None = None) -> int:
    """The console script; returns the exit code (``standalone_mode``: click's usage errors
    exit 2 with its message)."""
    try:
        rc = cli.main(args=argv, prog_name="specfleet", standalone_mode=False)
        return rc if isinstance(rc, int) else EXIT_OK
    except click.exceptions.Exit as done:
        return done.exit_code
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.Abort:
        click.echo("specfleet: aborted", err=True)
        return 130


def console() -> None:
    sys.exit(main())


if __name__ == "__main__":
    console()
