"""Triton's log settings API (`GET/POST /v2/logging`, gRPC `LogSettings`) over Python logging.

The settings and what they do here:

- `log_info`, `log_warning`, `log_error` (bool), `log_verbose_level` (integer, 0 to 2**32-1,
  gRPC's uint32): the level of the `duetime` loggers. Python logs by threshold, so the switches
  must describe one: a level on while a more severe one is off (info on, warning off) is refused.
  A verbose level above 0 logs debug records too.
- `log_file` (string): a file the `duetime` loggers write to instead of the server's stderr
  (appended to; "" goes back to stderr). A file that cannot be opened is refused, and so is
  any file unless the server has a control token and the caller sent it.
- `log_format` ("default" or "ISO8601"): the time stamps of the log's lines, on stderr and in
  the log file. While the server logs JSON (`--log-format json`) the file gets JSON lines too,
  their `time` in ISO 8601 (UTC) whichever is set.

An update is checked whole before any of it applies; the answer is the settings after it.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from duetime.errors import InvalidInput, NotAllowed, shown
from duetime.observability.logs import TEXT_LINE, JsonFormatter, TextFormatter

LOGGER = "duetime"
FORMATS = ("default", "ISO8601")
_TYPES: dict[str, type] = {
    "log_file": str, "log_info": bool, "log_warning": bool, "log_error": bool,
    "log_verbose_level": int, "log_format": str,
}  # fmt: skip
_VERBOSE_MAX = 2**32 - 1  # the protocol's uint32 (Triton's gRPC LogSettings sends one)


class LogSettings:
    """The log settings of one server process, applied to the `duetime` logger."""

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self._logger = logger or logging.getLogger(LOGGER)
        self._own_level = self._logger.level
        level = self._logger.getEffectiveLevel()
        self._settings: dict[str, Any] = {
            "log_file": "",
            "log_info": level <= logging.INFO,
            "log_warning": level <= logging.WARNING,
            "log_error": level <= logging.ERROR,
            "log_verbose_level": 1 if level <= logging.DEBUG else 0,
            "log_format": "default",
        }
        self._handler: logging.FileHandler | None = None
        self._stderr: dict[logging.Handler, logging.Formatter | None] = {}
        """The text handlers of the root logger (stderr) whose time stamps `log_format` set, and
        the formatter each had before."""

    def current(self) -> dict[str, Any]:
        return dict(self._settings)

    def update(self, changes: Mapping[str, Any], *, files: bool = False) -> dict[str, Any]:
        """Apply `changes` (setting -> value; None keeps a setting); the settings after.

        `files`: whether the caller may choose a log file. NOTE: the server appends to any file
        its user can write, so only a caller that proved it holds the control token may (the
        server has one); anyone may turn the file off."""
        merged = dict(self._settings)
        for name, value in changes.items():
            kind = _TYPES.get(name)
            if kind is None:
                known = ", ".join(_TYPES)
                raise InvalidInput(f"unknown log setting '{name}'; the settings are {known}")
            if value is None:
                continue
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise InvalidInput(
                    f"log setting '{name}': expected {_KIND_NAMES[kind]}, got {shown(value)}"
                )
            merged[name] = value
        if not 0 <= merged["log_verbose_level"] <= _VERBOSE_MAX:
            raise InvalidInput(
                f"log setting 'log_verbose_level': expected an integer from 0 to {_VERBOSE_MAX}, "
                f"got {merged['log_verbose_level']}"
            )
        if merged["log_format"] not in FORMATS:
            raise InvalidInput(
                f"log setting 'log_format': expected one of {', '.join(FORMATS)}, got "
                f"{shown(merged['log_format'])}"
            )
        level = _threshold(merged)
        moved = merged["log_file"] != self._settings["log_file"]
        if moved and merged["log_file"] and not files:
            raise NotAllowed(
                "log setting 'log_file': choosing a file the server appends to needs its control "
                "token (start it with --control-token and send it); without one a log file can "
                "only be turned off"
            )
        handler = self._file_handler(merged) if moved else self._handler
        self._apply(merged, level, handler)
        return self.current()

    def _file_handler(self, merged: Mapping[str, Any]) -> logging.FileHandler | None:
        path = merged["log_file"]
        if not path:
            return None
        try:
            _check_appendable(path)
            return logging.FileHandler(Path(path), mode="a", encoding="utf-8")
        except (OSError, ValueError) as exc:  # (ValueError: a NUL in the path)
            reason = getattr(exc, "strerror", None) or exc
            raise InvalidInput(
                f"log setting 'log_file': cannot open {shown(path)} for appending: {reason}"
            ) from None

    def _apply(
        self, merged: dict[str, Any], level: int, handler: logging.FileHandler | None
    ) -> None:
        logger = self._logger
        logger.setLevel(level)
        if handler is not self._handler:
            if self._handler is not None:
                logger.removeHandler(self._handler)
                _close(self._handler)
            self._handler = handler
            if handler is not None:
                logger.addHandler(handler)
            logger.propagate = handler is None  # a file takes the place of stderr
        if self._handler is not None:
            self._handler.setFormatter(_formatter(merged["log_format"]))
        self._stamp_stderr(merged["log_format"])
        self._settings = merged

    def _stamp_stderr(self, form: str) -> None:
        """Give the root logger's text lines (the server's stderr) `form`'s time stamps.

        NOTE: only a log file's lines took them, and a log file needs the control token: on a
        server without one, "ISO8601" was accepted and answered back, and changed nothing
        (found by a tester; Triton's changes every line)."""
        if form == "ISO8601":
            for handler in logging.getLogger().handlers:
                if handler not in self._stderr and type(handler.formatter) is TextFormatter:
                    self._stderr[handler] = handler.formatter
                    handler.setFormatter(_formatter(form))
            return
        for handler, formatter in self._stderr.items():
            handler.setFormatter(formatter)
        self._stderr.clear()

    def close(self) -> None:
        """Put the `duetime` logger back as it was (its level, stderr; closes a log file)."""
        self._logger.setLevel(self._own_level)
        self._stamp_stderr("default")
        if self._handler is not None:
            self._logger.removeHandler(self._handler)
            _close(self._handler)
            self._handler = None
            self._logger.propagate = True


def _check_appendable(path: str) -> None:
    """OSError unless `path` can be opened for appending without waiting: a FIFO with no reader
    (or a socket) is refused.

    NOTE: opened plainly on the event loop, a FIFO as the log file held the whole server until
    something read it (found by a tester)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o644)
    try:
        kind = os.fstat(fd).st_mode
    finally:
        os.close(fd)
    if stat.S_ISFIFO(kind) or stat.S_ISSOCK(kind):
        raise OSError(errno.EINVAL, "a pipe or socket; give a regular file")


def _close(handler: logging.FileHandler) -> None:
    """Close a log file the logger no longer writes to; one that fails to flush (its pipe's
    reader gone, a full device) is let go all the same (it answered 500 and left the
    settings half changed: found by a tester)."""
    with contextlib.suppress(OSError):
        handler.close()


_KIND_NAMES = {str: "a string", bool: "true or false", int: f"an integer from 0 to {_VERBOSE_MAX}"}
"""What a setting of each type must be. NOTE: an integer past 2**64 in a JSON body is read as a
float: "expected an integer >= 0, got 1.18e+21" told a client its 2**70 was not one; the range
is named, as for -1 (found by a tester)."""


def _threshold(settings: Mapping[str, Any]) -> int:
    """The one logging level the switches describe (see the module doc)."""
    switches = [
        (logging.DEBUG, settings["log_verbose_level"] > 0, "log_verbose_level"),
        (logging.INFO, settings["log_info"], "log_info"),
        (logging.WARNING, settings["log_warning"], "log_warning"),
        (logging.ERROR, settings["log_error"], "log_error"),
    ]
    level = logging.CRITICAL + 10  # all off
    for index, (candidate, on, name) in enumerate(switches):
        if on:
            off = [n for _, o, n in switches[index + 1 :] if not o]
            if off:
                raise InvalidInput(
                    f"log settings: {name} is on but {', '.join(off)} off; duetime logs by "
                    "level, so a level on turns on every more severe one"
                )
            level = candidate
            break
    return level


def _formatter(form: str) -> logging.Formatter:
    """The log file's format: JSON while the server logs JSON (its stderr handler, on the root
    logger, formats JSON), else text with `form`'s time stamps (and control characters escaped,
    as on stderr).

    NOTE: a file set with `--log-format json` got plain-text lines: a log shipper reading the
    server's JSON broke when the file was switched on."""
    if any(isinstance(h.formatter, JsonFormatter) for h in logging.getLogger().handlers):
        return JsonFormatter()
    if form == "ISO8601":
        formatter = TextFormatter(TEXT_LINE, datefmt="%Y-%m-%dT%H:%M:%SZ")
        formatter.converter = time.gmtime
        return formatter
    return TextFormatter(TEXT_LINE)
