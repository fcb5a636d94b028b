"""Cold operands on the host: what a forward pass streams (weights, the KV cache) is read from memory when an op is
timed alone, not from the last-level cache that the previous call left full; what the pass has just written
(activations: the query, the layer's input) stays as it would be.

Each operator names the fields of its inputs that a forward pass streams (`Operator.streamed`). They are copied
until a rotation over the copies streams at least COLD_FACTOR x the last-level cache between two reads of one
copy, and the timer takes the copies in turn; where that would need more than MAX_COPIES copies (small operands)
or more memory than is free, the timer instead reads a buffer of COLD_FACTOR x the LLC before each call (every
operand is then cold, the activations too, which are small there). A GPU flushes its L2 instead
(bench.instruments.timing). The plan says which (`state`, the row's `cache_state`): its roof follows it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

from ..spec.roof import EVICTED, FLUSHED_L2, ROTATED, WARM
from .memory.device_memory import HEADROOM, free_bytes
from .memory.host_cache import COLD_FACTOR, cold_bytes, evictor, last_level_cache

MAX_COPIES = 32


@dataclass(frozen=True)
class ColdCalls:
    """The calls a timer takes in turn, what it runs before each (outside the clock), how the operands were made
    cold (`how` in words, `state` one of bench.spec.roof's cache states), and the inputs the calls read (the case's
    own, then the copies: what an in-place op writes is reset in each before a judged call)."""

    calls: tuple[Callable[[], object], ...]
    evict: Callable[[], None] | None
    how: str
    inputs: tuple = ()
    state: str = WARM


def nbytes(tensors) -> int:
    """Bytes of tensors, or of anything with `nbytes` and `clone()` (a packed quantized weight)."""
    return sum(t.nbytes for t in tensors)


def clone_nbytes(tensors) -> int:
    """Bytes one cold copy of `tensors` allocates: `clone_nbytes` where a clone holds more than a call reads (every
    expert of a mixture, when a call touches a few), else `nbytes`."""
    return sum(getattr(t, "clone_nbytes", t.nbytes) for t in tensors)


def copies_needed(streamed_bytes: int, target: int) -> int:
    """Copies in rotation (the original included) so that the others stream `target` bytes between two reads of
    one copy."""
    return math.ceil(target / max(streamed_bytes, 1)) + 1


def cold_copies(inputs, names: tuple[str, ...], count: int) -> list:
    """`count` - 1 copies of `inputs` whose streamed fields are fresh clones; the other fields are shared."""
    return [dataclasses.replace(inputs, **{n: getattr(inputs, n).clone() for n in names}) for _ in range(count - 1)]


def plan(state, impl: str, call, *, cold: bool, mode: str, flush_l2: bool = False) -> ColdCalls:
    """The calls of one (case, impl) for the timer: the planned call alone where nothing needs to be cold (a GPU,
    --warm, an operator that streams nothing, Triton's interpreter), else copies in turn or an eviction. On a GPU
    the timer's L2 flush (`flush_l2`) makes every operand cold."""
    op, device = state.op, state.device
    names = tuple(op.streamed)
    if device.type != "cpu":
        flushed = flush_l2
        return ColdCalls((call.run,), None, "L2 flushed before each call" if flushed else "warm", (state.inputs,),
                         FLUSHED_L2 if flushed else WARM)
    if not cold or not names or mode == "interpreter":
        return ColdCalls((call.run,), None, "warm", (state.inputs,), WARM)
    streamed = [getattr(state.inputs, n) for n in names]
    read = streamed_read_bytes(op, state.case, streamed)
    count = rotation(read, device, clone_nbytes(streamed))
    if count:
        copies = state.cold_copies(names, count)
        calls = (call.run, *(op.prepare(state.case, x, impl).run for x in copies))
        between = (count - 1) * read / 2**20
        how = f"{'/'.join(names)} rotated over {count} copies ({between:.0f} MiB read between two reads of one copy)"
        return ColdCalls(calls, None, how, (state.inputs, *copies), ROTATED)
    return ColdCalls((call.run,), evictor(), f"{COLD_FACTOR} x LLC read before each call", (state.inputs,), EVICTED)


def streamed_read_bytes(op, case, streamed) -> int:
    """Bytes of the streamed operands one call reads: their size, or what the operator says a call reads of them where
    that is less (Operator.streamed_read: a sliding window reads the last keys of a cache, a ragged batch the keys each
    sequence holds), so that the rotation streams its COLD_FACTOR x LLC in bytes of the rotated operands the calls
    really read; what else a call reads (q, sinks, a block table) is never rotated and never counted."""
    size = nbytes(streamed)
    return int(size if op.streamed_read is None else min(size, op.streamed_read(case)))


def rotation(streamed: int, device, allocated: int | None = None) -> int:
    """How many copies of `streamed` bytes (the original included) keep each read cold when taken in turn; 0 where
    that would need more than MAX_COPIES or more memory than is free (then an eviction before each call). Each copy
    allocates `allocated` bytes (`streamed` unless a copy holds more than a call reads)."""
    count = copies_needed(streamed, cold_bytes())
    each = streamed if allocated is None else allocated
    return count if count <= MAX_COPIES and (count - 1) * each <= HEADROOM * free_bytes(device) else 0


def policy(device, timer) -> dict:
    """What run.json says of cold operands: on a GPU the L2 flush, on the host the rule below."""
    if device.type == "cuda":
        return {"cold": timer.flush_l2, "rule": "an L2 flush (a buffer 4x L2 read) before each call"
                if timer.flush_l2 else "no L2 flush: operands may stay in L2 between calls"}
    cold = timer.cold
    llc, source = last_level_cache()
    return {"cold": cold, "llc_bytes": llc, "llc_source": source, "cold_bytes": cold_bytes() if cold else 0,
            "max_copies": MAX_COPIES,
            "rule": ("host only: the operands each operator streams (attention k/v, linear w) are copied so that "
                     f"{COLD_FACTOR} x LLC streams between two reads of one copy, or, past {MAX_COPIES} copies, "
                     f"{COLD_FACTOR} x LLC is read before each call; activations stay warm; elementwise ops "
                     "read activations only (warm: judged against the cache level their footprint fits)"
                     if cold else "warm: operands stay in cache between calls (--warm)")}
