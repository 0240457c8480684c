"""Topic sglang: the installed SGLang (or the version table's prediction) and its registry."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from specfleet.core.plan.context import SGLANG, PlanContext
from specfleet.core.sglang.pr20547.portdata import PORTED_RELEASES
from specfleet.core.tables import sglang_versions as versions


def plan_sglang(c: PlanContext) -> None:
    b = c.b
    install, row, predicted = _install(c)
    features = install.get("features") or {}
    version = install.get("version") or (
        "(unknown version)" if not predicted else c.settings.sglang.version
    )
    if features.get("pr20547_port"):
        version = f"{version} + this project's PR#20547 port"
    elif features.get("dflash_pr20547"):
        version = f"PR#20547 build {version}"
    registry = set(install.get("attention_backends") or [])
    c.src = "predicted" if predicted else "rule"
    if predicted:
        b.why(
            "sglang",
            version,
            "not installed yet: features from the version table for settings.sglang",
            "predicted",
        )
    else:
        b.why("sglang", version, f"installed at {install.get('location') or '?'}")
    if not registry:
        registry = set(row.attention_backends)
        b.why(
            "attention-registry",
            f"sglang {version} table",
            "the install reported no attention registry; using the version table's",
            "assumed",
        )
    dflash = features.get("dflash")
    algos = install.get("speculative_algorithms")
    if not dflash or (algos is not None and algos and "DFLASH" not in algos):
        raise b.error(
            f"SGLang {version} has no DFLASH speculative decoding",
            "install sglang >= 0.5.11 (set specfleet sglang.version, e.g. '0.5.23'), or a build "
            "of sgl-project/sglang PR#20547",
        )
    c.install, c.row, c.predicted = install, row, predicted
    c.features, c.version, c.registry = features, version, registry


def _install(c: PlanContext) -> tuple[dict[str, Any], versions.VersionRow, bool]:
    """The SGLang install (fact or prediction), its version-table row, and whether predicted."""
    s = c.settings.sglang
    if c.predict:
        pr = bool(s.kind == "git" and s.git_ref and "20547" in s.git_ref)
        try:
            if pr:
                row = versions.PR20547
                install = {
                    "version": s.version,
                    "location": None,
                    "features": row.features(),
                    "speculative_algorithms": list(row.speculative_algorithms),
                    "attention_backends": sorted(row.attention_backends),
                }
            else:
                install = versions.predicted_install(s.version)
                row = versions.version_row(s.version)
                patch = c.settings.patch
                features = install["features"]
                if (patch.sha256 and str(versions.parse_version(s.version))
                        in PORTED_RELEASES and features.get("dflash") != "v2"):
                    # The deploy applies this project's port of PR#20547 before the server starts.
                    install["features"] = {**features, "dflash": "v2", "dflash_pr20547": True,
                                           "pr20547_port": True}  # fmt: skip
        except ValueError as exc:
            raise c.b.error(
                f"settings sglang.version {s.version!r} is not a version ({exc})",
                "set specfleet sglang.version to a release such as '0.5.23'",
            ) from None
        return install, row, True
    install = c.facts.get(SGLANG)
    if not isinstance(install, Mapping):
        raise c.b.error(
            "SGLang is not installed in the venv (facts.sglang.SGLangInstall is empty)",
            f"install it first (the deploy does), or plan with --predicted for sglang {s.version}",
        )
    features = install.get("features") or {}
    pr = bool(features.get("dflash_pr20547"))
    version = install.get("version")
    if version is not None:
        try:
            versions.parse_version(version)
        except ValueError:
            # Never a guess: another release's flags could crash-loop the server.
            raise c.b.error(
                f"the installed SGLang reports the version {version!r} "
                f"({SGLANG}.version), which does not parse as a version",
                "check the install (pip show sglang in the venv); reinstall a release such as "
                f"{s.version!r}, or plan with --predicted for settings.sglang.version",
            ) from None
    if pr:
        return dict(install), versions.PR20547, False
    layout = install.get("layout_release")
    if versions.is_placeholder(version) and isinstance(layout, Mapping):
        # A source build (setuptools-scm's fallback version): the row of the release whose files
        # it has, never a refusal and never the oldest row its placeholder would sort into.
        c.b.why(
            "version-table",
            f"SGLang {layout['release']} row",
            f"the install reports the placeholder version {version} (a source build); its files "
            f"match SGLang {layout['release']} ({layout['marker']}), so that release's flags are "
            "used",
            "assumed",
        )
        return dict(install), versions.version_row(layout["release"]), False
    if version is None:
        # An install whose version file is absent (a source tree without _version.py): plan
        # with the row of a release that has the same DFLASH worker, and say so.
        worker = features.get("dflash")
        row = versions.row_for_worker(worker)
        if worker in versions.RELEASE_FOR_WORKER:
            release = versions.RELEASE_FOR_WORKER[worker]
            c.b.why(
                "version-table",
                f"SGLang {release} row",
                f"the install reports no version; its DFLASH worker is {worker}, as in SGLang "
                f"{release}, so that release's flags are used",
                "assumed",
            )
        return dict(install), row, False
    return dict(install), versions.row_for_install(version), False
