"""Poisoned memory around the gate's calls: fresh allocations come back NaN while a judged call runs, and judged
outputs are NaN-filled before their memory is released, so that no right answer lingers where the next kernel's
torch.empty may find it (the CUDA caching allocator's block, the host allocator's chunk)."""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from collections.abc import Collection

import torch
import torch.utils.deterministic


@contextlib.contextmanager
def poisoned_allocations():
    """While the block runs, every uninitialised allocation torch makes (torch.empty in a kernel, a plugin or an op's
    own output) comes back filled: NaN for floating dtypes, the largest value for integers. This is torch's own
    fill_uninitialized_memory, which acts under use_deterministic_algorithms; warn_only, so that no op refuses to run
    (an op with a deterministic variant may take it here). The gate's first calls run inside it, and so does the
    checked call after the timed samples (bench.instruments.timing), which is not a sample: the fill takes time."""
    was_on = torch.are_deterministic_algorithms_enabled()
    was_warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    was_filling = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*[Dd]eterministic.*")
            yield
    finally:
        torch.utils.deterministic.fill_uninitialized_memory = was_filling
        torch.use_deterministic_algorithms(was_on, warn_only=was_warn_only)


def tensors_in(obj) -> list[torch.Tensor]:
    """The tensors of an output or of an inputs record: a tensor, a tuple or list of them, a dataclass's fields."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (tuple, list)):
        return [t for item in obj for t in tensors_in(item)]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [t for f in dataclasses.fields(obj) for t in tensors_in(getattr(obj, f.name))]
    return []


def storages(obj) -> set[int]:
    """The addresses of the storages of the tensors in `obj` (tensors_in)."""
    return {t.untyped_storage().data_ptr() for t in tensors_in(obj)}


def scrub(out, keep=(), skip: Collection[int] = ()) -> None:
    """Fill each tensor of a judged output with NaN (integers: their largest value) before it is released; tensors
    that share memory with `keep` (the inputs: an in-place op returns its caches), or whose storage is in `skip`
    (addresses), are left as they are."""
    kept = storages(keep) | set(skip)
    for t in tensors_in(out):
        if t.numel() == 0 or t.dtype == torch.bool or t.untyped_storage().data_ptr() in kept:
            continue
        if t.is_floating_point():
            t.fill_(float("nan"))
        elif not t.is_complex():
            t.fill_(torch.iinfo(t.dtype).max)
