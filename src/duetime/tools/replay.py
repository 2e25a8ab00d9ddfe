"""`duetime replay`: send a capture's requests again, on their recorded schedule, to any v2 server.

    duetime replay traffic.cap --target http://127.0.0.1:8000 --speed 2 --json out.json

Open loop: request i goes out at start + arrival_i / speed whatever the answers do, and its
latency runs from that scheduled instant. Every request is encoded before the run; a timer
thread wakes the loop at each send time (uvloop's own timers only resolve milliseconds), and a
connection carries one request at a time, so nothing queues behind a slow answer. The replay
reports how far its sends strayed from the schedule and the CPU it used doing so.
`--compare-outputs` checks every answer against the recorded one: a new model version, tested
on real traffic.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from duetime.errors import ConfigError
from duetime.loops import new_event_loop
from duetime.observability.logs import console
from duetime.tools.capture.format import CaptureFormatError
from duetime.tools.drivers import (
    GROUP_NS,
    Waker,
    cpu_seconds,
    paced_switching,
    timer_failure,
)
from duetime.tools.hdr import LatencyRecorder, MissingHdr, new_histogram, record_us
from duetime.tools.http_client import (
    NO_CONNECTION,
    NO_STATUS,
    Answered,
    HttpPool,
    error_text,
)
from duetime.tools.interrupt import EXIT_CODE, Interrupt
from duetime.tools.outcomes import Outcome, outcome_of_http_status
from duetime.tools.outputs import (
    OutputError,
    check_apart,
    check_output,
    failed_write,
    make_parents,
    strict_json,
    write_output,
)
from duetime.tools.progress import Progress, Snapshot
from duetime.tools.replay_payloads import (
    compare_outputs,
    grpc_outputs,
    http_outputs,
    retimed_grpc,
    retimed_http,
)
from duetime.tools.replay_plan import Plan, ReplayConfig, check_capture, load_plan
from duetime.tools.replay_results import (
    EXIT_TARGET_FAILED,
    MAX_MESSAGES,
    MAX_MISMATCHES,
    Mismatch,
    ReplayResult,
    Tally,
    answered_none,
    compare_failed,
    result_of,
    served_none,
)
from duetime.tools.replay_transports import GrpcReplayTransport, ReplayTransport
from duetime.tools.report import EXIT_UNSENT, rate_span
from duetime.tools.server_metrics import batch_sizes_json, counted_between, late_line, scrape
from duetime.tools.transports import BenchError, why_not_http

LEAD_NS = 50_000_000
"""From the end of setup to the first send."""
WITHIN_NS = 1_000_000
"""A send this close to its scheduled instant (either side) counts as on schedule."""
LOOP_EARLY_NS = 500_000
"""Timer "loop": a tick also sends what is due this soon (uvloop's timers resolve 1 ms)."""
RETIME_NS = WITHIN_NS
"""A send this late (or a 16th of its budget, if less) carries what is left of its budget, not
the budget it was encoded with; one less late, on schedule, is sent as encoded (a rewrite
copies the payload)."""


# -- the run -------------------------------------------------------------------------------------


class Replay:
    """Sends a Plan through a transport and records each end (see the module docstring)."""

    def __init__(self, plan: Plan, config: ReplayConfig) -> None:
        self.plan = plan
        self.config = config
        self.total = len(plan) * config.loops
        self.clock = time.perf_counter_ns
        self.start = 0
        self.next = 0
        self.outstanding = 0
        self.recorder = LatencyRecorder(0)
        self.late_sends = new_histogram()
        self.early_sends = new_histogram()
        self.on_schedule = 0
        self.retimed = 0
        """Sends late enough to carry less than their recorded budget (see `_retimed`)."""
        self.sent_early: dict[int, int] = {}
        self.tally = Tally()
        self.last_send_ns = 0
        self.last_answer_ns = 0
        """When the last successful answer (ok or late) came (0: none yet)."""
        self.transport: ReplayTransport | None = None
        self._done: asyncio.Future[None] | None = None
        self._idle: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._grpc = config.address()[0] == "grpc"
        self._loop: asyncio.AbstractEventLoop | None = None
        self.closed = False
        """The run is over (`close`): what is still outstanding stays unanswered."""

    def scheduled(self, rid: int) -> int:
        loop, index = divmod(rid, len(self.plan.offsets_ns))
        return self.start + loop * self.plan.span_ns + self.plan.offsets_ns[index]

    # -- sending ---------------------------------------------------------------------------------

    async def send_all(self, start_ns: int) -> None:
        """Send every request on schedule from `start_ns`; return after the last send."""
        self.start = start_ns
        self.recorder = LatencyRecorder(start_ns)
        loop = self._loop = asyncio.get_running_loop()
        self._done = loop.create_future()
        waker: Waker | None = None
        if self.config.timer == "thread":
            tick = functools.partial(self.tick, GROUP_NS)
            waker = Waker(loop, self._instants(), tick, failed=self._timer_failed)
            waker.start()
        else:
            self._timer = loop.call_later(0, self.tick)
        try:
            await self._done
        finally:
            if waker is not None:
                waker.stop()
            if self._timer is not None:
                self._timer.cancel()

    def _timer_failed(self, exc: BaseException) -> None:
        if self._done is not None and not self._done.done():
            self._done.set_exception(timer_failure(exc))

    def _instants(self) -> Iterator[int]:
        span = self.plan.span_ns
        for loop in range(self.config.loops):
            base = self.start + loop * span
            for offset in self.plan.offsets_ns:
                yield base + offset

    def tick(self, early_ns: int = 0) -> None:
        """Send every request due by now (+ `early_ns`)."""
        transport = self.transport
        assert transport is not None
        clock, send, sent = self.clock, transport.send, self.recorder.sent
        offsets, payloads, span = self.plan.offsets_ns, self.plan.payloads, self.plan.span_ns
        count, total, i = len(offsets), self.total, self.next
        now = clock()
        horizon = now + early_ns
        while i < total:
            loop, index = divmod(i, count)
            at = self.start + loop * span + offsets[index]
            if at > horizon:
                break
            error = now - at
            if error >= 0:
                record_us(self.late_sends, error // 1000)
                payload = self._sent_late(index, error, payloads[index])
            else:
                payload = payloads[index]
                record_us(self.early_sends, -error // 1000)
                self.sent_early[i] = now
            if -WITHIN_NS <= error <= WITHIN_NS:
                self.on_schedule += 1
            self.outstanding += 1
            sent(now)
            send(i, payload)
            i += 1
            now = clock()
        self.next = i
        self.last_send_ns = now
        if i >= total:
            if self._done is not None and not self._done.done():
                self._done.set_result(None)
        elif self.config.timer == "loop":
            self._loop_timer()

    def _sent_late(self, index: int, error_ns: int, payload: Any) -> Any:
        """`payload` of request `index` as it goes `error_ns` after its scheduled send: retimed
        (see `_retimed`) once that is late enough to matter, else as it is."""
        due = self.plan.dues_ns[index]
        if due is not None and error_ns >= min(RETIME_NS, due >> 4):
            return self._retimed(index, due - error_ns)
        return payload

    def _retimed(self, index: int, left_ns: int) -> Any:
        """Request `index`'s payload sent late, with `left_ns` of its budget left: carrying
        what is left (at least 1 µs, as `duetime bench` sends), so that its due time stays
        where the capture put it, its budget after the scheduled send.

        NOTE: the payload was sent as encoded, its whole budget: a send the replayer made late
        (stalled, behind its schedule) moved the server's due time later by the lag while the
        replay judged the answer late from the scheduled send (1 s behind: a 100 ms budget the
        server took as fresh, answered 200, and the replay counted late)."""
        plan = self.plan
        payload = plan.payloads[index]
        at = plan.timeout_at[index]
        if at < 0:
            return payload
        budget_us = max(1, left_ns // 1000)
        self.retimed += 1
        if self._grpc:
            return retimed_grpc(payload, budget_us)
        due = plan.dues_ns[index]
        assert due is not None
        return retimed_http(payload, at, due // 1000, budget_us)

    def waited(self, rid: int, payload: Any) -> Any:
        """Request `rid`'s payload as it goes after waiting for a free connection: retimed as a
        late send is, its wait taken from its budget."""
        index = rid % len(self.plan.offsets_ns)
        return self._sent_late(index, self.clock() - self.scheduled(rid), payload)

    def _loop_timer(self) -> None:
        wait_ns = self.scheduled(self.next) - LOOP_EARLY_NS - self.clock()
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(max(wait_ns / 1e9, 0.001), self.tick, LOOP_EARLY_NS)

    def stop(self) -> None:
        """Send nothing more (`next`, the count sent, stays as it is)."""
        self.total = self.next
        if self._done is not None and not self._done.done():
            self._done.set_result(None)

    # -- answers ---------------------------------------------------------------------------------

    def answered(
        self, rid: int, status: int, body: bytes | None, head: int | None, message: str | None,
        came: int | None = None,
    ) -> None:  # fmt: skip
        """Settle request `rid`: count its outcome and, with --compare-outputs, compare it.

        NOTE: nothing raised here may leave the request unsettled: the transports call this
        from their callbacks and swallow what it raises, so a fault (once: a malformed recorded
        BYTES output, raised while comparing) kept it outstanding, the run waited out the
        whole --drain and counted an error with no message. A fault settles it as an error
        saying what went wrong.

        NOTE: after `close` nothing is counted: closing the transport fails every request
        still owed with status 0, and these once replaced the unanswered (32 of 40 unanswered
        read "unanswered": 0, "statuses": {"0": 32}, and no warning)."""
        if self.closed:
            return
        # (an HTTP answer the pool knows came before it was read counts from then: see
        # `HttpPool.begin_turn`)
        now = self.clock() if came is None else came
        plan = self.plan
        loop, index = divmod(rid, len(plan.offsets_ns))
        began = self.start + loop * plan.span_ns + plan.offsets_ns[index]
        if self.sent_early:
            began = min(began, self.sent_early.pop(rid, began))
        latency = now - began
        if status == NO_CONNECTION:
            self._unsent(began, message)
        else:
            try:
                outcome = self._outcome(rid, index, latency, status, body, head, message)
            except Exception as exc:
                outcome = Outcome.ERROR
                self._error(index, f"the replay failed on its answer: {type(exc).__name__}: {exc}")
            self.recorder.ended(now, latency, outcome)
            if outcome == Outcome.OK or outcome == Outcome.LATE:
                self.last_answer_ns = now
        self.outstanding -= 1
        if self.next < self.total and self.scheduled(self.next) <= now and self._loop:
            # awake anyway: send what is due without waiting for the timer (once this
            # answer's connection is free again)
            self._loop.call_soon(self.tick)
        if self.outstanding == 0 and self._idle is not None and not self._idle.done():
            self._idle.set_result(None)

    def _unsent(self, began: int, message: str | None) -> None:
        """A request that never left: no connection to the target could be opened. Counted
        unsent, taken off the sends of its second (the first from its send on that has one:
        it was counted where it was sent, at or after `began`), neither an end nor a status.

        NOTE: these were counted sent, and errors with status 0, and the replay exited 0: a
        target that died mid-run read as a run that went through with some errors, where
        `duetime bench` says 'unsent' and exits 3."""
        tally = self.tally
        tally.unsent += 1
        if tally.unsent_message is None:
            tally.unsent_message = message
        sent = self.recorder.timeline.sent
        at = max(0, (began - self.recorder.start_ns) // self.recorder.interval_ns)
        while at < len(sent) - 1 and sent[at] <= 0:
            at += 1
        if at < len(sent):
            sent[at] -= 1

    def _outcome(
        self, rid: int, index: int, latency: int, status: int, body: bytes | None,
        head: int | None, message: str | None,
    ) -> Outcome:  # fmt: skip
        tally = self.tally
        tally.statuses[status] = tally.statuses.get(status, 0) + 1
        if status == 200:
            due = self.plan.dues_ns[index]
            if body is not None and self.plan.recorded[index] is not None:
                self._compare(rid, body, head)
            return Outcome.LATE if due is not None and latency > due else Outcome.OK
        outcome = Outcome.ERROR if status == NO_STATUS else outcome_of_http_status(status)
        if outcome == Outcome.ERROR:
            self._error(index, message or error_text(status, body or b""))
        return outcome

    def _error(self, index: int, text: str) -> None:
        tally = self.tally
        tally.errors += 1
        if len(tally.messages) < MAX_MESSAGES:
            tally.messages.append(f"request {index}: {text}")

    def _compare(self, rid: int, body: bytes, head: int | None) -> None:
        tally = self.tally
        loop, index = divmod(rid, len(self.plan.offsets_ns))
        recorded = self.plan.recorded[index]
        assert recorded is not None
        try:
            answer = grpc_outputs(body) if self._grpc else http_outputs(body, head)
        except Exception as exc:  # an answer we cannot read is a mismatch, not a crash
            tally.undecodable += 1
            if len(tally.messages) < MAX_MESSAGES:
                tally.messages.append(f"request {index}: answer not readable: {exc}")
            return
        try:
            difference = compare_outputs(recorded, answer, self.config.rtol, self.config.atol)
        except Exception as exc:  # (a recorded output that does not decode: BadField)
            tally.not_comparable += 1
            if len(tally.messages) < MAX_MESSAGES:
                tally.messages.append(
                    f"request {index}: not comparable, its recorded outputs do not read: {exc}"
                )
            return
        tally.compared += 1
        if difference is None:
            return
        tally.mismatched += 1
        # NOTE: the first in the capture's order, not in the order answers came: kept as they
        # came, answers out of order under load made "the first mismatches" 5, 6, 9, 7, 8 (or
        # left out a lower one once MAX_MISMATCHES were kept)
        kept = tally.mismatches
        if len(kept) < MAX_MISMATCHES or (loop, index) < (kept[-1].loop, kept[-1].index):
            mismatch = Mismatch(
                index, loop, self.plan.request_ids[index], difference.output,
                difference.max_abs_error, difference.problem,
            )  # fmt: skip
            bisect.insort(kept, mismatch, key=lambda m: (m.loop, m.index))
            del kept[MAX_MISMATCHES:]

    def close(self) -> None:
        """The run is over: the requests still outstanding stay unanswered."""
        self.stop()
        self.closed = True

    async def drained(self, timeout_s: float) -> None:
        if self.outstanding <= 0:
            return
        self._idle = asyncio.get_running_loop().create_future()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle, timeout_s)

    def snapshot(self) -> Snapshot:
        timeline = self.recorder.timeline
        return Snapshot(
            self.next, self.recorder.p99_us(), late=sum(timeline.late),
            rejected=sum(timeline.rejected), expired=sum(timeline.expired),
            errors=sum(timeline.errors),
        )  # fmt: skip


# -- running -------------------------------------------------------------------------------------


def run_replay(config: ReplayConfig, plan: Plan | None = None) -> ReplayResult:
    """Load (unless given) and replay on a fresh uvloop; never call from a running loop.
    Ctrl-C while sending stops the replay early: the result covers what was sent and says it
    was interrupted; Ctrl-C before sending starts raises KeyboardInterrupt.

    NOTE: the target is reached before the capture is read (only the cheap checks of the
    capture come first): a replay to a server that was not there once spent 33 s (and 1.35 GB)
    reading and encoding a 517 MiB capture before it said "cannot connect"."""
    loop = new_event_loop()
    interrupt = Interrupt()
    try:
        if plan is None:
            check_capture(config)
            interrupt.run(loop, reach_target(config))
            plan = load_plan(config)
        return interrupt.run(loop, replay_async(config, plan, interrupt))
    finally:
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()


async def reach_target(config: ReplayConfig) -> None:
    """Connect to the target and hang up; BenchError when it cannot be reached, or (HTTP) when
    it answers a GET in something that is not HTTP/1.1 (a gRPC port; see `why_not_http`).

    NOTE: a connection alone was taken for an HTTP server: a replay to a gRPC port sent the
    whole capture, each request failing ("malformed HTTP response"; found by a tester), where
    `duetime bench` stops at once, as this does now."""
    transport = _transport(config, _no_answers)
    try:
        await transport.open(1)
    except OSError as exc:
        raise BenchError(f"--target: {exc}") from None
    await transport.aclose()
    protocol, host, port = config.address()
    if protocol == "http" and (why := await why_not_http(host, port)) is not None:
        raise BenchError(f"--target {config.target}: {why}")


def _no_answers(
    rid: int, status: int, body: bytes | None, head: int | None, message: str | None,
    came: int | None = None,
) -> None:  # fmt: skip
    """`reach_target`'s transport sends nothing."""


async def replay_async(
    config: ReplayConfig, plan: Plan, interrupt: Interrupt | None = None
) -> ReplayResult:
    """Replay `plan` on the running loop; BenchError when the target cannot be reached.
    `interrupt.fire()` stops sending early."""
    interrupt = interrupt or Interrupt()  # never fired: the replay goes to its end
    replay = Replay(plan, config)
    transport = _transport(config, replay.answered, replay.waited)
    replay.transport = transport
    try:
        await transport.open(config.connections)
    except OSError as exc:
        raise BenchError(f"--target: {exc}") from None
    progress = Progress("duetime replay", replay.snapshot)
    try:
        start = replay.clock() + LEAD_NS
        expected_s = (config.loops * plan.span_ns) / 1e9
        if config.progress:
            progress.start(expected_s)
        cpu_before, wall_before = cpu_seconds(), time.perf_counter()
        interrupt.sending = True
        with paced_switching():
            if await interrupt.first(replay.send_all(start)):
                replay.stop()
        cpu_s, wall_s = cpu_seconds() - cpu_before, time.perf_counter() - wall_before
        await interrupt.drain(replay.drained(interrupt.drain_s(config.drain_s)))
    finally:
        progress.stop()
        replay.close()
        await transport.aclose()
    duration_s = max(replay.last_send_ns - start, 0) / 1e9 or plan.span_ns / 1e9
    # the rates count answers over the seconds they took, those after the last send included
    span_s = rate_span(duration_s, max(replay.last_answer_ns - start, 0) / 1e9)
    return result_of(
        replay, config, duration_s=duration_s, cpu_s=cpu_s, wall_s=wall_s,
        interrupted=interrupt.fired, span_s=span_s,
    )  # fmt: skip


def _transport(
    config: ReplayConfig, answered: Answered, waited: Callable[[int, bytes], bytes] | None = None
) -> ReplayTransport:
    protocol, host, port = config.address()
    if protocol == "grpc":
        return GrpcReplayTransport(f"{host}:{port}", answered, keep_bodies=config.compare_outputs)
    return HttpPool(
        host, port, answered, keep_bodies=config.compare_outputs,
        max_connections=config.max_connections, waited=waited,
    )  # fmt: skip


# -- command line --------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `duetime replay` flags."""
    parser.description = (
        "Send the requests of a capture (duetime serve --record, duetime bench --record) to a "
        "v2 server on their recorded schedule, open loop, and report latency from each "
        "scheduled send, how closely the schedule was kept, and (--compare-outputs) answers "
        "that differ from the recorded ones. Throughput and goodput are answers per second "
        "from the first scheduled send to the last answer (or the last send, if later)."
    )
    parser.epilog = (
        "exit status: 0 the replay went through; 1 the target failed (unreachable, not "
        "speaking --target's protocol, it answered none of the requests, or each one 404: it "
        "serves none of the capture's models), or an output "
        f"could not be written; 2 bad flags or capture; {EXIT_UNSENT} some requests could not "
        "be sent, records of the capture were skipped (they do not decode), or (--compare-outputs) "
        f"answers differ from the recorded ones; {EXIT_CODE} interrupted (Ctrl-C)"
    )
    parser.add_argument("capture", type=Path, metavar="FILE", help="the capture file")
    parser.add_argument(
        "--target", required=True, metavar="URL",
        help="http://HOST:PORT, grpc://HOST:PORT, or HOST:PORT with --protocol",
    )  # fmt: skip
    parser.add_argument("--protocol", choices=["http", "grpc"], help="default: --target's scheme")
    parser.add_argument(
        "--speed", type=float, default=1.0, help="time scale: 2 sends twice as fast (default 1)"
    )
    parser.add_argument(
        "--loop", type=int, default=1, metavar="N", help="replay the capture N times back to back"
    )
    parser.add_argument(
        "--compare-outputs", action="store_true",
        help="check each answer against the recorded outputs: floats within --rtol and "
        "--atol, integers, BOOL and BYTES exactly",
    )  # fmt: skip
    parser.add_argument(
        "--rtol", type=float, default=None,
        help="relative tolerance of float outputs (1e-5; with --compare-outputs)",
    )  # fmt: skip
    parser.add_argument(
        "--atol", type=float, default=None,
        help="absolute tolerance of float outputs (1e-6; with --compare-outputs)",
    )  # fmt: skip
    parser.add_argument(
        "--connections", type=int, default=8,
        help="HTTP connections opened first (more open when all are busy), or gRPC channels",
    )  # fmt: skip
    parser.add_argument(
        "--drain", type=float, default=10.0, help="seconds to wait for the last answers (10)"
    )
    parser.add_argument(
        "--timer", choices=["thread", "loop"], default="thread",
        help="what wakes each send: a timer thread (default, precise) or the loop's timers",
    )  # fmt: skip
    parser.add_argument("--json", type=Path, metavar="OUT", help="also write the result as JSON")
    parser.add_argument(
        "--report", type=Path, metavar="OUT", help="also write plots: OUT.html or OUT.png"
    )
    parser.add_argument(
        "--metrics", metavar="URL", help="the server's Prometheus /metrics (duetime: "
        "http://HOST:METRICS_PORT/metrics): the result then holds the batch sizes it ran, and "
        "a line says how many answers it counted late by its own clock, and why",
    )  # fmt: skip
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress line")


def config_from_args(args: argparse.Namespace) -> ReplayConfig:
    """The replay the flags describe; a tolerance given without --compare-outputs is warned of
    (it was taken in silence, comparing nothing: found by a tester)."""
    given = [flag for flag in ("rtol", "atol") if getattr(args, flag) is not None]
    if given and not args.compare_outputs:
        flags = " and ".join(f"--{flag}" for flag in given)
        console(
            f"duetime replay: {flags} take effect only with --compare-outputs; nothing is compared",
            logging.WARNING,
        )
    tolerances: dict[str, Any] = {flag: getattr(args, flag) for flag in given}
    return ReplayConfig(
        capture=args.capture, target=args.target, protocol=args.protocol, speed=args.speed,
        loops=args.loop, compare_outputs=args.compare_outputs, connections=args.connections,
        drain_s=args.drain, timer=args.timer, progress=not args.quiet, **tolerances,
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """`duetime replay`: 2 for bad flags or capture, 1 if the target fails (`reach_target`,
    or it answered none of the requests sent: `answered_none`, or each one 404: `served_none`),
    3 when some requests could not be sent (no connection: the target died or stopped
    listening), when records of the capture were skipped (they do not decode: the replay is
    not the whole capture), or when outputs differ, are unreadable, or a recorded answer was
    not answered 200 (with --compare-outputs).

    NOTE: skipped records once went unreported (a log line only): a damaged capture replayed
    19 of its 20 requests, said requests_in_capture 19, and exited 0."""
    try:
        config = config_from_args(args)
        check_output(args.json, "--json", reads=(args.capture,))
        check_output(args.report, "--report", reads=(args.capture,))
        check_apart(args.report, "--report", args.json, "--json")
        if args.report is not None and args.report.suffix.lower() not in (".html", ".png"):
            raise ConfigError(f"--report {args.report}: expected a .html or .png file")
        before = scrape(args.metrics) if args.metrics else None
        result = run_replay(config)
    except ConfigError as exc:
        console(f"duetime replay: {exc.message}")
        return 2
    except CaptureFormatError as exc:
        console(f"duetime replay: cannot read the capture: {exc}")
        return 2
    except BenchError as exc:
        console(f"duetime replay: {exc.message}")
        return 1
    except MissingHdr as exc:
        console(f"duetime replay: {exc}")
        return 1
    except KeyboardInterrupt:
        console("duetime replay: interrupted before sending started", logging.WARNING)
        return EXIT_CODE
    print(result.format())
    after = scrape(args.metrics) if args.metrics else None
    counted = counted_between(before, after)
    if before is not None and after is not None:
        print(late_line(counted.late))
    doc = result.to_json()
    if args.metrics:
        doc["batch_sizes"] = batch_sizes_json(counted.batches)
        doc["server_late"] = counted.late
    try:
        if args.json is not None:
            write_output(args.json, strict_json(doc), "--json")
            print(f"wrote {args.json}")
        if args.report is not None:
            from duetime.tools.hdr import RunReport
            from duetime.tools.plots import write_report

            make_parents(args.report, "--report")
            try:
                write_report([RunReport.from_json(doc, str(config.capture))], args.report)
            except OSError as exc:
                raise failed_write(args.report, "--report", exc) from None
            print(f"wrote {args.report}")
    except OutputError as exc:
        console(f"duetime replay: {exc.message}")
        return 1
    if doc["interrupted"]:
        return EXIT_CODE
    if answered_none(doc):
        return EXIT_TARGET_FAILED
    if served_none(doc):
        console(
            "duetime replay: the target answered every request 404 (NOT_FOUND): it serves none "
            "of the capture's models or versions"
        )
        return EXIT_TARGET_FAILED
    broken = doc["unsent"] or doc["skipped"] or compare_failed(doc["compare"])
    return EXIT_UNSENT if broken else 0


__all__ = ["Plan", "ReplayConfig", "ReplayResult", "add_arguments", "load_plan", "replay_async",
           "run", "run_replay"]  # fmt: skip
