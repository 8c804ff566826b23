"""An answer's wire bytes read by kvscope's one HTTP client (core/net.py), for the tests and
the fuzz bench (bench/fuzz_answers.py): a one-off listener on 127.0.0.1 writes the bytes (status
line, headers, framing and body), and `fetch` parses them with the same code and errors as any
read."""

from __future__ import annotations

import asyncio

from kvscope.core.net import client, fetch


async def _serve_bytes(raw: bytes) -> tuple[asyncio.Server, int]:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(raw)
            await writer.drain()
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def answer_from_bytes(raw: bytes, what: str, max_bytes: int) -> bytearray:
    """The body `fetch` reads from an answer whose wire bytes are `raw` (a one-off listener on
    127.0.0.1 writes them: status line, headers, framing and body parsed by the same code, with the
    same errors): the fuzz bench's entry."""
    c = client()
    server, port = c.run(_serve_bytes(raw))
    try:
        return fetch(f"http://127.0.0.1:{port}/", what, 60.0, max_bytes, data=b"")[0]
    finally:
        server.close()
