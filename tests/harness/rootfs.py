"""The cached Debian bookworm root file system every fleet host boots from.

Built once with ``debootstrap --variant=minbase bookworm`` into a temporary directory, adjusted for
booting under systemd-nspawn, then renamed into place: a finished rootfs is never half-written.
A lock file makes concurrent callers wait for the one build instead of starting their own.
Hosts boot it with ``--volatile=overlay``, so it stays pristine.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

# Root (the fleet, CI) caches machine-wide; a user without root (`pytest -m "not fleet"`) in
# their own cache folder.
CACHE_DIR = Path(
    os.environ.get("SPECFLEET_CACHE")
    or ("/var/cache/specfleet" if os.geteuid() == 0 else os.path.expanduser("~/.cache/specfleet"))
)
SUITE = "bookworm"
MIRROR = os.environ.get("SPECFLEET_DEBIAN_MIRROR", "http://deb.debian.org/debian")
INCLUDE = [
    "systemd", "systemd-sysv", "dbus", "openssh-server", "python3", "python3-venv", "python3-pip",
    "patch", "rsync", "git", "curl", "ca-certificates", "iproute2",
]
# Bump when the adjustments below change, so that a stale cache is rebuilt.
ROOTFS_VERSION = "1"

# Units that only cost time or memory in a container with no route out.
MASK_UNITS = [
    "apt-daily.timer", "apt-daily-upgrade.timer", "dpkg-db-backup.timer", "e2scrub_all.timer",
    "fstrim.timer", "e2scrub_reap.service", "systemd-networkd-wait-online.service",
    "getty@tty1.service", "console-getty.service",
]

SSHD_CONF = """\
# specfleet test fleet: key-only root login, no DNS lookups (there is no route out).
PermitRootLogin prohibit-password
PasswordAuthentication no
UseDNS no
"""


def rootfs_path() -> Path:
    # Versioned, so a change to the adjustments never touches a tree that running hosts use.
    return CACHE_DIR / f"rootfs-{SUITE}-v{ROOTFS_VERSION}"


def _marker(path: Path) -> Path:
    return path / ".specfleet-rootfs"


def is_built(path: Path | None = None) -> bool:
    path = path or rootfs_path()
    marker = _marker(path)
    return marker.exists() and marker.read_text().strip() == ROOTFS_VERSION


def adjust(root: Path) -> None:
    """Make a debootstrapped tree boot cleanly as a test host. Idempotent."""
    # The host name comes from systemd-nspawn --hostname; a baked-in one would override it.
    (root / "etc/hostname").unlink(missing_ok=True)
    (root / "etc/machine-id").write_text("")  # empty: a fresh id per boot
    ssh_dir = root / "root/.ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    os.chmod(ssh_dir, 0o700)
    # authorized_keys is bind-mounted per fleet; the empty file is the mount point.
    ak = ssh_dir / "authorized_keys"
    ak.touch(mode=0o600, exist_ok=True)
    (root / "etc/ssh/sshd_config.d/specfleet.conf").write_text(SSHD_CONF)
    for unit in MASK_UNITS:
        link = root / "etc/systemd/system" / unit
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to("/dev/null")
        for wants in (root / "etc/systemd/system").glob("*.wants"):
            (wants / unit).unlink(missing_ok=True)
    # Mount points for the stand-ins and the models disk.
    (root / "srv/models").mkdir(parents=True, exist_ok=True)
    (root / "usr/local/share/standin-nvidia-smi").mkdir(parents=True, exist_ok=True)
    # pam_loginuid cannot write /proc/self/loginuid in some containers; make it optional.
    pam = root / "etc/pam.d/sshd"
    text = pam.read_text()
    text = text.replace("session    required     pam_loginuid.so",
                        "session    optional     pam_loginuid.so")
    pam.write_text(text)
    _marker(root).write_text(ROOTFS_VERSION + "\n")


def ensure_rootfs(log=sys.stderr) -> Path:
    """Return the cached rootfs, building it first if needed (minutes; once per machine)."""
    path = rootfs_path()
    if is_built(path):
        return path
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with open(CACHE_DIR / f"{path.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another caller may be building it right now
        if is_built(path):
            return path
        if shutil.which("debootstrap") is None:
            raise RuntimeError("debootstrap is not installed: apt-get install debootstrap")
        tmp = CACHE_DIR / f"{path.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        print(f"fleet: building {path} with debootstrap (once)...", file=log, flush=True)
        subprocess.run(
            ["debootstrap", "--variant=minbase", f"--include={','.join(INCLUDE)}", SUITE,
             str(tmp), MIRROR],
            check=True, stdout=subprocess.DEVNULL,
        )
        adjust(tmp)
        if path.exists():  # a build that died after the rename but before the marker
            shutil.rmtree(path)
        tmp.rename(path)
    return path
