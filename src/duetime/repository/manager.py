"""ModelManager: keeps the served models in step with the repository on disk.

It loads a version (and its variants) in a worker thread, warms it up and profiles it, then
publishes it by swapping the registry's snapshot; the versions it replaces stop taking requests at
that instant, finish what is already queued on them, and are closed once drained. A version that
fails to load never replaces a working one: the versions already served stay, and the index
reports the failure and its reason.

Half-written files: a version is loaded only once every file it loads (model, variants, config)
has gone `stable_s` seconds without changing (size and modification time). A copy in progress
keeps touching its file, so it is picked up by a later poll, once complete; an explicit load
request waits for the files to settle. Copying into a hidden folder (`.tmp-3`) and renaming it to
the version number is atomic: a copy that stalls longer than `stable_s` is never loaded half
written. The rename does not change the files' modification times, so the version still waits
until its files are `stable_s` old: files written that long before the rename load at once.

NOTE: a folder that appeared by a rename cannot be told apart reliably from one being filled in
place. Its files older than the folder's last change would be the sign, but a file just created
in a folder (empty, being written) was older than that folder's change time in 1971 of 2000
tries (ext4, Linux 6.18: fine-grained time stamps), and other file systems need not update a
renamed folder's change time at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import re
import shutil
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Coroutine, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import ConfigDict, ValidationError, create_model

from duetime.config import (
    CONFIG_FILENAMES,
    ModelConfig,
    ServerSettings,
    TrafficConfig,
    describe_validation_error,
    find_config_file,
)
from duetime.errors import ConfigError, DuetimeError, InvalidInput, ModelNotFound, ModelUnavailable
from duetime.execution.affinity import lower_thread_priority, pin_current_thread
from duetime.execution.executor import abandon_with
from duetime.loops import in_thread
from duetime.repository.layout import (
    ModelSource,
    Scan,
    broken_links,
    folder_version,
    ignored_warning,
    is_hidden,
    misnamed_folders,
    model_file,
    model_folders,
    scan_model,
    scan_repository,
    shown_name,
    version_folder,
)
from duetime.repository.loader import FIELD_NAMES, LoadedModel, label_files, load_version
from duetime.repository.registry import (
    PRIMARY,
    Deployment,
    Registry,
    ServedModel,
    ServedVersion,
)
from duetime.repository.tritonconfig import FILENAME as PBTXT_FILENAME
from duetime.repository.tritonconfig import (
    TritonModelConfig,
    declared_filename,
    read_model_config,
    triton_field,
)
from duetime.routing.fit import unfit_traffic
from duetime.routing.traffic import plan_traffic

log = logging.getLogger("duetime.manager")
log_config = logging.getLogger("duetime.config")

ControlMode = Literal["none", "explicit", "poll"]

VARIANT_PROFILE_BUDGET_S = 0.5
"""Profiling time per variant: variants only take over when the primary cannot keep up."""

LAZY_RETRY_S = 1.0
"""With lazy loading, how often requests for a model whose load failed may try it again (the
others in between are refused with the failure at once). A retry reloads only if the model's
files or config changed since the failure, so this bounds a cheap check, not ORT loads."""

START_MARGIN_NS = 50_000_000
"""Files stamped before the server started, less this, count as present at start (taken as they
are). NOTE: file systems stamp files from a coarse clock that can lag `time.time_ns()` by a
tick, so a file written just after the start may carry a time just before it."""


@dataclass(frozen=True, slots=True)
class RepositoryOptions:
    """How the repository is watched and how many models it may keep loaded."""

    control_mode: ControlMode = "none"
    """`none`: load everything at start, no changes after; `explicit`: the repository API loads
    and unloads; `poll`: rescan every `poll_s` and apply what changed (as Triton)."""
    poll_s: float = 5.0
    stable_s: float = 1.0
    """A version's files must be unchanged this long before they are loaded."""
    startup_models: tuple[str, ...] = ()
    """Explicit mode: models to load at start (`*`: all). A name that is not a model folder of
    the repository fails the start (ConfigError); a model that is there but fails to load is
    logged and shown in the index, and the server starts (as Triton with `--exit-on-error
    false`, and as the other modes treat a broken model). Other modes ignore it, with a
    warning (Triton: it only takes effect in explicit mode)."""
    max_loaded_models: int | None = None
    max_loaded_bytes: int | None = None
    """Budget on the model files loaded, counted once per instance (ORT's memory for a model is
    roughly its weights per session); the least recently used idle model is unloaded to stay
    within it, once the model that needs the room serves (a load that fails unloads none), so
    a load may exceed either budget by the model it loads while it runs."""
    lazy: bool = False
    """Load a model on its first request instead of at start."""
    strict_readiness: bool = True
    """As Triton's `--strict-readiness`: the server is ready only while no model of the
    repository has failed to load with nothing serving it (the v2 protocol's server ready: "all
    the models are ready"); off, it is ready once it serves (or can load) models."""
    drain_s: float = 30.0
    """How long a replaced or unloaded version may take to finish its queued requests."""
    max_run_memory_bytes: int | None = None
    """The most a request's values may ask one node of a model to allocate (see
    loader.load_version); None: a quarter of the machine's memory."""

    def __post_init__(self) -> None:
        """The mistakes that would pass unseen: a mode that is none of the three (it acted as
        `none`), one name as a string (read as one name per letter); and the options a server
        setting gives, by that setting's rules (see `_SETTING_OF`): ConfigError naming the
        option."""
        if self.control_mode not in get_args(ControlMode):
            raise ConfigError(
                f"repository options: field 'control_mode': expected one of "
                f"{', '.join(get_args(ControlMode))}, got {self.control_mode!r}"
            )
        if isinstance(self.startup_models, str | bytes):
            raise ConfigError(
                f"repository options: field 'startup_models': expected a sequence of model "
                f"names, got the string {self.startup_models!r} (write ({self.startup_models!r},))"
            )
        try:
            _OPTION_RULES.model_validate({option: getattr(self, option) for option in _SETTING_OF})
        except ValidationError as exc:
            raise ConfigError(describe_validation_error("repository options", exc)) from None


_SETTING_OF = {
    "poll_s": "repository_poll_secs",
    "stable_s": "repository_stable_secs",
    "max_loaded_models": "max_loaded_models",
    "max_loaded_bytes": "max_loaded_bytes",
    "lazy": "lazy_load",
    "strict_readiness": "strict_readiness",
    "drain_s": "unload_drain_secs",
    "max_run_memory_bytes": "max_run_memory_bytes",
}
"""The repository options a server setting gives (see server.repository_options) -> that
setting: an option is checked by its setting's rules, in process as from the CLI.

NOTE: only `control_mode` and `startup_models` were checked in process: `poll_s=0` rescanned
the repository without a pause (a core busy while idle), `max_loaded_models=0` served no model,
`lazy="yes"` made `Engine.ready` the string 'yes' (found by a tester)."""

_RULES: dict[str, Any] = {
    option: (ServerSettings.model_fields[setting].annotation, ServerSettings.model_fields[setting])
    for option, setting in _SETTING_OF.items()
}
_OPTION_RULES = create_model(
    "RepositoryOptions",
    # (strict: in process, values come as Python objects, not as the CLI's text to convert)
    __config__=ConfigDict(strict=True, allow_inf_nan=False),
    **_RULES,
)


@dataclass(slots=True)
class VersionState:
    """What the repository index says of one version."""

    state: Literal["READY", "LOADING", "UNLOADING", "UNAVAILABLE"]
    reason: str = ""
    failed: bool = False
    """Its last load failed (UNAVAILABLE: `reason` says why)."""


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """What a loaded version was made from; any change to it means a reload."""

    files: tuple[tuple[str, int, int, int, int], ...]
    """(name, size, modification time in ns, inode, change time in ns) of each file the version
    loads (see `fingerprint`)."""
    config: str
    """Digest of the config the version was loaded with."""

    @property
    def newest_ns(self) -> int:
        """The latest modification time: what the settle rule waits on (a rename keeps it)."""
        return max(mtime for _, _, mtime, _, _ in self.files)


REMOVED = "its folder was removed from the repository"
"""The reason given for a version unloaded because its folder went away: the one row the index
keeps of a folder that is gone (rows of failures or unloads there would only be stale)."""
STILL_SERVES = "a new load failed, the previous one still serves: "
"""The reason a serving version's row gives after a load of its model failed (then the why)."""
FILE_REMOVED = "its model file was removed from its version folder"
"""As REMOVED, where the version's folder is still there but holds no model file.

NOTE: it said the folder was removed, though the folder was still there (found by a tester)."""
UPLOADED = "the model's uploaded files serve in place of its folder until it is unloaded"
"""The reason given for a version of the repository's folder an upload took the place of."""

REPLACED_UPLOAD = "the model's files were uploaded again without this version"
"""The reason given, while it drains, for a version of an upload that a later upload lacks."""

IndexEntry = dict[str, str]
"""One row of the repository index: name, and version, state, reason where known."""


class _LoadFailed(ModelUnavailable):
    """A load the model's files or config rule out (not one that waits for files being
    written): the requests it would have served are told the model is unavailable, and an
    explicit load, as in Triton, that its request failed (400)."""


@dataclass(frozen=True)
class _IndexRecord:
    """What the index and the registry said of a model before a load (see `_index_record`)."""

    name: str
    states: dict[str, VersionState]
    error: str | None
    served: dict[str, ServedVersion]
    absent: dict[str, str] | None
    """The versions its version_policy named that have no folder (see `_note_absent`)."""


def load_failed(name: str, detail: str, *, polled: bool = True) -> str:
    """A failed load's message: Triton's start, then duetime's `detail` of what went wrong.

    `polled=False`: the model could not be read at all (no folder of that name, its config or
    the load request's files unusable), where Triton says "failed to load 'x', failed to poll
    from model repository"; else a version (or the room for it) failed, where it says "failed
    to load 'x'" or "load failed for model 'x'". Its example clients and QA tests look for
    these words (`assertIn("failed to load 'unknown_model', failed to poll from model
    repository", ...)`)."""
    start = f"failed to load '{name}'"
    if not polled:
        start += ", failed to poll from model repository"
    return f"{start}: {detail}"


OVERRIDE = "load parameter 'config'"
"""What a load request's config override is called in its errors (as the endpoints call it)."""
UPLOADED_CONFIG = "the 'config' the model's files were uploaded with"
"""What an upload's config is called in the errors of a later load without one."""


@dataclass(frozen=True, slots=True)
class _Given:
    """A config a load uses in place of the model's config file (or read from its config.pbtxt:
    see `_named`), and what its errors call it."""

    config: ModelConfig
    source: str


_NOT_IN_NAMES = "/\0" if os.sep == "/" else "/\\:\0"
"""What a model name cannot hold: a path separator (a backslash is one only on Windows: a
folder `a\\b` is a model of that name elsewhere, as in Triton), or NUL."""


NAME_MAX_BYTES = 255
"""The longest folder name, in bytes of the file system's encoding (UTF-8): NAME_MAX of Linux's
file systems (ext4, xfs, btrfs, tmpfs)."""


def check_model_name(name: str) -> str:
    """`name` if it can only name a folder directly under the repository; InvalidInput if not."""
    if (
        not isinstance(name, str)  # (5 was an AttributeError from deep in the check)
        or not name
        or name in (".", "..")
        or is_hidden(name)
        or any(c in name for c in _NOT_IN_NAMES)
    ):
        raise InvalidInput(
            f"model name {name!r} is not valid: expected a folder name directly under the "
            f"model repository (no {' or '.join(map(repr, _NOT_IN_NAMES.strip(chr(0))))}, no "
            "leading '.')"
        )
    # NOTE: counted in bytes, not characters: 'é' * 130 (260 bytes) passed a limit of 255
    # characters, and the file system's 'File name too long' came back as a 500
    try:
        # NOTE: strict UTF-8, not os.fsencode: its surrogateescape took '\udcff', a JSON
        # request's escape, to the folder named by the byte 0xff (see `misnamed_folders`)
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:  # (a lone surrogate: it names no model)
        size = -1
    if not 0 <= size <= NAME_MAX_BYTES:
        problem = "it is not valid Unicode" if size < 0 else f"it is {size} bytes long"
        raise InvalidInput(
            f"model name {name!r} is not valid: expected a folder name directly under the "
            f"model repository, at most {NAME_MAX_BYTES} bytes in UTF-8 ({problem})"
        )
    return name


class ModelManager:
    """Loads, reloads and unloads models of one repository; the repository API's backend."""

    def __init__(
        self,
        root: Path,
        options: RepositoryOptions,
        registry: Registry,
        deploy: Callable[[LoadedModel, str, bool], Deployment],
        *,
        loader_cpus: frozenset[int] | None = None,
        python_words: bool = False,
    ) -> None:
        self.root = root
        self.options = options
        self._python_words = python_words
        """`options` came from Python (an Engine's `open()` or `start()`), not from server
        settings: errors and warnings about them name the options, not the CLI's flags."""
        self._registry = registry
        registry.load_failure = self._load_failure
        registry.on_demand = self._on_demand
        self._deploy = deploy
        # NOTE: loading (graph optimisation, warm-up, a second of profiling) runs on one thread
        # kept off the event loop's CPU and below the serving threads' priority, so a reload
        # under traffic takes spare cycles instead of the loop's.
        self._abandoned = threading.Event()
        """Set as the manager closes: the load running then stops at its next run."""
        self._loader = ThreadPoolExecutor(
            1, "duetime-loader", initializer=_background_thread,
            initargs=(loader_cpus, self._abandoned),
        )  # fmt: skip
        self._states: dict[str, dict[str, VersionState]] = defaultdict(dict)
        self._model_errors: dict[str, str] = {}
        self._cleared: set[str] = set()
        """Models whose error (`_model_errors`) was cleared as their config and folder were read
        again: their next version ready says so at the error's level (see `_load_version`)."""
        self._fingerprints: dict[tuple[str, str], Fingerprint] = {}
        self._niced: set[tuple[str, str]] = set()
        """(model, version) loaded as a shadow only, its instances in the background."""
        self._failed: dict[tuple[str, str], tuple[Fingerprint, str]] = {}
        """(model, version) -> what a failed load was made from, and why it failed: watcher and
        lazy loads try such a version again only once its files or config change."""
        self._degraded: dict[tuple[str, str], str] = {}
        """(model, version) -> the variants that did not load with it (the index says so)."""
        self._retry_at: dict[str, float] = {}
        """Lazy loading: model -> when (monotonic s) a request may next retry its failed load."""
        self._warned_unfit: dict[str, str] = {}
        """Model -> what its last load said of weighted versions unlike each other and of
        shadows that cannot take their copies (see `unfit_traffic`): said once, not at every
        poll."""
        self._warned: dict[str, str] = {}
        """Model -> the last warning about its traffic config (said once, not at every poll)."""
        self._config_warned: dict[str, str] = {}
        """Model -> the digest of the config file whose warnings were said (once per content,
        not at every poll)."""
        self._unread_configs: dict[str, str] = {}
        """Model -> the warning that files meant as its config are not read (see
        `unread_config_warning`), which its served versions give as their reason in the index."""
        self._ignored: dict[str, str] = {}
        """Model -> the warning that folders of it holding its model file are no version (see
        `ignored_warning`): said once, and given by its served versions as their reason in the
        index."""
        self._absent: dict[str, dict[str, str]] = {}
        """Model -> the versions its `specific` version_policy names that have no folder, each
        with the reason the index gives (said once in the log, not at every poll)."""
        self._started_ns = 0
        self._uploads: dict[str, Path] = {}
        """Model -> the folder its uploaded files form (in a temporary directory of its own),
        served in place of its folder in the repository until it is unloaded."""
        self._upload_configs: dict[str, ModelConfig] = {}
        """Model -> the config its uploaded files came with (or a later load's override): the
        config of the folder they form, which has no config file of its own. A config override
        of a model served from the repository is no entry here: it applies to its load alone."""
        self._locks: dict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._loads: set[asyncio.Task[None]] = set()
        """Loads running (see `load`: their callers may have stopped waiting)."""
        self._written: list[Path] = []
        """Every upload folder written, removed again once the loader thread has ended at
        `aclose` (see there)."""
        self._retiring: dict[asyncio.Task[None], ServedVersion] = {}
        """Drains (and closes) running in the background -> the version each closes (see
        `aclose`, which cuts them short)."""
        self._poller: asyncio.Task[None] | None = None
        self._broken_links: dict[str, str] = {}
        """Entries of the repository that are symbolic links to nothing (see `_warn_links`)."""
        self._unreadable: str | None = None
        """Why the last poll could not list the repository (None: it could): said once."""
        self._load_s: dict[str, float] = {}
        self._bytes: dict[str, int] = {}
        self._loading: dict[str, int] = {}
        """Models being loaded, not served yet -> their bytes: counted in the budget as loaded
        (see `_make_room`)."""
        self._evicting: dict[str, list[tuple[str, str]]] = {}
        """Models being loaded -> the models to unload once they serve, and the budget each is
        unloaded for (see `_make_room`)."""

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Load what the control mode loads at start; in poll mode, start watching.

        ConfigError for a startup model (`--load-model`) that is not a model folder of the
        repository: a typo would otherwise start a server without the model, without a word."""
        self._started_ns = time.time_ns() - START_MARGIN_NS
        scan = scan_repository(self.root, declared_filename)
        self._warn_links()
        names = [source.name for source in scan.models]
        wanted = self.options.startup_models
        if self.options.control_mode == "explicit":
            # NOTE: only the models asked for load, and only they can fail: a folder nobody
            # asked to load (`staging/`, no version yet) made the server unready while every
            # model asked for served. Triton's strict readiness counts the models with a
            # state; one never loaded has none (its load request gets the reason).
            everything = sorted([*names, *scan.errors])
            names = everything if "*" in wanted else self._startup_models(wanted, scan)
            if self.options.lazy:  # (requests for models not loaded got 404, without a word)
                self._warn_ignored("lazy", wanted)
        else:
            if wanted:
                self._warn_ignored("startup_models", wanted)
            if self.options.lazy:
                names = []
            for name, reason in scan.errors.items():  # (every folder is meant to load)
                self._fail_model(name, reason)
        for name in names:
            with contextlib.suppress(DuetimeError):
                await self.load(name, explicit=False, settle=False)
        if self.options.control_mode == "poll":
            self._poller = asyncio.get_running_loop().create_task(self._poll_forever())

    def _warn_ignored(
        self, option: Literal["lazy", "startup_models"], wanted: Iterable[str]
    ) -> None:
        """Warn that `option` has no effect in this control mode, named as its giver names it:
        a server's flag, or an Engine's option (see `_python_words`)."""
        if not self._python_words:
            if option == "lazy":
                log.warning(
                    "--lazy-load is ignored: with --model-control-mode explicit, models load "
                    "through the repository API (and --load-model at start), never on a request"
                )
            else:
                # (named as DUETIME_LOAD_MODEL too where that is set: it named the flag alone
                # for a variable's models, found by a tester)
                given = "DUETIME_LOAD_MODEL" if "DUETIME_LOAD_MODEL" in os.environ else None
                log.warning(
                    "%s %s is ignored: it only takes effect with "
                    "--model-control-mode explicit (this server runs with %s%s)",
                    "--load-model" if given is None else f"--load-model ({given})",
                    " ".join(wanted), self.options.control_mode,
                    ", --lazy-load" if self.options.lazy else "",
                )  # fmt: skip
        elif option == "lazy":
            log.warning(
                "repository options: lazy=True is ignored: with control_mode='explicit', models "
                "load through load_model (and startup_models at start), never on a request"
            )
        else:
            log.warning(
                "repository options: startup_models=%r is ignored: it only takes effect with "
                "control_mode='explicit' (these options have control_mode=%r%s)",
                tuple(wanted), self.options.control_mode,
                ", lazy=True" if self.options.lazy else "",
            )  # fmt: skip

    def _startup_models(self, wanted: Iterable[str], scan: Scan) -> list[str]:
        """`wanted`, each checked to be a model folder of the repository (ConfigError if not).

        NOTE: an Engine's unknown `startup_models` name was refused as "server settings: field
        'load_model' (--load-model 'x')", a setting and a flag its caller never gave (found by
        a tester): it is named as the caller gave it."""
        found = {source.name for source in scan.models} | set(scan.errors)
        names = []
        for name in wanted:
            if self._python_words:
                field = f"repository options: field 'startup_models' ({name!r})"
            else:
                field = f"server settings: field 'load_model' (--load-model {name!r})"
            try:
                check_model_name(name)
            except InvalidInput as exc:
                raise ConfigError(f"{field}: {exc.message}") from None
            if name not in found:
                known = ", ".join(repr(n) for n in sorted(found)) or "none"
                raise ConfigError(
                    f"{field}: no model folder of that name in the repository {self.root}; "
                    f"models there: {known}"
                )
            names.append(name)
        return names

    async def aclose(self, grace_s: float) -> None:
        """Stop watching, end the loads still running (rolled back), and let retiring versions
        drain for up to `grace_s`: those still draining then are closed at once, their queued
        requests failed (ModelUnavailable), as the engine fails its served versions' at the
        end of its grace.

        NOTE: their drains were awaited whole, bounded by --drain-s alone (30 s): the engine's
        `aclose(grace_s=0.2)` after an unload with 30 requests of 200 ms queued took 7.8 s."""
        self._abandoned.set()
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
        loads = list(self._loads)
        for task in loads:
            task.cancel()
        await asyncio.gather(*loads, return_exceptions=True)
        if self._retiring:
            draining = dict(self._retiring)
            _, late = await asyncio.wait(draining, timeout=grace_s)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
            # (a drain cancelled half-way closed nothing: its queue is failed, its sessions
            # closed, here)
            await asyncio.gather(*(_close(draining[task]) for task in late))
        self._stop_loader()

    def abandon(self) -> list[Deployment]:
        """Stop at once, without the loop (an engine whose loop ended without closing it): no
        more loads, the loader's queue dropped; the variants of versions still retiring, whose
        sessions the caller closes (their drains ended with the loop)."""
        self._abandoned.set()
        retiring = [d for version in self._retiring.values() for d in version.variants]
        self._retiring.clear()
        self._stop_loader()
        return retiring

    def _stop_loader(self) -> None:
        """End the loader thread's queue (a load under way finishes in the background) and
        remove the uploaded models' folders."""
        self._loader.shutdown(wait=False, cancel_futures=True)
        for name in list(self._uploads):
            _remove_upload(self._uploads.pop(name))
        # NOTE: a load still running in the loader thread (ORT cannot be interrupted) went on
        # after its upload's folder was removed, and ORT saving its optimised graph made the
        # folders again (an empty `.duetime-cache`, left in the temp directory): once that
        # thread ends, every upload folder written is removed again (not waited for here)
        written, self._written = self._written, []
        if written:
            threading.Thread(
                target=_sweep_uploads, args=(self._loader, written), daemon=True,
                name="duetime-upload-sweep",
            ).start()  # fmt: skip

    def _warn_links(self) -> None:
        """Warn (once each) of the symbolic links in the repository that lead nowhere: a model
        folder on a mount that is gone would otherwise go unserved without a word. Not a model
        that failed to load: such a link may be anything (readiness is left alone)."""
        with contextlib.suppress(OSError):
            found = broken_links(self.root)
            for name, broken in sorted(found.items()):
                if self._broken_links.get(name) != broken:
                    log.warning(
                        "model repository %s: %s is %s; if it is meant as a model folder, it is "
                        "not served", self.root, name, broken,
                    )  # fmt: skip
            self._broken_links = found

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self.options.poll_s)
            try:
                await self.poll()
            except Exception:  # a bug of ours must not end the watching
                log.exception("repository poll failed")

    async def poll(self) -> None:
        """Apply what changed on disk: new models and versions, changed files, removed models.

        A version that failed to load is tried again once its files or config change (not at
        every poll: the same error each time, and ORT reading the whole file to say so)."""
        # NOTE: what serves follows the folders alone, an upload included: counted as on disk,
        # an upload outlived the removal of its model's folder, and polling refuses unloads.
        # (The engine refuses uploads while polling, as Triton refuses loads.)
        # NOTE: a repository that cannot be listed (its folder removed, a network mount gone)
        # logged a full traceback at every poll; it is said once, and what serves goes on
        # serving as it is (as Triton, whose poll fails and changes nothing): a mount that
        # comes back must not find every model unloaded. A folder that is there but empty
        # is a change like any other, and unloads what it no longer holds.
        try:
            on_disk = {p.name for p in model_folders(self.root)}
            misnamed = misnamed_folders(self.root)
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
            if self._unreadable != reason:
                log.error(
                    "model repository %s cannot be read (%s): the models served go on serving "
                    "as they are, and the poll looks again every %g s",
                    self.root, reason, self.options.poll_s,
                )  # fmt: skip
            self._unreadable = reason
            return
        if self._unreadable is not None:
            log.info("model repository %s can be read again: polling resumes", self.root)
            self._unreadable = None
        self._warn_links()
        snapshot = self._registry.snapshot
        served = set(snapshot.models)
        for name in sorted(served - on_disk):
            await self.unload(name, reason=REMOVED)
        known = set(self._states) | set(self._model_errors) | set(snapshot.failures)
        for name in sorted(known - on_disk - served - misnamed.keys()):
            self._forget(name)
        for name, reason in misnamed.items():  # (no load can name them: refused here)
            self._fail_model(name, reason)
        # NOTE: lazily, a model is loaded on its first request; the poll keeps the served ones
        # in step, and retries those a request tried to load and failed (once their files
        # change), so a fixed model serves without waiting for a request to retry it.
        failed = set(snapshot.failures)
        candidates = on_disk if not self.options.lazy else on_disk & (served | failed)
        for name in sorted(candidates):
            try:
                await self.load(name, explicit=False)
            except DuetimeError:
                pass
            except Exception:
                # NOTE: a bug of ours in one model's load (a RecursionError from a deep config
                # once) ended the whole poll at that model, every poll: models after it never
                # loaded, nor did their changes
                log.exception("repository poll: model %s failed", name)

    # -- load and unload -----------------------------------------------------------------------

    async def load(
        self,
        name: str,
        *,
        config: ModelConfig | None = None,
        files: Mapping[str, bytes] | None = None,
        explicit: bool = True,
        settle: bool = True,
    ) -> None:
        """Bring `name` in step with its folder, with `config` in place of its config file for
        this load, if given: a later load without one reads the config file again, as Triton's
        (its lifecycle test `test_config_override`: "request without additional config will load
        with default config"). Explicit loads wait for files still being written and raise the
        reason when the model cannot be served; watcher loads record it in the index. The
        loads at start (`settle=False`) take the repository as it is.

        `files` (path in the model's folder -> content, with `config`: Triton's load with
        `file:` parameters) form a folder of their own that is served in place of the
        repository's until the model is unloaded, with `config` as its config file (kept for
        later loads, until another load's `config` replaces it).

        An explicit load is all or nothing, as Triton's: one that fails (a version that cannot
        load, files that never settle) serves none of the versions it loaded and drops its
        `config` and `files`; what served before serves on (an upload of a name with no folder
        in the repository leaves it unknown, and the server ready). Watcher and lazy loads
        serve what loaded (a broken new version does not hold back a good one).

        A load once asked for runs to its end whatever its caller does, as Triton's gRPC
        handler finishes a load whatever its client does: cancelling the caller (a client's
        deadline, `asyncio.wait_for`) only stops it waiting. `aclose` ends the loads still
        running, rolling each back."""
        # NOTE: cancelled half-way (a gRPC client's deadline cancels its handler, which awaited
        # this), a load was neither finished nor rolled back: the index said LOADING for good
        # and no longer listed the version still serving, and the cancelled upload and config
        # stayed installed, so the next plain load served them
        task = asyncio.get_running_loop().create_task(
            self._load(name, config=config, files=files, explicit=explicit, settle=settle)
        )
        self._loads.add(task)
        task.add_done_callback(self._load_ended)
        await asyncio.shield(task)

    def _load_ended(self, task: asyncio.Task[None]) -> None:
        self._loads.discard(task)
        if not task.cancelled():
            task.exception()  # (retrieved: a caller that gave up heard nothing of it)

    async def _load(
        self,
        name: str,
        *,
        config: ModelConfig | None,
        files: Mapping[str, bytes] | None,
        explicit: bool,
        settle: bool,
    ) -> None:
        """`load`'s work, in a task of its own (see `load`)."""
        check_model_name(name)
        if files and config is None:
            raise InvalidInput(
                load_failed(
                    name,
                    "uploaded files need a 'config' too (they form the whole model folder, as "
                    "in Triton)",
                    polled=False,
                )
            )
        if files and len(files) > MAX_UPLOAD_FILES:
            raise InvalidInput(
                load_failed(
                    name,
                    f"{len(files)} uploaded files ('file:' load parameters), over the limit of "
                    f"{MAX_UPLOAD_FILES}: upload the model folder's files alone (a version's "
                    "model and its external data), or put the model in the repository",
                    polled=False,
                )
            )
        upload = await asyncio.to_thread(_write_upload, name, files) if files else None
        if upload is not None:
            self._written.append(upload)
        async with self._locks[name]:
            previous = self._uploads.get(name), self._upload_configs.get(name)
            before = self._index_record(name)
            if upload is not None:
                self._uploads[name] = upload
            # NOTE: an override of a model served from its folder was kept for every later
            # load: a plain load, even after an edit of the config file, served the override
            # until an unload. It applies to its own load now; an upload's stays with its files.
            if config is not None and name in self._uploads:
                self._upload_configs[name] = config
            uploaded = self._upload_configs.get(name)
            given = (
                _Given(config, OVERRIDE) if config is not None
                else _Given(uploaded, UPLOADED_CONFIG) if uploaded is not None
                else None
            )  # fmt: skip
            try:  # (uploaded files are whole already: no waiting for them to settle)
                await self._sync(name, explicit, settle and upload is None, given)
            except asyncio.CancelledError:  # (only `aclose` cancels a load: roll it back)
                if not self._changed(before):
                    self._restore(name, *previous)
                    self._restore_index(name, before, "the load was cancelled: shutting down")
                if upload is not None and self._uploads.get(name) is not upload:
                    _remove_upload(upload)
                raise
            except DuetimeError as exc:
                if upload is not None:
                    # NOTE: a file of the upload was named by the temporary folder it was
                    # written to ('/tmp/duetime-upload-x/m/1/model.onnx: ONNX Runtime cannot
                    # load it'), which the client never saw; it is named by its load parameter
                    # (found by a tester)
                    exc.message = exc.message.replace(f"{upload}/", "file:")
                    exc.args = (exc.message,)
                if (upload is not None or config is not None) and not self._changed(before):
                    # what the request brought left no trace: the folder and config that
                    # served before serve on, and later plain loads read them again
                    self._restore(name, *previous)
                    self._restore_index(name, before, exc.message)
                elif explicit and before.served and not self._changed(before):
                    # NOTE: only loads with an upload or config said so: what still served
                    # kept the reason of an earlier failed load (its override's version_policy)
                    # after a plain load failed on another cause (a broken new version)
                    self._still_serving(name, before, exc.message)
                if upload is not None and self._uploads.get(name) is not upload:
                    _remove_upload(upload)
                if explicit and isinstance(exc, _LoadFailed):  # (Triton: a failed load is 400)
                    raise InvalidInput(exc.message) from None
                raise
            if upload is not None and previous[0] is not None:
                _remove_upload(previous[0])  # its sessions hold what they loaded

    def _restore(self, name: str, upload: Path | None, config: ModelConfig | None) -> None:
        if upload is None:
            self._uploads.pop(name, None)
        else:
            self._uploads[name] = upload
        if config is None:
            self._upload_configs.pop(name, None)
        else:
            self._upload_configs[name] = config

    def _index_record(self, name: str) -> _IndexRecord:
        """What the index and the registry say of `name` now, to put back after a failed load
        that changed nothing served."""
        snapshot = self._registry.snapshot
        served = snapshot.models.get(name)
        return _IndexRecord(
            name, dict(self._states.get(name, {})), self._model_errors.get(name),
            dict(served.versions) if served else {}, self._absent.get(name),
        )  # fmt: skip

    def _changed(self, before: _IndexRecord) -> bool:
        """Whether a load published other versions than those `before` was taken with."""
        served = self._registry.snapshot.models.get(before.name)
        now = dict(served.versions) if served else {}
        return now.keys() != before.served.keys() or any(
            now[v] is not old for v, old in before.served.items()
        )

    def _restore_index(self, name: str, before: _IndexRecord, message: str) -> None:
        """Put back what the index said of `name` before a failed load that changed nothing
        served, with `message` as the reason the versions still serving give.

        NOTE: the versions absent from the refused load's version_policy (`_note_absent`)
        were left: an override naming `specific [9]`, refused 400, had the index list version
        9 UNAVAILABLE ("version directory is not present") for good (found by a tester)."""
        states = self._states[name]
        states.clear()  # (in place: a drain in progress holds this dict)
        states.update(before.states)
        if before.absent is None:
            self._absent.pop(name, None)
        else:
            self._absent[name] = before.absent
        self._still_serving(name, before, message)
        if before.error is None:
            self._model_errors.pop(name, None)
        else:
            self._model_errors[name] = before.error
        if before.served:
            return
        if name in self._uploads or (self.root / name).is_dir():
            self._registry.record_failure(name, message)  # (nothing serves: the index says why)
        else:
            # NOTE: a name with no folder is no model of the repository: its failed upload was
            # recorded as the model's failure, and the server was unready (strict readiness)
            # while the index listed nothing, for anyone allowed to load; the caller had the
            # reason in its 400
            self._forget(name)

    def _still_serving(self, name: str, before: _IndexRecord, message: str) -> None:
        """The index says of each version that served before a failed load (`message`: why it
        failed), and serves on, why it still does."""
        states = self._states[name]
        for version in before.served:
            states[version] = VersionState("READY", STILL_SERVES + message)

    async def unload(self, name: str, *, reason: str = "unloaded by request") -> None:
        """Stop serving every version of `name`; queued requests finish first."""
        check_model_name(name)
        async with self._locks[name]:
            self._unload_now(name, reason)

    def _unload_now(self, name: str, reason: str) -> None:
        served = self._registry.snapshot.models.get(name)
        self._registry.publish(name, {}, ModelConfig().traffic)
        self._registry.record_failure(name, None)  # (unloaded: no longer one that failed)
        self._upload_configs.pop(name, None)
        self._absent.pop(name, None)  # (said of the config it was served with)
        upload = self._uploads.pop(name, None)
        if upload is not None:
            _remove_upload(upload)
            states = self._states.get(name, {})
            for number in [v for v, state in states.items() if state.reason == UPLOADED]:
                del states[number]  # (its folder is the model's again)
        self._bytes.pop(name, None)
        if served is not None:
            for version in served.versions.values():
                self._fingerprints.pop((name, version.version), None)
                self._niced.discard((name, version.version))
                self._retire(name, version, reason)

    async def _sync(self, name: str, explicit: bool, settle: bool, given: _Given | None) -> None:
        """Serve what `name`'s folder holds, with `given` as its config (None: its config
        file's)."""
        directory = self._uploads.get(name) or self.root / name
        current = self._registry.snapshot.models.get(name)
        if not directory.is_dir():
            # NOTE: a poll follows the folders: what served goes with its folder. A load request
            # is all or nothing (as Triton's): a failed one changes nothing served. One for a
            # model whose folder had been moved away unloaded it, answering 404 for the load
            # while every request after it was told "served models: none" (found by a tester)
            if current is None:
                self._forget(name)
            elif not explicit:
                self._unload_now(name, REMOVED)
            serves_on = "; the versions it served before serve on" if current and explicit else ""
            raise ModelNotFound(
                load_failed(
                    name, f"'{name}' is not in the repository {self.root}{serves_on}", polled=False
                )
            )
        if settle and given is None and not await self._config_settled(directory, wait=explicit):
            # NOTE: a config half written would be applied as it is (its traffic plan at once):
            # what serves goes on serving as it is until the next poll finds the file settled
            if current is not None:
                return
            raise ModelUnavailable(
                load_failed(name, "its config file is still being written; retry shortly")
            )
        try:
            config = given.config if given else self._read_config(name, directory)
            source = scan_model(
                directory,
                filename=config.default_model_filename,
                uploaded=directory is self._uploads.get(name),
            )
        except ConfigError as exc:
            if (
                current is not None
                and not explicit
                and not any(self._holds_model(directory, v, current) for v in current.versions)
            ):
                # NOTE: a config error leaves what serves serving, but the last version
                # folder removed (version 2, then 1) left version 1 READY and answering from
                # memory for good, beside a model row saying no version folder is left: what
                # serves follows the folders, as when a version among others goes. Not on a
                # load request, which is all or nothing (as Triton's): a failed one changes
                # nothing served. It unloaded the model where the request's upload (or, after
                # a rename, its folder) held no version folder (found by a tester).
                self._unload_now(
                    name, self._gone_reason(name, next(iter(current.versions.values())))
                )
                current = None
            self._fail_model(name, exc.message, serving=current is not None)
            raise _LoadFailed(load_failed(name, exc.message, polled=False)) from None
        self._prune_versions(name, source.versions)
        self._note_ignored(
            name, ignored_warning(source, uploaded=directory is self._uploads.get(name))
        )
        self._note_absent(
            name, config.version_policy.missing(source.versions), directory,
            config.default_model_filename,
        )  # fmt: skip
        wanted = config.version_policy.select(source.versions)
        if not wanted:
            found = ", ".join(str(v) for v in sorted(source.versions))
            reason = (
                f"{directory}: version_policy selects none of the versions found ({found})"
                if given is None
                else f"{given.source}: field 'version_policy' selects none of the versions "
                f"in {directory} ({found})"
            )
            self._fail_model(name, reason, serving=current is not None)
            raise _LoadFailed(load_failed(name, reason, polled=False))
        if self._model_errors.pop(name, None) is not None:
            self._cleared.add(name)
        # NOTE: a failed load of a version the policy no longer selects is no news: its row
        # said so for good, and a request for it was told 503 "its load failed" where any other
        # version outside the policy is 404 (found by a tester)
        states = self._states[name]
        for stale in [v for v, state in states.items() if state.failed and int(v) not in wanted]:
            del states[stale]
        named = given or _named(config, directory)
        needed = _model_bytes(source, wanted, config)
        budget = self.options.max_loaded_bytes
        if budget is not None and needed > budget:
            # NOTE: refused as a full budget (503, "every loaded model is busy ... retry
            # later") with nothing loaded: clients retried forever a load that can never fit,
            # and the index gave the model no state (found by a tester). A reload too (its
            # versions serve on): one to two instances took the model past the budget for good
            # (another tester)
            reason = (
                f"its files take {needed} bytes (each counted once per instance), more than "
                f"the whole max_loaded_bytes budget ({budget}): it can never load; raise the "
                "budget"
            )
            self._fail_model(name, reason, serving=current is not None)
            raise _LoadFailed(load_failed(name, reason))
        try:
            victims = [] if current else self._make_room(name, needed)
        except ModelUnavailable as exc:
            if not self._evicts:  # (no passing refusal: listed as why the model is not served)
                self._fail_model(name, exc.message.removeprefix(load_failed(name, "")))
            raise
        chosen: dict[str, ServedVersion] = {}
        prints: dict[str, Fingerprint] = {}
        """Of the versions loaded now, what each was made from (recorded once published)."""
        listed = dict(self._states[name])
        """What the index said of each version before this load (see `_discard`)."""
        try:
            served = dict(current.versions) if current else {}
            estimate_s = self.load_estimate_s(name)
            pending = {str(v) for v in wanted} - served.keys()
            """Versions this load brings that do not serve yet: their requests (and, while
            nothing of it serves, the model's) hear it is loading (503), not that it is unknown,
            until one of them fails."""
            self._registry.record_loading(name, estimate_s, pending)
            traffic = config.traffic
            plan = plan_traffic(traffic, [str(v) for v in wanted], str(wanted[0]))
            answering = set(plan.versions)
            shadow_only = {version for version, _ in plan.shadows} - answering
            """Versions that only ever see shadow copies: their instances run in the background
            (loaded after the others: see below).

            NOTE: read from the config's weights, a weight naming a version not served (or one
            that failed to load) left the version that answered every request (the default)
            niced as a shadow: p90 86.8 ms against 37.4 ms under contention (found by a
            tester). Now from the plan of the versions served, and a shadow runs in the
            background only once a version it serves beside answers (one loaded, or serving
            on): with none, the plan falls back to the default, which may be the shadow."""
            problems: list[str] = []
            failures = 0
            """Of the problems, versions that cannot load (the others are still being written)."""
            troubled: set[str] = set()
            # NOTE: only the versions the policy selected were checked: version 1, serving
            # on while a broken version 2 did not load, kept its old weights for good after
            # its model.onnx changed (a poll every 0.5 s: 1 * x answered, 3 s after the
            # file had become 5 * x), and the index said nothing of why 1 still served
            stand_ins = sorted(
                (int(v) for v in served if int(v) not in wanted and int(v) in source.versions),
                reverse=True,
            )
            """Served versions the policy no longer selects, on disk: they serve on while one it
            selects does not (see below), so their files are checked as the selected ones' are."""
            # (shadow-only versions last: whether one answers depends on how the others load)
            ordered = sorted(wanted, key=lambda number: str(number) in shadow_only)
            for number in [*ordered, *stand_ins]:
                version = str(number)
                background = version in shadow_only and not answering.isdisjoint(chosen)
                if number not in wanted and (
                    explicit or not troubled or len(chosen) >= len(wanted)
                ):
                    # (what the policy selects all serves, or stand-ins fill the places its
                    # failed versions leave: the others are retired below)
                    break
                old = served.get(version)
                print_ = (
                    await self._settled(source, number, config, explicit)
                    if settle
                    else fingerprint(source, number, config)
                )
                if print_ is None:  # still being written: try again on the next poll
                    problems.append(f"version {version}: files are still changing")
                    troubled.add(version)
                    if old is not None:
                        chosen[version] = old
                    continue
                if (
                    old is not None
                    and self._fingerprints.get((name, version)) == print_
                    and ((name, version) not in self._niced or background)
                ):  # (a niced one that now answers loads again, not niced)
                    chosen[version] = old
                    continue
                failed = self._failed.get((name, version))
                if failed is not None and failed[0] == print_ and not explicit:
                    problems.append(f"version {version}: {failed[1]}")  # (an explicit load retries)
                    troubled.add(version)
                    failures += 1
                    pending.discard(version)  # (failed: not found, not loading)
                    self._registry.record_loading(name, estimate_s, pending)
                    if old is not None:
                        chosen[version] = old
                    continue
                loaded = await self._load_version(source, number, config, background, named)
                if isinstance(loaded, str):
                    self._failed[(name, version)] = print_, loaded
                    problems.append(f"version {version}: {loaded}")
                    troubled.add(version)
                    failures += 1
                    pending.discard(version)
                    self._registry.record_loading(name, estimate_s, pending)
                    if old is not None:
                        chosen[version] = old
                    continue
                self._failed.pop((name, version), None)
                chosen[version] = loaded
                prints[version] = print_
                if background:
                    self._niced.add((name, version))
                else:
                    self._niced.discard((name, version))
            if problems and explicit:
                # NOTE: a load request is all or nothing, as Triton's: a load that answers
                # 400 (or 503) changes nothing served. It published the versions that loaded
                # (an upload's good version 5 beside its broken 6 became the default), and the
                # caller could not tell what now served.
                self._discard(name, [chosen[v] for v in prints], listed)
                if failures and not served:  # (nothing serves: the failure is the model's)
                    self._registry.record_failure(name, "; ".join(problems))
                error = _LoadFailed if failures else ModelUnavailable  # (or files still changing)
                raise error(load_failed(name, "; ".join(problems)))
            if problems:  # keep serving what worked before rather than fewer versions
                # NOTE: every version served before was kept: a good version 4 beside a broken
                # 3 under `latest 2` served 1, 2 and 4, three under a two-version policy.
                # Stand-ins fill the places the policy's versions leave empty, no more.
                for version in sorted(served, key=int, reverse=True):
                    if len(chosen) >= len(wanted):
                        break
                    chosen.setdefault(version, served[version])
            retired = [old for version, old in served.items() if chosen.get(version) is not old]
            self._registry.publish(name, chosen, config.traffic)
            warning = self._traffic_warning(name, traffic, chosen, wanted)
            for version, print_ in prints.items():
                self._fingerprints[(name, version)] = print_
            self._bytes[name] = _model_bytes(source, [int(v) for v in chosen], config)
            said_unfit, unfit = unfit_traffic(chosen, config.traffic) if chosen else ("", {})
            if said_unfit and self._warned_unfit.get(name) != said_unfit:  # (once)
                log.warning("model %s: %s", name, said_unfit)
            self._warned_unfit[name] = said_unfit
            for version in chosen.keys() - troubled:  # (a failure an earlier load noted is past)
                notes = [self._degraded.get((name, version), ""), unfit.get(version, ""), warning]
                notes.append(self._unread_configs.get(name, "") if given is None else "")
                notes.append(self._ignored.get(name, ""))
                if int(version) not in wanted:
                    notes.insert(0, _standing_in(troubled & {str(v) for v in wanted}))
                self._states[name][version] = VersionState("READY", "; ".join(filter(None, notes)))
            for old in retired:
                if old.version in chosen:
                    self._retire(name, old, "replaced by a new load")
                elif int(old.version) in source.versions:
                    self._retire(name, old, "not in policy")
                else:
                    self._retire(name, old, self._gone_reason(name, old))
            if not chosen and failures:
                self._registry.record_failure(name, "; ".join(problems))
            elif not chosen:
                # NOTE: files still being written are no failure: recorded as one, a new model
                # copied in (even by the atomic rename) made the server unready until they
                # settled. The caller hears why nothing serves yet (a lazy request, say).
                raise ModelUnavailable(load_failed(name, "; ".join(problems)))
            for victim, limit in self._victims_now(name, victims):  # (the model serves)
                await self._evict(victim, name, limit)
        except asyncio.CancelledError:  # (`aclose`: what loaded but never served is closed)
            if self._registry.snapshot.models.get(name) is current:
                self._discard(name, [chosen[v] for v in prints], listed)
            raise
        finally:
            self._loading.pop(name, None)
            self._evicting.pop(name, None)
            self._registry.record_loading(name, None)

    def _traffic_warning(
        self,
        name: str,
        traffic: TrafficConfig,
        chosen: Mapping[str, ServedVersion],
        wanted: list[int],
    ) -> str:
        """What to say of `traffic` naming versions that do not serve now (`chosen` serve, of
        the versions the policy selects, `wanted`): logged once, not at every poll.

        NOTE: taken from the versions the policy selects, before any loaded, it said nothing
        of weights naming a version that failed to load: `weights = {"3" = 1}` with a broken
        version 3 sent every request to version 2, silently (found by a tester)."""
        serving = sorted((int(version) for version in chosen), reverse=True)
        if not serving:  # (the failure is the model's: see `record_failure`)
            return ""
        said = (
            _unserved(traffic.weights, "weights", serving, wanted),
            _unserved(traffic.shadow, "shadow", serving, wanted),
            _shadowing_itself(traffic, serving),
        )
        warning = " ".join(part for part in said if part)
        if warning and self._warned.get(name) != warning:
            log.warning("model %s: %s", name, warning)
        self._warned[name] = warning
        return warning

    def _discard(
        self, name: str, versions: Iterable[ServedVersion], listed: Mapping[str, VersionState]
    ) -> None:
        """Close `versions`, loaded by a load that failed as a whole and never published; the
        index says of each what it said before (`listed`)."""
        states = self._states[name]
        for version in versions:
            before = listed.get(version.version)
            if before is None:
                states.pop(version.version, None)
            else:
                states[version.version] = before
            self._in_background(_close(version), version)

    def _gone_reason(self, name: str, old: ServedVersion) -> str:
        """Why `old`, whose version the folder `name` is served from lacks, is retired."""
        folder = version_folder(old.primary.model.path, _filename(old))
        if name not in self._uploads:
            return FILE_REMOVED if folder.is_dir() else REMOVED
        if folder.parent == self.root / name:
            return UPLOADED  # (the repository's: listed, to say why it no longer serves)
        # NOTE: a version of an earlier upload was labelled as the repository's folder (the
        # upload serving in its place); gone with its files, it leaves the index once drained
        return REPLACED_UPLOAD

    async def _config_settled(self, directory: Path, wait: bool) -> bool:
        """Whether the model's config file (if any) has gone `stable_s` unchanged, or was there
        at the start; with `wait`, waits for it (a while)."""
        for _ in range(20):
            newest = 0
            for file in CONFIG_FILENAMES:
                with contextlib.suppress(OSError):
                    newest = max(newest, (directory / file).stat().st_mtime_ns)
            age_s = (time.time_ns() - newest) / 1e9
            if age_s >= self.options.stable_s or newest < self._started_ns:
                return True
            if not wait:
                return False
            await asyncio.sleep(self.options.stable_s - age_s + 0.01)
        return False

    async def _settled(
        self, source: ModelSource, version: int, config: ModelConfig, wait: bool
    ) -> Fingerprint | None:
        """The version's fingerprint once its files have stopped changing (None: not yet)."""
        for _ in range(20):
            print_ = fingerprint(source, version, config)
            age_s = (time.time_ns() - print_.newest_ns) / 1e9
            if age_s >= self.options.stable_s or print_.newest_ns < self._started_ns:
                return print_  # (files present at start are taken as they are: a lazy load)
            if not wait:
                return None
            await asyncio.sleep(self.options.stable_s - age_s + 0.01)
        return None

    async def _load_version(
        self,
        source: ModelSource,
        version: int,
        config: ModelConfig,
        background: bool,
        given: _Given | None = None,
    ) -> ServedVersion | str:
        """Load and deploy one version with its variants; the reason as text on failure (the
        config's errors named for the config the load was `given`, if any)."""
        key = str(version)
        previous = self._states[source.name].get(key)
        self._states[source.name][key] = VersionState("LOADING")
        started = time.perf_counter()
        keep = previous is not None and previous.state == "READY"
        current = self._registry.snapshot.models.get(source.name)
        served = current.versions.get(key) if current is not None else None
        serving = {d.variant for d in served.variants} if served is not None else set()
        """The variants the version serves with now (none: a first load)."""
        limit = self.options.max_run_memory_bytes
        # (the limit only when one is set: stand-ins for `_load_with_variants` take three)
        extra = () if limit is None else (limit,)
        try:
            loading = self._loader.submit(_load_named, given, source, version, config, *extra)
            try:
                loaded, unloaded, missing = await asyncio.wrap_future(loading)
            except asyncio.CancelledError:
                # NOTE: cancelled (an `Engine.start` cancelled twice, say), a load its thread
                # had begun ran on, and the instance threads of what it loaded were left
                # running, never deployed, never closed (found by a tester)
                if not loading.cancel():
                    loading.add_done_callback(_stop_loaded)
                raise
            lost = [
                why
                for variant, why in unloaded.items()
                if keep and variant in serving and variant not in missing
            ]
            if lost:
                # NOTE: a working version is not swapped for one without a variant it serves
                # whose file is there but will not load: a bad copy would take cheaper answers
                # away from tight due times. A file taken away is followed, as at a first load
                # (the guard held it too: a deleted variant served from memory until a restart,
                # which served the files as they were)
                for _, model in loaded:
                    model.executor.close()
                it, these = ("it", "this variant") if len(lost) == 1 else ("them", "these variants")
                raise ConfigError(
                    f"{'; '.join(lost)} (version {version} serves with {these} now, and is "
                    f"not replaced by a load without {it})"
                )
        except Exception as exc:  # (a ConfigError, or a fault of duetime's: either way, this
            # version only: the other models and versions load on)
            if isinstance(exc, ConfigError):
                message = exc.message if given is None else _named_for(exc.message, source, given)
                log.error("model %s version %d not loaded: %s", source.name, version, message)
            else:
                message = f"internal error while loading: {type(exc).__name__}: {exc}"
                log.exception("model %s version %d not loaded", source.name, version)
            self._states[source.name][key] = VersionState(
                "READY" if keep else "UNAVAILABLE",
                f"{STILL_SERVES}{message}" if keep else message,
                failed=not keep,
            )
            return message
        self._load_s[source.name] = time.perf_counter() - started
        variants = tuple(self._deploy(model, variant, background) for variant, model in loaded)
        # NOTE: a recovery was logged at INFO alone, below the default level, where its failure
        # had been an ERROR: the operator never saw it cleared (found by a tester)
        recovered = source.name in self._cleared or (
            previous is not None and (previous.failed or previous.reason.startswith(STILL_SERVES))
        )
        self._cleared.discard(source.name)
        log.log(
            logging.WARNING if recovered else logging.INFO,
            "model %s version %d ready (%d variants)%s", source.name, version, len(variants),
            "; its last load had failed" if recovered else "",
        )  # fmt: skip
        if unloaded:  # (a missing file, or a variant it never served: it serves without; the
            # index says so)
            # NOTE: a load adding a variant whose file was missing answered 400 'version 1
            # serves without it' and the version served on as before, without it; the same
            # config served (200) at a first load, and the README's word is that a version
            # without the file serves without the variant, with a warning
            without = f"version {version} serves without {'it' if len(unloaded) == 1 else 'them'}"
            said = f"{'; '.join(unloaded.values())}; {without}"
            log.warning("model %s version %d: %s", source.name, version, said)
            self._degraded[(source.name, key)] = said
        else:
            self._degraded.pop((source.name, key), None)
        return ServedVersion(key, variants)

    def _retire(self, name: str, version: ServedVersion, reason: str) -> None:
        """Drain and close `version` in the background; the index says it is unloading (unless
        a new instance of it serves on), then `reason`.

        NOTE: a drain ends by writing its own state only: it overwrote any unloading entry,
        so an instance replaced by a reload (listed nothing: its successor served), drained
        after that successor was unloaded, wrote 'replaced by a new load' over 'unloaded by
        request' (9 of 10 tries of load, reload, unload). What last happened to the version
        is what the index says."""
        states = self._states[name]
        served = self._registry.snapshot.models.get(name)
        mine: VersionState | None = None
        if served is None or version.version not in served.versions:
            mine = states[version.version] = VersionState("UNLOADING", reason)
            # NOTE: loads were logged, unloads never (found by a tester; Triton logs both)
            log.info("model %s version %s unloading: %s", name, version.version, reason)

        async def drain() -> None:
            try:
                await _close(version, self.options.drain_s)
            finally:  # (its counts fold into the kept ones now, not at some later publish)
                self._registry.prune_retiring()
            if mine is not None:
                log.info("model %s version %s unloaded", name, version.version)
            if mine is not None and states.get(version.version) is mine:
                if reason in _GONE or self._on_disk(name, version.version):
                    states[version.version] = VersionState("UNAVAILABLE", reason)
                else:  # (an upload's version, unloaded: the index lists what is on disk)
                    del states[version.version]

        self._in_background(drain(), version)

    def _in_background(self, closing: Coroutine[Any, Any, None], version: ServedVersion) -> None:
        """Run `closing`, which drains and closes `version`, as a task of its own (see
        `aclose`)."""
        task = asyncio.get_running_loop().create_task(closing)
        self._retiring[task] = version
        task.add_done_callback(self._retired)

    def _retired(self, task: asyncio.Task[None]) -> None:
        del self._retiring[task]

    def _note_ignored(self, name: str, warning: str) -> None:
        """Record (and log, when it changes) what of `name`'s folder holds its model file but is
        no version (`warning`, '' for nothing): its served versions' rows in the index say it.

        NOTE: such a folder (`003`, `v1`) was skipped without a word, or (`01` beside `1`)
        refused the model; Triton ignores it with a warning (found by a tester)."""
        _note(self._ignored, name, warning, [warning])

    def _note_absent(self, name: str, versions: list[int], directory: Path, filename: str) -> None:
        """Record (and log, when it changes) the versions of `name` that its `specific`
        version_policy names but that have no folder, or one without the model file (in
        `directory`, the model's folder): the index lists each as UNAVAILABLE with Triton's
        words for it.

        NOTE: a folder holding no model.onnx was said not to be there (found by a tester)."""
        said = f"is specified for model '{name}', but the version directory"
        absent = {
            str(version): f"version {version} {said} {version}/ holds no {shown_name(filename)}"
            if _is_folder(directory / str(version))
            else f"version {version} {said} is not present"
            for version in versions
        }
        _note(self._absent, name, absent, absent.values())

    def _read_config(self, name: str, directory: Path) -> ModelConfig:
        """The model's config from its file; the file's warnings are logged the first time its
        content is read, again only once it changes."""
        read = read_model_config(directory)
        self._unread_configs[name] = read.unread
        if self._config_warned.get(name) != read.digest:
            for message in read.warnings:
                log_config.warning("%s", message)
            self._config_warned[name] = read.digest
        return read.config

    def _fail_model(self, name: str, reason: str, *, serving: bool = False) -> None:
        if self._model_errors.get(name) != reason:  # (each poll meets an unfixed error again)
            log.error("model %s not loaded: %s", name, reason)
        self._model_errors[name] = reason
        if not serving:
            self._registry.record_failure(name, reason)

    def _forget(self, name: str) -> None:
        """Drop what the index and the failure records say of `name`, whose folder is gone;
        versions still loading or draining stay listed, and those unloaded as it went."""
        states = self._states.get(name, {})
        for version, state in list(states.items()):
            if not _outlives_folder(state):
                del states[version]  # (in place: a drain in progress holds this dict)
        if not states:
            self._states.pop(name, None)
        self._model_errors.pop(name, None)
        self._cleared.discard(name)
        if name in self._registry.snapshot.failures:
            self._registry.record_failure(name, None)
        for table in (self._failed, self._degraded):  # (keyed by model and version)
            for key in [key for key in table if key[0] == name]:
                del table[key]
        self._retry_at.pop(name, None)
        self._warned.pop(name, None)
        self._config_warned.pop(name, None)
        self._unread_configs.pop(name, None)
        self._ignored.pop(name, None)
        self._absent.pop(name, None)

    def _prune_versions(self, name: str, versions: Iterable[int]) -> None:
        """Forget the failed or unloaded versions of `name` no longer on disk (a removed version
        folder, or versions of an upload since unloaded)."""
        present = {str(v) for v in versions}
        states = self._states.get(name, {})
        for version, state in list(states.items()):
            if version not in present and not _outlives_folder(state):
                del states[version]
        for table in (self._failed, self._degraded):
            for key in [key for key in table if key[0] == name and key[1] not in present]:
                del table[key]

    @staticmethod
    def _holds_model(directory: Path, version: str, served: ServedModel) -> bool:
        """Whether `directory` holds a folder of `version` with a model file in it (named as
        the `served` model's config names it); True where it cannot be read.

        NOTE: a model folder the server may not read was taken to hold no version any more:
        the poll went to unload what served, and failed on the folder with a traceback at
        every poll (found by a tester). What serves serves on, as for an unreadable
        repository, and the folder's error is the model's."""
        filename = _filename(served.versions[version])
        try:
            return any(
                folder_version(p.name) == int(version)
                and p.is_dir()
                and model_file(p, filename) is not None
                for p in directory.iterdir()
            )
        except OSError:
            return True

    def _on_disk(self, name: str, version: str) -> bool:
        """Whether the folder `name` is served from holds a folder of `version`."""
        directory = self._uploads.get(name) or self.root / name
        try:
            return any(folder_version(p.name) == int(version) for p in directory.iterdir())
        except OSError:
            return False

    # -- memory budget and lazy loading --------------------------------------------------------

    def _make_room(self, name: str, needed: int) -> list[tuple[str, str]]:
        """The least recently used idle models to unload, with the budget each is unloaded for,
        once `name` loads, so that it fits the budget; `name` counts as loaded from now until
        its load ends (`_sync` forgets it then). ModelUnavailable if no idle models make room.

        NOTE: the models chosen are unloaded only once `name` serves (`_evict`): unloaded
        first, a model that served was gone after an explicit load that failed (400, all or
        nothing), until someone loaded it again. So while a load runs, the models loaded may
        exceed the budget by the one being loaded (its bytes), never by more: the models a
        load will unload count as gone for the other loads.

        NOTE: loads under way count as models loaded: four first requests for four models at
        once, under a budget of two, loaded all four (each saw none loaded yet). A load that
        finds the budget full of other loads is refused at once (503, retry), not queued behind
        them: the models they bring are about to take their own first requests."""
        models = self._registry.snapshot.models
        loading = {n: b for n, b in self._loading.items() if n not in models and n != name}
        kept = self._kept(name, models)
        idle = sorted(
            (max(d.scheduler.last_arrival_ns for d in _deployments(models[other])), other)
            for other in kept
            if other != name and _quiet(models[other])
        )
        if not self._evicts:
            idle = []
        victims: list[tuple[str, str]] = []
        while True:
            limit = self._over_budget(kept, loading, adding=needed)
            if limit is None:
                self._loading[name] = needed
                self._evicting[name] = victims
                return victims
            if not self._evicts:
                raise ModelUnavailable(
                    load_failed(
                        name,
                        f"the {limit} budget is full; with --model-control-mode "
                        f"{self.options.control_mode} and no --lazy-load nothing would load a "
                        "model unloaded to make room again, so none is: add --lazy-load, or "
                        "raise the budget",
                    )
                )
            if not idle:
                busy = "loaded or loading" if loading else "loaded"
                # (a passing refusal: a Retry-After, as for a model loading; found by a tester)
                raise ModelUnavailable(
                    load_failed(
                        name,
                        f"the {limit} budget is full and every {busy} model is busy (one "
                        "unloaded to make room must have had no request, and been loaded, for "
                        f"{EVICT_QUIET_S * 1000:.0f} ms); retry later or raise the budget",
                    ),
                    retry_after_s=LAZY_RETRY_S,
                )
            _, victim = idle.pop(0)
            kept.remove(victim)
            victims.append((victim, limit))

    def _victims_now(self, name: str, planned: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """The models to unload now that `name` serves, with the budget each goes for: the
        least recently used idle ones (then, were those not enough, the least recently used)
        until the models loaded fit the budget again; none if `_make_room` planned none.

        NOTE: chosen when the load began, the models planned were unloaded when it ended
        whatever they did meanwhile: a model that took traffic through a slow load was unloaded
        (404s) while one idle all along stayed. And counted, not weighed, against what is
        loaded now, the choice made now left a byte budget exceeded (a small model went for a
        big one), or unloaded a model for room another unload had made already."""
        if not planned:
            return []
        models = self._registry.snapshot.models
        loading = {n: b for n, b in self._loading.items() if n not in models}
        kept = self._kept(name, models)
        ranked = sorted(
            (
                not _quiet(models[other]),
                max(d.scheduler.last_arrival_ns for d in _deployments(models[other])),
                other,
            )
            for other in kept
            if other != name
        )
        victims: list[tuple[str, str]] = []
        while True:
            limit = self._over_budget(kept, loading)
            if limit is None:
                return victims
            if not ranked:
                return victims  # (all that could go is going)
            _, _, victim = ranked.pop(0)
            kept.remove(victim)
            victims.append((victim, limit))

    @property
    def _evicts(self) -> bool:
        """Whether the budget unloads idle models to make room: only where something loads
        them again (a request, lazily; the repository API, explicitly).

        NOTE: in mode none (or poll) without --lazy-load, the start loaded every model and
        unloaded all but the last to fit `--max-loaded-models 1`: those answered 404 for good,
        without a word (and each poll would load one back, unloading another). There the
        budget loads what fits and refuses the rest, each saying why in the index."""
        return self.options.control_mode == "explicit" or self.options.lazy

    def _kept(self, name: str, models: Mapping[str, ServedModel]) -> list[str]:
        """The models served that no other load than `name`'s will unload once it serves."""
        claimed = {v for n, chosen in self._evicting.items() if n != name for v, _ in chosen}
        return [n for n in models if n not in claimed]

    def _over_budget(
        self, kept: list[str], loading: Mapping[str, int], *, adding: int | None = None
    ) -> str | None:
        """The budget (its setting's name) that the models `kept` and `loading` exceed, with
        one more model of `adding` bytes where given; None if they fit both."""
        options = self.options
        count = len(kept) + len(loading) + (adding is not None)
        used = sum(self._bytes.get(n, 0) for n in kept) + sum(loading.values()) + (adding or 0)
        if options.max_loaded_models is not None and count > options.max_loaded_models:
            return "max_loaded_models"
        if options.max_loaded_bytes is not None and used > options.max_loaded_bytes:
            return "max_loaded_bytes"
        return None

    async def _evict(self, victim: str, name: str, limit: str) -> None:
        """Unload `victim`, chosen by `_make_room` to make room for `name`, which now serves."""
        async with self._locks[victim]:
            if victim not in self._registry.snapshot.models:
                return  # (unloaded meanwhile)
            log.info("unloading idle model %s to make room for %s (%s)", victim, name, limit)
            self._unload_now(victim, f"unloaded to make room for '{name}' ({limit})")

    def can_load_lazily(self, name: str) -> bool:
        """Whether a request for `name`, which is not served, should load it first.

        A model whose last load failed is tried again by one request every `LAZY_RETRY_S` (the
        failure could be passing: a full budget, a file since fixed); the requests in between
        get the failure at once, not a load each. Files still being written are no failure:
        each request checks them again (a stat per file), and the first after they settle
        loads them."""
        if not self.options.lazy or self.options.control_mode == "explicit":
            return False
        snapshot = self._registry.snapshot
        if name in snapshot.models:  # served: a version it lacks is not loaded on demand
            return False
        try:
            check_model_name(name)
        except InvalidInput:
            return False
        if not (self.root / name).is_dir():
            return False
        now = time.monotonic()
        if name in snapshot.failures and now < self._retry_at.get(name, 0.0):
            return False
        self._retry_at[name] = now + LAZY_RETRY_S  # (from the try: the failure is its outcome)
        return True

    def _on_demand(self) -> list[str]:
        """The models a request loads first, served or not: with lazy loading (not in explicit
        mode), every model folder of the repository (see `Registry.on_demand`)."""
        if not self.options.lazy or self.options.control_mode == "explicit":
            return []
        try:
            return [folder.name for folder in model_folders(self.root)]
        except OSError:  # (the repository gone or unreadable: the index says so)
            return []

    def load_estimate_s(self, name: str) -> float:
        """How long loading `name` took last time (a second by default)."""
        return self._load_s.get(name, 1.0)

    # -- the index -----------------------------------------------------------------------------

    def _load_failure(self, name: str, version: str) -> str | None:
        """Why version `version` of model `name` is not served, where its load failed (see
        `Registry.load_failure`); None otherwise."""
        state = self._states.get(name, {}).get(version)
        return state.reason if state is not None and state.failed else None

    def index(self, ready_only: bool = False) -> list[IndexEntry]:
        """Triton's repository index: every model on disk or served, with each version's
        state. Of a folder that is gone, only versions still loading or draining are listed, and
        those unloaded as it went (its failures and older states would only be stale)."""
        present = set(self._registry.snapshot.models) | set(self._uploads)
        misnamed: dict[str, str] = {}
        with contextlib.suppress(OSError):
            present |= {p.name for p in model_folders(self.root)}
            misnamed = misnamed_folders(self.root)  # (listed by a name that can be shown)
        present |= misnamed.keys()
        names = present | set(self._states) | set(self._model_errors)
        entries: list[IndexEntry] = []
        for name in sorted(names):
            versions = self._states.get(name, {})
            # NOTE: a failed load of a version whose folder has since been removed was listed
            # with its failure (a parse error of a file no longer there) until a load of the
            # model succeeded: only a poll or a load prunes the states (found by a tester)
            rows: list[IndexEntry] = [
                {"name": name, "version": version, "state": s.state, "reason": s.reason}
                for version, s in sorted(versions.items(), key=lambda item: int(item[0]))
                if (name in present and not (s.failed and not self._on_disk(name, version)))
                or _outlives_folder(s)
            ]
            if name not in present:  # its folder is gone (explicit mode: no poll forgot it)
                entries.extend(r for r in rows if not ready_only or r.get("state") == "READY")
                continue
            rows.extend(
                {"name": name, "version": version, "state": "UNAVAILABLE", "reason": reason}
                for version, reason in self._absent.get(name, {}).items()
                if version not in versions
            )
            error = self._model_errors.get(name, misnamed.get(name))
            serving = [r for r in rows if r.get("state") == "READY"]
            if error is not None and serving:
                # NOTE: a row of its own, UNAVAILABLE, said the model was not served beside the
                # versions serving it (READY, no reason): read as name -> state, the index said
                # a serving model was down (found by a tester). Said as a failed load's is.
                for row in serving:
                    if not row.get("reason"):
                        row["reason"] = STILL_SERVES + error
            elif error is not None:
                rows.append({"name": name, "state": "UNAVAILABLE", "reason": error})
            if not rows:
                rows = [{"name": name}]
            entries.extend(r for r in rows if not ready_only or r.get("state") == "READY")
        return entries


UPLOAD_PREFIX = "duetime-upload-"

MAX_UPLOAD_FILES = 4096
"""The most files one load may upload. NOTE: a 64 MiB body holds millions of empty `file:`
entries, and one with 100,000 kept the loader thread writing for over 30 s; a model folder needs
a file per version, variant and external-data tensor (Triton sets no limit)."""

MAX_UPLOAD_DEPTH = 32
"""The most parts an uploaded file's path may have ('1/model.onnx' has 2). NOTE: making the
folders of a path of 2,000 parts overflowed the stack (pathlib's mkdir recurses per part)."""


def _write_upload(name: str, files: Mapping[str, bytes]) -> Path:
    """A fresh temporary folder `<tmp>/duetime-upload-XXXX/<name>` holding `files` (relative
    paths, checked by `check_upload_path`; Triton's load parameter keys, `file:<path>`, too).

    NOTE: `engine.load_model(files={"file:1/model.onnx": data})`, tritonclient's keys and the
    README's example, was refused as a folder 'file:1' holding no version (found by a tester)."""
    folder = Path(tempfile.mkdtemp(prefix=UPLOAD_PREFIX)) / name
    try:
        for key, content in files.items():
            relative = key.removeprefix("file:")
            target = folder.joinpath(*check_upload_path(relative))
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(content)
            except OSError as exc:  # a name too long, a file where a folder goes, a full disk
                raise InvalidInput(
                    load_failed(
                        name,
                        f"load parameter 'file:{relative}': cannot write it into the model "
                        f"folder: {exc.strerror or exc}",
                        polled=False,
                    )
                ) from None
    except BaseException:
        _remove_upload(folder)
        raise
    return folder


def check_upload_path(relative: str) -> tuple[str, ...]:
    """The parts of an uploaded file's path in its model folder; InvalidInput for a path that
    could land outside it (absolute, `..`, empty parts, backslashes, NUL, hidden names), or
    that has more than `MAX_UPLOAD_DEPTH` parts."""
    parts = tuple(relative.split("/", MAX_UPLOAD_DEPTH))  # (what is beyond is refused unsplit)
    if not relative or any(
        p in ("", ".", "..") or p.startswith(".") or "\\" in p or "\0" in p for p in parts
    ):
        raise InvalidInput(
            f"load parameter 'file:{relative}': expected a relative path inside the model "
            "folder, such as 'file:1/model.onnx'"
        )
    if len(parts) > MAX_UPLOAD_DEPTH:
        shown = relative if len(relative) <= 200 else f"{relative[:200]}..."
        raise InvalidInput(
            f"load parameter 'file:{shown}': the path has more than "
            f"{MAX_UPLOAD_DEPTH} parts, the limit for a file in the model folder (such as "
            "'file:1/model.onnx', 2 parts)"
        )
    return parts


_GONE = frozenset({REMOVED, FILE_REMOVED, UPLOADED})
"""The reasons of versions whose files went away: their rows outlive them in the index."""


def _sweep_uploads(loader: ThreadPoolExecutor, folders: list[Path]) -> None:
    """Remove `folders` once `loader`'s threads have ended (see `ModelManager.aclose`)."""
    loader.shutdown(wait=True)
    for folder in folders:
        _remove_upload(folder)


def _remove_upload(folder: Path) -> None:
    """Remove the temporary directory holding an uploaded model folder."""
    shutil.rmtree(folder.parent, ignore_errors=True)


def _note(table: dict[str, Any], name: str, value: Any, warnings: Iterable[str]) -> None:
    """Keep `value` (falsy: nothing) as what `table` says of model `name`, logging `warnings`
    only where it changed: said once, not at every poll."""
    if value and value != table.get(name):
        for warning in warnings:
            log.warning("model %s: %s", name, warning)
    if value:
        table[name] = value
    else:
        table.pop(name, None)


def _outlives_folder(state: VersionState) -> bool:
    """Whether the index lists a version whose folder is gone: while it loads or drains, and
    once unloaded because the folder went away or an upload took its place (to say so)."""
    return state.state in ("LOADING", "UNLOADING") or state.reason in _GONE


async def _close(version: ServedVersion, drain_s: float = 0.0) -> None:
    """Close a version's schedulers, their queues drained for up to `drain_s` (0: a version
    that never took a request), then its sessions."""
    await asyncio.gather(*(d.scheduler.aclose(drain_s) for d in version.variants))
    for deployment in version.variants:
        await in_thread(deployment.model.executor.close)


def _deployments(served: ServedModel) -> list[Deployment]:
    return [d for version in served.versions.values() for d in version.variants]


EVICT_QUIET_S = 0.1
"""A model unloaded to make room for another must have had no request for this long (and none
queued or running): one under steady traffic is not idle between two of its requests.

NOTE: "idle" was "nothing queued or running at this instant": under thousands of requests a
second, one load was refused (every model busy) and the next, a second later, unloaded the
busy model, whose clients then got 404s by the thousand (found by a tester)."""


def _quiet(served: ServedModel) -> bool:
    """Whether `served` may be unloaded to make room (see `EVICT_QUIET_S`)."""
    window = EVICT_QUIET_S * 1e9
    for deployment in _deployments(served):
        quiet = deployment.scheduler.quiet_ns()
        if quiet is None or quiet < window:
            return False
    return True


LOADER_NICENESS = 10


def _background_thread(cpus: frozenset[int] | None, abandoned: threading.Event) -> None:
    """Move the loader thread off the loop's CPU and below the serving threads (Linux); its
    loads stop once `abandoned` is set (see `abandon_with`)."""
    pin_current_thread(cpus)
    lower_thread_priority(LOADER_NICENESS)
    abandon_with(abandoned)


def _unserved(
    table: Mapping[str, float] | None,
    field: str,
    served: Iterable[int],
    selected: Iterable[int] = (),
) -> str:
    """What to say when `[traffic] field` names versions that are not `served`: the version
    policy does not serve them, or of those it `selected`, they did not load. It is easy to
    miss: a shadow gets no copies; a weighted version gets no requests (the others share
    them), and where no version served has a weight, every request naming no version goes to
    the highest served (`plan_traffic`'s default).

    NOTE: the weights' warning said the versions missing "get no requests" where none of the
    weighted versions was served and every request went to the highest version, which it did
    not say (found by a tester)."""
    numbers = sorted(served)
    names = {str(v) for v in numbers}
    missing = sorted(set(table or ()) - names, key=int)
    if not missing:
        return ""
    failed = [version for version in missing if int(version) in set(selected)]
    serving = ", ".join(map(str, numbers))
    why = (
        f"version(s) {', '.join(failed)} did not load; {serving} serve"
        if failed
        else f"version_policy serves {serving}"
    )
    said = f"[traffic] {field} names version(s) {', '.join(missing)}, not served ({why}): "
    if field == "shadow":
        return said + "they get no copies."
    if any(weight > 0 and version in names for version, weight in (table or {}).items()):
        return said + "they get no requests."
    return (
        said + "no version served has a weight, so every request naming no version goes to "
        f"version {numbers[-1]}, the highest served."
    )


def _standing_in(selected: Iterable[str]) -> str:
    """What the index says of a version served on although the version policy no longer
    selects it, while the load of the `selected` versions, which it does select, has not
    succeeded."""
    numbers = sorted(selected, key=int)
    which = f"version {numbers[0]}" if len(numbers) == 1 else f"versions {', '.join(numbers)}"
    return (
        f"not selected by version_policy, served on while the load of {which}, which it "
        f"selects, has not succeeded (see {'its' if len(numbers) == 1 else 'their'} state)"
    )


def _shadowing_itself(traffic: TrafficConfig, served: list[int]) -> str:
    """What to say when `[traffic] shadow` names the one version the traffic policy sends
    requests to: a request is never mirrored to the version answering it, so that shadow
    sees only requests that name another version (none when no other is served)."""
    plan = plan_traffic(traffic, [str(v) for v in served], str(served[0]))
    idle = [version for version, _ in plan.shadows if plan.versions == (version,)]
    if not idle:
        return ""
    return (
        f"[traffic] shadow names version {idle[0]}, the only version the traffic policy sends "
        "requests to: no request is mirrored to the version that answers it, so it gets copies "
        "only of requests that name another version."
    )


def _stop_loaded(loading: Future[Any]) -> None:
    """Stop the instance threads of a load no one awaits any more (see `_load_version`)."""
    if loading.cancelled() or loading.exception() is not None:
        return
    for _, model in loading.result()[0]:
        model.executor.stop()


def _load_named(
    given: _Given | None, source: ModelSource, version: int, config: ModelConfig, *extra: Any
) -> tuple[list[tuple[str, LoadedModel]], dict[str, str], set[str]]:
    """`_load_with_variants`, its warnings naming the config's fields as its errors do: for
    the config the load was `given` (see `_named_for`)."""
    named = None if given is None else lambda message: _named_for(message, source, given)
    token = FIELD_NAMES.set(named)
    try:
        return _load_with_variants(source, version, config, *extra)
    finally:
        FIELD_NAMES.reset(token)


def _load_with_variants(
    source: ModelSource, version: int, config: ModelConfig, max_run_memory_bytes: int | None = None
) -> tuple[list[tuple[str, LoadedModel]], dict[str, str], set[str]]:
    """The primary model of `version` and each variant that loads beside it, why each other
    variant did not (by name, in the config's order: its file is missing, or will not load),
    and the names of those whose file is missing; blocking. What comes of the variants that did
    not load is the caller's to say (and log)."""
    primary = load_version(source, version, config, max_run_memory_bytes=max_run_memory_bytes)
    loaded = [(PRIMARY, primary)]
    unloaded: dict[str, str] = {}
    missing: set[str] = set()
    folder = source.versions[version].parent
    for variant in config.variants:
        if not (folder / variant.file).is_file():
            unloaded[variant.name] = _missing_variant(variant.name, variant.file, folder)
            missing.add(variant.name)
            continue
        try:
            model = load_version(
                source, version, config, variant=variant, primary=primary.signature,
                profile_budget_s=VARIANT_PROFILE_BUDGET_S,
                max_run_memory_bytes=max_run_memory_bytes,
            )  # fmt: skip
        except ConfigError as exc:
            unloaded[variant.name] = f"variant '{variant.name}' not loaded: {exc.message}"
            continue
        loaded.append((variant.name, model))
    return loaded, unloaded, missing


def _is_folder(path: Path) -> bool:
    try:
        return path.is_dir()
    except OSError:  # (one the server may not look at: no folder it can serve)
        return False


def _missing_variant(name: str, file: str, folder: Path) -> str:
    try:
        others = sorted(p.name for p in folder.iterdir() if p.suffix == ".onnx")
    except OSError:
        others = []
    return (
        f"variant '{name}': no file {file} in {folder} (model files there: "
        f"{', '.join(others) or 'none'})"
    )


def _named(config: ModelConfig, directory: Path) -> _Given | None:
    """`config`, read from the model's folder `directory`, as its errors name it, if not as
    the loader does (`<folder>: field 'inputs.0.name'`, duetime's fields): its file's
    (`<folder>/config.toml: field 'inputs.0.name'`), and a config.pbtxt's are the file's own
    fields (`<folder>/config.pbtxt: field 'input[0].name'`), as a load override's in Triton's
    form and the file's own errors (`output[0].data_type`) are.

    NOTE: a config.toml's dims that the graph refused were blamed on the model's folder, where
    its parse errors named the file (found by a tester)."""
    if isinstance(config, TritonModelConfig):
        return _Given(config, str(directory / PBTXT_FILENAME))
    with contextlib.suppress(ConfigError):  # (read already: only a race could fail it now)
        path = find_config_file(directory)
        if path is not None:
            return _Given(config, str(path))
    return None


def _named_for(message: str, source: ModelSource, given: _Given) -> str:
    """`message`, an error of loading `source` with the config a load was `given`, with the
    config's fields that the loader names in the model's folder (`<folder>: field
    'inputs.0.name': ...`) named in that config, as its writer named them (`input[0].name` in
    Triton's form): an override's or an upload's (the folder's config file was not read, and
    may be fine), or the folder's config.pbtxt (see `_named`)."""

    def named(match: re.Match[str]) -> str:
        field = match[1]
        if isinstance(given.config, TritonModelConfig):
            field = triton_field(
                tuple(int(p) if p.isascii() and p.isdigit() else p for p in field.split("."))
            )
        return f"{given.source}: field '{field}'"

    return re.sub(re.escape(f"{source.directory}: field '") + r"([\w.]+)'", named, message)


def fingerprint(source: ModelSource, version: int, config: ModelConfig) -> Fingerprint:
    """Size, modification time, inode and change time of each file `version` loads, and the
    config's digest.

    Every file of the version's folder counts, not only the model files: a model's tensors can
    live in files of their own (ONNX external data), which a new release may change alone. So
    do the config files and the label files the config names (`labels`, Triton's
    `label_filename`), which the load reads too.

    NOTE: size and modification time alone missed a file replaced by one of the same size and
    the same time (a retrained model of one architecture, its time normalised: `cp -p`, `rsync
    -a`, SOURCE_DATE_EPOCH archives): polls served the old weights for good, and a load request
    answered 200 with them. A rename onto the file gives it another inode, and an overwrite in
    place, its time set back, a new change time. (A `chmod` or a new hard link changes the
    change time too: a reload of the same files, which serve on meanwhile.) The folders'
    modification times, which Triton compares, would change with the optimised-graph cache
    that the first load writes into the version's folder."""
    model = source.versions[version]
    paths = _version_files(model, config)
    paths += [source.directory / name for name in CONFIG_FILENAMES]
    # NOTE: an edited label file was never read again: polls, and a load request, kept the
    # old labels for good (found by a tester); Triton's poll compares the whole folder's time.
    # One deleted drops out of the list, a change too: its load then says it is missing.
    paths += label_files(config, source.directory)
    files = []
    for path in paths:
        try:
            stat = path.stat()
        except FileNotFoundError:
            continue
        except OSError as exc:
            # NOTE: one the server may not read (its folder's mode) is a change its load
            # reports (as an unreadable model file); the PermissionError ended every poll of the
            # model with a traceback (found by a tester)
            files.append((str(path), -(exc.errno or 1), 0, 0, 0))
            continue
        files.append((str(path), stat.st_size, stat.st_mtime_ns, stat.st_ino, stat.st_ctime_ns))
    digest = hashlib.sha256(config.model_dump_json().encode()).hexdigest()
    return Fingerprint(tuple(files), digest)


def _model_bytes(source: ModelSource, versions: Iterable[int], config: ModelConfig) -> int:
    total = 0
    for version in versions:
        model = source.versions.get(version)
        if model is None:
            continue
        for path in _version_files(model, config):
            with contextlib.suppress(OSError):
                total += path.stat().st_size * config.instances
    return total


def _filename(version: ServedVersion) -> str:
    """The model file name `version`'s config gives its version folders."""
    return version.primary.model.config.default_model_filename


def _version_files(model: Path, config: ModelConfig) -> list[Path]:
    """The model files of a version (`model` and its variants' files), then every other file in
    its version folder and below, but hidden ones (the optimised-graph cache, a copy in
    progress): those in `<version>/model.onnx/` too, where Triton's layout puts the model."""
    files = [model, *(model.with_name(v.file) for v in config.variants)]
    named = set(files)
    folder = version_folder(model, config.default_model_filename)
    with contextlib.suppress(OSError):
        for path in sorted(folder.rglob("*")):
            hidden = any(part.startswith(".") for part in path.relative_to(folder).parts)
            if not hidden and path not in named and path.is_file():
                files.append(path)
    return files
