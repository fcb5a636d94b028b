"""What `phasebench selfcheck` runs, written as data: its steps and their budgets, on a GPU and as a host dry run."""

from __future__ import annotations

from dataclasses import dataclass, field

STEPS = ("env", "tests", "ceilings", "suites", "interference", "phases", "profile", "ncu", "report")
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
    # the least each step needs to do its work at all (start-up and teardown included); the suites step needs
    # suite_need_s per suite instead
    minimum_s: dict[str, float]
    reserve_s: float = 15.0  # kept back for the report's packing and the summary
    # default: every impl available there, but those that compile on their first call (flex, compiled) unless
    # `compiled`: their cold compiles, seconds a shape, would take the suites' budget
    suite_impls: dict[str, tuple[str, ...]] = field(default_factory=dict)
    compiled: bool = False
    interference_args: tuple[str, ...] = ()  # `phasebench interference` beside --device, --dtype and --out

    def __post_init__(self):
        unknown = (set(self.budgets) | set(self.minimum_s)) - set(STEPS)
        if unknown or sum(self.budgets.values()) + self.reserve_s > self.total_s + 1e-6:
            raise ValueError(f"selfcheck plan {self.name}: steps {sorted(unknown)} unknown, or budgets "
                             f"{sum(self.budgets.values())} s + reserve {self.reserve_s} s over {self.total_s} s")

    @property
    def suite_need_s(self) -> float:
        """What one suite's run needs: start-up, one row, and writing its results."""
        return self.startup_s + 1 + self.teardown_s

    def shortfalls(self) -> list[str]:
        """Each step, and each suite of the suites step, whose share of this plan is under what it needs."""
        short = [f"{step}: {self.budgets[step]:.1f} s < {need:g} s" for step, need in self.minimum_s.items()
                 if self.budgets.get(step, 0) < need]
        short += [f"suite {suite}: {share * self.budgets['suites']:.1f} s < {self.suite_need_s:g} s"
                  for suite, share in self.suites.items() if share * self.budgets["suites"] < self.suite_need_s]
        return short

    def with_total(self, total_s: float) -> SelfcheckPlan:
        """The same plan in another total time, every step scaled alike."""
        scale = (total_s - self.reserve_s) / (self.total_s - self.reserve_s)
        if scale <= 0:
            raise ValueError(f"budget: {total_s:g} s leaves nothing beyond the {self.reserve_s:g} s reserve")
        return SelfcheckPlan(**{**self.__dict__, "total_s": total_s,
                                "budgets": {k: v * scale for k, v in self.budgets.items()}})


# shares of the suites step (they sum to 1); the smallest still covers a run's start-up at 70% of the budget
GPU_SUITE_SHARES = {"prefill": 0.15, "chunked": 0.14, "verify": 0.14, "decode": 0.16, "decode-linear": 0.14,
                    "prefill-linear": 0.14, "paged": 0.13}

# Eight minutes on one H200 (a 15-minute lease, the machine's start and the transfers included): the CUDA tests
# compile many Triton specialisations, so they get the largest share after the suites; what a step does not use
# goes to the steps after it. Every share covers its step's start-up and teardown at this budget and at 70% of it.
GPU = SelfcheckPlan(
    name="gpu", device="cuda", dtype="bfloat16", total_s=480,
    budgets={"env": 12, "tests": 110, "ceilings": 15, "suites": 170, "interference": 25, "phases": 45,
             "profile": 30, "ncu": 30, "report": 12},
    minimum_s={"env": 8, "tests": 40, "ceilings": 10, "interference": 15, "phases": 30, "profile": 20, "ncu": 20,
               "report": 8},
    # a run's start-up: the worker's interpreter spawned beside the parent's, the CUDA context, cached ceilings
    models=("llama-3-8b", "llama-3-70b"), suites=GPU_SUITE_SHARES, sample_time=0.1, startup_s=10, teardown_s=4,
    # sizes the suites measure too (causal prefill 2048; decode at 4096 keys, context 4095 plus the new token, for
    # batches 1/16/64; the linear layers at M = 1/16/64 and 2048), so the rows the suites got to serve here
    phases_args=("--model", "llama-3-8b", "--prompt", "2048", "--batch", "1", "16", "64", "--context", "4095",
                 "--chunk", "512", "--chunk-batch", "16", "--reference-layers", "1"),
    profile_shapes=("model=llama-3-8b,q_len=4096,kv_len=4096", "model=llama-3-8b,batch=16,q_len=1,kv_len=32768"),
    ncu_shape="model=llama-3-8b,batch=16,q_len=1,kv_len=32768",
    ceiling_dtypes=("float32", "float16", "bfloat16"),
    # the naive GEMM multiplies elementwise in bounded slices: seconds per call at M = 128 on 70b's lm_head and
    # minutes at M = 16k, so the linear suites compare the vendor BLAS with Triton (naive linear is in the tests)
    suite_impls={"decode-linear": ("torch", "triton"), "prefill-linear": ("torch", "triton")},
    # the phases step's chunk batch, prompt and context among them, so its co-located estimate is measured; 8 layers
    # keep three copies of the weights small, one round of short windows keeps it to seconds; the hybrid form at the
    # phases step's chunk (512), a larger one and whole, 3 arrivals each
    interference_args=("--model", "llama-3-8b", "--prompt", "2048", "8192", "--batch", "16", "64", "--context",
                       "4095", "--layers", "8", "--window", "0.3", "--rounds", "1", "--chunk", "512", "2048", "whole",
                       "--arrivals", "3"),
)

# The dry run on a host without CUDA: the same steps at host sizes, about four minutes on 2 cores.
HOST = SelfcheckPlan(
    name="host-dry-run", device="cpu", dtype="float32", total_s=250,
    # phases: the check times its references at 0, L and 2L layers around rounds of the ops, about a minute here
    budgets={"env": 6, "tests": 25, "ceilings": 15, "suites": 90, "interference": 9, "phases": 68, "profile": 10,
             "ncu": 6, "report": 10},
    minimum_s={"env": 4, "tests": 12, "ceilings": 3, "interference": 6, "phases": 10, "profile": 6, "ncu": 4,
               "report": 5},
    models=(TINY_MODEL,), suites={s: 1 / len(GPU_SUITE_SHARES) for s in GPU_SUITE_SHARES}, sample_time=0.02,
    startup_s=5, teardown_s=2,
    # the host suites' sizes: causal prefill 64, decode at 256 keys for batches 1 and 4; no second pass over the rows
    # a busy host flagged noisy (on a loaded 2-core host that is every row, and it doubled the step)
    phases_args=("--model", TINY_MODEL, "--prompt", "64", "--batch", "1", "4", "--context", "255", "--chunk", "32",
                 "--chunk-batch", "4", "--reference-layers", "1", "--reference-batch", "1", "4",
                 "--reference-rounds", "1", "--retry-noisy", "0"),
    profile_shapes=("q_len=32,kv_len=32", "batch=2,q_len=1,kv_len=256"),
    ncu_shape="batch=2,q_len=1,kv_len=256",
    ceiling_dtypes=("float32",), reserve_s=5,
    # the phases step's chunk prompt, chunk batch and context, and all the model's layers (a stretch of fewer is not
    # used), so its co-located estimate is measured
    interference_args=("--model", TINY_MODEL, "--prompt", "64", "--batch", "4", "--context", "255", "--layers", "2",
                       "--window", "0.1", "--rounds", "1", "--chunk", "32", "whole", "--arrivals", "2"),
)
