"""What one inference step of a decoder runs, op by op: prefill, decode and the hybrid chunked step (no torch).

A step is a list of `OpUse`: the fields of one measured case (its operator's constructor fields
without dtype and model) and how many times the step runs it. bench builds the cases from these
fields and measures them; analysis sums count x median latency over the rows with the same fields.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .models import DecoderConfig

PARTS = ("weights", "experts", "attention", "elementwise", "head")  # where a step's time goes (stacked bars)
MOE_ROUTING = "uniform"  # the routing a composed mixture-of-experts layer is measured with (a random router's)


@dataclass(frozen=True)
class OpUse:
    """One measured case a step runs `count` times; `part` and `label` say what it is for, `group` in which kind of
    layer (model.layer_kind: "moe/window", "dense/full", ...) where a model's layers differ ("" where they are all
    alike)."""

    op: str
    fields: tuple[tuple[str, object], ...]
    count: int
    part: str
    label: str
    group: str = ""
    reads_cache: bool = False  # an attention or mla call reading a cached prefix in place (decode, verify)

    @property
    def field_dict(self) -> dict:
        return dict(self.fields)


def _use(op: str, count: int, part: str, label: str, reads_cache: bool = False, **fields) -> OpUse:
    return OpUse(op, tuple(sorted(fields.items())), count, part, label, reads_cache=reads_cache)


MLA_ABSORBED_MAX = 2  # an MLA call of at most this many query tokens after a cached prefix runs absorbed (decode)


def _layer(config: DecoderConfig, tokens: int, phase: str, linear_phase: str, cache_len: int,
           attention: list[dict]) -> list[OpUse]:
    """Every decoder layer over `tokens` rows, one list of uses per kind of layer (DecoderConfig.layer_groups: a
    mixture's first dense layers, a window model's window and full layers) counted by how many layers run it."""
    groups = config.layer_groups()
    out = []
    for (mlp, kind), count in groups.items():
        group = "" if len(groups) == 1 else f"{mlp}/{kind}"
        uses = _one_layer(config, tokens, phase, linear_phase, cache_len, attention, mlp, kind)
        out += [dataclasses.replace(u, count=u.count * count, group=group) for u in uses]
    return out


def _one_layer(config: DecoderConfig, tokens: int, phase: str, linear_phase: str, cache_len: int,
               attention: list[dict], mlp: str, kind: str) -> list[OpUse]:
    """One decoder layer over `tokens` rows: norms, projections, rotary, the KV-cache append, the attention calls
    given (window and sinks as the layer's `kind` has them; MLA's as mla_attention), the MLP (SiLU-and-multiply
    between gate_up and down; a mixture's router, its routed experts and any shared experts, or the dense MLP of
    its first layers) and the residual adds."""
    proj = config.projections()
    ew = dict(m=tokens, phase=phase)
    mla = config.attention == "mla"
    mixture = mlp == "moe"
    names = ["q_kv_a", "q_b"] if mla else ["qkv", "o"]
    names += ["router", "gate_up", "down"] if mixture else ["dense_gate_up", "dense_down"] if config.is_moe \
        else ["gate_up", "down"]
    uses = [_use("elementwise", 2, "elementwise", "rmsnorm", kind="rmsnorm", n=config.hidden, **ew)]
    for name in names:
        if name in proj:  # a mixture's gate_up / down are its shared experts', where it has them
            n, k = proj[name]
            uses.append(_use("linear", 1, "weights", name, m=tokens, n=n, k=k, phase=linear_phase, projection=name))
    if mla:
        uses += mla_attention(config, tokens, phase, linear_phase, cache_len, attention)
    else:
        uses += [_use("elementwise", 1, "elementwise", "rotary", kind="rotary", n=config.q_heads,
                      head_dim=config.head_dim, kv_heads=config.kv_heads, **ew),
                 _use("elementwise", 1, "elementwise", "kv_append", kind="kv_append", n=config.kv_heads,
                      head_dim=config.head_dim, cache_len=cache_len, **ew)]
        extra = {**({"window_left": config.window_left} if kind == "window" else {}),
                 **({"sinks": True} if config.sinks else {})}
        for shape in attention:
            uses.append(_use("attention", 1, "attention", "attention", q_heads=config.q_heads,
                             kv_heads=config.kv_heads, head_dim=config.head_dim, causal=True, **shape, **extra))
    if mixture:  # the routed experts fuse their SiLU-and-multiply; the shared ones have their own
        uses.append(_use("moe", 1, "experts", "experts", m=tokens, n=config.intermediate, k=config.hidden,
                         experts=config.experts, top_k=config.top_k, routing=MOE_ROUTING, phase=linear_phase))
    width = next((proj[n][1] for n in ("down", "dense_down") if n in names and n in proj), 0)
    if width:
        uses.append(_use("elementwise", 1, "elementwise", "silu_mul", kind="silu_mul", n=width, **ew))
    uses.append(_use("elementwise", 2, "elementwise", "residual_add", kind="residual_add", n=config.hidden, **ew))
    return uses


def mla_attention(config: DecoderConfig, tokens: int, phase: str, linear_phase: str, cache_len: int,
                  attention: list[dict]) -> list[OpUse]:
    """MLA's attention half after q_kv_a (and q_b), as serving engines run it: the latent's and q_lora's norms, the
    rotary dims of the queries and of the one shared rotary key, the latent appended to the cache (as the K and V
    halves of one head), then per attention call either

    - absorbed (a decode call: at most MLA_ABSORBED_MAX query tokens after a cached prefix): kv_b's key half
      absorbed into the queries (q_absorb), the mla operator over the latent cache, kv_b's value half out of the
      latent output (v_up); the absorptions are torch.bmm over heads in vLLM and SGLang, composed as one linear of
      the same FLOPs and weight bytes (its activations are B x qk_nope instead of B x H x qk_nope);
    - or decompressed (a prompt or a chunk): kv_b up-projects every cached latent of the call's sequences to each
      head's key and value, and attention runs H heads of qk_nope + qk_rope dims, the value padded to them (as
      vLLM pads it for FlashAttention), bottom-right causal over a contiguous tensor;

    then the output projection o."""
    proj = config.projections()
    ew = dict(m=tokens, phase=phase)
    uses = []
    if config.q_lora_rank:
        uses.append(_use("elementwise", 1, "elementwise", "q_norm", kind="rmsnorm", n=config.q_lora_rank, **ew))
    uses += [_use("elementwise", 1, "elementwise", "kv_norm", kind="rmsnorm", n=config.kv_lora_rank, **ew),
             _use("elementwise", 1, "elementwise", "rotary", kind="rotary", n=config.q_heads,
                  head_dim=config.qk_rope_head_dim, kv_heads=1, **ew),
             _use("elementwise", 1, "elementwise", "kv_append", kind="kv_append", n=1,
                  head_dim=config.latent_dim // 2, cache_len=cache_len, **ew)]

    def linear(name: str, m: int) -> OpUse:
        n, k = proj[name]
        return _use("linear", 1, "weights", name, m=m, n=n, k=k, phase=linear_phase, projection=name)

    for shape in attention:
        batch, q_len, kv_len = shape["batch"], shape["q_len"], shape["kv_len"]
        if q_len <= MLA_ABSORBED_MAX and kv_len > q_len:
            uses += [linear("q_absorb", batch * q_len),
                     _use("mla", 1, "attention", "attention", reads_cache=True, batch=batch, q_heads=config.q_heads,
                          q_len=q_len, kv_len=kv_len, head_dim=config.latent_dim, head_dim_v=config.kv_lora_rank,
                          page_size=shape.get("page_size", 0)),
                     linear("v_up", batch * q_len)]
        else:
            uses += [linear("kv_b", batch * kv_len),
                     _use("attention", 1, "attention", "attention", batch=batch, q_len=q_len, kv_len=kv_len,
                          q_heads=config.q_heads, kv_heads=config.q_heads, head_dim=config.qk_head_dim, causal=True,
                          page_size=0)]
    return uses + [linear("o", tokens)]


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
    attention = [dict(batch=batch, q_len=1, kv_len=context + 1, page_size=page_size, reads_cache=True)]
    return (_layer(config, batch, "decode", "decode", batch * (context + 1), attention)
            + _head(config, batch))


def verify_step(config: DecoderConfig, batch: int, context: int, gamma: int, page_size: int = 0) -> list[OpUse]:
    """Speculative decoding's verify pass: each of `batch` sequences holding `context` tokens runs its last token and
    `gamma` draft tokens through the target: projections and elementwise work at M = batch x (gamma + 1), attention
    with gamma + 1 query tokens against the context (bottom-right causal), the head over every verified position."""
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
        raise ValueError(f"gamma: the draft tokens per iteration must be an int >= 1, got {gamma!r}")
    tokens = gamma + 1
    attention = [dict(batch=batch, q_len=tokens, kv_len=context + tokens, page_size=page_size, reads_cache=True)]
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
        attention.insert(0, dict(batch=decode_batch, q_len=1, kv_len=context + 1, page_size=page_size,
                                 reads_cache=True))
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


# projections a served format keeps in the activation dtype: the router (gpt-oss, DeepSeek-V3 and vLLM keep it in
# bf16), and MLA's absorbed halves of kv_b (vLLM absorbs a bf16 copy of the packed kv_b at load; kv_b itself, which
# decompresses the latent for a prompt, stays packed)
KEPT_FLOAT = frozenset({"router", "q_absorb", "v_up"})


def with_weights(uses: list[OpUse], scheme: str, experts: str = "") -> list[OpUse]:
    """The step with its decoder layers' projections (part "weights", less KEPT_FLOAT) packed by `scheme` (qlinear
    uses of the same fields plus scheme) and its routed experts by `experts` (moe uses plus scheme); the lm_head
    keeps the activation dtype, as serving stacks mostly leave it. "": unchanged."""
    if not scheme and not experts:
        return uses
    out = []
    for u in uses:
        if scheme and u.op == "linear" and u.part == "weights" and u.label not in KEPT_FLOAT:
            u = dataclasses.replace(u, op="qlinear", fields=tuple(sorted((*u.fields, ("scheme", scheme)))))
        elif experts and u.op == "moe":
            u = dataclasses.replace(u, fields=tuple(sorted((*u.fields, ("scheme", experts)))))
        out.append(u)
    return out


def with_kv_dtype(uses: list[OpUse], kv_dtype: str) -> list[OpUse]:
    """The step with the calls that read a cached prefix in place (`reads_cache`: decode and verify attention, a
    hybrid step's decode part, MLA's absorbed calls over its latent) stored as `kv_dtype` (fp8). A prompt's or a
    chunk's attention keeps the dtype (served engines upcast a chunk's prefix or attend to its fresh K/V), and so does
    MLA's decompressed attention (its K and V are kv_b's output, not the cache); the cache append is timed in the
    dtype. "": unchanged."""
    if not kv_dtype:
        return uses
    return [dataclasses.replace(u, fields=tuple(sorted((*u.fields, ("kv_dtype", kv_dtype))))) if u.reads_cache else u
            for u in uses]


def distinct_uses(steps) -> list[OpUse]:
    """Each (op, fields) once, across any number of steps: the cases to measure."""
    seen, out = set(), []
    for step in steps:
        for use in step:
            if (use.op, use.fields) not in seen:
                seen.add((use.op, use.fields))
                out.append(use)
    return out
