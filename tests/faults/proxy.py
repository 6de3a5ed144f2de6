"""A small asyncio TCP proxy whose links can be cut at run time (shared/TESTING.md: no netem here).

Run as ``python tests/faults/proxy.py CONTROL_PORT``. Each *link* is a listener on 127.0.0.1
forwarding to one upstream (a timesvc or leasewatch replica) for one client process, so the
nemesis can partition chosen processes from chosen services. The control port speaks one line
per request, one line per answer:

* ``listen NAME HOST:PORT`` -> the new listener's port
* ``upstream NAME HOST:PORT`` -> ``ok`` (a restarted service listens elsewhere)
* ``mode PREFIX MODE`` -> how many links matched; every link whose name starts with PREFIX gets MODE:
  ``pass``; ``delay:SECONDS`` (each chunk forwarded that much later); ``blackhole`` (new connections
  are accepted but never answered and data in flight is held back, like dropped packets: the client
  waits for its own timeout); ``reset`` (every connection, new or open, is reset at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import sys
from dataclasses import dataclass, field

_CHUNK = 65536


@dataclass
class Link:
    name: str
    upstream: tuple[str, int]
    mode: str = "pass"
    delay: float = 0.0
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    writers: set[asyncio.StreamWriter] = field(default_factory=set)

    def set_mode(self, mode: str) -> None:
        if mode.startswith("delay:"):
            self.mode, self.delay = "delay", float(mode.split(":", 1)[1])
        elif mode in ("pass", "blackhole", "reset"):
            self.mode, self.delay = mode, 0.0
        else:
            raise ValueError(f"unknown mode {mode!r}")
        self.changed.set()
        self.changed = asyncio.Event()
        if self.mode == "reset":
            for writer in list(self.writers):
                _reset(writer)

    async def until_not_blackholed(self) -> None:
        while self.mode == "blackhole":
            await self.changed.wait()


def _reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class Proxy:
    def __init__(self) -> None:
        self.links: dict[str, Link] = {}

    async def _pipe(self, link: Link, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                data = await reader.read(_CHUNK)
                if not data:
                    break
                await link.until_not_blackholed()
                if link.mode == "reset":
                    break
                if link.mode == "delay":
                    await asyncio.sleep(link.delay)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            if link.mode == "reset":
                _reset(writer)
            else:
                writer.close()

    async def _serve(self, link: Link, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if link.mode == "reset":
            _reset(writer)
            return
        link.writers.add(writer)
        try:
            await link.until_not_blackholed()
            if link.mode == "reset":
                _reset(writer)
                return
            try:
                up_reader, up_writer = await asyncio.open_connection(*link.upstream)
            except OSError:
                _reset(writer)  # the service is down: refuse like a closed port would
                return
            link.writers.add(up_writer)
            try:
                await asyncio.gather(self._pipe(link, reader, up_writer), self._pipe(link, up_reader, writer))
            finally:
                link.writers.discard(up_writer)
        finally:
            link.writers.discard(writer)

    async def listen(self, name: str, upstream: tuple[str, int]) -> int:
        link = Link(name, upstream)
        self.links[name] = link
        server = await asyncio.start_server(lambda r, w: self._serve(link, r, w), "127.0.0.1", 0)
        port: int = server.sockets[0].getsockname()[1]
        return port

    async def control(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while line := (await reader.readline()).decode().strip():
            try:
                words = line.split()
                if words[0] == "listen":
                    host, port = words[2].rsplit(":", 1)
                    answer = str(await self.listen(words[1], (host, int(port))))
                elif words[0] == "upstream":
                    host, port = words[2].rsplit(":", 1)
                    self.links[words[1]].upstream = (host, int(port))
                    answer = "ok"
                elif words[0] == "mode":
                    matched = [link for name, link in self.links.items() if name.startswith(words[1])]
                    for link in matched:
                        link.set_mode(words[2])
                    answer = str(len(matched))
                else:
                    answer = f"error unknown command {words[0]!r}"
            except (IndexError, KeyError, ValueError) as exc:
                answer = f"error {exc!r}"
            writer.write((answer + "\n").encode())
            await writer.drain()
        writer.close()


async def main(control_port: int) -> None:
    proxy = Proxy()
    server = await asyncio.start_server(proxy.control, "127.0.0.1", control_port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
