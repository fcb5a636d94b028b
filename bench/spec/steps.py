"""What one inference step of a decoder runs, op by op: prefill, decode and the hybrid chunked step (no torch).

A step is a list of `OpUse`: the fields of one measured case (its operator's constructor fields
without dtype and model) and how many times the step runs it. bench builds the cases from these
fields and measures them; analysis sums count x median latency over the rows with the same fields.
"""

from __future__ import annotations

from dataclasses import dataclass

from .models import DecoderConfig

PARTS = ("weights", "experts", "attention", "elementwise", "head")  # where a step's time goes (stacked bars)
MOE_ROUTING = "uniform"  # the routing a composed mixture-of-experts layer is measured with (a random router's)


@dataclass(frozen=True)
class OpUse:
    """One measured case a step runs `count` times; `part` and `label` say what it is for."""

    op: str
    fields: tuple[tuple[str, object], ...]
    count: int
    part: str
    label: str

    @property
    def field_dict(self) -> dict:
        return dict(self.fields)


def _use(op: str, count: int, part: str, label: str, **fields) -> OpUse:
    return OpUse(op, tuple(sorted(fields.items())), count, part, label)


def _layer(config: DecoderConfig, tokens: int, phase: str, linear_phase: str, cache_len: int,
           attention: list[dict]) -> list[OpUse]:
    """One decoder layer over `tokens` rows, times config.layers: norms, projections, rotary, the KV-cache
    append, the attention calls given, the MLP (SiLU-and-multiply between gate_up and down; a mixture's router, its
    routed experts and any shared experts) and the residual adds."""
    n_layers = config.layers
    proj = config.projections()
    ew = dict(m=tokens, phase=phase)
    uses = [_use("elementwise", 2 * n_layers, "elementwise", "rmsnorm", kind="rmsnorm", n=config.hidden, **ew)]
    for name in ("qkv", "o", "router", "gate_up", "down"):
        if name not in proj:  # a mixture has a router, and gate_up / down only for its shared experts
            continue
        n, k = proj[name]
        uses.append(_use("linear", n_layers, "weights", name, m=tokens, n=n, k=k, phase=linear_phase,
                         projection=name))
    uses += [
        _use("elementwise", n_layers, "elementwise", "rotary", kind="rotary", n=config.q_heads,
             head_dim=config.head_dim, kv_heads=config.kv_heads, **ew),
        _use("elementwise", n_layers, "elementwise", "kv_append", kind="kv_append", n=config.kv_heads,
             head_dim=config.head_dim, cache_len=cache_len, **ew),
    ]
    for shape in attention:
        uses.append(_use("attention", n_layers, "attention", "attention", q_heads=config.q_heads,
                         kv_heads=config.kv_heads, head_dim=config.head_dim, causal=True, **shape))
    if config.is_moe:  # the routed experts fuse their SiLU-and-multiply; the shared ones have their own
        uses.append(_use("moe", n_layers, "experts", "experts", m=tokens, n=config.intermediate, k=config.hidden,
                         experts=config.experts, top_k=config.top_k, routing=MOE_ROUTING, phase=linear_phase))
    if "gate_up" in proj:
        uses.append(_use("elementwise", n_layers, "elementwise", "silu_mul", kind="silu_mul", n=proj["down"][1], **ew))
    uses.append(_use("elementwise", 2 * n_layers, "elementwise", "residual_add", kind="residual_add", n=config.hidden,
                     **ew))
    return uses


def _head(config: DecoderConfig, rows: int) -> list[OpUse]:
    """After the layers, on the rows whose next token is wanted: final norm, lm_head, greedy pick. These run
    per token in every phase (a GEMV-like lm_head at M = rows), so they are decode cases wherever they run."""
    if rows == 0:
        return []
    n, k = config.projections()["lm_head"]
    ew = dict(m=rows, phase="decode")
    return [_use("elementwise", 1, "head", "final_norm", kind="rmsnorm", n=config.hidden, **ew),
            _use("linear", 1, "head", "lm_head", m=rows, n=n, k=k, phase="decode", projection="lm_head"),
            _use("elementwise", 1, "head", "greedy_pick", kind="greedy_pick", n=config.vocab, **ew)]


def prefill_step(config: DecoderConfig, prompt: int, batch: int = 1) -> list[OpUse]:
    """The prompt of `batch` sequences at once: M = batch x prompt rows; lm_head on each last token."""
    attention = [dict(batch=batch, q_len=prompt, kv_len=prompt, page_size=0)]
    return (_layer(config, batch * prompt, "prefill", "prefill", batch * prompt, attention)
            + _head(config, batch))


def decode_step(config: DecoderConfig, batch: int, context: int, page_size: int = 0) -> list[OpUse]:
    """One new token for each of `batch` sequences that hold `context` tokens: M = batch; the KV cache read in
    pages of `page_size` tokens (0: contiguous)."""
    attention = [dict(batch=batch, q_len=1, kv_len=context + 1, page_size=page_size)]
    return (_layer(config, batch, "decode", "decode", batch * (context + 1), attention)
            + _head(config, batch))


def verify_step(config: DecoderConfig, batch: int, context: int, gamma: int, page_size: int = 0) -> list[OpUse]:
    """Speculative decoding's verify pass: each of `batch` sequences holding `context` tokens runs its last token and
    `gamma` draft tokens through the target: projections and elementwise work at M = batch x (gamma + 1), attention
    with gamma + 1 query tokens against the context (bottom-right causal), the head over every verified position."""
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
        raise ValueError(f"gamma: the draft tokens per iteration must be an int >= 1, got {gamma!r}")
    tokens = gamma + 1
    attention = [dict(batch=batch, q_len=tokens, kv_len=context + tokens, page_size=page_size)]
    return (_layer(config, batch * tokens, "chunked_prefill", "decode", batch * (context + tokens), attention)
            + _head(config, batch * tokens))


def hybrid_step(config: DecoderConfig, decode_batch: int, context: int, chunk: int, prefix: int,
                last_chunk: bool, page_size: int = 0) -> list[OpUse]:
    """Sarathi-Serve's step: `decode_batch` decode tokens and a `chunk`-token slice of a prompt (after `prefix`
    cached tokens) in one batch: the projections and elementwise work at M = decode_batch + chunk, attention as
    a decode call plus a chunk call; the head on the decode tokens, and on the chunk's last token when it ends
    the prompt."""
    attention = [dict(batch=1, q_len=chunk, kv_len=prefix + chunk, page_size=page_size)]
    if decode_batch:
        attention.insert(0, dict(batch=decode_batch, q_len=1, kv_len=context + 1, page_size=page_size))
    tokens = decode_batch + chunk
    cache = decode_batch * (context + 1) + prefix + chunk  # every sequence's cache rows
    rows = decode_batch + (1 if last_chunk else 0)
    return (_layer(config, tokens, "chunked_prefill", "prefill", cache, attention)
            + _head(config, rows))


def chunked_prefill_steps(config: DecoderConfig, prompt: int, chunk: int, decode_batch: int,
                          context: int, page_size: int = 0) -> list[list[OpUse]]:
    """The hybrid steps that carry a `prompt` through in `chunk`-token slices beside a running decode batch."""
    if chunk < 1:
        raise ValueError(f"chunk: must be a positive int, got {chunk!r}")
    steps, prefix = [], 0
    while prefix < prompt:
        size = min(chunk, prompt - prefix)
        steps.append(hybrid_step(config, decode_batch, context, size, prefix, prefix + size == prompt, page_size))
        prefix += size
    return steps


def with_weights(uses: list[OpUse], scheme: str) -> list[OpUse]:
    """The step with its decoder layers' projections (part "weights") packed by `scheme` (qlinear uses of the same
    fields plus scheme); the lm_head keeps the activation dtype, as serving stacks mostly leave it. "": unchanged."""
    if not scheme:
        return uses
    return [OpUse("qlinear", tuple(sorted((*u.fields, ("scheme", scheme)))), u.count, u.part, u.label)
            if u.op == "linear" and u.part == "weights" else u for u in uses]


def distinct_uses(steps) -> list[OpUse]:
    """Each (op, fields) once, across any number of steps: the cases to measure."""
    seen, out = set(), []
    for step in steps:
        for use in step:
            if (use.op, use.fields) not in seen:
                seen.add((use.op, use.fields))
                out.append(use)
    return out
