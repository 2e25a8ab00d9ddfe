"""A stand-in HTTP server for the tools' tests: v2 metadata of model `m` (x: FP32 [-1, 4]), its
Triton-style config (unless `has_config` is False, as MLServer) and an infer answer chosen per
test (a v2 answer, or something that is not one). `dies_at_first_post`: it answers its first
POSTs, each on a connection it then closes, and stops listening (a server dying mid-run).
`metadata` and `config`: other bodies for those two (malformed ones)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

METADATA = {
    "name": "m", "versions": ["1"], "platform": "onnx",
    "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
    "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 4]}],
}  # fmt: skip
V2_ANSWER = (
    b'{"model_name":"m","outputs":[{"name":"y","datatype":"FP32","shape":[1,4],"data":[1,2,3,4]}]}'
)


@dataclass
class FakeV2:
    """What the server answers to POSTs, and an event set at the first one."""

    answer: bytes = V2_ANSWER
    content_type: str = "application/json"
    posted: threading.Event = field(default_factory=threading.Event)
    port: int = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


@contextmanager
def fake_v2_server(
    answer: bytes = V2_ANSWER,
    content_type: str = "application/json",
    *,
    has_config: bool = True,
    dies_at_first_post: bool = False,
    metadata: bytes | None = None,
    config: bytes | None = None,
) -> Iterator[FakeV2]:
    fake = FakeV2(answer, content_type)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _send(self, code: int, body: bytes, content_type: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            if dies_at_first_post and self.command == "POST":
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path.endswith("/config"):
                if has_config:
                    self._send(200, b'{"max_batch_size": 8}' if config is None else config)
                else:
                    self._send(404, b'{"error": "not found"}')
            elif self.path.startswith("/v2/models/"):
                self._send(200, json.dumps(METADATA).encode() if metadata is None else metadata)
            else:
                self._send(404, b"{}")

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if dies_at_first_post and not fake.posted.is_set():
                # (from a thread of its own: shutdown() waits for serve_forever to return)
                threading.Thread(target=stop, name="fake-v2-dies", daemon=True).start()
            fake.posted.set()
            self._send(200, fake.answer, fake.content_type)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    fake.port = server.server_address[1]

    def stop() -> None:
        server.shutdown()
        server.server_close()

    thread = threading.Thread(target=server.serve_forever, name="fake-v2", daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        stop()
        thread.join(timeout=10)
