"""The seeded inputs of an MLA decode case (q and the latent cache, contiguous or paged), its large-logit stress, and
the NaN the gate puts past each sequence's length."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from ...instruments.roofline import TORCH_DTYPES
from ..attention.inputs import LOGIT_SCALE, CaseInputs, fill_past_the_end, quantize_e4m3
from ..attention.pages import make_pages
from .cases import MLACase


@dataclass(frozen=True)
class MLAInputs:
    q: torch.Tensor  # [B, Hq, Sq, D]
    latent: torch.Tensor  # [B, 1, Sk, D], or a pool of pages [num_pages, page_size, 1, D]
    cache_seqlens: torch.Tensor | None = None
    block_table: torch.Tensor | None = None
    latent_scale: torch.Tensor | None = None  # an fp8 case's float32 scale [] (latent then holds e4m3 codes)

    def as_attention(self, case: MLACase) -> CaseInputs:
        """The attention operator's inputs over the latent: key the latent, value a view of its first Dv dims (an fp8
        latent's one scale for both)."""
        return CaseInputs(self.q, self.latent, self.latent[..., :case.head_dim_v], self.cache_seqlens,
                          self.block_table, k_scale=self.latent_scale, v_scale=self.latent_scale)


def make_inputs(case: MLACase, device: torch.device, seed: int = 0) -> MLAInputs:
    """Standard-normal q and latent in the case's dtype, from a fixed seed; a paged case's latent is a pool of pages in
    shuffled order with its block table (attention's make_pages, one pool), read with cache_seqlens."""
    gen = torch.Generator(device=device).manual_seed(seed)
    dtype = TORCH_DTYPES[case.dtype]
    q = torch.randn((case.batch, case.q_heads, case.q_len, case.head_dim), generator=gen, device=device, dtype=dtype)
    if case.paged:
        latent, table = make_pages(case.attention, gen, dtype, device, pools=1)
        return fp8_latent(case, MLAInputs(q, latent, torch.tensor(case.lengths, dtype=torch.int32, device=device),
                                          table))
    latent = torch.randn((case.batch, 1, case.kv_len, case.head_dim), generator=gen, device=device, dtype=dtype)
    lens = None if case.seqlens is None else torch.tensor(case.seqlens, dtype=torch.int32, device=device)
    return fp8_latent(case, MLAInputs(q, latent, lens))


def fp8_latent(case: MLACase, inputs: MLAInputs) -> MLAInputs:
    """An fp8 case's latent (contiguous or a pool) quantized to e4m3 with one scale for the tensor; others unchanged."""
    if case.kv_dtype != "fp8":
        return inputs
    latent, scale = quantize_e4m3(inputs.latent, None)
    return dataclasses.replace(inputs, latent=latent, latent_scale=scale)


def large_logits(case: MLACase, inputs: MLAInputs) -> MLAInputs:
    """The same latent with q x LOGIT_SCALE: logits of about +-50 at DeepSeek's scale, past exp's range unless the
    kernel subtracts the running max."""
    return dataclasses.replace(inputs, q=inputs.q * LOGIT_SCALE)


def poison_unread(case: MLACase, inputs: MLAInputs) -> None:
    """NaN in the latent past each sequence's length, before every judged call (attention's rule over one pool)."""
    fill_past_the_end(case.attention, (inputs.latent,), inputs.block_table)
