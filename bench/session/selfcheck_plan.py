"""What `phasebench selfcheck` runs, written as data: its steps and their budgets, on a GPU and as a host dry run."""

from __future__ import annotations

from dataclasses import dataclass, field

STEPS = ("env", "tests", "ceilings", "suites", "phases", "profile", "ncu", "report")
ATTENTION_SUITES = ("prefill", "chunked", "verify", "decode")
LINEAR_SUITES = ("decode-linear", "prefill-linear")
# a small decoder for the dry run: every step runs its real path, at sizes a 2-core host does in seconds
TINY_MODEL = "name=selfcheck-tiny,hidden=256,intermediate=512,layers=2,q_heads=4,kv_heads=2,head_dim=64,vocab=1000"


@dataclass(frozen=True)
class SelfcheckPlan:
    """One self-check: the device, the seconds of each step (a step may use what earlier ones left), the suites
    with their shares of the suites step, and the cases of the phase model, the profiles and ncu."""

    name: str
    device: str
    dtype: str
    total_s: float
    budgets: dict[str, float]
    models: tuple[str, ...]
    suites: dict[str, float]  # suite -> share of the suites step
    sample_time: float  # seconds of timed samples per (case, impl)
    startup_s: float  # what a run spends before it measures (imports, CUDA context, cached ceilings)
    teardown_s: float  # and after its time budget (the row in flight, parquet, run.json, the table)
    phases_args: tuple[str, ...]
    profile_shapes: tuple[str, ...]
    ncu_shape: str
    ceiling_dtypes: tuple[str, ...]
    reserve_s: float = 15.0  # kept back for the report's packing and the summary
    suite_impls: dict[str, tuple[str, ...]] = field(default_factory=dict)  # default: every impl available there

    def __post_init__(self):
        unknown = set(self.budgets) - set(STEPS)
        if unknown or sum(self.budgets.values()) + self.reserve_s > self.total_s + 1e-6:
            raise ValueError(f"selfcheck plan {self.name}: steps {sorted(unknown)} unknown, or budgets "
                             f"{sum(self.budgets.values())} s + reserve {self.reserve_s} s over {self.total_s} s")

    def with_total(self, total_s: float) -> SelfcheckPlan:
        """The same plan in another total time, every step scaled alike."""
        scale = (total_s - self.reserve_s) / (self.total_s - self.reserve_s)
        if scale <= 0:
            raise ValueError(f"budget: {total_s:g} s leaves nothing beyond the {self.reserve_s:g} s reserve")
        return SelfcheckPlan(**{**self.__dict__, "total_s": total_s,
                                "budgets": {k: v * scale for k, v in self.budgets.items()}})


GPU_SUITE_SHARES = {"prefill": 0.2, "chunked": 0.12, "verify": 0.12, "decode": 0.22, "decode-linear": 0.2,
                    "prefill-linear": 0.14, "paged": 0.1}

# Seven minutes on one H200: the CUDA tests compile many Triton specialisations, so they get the largest share
# after the suites; what a step does not use goes to the steps after it.
GPU = SelfcheckPlan(
    name="gpu", device="cuda", dtype="bfloat16", total_s=420,
    budgets={"env": 15, "tests": 130, "ceilings": 20, "suites": 130, "phases": 45, "profile": 25, "ncu": 25,
             "report": 15},
    models=("llama-3-8b", "llama-3-70b"), suites=GPU_SUITE_SHARES, sample_time=0.1, startup_s=10, teardown_s=5,
    # sizes the suites measured too (prefill 2048, decode at 4096 keys for batches 1/16/64), so their rows serve
    phases_args=("--model", "llama-3-8b", "--prompt", "2048", "--batch", "1", "16", "64", "--context", "4096",
                 "--chunk", "512", "--chunk-batch", "16", "--reference-layers", "1"),
    profile_shapes=("model=llama-3-8b,q_len=4096,kv_len=4096", "model=llama-3-8b,batch=16,q_len=1,kv_len=32768"),
    ncu_shape="model=llama-3-8b,batch=16,q_len=1,kv_len=32768",
    ceiling_dtypes=("float32", "float16", "bfloat16"),
    # the naive GEMM multiplies elementwise in bounded slices: seconds per call at M = 128 on 70b's lm_head and
    # minutes at M = 16k, so the linear suites compare the vendor BLAS with Triton (naive linear is in the tests)
    suite_impls={"decode-linear": ("torch", "triton"), "prefill-linear": ("torch", "triton")},
)

# The dry run on a host without CUDA: the same steps at host sizes, under two minutes on 2 cores.
HOST = SelfcheckPlan(
    name="host-dry-run", device="cpu", dtype="float32", total_s=118,
    budgets={"env": 6, "tests": 17, "ceilings": 6, "suites": 50, "phases": 13, "profile": 7, "ncu": 5,
             "report": 9},
    models=(TINY_MODEL,), suites={s: 1 / 6 for s in GPU_SUITE_SHARES}, sample_time=0.02, startup_s=4,
    teardown_s=2.5,
    phases_args=("--model", TINY_MODEL, "--prompt", "16", "--batch", "1", "2", "--context", "32", "--chunk", "8",
                 "--chunk-batch", "2", "--reference-layers", "1"),
    profile_shapes=("q_len=32,kv_len=32", "batch=2,q_len=1,kv_len=256"),
    ncu_shape="batch=2,q_len=1,kv_len=256",
    ceiling_dtypes=("float32",), reserve_s=5,
)
