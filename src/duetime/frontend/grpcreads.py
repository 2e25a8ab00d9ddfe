"""FirstMessages: a gRPC call's first request message must come within the read timeout.

grpc.aio takes a call from its core at the call's HEADERS, before any message has come, and
serves it in a task of its own; a unary call's handler runs once its message is all there.
gRPC's core has no timeout for a request message: a call whose message never came held its
stream, and so its connection, until its client closed it (`grpc.max_connection_idle_ms` ends
only a connection with no call).

NOTE: one client sent the HEADERS of one ModelInfer call, and nothing more, on each of
`--max-grpc-connections` connections (200 bytes each): every other gRPC client was refused
UNAVAILABLE for as long as it kept them (found by a tester). A handler that takes a unary
request now takes it as a stream, so it runs at once and reads the message itself
(`FirstMessages.first`); one that takes a stream is told when its first message comes
(`_Watched`). A call whose first message has not come within `--request-read-timeout-s` of its
start is ended DEADLINE_EXCEEDED, as HTTP's 408; a connection left with no call is then
ended by the idle timeout. Taken as a stream, an empty unary call cost the loop what it did
(273 µs of CPU a call either way, 40,000 calls, 6 runs each, on the 2-core VM).

NOTE: a stream (ModelStreamInfer) is opened ahead of its requests: tritonclient's
`start_stream` sends the call's HEADERS at once, and a client that opened it at start-up to send
when events come had it ended after 10 s of quiet (found by a tester; Triton has no limit). A
stream waiting for its first message past the timeout is kept while few do: it is ended only
once more than `idle_streams` (half of `--max-grpc-connections`) wait past it, the newest first
(those kept longest are a client's established streams, not a flood's). Calls held that way can
keep at most that share of the connections from other clients.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

_LATE = object()
"""What `FirstMessages.first` gives for a call ended for its message's wait."""
_CACHED = 64
"""Handlers a generic handler's lookups are bounded for at most, kept (see `_BoundGeneric`)."""


class FirstMessages:
    """The calls waiting for their first request message, each ended once `within_s` has passed
    since it was `wait`ed for: its task (the one grpc.aio serves the call in) is cancelled, and
    the wrapper that waits (`first`, `bounded`) takes the cancellation back (`late`) and ends
    the call with DEADLINE_EXCEEDED.

    NOTE: one timer serves every call, set for the one due first: a timer a call (asyncio's
    `timeout`) cost 6 µs a call, against 0.2 µs here."""

    def __init__(
        self,
        within_s: float,
        idle_streams: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.within_s = within_s
        self.idle_streams = idle_streams
        """Streams kept past `within_s` waiting for their first message, at most (module NOTE)."""
        self._clock = clock
        self._waiting: dict[asyncio.Task[Any], tuple[float, bool]] = {}
        """Each call's task -> when it is due, and whether it serves a stream; in the order
        they came, so the order due."""
        self._idle: dict[asyncio.Task[Any], None] = {}
        """Streams past `within_s` with no message yet, kept; in the order they came."""
        self._late: set[asyncio.Task[Any]] = set()
        self._timer: asyncio.TimerHandle | None = None

    def wait(self, task: asyncio.Task[Any], stream: bool = False) -> None:
        self._waiting[task] = (self._clock() + self.within_s, stream)
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.within_s, self._sweep)

    def came(self, task: asyncio.Task[Any]) -> None:
        self._waiting.pop(task, None)
        if self._idle:
            self._idle.pop(task, None)

    def done(self, task: asyncio.Task[Any]) -> None:
        self.came(task)
        self._late.discard(task)

    def late(self, task: asyncio.Task[Any]) -> bool:
        """Whether `task`'s cancellation was this one's (taken back: the call goes on, to end)."""
        if task not in self._late:
            return False
        self._late.discard(task)
        task.uncancel()
        return True

    async def first(self, context: Any) -> Any:
        """The call's request message (deserialized), `grpc.aio.EOF` where its client ended
        it without one, or `_LATE`."""
        task = asyncio.current_task()
        if task is None:  # (grpc.aio serves every call in a task)
            return await context.read()
        self.wait(task)
        try:
            return await context.read()
        except asyncio.CancelledError:
            if not self.late(task):
                raise
            return _LATE
        finally:
            self.done(task)

    def _end(self, task: asyncio.Task[Any]) -> None:
        if task.cancel():
            self._late.add(task)

    def _sweep(self) -> None:
        self._timer = None
        now = self._clock()
        due_first = None
        overdue = []
        for task, (due, stream) in self._waiting.items():
            if due > now:
                due_first = due
                break
            overdue.append((task, stream))
        idle = self._idle
        for task, stream in overdue:
            del self._waiting[task]
            if stream:
                idle[task] = None
            else:
                self._end(task)
        while len(idle) > self.idle_streams:
            self._end(idle.popitem()[0])  # (the newest: see the module's NOTE)
        if due_first is not None:  # (uvloop's timers are whole ms: not one that fires early)
            delay = max(due_first - now, 0.001)
            self._timer = asyncio.get_running_loop().call_later(delay, self._sweep)


def bounded(handler: Any, messages: FirstMessages) -> Any:
    """`handler` (a grpc.RpcMethodHandler) with its call's first request message due within
    `messages.within_s` of the call's start: one taking a unary request is made one taking a
    stream, whose first message it reads (its behaviour is given that message, as before).
    Unchanged where its behaviour is not a coroutine or an async generator (grpc.aio runs those
    on a thread)."""
    for kind in ("unary_unary", "unary_stream", "stream_unary", "stream_stream"):
        inner = getattr(handler, kind)
        if inner is not None:
            break
    else:
        return handler
    deserialize, serialize = handler.request_deserializer, handler.response_serializer
    if kind == "unary_unary" and inspect.iscoroutinefunction(inner):

        async def unary(requests: Any, context: Any) -> Any:
            request = await messages.first(context)
            if request is _LATE or request is grpc.aio.EOF:
                return _unread(context, request, messages.within_s)
            return await inner(request, context)

        return grpc.stream_unary_rpc_method_handler(unary, deserialize, serialize)
    if kind == "unary_stream" and inspect.isasyncgenfunction(inner):

        async def unary_stream(requests: Any, context: Any) -> AsyncIterator[Any]:
            request = await messages.first(context)
            if request is _LATE or request is grpc.aio.EOF:
                _unread(context, request, messages.within_s)
                return
            async for answer in inner(request, context):
                yield answer

        return grpc.stream_stream_rpc_method_handler(unary_stream, deserialize, serialize)
    if kind == "stream_unary" and inspect.iscoroutinefunction(inner):

        async def stream_unary(requests: Any, context: Any) -> Any:
            task = _waiting(messages)
            try:
                return await inner(_Watched(requests, messages, task), context)
            except asyncio.CancelledError:
                if not messages.late(task):
                    raise
                return _unread(context, _LATE, messages.within_s, messages.idle_streams)
            finally:
                messages.done(task)

        return handler._replace(stream_unary=stream_unary)
    if kind == "stream_stream" and inspect.isasyncgenfunction(inner):

        async def stream_stream(requests: Any, context: Any) -> AsyncIterator[Any]:
            task = _waiting(messages)
            try:
                async for answer in inner(_Watched(requests, messages, task), context):
                    yield answer
            except asyncio.CancelledError:
                if not messages.late(task):
                    raise
                _unread(context, _LATE, messages.within_s, messages.idle_streams)
            finally:
                messages.done(task)

        return handler._replace(stream_stream=stream_stream)
    return handler


def _waiting(messages: FirstMessages) -> asyncio.Task[Any]:
    task = asyncio.current_task()
    assert task is not None  # (grpc.aio serves every call in a task)
    messages.wait(task, stream=True)
    return task


def _unread(context: Any, request: object, within_s: float, idle_streams: int = 0) -> None:
    """End the call, its request message not read: late (`_LATE`), or never sent (EOF). No
    answer is sent with a status that is not OK. `idle_streams`: the call is a stream, ended
    as one more than those kept idle (`FirstMessages.idle_streams`)."""
    if request is _LATE and idle_streams:
        context.set_code(grpc.StatusCode.DEADLINE_EXCEEDED)
        context.set_details(
            f"the stream's first request did not come within {within_s:g} s of its start "
            f"(--request-read-timeout-s), and {idle_streams} other streams were already kept "
            "waiting for theirs (half of --max-grpc-connections)"
        )
    elif request is _LATE:
        context.set_code(grpc.StatusCode.DEADLINE_EXCEEDED)
        context.set_details(
            f"the call's request message did not come within {within_s:g} s of its start "
            "(--request-read-timeout-s)"
        )
    else:
        context.set_code(grpc.StatusCode.INTERNAL)
        context.set_details("the call ended without its request message")


class _Watched:
    """A stream's requests, telling `messages` once the first has come (or the stream ended)."""

    def __init__(self, requests: Any, messages: FirstMessages, task: asyncio.Task[Any]) -> None:
        self._requests = aiter(requests)
        self._messages: FirstMessages | None = messages
        self._task = task

    def __aiter__(self) -> _Watched:
        return self

    async def __anext__(self) -> Any:
        messages = self._messages
        if messages is None:
            return await anext(self._requests)
        try:
            return await anext(self._requests)
        finally:
            self._messages = None
            messages.came(self._task)


class _BoundGeneric(grpc.GenericRpcHandler):  # type: ignore[misc]
    """A generic handler whose methods' calls are `bounded` (each handler made once)."""

    def __init__(self, inner: Any, messages: FirstMessages) -> None:
        self._inner = inner
        self._messages = messages
        self._made: dict[int, tuple[Any, Any]] = {}
        """id of a handler looked up -> it, and it bounded (it is kept: its id is not reused)."""

    def service(self, handler_call_details: Any) -> Any:
        handler = self._inner.service(handler_call_details)
        if handler is None:
            return None
        made = self._made.get(id(handler))
        if made is not None and made[0] is handler:
            return made[1]
        bound = bounded(handler, self._messages)
        if len(self._made) < _CACHED:  # (a lookup that makes a new handler a call is not kept)
            self._made[id(handler)] = (handler, bound)
        return bound


class FirstMessageServer:
    """Registers services on `server` (a grpc.aio server, or what stands for one: a
    `CountingServer`) with their calls `bounded` by `messages`."""

    def __init__(self, server: Any, messages: FirstMessages) -> None:
        self._server = server
        self._messages = messages

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        self._server.add_generic_rpc_handlers(
            tuple(_BoundGeneric(h, self._messages) for h in handlers)
        )

    def add_registered_method_handlers(self, name: str, handlers: dict[str, Any]) -> None:
        bound = {method: bounded(h, self._messages) for method, h in handlers.items()}
        self._server.add_registered_method_handlers(name, bound)


# (reflection registers its asyncio servicer only on what it takes for a grpc.aio server)
grpc.aio.Server.register(FirstMessageServer)
