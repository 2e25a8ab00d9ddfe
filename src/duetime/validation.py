"""Checks a request's tensors against a model's signature before anything reaches ONNX Runtime."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from duetime.datatypes import NUMPY_OF, v2_datatype_of
from duetime.errors import InvalidInput
from duetime.execution.ort import strings_for_ort
from duetime.types import ModelSignature, TensorSpec

if TYPE_CHECKING:
    from duetime.repository.graphs import SizedNode


@dataclass(slots=True, eq=False)
class Prepared:
    """A request that passed validation: ORT-ready feeds, its batch rows and batching key.

    NOTE: not frozen: a frozen dataclass sets each field through `object.__setattr__`, four
    calls on every request for a record nothing changes after `prepare` anyway."""

    feeds: dict[str, np.ndarray]
    rows: int
    shape_key: tuple[Any, ...]
    outputs: tuple[str, ...]
    units: tuple[str, ...] = ()
    """The outputs without dims (beyond the batch's) its answer gives with a trailing dim of 1
    ([1], [batch, 1]): Triton's form, the request's too (see `Validator._unit_outputs`)."""


TEMPLATES_MAX = 256
"""Request templates a validator remembers as valid; all are forgotten when full."""


class Validator:
    """The checks for one model version, built once at load so a request pays only for lookups."""

    def __init__(
        self,
        model: str,
        signature: ModelSignature,
        unserved: Mapping[str, str] | None = None,
        *,
        sized: Sequence[SizedNode] = (),
        max_run_bytes: int | None = None,
        left_out: Mapping[str, str] | None = None,
    ) -> None:
        """`unserved`: the graph's outputs left out of `signature`, name -> why (see
        `unserved_output_reason`), for the error to a request asking for one. `sized`: the
        graph's nodes whose output size the request's values set (see `graphs.sized_nodes`),
        none of which may be asked for more than `max_run_bytes` (None: no limit).
        `left_out`: the graph's inputs left out of `signature`, name -> why (see
        `left_out_inputs`), for the error to a request giving one."""
        self._model = model
        self._left_out = left_out or {}
        self._sized = tuple(sized) if max_run_bytes is not None else ()
        self._max_run_bytes = max_run_bytes or 0
        self._signature = signature
        self._unserved = unserved or {}
        self._batched = signature.max_batch_size > 0
        self._specs = {spec.name: spec for spec in signature.inputs}
        self._names = self._specs.keys()
        """The inputs' names (a view of `_specs`', made once: not one per request)."""
        self._dtypes = {spec.name: NUMPY_OF[spec.datatype] for spec in signature.inputs}
        self._wanted = {
            spec.name: None if spec.any_rank else spec.client_shape for spec in signature.inputs
        }
        """The shape each input's requests carry (None: any); looked up, not derived per
        request (`client_shape` is a property: a call on every request's every input)."""
        self._tails = {
            name: wanted[1:]
            for name, wanted in self._wanted.items()
            if wanted and wanted[0] == -1 and -1 not in wanted[1:]
        }
        """The inputs whose shape is a free first dim and fixed others (a batched model's
        usual input): their non-batch dims, which an array of the right datatype and rank that
        has them passes `_check_tensor` by (see `_prepare`)."""
        self._required = tuple(spec.name for spec in signature.required_inputs)
        self._all_outputs = tuple(spec.name for spec in signature.outputs)
        self._output_names = frozenset(self._all_outputs)
        self._expected = expected_inputs(signature)
        self._others = other_shapes(signature)
        self._graph_shapes = {
            spec.name: spec.shape[1:] if self._batched else spec.shape
            for spec in signature.inputs
            if spec.wire is not None or spec.name in self._others
        }
        """Inputs the config reshapes, or that requests may give in another shape (see
        `other_shapes`): the graph's shape of each (without the batch dim)."""
        self._unit_inputs = {name: len(self._specs[name].client_shape) + 1 for name in self._others}
        """The inputs without dims a request may give in Triton's form (one dim more: [1],
        [batch, 1]), and that form's rank..."""
        self._unit_outputs = tuple(
            spec.name
            for spec in signature.outputs
            if spec.wire is None
            and not spec.any_rank
            and not (spec.shape[1:] if self._batched else spec.shape)
        )
        """...and the outputs without dims, which a request giving such an input in that form
        is answered in it too.

        NOTE: Triton's config cannot say "no dims": such a model's config reads dims [1] with
        reshape [] (see `other_shapes`), and a Triton client that sent [1] was answered [] (its
        `as_numpy('y')[0]` raised IndexError; found by a tester)."""
        self._templates: dict[object, tuple[int, tuple[Any, ...], tuple[str, ...]]] = {}
        """Templates whose requests passed: their rows, batching key and outputs."""

    @property
    def max_run_bytes(self) -> int:
        """The most one run's request may ask a node to allocate (0: no bound given)."""
        return self._max_run_bytes

    @property
    def left_out(self) -> Mapping[str, str]:
        """The graph's inputs requests may not give, name -> why (see `left_out_inputs`)."""
        return self._left_out

    def overrides(self, prepared: Prepared) -> bool:
        """Whether the request gives optional inputs (it gave every required one)."""
        return len(prepared.feeds) > len(self._required)

    def prepare(
        self,
        inputs: Mapping[str, np.ndarray],
        outputs: Sequence[str] | None,
        template: object | None = None,
    ) -> Prepared:
        """Validate `inputs` and the requested `outputs`; raise InvalidInput naming the field.

        `template` (see `InferRequest.template`): requests made from one template have inputs of
        the same names, datatypes and shapes, and ask for the same outputs; once one of them
        passed, and its arrays went to ONNX Runtime as they are, the others skip the checks."""
        if template is not None:
            known = self._templates.get(template)
            if known is not None:  # (a front end's own dict, made for this request: not copied)
                prepared = Prepared(inputs if type(inputs) is dict else dict(inputs), *known)
                if self._sized:  # (same shapes, other values)
                    self._check_sizes(prepared.feeds)
                return prepared
        prepared = self._prepare(inputs, outputs)
        if self._sized:
            self._check_sizes(prepared.feeds)
        if template is not None and all(prepared.feeds[n] is a for n, a in inputs.items()):
            if len(self._templates) >= TEMPLATES_MAX:
                self._templates.clear()
            self._templates[template] = (prepared.rows, prepared.shape_key, prepared.outputs)
        return prepared

    def _check_sizes(self, feeds: Mapping[str, np.ndarray]) -> None:
        """InvalidInput when the request's values ask a node for an output bigger than one run
        may allocate, before it runs.

        NOTE: a 16-byte request to `ConstantOfShape(shape) -> ReduceSum` asking for 1 GiB was
        run: the server allocated it (and ORT's arena kept it); a request for more than the
        machine has brings the OOM killer. What cannot be computed here (a size the graph
        computes otherwise) is left to ONNX Runtime's allocation failure."""
        limit = self._max_run_bytes
        for node in self._sized:
            asked = node.bytes_asked(feeds)
            if asked is not None and asked > limit:
                names = " and ".join(f"'{name}'" for name in node.inputs)
                raise InvalidInput(
                    f"input {names}: its values ask {node.described} of model '{self._model}' "
                    f"for a tensor of {asked} bytes ({_mib(asked)}), over the {limit} bytes "
                    f"({_mib(limit)}) one run may allocate (--max-run-memory-bytes); ask for "
                    "a smaller size"
                )

    def _prepare(self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str] | None) -> Prepared:
        # (every name known and as many as the model has: none is missing; a set comparison of
        # the keys, in C, instead of `_check_names`' loop on every request)
        if len(inputs) != len(self._specs) or not inputs.keys() <= self._names:
            self._check_names(inputs)
        feeds: dict[str, np.ndarray] = {}
        rows: int | None = None
        limit = self._signature.max_batch_size
        tails = self._tails
        dtypes = self._dtypes
        for name, array in inputs.items():
            spec = self._specs[name]
            # (`_check_tensor` only where the quick look is not enough: a frame and its loop
            # less per input on the usual request)
            tail = tails.get(name)
            if (
                tail is None
                or not isinstance(array, np.ndarray)
                or array.dtype != dtypes[name]
                or len(array.shape) != len(tail) + 1
                or array.shape[1:] != tail
            ):
                self._check_tensor(spec, array)
            if self._batched:
                # (`_check_rows` only where it has something to say: a frame less per input)
                batch = array.shape[0]
                if batch < 1 or batch > limit or (rows is not None and batch != rows):
                    self._check_rows(spec, array, rows)
                rows = int(batch)
            # (`_for_ort` only where it has something to do: a native, C-ordered numeric array
            # goes as it is)
            if spec.datatype != "BYTES" and array.dtype.isnative and array.flags.c_contiguous:
                feeds[name] = array
            else:
                feeds[name] = self._for_ort(spec, array)
        if self._graph_shapes:
            self._reshape(feeds)
        if not self._batched:
            shape_key: tuple[Any, ...] = ()
        elif len(feeds) == 1:
            shape_key = ((name, feeds[name].shape[1:]),)
        else:
            shape_key = tuple((name, a.shape[1:]) for name, a in feeds.items())
        # (all outputs, the usual, without `_check_outputs`' frame)
        wanted = self._all_outputs if outputs is None else self._check_outputs(outputs)
        units: tuple[str, ...] = ()
        if self._unit_outputs and any(
            inputs[name].ndim == rank for name, rank in self._unit_inputs.items() if name in inputs
        ):
            units = self._unit_outputs
        return Prepared(feeds, rows or 1, shape_key, wanted, units)

    def _check_names(self, inputs: Mapping[str, np.ndarray]) -> None:
        for name in inputs:
            if name not in self._specs:
                why = self._left_out.get(name)
                if why is not None:
                    raise InvalidInput(left_out_input(self._model, name, why))
                raise InvalidInput(
                    f"input '{name}' is not an input of model '{self._model}'; it expects "
                    f"{self._expected}"
                )
        if len(inputs) == len(self._specs):  # every name known and as many: none missing
            return
        missing = [name for name in self._required if name not in inputs]
        if missing:
            spec = self._specs[missing[0]]
            raise InvalidInput(
                f"input '{spec.name}' ({spec.describe()}) is missing; model '{self._model}' "
                f"expects {self._expected}"
            )

    def _check_tensor(self, spec: TensorSpec, array: np.ndarray) -> None:
        if not isinstance(array, np.ndarray):
            raise InvalidInput(f"input '{spec.name}': expected a numpy array, got {type(array)}")
        expected = self._dtypes[spec.name]
        dtype = array.dtype
        # Byte order is not part of the datatype: a big-endian FP32 array is still FP32.
        if (
            dtype != expected
            and dtype.newbyteorder("=") != expected
            and not (spec.datatype == "BYTES" and dtype.kind in "OSU")
        ):
            got = _datatype_name(array)
            raise InvalidInput(
                f"input '{spec.name}': datatype {got} does not match the model's {spec.datatype}"
            )
        wanted = self._wanted[spec.name]
        if wanted is None:
            return
        shape = array.shape
        if len(shape) == len(wanted):
            for want, got in zip(wanted, shape, strict=True):  # a loop: a generator is a frame
                if want != got and want != -1:
                    break
            else:
                return
        refused = shape_refused(spec, shape, self._others.get(spec.name, ()), self._model)
        if refused is not None:
            raise InvalidInput(refused)

    def _check_rows(self, spec: TensorSpec, array: np.ndarray, rows: int | None) -> int:
        batch = array.shape[0]
        limit = self._signature.max_batch_size
        if not 0 < batch <= limit:
            raise InvalidInput(batch_refused(spec.name, batch, limit, self._model))
        if rows is not None and batch != rows:
            raise InvalidInput(
                f"input '{spec.name}': batch size {batch} differs from the other inputs' {rows}; "
                "all inputs must have the same first dim"
            )
        return int(batch)

    def _reshape(self, feeds: dict[str, np.ndarray]) -> None:
        """The inputs the config reshapes, in the graph's shape: the request's rows (a view).
        One given in that shape is left as it is (a template's requests then skip the checks)."""
        for name, inner in self._graph_shapes.items():
            array = feeds.get(name)
            if array is None:
                continue
            if self._batched:
                if array.shape[1:] != inner:
                    feeds[name] = array.reshape((len(array), *inner))
            elif array.shape != inner:
                feeds[name] = array.reshape(inner)

    def _for_ort(self, spec: TensorSpec, array: np.ndarray) -> np.ndarray:
        if spec.datatype == "BYTES":
            refused = strings_refused(spec.name, array.size)
            if refused is not None:
                raise InvalidInput(refused)
            return strings_for_ort(array, spec.name)
        return c_ordered(array)

    def _check_outputs(self, outputs: Sequence[str] | None) -> tuple[str, ...]:
        if outputs is None:
            return self._all_outputs
        for name in outputs:
            if name not in self._output_names:
                raise InvalidInput(
                    not_an_output(self._model, name, self._all_outputs, self._unserved)
                )
        return tuple(outputs)


MAX_STRING_ELEMENTS = 1 << 20
"""BYTES elements one input tensor may hold.

NOTE: each element costs the server a few Python objects and ONNX Runtime's own string, ~275
bytes however short it is: one 64 MiB request of 16.7M empty strings (4-byte length prefixes
only) took 4.6 GB and held the server 13 s; two at once would have taken 9 GB (found by a
tester). At this bound one input takes ~300 MB at most."""


def strings_refused(name: str, count: int) -> str | None:
    """Why a BYTES input `name` of `count` elements is refused (None: it is not)."""
    if count <= MAX_STRING_ELEMENTS:
        return None
    return (
        f"input '{name}': {count} BYTES elements, over the {MAX_STRING_ELEMENTS} one input may "
        "hold (each costs the server a few hundred bytes, however short); split the request"
    )


EXPECTED_OPTIONAL_MAX = 8
"""Optional inputs an error message names (a model from an older exporter has one a weight)."""


def expected_inputs(signature: ModelSignature) -> str:
    """The inputs `signature` takes, as error messages name them."""
    text = ", ".join(f"'{s.name}' {s.describe()}" for s in signature.required_inputs) or "no input"
    optional = [s for s in signature.inputs if s.optional]
    if optional:
        named = ", ".join(f"'{s.name}' {s.describe()}" for s in optional[:EXPECTED_OPTIONAL_MAX])
        more = len(optional) - EXPECTED_OPTIONAL_MAX
        text += f" (optional: {named}{f' and {more} more' if more > 0 else ''})"
    return text


def left_out_inputs(
    graph_inputs: Iterable[TensorSpec], signature: ModelSignature
) -> dict[str, str]:
    """The graph's optional inputs `signature` does not serve, name -> why, for the error to a
    request giving one (see `Validator`): those of a model that batches whose first dim is not
    free (a weight or bias: no batch dim, so no request's rows to batch by).

    NOTE: a request giving one was told "input 'b' is not an input of model 'm'; it expects
    'x'": false (it is one of the graph's, and ONNX Runtime takes it), and silent on the reason
    and the way out, which the load-time refusal of the same input in a config names."""
    if signature.max_batch_size <= 0:
        return {}
    served = {spec.name for spec in signature.inputs}
    return {
        spec.name: (
            f"an initializer ({spec.describe()}) the model's graph lets requests override, but "
            f"not on a model that batches (max_batch_size = {signature.max_batch_size}): it has "
            "no batch dim; leave it out (its initializer's value is used), or serve the model "
            "unbatched (max_batch_size = 0 in its config) to give it"
        )
        for spec in graph_inputs
        if spec.optional and spec.name not in served
    }


def left_out_input(model: str, name: str, why: str) -> str:
    """The error to a request giving input `name`, which the graph of `model` has but which is
    not served, and `why` (see `left_out_inputs`)."""
    return f"input '{name}' of model '{model}': {why}"


def not_an_output(
    model: str, name: str, outputs: Sequence[str], unserved: Mapping[str, str]
) -> str:
    """The error to a request asking for output `name`, which `model` does not give: why, where
    the graph has it but duetime cannot return it (`unserved`: name -> why), else its outputs."""
    reason = unserved.get(name)
    if reason is not None:
        return f"output '{name}' of model '{model}' is not served: {reason}"
    return (
        f"requested output '{name}' is not an output of model '{model}'; its outputs are "
        f"{', '.join(repr(n) for n in outputs)}"
    )


def other_shapes(signature: ModelSignature) -> dict[str, tuple[tuple[int, ...], ...]]:
    """The inputs requests may give in other shapes than `client_shape`, by name: those shapes,
    reshaped to the graph's. An input the graph takes without dims beyond the batch's takes
    [batch] and [batch, 1] alike ([] and [1] when the model does not batch), whatever its
    config's dims; a request in the form with the extra dim is answered in it too (its outputs
    without dims: see `Prepared.units`), one in metadata's form in that one.

    NOTE: Triton's config cannot say "no dims" (its check refuses empty dims): its ONNX Runtime
    backend writes such a tensor dims [1] with reshape [], so Triton's clients send [batch, 1]
    ([1]), where duetime's (KServe's, the README's) send [batch] ([]). The config endpoint
    shows the one, metadata the other: each form was refused by the model serving the other."""
    batched = signature.max_batch_size > 0
    forms = ((-1,), (-1, 1)) if batched else ((), (1,))
    return {
        spec.name: tuple(form for form in forms if form != spec.client_shape)
        for spec in signature.inputs
        if not spec.any_rank and not (spec.shape[1:] if batched else spec.shape)
    }


def fits(shape: tuple[int, ...], wanted: tuple[int, ...]) -> bool:
    """Whether `shape` is one of `wanted`'s (-1 marks a free dim)."""
    return len(shape) == len(wanted) and all(
        want in (-1, got) for want, got in zip(wanted, shape, strict=True)
    )


def shape_refused(
    spec: TensorSpec, shape: tuple[int, ...], others: tuple[tuple[int, ...], ...], model: str
) -> str | None:
    """Why input `spec` of `model` does not take `shape`, which is not its `client_shape`: None
    where it is one of `others` (see `other_shapes`), else the message naming the shapes it
    takes, in Triton's words (its dims written as Triton writes them: `[-1,40]`).

    NOTE: it said "input 'x': shape [1, 5] does not match the model's [-1, 4]", where Triton's
    "unexpected shape for input 'x' for model 'm'. Expected [-1,4], got [1,5]" is what clients
    and their logs look for (found by a tester)."""
    if any(fits(shape, other) for other in others):
        return None
    taken = " or ".join(_dims(each) for each in (spec.client_shape, *others))
    return (
        f"unexpected shape for input '{spec.name}' for model '{model}'. Expected {taken}, got "
        f"{_dims(shape)} (-1 marks a free dim)"
    )


def _dims(shape: tuple[int, ...]) -> str:
    """A shape as Triton writes one (DimsListToString): `[-1,40]`."""
    return f"[{','.join(map(str, shape))}]"


def batch_refused(name: str, batch: int, limit: int, model: str) -> str:
    """Why input `name`'s `batch` rows are not a batch `model` takes (at most `limit`), in
    Triton's words, which client code matches to split a request (`inference request
    batch-size must be <= 8 for 'm'`).

    NOTE: it said "input 'x': batch size 9 is over model 'm' max_batch_size 8" (found by a
    tester)."""
    if batch < 1:
        return (
            f"inference request batch-size must be >= 1 for '{model}': input '{name}' has "
            f"{batch} rows"
        )
    return (
        f"inference request batch-size must be <= {limit} for '{model}': input '{name}' has "
        f"{batch} rows; split the request"
    )


def _mib(count: int) -> str:
    return f"{count / 2**20:.1f} MiB" if count < 2**30 else f"{count / 2**30:.1f} GiB"


def _datatype_name(array: np.ndarray) -> str:
    try:
        return v2_datatype_of(array)
    except TypeError:
        return str(array.dtype)


def c_ordered(array: np.ndarray) -> np.ndarray:
    """`array` as ONNX Runtime takes a numeric tensor: C-ordered, in this machine's byte order
    (copied only where it is not)."""
    if not array.dtype.isnative:
        return array.astype(array.dtype.newbyteorder("="), order="C")
    return array if array.flags.c_contiguous else np.ascontiguousarray(array)
