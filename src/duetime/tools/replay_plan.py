"""What `duetime replay` sends: its settings, and the capture read and encoded before the run."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from duetime.errors import ConfigError
from duetime.tools.bench_record import WRITTEN_BY
from duetime.tools.capture.format import CapturedRequest, CapturedTensor
from duetime.tools.capture.reader import CaptureHeader, CaptureReader, not_a_file
from duetime.tools.config import MAX_HTTP_CONNECTIONS, MAX_SECONDS
from duetime.tools.replay_payloads import (
    Unsendable,
    due_timeout_us,
    grpc_request,
    timed_http_request,
)

ReplayProtocol = Literal["http", "grpc"]
Timer = Literal["thread", "loop"]


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    """One replay; each field is the `duetime replay` flag of the same name."""

    capture: Path
    target: str
    protocol: ReplayProtocol | None = None
    speed: float = 1.0
    loops: int = 1
    compare_outputs: bool = False
    rtol: float = 1e-5
    atol: float = 1e-6
    connections: int = 8
    max_connections: int = MAX_HTTP_CONNECTIONS
    drain_s: float = 10.0
    timer: Timer = "thread"
    progress: bool = True

    def __post_init__(self) -> None:
        problems = []
        if not (self.speed > 0 and math.isfinite(self.speed)):
            problems.append(f"--speed: expected a factor > 0, got {self.speed}")
        if self.loops < 1:
            problems.append(f"--loop: expected a count >= 1, got {self.loops}")
        if not (0 <= self.rtol < math.inf and 0 <= self.atol < math.inf):
            problems.append(f"--rtol, --atol: expected >= 0, got {self.rtol} and {self.atol}")
        if not 1 <= self.connections <= self.max_connections:
            problems.append(
                f"--connections: expected 1 to {self.max_connections}, got {self.connections}"
            )
        if not 0 <= self.drain_s <= MAX_SECONDS:  # NaN fails it too
            problems.append(
                f"--drain: expected seconds >= 0 and <= {MAX_SECONDS:g}, got {self.drain_s}"
            )
        if self.timer not in ("thread", "loop"):
            problems.append(f"--timer: expected thread or loop, got {self.timer!r}")
        if problems:
            raise ConfigError("; ".join(problems))
        self.address()

    def address(self) -> tuple[ReplayProtocol, str, int]:
        """(protocol, host, port) of --target: URL http://H:P or grpc://H:P, or plain H:P."""
        text = self.target if "://" in self.target else f"//{self.target}"
        # NOTE: urlsplit raises ValueError too ("Invalid IPv6 URL": http://[::1:80), which
        # once reached the command line as a traceback
        try:
            parts = urlsplit(text)
            host, port = parts.hostname, parts.port
        except ValueError:
            parts, host, port = None, None, None
        scheme = (parts.scheme if parts else "") or self.protocol or "http"
        extra = parts is None or parts.path.strip("/") or parts.query or parts.fragment
        if scheme not in ("http", "grpc") or not host or port is None or extra:
            raise ConfigError(
                f"--target: expected http://HOST:PORT, grpc://HOST:PORT or HOST:PORT, got "
                f"{self.target!r}"
            )
        if self.protocol is not None and parts and parts.scheme and self.protocol != scheme:
            raise ConfigError(f"--protocol {self.protocol} contradicts --target {self.target}")
        return scheme, host, port  # type: ignore[return-value]


# -- the plan: the capture, encoded --------------------------------------------------------------


@dataclass(slots=True)
class Plan:
    """The capture in send order, encoded for one protocol: request i of loop k goes out at
    start + k * span_ns + offsets_ns[i]."""

    offsets_ns: list[int]
    span_ns: int
    payloads: list[Any]
    dues_ns: list[int | None]
    """The budget each request is sent with (ns; None: none): an answer after it is late."""
    timeout_at: list[int]
    """Where each payload's `timeout` digits start (HTTP), 0 (gRPC), or -1 where it sends no
    due time of its budget: what a late send rewrites (`replay_payloads.retimed_http`)."""
    request_ids: list[str]
    recorded: list[list[CapturedTensor] | None]
    """Recorded outputs (only with --compare-outputs; None where the capture has none)."""
    skipped: int = 0
    """Records of the capture skipped because they do not decode (`CaptureReader`): not in
    the plan, not replayed."""
    first_skipped: str | None = None
    """Why the first of them was skipped."""

    def __len__(self) -> int:
        return len(self.offsets_ns)


def check_capture(config: ReplayConfig) -> None:
    """The checks of the capture that cost nothing: ConfigError for no file, a folder, or
    something else that is no file (a device, a pipe; a link to one)."""
    if not config.capture.is_file():
        raise ConfigError(f"{config.capture}: {not_a_file(config.capture)}")


@dataclass(slots=True)
class _Entry:
    """What the plan keeps of one record: its request encoded, and the little the run needs."""

    arrival_ns: int
    payload: Any
    due_ns: int | None
    timeout_at: int
    request_id: str
    recorded: list[CapturedTensor] | None


def load_plan(config: ReplayConfig) -> Plan:
    """Read and encode the capture; CaptureFormatError names a bad record, ConfigError an empty
    or missing capture, or a record the protocol cannot carry.

    NOTE: each record is encoded as it is read and only its wire form kept: the decoded
    records and their encoded copies were once held together (a 517 MiB capture took 1.35 GB).
    The whole capture is still held encoded before the run (about its size again): replaying
    one bigger than memory would take encoding ahead of the sends, in a bounded window."""
    protocol, host, port = config.address()
    check_capture(config)
    encode: Callable[[CapturedRequest], tuple[Any, int]] = _timed_grpc_request
    if protocol != "grpc":
        encode = functools.partial(timed_http_request, host=host, port=port)
    keep = config.compare_outputs
    entries: list[_Entry] = []
    any_recorded = False
    with CaptureReader(config.capture) as reader:
        sent_ids = ids_sent(reader.header)
        for index, record in enumerate(reader):
            if not sent_ids:
                record.request_id = ""
            try:
                payload, timeout_at = encode(record)
            except Unsendable as exc:
                raise ConfigError(
                    f"{config.capture}: record {index} (id {record.request_id!r}) cannot be "
                    f"replayed over {protocol}: {exc}"
                ) from None
            answered = record.outputs is not None and record.status == 200
            any_recorded |= answered
            entries.append(_Entry(
                record.arrival_ns, payload, replay_due_ns(record), timeout_at,
                record.request_id, record.outputs if keep and answered else None,
            ))  # fmt: skip
        skipped, first_skipped = reader.skipped, reader.first_skipped
    if not entries:
        why = f" that decode ({skipped} skipped; the first: {first_skipped})" if skipped else ""
        raise ConfigError(f"{config.capture}: the capture holds no requests{why}")
    entries.sort(key=lambda e: e.arrival_ns)  # a server writes them as they end
    first = entries[0].arrival_ns
    _check_length(config, (entries[-1].arrival_ns - first) / config.speed / 1e9)
    offsets = [round((e.arrival_ns - first) / config.speed) for e in entries]
    last = offsets[-1]
    # back to back: the next loop starts one mean gap after the last request
    span = last + (last // (len(entries) - 1) if len(entries) > 1 else 1_000_000)
    _check_length(config, config.loops * span / 1e9)
    if keep and not any_recorded:
        # NOTE: refused, not run: "0 compared, 0 differ" and exit 0 read as a pass
        raise ConfigError(
            f"--compare-outputs: {config.capture} holds no recorded outputs to compare with "
            "(record them with `duetime serve --record FILE --record-outputs`)"
        )
    return Plan(
        offsets_ns=offsets, span_ns=max(span, 1), payloads=[e.payload for e in entries],
        dues_ns=[e.due_ns for e in entries], timeout_at=[e.timeout_at for e in entries],
        request_ids=[e.request_id for e in entries],
        recorded=[e.recorded for e in entries], skipped=skipped,
        first_skipped=None if first_skipped is None else str(first_skipped),
    )  # fmt: skip


def ids_sent(header: CaptureHeader) -> bool:
    """Whether the records' request ids were on the wire, to be sent again: not in a capture
    of `duetime bench --record` (header meta `written_by`), which sends none, unless its meta
    says `ids_sent: true`.

    NOTE: bench recorded its requests as `bench-0`, `bench-1` ..., ids it never sent, and the
    replay sent them: its bodies (and over gRPC its ModelInferRequest) were not bench's, and
    the server's answers echoed them (found by a tester). Bench now records none; this
    leaves them out of the captures it wrote before."""
    if header.meta.get("written_by") != WRITTEN_BY:
        return True
    return header.meta.get("ids_sent") is True


def _check_length(config: ReplayConfig, seconds: float) -> None:
    """ConfigError naming --speed (and --loop) when the replay's schedule would last more than
    MAX_SECONDS (NaN and inf included).

    NOTE: --speed 1e-300 once raised OverflowError (a schedule of inf ns), and --speed 1e-12
    (a 0.9 s capture over 28,000 years) killed the send timer thread ("timestamp out of
    range"): the replay hung at its first send."""
    if seconds <= MAX_SECONDS:
        return
    loops = f" x --loop {config.loops}" if config.loops > 1 else ""
    raise ConfigError(
        f"--speed {config.speed:g}{loops}: the capture's schedule would last {seconds:.3g} s, "
        f"over the {MAX_SECONDS:g} s a replay may; raise --speed"
    )


def _timed_grpc_request(record: CapturedRequest) -> tuple[Any, int]:
    return grpc_request(record), -1 if due_timeout_us(record) is None else 0


def replay_due_ns(record: CapturedRequest) -> int | None:
    """The budget the replay sends `record` with, in ns: the one its answer is judged late by.

    NOTE: from the same `due_timeout_us` as the payload, so a request sent overdue (1 µs) and
    served all the same counts late, not ok."""
    timeout = due_timeout_us(record)
    return None if timeout is None else timeout * 1000
