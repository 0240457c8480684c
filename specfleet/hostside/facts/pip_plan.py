"""What ``pip install`` would change in this interpreter's environment, without changing it.

Run by ``facts.python.PipInstallPlan`` with the venv's own Python: ``argv[1]`` the venv, the
rest pip's arguments (sources, then the requirement). pip's dry run writes its report (format
1) to a temporary file; printed back are its ``install`` entries cut to what the decision reads
(name, version, requested), with pip's exit status and its last error lines, every installed
distribution's version, and whether ``sglang.installed`` created this venv (its marker).
"""
import json
import os
import subprocess
import sys
import tempfile

venv, args = sys.argv[1], sys.argv[2:]
out = {"rc": None, "error": None, "install": [], "installed": {}, "pip_version": None,
       "created_by_specfleet": os.path.exists(
           os.path.join(venv, ".specfleet", "created-by-specfleet"))}
with tempfile.TemporaryDirectory(prefix="specfleet-pip-plan.") as d:
    path = os.path.join(d, "report.json")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--no-input",
         "--disable-pip-version-check", "--report", path, *args],
        capture_output=True, text=True,
    )
    out["rc"] = done.returncode
    if done.returncode != 0:
        lines = [ln for ln in (done.stderr + done.stdout).splitlines() if ln.strip()]
        out["error"] = "\n".join(lines[-8:]) or f"pip exited with {done.returncode}"
    try:
        with open(path) as f:
            report = json.load(f)
    except (OSError, ValueError):
        report = {}
out["pip_version"] = report.get("pip_version")
for item in report.get("install") or []:
    meta = item.get("metadata") or {}
    out["install"].append({"metadata": {"name": meta.get("name"), "version": meta.get("version")},
                           "requested": item.get("requested")})
try:
    from importlib import metadata

    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            out["installed"][name] = dist.version
except ImportError:  # Python < 3.8: the decision then sees every package as added
    pass
print(json.dumps(out, sort_keys=True))
