"""How much memory a (case, impl) needs against what the device has free, so sweeps skip what cannot fit."""

from __future__ import annotations

from pathlib import Path

import torch

from .cases import AttentionCase
from .correctness import REFERENCE_SCORE_BYTES, reference_dtype
from .cost import ELEMENT_BYTES, min_bytes

HEADROOM = 0.85  # leave room for the allocator, the L2 flush buffer and fragmentation


def tensors_bytes(case: AttentionCase) -> int:
    """q, k, v and the output: the cost model's minimum traffic is exactly their size."""
    return int(min_bytes(case))


def reference_bytes(case: AttentionCase, device: torch.device) -> int:
    """Upcast copies of q, k, v, o plus one chunk of reference scores."""
    elem = torch.finfo(reference_dtype(case, device)).bits // 8
    upcast = tensors_bytes(case) * elem // ELEMENT_BYTES[case.dtype]
    scores = min(REFERENCE_SCORE_BYTES, case.batch * case.q_heads * case.q_len * case.kv_len * elem * 3)
    return upcast + scores


def impl_bytes(case: AttentionCase, impl: str) -> int:
    """Scratch an implementation allocates beyond its output."""
    if impl == "naive":  # scores in the dtype, fp32 copy, fp32 softmax, probabilities in the dtype
        return case.batch * case.q_heads * case.q_len * case.kv_len * (2 * ELEMENT_BYTES[case.dtype] + 9)
    # split-KV partials and the per-row statistics of tiled kernels are small
    return case.batch * case.q_heads * case.q_len * (case.head_dim + 2) * 4 * 128


def free_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62  # unknown: do not skip


def does_not_fit(case: AttentionCase, impl: str, device: torch.device) -> str | None:
    """A one-line reason when the case would not fit in memory here, else None."""
    need = tensors_bytes(case) + reference_bytes(case, device) + impl_bytes(case, impl)
    free = free_bytes(device)
    if need > HEADROOM * free:
        return f"needs about {need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free on {device.type}"
    return None
