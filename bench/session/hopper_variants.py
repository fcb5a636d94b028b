"""What the Hopper build compiles: every Triton kernel of phasebench at its launches (each autotune config at its
heaviest bf16 launch, one fp16 and one fp32 case per kernel, the fixed-tile kernels), as variants of constexprs and
argument types; hopper_build compiles them and judges what ptxas says."""

from __future__ import annotations

from dataclasses import dataclass, field

_MODULES = {"prefill_kernel": "triton_prefill", "split_kv_kernel": "triton_decode", "reduce_kernel": "triton_decode",
            "gemm_kernel": "triton_linear", "splitk_gemv_kernel": "triton_linear",
            "splitk_reduce_kernel": "triton_linear", "qlinear_kernel": "triton_qlinear",
            "mla_split_kernel": "triton_mla", "gate_up_kernel": "triton_moe", "down_kernel": "triton_moe"}
_PRECISION = {"bf16": "tf32", "fp16": "tf32", "fp32": "ieee"}  # what triton_attention passes per dtype


@dataclass(frozen=True)
class Variant:
    """One compile: a kernel, its launch constexprs and argument dtypes, and a config's warps and stages."""

    kernel: str
    config: str  # e.g. "M128 N64 w4 s3"
    dtype: str  # the input dtype: bf16, fp16 or fp32
    flags: str  # the other constexprs that matter, e.g. "D128 causal"
    source: str  # autotune, interpreter or fixed (a launch with no autotuner)
    constexprs: dict = field(hash=False)
    types: dict = field(hash=False)  # argument name -> Triton type for the non-i32 arguments
    num_warps: int = 4
    num_stages: int = 3

    @property
    def name(self) -> str:
        tag = "" if self.source == "autotune" else f"[{self.source}]"
        return " ".join(part for part in (self.kernel, self.dtype, self.flags, self.config, tag) if part)


def _label(cfg: dict, warps: int, stages: int) -> str:
    short = {"BLOCK_M": "M", "BLOCK_N": "N", "BLOCK_K": "K", "GROUP_M": "G", "BLOCK_S": "S", "BLOCK_D": "D",
             "BLOCK": "B", "BLOCK_ROWS": "R"}
    return " ".join(f"{short.get(k, k)}{v}" for k, v in cfg.items()) + f" w{warps} s{stages}"


def _configs(tuned) -> list[tuple[dict, int, int]]:
    return [(dict(c.kwargs), c.num_warps, c.num_stages) for c in tuned]


def _attention_types(dt: str, kv_fp8: bool = False) -> dict:
    """Argument dtypes; an fp8 cache arrives as its bytes, with float32 scales (unread without KV_FP8)."""
    kv = "*u8" if kv_fp8 else f"*{dt}"
    return {"Q": f"*{dt}", "K": kv, "V": kv, "KV": kv, "Out": f"*{dt}", "SEQLENS": "*i32",
            "TABLE": "*i32", "SINKS": "*fp32", "qk_scale": "fp32", "PART_M": "*fp32", "PART_L": "*fp32",
            "PART_ACC": "*fp32", "K_SCALE": "*fp32", "V_SCALE": "*fp32", "LATENT_SCALE": "*fp32"}


def _gemv_tiles(block_m: int, configs) -> list[tuple[dict, int, int]]:
    return [({"BLOCK_M": block_m, **cfg}, w, s) for cfg, w, s in configs]


def variants(full: bool = False) -> list[Variant]:
    """Every autotune config of every kernel at its heaviest bf16 launch, one fp16 and one fp32 case per kernel,
    and the kernels launched without an autotuner; `full` adds fp16/fp32 and D64 at every config, the flag
    variants and the interpreter-only tiles (launched only under TRITON_INTERPRET, compiled here for the record)."""
    from ...kernels.attention import triton_decode as dec
    from ...kernels.attention import triton_prefill as pre
    from ...kernels.linear import triton_linear as lin
    from ...kernels.mla import triton_mla as mlak
    from ...kernels.moe import triton_moe
    from ...kernels.qlinear import triton_qlinear as qlin
    from ...kernels.qlinear.schemes import SCHEMES

    out: dict[tuple, Variant] = {}

    def add(kernel, dt, flags, source, cfg, warps, stages, cx, types):
        v = Variant(kernel, _label(cfg, warps, stages), dt, flags, source, {**cx, **cfg}, types, warps, stages)
        # a second identical compile would be a cache hit with no ptxas log: keep the first
        out.setdefault((kernel, repr(sorted(v.constexprs.items())), repr(sorted(types.items())), warps, stages), v)

    def prefill(dt, d, causal, seqlens, source="autotune", configs=None, page=0, window=False, sinks=False):
        cx = dict(HAS_SEQLENS=seqlens, CAUSAL=causal, UPCAST=False, PRECISION=_PRECISION[dt], BLOCK_D=d, EVEN_D=True,
                  PAGE_SIZE=page, HAS_WINDOW=window, HAS_SINKS=sinks)
        flags = (f"D{d}" + " causal" * causal + " seqlens" * seqlens + f" page{page}" * bool(page)
                 + " window" * window + " sinks" * sinks)
        for cfg, w, s in configs or _configs(pre._prune(pre.TUNING_CONFIGS, {"BLOCK_D": d})):
            add("prefill_kernel", dt, flags, source, cfg, w, s, cx, _attention_types(dt))

    def split_kv(dt, d, rows, causal, source="autotune", configs=None, page=0, window=False, kv_fp8=False):
        cx = dict(HAS_SEQLENS=True, CAUSAL=causal, UPCAST=False, PRECISION=_PRECISION[dt], BLOCK_D=d, BLOCK_ROWS=rows,
                  PAGE_SIZE=page, HAS_WINDOW=window, KV_FP8=kv_fp8)
        flags = (f"D{d} rows{rows}" + " causal" * causal + " seqlens" + f" page{page}" * bool(page)
                 + " window" * window + " fp8kv" * kv_fp8)
        for cfg, w, s in configs or _configs(dec.TUNING_CONFIGS):
            add("split_kv_kernel", dt, flags, source, cfg, w, s, cx, _attention_types(dt, kv_fp8))

    def mla(dt, page=0, configs=None, kv_fp8=False):  # DeepSeek's latent: 512 dims of value and key, 64 rotary
        cx = dict(HAS_SEQLENS=True, UPCAST=False, PRECISION=_PRECISION[dt], BLOCK_DV=512, BLOCK_DR=64,
                  PAGE_SIZE=page, KV_FP8=kv_fp8)
        flags = "DV512 DR64 seqlens" + f" page{page}" * bool(page) + " fp8kv" * kv_fp8
        for cfg, w, s in configs or _configs(mlak.TUNING_CONFIGS):
            add("mla_split_kernel", dt, flags, "autotune", cfg, w, s, cx, _attention_types(dt, kv_fp8))

    def linear(kernel, dt, flags, configs, source="autotune", dst="", even_k=True):
        types = {"X": f"*{dt}", "W": f"*{dt}", "Out": f"*{dt}", "Dst": dst or f"*{dt}"}
        cx = dict(EVEN_K=even_k, UPCAST=False, PRECISION="ieee" if dt == "fp32" else None)
        for cfg, w, s in configs:
            add(kernel, dt, flags + ("" if even_k else " ragged-K"), source, cfg, w, s, cx, types)

    def qlinear_operands(scheme, dt):  # (Q, S, Z) types: int8 as i8, the others' codes and 1-byte scales as bytes,
        info = SCHEMES[scheme]  # fp8-b128's scales fp32, nvfp4's tensor scale (Z) fp32
        width = info.scale_dtype.itemsize if info.scale_dtype is not None else 0
        return ("*i8" if scheme == "int8" else "*u8", {1: "*u8", 4: "*fp32"}.get(width, f"*{dt}"),
                "*fp32" if info.tensor_scale else f"*{dt}")

    def qlinear(scheme, dt, block_m, configs, dst=""):
        info = SCHEMES[scheme]
        q, scale, zero = qlinear_operands(scheme, dt)
        types = {"X": f"*{dt}", "Q": q, "S": scale, "Z": zero, "Dst": dst or f"*{dt}"}
        cx = dict(QMODE=qlin.QMODES[scheme], GROUP=info.group or 1, UPCAST=False,
                  PRECISION="ieee" if dt == "fp32" else None)
        for cfg, w, s in configs:
            add("qlinear_kernel", dt, f"{scheme} M{block_m or cfg['BLOCK_M']}" + " split" * bool(dst), "autotune",
                {**({"BLOCK_M": block_m} if block_m else {}), **cfg}, w, s, cx, types)

    def moe(kernel, dt, block_m, configs, scheme=""):  # routed experts: slot ids and block experts int32, fp32
        # weights and partials; float experts (QMODE -1: S and Z unread) or packed ones, as qlinear's operands
        w, scale, zero = (f"*{dt}",) * 3
        if scheme:
            w, scale, zero = qlinear_operands(scheme, dt)
        types = {"X": f"*{dt}", "W": w, "S": scale, "Z": zero, "Inter": f"*{dt}", "Part": "*fp32",
                 "Weights": "*fp32", "Slots": "*i32", "BlockExpert": "*i32", "Used": "*i32"}
        cx = dict(UPCAST=False, PRECISION="ieee" if dt == "fp32" else None, BLOCK_M=block_m,
                  QMODE=qlin.QMODES[scheme] if scheme else -1, GROUP=SCHEMES[scheme].group or 1 if scheme else 1)
        for cfg, warps, stages in configs:
            add(kernel, dt, f"M{block_m}" + f" {scheme}" * bool(scheme), "autotune", cfg, warps, stages, cx, types)

    gemm, gemv = _configs(lin.GEMM_CONFIGS), _configs(lin.GEMV_CONFIGS)
    one = slice(0, 1)
    # routed experts: decode's 16-row blocks and prefill's 64, every config in bf16; one fp16 and one fp32 each
    for kernel, tuned in (("gate_up_kernel", triton_moe.GATE_UP_CONFIGS), ("down_kernel", triton_moe.DOWN_CONFIGS)):
        for block_m in (16, 64):
            moe(kernel, "bf16", block_m, _configs(tuned))
        moe(kernel, "fp16", 16, _configs(tuned)[one])
        moe(kernel, "fp32", 16, _configs(tuned)[one])
        for scheme in ("mxfp4", "fp8-b128", "int4-g128"):  # packed experts: gpt-oss's, DeepSeek's, a w4a16 server's
            moe(kernel, "bf16", 16, _configs(tuned)[one], scheme)
    # quantized weights: each scheme's one-token GEMV (no dot) and 16-row split GEMV, every config for int4-g128
    # (the others one each: they differ only in how a tile is decoded), and the GEMM for int4-g128
    for scheme in qlin.QMODES:
        configs = _configs(qlin.GEMV_CONFIGS)[slice(None) if scheme == "int4-g128" else one]
        qlinear(scheme, "bf16", 1, configs)
        qlinear(scheme, "bf16", 16, configs, dst="*fp32")
    qlinear("int4-g128", "bf16", 0, _configs(qlin.GEMM_CONFIGS))
    for dt in ("bf16", "fp16", "fp32") if full else ("bf16",):
        prefill(dt, 128, True, False)
        split_kv(dt, 128, 16, False)
        linear("gemm_kernel", dt, "", gemm)
        # decode batches of up to 16 rows; split_k > 1 writes fp32 partials
        linear("splitk_gemv_kernel", dt, "M16 split", _gemv_tiles(16, gemv), dst="*fp32")
    # paged caches: pages of 16 (smaller than every key block: one table entry per key), 256 (whole blocks: one
    # entry per block) and 64 at verify rows (both, by BLOCK_N); the chunk path through the prefill kernel
    split_kv("bf16", 128, 16, False, page=16)
    split_kv("bf16", 128, 16, False, page=256)
    split_kv("bf16", 128, 64, True, page=64)
    prefill("bf16", 128, True, True, page=16)
    prefill("bf16", 128, True, True, page=256, configs=None if full else _configs(pre.TUNING_CONFIGS)[1:2])
    # largest head dim (shared memory) and 128 verify rows (GQA group x draft tokens): the register peaks
    prefill("bf16", 256, True, False)
    split_kv("bf16", 256, 16, False)
    split_kv("bf16", 128, 128, True)
    # gpt-oss (head dim 64, 8 query heads a kv head): window layers with sinks in prefill (every config), in decode
    # and at two draft tokens (16 rows) contiguous and in pages of 16; MLA decode over DeepSeek's latent, every config
    # contiguous and in pages of 64
    prefill("bf16", 64, True, False, window=True, sinks=True)
    prefill("bf16", 64, True, True, page=16, window=True, sinks=True, configs=_configs(pre.TUNING_CONFIGS)[1:2])
    split_kv("bf16", 64, 16, False, window=True)
    split_kv("bf16", 64, 16, True, window=True, page=16)
    mla("bf16")
    mla("bf16", page=64)
    mla("fp16", configs=_configs(mlak.TUNING_CONFIGS)[one])
    mla("fp32", configs=_configs(mlak.TUNING_CONFIGS)[2:3])
    # an fp8 KV cache (and latent): decode, verify rows in pages, one config each beside the bf16 ones
    split_kv("bf16", 128, 16, False, configs=_configs(dec.TUNING_CONFIGS)[one], kv_fp8=True)
    split_kv("bf16", 128, 64, True, page=64, configs=_configs(dec.TUNING_CONFIGS)[one], kv_fp8=True)
    mla("bf16", configs=_configs(mlak.TUNING_CONFIGS)[one], kv_fp8=True)
    # fp16 takes the same MMA path as bf16; fp32 dots are ieee (FMA), one config each here
    prefill("fp16", 128, False, True, configs=_configs(pre.TUNING_CONFIGS)[one])
    split_kv("fp16", 128, 64, True, configs=_configs(dec.TUNING_CONFIGS)[one])
    split_kv("fp32", 128, 16, False, configs=_configs(dec.TUNING_CONFIGS)[one], page=16)
    linear("gemm_kernel", "fp16", "", gemm[one])
    linear("splitk_gemv_kernel", "fp16", "M64", _gemv_tiles(64, gemv)[one], even_k=False)
    linear("splitk_gemv_kernel", "fp32", "M16 split", _gemv_tiles(16, gemv)[one], dst="*fp32")
    if full:
        prefill("bf16", 64, True, False)
        prefill("bf16", 128, False, True)
        split_kv("bf16", 64, 16, False)
        linear("splitk_gemv_kernel", "bf16", "M64", _gemv_tiles(64, gemv))
        linear("gemm_kernel", "bf16", "", gemm, even_k=False)
        prefill("bf16", 64, True, True, "interpreter", [(dict(pre.INTERPRETER_CONFIG), 4, 3)])
        split_kv("bf16", 128, 16, False, "interpreter", [({"BLOCK_N": dec.INTERPRETER_BLOCK_N}, 4, 3)])
        linear("gemm_kernel", "bf16", "", [(dict(lin.INTERPRETER_GEMM), 4, 3)], "interpreter")
        linear("splitk_gemv_kernel", "bf16", "M16", _gemv_tiles(16, [(lin.INTERPRETER_GEMV, 4, 3)]), "interpreter")
    # launched with fixed tiles and Triton's default 4 warps, 3 stages
    reduce_types = {"PART_M": "*fp32", "PART_L": "*fp32", "PART_ACC": "*fp32", "SINKS": "*fp32"}
    for dt in ("bf16", "fp32"):
        add("reduce_kernel", dt, "", "fixed", {"BLOCK_S": dec.MAX_SPLITS, "BLOCK_D": 128}, 4, 3,
            {"UPCAST": False, "HAS_SINKS": False}, {**reduce_types, "Out": f"*{dt}"})
        add("splitk_reduce_kernel", dt, "", "fixed", {"BLOCK": lin.REDUCE_BLOCK}, 4, 3, {"UPCAST": False},
            {"Part": "*fp32", "Out": f"*{dt}"})
    # with sinks (gpt-oss, head dim 64), and MLA's partials: 512 wide, at most MLA_MAX_SPLITS of them
    add("reduce_kernel", "bf16", "sinks", "fixed", {"BLOCK_S": dec.MAX_SPLITS, "BLOCK_D": 64}, 4, 3,
        {"UPCAST": False, "HAS_SINKS": True}, {**reduce_types, "Out": "*bf16"})
    add("reduce_kernel", "bf16", "mla", "fixed", {"BLOCK_S": mlak.MLA_MAX_SPLITS, "BLOCK_D": 512}, 4, 3,
        {"UPCAST": False, "HAS_SINKS": False}, {**reduce_types, "Out": "*bf16"})
    return list(out.values())
