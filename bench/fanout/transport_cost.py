"""What one peer-to-peer copy stream costs in CPU, by transport: the measurement behind the
fan-out's missed 1.3x target at 16 hosts (bench/fanout/README.md, "One copy stream by
transport").

Two real hosts of a fleet of their own (tests.harness); host ``src`` holds a file of random
bytes on its models disk (tmpfs), host ``dst`` reads it over the bridge and throws it away, so
only the transport is measured (no hashing, no disk write). Each transport runs ``--repeat``
times; each host's CPU is every process of its container (``run.tree_cpu``):

- ``ssh``: OpenSSH as the fan-out uses it today: the pull's own client command
  (``fanout_agent.ssh_command``: its ciphers, pinned host key, ControlMaster) from ``dst`` to an
  sshd of ``src``'s own, ``cat`` on ``src``;
- ``tls``: Python's ``ssl`` (TLS 1.3, a certificate the control machine made for this run and
  ``dst`` checks), 1 MiB reads and ``sendall`` on ``src``, ``recv_into`` on ``dst``;
- ``tcp``: no encryption: ``socket.sendfile`` on ``src``, ``recv_into`` on ``dst`` (the floor).

Usage (as root, from the repository root):
    .venv/bin/python -m bench.fanout.transport_cost [--mb 512] [--repeat 3]
The last line is ``transport: ssh=S tls=T tcp=P CPU-s per GB (both ends), tls/ssh=R``.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from bench.fanout.run import tree_cpu
from specfleet.hostside.fanout_agent import ssh_command
from tests.harness import Fleet, HostSpec

BLOB = "/srv/models/transport-blob"
PORT = 7443
SSH_PORT = 2222

# Host-side programs, in Python's standard library only (the hosts' /usr/bin/python3).
SERVER = r"""
import socket, ssl, sys
mode, path, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
srv = socket.create_server(("0.0.0.0", port))
print("listening", flush=True)
conn, _ = srv.accept()
with open(path, "rb") as f:
    if mode == "tcp":
        conn.sendfile(f)
    else:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        ctx.load_cert_chain("/root/tc-cert.pem", "/root/tc-key.pem")
        conn = ctx.wrap_socket(conn, server_side=True)
        while chunk := f.read(1 << 20):
            conn.sendall(chunk)
        conn.unwrap()
conn.close()
"""
CLIENT = r"""
import socket, ssl, sys
mode, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
sock = socket.create_connection((host, port))
if mode == "tls":
    ctx = ssl.create_default_context(cafile="/root/tc-cert.pem")
    ctx.check_hostname = False
    sock = ctx.wrap_socket(sock)
buf, got = bytearray(1 << 20), 0
while n := sock.recv_into(buf):
    got += n
print(got)
"""


def host_cpu(fleet: Fleet, host: str) -> float:
    return tree_cpu(fleet.state["hosts"][host]["pid"])


def measure(fleet: Fleet, transport: str, size: int) -> tuple[float, float, float]:
    """(seconds, src CPU-s, dst CPU-s) of one copy of the blob from src to dst."""
    src_ip = fleet.ip("src")
    server = None
    if transport != "ssh":
        server = subprocess.Popen(fleet.ssh_argv("src") + [
            "--", f"python3 /root/tc-server.py {transport} {BLOB} {PORT}"],
            stdout=subprocess.PIPE, text=True)
        if server.stdout.readline().strip() != "listening":
            raise SystemExit(f"the {transport} server on src did not start")
        copy = f"python3 /root/tc-client.py {transport} {src_ip} {PORT}"
    else:
        client = ssh_command("/root/.ssh/tc", "/root/tc-known", SSH_PORT, "/root/tc-ctl")
        copy = f"{shlex.join(client)} root@{src_ip} cat {BLOB} | wc -c"
    cpu0 = host_cpu(fleet, "src"), host_cpu(fleet, "dst")
    start = time.monotonic()
    res = fleet.run("dst", copy, timeout=600)
    took = time.monotonic() - start
    if res.returncode or res.stdout.split()[-1:] != [str(size)]:
        if server is not None:
            server.kill()
        raise SystemExit(f"{transport}: copied {res.stdout.strip()!r}, wanted {size} bytes: "
                         f"{res.stderr.strip()}")
    if server is not None:
        server.wait(timeout=60)
    time.sleep(1.5)  # an sshd session ends just after its client: let it be reaped and counted
    cpu1 = host_cpu(fleet, "src"), host_cpu(fleet, "dst")
    return took, cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]


def prepare(fleet: Fleet, mb: int, work: Path) -> None:
    fleet.run("src", f"head -c {mb}M /dev/urandom > {BLOB} && cat {BLOB} > /dev/null",
              check=True, timeout=600)
    fleet.run("dst", "ssh-keygen -q -t ed25519 -N '' -f /root/.ssh/tc", check=True)
    pub = fleet.run("dst", "cat /root/.ssh/tc.pub", check=True).stdout
    # The fleet's own authorized_keys is read-only: a second sshd of its own, as the fan-out's
    # serving unit is (operations/fanout.py).
    fleet.run("src", "cat > /root/tc-keys", check=True, input=pub)
    fleet.run("src", f"systemd-run --unit=tc-sshd /usr/sbin/sshd -D -e -p {SSH_PORT} "
              "-o AuthorizedKeysFile=/root/tc-keys -o PidFile=none", check=True)
    # The pull's client takes only a pinned host key (StrictHostKeyChecking=yes).
    fleet.run("dst", f"mkdir -p /root/tc-ctl && for i in 1 2 3 4 5; do "
              f"ssh-keyscan -p {SSH_PORT} {fleet.ip('src')} > /root/tc-known 2>/dev/null "
              "&& [ -s /root/tc-known ] && exit 0; sleep 1; done; exit 1", check=True)
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1", "-subj", "/CN=src",
                    "-keyout", str(work / "key.pem"), "-out", str(work / "cert.pem")],
                   check=True, capture_output=True)
    (work / "server.py").write_text(SERVER)
    (work / "client.py").write_text(CLIENT)
    for host in ("src", "dst"):
        fleet.put(host, work / "cert.pem", "/root/tc-cert.pem")
    fleet.put("src", work / "key.pem", "/root/tc-key.pem")
    fleet.put("src", work / "server.py", "/root/tc-server.py")
    fleet.put("dst", work / "client.py", "/root/tc-client.py")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=512)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    size = args.mb << 20
    fleet = Fleet.up(f"tcost-{os.getpid()}"[:31], [HostSpec("src", disk="2G"),
                                                    HostSpec("dst", disk="1G")],
                     wheelhouse_needed=False)
    per_gb: dict[str, float] = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            prepare(fleet, args.mb, Path(tmp))
        print(f"{args.mb} MiB from src to dst, {args.repeat} runs each, interleaved; "
              "CPU-s of each host's container")
        print("| transport | s (median) | GB/s | src CPU-s | dst CPU-s | both, CPU-s per GB |")
        print("|---|---:|---:|---:|---:|---:|")
        runs: dict[str, list[tuple[float, float, float]]] = {t: [] for t in ("ssh", "tls", "tcp")}
        for _ in range(args.repeat):
            for transport in runs:
                runs[transport].append(measure(fleet, transport, size))
        for transport, rows in runs.items():
            took = statistics.median(r[0] for r in rows)
            src = statistics.median(r[1] for r in rows)
            dst = statistics.median(r[2] for r in rows)
            per_gb[transport] = (src + dst) / (size / 1e9)
            print(f"| {transport} | {took:.2f} | {size / took / 1e9:.2f} | {src:.2f} | "
                  f"{dst:.2f} | {per_gb[transport]:.2f} |")
    finally:
        fleet.down()
    print(f"transport: ssh={per_gb['ssh']:.2f} tls={per_gb['tls']:.2f} tcp={per_gb['tcp']:.2f} "
          f"CPU-s per GB (both ends), tls/ssh={per_gb['tls'] / per_gb['ssh']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
