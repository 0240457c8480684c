"""What to do about PR#20547 (the DFlash v2 overlap worker) on one host: one decision table.

    installed SGLang                  | opted in (patch.sha256) | port for this tree | decision
    ----------------------------------+-------------------------+--------------------+-----------
    v2 wired in (PR branch, >= 0.5.14)| any                     | -                  | built in
    v1                                | yes                     | yes                | apply port
    v1                                | yes                     | no                 | keep v1
    v1                                | no                      | -                  | keep v1

Before the table: an interrupted apply (a journal without a marker) is restored first; an applied
port whose marker no longer reverses (SGLang reinstalled under it) is forgotten; an applied port is
kept while the settings still opt in with the same port, replaced when they name another, and
removed when they no longer opt in (``present=False`` too). Every "keep v1" says why in one line
with the fix. Pure: the facts and the port's key are passed in.
"""

from __future__ import annotations

from dataclasses import dataclass

from specfleet.core.sglang.install import short
from specfleet.core.sglang.patch import describe_failures
from specfleet.core.tables.sglang_versions import V2_BUILTIN_SINCE

BUILT_IN, APPLY, KEEP_V1, APPLIED, REMOVE = "built in", "apply port", "keep v1", "applied", "remove"


@dataclass(frozen=True)
class PortVerdict:
    """Whether this project has a port of PR#20547 for the host's tree, and which."""

    available: bool
    # The port's identity (the sha256 of the patch it applies), written as the marker.
    port_id: str | None = None
    # "the PR#20547 port for SGLang 0.5.11 (11 files from its recipe: ...)", or why there is none.
    text: str = ""
    # For "no port": what the user can do.
    fix: str = ""


@dataclass(frozen=True)
class PatchDecision:
    """``steps`` run in order: "restore" (undo an applied or half-applied port from its journal),
    "drop-marker" (forget a marker whose files are no longer on disk), "apply". ``row`` is the
    table's row; ``reason`` one line a person reads at normal verbosity."""

    steps: tuple[str, ...]
    row: str
    reason: str
    warning: str | None = None
    fix: str | None = None

    @property
    def noop(self) -> bool:
        return not self.steps


def keep_v1_reason(version: str, why: str) -> str:
    return f"SGLang {version} keeps DFLASH v1 with overlap off: {why}"


def decide_pr20547(
    install: dict | None,
    marker: dict | None,
    *,
    present: bool,
    opted_in: bool,
    port: PortVerdict | None,
    release_features: dict | None = None,
) -> PatchDecision:
    """The table above. ``install``: the SGLangInstall fact; ``marker``: the PatchState fact;
    ``opted_in``: the settings pin the PR revision (``patch.sha256``); ``port``: the
    verdict for this tree (None when not asked: not opted in); ``release_features``: the
    features of the release tree that restoring an interrupted apply gives back (where known:
    a port exists only for a release's exact tree)."""
    version = (install or {}).get("version") or "?"
    steps: list[str] = []
    warning = None
    applied = None
    rejected = (marker or {}).get("rejected")
    if marker and (marker.get("sha256") or marker.get("partial")):
        if marker.get("partial"):
            steps.append("restore")
            warning = "a PR#20547 apply was interrupted; restores every file it had touched first"
        elif marker.get("intact"):
            applied = marker.get("sha256")
        else:
            steps.append("drop-marker")
            warning = (
                f"the PR#20547 marker ({short(marker.get('sha256'))}) no longer matches the files "
                "on disk (SGLang was reinstalled?); forgets it"
            )
    wanted = present and opted_in
    if applied:
        if not wanted:
            what = f"removes PR#20547 port {short(applied)} from SGLang {version}"
            return PatchDecision(("restore",), REMOVE, what)
        if port is not None and port.available and port.port_id == applied:
            return PatchDecision((), APPLIED, f"PR#20547 port {short(applied)} is applied")
        if port is not None and port.available:
            return PatchDecision(
                ("restore", "apply"), APPLY,
                f"PR#20547 port {short(applied)} is applied, settings want {short(port.port_id)}; "
                "replaces it",
            )  # fmt: skip
        # The tree under an applied port no longer hashes as the wheel did: that is the port.
        return PatchDecision((), APPLIED, f"PR#20547 port {short(applied)} is applied")
    features = (install or {}).get("features") or {}
    if marker and marker.get("partial") and release_features is not None:
        # An interrupted apply of ours may have wired the v2 worker in already: that is not
        # SGLang's own. The restore step puts the release's tree back; judge that tree.
        features = release_features
    if features.get("dflash") == "v2":
        what = "PR#20547 built in" if features.get("dflash_pr20547") else "the DFlash v2 worker"
        return PatchDecision(tuple(steps), BUILT_IN, f"SGLang {version} has {what}", warning)
    detail = ""
    if features.get("dflash_v2_missing"):
        detail = f" (a v2 worker is there but not wired in: {features['dflash_v2_missing'][0]})"
    if not wanted:
        return PatchDecision(
            tuple(steps), KEEP_V1,
            keep_v1_reason(version, "PR#20547 is not opted in" + detail), warning,
            fix=f"set sglang.version >= {V2_BUILTIN_SINCE} (v2 built in), or patch.sha256 to "
            "the PR revision where this project has a port (SGLang 0.5.11)",
        )  # fmt: skip
    if port is not None and port.available and rejected and port.port_id == rejected:
        return PatchDecision(
            tuple(steps), KEEP_V1,
            keep_v1_reason(version, f"{port.text} failed the readiness gate on this host and was "
                           "rolled back"),
            warning,
            fix="read the server's journal from that run; remove the .rejected file beside the "
            "venv's .specfleet/pr20547 state to try the port again",
        )  # fmt: skip
    if port is None or not port.available:
        why = port.text if port is not None else "no port was looked up"
        return PatchDecision(
            tuple(steps), KEEP_V1, keep_v1_reason(version, why + detail), warning,
            fix=(port.fix if port is not None and port.fix else
                 f"set sglang.version >= {V2_BUILTIN_SINCE} (v2 built in)"),
        )  # fmt: skip
    return PatchDecision(
        (*steps, "apply"), APPLY, f"SGLang {version}: applies {port.text}", warning
    )


def conflict_message(
    version: str, site: str, sha256: str | None, failures: dict[str, list[str]], on_conflict: str
) -> str:
    head = (
        f"PR#20547 patch {short(sha256)} does not apply to SGLang {version} in {site}: "
        f"{describe_failures(failures)}. The install is unchanged."
    )
    if on_conflict == "keep-v1":
        head += " DFLASH runs v1 with overlap scheduling off."
    return head + f" SGLang >={V2_BUILTIN_SINCE} has the DFlash v2 worker built in."


CONFLICT_FIX = (
    f"pin sglang.version to {V2_BUILTIN_SINCE} or later (the v2 worker is built in), or run a "
    "release this project ports (0.5.11, patch.sha256), or set patch.on_conflict = 'keep-v1' "
    "to run DFLASH v1 with overlap off"
)
