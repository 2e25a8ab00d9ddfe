"""The floor under every HTTP figure of bench/overhead.py: a bare uvloop + httptools server that
answers each request with a fixed 200 (no routing, no decoding, no model).

    python3 bench/echo_server.py [--cpu N] [--answers-from PORT]
    # prints "port P" once listening; SIGTERM stops it

Timed with the same clients as duetime, it shows what this machine's loopback, wake-ups and
client cost before a server does any work of its own.

`--answers-from PORT`: answer each request with the answer a duetime server on 127.0.0.1:PORT
gave the first request of its method and path that it answered with success (asked until
then, the loop blocked meanwhile: the model's metadata and config, one inference), so that
`duetime bench` can drive it as it drives duetime: the floor under bench/scheduling.py's
latencies and on-time shares (see `echo_floor`). It reads no timeout and refuses nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
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


class Replay(asyncio.Protocol):
    """Answers as a duetime server on `source` answered the first request of the same method
    and path (see the module's doc)."""

    answers: dict[tuple[bytes, bytes], bytes] = {}
    source = 0

    def __init__(self) -> None:
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._url = b""
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._parser.feed_data(data)

    def on_message_begin(self) -> None:
        self._url, self._headers, self._body = b"", {}, []

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode("latin-1")] = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        assert self._transport is not None
        method = self._parser.get_method()
        key = (method, self._url.split(b"?")[0])
        answer = self.answers.get(key)
        if answer is None:
            status, answer = self._ask(method.decode(), self._url.decode())
            if 200 <= status < 300:
                self.answers[key] = answer
        self._transport.write(answer)

    def _ask(self, method: str, url: str) -> tuple[int, bytes]:
        """The source server's answer to this request, whole, as bytes to send again, and its
        status (only a success is kept for the requests after it).

        NOTE: the first answer was kept whatever it was: a busy source (the hypervisor took
        half a core) refused the first inference, and every one after it was answered with
        that refusal (a floor of 28,699 errors)."""
        connection = http.client.HTTPConnection("127.0.0.1", self.source, timeout=30)
        try:
            kept = {k: v for k, v in self._headers.items() if k.lower() != "connection"}
            connection.request(method, url, body=b"".join(self._body) or None, headers=kept)
            response = connection.getresponse()
            body = response.read()
        finally:
            connection.close()
        head = [f"HTTP/1.1 {response.status} {response.reason}"]
        head += [
            f"{name}: {value}"
            for name, value in response.getheaders()
            if name.lower() not in ("content-length", "connection", "transfer-encoding")
        ]
        head.append(f"Content-Length: {len(body)}")
        return response.status, ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


async def serve(answers_from: int | None) -> None:
    loop = asyncio.get_running_loop()
    if answers_from is not None:
        Replay.source = answers_from
    protocol = Echo if answers_from is None else Replay
    server = await loop.create_server(protocol, "127.0.0.1", 0)
    print(f"port {server.sockets[0].getsockname()[1]}", flush=True)
    stop = loop.create_future()
    loop.add_signal_handler(signal.SIGTERM, stop.set_result, None)
    await stop
    server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cpu", type=int, default=None, help="pin to this CPU")
    parser.add_argument(
        "--answers-from", type=int, default=None, metavar="PORT",
        help="answer as the duetime server on this port answered (see above)",
    )  # fmt: skip
    args = parser.parse_args()
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    uvloop.run(serve(args.answers_from))


if __name__ == "__main__":
    main()
