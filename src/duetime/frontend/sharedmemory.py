"""Triton's system shared-memory extension: tensors passed through POSIX shared memory.

A client creates a shared-memory object (`shm_open`, e.g. with `tritonclient.utils.
shared_memory`), registers a window of it under a name (`key`, `offset`, `byte_size`), then names
that region in an input's or output's parameters (`shared_memory_region`,
`shared_memory_byte_size`, `shared_memory_offset` within the region) instead of sending the bytes.
duetime copies an input's bytes out of the region when it decodes the request (the client may reuse
the region as soon as the answer comes) and writes an output's bytes into its region when it
encodes the answer, which then carries the region and the byte count instead of the data: into the
region registered under that name when the request was taken in, as Triton's requests hold theirs
(see `SharedMemoryRegions.check`). The layout of the bytes is the binary tensor extension's (BYTES:
4-byte little-endian lengths before each element). An input's `shared_memory_byte_size` is checked
against what its datatype and shape need (where the decoder passes them to `read`) before anything
is read, and no input reads more than `max_read_bytes` (the server's: the larger of its HTTP body
and gRPC message limits; the copy is made on the event loop, while the request is decoded). Errors
begin with Triton's words for them and have its status codes (see `SharedMemoryRegions.register`
for where they differ). The bytes an input copies out are held against the server's in-flight
limits, as a request body's are, until its request ends: its front end charges them (see
`SharedMemoryRegions.charged`) and refuses a request whose bytes do not fit (`check_room`).

Regions are objects in `/dev/shm/<key>` (Linux); a key names an object there, never a path
elsewhere. They are read and written with `pread`/`pwrite`, not through a memory map: a client
may shrink its object after registering it, and a mapped page past the new end would kill the
whole server with SIGBUS on the next access; a read past the end is merely short (refused,
naming the region), and a write there grows the client's object again. The object is opened for
each access and closed after it, so a region holds no descriptor (one each let a client that
registered thousands of regions take the server to its descriptor limit, after which every new
connection was refused); an object removed or made again since it was registered is refused
(register it again). At most `REGIONS_MAX` regions are registered at once.

CUDA shared memory is not supported (no GPU path): its status lists no region, unregistering
has nothing to do and registering is refused (`CudaRegions`), so that a Triton client tidying up
at start finds nothing amiss.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from errno import ELOOP
from pathlib import Path
from stat import S_ISREG
from typing import Any, Protocol, TypeAlias

from duetime.datatypes import WIRE_DTYPE_OF
from duetime.errors import DuetimeError, InvalidInput, PayloadTooLarge, shown
from duetime.frontend import codec

SHM_ROOT = Path("/dev/shm")
REGION = "shared_memory_region"
BYTE_SIZE = "shared_memory_byte_size"
OFFSET = "shared_memory_offset"

READ_MAX_BYTES = 64 * 1024 * 1024
"""The most bytes one input may read from shared memory: as much as a request body (or gRPC
message) may carry by default. NOTE: reads run on the event loop, while the request is decoded;
without a bound, one request naming a sparse multi-GiB object stalled every client for seconds
and grew the server by the whole window."""

REGIONS_MAX = 4096
"""The most regions one server keeps registered; registering more is refused (unregister first).
A region costs a few hundred bytes and no descriptor."""

NAME_MAX_CHARS = 1024
"""The longest region name (so that `REGIONS_MAX` regions stay small)."""

SIZE_MAX = 2**64 - 1
"""The largest offset + byte size Triton can add up (a size_t); a bigger sum is refused as an
overflow, as Triton does."""


class RegionNotFound(DuetimeError):
    """No region of that name is registered: 404 / NOT_FOUND, as Triton answers."""

    http_status = 404
    grpc_code = "NOT_FOUND"


class RegionExists(InvalidInput):
    """A region of that name is registered already: 400 / ALREADY_EXISTS, as Triton answers."""

    grpc_code = "ALREADY_EXISTS"


class TooManyRegions(InvalidInput):
    """`REGIONS_MAX` regions are registered already: 400 / RESOURCE_EXHAUSTED."""

    grpc_code = "RESOURCE_EXHAUSTED"


class NoRoomToRead(DuetimeError):
    """An input's bytes in shared memory do not fit the server's in-flight limits beside what
    other requests hold now: 429 / RESOURCE_EXHAUSTED, with a Retry-After (see `check_room`)."""

    http_status = 429
    grpc_code = "RESOURCE_EXHAUSTED"


Reads: TypeAlias = Callable[[int, str], None]
"""What an input's bytes copied out of shared memory are charged to: called with their count
and the input (`where`) before they are read; raises NoRoomToRead where they do not fit."""


@dataclass(frozen=True, slots=True)
class _Region:
    name: str
    key: str
    offset: int
    byte_size: int
    path: Path
    identity: tuple[int, int]
    """The registered object's device and inode: an object of the same name made since is
    another one (tmpfs numbers inodes afresh, never reusing a freed one's number soon)."""

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "offset": self.offset,
                "byte_size": self.byte_size}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Window:
    """Where a tensor's bytes are: `byte_size` bytes at `offset` in region `region`."""

    region: str
    byte_size: int
    offset: int
    held: _Region | None = field(default=None, compare=False, repr=False)
    """The region registered under `region` when the request was taken in (`check` sets it),
    which an output is written to whatever happens to the name meanwhile."""


_UNCHARGED = nullcontext()


class SharedMemoryRegions:
    """The registered regions of one server (owned by the event loop; `write` may run on a
    thread that builds a big answer: each access opens a descriptor of its own)."""

    def __init__(
        self,
        root: Path = SHM_ROOT,
        max_read_bytes: int = READ_MAX_BYTES,
        max_regions: int = REGIONS_MAX,
    ) -> None:
        self._root = root
        self._max_read_bytes = max_read_bytes
        self._max_regions = max_regions
        self._regions: dict[str, _Region] = {}
        self._reads: Reads | None = None
        """What the inputs read now are charged to (see `charged`; None: nothing)."""

    def register(self, name: str, key: Any, offset: Any, byte_size: Any) -> None:
        """Register `byte_size` bytes at `offset` of the object `key` as region `name` (the
        values as a client sent them: each is checked). Errors begin with Triton's words for
        them and have its status codes, but for a key that cannot be opened (and, in `write`,
        an output window too small): 400, where Triton answers 500 INTERNAL, though the client
        is at fault."""
        if not isinstance(name, str) or not name or len(name) > NAME_MAX_CHARS:
            raise InvalidInput(
                "'region name' is necessary to register system shared memory region (a "
                f"non-empty string of at most {NAME_MAX_CHARS} characters)"
            )
        if name in self._regions:
            raise RegionExists(
                f"shared memory region '{name}' already in manager; unregister it first"
            )
        if len(self._regions) >= self._max_regions:
            raise TooManyRegions(
                f"shared memory region '{name}': {len(self._regions)} regions are registered, "
                f"the most this server keeps (REGIONS_MAX {self._max_regions}); unregister "
                "regions no longer used"
            )
        for wanted, value in (("key", key), ("byte_size", byte_size)):
            if value is None:
                raise InvalidInput(f"Shared memory register request has no '{wanted}' field")
        _check_count(offset, "offset")
        # (a region holds at least one byte: the range said 0 was allowed, and 0 was then
        # refused, found by a tester)
        _check_count(byte_size, "byte_size", least=1)
        path, identity = self._examine(name, key, offset, byte_size)
        self._regions[name] = _Region(name, key, offset, byte_size, path, identity)

    def unregister(self, name: str | None = None) -> None:
        """Forget region `name` (None or "": every region); an unknown name is not an error."""
        if name:
            self._regions.pop(name, None)
        else:
            self._regions.clear()

    def status(self, name: str | None = None) -> list[dict[str, Any]]:
        """Every region (`name` None or ""), or region `name`: RegionNotFound if there is none."""
        if not name:
            return [region.status() for region in self._regions.values()]
        region = self._regions.get(name)
        if region is None:
            raise RegionNotFound(
                f"Unable to find system shared memory region: '{name}' (not registered)"
            )
        return [region.status()]

    def read(
        self,
        window: Window,
        where: str,
        datatype: str | None = None,
        shape: tuple[int, ...] | None = None,
    ) -> memoryview:
        """The window's bytes, copied once into a new buffer: the `datatype` tensor of `shape`
        (when given: `byte_size` must be what they need) that an input names.

        Nothing is read from a window of the wrong size, or over `max_read_bytes` (the only
        bound on a BYTES tensor, or when the datatype and shape are not given)."""
        region, start = self._bounds(window, where)
        size = window.byte_size
        if datatype is not None and shape is not None and datatype in WIRE_DTYPE_OF:
            need = math.prod(shape) * WIRE_DTYPE_OF[datatype].itemsize
            if size != need:
                raise InvalidInput(
                    f"input byte size mismatch for {where}. Expected {need}, got {size} "
                    f"(shared_memory_byte_size must be the size of a {datatype} tensor of "
                    f"shape {list(shape)}; nothing was read)"
                )
        if size > self._max_read_bytes:
            raise PayloadTooLarge(
                f"{where}: shared_memory_byte_size {size} is over the {self._max_read_bytes}"
                "-byte limit of an input read from shared memory (as of one sent inline: the "
                "larger of --max-body-bytes and --max-grpc-message-bytes); give the size of the "
                "tensor itself, not of the whole region"
            )
        if self._reads is not None:
            self._reads(size, where)
        # NOTE: numpy's, at a multiple of codec.ALIGNMENT, so that the input is decoded without
        # another copy (a bytearray's data lies at a multiple of 16; see codec.ALIGNMENT)
        buffer = codec.aligned_empty(size).data
        done = 0
        with self._opened(region, os.O_RDONLY, where) as fd:
            while done < size:  # (one read stops at 2 GiB, or where the object now ends)
                count = os.preadv(fd, [buffer[done:]], start + done)
                if count == 0:
                    raise InvalidInput(
                        f"{where}: shared memory region '{region.name}' ends before its "
                        f"registered size: {done} of {size} bytes at offset {start} of object "
                        f"{region.key!r} (the object was shrunk; register it again)"
                    )
                done += count
        return buffer

    def write(self, window: Window, data: bytes | memoryview, where: str) -> None:
        """Write an output's bytes into `window` (as `check` returned it: into the region it
        holds)."""
        region, start = self._bounds(window, where)
        if len(data) > window.byte_size:
            # NOTE: 400: Triton answers 500 INTERNAL, though the client is at fault
            raise InvalidInput(
                f"shared memory size specified with the request for {where} "
                f"({window.byte_size} bytes) should be at least {len(data)} bytes to hold the "
                "results"
            )
        view = memoryview(data).cast("B")
        with self._opened(region, os.O_WRONLY, where) as fd:
            while view:
                written = os.pwrite(fd, view, start)
                view, start = view[written:], start + written

    def check(self, window: Window, where: str) -> Window:
        """The output `window`, holding the region its name registers now (to write the
        output to); InvalidInput or RegionNotFound if it is not inside a registered region.
        Called before the model runs.

        NOTE: the output then goes to that region even if the name is unregistered, or
        registered again for another object, while the model runs (Triton's requests hold
        the region's mapping, and an unregister waits for them to end). Looked up again at
        the write, an unregister in between failed the request after its run (404), and a
        name registered again for another object had the output written into that one,
        which may be another client's."""
        region, _ = self._bounds(window, where)
        return replace(window, held=region)

    @property
    def any_registered(self) -> bool:
        """Whether a region is registered (none: no input can read one, nothing to charge)."""
        return bool(self._regions)

    def charged(self, reads: Reads | None) -> AbstractContextManager[None]:
        """Charge the bytes the inputs read meanwhile to `reads` (None: to nothing): the front
        end's, around the decoding of one request, which holds them until the request ends.

        NOTE: uncharged, what requests copied out was held against no limit: 20 concurrent
        requests of 300-byte bodies, each naming a 60 MiB input, grew the server by 1 GiB
        under --max-inflight-bytes 64 MiB (found by a tester). Set for the call rather than
        passed down the decoders: a request is decoded whole within one call on the event
        loop (as `ReadTurn` marks the read that brought it); while no region is registered,
        nothing can be read, and the common request pays no more than a `with` (a charge costs
        1-2 µs)."""
        return self._charging(reads) if self._regions else _UNCHARGED

    @contextmanager
    def _charging(self, reads: Reads | None) -> Iterator[None]:
        before, self._reads = self._reads, reads
        try:
            yield
        finally:
            self._reads = before

    def close(self) -> None:
        self.unregister(None)

    def _examine(
        self, name: str, key: Any, offset: int, byte_size: int
    ) -> tuple[Path, tuple[int, int]]:
        """The path and identity (device, inode) of the object `key`, once it is checked to be
        one the window fits in."""
        # NOTE: a key of 995 nested lists was quoted whole: RecursionError, a 500 (a tester)
        quoted = f"'{key}'" if isinstance(key, str) else shown(key)
        unable = f"Unable to open shared memory region: {quoted} (region '{name}')"
        stem = key.lstrip("/") if isinstance(key, str) else ""
        if not stem or "/" in stem or "\0" in stem or stem in (".", ".."):
            raise InvalidInput(
                f"{unable}: the key must name a shared-memory object (like '/input0'), not a "
                "path (and hold no NUL character)"
            )
        path = self._root / stem
        try:
            fd = _open(path, os.O_RDWR)
        except OSError as exc:
            raise InvalidInput(f"{unable}: cannot open it: {_why(exc)}") from None
        try:
            stat = os.fstat(fd)
        finally:
            os.close(fd)
        if not S_ISREG(stat.st_mode):
            raise InvalidInput(f"{unable}: it is not a shared-memory object")
        size = stat.st_size
        if offset + byte_size > size:
            raise InvalidInput(
                f"failed to register shared memory region '{name}': invalid args: offset "
                f"{offset} + byte_size {byte_size} does not fit the {size}-byte object '{key}'"
            )
        return path, (stat.st_dev, stat.st_ino)

    @contextmanager
    def _opened(self, region: _Region, flags: int, where: str) -> Iterator[int]:
        """A descriptor of the region's object, for one access (closed after it); InvalidInput
        if the object is gone or is not the one registered, or the access fails."""
        try:
            fd = _open(region.path, flags)
        except OSError as exc:
            raise InvalidInput(
                f"{where}: shared memory region '{region.name}': cannot open its object "
                f"{region.key!r}: {_why(exc)} (removed since it was registered?)"
            ) from None
        try:
            stat = os.fstat(fd)
            if (stat.st_dev, stat.st_ino) != region.identity:
                raise InvalidInput(
                    f"{where}: shared memory region '{region.name}': object {region.key!r} is "
                    "not the one registered (it was removed and made again); register it again"
                )
            yield fd
        except OSError as exc:
            raise InvalidInput(
                f"{where}: shared memory region '{region.name}': {_why(exc)}"
            ) from None
        finally:
            os.close(fd)

    def _bounds(self, window: Window, where: str) -> tuple[_Region, int]:
        """The window's region and where the window starts in the region's object; the errors
        (and their order) are Triton's, with the details after them."""
        name, offset, size = window.region, window.offset, window.byte_size
        region = window.held or self._regions.get(name)
        if region is None:
            raise RegionNotFound(
                f"Unable to find shared memory region: '{name}' ({where}: not registered)"
            )
        if offset >= region.byte_size:
            raise InvalidInput(
                f"Invalid offset for shared memory region: '{name}' ({where}: "
                f"shared_memory_offset {offset} is not inside its {region.byte_size} bytes)"
            )
        if size > SIZE_MAX - offset:
            raise InvalidInput(
                f"Integer overflow detected: byte_size ({size}) + offset ({offset}) exceeds "
                f"maximum value ({SIZE_MAX}) for region '{name}' ({where})"
            )
        if offset + size > region.byte_size:
            raise InvalidInput(
                f"Invalid offset + byte size for shared memory region: '{name}' ({where}: "
                f"shared_memory_offset {offset} + shared_memory_byte_size {size} runs past its "
                f"{region.byte_size} bytes)"
            )
        return region, region.offset + offset


def window_of(parameters: Mapping[str, Any], where: str) -> Window | None:
    """The shared-memory window a tensor's parameters (plain values) name; None: none.

    NOTE: a byte size or offset without a region was ignored: a client that misspelt the
    region's key got its output inline, a 200, and read stale bytes from its region (found by
    a tester). Refused in the words of Triton's gRPC front end (its shared-memory extension
    calls it an error; its HTTP front end ignores it too)."""
    if REGION not in parameters:
        for key in (OFFSET, BYTE_SIZE):
            if key in parameters:
                raise InvalidInput(
                    f"'{key}' can not be specified without '{REGION}' parameter for {where} "
                    f"(its parameters name no region: is '{REGION}' misspelt?)"
                )
        return None
    region = parameters[REGION]
    size = parameters.get(BYTE_SIZE)
    offset = parameters.get(OFFSET, 0)
    if not isinstance(region, str) or not region:
        raise InvalidInput(f"{where}: '{REGION}' must be a region name")
    if size is None:
        raise InvalidInput(f"{where}: '{REGION}' needs '{BYTE_SIZE}'")
    _check_count(size, BYTE_SIZE, where)
    _check_count(offset, OFFSET, where)
    return Window(region, size, offset)


def output_window_of(
    parameters: Mapping[str, Any], name: str, binary_data: bool = False
) -> Window | None:
    """The shared-memory window output `name`'s parameters name (`window_of`); InvalidInput,
    in Triton's words, where they also ask for its top classes (`classification`) or, over
    HTTP (`binary_data`: the front end has that parameter), for it as binary data.

    NOTE: both were taken (a 200, as found by a tester): the classes' texts were written into
    the region, and a window sized for the output's values was refused as too small for them;
    `binary_data` was dropped. Triton refuses both (its HTTP front end the two, its gRPC one
    `classification`: gRPC has no `binary_data`)."""
    where = f"output '{name}'"
    window = window_of(parameters, where)
    if window is None:
        return None
    conflict = "classification" if "classification" in parameters else None
    if binary_data and parameters.get("binary_data") is True:
        conflict = conflict or "binary_data"
    if conflict is not None:
        raise InvalidInput(
            f"Output can't set both '{REGION}' and '{conflict}' ({where}: an output written "
            f"into shared memory is written as its values; ask for '{conflict}' without "
            f"'{REGION}')"
        )
    return window


def check_room(size: int, where: str, held: int, own: int, limit: int, setting: str) -> None:
    """NoRoomToRead unless `size` more bytes copied out of shared memory for `where` (an input)
    fit within `limit` (server setting `setting`: `INFLIGHT` or `CONNECTION_INFLIGHT`) beside
    the `held` bytes held now, `own` of them by the same request. As a request body, one
    request always fits where it holds all that is held."""
    others = held - own
    if others > 0 and held + size > limit:
        whose = "of its connection" if setting == CONNECTION_INFLIGHT else "of all connections"
        raise NoRoomToRead(
            f"{where}: its {size} bytes in shared memory do not fit beside the {others} bytes "
            f"other requests {whose} hold, within the {limit} bytes the server holds at once "
            f"(server setting {setting}, --{setting.replace('_', '-')}); retry once they are "
            "answered, or send smaller tensors",
            retry_after_s=1.0,
        )


INFLIGHT = "max_inflight_bytes"
CONNECTION_INFLIGHT = "max_connection_inflight_bytes"
"""The settings bounding the bytes requests hold (bodies, and what they read from shared
memory): of all connections, and of one."""


class Room(Protocol):
    """Where the server holds its requests' bytes within `max_bytes` (the HTTP front end's
    Intake: its big bodies, and what HTTP and gRPC requests read from shared memory)."""

    reserved: int
    max_bytes: int
    max_connection_bytes: int

    def release(self, size: int) -> None: ...


class HeldReads:
    """What one request read from shared memory (`take`, its `Reads`), held in `room` with
    the bytes of every request, and in `by_connection[connection]` with those of its
    connection's requests, until `release` (its request is over)."""

    __slots__ = ("_by_connection", "_connection", "_room", "size")

    def __init__(self, room: Room, by_connection: dict[str, int], connection: str) -> None:
        self._room = room
        self._by_connection = by_connection
        self._connection = connection
        self.size = 0

    def take(self, size: int, where: str) -> None:
        room, mine = self._room, self._by_connection.get(self._connection, 0)
        check_room(size, where, room.reserved, self.size, room.max_bytes, INFLIGHT)
        check_room(size, where, mine, self.size, room.max_connection_bytes, CONNECTION_INFLIGHT)
        room.reserved += size
        self._by_connection[self._connection] = mine + size
        self.size += size

    def release(self) -> None:
        size, self.size = self.size, 0
        if not size:
            return
        left = self._by_connection.pop(self._connection) - size
        if left:
            self._by_connection[self._connection] = left
        self._room.release(size)


def _open(path: Path, flags: int) -> int:
    # NOTE: O_NOFOLLOW as shm_open has it: a symbolic link in /dev/shm would otherwise let a
    # client have outputs written into (and inputs read from) any file the server can open
    return os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK)


def _why(exc: OSError) -> str:
    return "a symbolic link" if exc.errno == ELOOP else (exc.strerror or str(exc))


def _check_count(value: Any, field: str, where: str = "shared memory", least: int = 0) -> None:
    """Refuse `value` unless an integer from `least` to the protocol's uint64 maximum.

    NOTE: an integer past 2**64 in a JSON body is read as a float: "must be an integer
    >= 0, got 1.8446744073709552e+19" told a client its 2**64 was no integer; the range is
    named (the protocol's uint64; found by a tester)."""
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= SIZE_MAX:
        raise InvalidInput(
            f"{where}: '{field}' must be an integer from {least} to {SIZE_MAX}, got {shown(value)}"
        )


CUDA_UNSUPPORTED = (
    "CUDA shared memory is not supported: this server runs models on the CPU; register system "
    "shared memory instead (/v2/systemsharedmemory)"
)


class CudaRegions:
    """The CUDA shared-memory extension of a server without a GPU path: never any region (the
    interface of `SharedMemoryRegions`)."""

    def status(self, name: str | None = None) -> list[dict[str, Any]]:
        if name:
            raise RegionNotFound(
                f"Unable to find cuda shared memory region: '{name}' ({CUDA_UNSUPPORTED})"
            )
        return []

    def register(self, name: str, *_: Any) -> None:
        raise InvalidInput(
            f"failed to register CUDA shared memory region: '{name}', GPUs not supported "
            f"({CUDA_UNSUPPORTED})"
        )

    def unregister(self, name: str | None = None) -> None:
        """Nothing to forget."""


CUDA_REGIONS = CudaRegions()
