"""The quantized linear operator's record: what the measuring path needs of it, registered by name."""

from ....kernels import prepare_qlinear
from ....profiles.names import qlinear_key_for
from ..records import Operator, register_operator
from . import baseline, cases, inputs, memory, reference
from .cases import QLinearCase

QLINEAR = register_operator(Operator(
    name="qlinear", case_type=QLinearCase, flops=cases.flops, min_bytes=cases.min_bytes,
    moved_bytes=cases.moved_bytes, make_inputs=inputs.make_inputs, reference=reference.reference,
    baseline_error=baseline.baseline_error, prepare=lambda case, x, impl: prepare_qlinear(x.x, x.qweight, impl=impl),
    does_not_fit=memory.does_not_fit, key=qlinear_key_for, streamed=("qweight",), baseline_cap=baseline.CAP_UNITS,
))
