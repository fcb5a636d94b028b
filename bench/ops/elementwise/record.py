"""The elementwise operator's record: what the measuring path needs of it, registered by name."""

from ....profiles.names import elementwise_key_for
from ..records import Operator, register_operator
from . import cases, check
from .cases import ElementwiseCase

ELEMENTWISE = register_operator(Operator(
    name="elementwise", case_type=ElementwiseCase, flops=cases.flops, min_bytes=cases.min_bytes,
    moved_bytes=cases.moved_bytes,
    make_inputs=check.make_inputs, reference=check.reference, baseline_error=check.baseline_error,
    prepare=check.prepare, does_not_fit=check.does_not_fit, key=elementwise_key_for,
))
