"""The readiness gate of the SGLang server, run from the control machine: the host-side gate
(``specfleet/hostside/readiness_gate.py``, sent on stdin), its progress, and on failure the
journal, the serving group's members and the rollback of a PR#20547 port the gate did not prove.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path
from typing import Any

from paramiko import SSHException
from pyinfra import logger
from pyinfra.api import QuoteString, StringCommand
from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS
from pyinfra.api.exceptions import ConnectError

from operations.sglang_commands import rejected_port_path, restore_script
from operations.util import record_failure
from specfleet.core.errors import SpecfleetError
from specfleet.core.layout import join
from specfleet.core.resources import hostside_path
from specfleet.core.settings import ProbeOptions, SettingsError, probe_from_file
from specfleet.hostside.specfleet_log_redact import ship_ahead_of

GATE_SCRIPT = hostside_path("readiness_gate.py")
PORT_OWNER = hostside_path("port_owner.py")


def gate_source(probe: dict[str, Any] | None = None) -> str:
    """The readiness gate as the host runs it (from stdin): the redaction module's source ahead
    of the gate's, so that its journal excerpt is redacted by the one set of rules, and the port
    owner's (``PORT_OWNER_SOURCE``: the one check of who listens before the key is sent). With
    ``probe`` (``probe_spec``), its JSON too, as one assignment (``PROBE_JSON``) that the gate
    reads with ``--probe-on-stdin``: a probe of any size, where one argv word stops at 128 KiB
    (E2BIG)."""
    ahead = f"PORT_OWNER_SOURCE = {PORT_OWNER.read_text()!r}\n"
    if probe is not None:
        ahead += f"PROBE_JSON = {json.dumps(probe)!r}\n"
    return ship_ahead_of(GATE_SCRIPT.read_text()).replace(
        "\n# ---- the program ----\n", f"\n{ahead}\n# ---- the program ----\n", 1)


def probe_spec(probe: ProbeOptions, host_name: str = "") -> dict[str, Any]:
    """The gate's correctness probe (``PROBE_JSON``, ``gate_source``): the settings' questions
    and thresholds, or a
    probe file's (``probe.file`` on the control machine, read now, at deploy time)."""
    if probe.file is not None:
        path = os.path.expanduser(probe.file)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise SettingsError(
                f"probe.file {probe.file} cannot be read on the control machine "
                f"({getattr(exc, 'strerror', None) or exc})", host=host_name,
                fix="point probe.file at a JSON probe file, or unset it for the default probe",
            ) from None
        probe = probe_from_file(probe, text, probe.file, host_name)
    return {
        "questions": [{"prompt": q.prompt, "answer": q.answer} for q in probe.questions],
        "min_correct": probe.min_correct, "max_tokens": probe.max_tokens,
        "concurrency": probe.concurrency, "min_accept_length": probe.min_accept_length,
        "timeout_s": probe.timeout_s,
    }


JOURNAL_LINES = 30
# What a dropped SSH session raises from a command (paramiko, sockets, pyinfra's reconnect).
CONNECTION_ERRORS = (SSHException, EOFError, OSError, ConnectError)


def run_gate(
    state, host, argv: list[str], unit_name: str, budget: float, patch_dir: str | None = None,
    group: tuple[str, list[tuple[str, str]]] | None = None, probe: dict[str, Any] | None = None,
) -> bool:  # fmt: skip
    """Run the gate on the host, its progress printed live; on failure, quote the journal.
    ``probe``: the correctness probe, sent on stdin with the gate (``argv`` then says
    ``--probe-on-stdin``). A
    PR#20547 port applied in this run (``unproven``) is proven by a passing gate and rolled back by
    a failing one (remembered as rejected, so the next run keeps v1 instead of applying it
    again). A dropped SSH session fails the host with what happened and what the next run does,
    not a traceback; a timeout of the op stays pyinfra's to report."""
    script = gate_source(probe)
    try:
        return _gate(state, host, argv, unit_name, budget, patch_dir, script, group)
    except TimeoutError:
        raise
    except CONNECTION_ERRORS as exc:
        detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        error = SpecfleetError(
            f"the SSH connection to the host was lost during the readiness gate of {unit_name} "
            f"({detail}); whether the server is ready is not known",
            host=host.name,
            fix="check that the host is reachable (network, sshd) and run again: the restart stays "
            "pending, and the next run waits on the server if it is still starting (it restarts "
            "it only if its unit changed or it died, and its gate proves or rolls back a "
            "PR#20547 port applied in this run)",
        )  # fmt: skip
        return record_failure(state, host, error.render())


def _gate(
    state, host, argv: list[str], unit_name: str, budget: float, patch_dir: str | None,
    script: str, group: tuple[str, list[tuple[str, str]]] | None = None,
) -> bool:  # fmt: skip
    # The op's connector arguments (_sudo, _su_user, ...) apply to the gate's commands too.
    connector_args: dict[str, Any] = {}
    if host.executing_op_hash:
        global_args = state.get_op_data_for_host(host, host.executing_op_hash).global_arguments
        connector_args = {k: v for k, v in global_args.items() if k in CONNECTOR_ARGUMENT_KEYS}
    connector_args["_timeout"] = int(budget) + 120
    connector_args["_stdin"] = script
    ok, output = host.run_shell_command(
        StringCommand(*[QuoteString(a) for a in argv]),
        print_output=True,
        print_input=False,
        **connector_args,
    )
    if ok:
        if patch_dir:
            connector_args.pop("_stdin", None)
            host.run_shell_command(
                StringCommand("rm", "-f", QuoteString(join(patch_dir, "unproven"))),
                print_output=False, print_input=False, **connector_args,
            )  # fmt: skip
        return True
    rolled_back = _reject_unproven_port(host, patch_dir, connector_args)
    lines = output.output_lines if output else []
    since = next((m.group(1) for ln in lines if (m := re.search(r"since @(\d+)", ln))), None)
    failed = next((ln.split("FAILED ", 1)[1] for ln in lines if "gate: FAILED " in ln), None)
    last = lines[-1] if lines else "no output"
    problem = f"not ready {failed}" if failed else f"the gate failed: {last}"
    journal: list[str] = []
    if since is not None:
        connector_args["_timeout"] = 60
        _, out = host.run_shell_command(
            StringCommand(
                *[QuoteString(a) for a in argv],
                "--journal-since", since, "--journal-lines", str(JOURNAL_LINES),
            ),
            print_output=False,
            print_input=False,
            **connector_args,
        )
        journal = [ln[2:] for ln in (out.output_lines if out else []) if ln.startswith("| ")]
    excerpt = "\n".join(f"    | {ln}" for ln in journal)
    if group is not None:
        problem += _group_diagnosis(state, group)
    error = SpecfleetError(
        f"{unit_name} {problem}"
        + (f"\n  last {len(journal)} journal lines of {unit_name}:\n{excerpt}" if journal else ""),
        host=host.name,
        fix=f"read `journalctl -u {unit_name}` on the host, fix the cause (settings, software, "
        "weights) and run again: the restart stays pending until the server is ready (a server "
        "still starting is waited on, not restarted, unless its unit changes or it dies)",
    )
    record_failure(state, host, error.render())
    if rolled_back:
        logger.error(
            f"{host.print_prefix}rolled back the PR#20547 port applied in this run (the server did "
            "not pass readiness with it): the next run restarts the server on DFLASH v1; delete "
            f"{rolled_back} on the host to try the port again"
        )
    return False


def _group_diagnosis(state, group: tuple[str, list[tuple[str, str]]]) -> str:
    """What each other member of a serving group was doing when rank 0's gate failed: its unit's
    state and its last journal line (a rank that cannot reach the rendezvous says so there)."""
    name, members = group
    down, up = [], []
    for rank, (member, unit_name) in enumerate(members, start=1):
        peer = state.inventory.get_host(member, default=None)
        script = (
            'printf "%s|" "$(systemctl is-active "$1" 2>/dev/null)"; '
            # The server's own lines (_SYSTEMD_UNIT), not systemd's about it; no access log.
            'journalctl _SYSTEMD_UNIT="$1" -n 40 --no-pager -o cat 2>/dev/null | '
            'grep -v "\\"GET /" | tail -n 1'
        )
        try:
            _, out = peer.run_shell_command(
                StringCommand("sh", "-c", QuoteString(script), "specfleet", QuoteString(unit_name)),
                print_output=False, print_input=False, _timeout=30,
            )  # fmt: skip
        except CONNECTION_ERRORS as exc:
            down.append(f"{member} (rank {rank}): not reachable over SSH ({exc})")
            continue
        active, _, last = " ".join(out.output_lines if out else []).strip().partition("|")
        state_text = active or "unknown"
        note = f"{member} (rank {rank}): server {state_text}, last log: {last.strip() or '-'}"
        (up if active == "active" else down).append(note)
    if down:
        return f"; serving group {name}: members not running: " + "; ".join(down)
    return f"; serving group {name}: every member's server runs: " + "; ".join(up)


def _reject_unproven_port(host, patch_dir: str | None, connector_args: dict) -> str | None:
    """Restore a port that has not passed a gate yet; returns the rejection file, or None."""
    if not patch_dir:
        return None
    d = shlex.quote(patch_dir)
    rejected = rejected_port_path(patch_dir)
    script = (
        f'if [ -f {d}/unproven ] && [ -f {d}/sha256 ]; then '
        f'cp {d}/sha256 {shlex.quote(rejected)}; {restore_script(patch_dir)}\n'
        "echo rolled-back; fi"
    )
    args = {k: v for k, v in connector_args.items() if k != "_stdin"}
    args["_timeout"] = 300
    ok, out = host.run_shell_command(
        StringCommand("sh", "-c", QuoteString(script)), print_output=False, print_input=False,
        **args,
    )  # fmt: skip
    lines = out.output_lines if out else []
    return rejected if ok and "rolled-back" in lines else None
