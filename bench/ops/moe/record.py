"""The routed-experts operator's record: what the measuring path needs of it, registered by name."""

from ....kernels import prepare_moe
from ....profiles.names import moe_key_for
from ..records import Operator, register_operator
from . import baseline, cases, inputs, memory, reference
from .cases import MoeCase

MOE = register_operator(Operator(
    name="moe", case_type=MoeCase, flops=cases.flops, min_bytes=cases.min_bytes, moved_bytes=cases.moved_bytes,
    make_inputs=inputs.make_inputs, reference=reference.reference, baseline_error=baseline.baseline_error,
    prepare=lambda case, x, impl: prepare_moe(x.x, x.w_gate_up, x.w_down, x.topk_weights, x.topk_ids, impl=impl),
    does_not_fit=memory.does_not_fit, key=moe_key_for, streamed=("experts",),
))
