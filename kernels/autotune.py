"""The Triton autotuner's winners so far: per tuned kernel and tuning key, the config it chose."""

from __future__ import annotations


def _config_fields(config) -> dict:
    return {**config.kwargs, "num_warps": config.num_warps, "num_stages": config.num_stages}


def tuned_kernels() -> dict[str, object]:
    """The project's autotuned Triton kernels by name (empty where Triton does not import)."""
    try:
        from .attention import triton_decode, triton_prefill
        from .linear import triton_linear
        from .mla import triton_mla
    except ImportError:
        return {}
    return {"prefill_kernel": triton_prefill.prefill_kernel_tuned,
            "split_kv_kernel": triton_decode.split_kv_kernel_tuned,
            "gemm_kernel": triton_linear.gemm_kernel_tuned,
            "splitk_gemv_kernel": triton_linear.splitk_gemv_kernel_tuned,
            "mla_split_kernel": triton_mla.mla_split_kernel_tuned}


def autotune_winners() -> list[dict]:
    """One record per (kernel, key) the autotuner has settled in this process: the key's named values, the
    dtypes of the tensor arguments, and the chosen config (block sizes, warps, stages). Empty in the
    interpreter, which launches fixed tiles and never tunes."""
    records = []
    for name, tuner in tuned_kernels().items():
        names = list(getattr(tuner, "keys", ()))
        for key, config in sorted(getattr(tuner, "cache", {}).items(), key=lambda item: str(item[0])):
            values = list(key)
            records.append({"kernel": name, "key": dict(zip(names, values[:len(names)], strict=False)),
                            "dtypes": [str(v) for v in values[len(names):]], "config": _config_fields(config)})
    return records
