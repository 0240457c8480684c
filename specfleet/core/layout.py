"""Where everything specfleet puts on a host lives: every host path, built once from ``Settings``.

Nothing else in the project joins a host path (``tests/unit/test_layout.py`` scans for it): the
operations, the facts, the controllers and the host-side programs' arguments all read their paths
from here, so a folder moves in one place.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from specfleet.core.settings import Settings

# Root-owned folders of every host.
SYSTEMD_DIR = "/etc/systemd/system"
ETC_DIR = "/etc/specfleet"
SECRETS_DIR = f"{ETC_DIR}/secrets"
OPT_DIR = "/opt/specfleet"
# The venv of the host-side tools (the weights agent and huggingface_hub, the fan-out agent).
TOOLS_PATH = f"{OPT_DIR}/tools"
# huggingface_hub's default token path for root, a host's own token.
HOST_TOKEN_DEFAULT = "/root/.cache/huggingface/token"
# Where an applied PR#20547 keeps its state, relative to the venv: the mapped diff it applied
# (``applied.diff``), a tar of the files it modified (``backup.tar``), the files and directories
# it created (``created``, ``created_dirs``), the site-packages it patched (``site``) and, written
# last, the sha256 of the patch as given (``sha256``): the marker.
# (specfleet/core/sglang/install.py). Written into a venv ``sglang.installed`` created: only such a
# venv may have other packages replaced without ``sglang.allow_replacing``.
PATCH_STATE_DIR = ".specfleet/pr20547"
CREATED_MARKER = ".specfleet/created-by-specfleet"
# What ``sglang.installed`` last built from an SGLang source tree into the venv: the tree's
# content sha256 and its path (``facts.sglang.SourceTreeKey`` reads it back).
SOURCE_KEY = ".specfleet/sglang-source"
# The drafter RoPE patch's state (issue #52), laid out as PR#20547's above.
ROPE_STATE_DIR = ".specfleet/dflash-rope"
# The server's log formatter module, as the host keeps it in the unit's logging folder.
LOG_MODULE_NAME = "specfleet_log_redact.py"


def join(folder: str, *names: str) -> str:
    """``folder/name/...`` without a doubled slash (settings paths are normalized, may end in /)."""
    return posixpath.join(folder.rstrip("/") or "/", *names)


# --- a venv ---------------------------------------------------------------------------------------


def venv_python(venv: str) -> str:
    """A venv's interpreter (SGLang's venv, the tools' venv, a rollback's)."""
    return join(venv, "bin", "python")


def venv_pip(venv: str) -> str:
    return join(venv, "bin", "pip")


def patch_state_dir(venv: str) -> str:
    return join(venv, PATCH_STATE_DIR)


def rope_state_dir(venv: str) -> str:
    return join(venv, ROPE_STATE_DIR)


def created_marker(venv: str) -> str:
    return join(venv, CREATED_MARKER)


def source_key_path(venv: str) -> str:
    return join(venv, SOURCE_KEY)


def tools_python() -> str:
    return venv_python(TOOLS_PATH)


def tools_program(name: str) -> str:
    """A host-side program shipped into the tools' folder (``weights_agent.py``, ...)."""
    return join(TOOLS_PATH, name)


# --- the server -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServerPaths:
    """Where a specfleet server's files live on the host."""

    unit_name: str
    unit: str
    env: str
    secret: str
    marker: str
    cache_root: str
    # The logging config and its formatter module, root's alone (a 0700 folder of 0600 files).
    log_dir: str
    log_config: str
    log_module: str

    def files(self) -> dict[str, str]:
        """The server's own files, by the name a rollback point keeps each under: every file a
        deploy writes for the server, a change to any of which restarts it. The one list of
        them: ``serving.unit`` writes them, ``specfleet status`` compares them, a rollback point
        keeps them and the removal removes them (``FILE_KEYS`` is its keys)."""
        return {"unit": self.unit, "env": self.env, "secret": self.secret,
                "log_config": self.log_config, "log_module": self.log_module}

    def unit_files(self) -> list[str]:
        """The files whose state ``ServiceState`` reports with the unit's: one set for every
        step (preflight, serving.unit, serving.service, status), so that a probe asks systemctl
        once."""
        return list(self.files().values())


# The keys of ``ServerPaths.files``, in order.
FILE_KEYS = ("unit", "env", "secret", "log_config", "log_module")


def server_paths(settings: Settings) -> ServerPaths:
    name = settings.service_name
    log_dir = join(ETC_DIR, f"{name}.logging")
    return ServerPaths(
        unit_name=f"{name}.service",
        unit=join(SYSTEMD_DIR, f"{name}.service"),
        env=join(ETC_DIR, f"{name}.env"),
        # SGLang reads `--config FILE.yaml` (0.5.11, 0.5.14, 0.5.23): the API key goes there, so it
        # is in no argv, no unit and no diff. The directory is 0700.
        secret=join(SECRETS_DIR, f"{name}.yaml"),
        marker=join(settings.state_dir, f"{name}.restart-pending"),
        cache_root=join(settings.models_root, ".cache"),
        log_dir=log_dir,
        log_config=join(log_dir, "logging.json"),
        log_module=join(log_dir, LOG_MODULE_NAME),
    )


def sglang_python(settings: Settings) -> str:
    """The interpreter of the venv SGLang is installed in."""
    return venv_python(settings.venv)


# --- the weights ----------------------------------------------------------------------------------


def model_root(settings: Settings, which: str) -> str:
    """``<models_root>/<dir_name>``: the folder that holds the revisions of one model
    (``which``: ``"target"`` or ``"drafter"``)."""
    return join(settings.models_root, getattr(settings, which).dir_name)


def serve_path(settings: Settings, which: str) -> str:
    """The path SGLang is given: the pinned revision's own folder, so that a new pin changes
    the unit; or the ``current`` link, flipped only after a verified download, when a branch is
    followed."""
    src = getattr(settings, which)
    pinned = src.revision if src.revision and not src.follow_branch else None
    return join(model_root(settings, which), pinned or "current")


def model_file(settings: Settings, which: str, *names: str) -> str:
    """A path inside one model's folder (``config.json``, ``current/config.json``, a revision)."""
    return join(model_root(settings, which), *names)


def control_token_path(settings: Settings) -> str:
    """Where a token given on the control machine goes on the host (never the host's own)."""
    return join(settings.state_dir, "hf", "token")


def host_token_path(settings: Settings) -> str:
    """The host's own token: ``weights.host_token_path``, or huggingface_hub's default."""
    return settings.weights.host_token_path or HOST_TOKEN_DEFAULT


@dataclass(frozen=True)
class WeightsJobPaths:
    """A detached download's job file and its progress file, under ``<state_dir>/weights``."""

    work: str
    job: str
    progress: str


def weights_job_paths(state_dir: str, root: str) -> WeightsJobPaths:
    work = join(state_dir, "weights")
    name = posixpath.basename(root.rstrip("/"))
    return WeightsJobPaths(
        work, job=join(work, f"{name}.job.json"), progress=join(work, f"{name}.progress.json")
    )


# --- the run lock, rollback points, the fan-out, the benchmark -----------------------------------


def lock_path(settings: Settings) -> str:
    return join(settings.state_dir, "run.lock")


def bench_dir(settings: Settings) -> str:
    """The smoke benchmark's client and its results."""
    return join(settings.state_dir, "bench")


@dataclass(frozen=True)
class RollbackPaths:
    """A server's rollback point (its unit, pins and patch), and the wheels kept for it."""

    directory: str
    wheels: str

    def file(self, key: str) -> str:
        return join(self.directory, key)


def rollback_paths(settings: Settings) -> RollbackPaths:
    root = join(settings.state_dir, "rollback")
    return RollbackPaths(directory=join(root, settings.service_name), wheels=join(root, "wheels"))


def fanout_dir(state_dir: str) -> str:
    """The fan-out's keys, jobs and progress (``specfleet/hostside/fanout_agent.py`` names the
    progress files there too: ``tests/unit/test_layout.py`` checks that the two agree)."""
    return join(state_dir, "fanout")


def serve_dir(state_dir: str) -> str:
    """The ephemeral sshd's config, host key and authorized keys."""
    return join(fanout_dir(state_dir), "sshd")


# --- the watchdog ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class WatchdogPaths:
    """Every file and unit the watchdog of one server puts on a host."""

    unit_name: str
    unit: str
    # The program and run_lock.py beside it (one set of rules for the lock's lease).
    folder: str
    program: str
    run_lock: str
    config: str
    # Its counters, kept across its own restarts.
    state: str
    # What the last deploy set up (written by the deploy, read into the textfile).
    deploy_state: str
    # node-exporter's textfile.
    textfile: str

    def files(self) -> list[str]:
        """Every file, for a removal (``rm -f``) and for ``facts.serving.ServiceState``."""
        return [self.unit, self.program, self.run_lock, self.config, self.state,
                self.deploy_state, self.textfile]  # fmt: skip


def watchdog_paths(settings: Settings) -> WatchdogPaths:
    name = settings.service_name
    folder = join(OPT_DIR, "watchdog", name)
    return WatchdogPaths(
        unit_name=f"{name}-watchdog.service",
        unit=join(SYSTEMD_DIR, f"{name}-watchdog.service"),
        folder=folder,
        program=join(folder, "watchdog.py"),
        run_lock=join(folder, "run_lock.py"),
        config=join(ETC_DIR, f"{name}.watchdog.json"),
        state=join(settings.state_dir, f"{name}.watchdog-state.json"),
        deploy_state=join(settings.state_dir, f"{name}.deployed.json"),
        textfile=join(settings.metrics.textfile_dir, f"specfleet_{name}.prom"),
    )
