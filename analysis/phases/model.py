"""The phase model: TTFT, TPOT and tokens/s of a whole model composed from measured op rows (no torch).

A step (bench.spec.steps) lists the cases it runs and how often; its time is the sum of count x the median latency
of the measured row with the same fields, for the impl chosen per operator. Rows measured in rounds (each in a worker
process of its own, at another moment of the run) compose once per round too: the spread of a step's per-round
totals, which a drift of the machine moves alike on every row, gives the interval a repeat of the run lands in.
`page_size` composes decode and chunked steps whose attention reads a paged KV cache (rows with that page_size; 0:
contiguous).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ...bench.spec import steps as step_defs
from ...bench.spec.interval import median_interval, ratio_interval, scale_interval
from ...bench.spec.models import DTYPE_BYTES, DecoderConfig
from ...bench.spec.routing import expected_touched, touched_experts
from .intervals import composed_interval, in_turn, round_totals  # noqa: F401 (names of the phase model)

DEFAULT_IMPLS = {"attention": "flash", "linear": "torch", "elementwise": "torch", "qlinear": "torch", "moe": "torch",
                 "mla": "torch"}
PARTS = (*step_defs.PARTS, "iteration")  # the ops' parts, and what a step costs beyond them (a zero-layer pass)
ONCE = ("head", "iteration")  # the parts a step runs once, whatever its layer count
KV_DTYPE_BYTES = {"fp8": 1}  # bytes of a cache element stored as a kv_dtype (e4m3)
# attention fields a use names only where set, as rows of any age do
UNSET = {"window_left": -1, "sinks": False, "kv_dtype": "", "scheme": ""}
SATURATION_MARGIN = 0.05  # throughput "stops growing" once no larger batch adds more than this share
USER_TARGETS = (3.0, 10.0)  # tokens/s per user: reading speed, and a comfortable chat


@dataclass
class StepTime:
    """A composed step: total milliseconds, the split by part, the per-op items, and what was not measured."""

    total_ms: float
    parts: dict[str, float]
    items: pd.DataFrame
    missing: list[str] = field(default_factory=list)
    noisy: int = 0  # noisy or profiled rows of the step's ops that the composition left out
    low_ms: float = float("nan")  # the total's 95% interval (composed_interval; NaN where a row has none)
    high_ms: float = float("nan")

    @property
    def complete(self) -> bool:
        return not self.missing

    @property
    def interval(self) -> tuple[float, float, float]:
        return self.total_ms, self.low_ms, self.high_ms

    def layer_interval(self, layers: int) -> tuple[float, float, float]:
        """One layer's share (every part but the head, over `layers`) with its interval: what a layer more adds."""
        body = self.items[~self.items["part"].isin(ONCE)]
        if self.missing:
            return float("nan"), float("nan"), float("nan")
        return scale_interval(composed_interval(body), 1.0 / layers)


def _flag(rows: pd.DataFrame, column: str) -> np.ndarray:
    if column not in rows.columns:
        return np.zeros(len(rows), dtype=bool)
    return rows[column].fillna(False).astype(bool).to_numpy()


def row_intervals(rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Each row's 95% interval of its median latency: its latency_ci columns (schema 7), else from its raw samples
    (results.parquet's samples_ms, a file from before the columns), NaN where neither says."""
    low, high = (pd.to_numeric(rows[c], errors="coerce").to_numpy(float, copy=True) if c in rows
                 else np.full(len(rows), np.nan) for c in ("latency_ci_low_ms", "latency_ci_high_ms"))
    if "samples_ms" in rows:
        for i, samples in enumerate(rows["samples_ms"]):
            if not (np.isfinite(low[i]) and np.isfinite(high[i])) and samples is not None \
                    and not (np.isscalar(samples) and pd.isna(samples)):
                found = median_interval(np.asarray(samples, dtype=float).ravel().tolist())
                low[i], high[i] = found.low, found.high
    return low, high


class Measured:
    """The ok, timed rows of one device, mode and timer, indexed by (op, impl, case fields) for the lookups: quiet
    and unprofiled rows only (the noisy and profiled ones are kept apart, to be counted as left out). With `weights`
    (a scheme such as int4-g128), every step composed from it takes its layers' projections from the qlinear rows
    of that scheme, and with `experts` its routed experts from the moe rows of that scheme: measured, never scaled
    from the unquantized rows."""

    def __init__(self, df: pd.DataFrame, *, model: str, dtype: str, impls: dict[str, str] | None = None,
                 weights: str = "", iterations: dict | None = None, keep_noisy: bool = False,
                 kv_dtype: str = "", experts: str = ""):
        self.model, self.dtype, self.weights, self.experts = model, dtype, weights, experts
        self.kv_dtype = kv_dtype  # the KV cache storage of the decode calls (steps.with_kv_dtype; "": the dtype)
        # (phase, batch, tokens) -> (ms, low, high): the per-iteration cost measured for a published step
        # (analysis.phases.check.iteration_costs), added once to that step
        self.iterations = dict(iterations or {})
        self.impls = {**DEFAULT_IMPLS, **(impls or {})}
        rows = df[(df["status"] == "ok") & (df["dtype"] == dtype) & (df["model"] == model)]
        chosen = [self.impls.get(op) == impl for op, impl in zip(rows["op"], rows["impl"], strict=True)]
        rows = rows[np.array(chosen, dtype=bool)]  # a bare empty list would select columns, not rows
        groups = rows[["device", "mode", "timer"]].drop_duplicates()
        if len(groups) > 1:  # never pool unlike rows
            found = "; ".join(" / ".join(map(str, g)) for g in groups.itertuples(index=False))
            raise ValueError(f"rows: {len(groups)} device/mode/timer groups ({found}); compose one at a time")
        self.device = str(rows["device"].iloc[0]) if len(rows) else ""  # the one device of the rows
        # the noisy rows too with keep_noisy (the check's rounds: its interval over them carries what a busy machine
        # did, and a round left out for one busy op would be a selection)
        unfit = (_flag(rows, "noisy") & (not keep_noisy)) | _flag(rows, "profiled")
        # rows from before the page_size column read a contiguous cache
        paged = rows["page_size"] if "page_size" in rows.columns else pd.Series(0, index=rows.index)
        rows = rows.assign(page_size=pd.to_numeric(paged, errors="coerce").fillna(0).astype(int))
        low, high = row_intervals(rows)
        rows = rows.assign(_ci_low=low, _ci_high=high, _rounds=[in_turn(cell) for cell in rows.get(
            "round_latencies_ms", pd.Series([""] * len(rows), index=rows.index))])
        self.rows, self.left_out = rows[~unfit], rows[unfit]
        self._found: dict = {}

    def _matching(self, rows: pd.DataFrame, use: step_defs.OpUse) -> pd.DataFrame | None:
        """The rows (self.rows or self.left_out) measuring `use`'s case: one boolean mask, kept per case (a step is
        composed many times, and a wide frame is slow to filter)."""
        key = (rows is self.rows, use.op, use.fields)
        if key in self._found:
            return self._found[key]
        mask = (rows["op"] == use.op).to_numpy(bool, copy=True, na_value=False)
        for name, value in use.fields:
            if name not in rows:
                self._found[key] = None
                return None
            mask &= (rows[name] == value).to_numpy(bool, na_value=False)
        for name, unset in UNSET.items():  # a use without a window (or sinks) is a row without one
            if name in rows and name not in use.field_dict:
                mask &= (rows[name].isna() | (rows[name] == unset)).to_numpy(bool, na_value=False)
        self._found[key] = rows[mask]
        return self._found[key]

    def latency_ms(self, use: step_defs.OpUse) -> float | None:
        """The median latency of the quiet row measuring `use` (the median over repeats), None when none was."""
        found = self.latency(use)
        return None if found is None else found[0]

    def latency(self, use: step_defs.OpUse) -> tuple[float, float, float] | None:
        """(median, low, high): the quiet row's median latency measuring `use` with its 95% interval (over repeats:
        the median of their medians inside the envelope of their intervals), None when none was."""
        rows = self._matching(self.rows, use)
        if rows is None or rows.empty:
            return None
        low, high = rows["_ci_low"].to_numpy(float), rows["_ci_high"].to_numpy(float)
        known = np.isfinite(low).all() and np.isfinite(high).all()
        return (float(np.median(rows["latency_ms"].to_numpy(float))), float(low.min()) if known else np.nan,
                float(high.max()) if known else np.nan)

    def rounds(self, use: step_defs.OpUse) -> tuple | None:
        """The per-round medians of the one quiet row measuring `use` (None for a round it lacks or took again at
        the end of its run), None where it has no rounds or several rows measure it."""
        rows = self._matching(self.rows, use)
        if rows is None or len(rows) != 1:
            return None
        return rows["_rounds"].iloc[0]

    def left_out_rows(self, use: step_defs.OpUse) -> int:
        """How many noisy or profiled rows measured `use` and were left out."""
        rows = self._matching(self.left_out, use)
        return 0 if rows is None else len(rows)


ITEM_COLUMNS = ["op", "label", "part", "count", "latency_ms", "ms", "key", "latency_low_ms", "latency_high_ms",
                "rounds"]


def step_time(measured: Measured, uses: list[step_defs.OpUse]) -> StepTime:
    """Sum count x latency over a step's ops (the projections packed as measured.weights says, the cache read as
    measured.kv_dtype says); ops with no measured row are named in `missing`."""
    items, missing, noisy = [], [], 0
    uses = step_defs.with_kv_dtype(step_defs.with_weights(uses, measured.weights, measured.experts), measured.kv_dtype)
    for use in uses:
        noisy += measured.left_out_rows(use)
        found = measured.latency(use)
        if found is None:
            missing.append(f"{use.op} {use.label} {use.field_dict}")
            continue
        latency, low, high = found
        items.append({"op": use.op, "label": use.label, "part": use.part, "count": use.count,
                      "latency_ms": latency, "ms": use.count * latency, "key": f"{use.op} {use.fields!r}",
                      "latency_low_ms": low, "latency_high_ms": high, "rounds": measured.rounds(use)})
    table = pd.DataFrame(items, columns=ITEM_COLUMNS)
    parts = {part: float(table.loc[table["part"] == part, "ms"].sum()) for part in step_defs.PARTS}
    parts["iteration"] = float("nan")  # not measured for this step (with_iteration adds it)
    if missing:
        return StepTime(float("nan"), parts, table, missing, noisy)
    _, low, high = composed_interval(table)
    return StepTime(float(table["ms"].sum()), parts, table, missing, noisy, low, high)


def ttft(measured: Measured, config: DecoderConfig, prompt: int) -> StepTime:
    """Time to first token of one prompt: layers x the layer at M = prompt tokens, then the head."""
    return step_time(measured, step_defs.prefill_step(config, prompt))


def tpot(measured: Measured, config: DecoderConfig, batch: int, context: int, page_size: int = 0) -> StepTime:
    """Time per output token of a decode batch: layers x the layer at M = batch, then the head."""
    return step_time(measured, step_defs.decode_step(config, batch, context, page_size))


def iteration_ends(measured: Measured, key: tuple[str, int, int]) -> dict:
    """{iteration_low_ms, iteration_high_ms}: the interval of the per-iteration cost measured for a step (NaN where
    none was)."""
    _, low, high = measured.iterations.get(key, (np.nan, np.nan, np.nan))
    return {"iteration_low_ms": low, "iteration_high_ms": high}


def with_iteration(measured: Measured, step: StepTime, key: tuple[str, int, int]) -> StepTime:
    """The step with the per-iteration cost measured for it (measured.iterations) as an item of its own."""
    if key not in measured.iterations or step.missing:
        return step
    ms, low, high = measured.iterations[key]
    item = {"op": "iteration", "label": "per-iteration cost (zero-layer pass less the head)", "part": "iteration",
            "count": 1, "latency_ms": ms, "ms": ms, "key": f"iteration {key}", "latency_low_ms": low,
            "latency_high_ms": high, "rounds": None}
    table = pd.concat([step.items, pd.DataFrame([item], columns=ITEM_COLUMNS)], ignore_index=True)
    parts = {**step.parts, "iteration": ms}
    _, low, high = composed_interval(table)
    return StepTime(float(table["ms"].sum()), parts, table, step.missing, step.noisy, low, high)


def prefill_table(measured: Measured, config: DecoderConfig, prompts) -> pd.DataFrame:
    """Per prompt length: TTFT and prompt tokens/s, with the split by part."""
    rows = []
    for prompt in prompts:
        t = with_iteration(measured, ttft(measured, config, prompt), ("prefill", 1, prompt))
        rows.append({"prompt": prompt, "ttft_ms": t.total_ms, "ttft_low_ms": t.low_ms, "ttft_high_ms": t.high_ms,
                     "prompt_tokens_per_s": 1e3 * prompt / t.total_ms,
                     **rate_ends("prompt_tokens_per_s", 1e3 * prompt, t),
                     **{f"{p}_ms": v for p, v in t.parts.items()},
                     **iteration_ends(measured, ("prefill", 1, prompt)), "missing": len(t.missing),
                     "noisy_left_out": t.noisy})
    return pd.DataFrame(rows)


def rate_ends(name: str, amount: float, t: StepTime) -> dict:
    """{name_low, name_high}: amount / the step's time at the ends of its interval (a rate: the ends swap)."""
    return {f"{name}_low": amount / t.high_ms, f"{name}_high": amount / t.low_ms}


def saturation_batch(batches, tokens_per_s, margin: float = SATURATION_MARGIN):
    """The smallest measured batch after which no larger measured batch raises throughput by more than `margin`
    (relative), or None when none does (a larger batch still gains, or a single batch was measured)."""
    pairs = sorted((b, t) for b, t in zip(batches, tokens_per_s, strict=True) if np.isfinite(t))
    for i, (batch, tps) in enumerate(pairs[:-1]):
        if all(later <= tps * (1 + margin) for _, later in pairs[i + 1:]):
            return batch
    return None


def batch_sweep(measured: Measured, config: DecoderConfig, batches, context: int,
                margin: float = SATURATION_MARGIN, page_size: int = 0) -> pd.DataFrame:
    """Per batch at one context: TPOT, output tokens/s (batch / TPOT), tokens/s per user, the split by part,
    and `saturated` on the batch where throughput stops growing (within `margin`); for a mixture of experts, the
    experts a step's routing touches (the composed rows' draw) beside the uniform expectation E·(1 - (1 - k/E)^B); the
    KV-cache bytes a token costs at that context (`kv_bytes_per_token`, by the model's attention kind) and the batch's
    cache (`kv_cache_bytes`)."""
    rows, steps = [], {}
    # an fp8 cache: one byte an element (its float32 scales, one per KV head and layer, left out)
    per_token = config.kv_bytes_per_token(KV_DTYPE_BYTES.get(measured.kv_dtype, DTYPE_BYTES[measured.dtype]),
                                          context + 1)
    for batch in batches:
        t = with_iteration(measured, tpot(measured, config, batch, context, page_size), ("decode", batch, context))
        mixture = {"experts": config.experts, "top_k": config.top_k,
                   "touched_experts": touched_experts(batch, config.experts, config.top_k, step_defs.MOE_ROUTING),
                   "expected_touched": float(expected_touched(config.experts, config.top_k, batch))} \
            if config.is_moe else {}
        steps[batch] = t
        rows.append({"batch": batch, "context": context, "tpot_ms": t.total_ms, "tpot_low_ms": t.low_ms,
                     "tpot_high_ms": t.high_ms, "tokens_per_s": 1e3 * batch / t.total_ms,
                     **rate_ends("tokens_per_s", 1e3 * batch, t), "tokens_per_s_per_user": 1e3 / t.total_ms,
                     **rate_ends("tokens_per_s_per_user", 1e3, t),
                     "attention": config.attention, "kv_bytes_per_token": per_token,
                     "kv_cache_bytes": per_token * batch * (context + 1),
                     **{f"{p}_ms": v for p, v in t.parts.items()},
                     **iteration_ends(measured, ("decode", batch, context)), **mixture, "missing": len(t.missing),
                     "noisy_left_out": t.noisy})
    table = pd.DataFrame(rows)
    knee = saturation_batch(table["batch"], table["tokens_per_s"], margin) if len(table) else None
    table["saturated"] = table["batch"] == knee
    table["monotone_note"] = monotone_notes(steps)
    return table


def monotone_notes(steps: dict[int, StepTime]) -> list[str]:
    """Per batch (in the order given), why its TPOT is below a smaller batch's beyond both intervals ("" where it is
    not): a larger batch reads at least the same weights, so such a step names the op that got faster, most often
    a BLAS shape slow at the smaller M. Without intervals a lower point is said as such."""
    notes = {}
    for batch, t in steps.items():
        below = [b for b, s in steps.items() if b < batch and np.isfinite(s.total_ms) and t.total_ms < s.total_ms]
        if not below or not np.isfinite(t.total_ms):
            notes[batch] = ""
            continue
        worst = max(below, key=lambda b: steps[b].total_ms)
        other = steps[worst]
        resolved = np.isfinite(t.high_ms) and np.isfinite(other.low_ms)
        if resolved and t.high_ms >= other.low_ms:
            notes[batch] = ""  # within their intervals
            continue
        mine = t.items.groupby("label")["ms"].sum()
        theirs = other.items.groupby("label")["ms"].sum()
        drop = (theirs - mine.reindex(theirs.index)).dropna()
        op = f"; {drop.idxmax()} {theirs[drop.idxmax()]:.3g} -> {mine[drop.idxmax()]:.3g} ms" if len(drop) else ""
        notes[batch] = (f"below batch {worst}'s TPOT ({t.total_ms:.4g} < {other.total_ms:.4g} ms"
                        + ("" if resolved else ", no interval") + op + ")")
    return [notes[b] for b in steps]


def beside_unquantized(decode: pd.DataFrame, unquantized: pd.DataFrame, base: str = "unquantized",
                       gain: str = "weights") -> pd.DataFrame:
    """A batch sweep with quantized projections (or an fp8 KV cache) beside the same run's sweep without: the latter's
    TPOT per batch (`{base}_tpot_ms`) and the gain (`{gain}_speedup`: its TPOT / this one's, with its interval)."""
    names = {"tpot_ms": f"{base}_tpot_ms", "tpot_low_ms": "_base_low", "tpot_high_ms": "_base_high"}
    plain = unquantized[["batch", *(c for c in names if c in unquantized)]].rename(columns=names)
    out = decode.merge(plain, on="batch", how="left")
    out[f"{gain}_speedup"] = out[f"{base}_tpot_ms"] / out["tpot_ms"]
    ends = [ratio_interval((b, bl, bh), (q, ql, qh))[1:] for b, bl, bh, q, ql, qh in zip(
        *(out.get(c, pd.Series(np.nan, index=out.index)) for c in (f"{base}_tpot_ms", "_base_low", "_base_high",
                                                                    "tpot_ms", "tpot_low_ms", "tpot_high_ms")),
        strict=True)]
    out[f"{gain}_speedup_low"] = [e[0] for e in ends]
    out[f"{gain}_speedup_high"] = [e[1] for e in ends]
    return out.drop(columns=[c for c in ("_base_low", "_base_high") if c in out])


def chunk_table(measured: Measured, config: DecoderConfig, prompt: int, chunks, decode_batch: int,
                context: int, page_size: int = 0) -> pd.DataFrame:
    """Chunked prefill (Sarathi-Serve) of one prompt beside a running decode batch, per chunk size: the steps,
    the prompt's TTFT when chunked, the inter-token latency the decode users see meanwhile against the
    decode-only step, and the cost of chunking: the chunk-only steps against the unchunked prefill."""
    whole = ttft(measured, config, prompt)
    decode_only = tpot(measured, config, decode_batch, context, page_size)
    rows = []
    for chunk in chunks:
        hybrid = [step_time(measured, s) for s in
                  step_defs.chunked_prefill_steps(config, prompt, chunk, decode_batch, context, page_size)]
        alone = [step_time(measured, s) for s in
                 step_defs.chunked_prefill_steps(config, prompt, chunk, 0, context, page_size)]
        hybrid_ms = np.array([h.total_ms for h in hybrid])
        done = not any(h.missing for h in hybrid + alone)
        ttft_ci = composed_interval(*(h.items for h in hybrid)) if done else (np.nan,) * 3
        alone_ci = composed_interval(*(a.items for a in alone)) if done else (np.nan,) * 3
        itl_ci = scale_interval(ttft_ci, 1 / len(hybrid))
        increase = ratio_interval(itl_ci, (decode_only.total_ms, decode_only.low_ms, decode_only.high_ms))
        cost = ratio_interval(alone_ci, whole.interval)
        rows.append({
            "chunk": chunk, "prompt": prompt, "decode_batch": decode_batch, "context": context,
            "steps": len(hybrid), "ttft_ms": float(hybrid_ms.sum()), "ttft_low_ms": ttft_ci[1],
            "ttft_high_ms": ttft_ci[2], "itl_ms": float(hybrid_ms.mean()), "itl_low_ms": itl_ci[1],
            "itl_high_ms": itl_ci[2], "itl_max_ms": float(hybrid_ms.max()), "decode_only_ms": decode_only.total_ms,
            "itl_increase_pct": 100 * (float(hybrid_ms.mean()) / decode_only.total_ms - 1),
            "itl_increase_low_pct": 100 * (increase[1] - 1), "itl_increase_high_pct": 100 * (increase[2] - 1),
            "unchunked_ttft_ms": whole.total_ms,
            "chunking_cost_pct": 100 * (float(sum(a.total_ms for a in alone)) / whole.total_ms - 1),
            "chunking_cost_low_pct": 100 * (cost[1] - 1), "chunking_cost_high_pct": 100 * (cost[2] - 1),
            "missing": sum(len(h.missing) for h in hybrid + alone),
        })
    return pd.DataFrame(rows)


def interactive_limits(measured: Measured, config: DecoderConfig, prompts, batches, *, ttft_s: float = 3.0,
                       user_tokens_per_s=None, page_size: int = 0) -> pd.DataFrame:
    """Per prompt length and per-user rate target: the largest measured batch whose TTFT (the prompt alone)
    is within `ttft_s` and whose decode at context = prompt gives each user at least the target tokens/s."""
    rows = []
    for prompt in prompts:
        first = ttft(measured, config, prompt).total_ms
        for target in user_tokens_per_s or USER_TARGETS:
            ok = [b for b in batches
                  if first <= 1e3 * ttft_s and 1e3 / tpot(measured, config, b, prompt, page_size).total_ms >= target]
            rows.append({"prompt": prompt, "ttft_ms": first, "ttft_target_s": ttft_s,
                         "user_tokens_per_s_target": target, "largest_batch": max(ok) if ok else 0})
    return pd.DataFrame(rows)


def model_error(composed_ms: float, measured_ms: float) -> float:
    """Relative error of the composition against the measured forward pass, in percent."""
    return 100 * (composed_ms - measured_ms) / measured_ms
