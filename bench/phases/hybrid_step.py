"""The hybrid iteration of continuous batching: B decode tokens and one prompt's chunk in one forward pass of the
reference decoder (projections, norms and MLP once over the B + c tokens stacked, attention per part)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .reference_decoder import DecoderLayer, ReferenceDecoder, rotate_half


@dataclass(frozen=True)
class HybridStep:
    """One iteration's work: `batch` decode sequences (cache rows 0..batch-1) each adding one token at position
    `context`, and `tokens` of one prompt (cache row `prompt_row`) at positions start..start+tokens-1; `last` when
    this chunk ends the prompt, so the head runs on its last token too. batch 0 is a prefill chunk alone; tokens 0
    a decode step alone."""

    batch: int
    context: int
    start: int = 0
    tokens: int = 0
    prompt_row: int | None = None  # default: the row after the decode users'
    last: bool = False

    @property
    def row(self) -> int:
        return self.batch if self.prompt_row is None else self.prompt_row

    def check(self, decoder: ReferenceDecoder) -> None:
        """One-line ValueErrors for an iteration that the decoder's caches cannot hold."""
        for name in ("batch", "context", "start", "tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name}: must be a non-negative int, got {value!r}")
        if self.batch + self.tokens == 0:
            raise ValueError("batch, tokens: an iteration needs a decode token or a prompt token")
        if self.batch > decoder.max_batch:
            raise ValueError(f"batch: {self.batch} decode sequences need more than max_batch={decoder.max_batch}")
        if self.batch and self.context + 1 > decoder.max_tokens:
            raise ValueError(f"context: {self.context} + 1 cache rows are more than max_tokens={decoder.max_tokens}")
        if self.tokens:
            if not 0 <= self.row < decoder.max_batch or self.row < self.batch:
                raise ValueError(f"prompt_row: must be in {self.batch}..{decoder.max_batch - 1} (after the decode "
                                 f"users' rows, within max_batch), got {self.row}")
            if self.start + self.tokens > decoder.max_tokens:
                raise ValueError(f"start + tokens: {self.start + self.tokens} cache rows are more than "
                                 f"max_tokens={decoder.max_tokens}")
        elif self.last:
            raise ValueError("last: a prompt ends only in an iteration that carries its tokens")


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [N, heads, D] rotated at each token's own position (cos, sin [N, D])."""
    return x * cos[:, None] + rotate_half(x) * sin[:, None]


def hybrid_layer(layer: DecoderLayer, x: torch.Tensor, step: HybridStep, cos: torch.Tensor,
                 sin: torch.Tensor) -> torch.Tensor:
    """One layer over x [B + c, hidden] (the decode tokens, then the chunk's), cos/sin at each token's position;
    the new K/V go into the decode users' rows at `context` and into the prompt's row at start..start+c-1."""
    b, c = step.batch, step.tokens
    hq, hkv, d = layer.q_heads, layer.kv_heads, layer.head_dim
    qkv = layer.qkv(layer.attn_norm(x))
    q, k, v = qkv.split((hq * d, hkv * d, hkv * d), dim=-1)
    q = _rope(q.view(-1, hq, d), cos, sin)
    k = _rope(k.view(-1, hkv, d), cos, sin)
    v = v.view(-1, hkv, d)
    parts = []
    if b:  # each user's one token against its own cache and itself
        end = step.context + 1
        layer.k_cache[:b, :, step.context] = k[:b]
        layer.v_cache[:b, :, step.context] = v[:b]
        attn = layer.attention(q[:b, :, None], layer.k_cache[:b, :, :end], layer.v_cache[:b, :, :end], False)
        parts.append(attn.reshape(b, hq * d))
    if c:  # the chunk against its prefix and causally against itself (the decoder's bottom-right mask)
        row, end = step.row, step.start + c
        layer.k_cache[row, :, step.start:end] = k[b:].transpose(0, 1)
        layer.v_cache[row, :, step.start:end] = v[b:].transpose(0, 1)
        attn = layer.attention(q[None, b:].transpose(1, 2), layer.k_cache[row:row + 1, :, :end],
                               layer.v_cache[row:row + 1, :, :end], c > 1)
        parts.append(attn.transpose(1, 2).reshape(c, hq * d))
    x = x + layer.o(torch.cat(parts) if len(parts) > 1 else parts[0])
    gate, up = layer.gate_up(layer.mlp_norm(x)).chunk(2, dim=-1)
    return x + layer.down(F.silu(gate) * up)


@torch.inference_mode()
def hybrid_step(decoder: ReferenceDecoder, step: HybridStep, x_decode: torch.Tensor | None = None,
                x_prompt: torch.Tensor | None = None, return_hidden: bool = False, depth: int | None = None):
    """One forward iteration of `step` through the decoder's layers (the first `depth`), then the final norm, the
    lm_head and the greedy pick once over the decode tokens and, when the chunk ends the prompt, its last token.
    x_decode [B, 1, hidden] and x_prompt [1, c, hidden] are the inputs (seeded random by default, as the decoder's).
    Returns ids [B] (plus 1 when `last`: the prompt's first generated token is the final id); with return_hidden
    also the last layer's output for the decode tokens [B, 1, hidden] and the chunk [1, c, hidden]."""
    step.check(decoder)
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int)
                              or not 0 <= depth <= len(decoder.layers)):
        raise ValueError(f"depth: must be an int in 0..{len(decoder.layers)} (the layers built), got {depth!r}")
    b, c, hidden = step.batch, step.tokens, decoder.config.hidden
    inputs = []
    for name, x, shape in (("x_decode", x_decode, (b, 1, hidden)), ("x_prompt", x_prompt, (1, c, hidden))):
        if shape[0] * shape[1] == 0:
            if x is not None:
                raise ValueError(f"{name}: given for an iteration without those tokens")
            continue
        if x is None:
            x = decoder._input(shape[0], shape[1]) if name == "x_decode" else decoder._input(1, c)
        if tuple(x.shape) != shape:
            raise ValueError(f"{name}: expected shape {list(shape)}, got {list(x.shape)}")
        inputs.append(x.reshape(-1, hidden))
    decoder._fill_cache()
    positions = torch.cat((torch.full((b,), step.context, dtype=torch.long),
                           torch.arange(step.start, step.start + c))).to(decoder.cos.device)
    cos, sin = decoder.cos[positions], decoder.sin[positions]
    h = torch.cat(inputs) if len(inputs) > 1 else inputs[0]
    for layer in decoder.layers[:depth]:
        h = hybrid_layer(layer, h, step, cos, sin)
    heads = torch.cat((h[:b], h[-1:])) if step.last else h[:b]  # the prompt's last token: the stack's last row
    ids = decoder.greedy(decoder.lm_head(decoder.final_norm(heads))) if len(heads) else heads.new_empty(0).long()
    if not return_hidden:
        return ids
    return ids, h[:b].view(b, 1, hidden), h[b:].view(1, c, hidden)


def chunk_plan(prompt: int, chunk: int | None) -> list[tuple[int, int]]:
    """(start, tokens) of each iteration that carries a prompt of `prompt` tokens in chunks of `chunk` (the last
    one shorter; None: the whole prompt in one iteration)."""
    if isinstance(prompt, bool) or not isinstance(prompt, int) or prompt < 1:
        raise ValueError(f"prompt: must be a positive int, got {prompt!r}")
    if chunk is None:
        return [(0, prompt)]
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk: must be a positive int or 'whole', got {chunk!r}")
    if chunk > prompt:
        raise ValueError(f"chunk: {chunk} tokens is more than the prompt's {prompt}")
    return [(start, min(chunk, prompt - start)) for start in range(0, prompt, chunk)]
