"""The linear operator's record: what the measuring path needs of it, registered by name."""

from ....kernels import prepare_linear
from ....profiles.names import linear_key_for
from ..records import Operator, register_operator
from . import baseline, cases, inputs, memory, reference
from .cases import LinearCase

LINEAR = register_operator(Operator(
    name="linear", case_type=LinearCase, flops=cases.flops, min_bytes=cases.min_bytes, moved_bytes=cases.moved_bytes,
    make_inputs=inputs.make_inputs, reference=reference.reference, baseline_error=baseline.baseline_error,
    prepare=lambda case, x, impl: prepare_linear(x.x, x.w, impl=impl),
    does_not_fit=memory.does_not_fit, key=linear_key_for, streamed=("w",), baseline_cap=baseline.CAP_UNITS,
))
