"""Who listens on the server's port: the API key goes only to the unit's own process. Stdlib only,
run ON the host (as root: it reads every process's sockets).

Before anything sends the API key to ``host:port`` (the readiness gate, the status fact, the
benchmark client), ``key_guard`` checks that every listening socket on the port belongs to a
process of the server's unit (its cgroup): a local user who binds the port while SGLang loads, or
while it is down, receives nothing. Sockets are read from ``/proc/net/tcp{,6}`` (their inodes)
and matched to ``/proc/<pid>/fd``; a socket whose process cannot be seen (another pid namespace)
counts as a stranger.

As a program: ``python3 port_owner.py PORT UNIT`` prints nothing and exits 0 when the unit's
process alone listens; prints ``none`` and exits 3 when nothing listens; prints who listens and
exits 4 otherwise.
"""

import os
import sys

# /proc/net/tcp's state of a listening socket.
_LISTEN = "0A"


def listener_inodes(port, tables=("/proc/net/tcp", "/proc/net/tcp6")):
    """The inodes of the listening TCP sockets on ``port``, any address."""
    inodes = set()
    for table in tables:
        try:
            with open(table) as f:
                next(f, None)
                for line in f:
                    bits = line.split()
                    if len(bits) < 10 or bits[3] != _LISTEN:
                        continue
                    if int(bits[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add(bits[9])
        except (OSError, ValueError):
            continue
    return inodes


def socket_owners(inodes, proc="/proc"):
    """{inode: the pids holding that socket open} for the socket ``inodes`` (an inode no
    visible process holds maps to an empty set)."""
    owners = {i: set() for i in inodes}
    if not inodes:
        return owners
    for pid in os.listdir(proc):
        if not pid.isdigit():
            continue
        try:
            fds = os.listdir(f"{proc}/{pid}/fd")
        except OSError:
            continue  # gone, or not ours to read
        for fd in fds:
            # A busy process (the server itself) opens and closes files as it is read: one fd
            # gone since the listing says nothing about the others.
            try:
                link = os.readlink(f"{proc}/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:[") and link[8:-1] in owners:
                owners[link[8:-1]].add(int(pid))
    return owners


def socket_pids(inodes, proc="/proc"):
    """The pids holding any of the socket ``inodes`` open."""
    return set().union(*socket_owners(inodes, proc).values())


def listener_pids(port):
    """The pids holding a listening TCP socket on ``port``."""
    return socket_pids(listener_inodes(port))


def in_unit(pid, unit):
    """Whether process ``pid`` is in the cgroup of the systemd unit ``unit``."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            return any(line.rstrip().endswith("/" + unit) or f"/{unit}/" in line for line in f)
    except OSError:
        return False


def describe(pid):
    """``'nc' (pid 4242, uid 1000)``: a process, in printable words."""
    name, uid = "?", "?"
    try:
        with open(f"/proc/{pid}/comm", errors="replace") as f:
            name = f.read().strip()
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    uid = line.split()[1]
                    break
    except OSError:
        pass
    name = "".join(c if c.isprintable() else "?" for c in name)[:32]
    return f"{name!r} (pid {pid}, uid {uid})"


def key_guard(port, unit):
    """(``"none"`` when nothing listens on ``port``, or None; why the key must not be sent, or
    None). Both None: every listener on the port is a process of ``unit``."""
    inodes = listener_inodes(port)
    if not inodes:
        return "none", None
    owners = socket_owners(inodes)
    pids = set().union(*owners.values())
    strangers = sorted(p for p in pids if not in_unit(p, unit))
    unseen = sum(1 for held in owners.values() if not held)
    if not strangers and not unseen:
        return None, None
    who = [describe(p) for p in strangers]
    if unseen:
        who.append("a process this host cannot see (its socket has no pid here)")
    return None, (f"port {port} is held by {', '.join(who)}, outside {unit}: the API key was "
                  "not sent to it; stop that process, or give the server another port")


def main(argv):
    try:
        port, unit = int(argv[1]), argv[2]
    except (IndexError, ValueError):
        print("usage: port_owner.py PORT UNIT")
        return 2
    state, problem = key_guard(port, unit)
    if problem:
        print(problem)
        return 4
    if state:
        print(state)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
