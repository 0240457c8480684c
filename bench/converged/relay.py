"""A delaying TCP relay: each chunk is held ``delay_ms`` before it is passed on, in both directions.

This kernel has no ``netem``, so round-trip time is added in user space: a relay in front of each
host's sshd, listening on 127.0.0.1, holding every chunk 25 ms each way (about 50 ms RTT). Chunks
keep their order and are not throttled: a chunk's hold starts when it is read, so a burst of
chunks costs one delay, not one per chunk (like a long link, unlike a slow one).

    relays = Relays({"h1": ("10.250.3.2", 22)}, delay_ms=25).start()
    relays.ports["h1"]  # -> 127.0.0.1 port in front of h1's sshd
    relays.stop()
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time

CHUNK = 65536


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def read() -> None:
        try:
            while True:
                data = await reader.read(CHUNK)
                await queue.put((time.monotonic() + delay, data))
                if not data:
                    return
        except (ConnectionError, OSError):
            await queue.put((time.monotonic(), b""))

    async def write() -> None:
        try:
            while True:
                due, data = await queue.get()
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not data:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            return

    await asyncio.gather(read(), write())


class Relays:
    """One delaying relay per target, all in one asyncio loop on a daemon thread."""

    def __init__(self, targets: dict[str, tuple[str, int]], delay_ms: float = 25.0,
                 listen: str = "127.0.0.1"):
        self.targets = dict(targets)
        self.delay = delay_ms / 1000.0
        self.listen = listen
        self.ports: dict[str, int] = {}
        self.connections = 0
        self._loop = asyncio.new_event_loop()
        # Connections cut at stop() are expected: no tracebacks for them.
        self._loop.set_exception_handler(lambda loop, context: None)
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._servers: list[asyncio.AbstractServer] = []

    def _handler(self, target: tuple[str, int]):
        async def handle(c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter):
            self.connections += 1
            try:
                s_reader, s_writer = await asyncio.open_connection(*target)
            except OSError:
                c_writer.close()
                return
            for w in (c_writer, s_writer):
                sock = w.get_extra_info("socket")
                if sock is not None:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                await asyncio.gather(
                    _pump(c_reader, s_writer, self.delay), _pump(s_reader, c_writer, self.delay)
                )
            finally:
                for w in (c_writer, s_writer):
                    w.close()

        return handle

    async def _start(self) -> None:
        for name, target in self.targets.items():
            server = await asyncio.start_server(self._handler(target), self.listen, 0)
            self._servers.append(server)
            self.ports[name] = server.sockets[0].getsockname()[1]

    def start(self) -> Relays:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)
        return self

    def stop(self) -> None:
        async def close() -> None:
            for server in self._servers:
                server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(timeout=10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
