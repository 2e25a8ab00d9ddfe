"""The floor under every HTTP figure of bench/overhead.py: a bare uvloop + httptools server that
answers each request with a fixed 200 (no routing, no decoding, no model).

    python3 bench/echo_server.py [--cpu N]   # prints "port P" once listening; SIGTERM stops it

Timed with the same clients as duetime, it shows what this machine's loopback, wake-ups and
client cost before a server does any work of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal

import httptools
import uvloop

ANSWER_BODY = b'{"model_name":"mlp","outputs":[]}' + b" " * 90
ANSWER = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
    + str(len(ANSWER_BODY)).encode()
    + b"\r\n\r\n"
    + ANSWER_BODY
)


class Echo(asyncio.Protocol):
    def __init__(self) -> None:
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._parser.feed_data(data)

    def on_message_complete(self) -> None:
        assert self._transport is not None
        self._transport.write(ANSWER)


async def serve() -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Echo, "127.0.0.1", 0)
    print(f"port {server.sockets[0].getsockname()[1]}", flush=True)
    stop = loop.create_future()
    loop.add_signal_handler(signal.SIGTERM, stop.set_result, None)
    await stop
    server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cpu", type=int, default=None, help="pin to this CPU")
    args = parser.parse_args()
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    uvloop.run(serve())


if __name__ == "__main__":
    main()
