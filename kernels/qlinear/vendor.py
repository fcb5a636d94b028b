"""The vendor quantized linear layers: torch's own weight-only GEMMs (the backend names the op).

- int8: torch._weight_int8pack_mm (per-channel scales in x's dtype). torch 2.13's host kernel reads past the end
  of K for bfloat16 activations unless K is a multiple of 16 (garbage or a segfault): there the weight is padded
  with zero columns once, when the call is planned, and x with zeros on each call (counted in its time).
- int4: on the host torch._convert_weight_to_int4pack_for_cpu + torch._weight_int4pack_mm_for_cpu (N a multiple
  of 16); on CUDA torch._convert_weight_to_int4pack + torch._weight_int4pack_mm (bf16, N a multiple of 8, the padded
  K a multiple of 32). Both take scales and zeros as [K / G, N, 2] with w = (q - 8) * scale + zero, the layout of
  phasebench's int4 schemes; the repacking happens when the call is planned, as a model does it at load time. When
  K is not a multiple of the group, x is padded with zeros on each call (counted in its time).
- fp8-e4m3 and fp8-b128: unsupported. torch._scaled_mm multiplies fp8 by fp8 (W8A8, with per-tensor, per-row or
  DeepSeek's block scales): it refuses a float activation, and quantizing x would change the math that the gate
  checks; torch 2.13 has no weight-only fp8 GEMM.
- mxfp4 and nvfp4: unsupported. torch._scaled_mm's fp4 path multiplies fp4 activations by fp4 weights with their
  block scales (W4A4, on Blackwell GPUs only); torch 2.13 has no weight-only fp4 GEMM on any device.

What they compute in (their rows' compute roof, `compute` below; docs/quantized.md cites the sources): on the host
every weight-only kernel turns x and the dequantized weights into fp32 and multiplies in fp32 (AVX-512 FMAs for bf16
x, a scalar loop for fp16 and fp32 x), with or without the CPU's bf16 instructions; on CUDA the int8 kernel runs fp32
FMAs on the CUDA cores, and the int4 kernel (tinygemm) bf16 MMAs on the tensor cores.
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F

from ..errors import Unsupported
from ..registry import Impl, PlannedCall, add_builtin
from .request import ACTIVATION_DTYPES, QLinearRequest
from .schemes import padded_k

INT4_CUDA_INNER_K_TILES = (8, 4, 2)  # the largest that divides the padded K in units of 16
# each weight's repacking for torch's int4 op, made once per (weight, activation dtype) and kept while the weight
# lives: a model repacks at load time, not per call
_PACKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _repacked(qweight, dtype: torch.dtype, pack) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed codes, scales and zeros [K / G, N, 2] in `dtype`) of qweight, `pack` making the codes once."""
    found = _PACKED.setdefault(qweight, {})
    if dtype not in found:
        sz = torch.stack((qweight.scales.T, qweight.zeros.T), dim=-1).to(dtype).contiguous()
        found[dtype] = (pack(qweight.nibbles().to(torch.int32)), sz)
    return found[dtype]


INT8_HOST_BF16_K = 16  # the K multiple torch's host int8 kernel needs for bfloat16 activations


def _int8(req: QLinearRequest) -> PlannedCall:
    qweight, x = req.qweight, req.x
    scales, qdata, kp = qweight.scales.to(x.dtype), qweight.qdata, req.k
    if req.device_type == "cpu" and req.dtype == torch.bfloat16 and req.k % INT8_HOST_BF16_K:
        kp = -(-req.k // INT8_HOST_BF16_K) * INT8_HOST_BF16_K
        found = _PACKED.setdefault(qweight, {})
        if ("int8", kp) not in found:
            found["int8", kp] = F.pad(qdata, (0, kp - req.k))
        qdata = found["int8", kp]
    x_of = _padded(x, kp)

    def run():
        try:
            return torch._weight_int8pack_mm(x_of(), qdata, scales)
        except NotImplementedError as err:  # no kernel for this device in this torch build
            raise Unsupported(f"torch._weight_int8pack_mm: {str(err).splitlines()[0]}") from None

    return PlannedCall("torch", "torch._weight_int8pack_mm", run)


def _padded(x: torch.Tensor, kp: int):
    k = x.shape[1]
    return (lambda: x) if kp == k else (lambda: F.pad(x, (0, kp - k)))


def _int4_host(req: QLinearRequest) -> PlannedCall:
    qweight = req.qweight
    if req.n % 16:
        raise Unsupported(f"torch._weight_int4pack_mm_for_cpu needs N a multiple of 16, got N = {req.n}")
    packed, sz = _repacked(qweight, req.dtype, lambda codes: torch._convert_weight_to_int4pack_for_cpu(codes, 1))
    group, x = qweight.group_size, _padded(req.x, padded_k(req.k, qweight.info))
    return PlannedCall("torch", "torch._weight_int4pack_mm_for_cpu",
                       lambda: torch._weight_int4pack_mm_for_cpu(x(), packed, group, sz))


def _int4_cuda(req: QLinearRequest) -> PlannedCall:
    qweight = req.qweight
    kp = padded_k(req.k, qweight.info)
    if req.dtype != torch.bfloat16:
        raise Unsupported(f"torch._weight_int4pack_mm on CUDA takes bfloat16 activations, got {req.dtype}")
    tiles = [t for t in INT4_CUDA_INNER_K_TILES if kp % (16 * t) == 0]
    if req.n % 8 or not tiles:
        raise Unsupported(f"torch._weight_int4pack_mm needs N a multiple of 8 and K a multiple of 32, got N = {req.n},"
                          f" padded K = {kp}")
    def pack(codes):  # its packing: even k in the high nibble
        return torch._convert_weight_to_int4pack((codes[:, 0::2] << 4 | codes[:, 1::2]).to(torch.uint8), tiles[0])

    packed, sz = _repacked(qweight, req.dtype, pack)
    group, x = qweight.group_size, _padded(req.x, kp)
    return PlannedCall("torch", "torch._weight_int4pack_mm", lambda: torch._weight_int4pack_mm(x(), packed, group, sz))


def _plan(req: QLinearRequest) -> PlannedCall:
    if req.scheme == "int8":
        return _int8(req)
    if req.scheme.startswith("int4"):
        return _int4_cuda(req) if req.device_type == "cuda" else _int4_host(req)
    if req.scheme in ("mxfp4", "nvfp4"):
        raise Unsupported(f"torch has no weight-only {req.scheme} GEMM: torch._scaled_mm takes fp4 activations and "
                          "weights with block scales (W4A4, Blackwell only) and refuses float activations")
    raise Unsupported(f"torch has no weight-only {req.scheme} GEMM: torch._scaled_mm multiplies fp8 activations "
                      "by fp8 weights (W8A8) and refuses float activations")


def compute(device_type: str, dtype: torch.dtype, fields) -> str:
    """The precision of torch's weight-only kernels' multiply-adds (the module docstring)."""
    return "bfloat16" if device_type == "cuda" and str(fields.get("scheme", "")).startswith("int4") else "float32"


def backends(device_type: str) -> str:
    int4 = "torch._weight_int4pack_mm" if device_type == "cuda" else "torch._weight_int4pack_mm_for_cpu"
    return f"torch._weight_int8pack_mm, {int4}"


TORCH_QLINEAR = add_builtin(Impl(
    name="torch",
    summary="torch's weight-only GEMMs: _weight_int8pack_mm (int8), _weight_int4pack_mm[_for_cpu] (int4); "
            "no fp8 or fp4",
    devices=frozenset({"cpu", "cuda"}),
    dtypes=frozenset(ACTIVATION_DTYPES),
    plan=_plan,
    backends=backends,
    op="qlinear",
    compute=compute,
))
