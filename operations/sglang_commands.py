"""The shell scripts ``operations.pr20547`` and the drafter RoPE patch (``operations.sglang``)
yield: they apply, restore and forget a journaled patch on a host, and install a pinned SGLang."""

from __future__ import annotations

import re
import shlex

from pyinfra.api import QuoteString, StringCommand

from specfleet.core.sglang.install import PATCH_OPTS
from specfleet.core.sglang.patch import FilteredPatch

# --------------------------------------------------------------------------------------------------
# Shell scripts (paths are quoted with shlex; nothing here runs on its own)
# --------------------------------------------------------------------------------------------------


def _q(value: str) -> str:
    return shlex.quote(value)


def apply_script(state_dir: str, site: str, patch: FilteredPatch) -> str:
    """Back up, commit the journal, dry-run, apply. Safe to kill at any line:

    1. the state of every path the patch touches is read from the tree (``existing``: there now,
       backed up in ``backup.tar``; ``created``: absent now, removed on restore; ``created_dirs``:
       directories to remove), each written to a temporary file and synced;
    2. ``journal`` is renamed into place: the commit point. Before it, the tree is untouched and
       a restore only forgets the state directory; after it, a restore puts every path back;
    3. a trial on a copy of the touched files: a conflict leaves every file as it was, writes
       GNU patch's words to ``conflict`` and drops the journal;
    4. the apply (each file GNU patch writes is renamed into place); a failure restores.

    The marker (``sha256``) is written by the caller after it verified the result."""
    d, s = _q(state_dir), _q(site)
    touched = " ".join(_q(p) for p in patch.touched)
    opts = " ".join(PATCH_OPTS)
    return "\n".join(
        [
            "set -e",
            f"d={d}",
            f"cd {s}",
            'rm -f -- "$d/journal" "$d"/*.tmp "$d/conflict"',
            'printf "%s\\n" "$PWD" > "$d/site"',
            ': > "$d/existing.tmp"; : > "$d/created.tmp"',
            f"for f in {touched}; do",
            '  if [ -e "$f" ] || [ -L "$f" ]; then echo "$f" >> "$d/existing.tmp"; '
            'else echo "$f" >> "$d/created.tmp"; fi',
            "done",
            # Directories the apply will create, deepest first, so that a restore removes them.
            'while IFS= read -r f; do p=$(dirname "$f"); '
            'while [ "$p" != . ] && [ ! -e "$p" ]; do echo "$p"; p=$(dirname "$p"); done; '
            'done < "$d/created.tmp" | sort -u -r > "$d/created_dirs.tmp"',
            'tar -cf "$d/backup.tar.tmp" --verbatim-files-from -T "$d/existing.tmp"',
            'sync -f "$d/backup.tar.tmp" 2>/dev/null || sync',
            'for f in existing created created_dirs backup.tar; do mv -f "$d/$f.tmp" "$d/$f"; done',
            'printf "%s\\n" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" > "$d/journal.tmp"',
            'mv -f "$d/journal.tmp" "$d/journal"',
            'sync -f "$d/journal" 2>/dev/null || sync',
            # The trial: the whole diff on a copy of the files it touches (a port's adaptation edits
            # files its first sections create, which a --dry-run cannot follow).
            'rm -rf -- "$d/trial"; mkdir "$d/trial"; tar -xf "$d/backup.tar" -C "$d/trial"',
            f'if ! (cd "$d/trial" && patch {opts} -i "$d/applied.diff") > "$d/dryrun.out" 2>&1',
            "then",
            '  cp "$d/dryrun.out" "$d/conflict"; rm -rf -- "$d/journal" "$d/trial"; '
            'cat "$d/conflict"; exit 0',
            "fi",
            'rm -rf -- "$d/trial"',
            f'if ! patch {opts} -i "$d/applied.diff"; then',
            '  echo "patch failed after a clean dry run; restoring" >&2',
            f"  {restore_files_script()}",
            '  rm -f -- "$d/journal"',
            "  exit 1",
            "fi",
            # What it added, by content: after an out-of-band reinstall these are the leftovers.
            'if [ -s "$d/created" ]; then tr "\\n" "\\0" < "$d/created" | '
            'xargs -0 sha256sum -- > "$d/created.sha256"; else : > "$d/created.sha256"; fi',
            # What every touched file is now: the marker stays valid while they are.
            'cat "$d/existing" "$d/created" | while IFS= read -r f; do '
            '[ -f "$f" ] && sha256sum -- "$f"; done > "$d/applied.sha256" || true',
        ]
    )


def restore_files_script() -> str:
    """Undo an apply from ``$d`` (cwd = the site it patched): remove what was absent before it,
    untar what was there. Idempotent, so a restore killed half-way is finished by the next
    one. Needs ``d`` set."""
    return (
        'while IFS= read -r f; do [ -n "$f" ] || continue; rm -f -- "$f"; '
        'b=$(basename "$f" .py); rm -f -- "$(dirname "$f")/__pycache__/$b".*.pyc; '
        'done < "$d/created"; '
        'tar -xf "$d/backup.tar"; '
        'while IFS= read -r f; do [ -n "$f" ] || continue; '
        'b=$(basename "$f" .py); rm -f -- "$(dirname "$f")/__pycache__/$b".*.pyc; '
        'done < "$d/existing"; '
        'while IFS= read -r p; do [ -n "$p" ] || continue; [ -d "$p" ] || continue; '
        'rm -rf -- "$p/__pycache__"; rmdir --ignore-fail-on-non-empty -- "$p"; '
        'done < "$d/created_dirs"'
    )


def rejected_port_path(state_dir: str) -> str:
    """Where a port that failed the readiness gate is remembered (beside the state directory,
    which a restore removes): the next run keeps v1 instead of applying it again."""
    return state_dir.rstrip("/") + ".rejected"


def restore_script(state_dir: str) -> str:
    """Restore the files an apply (complete or interrupted) touched, then forget it. The marker
    goes first and the journal last, so a restore killed half-way is seen as one to finish."""
    d = _q(state_dir)
    return "\n".join(
        [
            "set -e",
            f"d={d}",
            'rm -f -- "$d/sha256" "$d/unproven"',
            'if [ -f "$d/journal" ] && [ -f "$d/site" ]; then',
            '  cd "$(cat "$d/site")"',
            f"  {restore_files_script()}",
            "fi",
            'rm -f -- "$d/journal"',
            'rm -rf -- "$d"',
        ]
    )


def forget_script(state_dir: str) -> str:
    """Forget a marker whose patch is no longer on disk (SGLang reinstalled under it): remove the
    files it added that are still exactly as it added them (pip does not know them), then the
    state directory. Files pip has replaced since are left alone."""
    d = _q(state_dir)
    return "\n".join(
        [
            "set -e",
            f"d={d}",
            'rm -f -- "$d/sha256" "$d/unproven"',
            'if [ -f "$d/created.sha256" ] && [ -f "$d/site" ]; then',
            '  cd "$(cat "$d/site")"',
            '  sha256sum -c "$d/created.sha256" 2>/dev/null | sed -n "s/: OK$//p" | '
            'while IFS= read -r f; do rm -f -- "$f"; '
            'b=$(basename "$f" .py); rm -f -- "$(dirname "$f")/__pycache__/$b".*.pyc; done',
            '  if [ -f "$d/created_dirs" ]; then while IFS= read -r p; do [ -n "$p" ] || continue; '
            '[ -d "$p" ] || continue; rmdir --ignore-fail-on-non-empty -- "$p/__pycache__" "$p" '
            '2>/dev/null || true; done < "$d/created_dirs"; fi',
            "fi",
            'rm -rf -- "$d"',
        ]
    )


def pinned_install_script(
    python: str, pip_args: list[str], dist: str, specifier: str, check: bool = True
) -> str:
    """Install ``dist`` within ``specifier`` while every other distribution in the environment
    stays where it is: a constraints file of the current pins (``pip list --format=freeze``
    minus ``dist``). Then ``pip check``, failing only on problems the install brought: problems
    that were there before (a venv with extras missing, say) are printed, not fatal."""
    py = _q(python)
    name_re = "[-_.]".join(re.escape(part) for part in re.split(r"[-_.]+", dist))
    lines = [
        "set -e",
        "c=$(mktemp)",
        'trap \'rm -f "$c" "$c.all" "$c.before" "$c.after"\' EXIT',
        f'{py} -m pip list --format=freeze --disable-pip-version-check > "$c.all"',
        f'grep -viE {_q(f"^{name_re}==")} "$c.all" > "$c" || true',
    ]
    if check:
        lines.append(f'{py} -m pip check > "$c.before" 2>&1 || true')
    lines.append(
        f'{py} -m pip install {shlex.join(pip_args)} --constraint "$c" {_q(dist + specifier)}'
    )
    if check:
        lines += [
            f'if ! {py} -m pip check > "$c.after" 2>&1; then',
            '  new=$(grep -vxF -f "$c.before" "$c.after" || true)',
            '  if [ -n "$new" ]; then',
            f'    echo "pip check: installing {dist} broke:" >&2; echo "$new" >&2; exit 1',
            "  fi",
            '  echo "pip check: only problems that were there before:"; cat "$c.after"',
            "fi",
        ]
    return "\n".join(lines)


def script_command(script: str) -> StringCommand:
    return StringCommand("sh", "-c", QuoteString(script))


def restore_steps(state_dir: str, marker: dict | None):
    """Commands that undo a patch applied (or half-applied) from ``state_dir``, or forget a
    marker whose files pip has replaced since (its backup is then not put back): one way for
    PR#20547 and the drafter RoPE patch alike."""
    if not marker:
        return
    if marker.get("partial") or marker.get("intact"):
        yield script_command(restore_script(state_dir))
    else:
        yield script_command(forget_script(state_dir))

