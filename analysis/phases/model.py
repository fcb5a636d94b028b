"""The phase model: TTFT, TPOT and tokens/s of a whole model composed from measured op rows (no torch).

A step (bench.spec.steps) lists the cases it runs and how often; its time is the sum of count x the
median latency of the measured row with the same fields, for the impl chosen per operator, plus, where measured,
the sequence term: what one layer's ops (and the head's) cost called back to back beyond their sum alone, measured
in the same run (bench.phases.op_sequence; x layers, and once for the head). `page_size` composes decode and chunked
steps whose attention reads a paged KV cache (rows with that page_size; 0: contiguous).
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ...bench.spec import steps as step_defs
from ...bench.spec.interference_schema import COVERED_MIN
from ...bench.spec.models import DTYPE_BYTES, DecoderConfig
from ...bench.spec.routing import expected_touched, touched_experts

DEFAULT_IMPLS = {"attention": "flash", "linear": "torch", "elementwise": "torch", "qlinear": "torch", "moe": "torch",
                 "mla": "torch"}
PARTS = (*step_defs.PARTS, "sequence")  # the ops' parts, and what they cost in sequence beyond alone
UNSET = {"window_left": -1, "sinks": False}  # attention fields a use names only where set, as rows of any age do
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

    @property
    def complete(self) -> bool:
        return not self.missing


def _flag(rows: pd.DataFrame, column: str) -> np.ndarray:
    if column not in rows.columns:
        return np.zeros(len(rows), dtype=bool)
    return rows[column].fillna(False).astype(bool).to_numpy()


class Measured:
    """The ok, timed rows of one device, mode and timer, indexed by (op, impl, case fields) for the lookups: quiet
    and unprofiled rows only (the noisy and profiled ones are kept apart, to be counted as left out). With `weights`
    (a scheme such as int4-g128), every step composed from it takes its layers' projections from the qlinear rows
    of that scheme: measured, never scaled from the unquantized rows."""

    def __init__(self, df: pd.DataFrame, *, model: str, dtype: str, impls: dict[str, str] | None = None,
                 sequences: pd.DataFrame | None = None, weights: str = ""):
        self.model, self.dtype, self.weights = model, dtype, weights
        self.sequences = _sequence_terms(sequences)
        self.impls = {**DEFAULT_IMPLS, **(impls or {})}
        rows = df[(df["status"] == "ok") & (df["dtype"] == dtype) & (df["model"] == model)]
        chosen = [self.impls.get(op) == impl for op, impl in zip(rows["op"], rows["impl"], strict=True)]
        rows = rows[np.array(chosen, dtype=bool)]  # a bare empty list would select columns, not rows
        groups = rows[["device", "mode", "timer"]].drop_duplicates()
        if len(groups) > 1:  # never pool unlike rows
            found = "; ".join(" / ".join(map(str, g)) for g in groups.itertuples(index=False))
            raise ValueError(f"rows: {len(groups)} device/mode/timer groups ({found}); compose one at a time")
        self.device = str(rows["device"].iloc[0]) if len(rows) else ""  # the one device of the rows
        unfit = _flag(rows, "noisy") | _flag(rows, "profiled")
        # rows from before the page_size column read a contiguous cache
        paged = rows["page_size"] if "page_size" in rows.columns else pd.Series(0, index=rows.index)
        rows = rows.assign(page_size=pd.to_numeric(paged, errors="coerce").fillna(0).astype(int))
        self.rows, self.left_out = rows[~unfit], rows[unfit]

    @staticmethod
    def _matching(rows: pd.DataFrame, use: step_defs.OpUse) -> pd.DataFrame | None:
        rows = rows[rows["op"] == use.op]
        for name, value in use.fields:
            if name not in rows:
                return None
            rows = rows[rows[name] == value]
        for name, unset in UNSET.items():  # a use without a window (or sinks) is a row without one
            if name in rows and name not in use.field_dict:
                rows = rows[rows[name].isna() | (rows[name] == unset)]
        return rows

    def latency_ms(self, use: step_defs.OpUse) -> float | None:
        """The median latency of the quiet row measuring `use` (the median over repeats), None when none was."""
        rows = self._matching(self.rows, use)
        if rows is None or rows.empty:
            return None
        return float(np.median(rows["latency_ms"].to_numpy(float)))

    def left_out_rows(self, use: step_defs.OpUse) -> int:
        """How many noisy or profiled rows measured `use` and were left out."""
        rows = self._matching(self.left_out, use)
        return 0 if rows is None else len(rows)


def sequence_parts(uses: list[step_defs.OpUse]) -> list[tuple[str, int, list[step_defs.OpUse]]]:
    """A step as its sequences: ("layer", layers, one layer's uses with per-layer counts) for each kind of layer
    (OpUse.group: a model whose layers differ has several), and ("head", 1, the head's uses), each present where the
    step has it. A layer runs each op once or twice, so the fewest runs are the layers."""
    groups: dict[str, list[step_defs.OpUse]] = {}
    for use in uses:
        if use.part != "head":
            groups.setdefault(use.group, []).append(use)
    out = []
    for layer in groups.values():
        layers = min(u.count for u in layer)
        out.append(("layer", layers, [dataclasses.replace(u, count=u.count // layers) for u in layer]))
    head = [u for u in uses if u.part == "head"]
    if head:
        out.append(("head", 1, head))
    return out


def sequence_key(uses: list[step_defs.OpUse]) -> str:
    """The name of a sequence of uses, the same wherever it is built (16 hex digits of its ops, fields and counts)."""
    text = "|".join(f"{u.op} {u.fields!r} x{u.count}" for u in uses)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


# the sequence row's ops alone against the sweep's rows of the same ops: further apart than this, one of the two
# was disturbed (the host's drift between them reads 10-25%), and their difference is no term
ALONE_AGREEMENT = 1.5


def _sequence_terms(sequences: pd.DataFrame | None) -> dict:
    """key -> (term ms, noisy, the ops' time alone in the row) of the ok sequence rows (bench.phases.op_sequence):
    in sequence minus alone."""
    if sequences is None or not len(sequences) or "key" not in sequences:
        return {}
    ok = sequences[sequences["status"] == "ok"]
    noisy = _flag(ok, "noisy")
    return {key: (float(seq) - float(alone), bool(flag), float(alone)) for key, seq, alone, flag
            in zip(ok["key"], ok["sequence_ms"], ok["alone_ms"], noisy, strict=True)}


def _agrees_with_the_sweep(measured: Measured, part: list[step_defs.OpUse], alone_ms: float) -> bool:
    """Whether a sequence row's ops alone took about what the sweep's rows of the same ops say (the term is the
    sequence against that alone time, added to the sweep's sum)."""
    latencies = [measured.latency_ms(u) for u in part]
    if any(t is None for t in latencies):
        return True  # the op is missing: step_time names it
    swept = sum(u.count * t for u, t in zip(part, latencies, strict=True))
    return swept > 0 and 1 / ALONE_AGREEMENT <= alone_ms / swept <= ALONE_AGREEMENT


def sequence_items(measured: Measured, uses: list[step_defs.OpUse]) -> tuple[list[dict], int]:
    """The sequence term's items of a step (one for its layers, one for its head) and how many noisy ones were left
    out (as are those whose ops alone disagree with the sweep's rows); none where no sequence was measured (a folder
    from before the term, a time budget)."""
    items, noisy = [], 0
    for kind, count, part in sequence_parts(uses) if measured.sequences else ():
        term = measured.sequences.get(sequence_key(part))
        if term is None:
            continue
        if term[1] or not _agrees_with_the_sweep(measured, part, term[2]):
            noisy += 1
            continue
        # the head's term stays in the head's part: what runs once per step, whatever the layer count
        items.append({"op": "sequence", "label": f"{kind} ops in sequence", "part": "head" if kind == "head"
                      else "sequence", "count": count, "latency_ms": term[0], "ms": count * term[0]})
    return items, noisy


def step_time(measured: Measured, uses: list[step_defs.OpUse]) -> StepTime:
    """Sum count x latency over a step's ops (the projections packed as measured.weights says), and the sequence
    term where measured; ops with no measured row are named in `missing`."""
    items, missing, noisy = [], [], 0
    uses = step_defs.with_weights(uses, measured.weights)  # the sequence term is keyed by the packed ops too
    for use in uses:
        noisy += measured.left_out_rows(use)
        latency = measured.latency_ms(use)
        if latency is None:
            missing.append(f"{use.op} {use.label} {use.field_dict}")
            continue
        items.append({"op": use.op, "label": use.label, "part": use.part, "count": use.count,
                      "latency_ms": latency, "ms": use.count * latency})
    sequence, left_out = sequence_items(measured, uses)
    items, noisy = items + sequence, noisy + left_out
    table = pd.DataFrame(items, columns=["op", "label", "part", "count", "latency_ms", "ms"])
    parts = {part: float(table.loc[table["part"] == part, "ms"].sum()) for part in PARTS}
    return StepTime(float(table["ms"].sum()) if not missing else float("nan"), parts, table, missing, noisy)


def ttft(measured: Measured, config: DecoderConfig, prompt: int) -> StepTime:
    """Time to first token of one prompt: layers x the layer at M = prompt tokens, then the head."""
    return step_time(measured, step_defs.prefill_step(config, prompt))


def tpot(measured: Measured, config: DecoderConfig, batch: int, context: int, page_size: int = 0) -> StepTime:
    """Time per output token of a decode batch: layers x the layer at M = batch, then the head."""
    return step_time(measured, step_defs.decode_step(config, batch, context, page_size))


def prefill_table(measured: Measured, config: DecoderConfig, prompts) -> pd.DataFrame:
    """Per prompt length: TTFT and prompt tokens/s, with the split by part."""
    rows = []
    for prompt in prompts:
        t = ttft(measured, config, prompt)
        rows.append({"prompt": prompt, "ttft_ms": t.total_ms, "prompt_tokens_per_s": 1e3 * prompt / t.total_ms,
                     **{f"{p}_ms": v for p, v in t.parts.items()}, "missing": len(t.missing),
                     "noisy_left_out": t.noisy})
    return pd.DataFrame(rows)


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
    rows = []
    per_token = config.kv_bytes_per_token(DTYPE_BYTES[measured.dtype], context + 1)
    for batch in batches:
        t = tpot(measured, config, batch, context, page_size)
        mixture = {"experts": config.experts, "top_k": config.top_k,
                   "touched_experts": touched_experts(batch, config.experts, config.top_k, step_defs.MOE_ROUTING),
                   "expected_touched": float(expected_touched(config.experts, config.top_k, batch))} \
            if config.is_moe else {}
        rows.append({"batch": batch, "context": context, "tpot_ms": t.total_ms,
                     "tokens_per_s": 1e3 * batch / t.total_ms, "tokens_per_s_per_user": 1e3 / t.total_ms,
                     "attention": config.attention, "kv_bytes_per_token": per_token,
                     "kv_cache_bytes": per_token * batch * (context + 1),
                     **{f"{p}_ms": v for p, v in t.parts.items()}, **mixture, "missing": len(t.missing),
                     "noisy_left_out": t.noisy})
    table = pd.DataFrame(rows)
    knee = saturation_batch(table["batch"], table["tokens_per_s"], margin) if len(table) else None
    table["saturated"] = table["batch"] == knee
    return table


def beside_unquantized(decode: pd.DataFrame, unquantized: pd.DataFrame) -> pd.DataFrame:
    """A batch sweep with quantized projections beside the same run's sweep with float ones: the latter's TPOT per
    batch (`unquantized_tpot_ms`) and the gain (`weights_speedup`: unquantized TPOT / quantized TPOT)."""
    base = unquantized[["batch", "tpot_ms"]].rename(columns={"tpot_ms": "unquantized_tpot_ms"})
    out = decode.merge(base, on="batch", how="left")
    out["weights_speedup"] = out["unquantized_tpot_ms"] / out["tpot_ms"]
    return out


def chunk_table(measured: Measured, config: DecoderConfig, prompt: int, chunks, decode_batch: int,
                context: int, page_size: int = 0) -> pd.DataFrame:
    """Chunked prefill (Sarathi-Serve) of one prompt beside a running decode batch, per chunk size: the steps,
    the prompt's TTFT when chunked, the inter-token latency the decode users see meanwhile against the
    decode-only step, and the cost of chunking: the chunk-only steps against the unchunked prefill."""
    whole = ttft(measured, config, prompt).total_ms
    decode_only = tpot(measured, config, decode_batch, context, page_size).total_ms
    rows = []
    for chunk in chunks:
        hybrid = [step_time(measured, s) for s in
                  step_defs.chunked_prefill_steps(config, prompt, chunk, decode_batch, context, page_size)]
        alone = [step_time(measured, s) for s in
                 step_defs.chunked_prefill_steps(config, prompt, chunk, 0, context, page_size)]
        hybrid_ms = np.array([h.total_ms for h in hybrid])
        alone_ms = float(sum(a.total_ms for a in alone))
        rows.append({
            "chunk": chunk, "prompt": prompt, "decode_batch": decode_batch, "context": context,
            "steps": len(hybrid), "ttft_ms": float(hybrid_ms.sum()), "itl_ms": float(hybrid_ms.mean()),
            "itl_max_ms": float(hybrid_ms.max()), "decode_only_ms": decode_only,
            "itl_increase_pct": 100 * (float(hybrid_ms.mean()) / decode_only - 1),
            "unchunked_ttft_ms": whole, "chunking_cost_pct": 100 * (alone_ms / whole - 1),
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


COLOCATED_COLUMNS = ("option", "prompt", "decode_batch", "context", "decode_only_ms", "itl_ms", "stretch",
                     "tokens_per_s_per_user", "ttft_ms", "source")


def measured_stretch(interference: pd.DataFrame | None, *, model: str, dtype: str, batch: int, prompt: int,
                     context: int, mode: str, device: str, layers: int) -> tuple[dict | None, str]:
    """The worst ok, quiet `mode` row of `phasebench interference` rows for this decode and prompt (over its
    mechanisms), measured on `device` (as result rows name it) with the composition's `layers`: (stretch,
    prefill_slowdown and a label, ""); else (None, why none is used: "" where none was measured at all). A row
    whose prefill covered under COVERED_MIN of a window understates the stretch and is not used either."""
    if interference is None or not len(interference):
        return None, ""
    rows = interference[(interference["status"] == "ok") & (interference["mode"] == mode)
                        & (interference["model"] == model) & (interference["dtype"] == dtype)
                        & (interference["batch"] == batch) & (interference["prompt"] == prompt)
                        & (interference["context"] == context)]
    if rows.empty:
        return None, ""
    names = rows["device_name"].fillna("").astype(str) if "device_name" in rows else pd.Series("", rows.index)
    counts = pd.to_numeric(rows["layers"], errors="coerce") if "layers" in rows else pd.Series(np.nan, rows.index)
    here = rows[(names == device) & (counts == layers)]
    if here.empty:
        seen = sorted({f"{n or 'an unnamed device'} with {c:g} layers" for n, c in zip(names, counts, strict=True)})
        return None, (f"{mode} measured on {', '.join(seen)}, not on {device or 'an unnamed device'} with {layers} "
                      "layers: not used")
    covered = pd.to_numeric(here["covered"], errors="coerce") if "covered" in here else pd.Series(np.nan, here.index)
    usable = here[~here["noisy"].fillna(False).astype(bool) & ~(covered < COVERED_MIN)]
    if usable.empty:
        return None, f"{mode} rows noisy or their prefill under {COVERED_MIN:.0%} of a window: not used"
    worst = usable.loc[usable["stretch"].astype(float).idxmax()]
    return ({"stretch": float(worst["stretch"]), "prefill_slowdown": float(worst["prefill_slowdown"]),
             "source": f"measured: {mode}/{worst['mechanism']} on {worst['device']}"}, "")


def colocated_table(measured: Measured, config: DecoderConfig, prompt: int, decode_batch: int, context: int,
                    interference: pd.DataFrame | None = None, page_size: int = 0) -> pd.DataFrame:
    """The prompt beside a running decode batch without chunking, next to the chunked table: separated (the
    prefill on another device: the decode-only step), co-located and protected. Co-located is measured where
    `phasebench interference` rows of this model, dtype, batch, prompt and context are given, else composed as a
    fair share: while both run, each decode step yields up to its own length to the prefill (ITL = TPOT +
    min(TPOT, TTFT)) and the prefill gets half the device (TTFT doubles). Protected is measured or unknown."""
    first = ttft(measured, config, prompt).total_ms
    step = tpot(measured, config, decode_batch, context, page_size).total_ms
    found = dict(model=measured.model, dtype=measured.dtype, batch=decode_batch, prompt=prompt, context=context,
                 device=measured.device, layers=config.layers)
    options = [("separated", step, first, "composed: the prefill on another device")]
    colocated, why = measured_stretch(interference, mode="colocated", **found)
    if colocated is None:
        options.append(("co-located", step + min(step, first), 2 * first,
                        "fair share (composed)" + (f"; {why}" if why else "")))
    else:
        options.append(("co-located", step * colocated["stretch"], first * colocated["prefill_slowdown"],
                        colocated["source"]))
    protected, why = measured_stretch(interference, mode="protected", **found)
    if protected is None:
        options.append(("protected", np.nan, np.nan, f"not measured ({why or 'phasebench interference'})"))
    else:
        options.append(("protected", step * protected["stretch"], first * protected["prefill_slowdown"],
                        protected["source"]))
    rows = [{"option": name, "prompt": prompt, "decode_batch": decode_batch, "context": context,
             "decode_only_ms": step, "itl_ms": itl, "stretch": itl / step, "tokens_per_s_per_user": 1e3 / itl,
             "ttft_ms": when, "source": source} for name, itl, when, source in options]
    return pd.DataFrame(rows, columns=list(COLOCATED_COLUMNS))
