"""One layer's path through the comm hook: its slot, the encode rounds and the decode.

The hook (:mod:`autocomp.hook`) works per bucket; everything it does to a single parameter's
gradient lives here, so the same code can be replayed on one rank without collectives
(:func:`encode_locally`, :class:`LayerReplay`) for tests, the cost model's calibration and the
advisor's compressor measurements.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from autocomp.compressors import Collective, Compressor, NoCompression
from autocomp.error_sketch import sign_sketch, sketch_buckets, sketch_seed
from autocomp.profiler import StepProfiler
from autocomp.timing import clock_for

__all__ = [
    "Encoding",
    "LayerReplay",
    "LayerSlot",
    "advance_encoding",
    "begin_encoding",
    "decode_into",
    "encode_locally",
    "is_identity",
    "sample_plain",
]


def float32_norm(tensor: torch.Tensor, ord: float = 2) -> torch.Tensor:
    """The ``ord``-norm of ``tensor`` (L2 by default; L1 is what ``error_weight = "grad_l1"``
    weighs a layer by) as a 0-d float32 tensor, without a host sync.

    Half-precision values accumulate in float32 (their squares overflow fp16). A float64
    gradient (a layer kept in double) is reduced in its own precision and then narrowed:
    ``vector_norm`` refuses a ``dtype`` narrower than its input."""
    if tensor.dtype == torch.float64:
        return torch.linalg.vector_norm(tensor, ord).float()
    return torch.linalg.vector_norm(tensor, ord, dtype=torch.float32)


NONZERO_SAMPLE = 65_536
"""Elements :func:`nonzero_share` reads at most: about 3% relative error on a share of 0.5%,
for tens of microseconds on a 10M-element gradient, on sampled steps only."""


def nonzero_share(tensor: torch.Tensor) -> torch.Tensor:
    """The fraction of ``tensor``'s elements that are nonzero, as a 0-d float32 tensor,
    estimated from an evenly strided sample (no host sync).

    An embedding table's gradient is nonzero only in the rows of the batch's tokens (0.5% of
    the hashed n-gram table's elements): top-k at a ratio above that share sends every
    nonzero, which the dense-gradient priors cannot know. The stride is odd, so the sample
    does not fall into the same columns of a row-major matrix every time."""
    flat = tensor.reshape(-1)
    numel = flat.numel()
    if numel == 0:
        return torch.ones((), dtype=torch.float32, device=tensor.device)
    stride = max(1, numel // NONZERO_SAMPLE) | 1
    sample = flat[::stride]
    return torch.count_nonzero(sample).to(torch.float32) / sample.numel()


def bucket_shape(param: torch.Tensor) -> tuple[torch.Size, torch.dtype]:
    """Shape and dtype of ``param``'s gradient as it sits in DDP's bucket: a complex
    gradient is bucketed as its real view (DDP's reducer), with a trailing dimension of 2
    for the real and imaginary parts, so it is sent and compressed as real numbers."""
    if param.is_complex():
        return torch.Size((*param.shape, 2)), param.dtype.to_real()
    return param.shape, param.dtype


def is_identity(compressor: Compressor) -> bool:
    return type(compressor) is NoCompression


@dataclass(slots=True)
class LayerSlot:
    """Everything the hook keeps for one parameter."""

    name: str
    """Qualified parameter name, the stable key across bucket rebuilds and checkpoints."""
    shape: torch.Size
    """Gradient shape."""
    dtype: torch.dtype
    """Gradient dtype as it sits in the bucket."""
    seed: int
    """Per-layer seed, identical on all ranks (shared random choices)."""
    compressor: Compressor = field(default_factory=NoCompression)
    """Current compressor."""
    state: dict[str, Any] = field(default_factory=dict)
    """Compressor state (warm-start factors, generators, counters)."""
    residual: torch.Tensor | None = None
    """Error-feedback memory (float32, gradient shape), or None."""
    bytes_sent: int = 0
    """Wire bytes this rank handed to collectives for this layer, all steps."""
    bytes_raw: int = 0
    """Bytes an uncompressed all-reduce would have sent, all steps."""
    uncompressed_until: int = 0
    """Send uncompressed while the hook's step is below this (after a non-finite average)."""
    sparse: bool = False
    """DDP hands this gradient as a sparse tensor (an embedding with ``sparse=True``): it is
    all-reduced as it is, alone in its bucket, and never compressed."""
    sparse_step_bytes: int = 0
    """Sparse gradients: bytes of rows and indices this rank sent in the last step."""

    @property
    def numel(self) -> int:
        return self.shape.numel()

    def wire_bytes(self) -> int:
        """Bytes the next step sends for this layer."""
        return self.compressor.wire_bytes(self.shape, self.dtype)


@dataclass(slots=True)
class Encoding:
    """One layer's payload for this step, possibly still between rounds."""

    slot: LayerSlot
    work: torch.Tensor
    """What is being compressed (gradient plus residual, float32); kept for later rounds."""
    payload: torch.Tensor
    """The current round's payload (the final one once ``settled``)."""
    plain: bool
    """Sent as the gradient itself (no decode, no compressor state to advance)."""
    rounds: int = 1
    round_index: int = 0
    grad_norm: torch.Tensor | float = 0.0
    """Norm of this step's gradient alone (sampled steps only; a 0-d tensor, read by the
    profiler once per window)."""
    grad_l1: torch.Tensor | float = 0.0
    """L1 norm of this step's gradient alone (sampled steps only)."""
    nonzero: torch.Tensor | float = 1.0
    """:func:`nonzero_share` of this step's gradient alone (sampled steps only)."""
    step: int = 0
    """The step this payload belongs to (seeds the sampled error sketch)."""

    @property
    def settled(self) -> bool:
        return self.round_index == self.rounds - 1


def _check_round_bytes(encoding: Encoding) -> None:
    slot = encoding.slot
    expected = slot.compressor.round_wire_bytes(slot.shape, slot.dtype)[encoding.round_index]
    sent = encoding.payload.numel() * encoding.payload.element_size()
    if sent != expected:
        raise RuntimeError(
            f"compressor {slot.compressor.spec} produced {sent} bytes in round "
            f"{encoding.round_index} for {slot.name} {tuple(slot.shape)} but reports {expected}"
        )


def begin_encoding(
    slot: LayerSlot, grad: torch.Tensor, state: Any, step: int | None = None
) -> Encoding:
    """First round of one layer's (already divided) gradient; settles single-round ones.

    ``step``: the bucket's step (default the hook's current one). The hierarchical hook
    encodes on a worker thread, where ``state.step`` may already count the next step."""
    compressor = slot.compressor
    grad = grad.view(slot.shape)
    sampling = state.profiler is not None and state.profiler.sample_this_step
    grad_norm = float32_norm(grad) if sampling else 0.0
    grad_l1 = float32_norm(grad, 1) if sampling else 0.0
    nonzero = nonzero_share(grad) if sampling else 1.0
    # With a residual, work in its own buffer: no allocation, one pass. Without one, only
    # error feedback needs a private float32 copy (it becomes the residual); every other
    # compressor reads the bucket slice itself (``compress`` must not modify its input).
    residual = slot.residual
    if residual is not None:
        x = residual.add_(grad)
    else:
        x = grad.to(torch.float32, copy=compressor.error_feedback)
    step = state.step if step is None else step
    if is_identity(compressor) or step < slot.uncompressed_until:
        # A pending residual is flushed into an uncompressed layer in its own dtype.
        slot.residual = None
        return Encoding(slot, x, x.reshape(-1).to(slot.dtype), plain=True)
    rounds = compressor.rounds_for(slot.shape)
    if rounds > 2:
        raise NotImplementedError(
            f"compressor {compressor.spec} needs {rounds} collectives per step; the hook "
            "pipelines at most 2"
        )
    encoding = Encoding(
        slot,
        x,
        compressor.compress(x, slot.state),
        False,
        rounds,
        grad_norm=grad_norm,
        grad_l1=grad_l1,
        nonzero=nonzero,
        step=step,
    )
    if state.check_wire_bytes:
        _check_round_bytes(encoding)
    if encoding.settled:
        _settle(encoding, state)
    return encoding


def advance_encoding(encoding: Encoding, received: torch.Tensor, state: Any) -> None:
    """The next round's payload from the previous round's summed result."""
    slot = encoding.slot
    encoding.round_index += 1
    encoding.payload = slot.compressor.compress_round(
        encoding.work, encoding.round_index, received, slot.state
    )
    if state.check_wire_bytes:
        _check_round_bytes(encoding)
    if encoding.settled:
        _settle(encoding, state)


def _settle(encoding: Encoding, state: Any) -> None:
    """Error feedback and the sampled error, once the final payload is known."""
    slot, x, payload = encoding.slot, encoding.work, encoding.payload
    compressor = slot.compressor
    sampling = state.profiler is not None and state.profiler.sample_this_step
    profiler = state.profiler if sampling else None
    # Norms stay on the device: the profiler reads a window's worth in one transfer.
    x_norm = torch.linalg.vector_norm(x) if profiler is not None else 0.0
    # The input's and the lost part's sketches, summed over ranks at the boundary, give the
    # averaged update's error (autocomp.error_sketch). The input is sketched first: error
    # feedback turns it into the residual in place.
    input_sketch: torch.Tensor | None = None
    if profiler is not None and getattr(state, "sketch_errors", False):
        seed, buckets = sketch_seed(slot.seed, encoding.step), sketch_buckets(slot.shape)
        input_sketch = sign_sketch((x,), seed, buckets)
    lost: torch.Tensor | None = None
    if compressor.error_feedback:
        slot.residual = compressor.subtract_estimate_(x, payload, slot.state)
        lost = slot.residual
    else:
        slot.residual = None
        if profiler is not None:
            lost = x - compressor.decompress(payload, slot.shape, slot.state)
    if profiler is not None:
        error = torch.linalg.vector_norm(lost) if lost is not None else 0.0
        sketch = None
        if input_sketch is not None and lost is not None:
            sketch = torch.cat((sign_sketch((lost,), seed, buckets), input_sketch))
        profiler.layer_sample(
            slot.name,
            compressor.spec,
            grad_norm=encoding.grad_norm,
            grad_l1=encoding.grad_l1,
            nonzero=encoding.nonzero,
            residual_norm=error if slot.residual is not None else 0.0,
            error=error,
            x_norm=x_norm,
            sketch=sketch,
            sketch_step=encoding.step,
        )


def encode_locally(slot: LayerSlot, grad: torch.Tensor, state: Any) -> tuple[torch.Tensor, bool]:
    """Every round of one layer as a single rank would run them (its own payload is each
    round's sum); returns the final payload and whether it is the plain gradient.

    The hook's exact per-layer code path without collectives: for tests and replays.
    """
    encoding = begin_encoding(slot, grad, state)
    while not encoding.settled:
        advance_encoding(encoding, encoding.payload, state)
    return encoding.payload, encoding.plain


def sample_plain(slot: LayerSlot, grad: torch.Tensor, profiler: StepProfiler) -> None:
    if grad.is_sparse:  # repeated indices add up: the norm is of the coalesced values
        grad = grad.coalesce().values()
        nonzero: torch.Tensor | float = 1.0  # sent as DDP sends it, never compressed
    else:
        nonzero = nonzero_share(grad)
    profiler.layer_sample(
        slot.name,
        slot.compressor.spec,
        grad_norm=float32_norm(grad),
        grad_l1=float32_norm(grad, 1),
        nonzero=nonzero,
    )


def decode_into(slot: LayerSlot, received: Any, target: torch.Tensor) -> torch.Tensor:
    """Decode what arrived for a compressed layer into ``target``; advance its state.

    Returns a 0-d bool tensor: whether the result is finite (read later, without a sync here).
    NaN/Inf anywhere in a rank's input reaches the summed payload (all-reduce), which is
    cheaper to check than the decoded gradient when it is float32; other payloads are checked
    once decoded (a 16-bit payload too: on CPU a float32 sum of float16 elements is 5x slower
    than of the decoded float32 ones). The check is the float32 sum, which NaN and Inf
    propagate through: one streaming pass without a full-size bool temporary (30x cheaper than
    ``isfinite().all()`` on CPU). A finite tensor whose sum overflows float32 (elements near
    1e32) also counts as non-finite, which at that size is the right reaction anyway.
    """
    slot.compressor.decompress_into(received, target, slot.shape, slot.state)
    summed = isinstance(received, torch.Tensor) and received.dtype == torch.float32
    checked = received if summed else target
    finite = torch.isfinite(checked.sum(dtype=torch.float32))
    slot.compressor.commit(received, slot.state)
    return finite


@dataclass(slots=True)
class _ReplayHookState:
    """What the encoding functions read of :class:`~autocomp.hook_state.HookState`, for a
    replay without collectives."""

    check_wire_bytes: bool = False
    profiler: StepProfiler | None = None
    step: int = 0


class LayerReplay:
    """The hook's own per-layer work on one gradient, step after step, without the collective.

    What the cost model's calibration at ``wrap`` and the advisor's compressor measurements
    time: the exact hot path of :func:`~autocomp.hook.autocomp_hook` (every round of
    :func:`encode_locally`,
    then :func:`decode_into` into a bucket-sized target), so a fused or unfused code path is
    costed as it really runs.
    """

    def __init__(self, compressor: Compressor, grad: torch.Tensor, gathered: int = 2) -> None:
        shape = torch.Size(grad.shape)
        self.slot = LayerSlot("replay", shape, grad.dtype, 0, compressor)
        self.slot.state = compressor.init_state(shape, 0, 0)
        self.grad = grad.reshape(-1)
        self.target = torch.empty_like(self.grad)
        self.gathered = max(1, gathered)
        """Payloads decoded per all-gather step (the per-payload time is their mean)."""
        self._state = _ReplayHookState()
        self.clock = clock_for(grad.device)

    def step(self) -> tuple[float, float]:
        """One step: (sending-side seconds, decode seconds per received payload).

        Timed with the clock of the gradient's device (CUDA events on a GPU, where host time
        would only see the kernel launches), waiting for the device at the end of the step.
        """
        slot, clock = self.slot, self.clock
        started = clock.stamp()
        payload, _ = encode_locally(slot, self.grad, self._state)
        prepared = clock.stamp()
        payloads = 1
        received: Any = payload
        if slot.compressor.collective is Collective.ALL_GATHER:
            payloads = self.gathered
            received = [payload] + [payload.clone() for _ in range(payloads - 1)]
        decode_started = clock.stamp()
        bool(decode_into(slot, received, self.target))
        finished = clock.stamp()
        self._state.step += 1
        if isinstance(finished, torch.cuda.Event):
            finished.synchronize()
        read = clock.reader(started)
        return read(prepared) - read(started), (read(finished) - read(decode_started)) / payloads
