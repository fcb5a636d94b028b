"""The MLA decode operator's record: what the measuring path needs of it, registered by name."""

from ....kernels import prepare_mla
from ....profiles.names import mla_key_for
from ..attention.inputs import LOGIT_SCALE
from ..records import Operator, register_operator
from . import baseline, cases, inputs, memory, reference

MLA = register_operator(Operator(
    name="mla", case_type=cases.MLACase, flops=cases.flops, min_bytes=cases.min_bytes, moved_bytes=cases.moved_bytes,
    make_inputs=inputs.make_inputs, reference=reference.reference, baseline_error=baseline.baseline_error,
    prepare=lambda case, x, impl: prepare_mla(x.q, x.latent, impl=impl, scale=case.scale, v_dim=case.head_dim_v,
                                              cache_seqlens=x.cache_seqlens, block_table=x.block_table,
                                              latent_scale=x.latent_scale),
    does_not_fit=memory.does_not_fit, key=mla_key_for, streamed=("latent",),
    streamed_read=cases.latent_read_bytes, stress=inputs.large_logits,
    stress_note=f"large-logit inputs (q x {LOGIT_SCALE:g}: logits of about +-50 at DeepSeek's scale)",
    poison_unread=inputs.poison_unread, baseline_cap=baseline.CAP_UNITS,
))
