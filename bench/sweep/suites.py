"""The benchmark suites written as data: attention and linear sweeps per device type, and their cases."""

from __future__ import annotations

import itertools

from ..ops.attention.cases import RaggedSweep, Sweep, WindowSweep
from ..ops.elementwise.cases import ElementwiseSweep
from ..ops.linear.cases import LinearSweep
from ..ops.mla.cases import MLASweep
from ..ops.moe.cases import MoeSweep
from ..ops.qlinear.cases import quant_sweeps
from ..spec.models import model_config

K = 1024
# Each suite has a GPU and a CPU variant: the CPU sizes keep interpreter rows to seconds.
SUITES: dict[str, dict[str, list[Sweep]]] = {
    "quick": {
        "cuda": [Sweep(("llama-3-8b",), (1,), seq=(2 * K,)),
                 Sweep(("llama-3-8b",), (1,), chunk=(512,), prefix=(4 * K,)),
                 Sweep(("llama-3-8b",), (1,), chunk=(4,), prefix=(4 * K,)),
                 Sweep(("llama-3-8b",), (8,), kv=(8 * K,))],
        "cpu": [Sweep(("llama-3-8b",), (1,), seq=(128,)),
                Sweep(("llama-3-8b",), (1,), chunk=(32,), prefix=(224,)),
                Sweep(("llama-3-8b",), (1,), chunk=(4,), prefix=(252,)),
                Sweep(("llama-3-8b",), (2,), kv=(512,))],
    },
    "prefill": {
        "cuda": [Sweep(("llama-3-8b",), (1,), causal=(True, False), seq=(512, K, 2 * K, 4 * K, 8 * K, 16 * K, 32 * K))],
        "cpu": [Sweep(("llama-3-8b",), (1,), causal=(True, False), seq=(64, 128, 256))],
    },
    "chunked": {
        "cuda": [Sweep(("llama-3-8b",), (1,), chunk=(256, K, 4 * K), prefix=(4 * K, 16 * K, 28 * K))],
        "cpu": [Sweep(("llama-3-8b",), (1,), chunk=(32, 64), prefix=(192, 448))],
    },
    "decode": {
        "cuda": [Sweep(("llama-3-8b",), (1, 4, 16, 64, 256), kv=(K, 4 * K, 16 * K, 32 * K, 64 * K, 128 * K))],
        "cpu": [Sweep(("llama-3-8b",), (1, 4), kv=(256, 1 * K))],
    },
    "verify": {
        "cuda": [Sweep(("llama-3-8b",), (1, 8), chunk=(2, 4, 8, 16), prefix=(4 * K, 32 * K))],
        "cpu": [Sweep(("llama-3-8b",), (1,), chunk=(2, 8, 16), prefix=(256,))],
    },
}
SUITES["ragged"] = {
    "cuda": [RaggedSweep(("llama-3-8b",), (16, 64), kv_max=(32 * K, 128 * K))],
    "cpu": [RaggedSweep(("llama-3-8b",), (5,), kv_max=(1 * K,))],
}
# Paged KV caches: page sizes against the contiguous cache (page 0) at the same lengths and batches, ragged included
PAGES = (0, 16, 64, 256)
SUITES["paged"] = {
    "cuda": [Sweep(("llama-3-8b",), (8, 64), kv=(8 * K, 32 * K), pages=PAGES),
             RaggedSweep(("llama-3-8b",), (64,), kv_max=(32 * K,), pages=PAGES),
             Sweep(("llama-3-8b",), (8,), chunk=(4,), prefix=(8 * K,), pages=PAGES),
             Sweep(("llama-3-8b",), (1,), chunk=(512,), prefix=(8 * K,), pages=PAGES)],
    "cpu": [Sweep(("llama-3-8b",), (4,), kv=(1 * K,), pages=PAGES),
            RaggedSweep(("llama-3-8b",), (5,), kv_max=(1 * K,), pages=PAGES),
            Sweep(("llama-3-8b",), (1,), chunk=(4,), prefix=(508,), pages=PAGES)],
}
LINEAR_MODELS = ("llama-3-8b", "llama-3-70b")
SUITES["decode-linear"] = {
    "cuda": [LinearSweep(LINEAR_MODELS, (1, 2, 4, 8, 16, 32, 64, 128, 256), "decode",
                         ("qkv", "o", "gate_up", "down", "lm_head"))],
    "cpu": [LinearSweep(("llama-3-8b",), (1, 8, 64), "decode")],
}
SUITES["prefill-linear"] = {
    "cuda": [LinearSweep(LINEAR_MODELS, (512, K, 2 * K, 4 * K, 8 * K, 16 * K), "prefill")],
    # Triton's interpreter takes minutes per call on a host GEMM of M = 1024: host sizes stay small
    "cpu": [LinearSweep(("llama-3-8b",), (128, 256), "prefill", ("o",))],
}
SUITES["quick"]["cuda"] += [LinearSweep(("llama-3-8b",), (8,), "decode", ("gate_up",)),
                            LinearSweep(("llama-3-8b",), (2 * K,), "prefill", ("gate_up",))]
SUITES["quick"]["cpu"] += [LinearSweep(("llama-3-8b",), (96,), "prefill", ("o",))]
# Weight-only quantized projections beside the same projections unquantized (linear rows, `scheme` blank): the
# speedup per scheme and M against the ideal bytes ratio, the served formats (mxfp4, nvfp4, fp8-b128) included; a
# mixture's routed expert as expert_gate_up / expert_down (--model gpt-oss-20b). The host keeps three M (impls that
# run in Triton's interpreter take seconds a call on the larger projections; name --impl naive torch for timings).
SUITES["decode-quant"] = {
    "cuda": quant_sweeps(("llama-3-8b",), (1, 2, 4, 8, 16, 32, 64), ("qkv", "o", "gate_up", "down", "expert_gate_up",
                                                                   "expert_down", "lm_head")),
    "cpu": quant_sweeps(("llama-3-8b",), (1, 4, 16), ("qkv", "o", "gate_up", "down", "expert_gate_up", "expert_down")),
}
# one int4 GEMV row in the quick suite, in bf16 beside the same GEMV unquantized in bf16: the vendor path a server
# runs (in fp32 torch's host int4 kernel takes a scalar loop, and reads 9x slower than the float GEMV beside it)
SUITES["quick"]["cuda"] += quant_sweeps(("llama-3-8b",), (1,), ("gate_up",), ("int4-g128",), "bfloat16")
SUITES["quick"]["cpu"] += quant_sweeps(("llama-3-8b",), (1,), ("o",), ("int4-g128",), "bfloat16")
# Attention as current models run it, at the same batches and contexts on each device so that one roofline sets them
# side by side (decode-kinds, with GQA decode of the same context): DeepSeek's MLA over a latent cache (Sq 1 and 2 of
# multi-token prediction), gpt-oss's window layers (window 127 with sinks) beside its full layers (sinks, no window),
# paged too; and the prefill of both kinds of gpt-oss layer. The host keeps two contexts and the smaller batches:
# Triton's interpreter takes seconds a call at 64 heads.
KIND_BATCH = {"cuda": (1, 16, 64), "cpu": (1, 4)}
KIND_CONTEXT = {"cuda": (K, 4 * K, 16 * K, 64 * K), "cpu": (512, K)}
SUITES["mla-decode"] = {
    "cuda": [MLASweep(("deepseek-v2-lite", "deepseek-v3"), KIND_BATCH["cuda"], KIND_CONTEXT["cuda"], q_lens=(1, 2)),
             MLASweep(("deepseek-v3",), (16,), (16 * K,), pages=(64,))],
    "cpu": [MLASweep(("deepseek-v2-lite",), KIND_BATCH["cpu"], KIND_CONTEXT["cpu"]),
            MLASweep(("deepseek-v3",), (1,), (K,)),
            MLASweep(("deepseek-v2-lite",), (2,), (600,), q_lens=(2,), pages=(64,))],
}
SUITES["window-decode"] = {
    "cuda": [WindowSweep(("gpt-oss-20b",), KIND_BATCH["cuda"], kv=KIND_CONTEXT["cuda"]),
             WindowSweep(("gpt-oss-20b",), (16,), kv=(16 * K,), pages=(16, 64))],
    "cpu": [WindowSweep(("gpt-oss-20b",), KIND_BATCH["cpu"], kv=KIND_CONTEXT["cpu"]),
            WindowSweep(("gpt-oss-20b",), (2,), kv=(600,), layers=("window",), pages=(16,))],
}
SUITES["sink-prefill"] = {
    "cuda": [WindowSweep(("gpt-oss-20b",), (1,), seq=(K, 4 * K, 16 * K)),
             WindowSweep(("gpt-oss-20b",), (1,), chunk=(512,), prefix=(4 * K, 16 * K))],
    "cpu": [WindowSweep(("gpt-oss-20b",), (1,), seq=(128, 256)),
            WindowSweep(("gpt-oss-20b",), (1,), chunk=(32,), prefix=(224,))],
}
SUITES["decode-kinds"] = {dev: [*SUITES["mla-decode"][dev], *SUITES["window-decode"][dev],
                                Sweep(("llama-3-8b",), KIND_BATCH[dev], kv=KIND_CONTEXT[dev])]
                          for dev in ("cuda", "cpu")}
# An fp8 KV cache (e4m3, a float32 scale per KV head; the MLA latent's one scale) beside the same cache in the dtype,
# case for case: decode at long contexts (the host keeps to 1K keys: Triton's interpreter takes seconds a call there,
# 10 s at 16K), a paged cache, verify's few query tokens and MLA's latent. Run it with impls that read fp8 (naive,
# triton): SDPA and flex rows are skipped with their reason. `phasebench phases --kv-dtype fp8 --context 16384` times
# a 16K-key decode step on the host.
FP8_KV = ("", "fp8")
SUITES["fp8-kv-decode"] = {
    "cuda": [Sweep(("llama-3-8b",), (1, 16, 64), kv=(4 * K, 16 * K, 64 * K), kv_dtypes=FP8_KV),
             Sweep(("llama-3-8b",), (16,), kv=(16 * K,), pages=(16, 64), kv_dtypes=FP8_KV),
             Sweep(("llama-3-8b",), (8,), chunk=(4,), prefix=(16 * K,), kv_dtypes=FP8_KV),
             MLASweep(("deepseek-v3",), (16,), (4 * K, 16 * K), kv_dtypes=FP8_KV)],
    "cpu": [Sweep(("llama-3-8b",), (1, 4), kv=(K,), kv_dtypes=FP8_KV),
            Sweep(("llama-3-8b",), (2,), kv=(K,), pages=(16,), kv_dtypes=FP8_KV),
            Sweep(("llama-3-8b",), (1,), chunk=(4,), prefix=(K - 4,), kv_dtypes=FP8_KV),
            MLASweep(("deepseek-v2-lite",), (1,), (K,), kv_dtypes=FP8_KV)],
}
# Routed experts (moe): decode batches from 1 to 256 tokens, where the experts a step reads grow with the batch until
# every one is touched, and prefill's thousands of tokens; uniform routing for every preset, skewed (Zipf, exponent
# 1.2) and balanced for Qwen3's 128 experts. The host runs an awkward small mixture (12 experts, top 3, hidden 200,
# intermediate 72: K and N multiples of 8 for torch._grouped_mm) unless --model names a preset.
MOE_MODELS = ("qwen3-30b-a3b", "mixtral-8x7b", "deepseek-v2-lite", "gpt-oss-20b")
MOE_HOST = ("name=moe-host,hidden=200,intermediate=72,layers=2,q_heads=4,kv_heads=2,head_dim=16,vocab=256,experts=12,"
            "top_k=3")
MOE_ROUTINGS = ("uniform", "zipf-1.2", "balanced")
SUITES["moe-decode"] = {
    "cuda": [MoeSweep(MOE_MODELS, (1, 2, 4, 8, 16, 32, 64, 128, 256), "decode"),
             MoeSweep(("qwen3-30b-a3b",), (1, 4, 16, 64, 256), "decode", MOE_ROUTINGS[1:])],
    "cpu": [MoeSweep((MOE_HOST,), (1, 3, 8, 21, 64, 256), "decode", MOE_ROUTINGS)],
}
SUITES["moe-prefill"] = {
    "cuda": [MoeSweep(MOE_MODELS, (512, K, 2 * K, 4 * K, 8 * K, 16 * K), "prefill"),
             MoeSweep(("qwen3-30b-a3b",), (2 * K, 8 * K), "prefill", MOE_ROUTINGS[1:])],
    "cpu": [MoeSweep((MOE_HOST,), (100, 257), "prefill", MOE_ROUTINGS)],
}
# The memory-bound ops beside attention and the projections (rmsnorm, the residual add, SiLU x up), eager against
# compiled: decode batches and a prefill chunk of tokens.
SUITES["elementwise"] = {
    "cuda": [ElementwiseSweep(LINEAR_MODELS, (1, 8, 64, 256), "decode"),
             ElementwiseSweep(LINEAR_MODELS, (2 * K, 8 * K), "prefill")],
    "cpu": [ElementwiseSweep(("llama-3-8b",), (1, 8, 64), "decode"),
            ElementwiseSweep(("llama-3-8b",), (512,), "prefill")],
}
FULL = ("prefill", "chunked", "decode", "verify", "ragged", "paged", "decode-linear", "prefill-linear")
SUITES["full"] = {dev: [s for name in FULL for s in SUITES[name][dev]]
                  for dev in ("cuda", "cpu")}


def suite_cases(suite: str, device_type: str, dtype: str, models: tuple[str, ...] | None = None,
                ops: tuple[str, ...] | None = None) -> list:
    """The cases of a suite for a device type ('cuda' or 'cpu'), optionally for other model presets or
    only some operators."""
    if suite not in SUITES:
        raise ValueError(f"suite: unknown suite {suite!r}, choose from {', '.join(SUITES)}")
    models = tuple(model_config(m).name for m in models) if models else None
    sweeps = SUITES[suite]["cuda" if device_type == "cuda" else "cpu"]
    seen, cases = set(), []
    for case in itertools.chain.from_iterable(s.cases(dtype, models) for s in sweeps):
        if ops and case.op not in ops:
            continue
        if case not in seen:
            seen.add(case)
            cases.append(case)
    return cases


