"""Logs: plain text or one JSON object per line; a line per failed request, and a sampled access
log (off by default).

Request lines go to the `duetime.requests` logger: failures of the server's own making (5xx)
at WARNING, refusals and client errors (4xx, deadline misses) and requests their clients
cancelled (499) at INFO, sampled successes at INFO. Each names the protocol, model, status,
reason and trace id (a cancelled request's: its caller's, if it sent one).

Text lines carry control characters escaped (see `TextFormatter`): a model name, a URL or a
message quoting a client's value cannot start a line of its own.
"""

from __future__ import annotations

import logging
import re
import sys
import time
from typing import Any

import orjson

requests_log = logging.getLogger("duetime.requests")

_EXTRA_FIELDS = (
    "protocol", "model", "version", "status", "grpc_code", "trace_id", "latency_us",
)  # fmt: skip
"""The request fields a JSON line carries (see `log_request`).

NOTE: `grpc_code` was missing: a gRPC request's line had the code in its message only, though
the README promises the field (found by a tester)."""

TEXT_LINE = "%(asctime)s %(levelname)s %(name)s: %(message)s"
"""A text log line: time, level, logger and message."""

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
"""What a text line escapes: C0 and C1 controls, DEL, and the Unicode line and paragraph
separators (which some viewers break lines at)."""
_SHORT_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    short = _SHORT_ESCAPES.get(char)
    if short is not None:
        return short
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape_controls(text: str) -> str:
    """`text` with its control characters written as escapes (`\\n`, `\\r`, `\\x1b`, `\\u2028`)."""
    if _CONTROL.search(text) is None:  # (the common line: one scan, no copy)
        return text
    return _CONTROL.sub(_escape, text)


class TextFormatter(logging.Formatter):
    """Text lines (`TEXT_LINE`) whose every line is one record's.

    NOTE: messages quote what clients send (a model name from the URL, a gRPC `model_name`), so
    a CR/LF in one forged a line of its own ("x%0A2026-01-01 ... CRITICAL ..." in a URL), and an
    ESC drove the terminal showing the log. The line is escaped whole, message and all, as the
    JSON format's strings are; a traceback keeps its lines, each indented (so none can pass for
    a record: a record starts at the line's first column) and escaped. Backslashes are not
    doubled: a `\\n` in a line is a newline or the two characters sent, on its line either way."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return escape_controls(super().formatMessage(record))

    def formatException(self, ei: Any) -> str:
        return _indented(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:
        return _indented(super().formatStack(stack_info))


def _indented(text: str) -> str:
    return "\n".join("    " + escape_controls(line) for line in text.split("\n"))


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message and the request's fields."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in _EXTRA_FIELDS:
            value = record.__dict__.get(name)
            if value is not None:
                doc[name] = value
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(doc).decode()


def configure_logging(level: str, form: str) -> None:
    """Log to stderr at `level` ("debug".."error") as `form` ("text" or "json")."""
    handler = logging.StreamHandler(sys.stderr)
    if form == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter(TEXT_LINE))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper()))


def console(message: str, level: int = logging.ERROR) -> None:
    """A line for whoever runs the command, on stderr whatever the log level: the text as it is,
    or one JSON record (logger `duetime`) while the logs are JSON, so that a log collector reading
    stderr parses every line."""
    if any(isinstance(h.formatter, JsonFormatter) for h in logging.getLogger().handlers):
        record = logging.makeLogRecord(
            {"name": "duetime", "levelno": level, "levelname": logging.getLevelName(level),
             "msg": message}
        )  # fmt: skip
        message = JsonFormatter().format(record)
    print(message, file=sys.stderr, flush=True)


_CLIENTS_5XX = frozenset({501, 503, 504, 505})
"""5xx statuses logged at INFO: refusals under load (503, 504) and what the client asked for that
is not served (501, 505); see `log_request`."""


def log_request(
    *,
    protocol: str,
    model: str,
    version: str | None,
    status: int,
    reason: str | None,
    trace_id: str | None,
    latency_ns: int | None = None,
    grpc_code: str | None = None,
) -> None:
    """One line for one request: a failure, or a sampled success (reason None). `status` is
    HTTP's (or its equivalent, for a gRPC request: `DuetimeError.http_status`); a gRPC request's
    line names its own status code (`grpc_code`: OK, RESOURCE_EXHAUSTED, ...) in its place,
    and has both as fields.

    NOTE: a gRPC failure's line said `grpc resnet 429: ...`, a status its client never saw
    (found by a tester)."""
    # NOTE: 504 is a deadline miss (the client's budget, or overload), 503 a refusal for want
    # of room or of a model able to answer now (retry later): at overload there are thousands
    # a second (3 s of gzip overload logged 4,394 WARNING lines of 503), and they are counted
    # in the metrics; they go at INFO with the 4xx. So do 501 (a v1 explain: a method duetime
    # does not serve) and 505 (an HTTP version it does not speak), the client's asking: any
    # client wrote WARNING lines with them (found by a tester). Other 5xx are the server's.
    level = logging.WARNING if status >= 500 and status not in _CLIENTS_5XX else logging.INFO
    if not requests_log.isEnabledFor(level):
        return
    fields = {
        "protocol": protocol, "model": model, "version": version or None, "status": status,
        "grpc_code": grpc_code, "trace_id": trace_id,
        "latency_us": None if latency_ns is None else round(latency_ns / 1000, 1),
    }  # fmt: skip
    text = f"{protocol} {model} {grpc_code or status}" + (f": {reason}" if reason else "")
    if trace_id:
        text += f" (trace {trace_id})"
    requests_log.log(level, text, extra=fields)


CANCELLED_STATUS = 499
"""The status logged for a request its client cancelled before its answer (nginx's "client
closed request"; nothing is sent: there is no one to send it to)."""


def log_cancelled(protocol: str, model: str, version: str | None, trace_id: str | None) -> None:
    """The line of a request its client cancelled (closed its connection, cancelled its call)
    before its answer: counted as cancelled, and never run if it had not started."""
    log_request(
        protocol=protocol, model=model, version=version, status=CANCELLED_STATUS,
        reason="cancelled by its client before its answer", trace_id=trace_id,
        grpc_code=None if protocol == "http" else "CANCELLED",
    )  # fmt: skip


class AccessSampler:
    """A share `rate` of the successful requests get an access-log line, spread evenly: a
    request is taken when the shares of those before it and its own add up past a whole one.

    NOTE: it took every n-th, n = round(1 / rate): any share from 0.67 logged every success,
    0.4 to 0.66 half of them, 0.3 a third (found by a tester)."""

    def __init__(self, rate: float) -> None:
        self._rate = min(max(rate, 0.0), 1.0)
        self._owed = 0.0

    def take(self) -> bool:
        owed = self._owed + self._rate
        if owed >= 1.0 - _SHARE_EPSILON:
            self._owed = max(0.0, owed - 1.0)
            return True
        self._owed = owed
        return False


_SHARE_EPSILON = 1e-9
"""Rounding AccessSampler forgives: a share of 0.1 added ten times comes to 0.9999999999999999."""
