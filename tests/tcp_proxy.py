"""A TCP forwarder that can cut: every connection it carries is dropped and new ones are closed
as they arrive until it is restored. Put in front of the real Postgres it is a database outage as
the store sees one (its connections break, reconnecting fails), without stopping the server that
other tests share. Cut with hold_new, new connections are accepted and never answered instead: a
database host that stopped answering. Tests and benchmarks/store_outage.py use it.

    async with tcp_proxy("127.0.0.1", 5432) as proxy:
        url = f"postgresql+psycopg://postgres@127.0.0.1:{proxy.port}/db"
        proxy.cut()
        ...
        proxy.restore()
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

CHUNK = 64 * 1024


class TcpProxy:
    """Forwards 127.0.0.1:port to target_host:target_port while not cut."""

    def __init__(self, target_host: str, target_port: int):
        self.target = (target_host, target_port)
        self.port = 0
        self.is_cut = False
        self.holding = False  # while cut: new connections are held silent rather than closed
        self.refused = 0  # connections closed or held on arrival while cut
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()  # both ends of every carried connection
        self._held: set[asyncio.StreamWriter] = set()
        self._carrying: set[asyncio.Task] = set()  # awaited on close: none is left for the loop to cancel

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._carry, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def cut(self, hold_new: bool = False) -> None:
        """Drops every carried connection at once (no goodbye to either side) and refuses new ones,
        or with hold_new accepts them and never answers."""
        self.is_cut, self.holding = True, hold_new
        for writer in list(self._open):
            writer.transport.abort()
        self._open.clear()

    def restore(self) -> None:
        self.is_cut = False
        self._let_go_held()

    async def close(self) -> None:
        self.cut()
        self._let_go_held()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        await asyncio.gather(*self._carrying, return_exceptions=True)

    def _let_go_held(self) -> None:
        for writer in self._held:
            writer.transport.abort()
        self._held.clear()

    async def _carry(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        if self.is_cut:
            self.refused += 1
            if self.holding:
                self._held.add(client_writer)
            else:
                client_writer.transport.abort()
            return
        try:
            server_reader, server_writer = await asyncio.open_connection(*self.target)
        except OSError:
            client_writer.transport.abort()
            return
        ends = {client_writer, server_writer}
        self._open |= ends
        self._carrying.add(task := asyncio.current_task())
        try:
            await asyncio.gather(_pipe(client_reader, server_writer), _pipe(server_reader, client_writer))
        finally:
            self._carrying.discard(task)
            self._open -= ends
            for writer in ends:
                writer.transport.abort()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copies one direction until it ends; a cut ends it from the outside (the reads then fail)."""
    with contextlib.suppress(ConnectionError, OSError):
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
    writer.transport.abort()


@contextlib.asynccontextmanager
async def tcp_proxy(target_host: str, target_port: int) -> AsyncIterator[TcpProxy]:
    proxy = TcpProxy(target_host, target_port)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.close()
