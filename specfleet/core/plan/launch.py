"""Topics of the launch itself: model paths, the model's parsers, context length, listen address,
and the command that starts SGLang."""

from __future__ import annotations

from specfleet.core.layout import serve_path, sglang_python
from specfleet.core.plan.context import PlanContext
from specfleet.core.tables import sglang_versions as versions
from specfleet.core.tables.models import model_row


def plan_model_paths(c: PlanContext) -> None:
    b, s = c.b, c.settings
    target_dir = serve_path(s, "target")
    b.flag("--model-path", target_dir)
    b.flag("--trust-remote-code")
    b.flag("--tp-size", c.tp)
    b.why("model-paths", target_dir, "local directories, never Hub ids; HF_HUB_OFFLINE=1")
    b.env["HF_HUB_OFFLINE"] = "1"


def plan_model_args(c: PlanContext) -> None:
    b, s = c.b, c.settings
    row = model_row(s.target.repo_id)
    if row is not None and row.parser:
        b.flag("--reasoning-parser", row.parser)
        b.flag("--tool-call-parser", row.parser)
        b.why("parsers", row.parser, row.parser_why)
    b.env["SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"] = "1"
    b.why(
        "context-length",
        "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1",
        "the drafter's context is shorter than the target's",
    )
    b.flag("--host", s.listen_host)
    b.flag("--port", s.port)
    b.why("listen", f"{s.listen_host}:{s.port}", "settings listen_host and port")
    _grpc_port(c)


def _grpc_port(c: PlanContext) -> None:
    """The port rule (the version table's ``grpc_port_offset``): a release that derives its gRPC
    port as --port + 10000 refuses at start a --port above 55535, unless SGLANG_GRPC_PORT names
    one; the plan names one (never bound: specfleet does not turn SGLang's gRPC server on)."""
    b, s, row = c.b, c.settings, c.row
    offset = row.grpc_port_offset if row is not None else None
    if offset is None or s.port + offset <= versions.MAX_PORT:
        return
    given = s.plan.extra_env.get("SGLANG_GRPC_PORT")
    if given is not None:
        b.why("grpc-port", f"SGLANG_GRPC_PORT={given}", f"plan.extra_env: SGLang {c.version} "
              f"would otherwise derive {s.port + offset} from --port {s.port}", "override")
        return
    grpc = s.port - offset
    b.env["SGLANG_GRPC_PORT"] = str(grpc)
    b.why(
        "grpc-port",
        f"SGLANG_GRPC_PORT={grpc}",
        f"SGLang {c.version} sets its gRPC port to --port + {offset} = {s.port + offset} and "
        f"refuses to start above {versions.MAX_PORT} unless SGLANG_GRPC_PORT is set "
        "(server_args.py _handle_deprecated_args); a port below --port is named instead (not "
        "listened on: the gRPC server stays off)",
        c.src,
    )


def plan_metrics(c: PlanContext) -> None:
    """SGLang's own Prometheus endpoint, unless ``metrics.enable`` says no or the release lacks it
    (the version table's ``metrics_flag``)."""
    b, s = c.b, c.settings
    flag = c.row.metrics_flag if c.row is not None else None
    if not s.metrics.enable:
        b.why("metrics", "off", "settings metrics.enable is False")
    elif flag is None:
        b.why("metrics", "off", f"SGLang {s.sglang.version} has no --enable-metrics")
    else:
        b.flag(flag)
        b.why("metrics", flag, "/metrics for Prometheus (the watchdog relays it off the host)")


def launch_argv(c: PlanContext, flags: list[tuple[str, str | None]]) -> list[str]:
    s = c.settings
    argv = (
        list(s.launcher)
        if s.launcher
        else [sglang_python(s), "-m", "sglang.launch_server"]
    )
    for name, value in flags:
        argv.append(name)
        if value is not None:
            argv.append(value)
    return argv
