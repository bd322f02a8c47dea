"""A minimal asyncio HTTP endpoint for /metrics, /healthz and /readyz (no extra thread)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

Route = Callable[[], tuple[int, str, bytes]]


async def serve(sock: socket.socket, routes: dict[str, Route]) -> asyncio.Server:
    """Serve ``routes`` on an already bound, listening socket (bound before registering, so
    an address in use is a start-up error rather than a crash after registration)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), 5)
            while (await asyncio.wait_for(reader.readline(), 5)) not in (b"\r\n", b"\n", b""):
                pass
            parts = line.decode("latin-1").split()
            path = parts[1].split("?", 1)[0] if len(parts) >= 2 else ""
            route = routes.get(path)
            if route is None:
                status, ctype, body = 404, "text/plain", b"not found\n"
            else:
                status, ctype, body = route()
            reason = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}.get(status, "")
            writer.write(
                f"HTTP/1.0 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (TimeoutError, ConnectionError, UnicodeDecodeError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(handle, sock=sock)
