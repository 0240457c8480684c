"""The deploy tests/fleet/test_op_sglang_fleet.py runs with the pyinfra CLI: the SGLang software ops with
each host's settings (host data ``specfleet``).

Host data ``sglang_test`` narrows it for one test: ``{"ops": ["installed", ...],
"pr20547_present": False, "installed_present": False}``. Without it this is exactly ``operations.sglang.ensure_software``.
"""

from pyinfra import host

from operations import sglang
from operations.venvs import effective_settings
from specfleet.core.settings import settings_for_host

settings = effective_settings(settings_for_host(host))
opts = host.data.get("sglang_test") or {}
ops = opts.get("ops")
present = opts.get("pr20547_present", True)
installed_present = opts.get("installed_present", True)

if ops is None and present and installed_present:
    sglang.ensure_software(settings)
else:
    sg = settings.sglang
    source = dict(
        index_url=sg.index_url,
        find_links=sg.find_links,
        trusted_hosts=list(sg.trusted_hosts) or None,
        no_deps=sg.no_deps,
    )
    git = sg.kind == "git"
    for op in ops or ["installed", "compressed_tensors", "pr20547"]:
        if op == "installed":
            sglang.installed(
                name="sglang.installed",
                venv=settings.venv,
                version=sg.version,
                python=settings.python,
                git_url=sg.git_url if git else None,
                git_ref=sg.git_ref if git else None,
                present=installed_present,
                allow_replacing=sg.allow_replacing,
                **source,
            )
        elif op == "compressed_tensors":
            sglang.compressed_tensors(
                name="sglang.compressed_tensors",
                venv=settings.venv,
                specifier=sg.compressed_tensors,
                sglang_version=sg.version,
                **source,
            )
        elif op == "pr20547":
            sglang.pr20547(
                name="sglang.pr20547",
                venv=settings.venv,
                source=settings.patch.source,
                sha256=settings.patch.sha256,
                on_conflict=settings.patch.on_conflict,
                present=present,
                sglang_version=sg.version,
            )
