"""The linear operator's record: what the measuring path needs of it, registered by name."""

from ....kernels import prepare_linear
from ....profiles.names import linear_key_for
from ..records import Operator, register_operator
from . import cases, check
from .cases import LinearCase

LINEAR = register_operator(Operator(
    name="linear", case_type=LinearCase, flops=cases.flops, min_bytes=cases.min_bytes, moved_bytes=cases.moved_bytes,
    make_inputs=check.make_inputs, reference=check.reference, baseline_error=check.baseline_error,
    prepare=lambda case, x, impl: prepare_linear(x.x, x.w, impl=impl),
    does_not_fit=check.does_not_fit, key=linear_key_for, streamed=("w",),
))
