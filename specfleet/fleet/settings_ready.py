"""Would the deploy get far with these settings? What ``specfleet settings`` checks beyond the
schema, on the control machine, without connecting to any host: a model without a pinned
revision, an SGLang release the version table was not read from, a secret file that is not
there, and (``--check-access``) whether the Hub lets the token read each gated model, asked of the
Hub (or ``weights.hf_endpoint``) itself with ``huggingface_hub``'s ``auth_check``, before any
download. Each problem names the host, the key and the fix; all of them are raised at once."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from packaging.version import Version

from specfleet.core.errors import SettingsError
from specfleet.core.secrets import control_token_source
from specfleet.core.tables import sglang_versions as table

_FIX_ALL = "fix each key above where it is given (the host or group data, or --data)"


def _revision(name: str, section: Any) -> list[tuple[str, str]]:
    if section.revision is None and not section.follow_branch:
        return [(f"{name}.revision is not set: the deploy would stop before downloading "
                 f"{section.repo_id}",
                 f"pin it to a 40-hex commit (git ls-remote https://huggingface.co/"
                 f"{section.repo_id} main), or set {name}.follow_branch: True")]
    return []


def _release(sglang: Any) -> list[tuple[str, str]]:
    if sglang.kind != "index":
        return []  # a git ref or a source tree: its facts, read once installed, decide
    version = table.parse_version(sglang.version)
    if Version(version.base_version) > Version(table.NEWEST_READ):
        return [(f"sglang.version {sglang.version} is newer than any release the version table "
                 f"was read from ({table.NEWEST_READ}): its flags, backends and memory rule are "
                 "not known",
                 f"use {table.NEWEST_READ} or an older release, or add a row for it "
                 "(docs/tour.md, 'Add an SGLang release')")]
    if table.version_row(version).dflash is None:
        return [(f"sglang.version {sglang.version} has no DFLASH speculative decoding",
                 f"use {table.RELEASE_FOR_WORKER['v1']} or later")]
    return []


def _files(settings: Any, environ: Mapping[str, str]) -> list[tuple[str, str]]:
    found = []
    src = control_token_source(settings.weights.token_file, settings.weights.token_env, environ)
    named = [("weights.token_file", src.name)] if src.kind == "file" else []
    if settings.api_key_file:
        named.append(("api_key_file", settings.api_key_file))
    if settings.probe.file:
        named.append(("probe.file", settings.probe.file))
    for key, path in named:
        full = os.path.expanduser(path)
        if not os.path.isfile(full):
            found.append((f"{key} {path} does not exist on this machine (it is read here at "
                          "deploy time)", f"create it, or change {key}"))
        elif not os.access(full, os.R_OK):
            found.append((f"{key} {path} cannot be read by this user",
                          f"make it readable (0600, owned by this user), or change {key}"))
    if src.kind == "env" and src.named and not src.is_set:
        found.append((f"weights.token_env names ${src.name}, which is not set here",
                      f"export {src.name}=hf_..., or change weights.token_env"))
    return found


def _token(settings: Any, environ: Mapping[str, str]) -> str | None:
    src = control_token_source(settings.weights.token_file, settings.weights.token_env, environ)
    if src.kind == "file":
        try:
            with open(os.path.expanduser(src.name), encoding="utf-8") as fh:
                return fh.read().strip() or None
        except OSError:
            return None
    return (environ.get(src.name) or "").strip() or None


def _access(settings: Any, environ: Mapping[str, str],
            asked: dict[tuple, tuple[str, str] | None]) -> list[tuple[str, str]]:
    """The Hub's own answer for each gated model: ``auth_check`` with this host's token."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    found = []
    endpoint = settings.weights.hf_endpoint or None
    token = _token(settings, environ)
    for name in ("target", "drafter"):
        section = getattr(settings, name)
        if not section.gated:
            continue
        key = (endpoint, section.repo_id, token)
        if key not in asked:
            where = endpoint or "https://huggingface.co"
            try:
                HfApi(endpoint=endpoint).auth_check(section.repo_id, token=token or False)
                asked[key] = None
            except GatedRepoError as exc:
                asked[key] = (
                    f"{name} {section.repo_id} is gated and the Hub ({where}) refuses this "
                    f"token: {exc.server_message or exc}",
                    f"request access on {where}/{section.repo_id} with the account of the token "
                    "(the deploy would stop at its download)" if token else
                    "give a token (HF_TOKEN, weights.token_file or weights.token_env) of an "
                    "account with access")
            except RepositoryNotFoundError as exc:
                asked[key] = (f"{name} {section.repo_id}: the Hub ({where}) knows no such "
                              f"repository, or not for this token: {exc.server_message or exc}",
                              f"check {name}.repo_id and the token")
            except (HfHubHTTPError, OSError) as exc:
                asked[key] = (f"{name} {section.repo_id}: could not ask the Hub ({where}): "
                              f"{str(exc).splitlines()[0]}",
                              "check weights.hf_endpoint and this machine's network, or leave "
                              "out --check-access")
        if asked[key] is not None:
            found.append(asked[key])
    return found


def check_ready(hosts: Mapping[str, Any], check_access: bool = False,
                environ: Mapping[str, str] | None = None) -> None:
    """Raise one SettingsError naming every problem of every host (``{name: Settings}``)."""
    env = os.environ if environ is None else environ
    errors = []
    asked: dict[tuple, tuple[str, str] | None] = {}
    for host, settings in hosts.items():
        found = [*_revision("target", settings.target), *_revision("drafter", settings.drafter),
                 *_release(settings.sglang), *_files(settings, env)]
        if check_access:
            found += _access(settings, env, asked)
        errors += [SettingsError(problem, host=host, fix=fix) for problem, fix in found]
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise SettingsError(f"{len(errors)} problems would stop the deploy:\n" + "\n".join(
            e.render() for e in errors), fix=_FIX_ALL)
