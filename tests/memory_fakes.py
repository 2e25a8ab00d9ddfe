"""Test doubles shared across test folders: an in-memory transport for `HttpConnection`, and
hand-moved clocks for `LoadShedder`.

Imported as `from memory_fakes import ...` (pytest puts tests/ on `sys.path`, as for
`repo_models`).
"""

from __future__ import annotations


class Transport:
    """What HttpConnection writes to, kept in memory."""

    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(bytes(data))

    def writelines(self, pieces: list[bytes]) -> None:
        self.written.append(b"".join(pieces))

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default

    def close(self) -> None: ...


class ShedderClocks:
    """Wall and CPU time a test moves by hand, and running totals of requests all missing."""

    def __init__(self) -> None:
        self.wall = 0.0
        self.cpu = 0.0
        self.requests = 0

    def failing(self) -> tuple[int, int]:
        self.requests += 10
        return self.requests, self.requests

    def run(self, busy: float) -> None:
        self.wall += 0.01
        self.cpu += 0.01 * busy
