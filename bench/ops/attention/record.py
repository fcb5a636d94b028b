"""The attention operator's record: what the measuring path needs of it, registered by name."""

from ....kernels import prepare
from ....profiles.names import case_key_for
from ..records import Operator, register_operator
from . import baseline, cost, inputs, memory, reference
from .cases import AttentionCase

ATTENTION = register_operator(Operator(
    name="attention", case_type=AttentionCase, flops=cost.flops, min_bytes=cost.min_bytes, moved_bytes=cost.moved_bytes,
    make_inputs=inputs.make_inputs, reference=reference.reference, baseline_error=baseline.baseline_error,
    prepare=lambda case, x, impl: prepare(x.q, x.k, x.v, impl=impl, causal=case.causal,
                                          cache_seqlens=x.cache_seqlens, block_table=x.block_table,
                                          window_left=case.window_left, sinks=x.sinks, k_scale=x.k_scale,
                                          v_scale=x.v_scale),
    does_not_fit=memory.does_not_fit, key=case_key_for, streamed=("k", "v"),
    streamed_read=cost.kv_read_bytes, stress=inputs.large_logits,
    baseline_cap=baseline.CAP_UNITS, poison_unread=inputs.poison_unread,
    stress_note=f"large-logit inputs (q x {inputs.LOGIT_SCALE:g}: logits of about +-100, past exp's range without "
                "softmax's max subtraction)",
))
