"""The elementwise operator's record: what the measuring path needs of it, registered by name."""

from ....kernels import prepare_elementwise
from ....profiles.names import elementwise_key_for
from ..records import Operator, register_operator
from . import baseline, cases, inputs, memory, reference
from .cases import ElementwiseCase

ELEMENTWISE = register_operator(Operator(
    name="elementwise", case_type=ElementwiseCase, flops=cases.flops, min_bytes=cases.min_bytes,
    make_inputs=inputs.make_inputs, reference=reference.reference, baseline_error=baseline.baseline_error,
    prepare=lambda case, x, impl: prepare_elementwise(case.kind, *x.tensors, impl=impl),
    does_not_fit=memory.does_not_fit, key=elementwise_key_for, poison_written=inputs.poison_written,
))
