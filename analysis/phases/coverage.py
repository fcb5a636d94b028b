"""What a composition covers and leaves out: the batch from which a mixture's decode touches every expert (drawn and
expected under uniform routing) beside the batch where throughput saturates, the KV cache a token costs by the
attention kind, what the check's real passes run that the composition does not, and a per-iteration cost below the
head's noise."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ...bench.spec.models import DecoderConfig
from ...bench.spec.routing import expected_touched


def expected_all_batch(experts: int, top_k: int) -> int:
    """The smallest batch whose expected touched experts under uniform routing pass E - 1/2 (the formula reaches E
    only in the limit)."""
    if top_k >= experts:
        return 1
    return max(1, math.ceil(math.log(0.5 / experts) / math.log(1 - top_k / experts)))


def coverage_lines(decode: pd.DataFrame) -> list[str]:
    """One sentence for a decode table with touched_experts (a mixture's), none otherwise: where every expert is
    touched, drawn and expected, and where throughput saturates."""
    if not {"touched_experts", "experts", "top_k"} <= set(decode) or not len(decode):
        return []
    rows = decode.sort_values("batch")
    experts, top_k = int(rows["experts"].iloc[0]), int(rows["top_k"].iloc[0])
    batches, touched = rows["batch"].to_numpy(int), pd.to_numeric(rows["touched_experts"]).to_numpy(float)
    every = batches[touched >= experts]
    drawn = (f"every one from batch {every[0]}" if len(every) else
             f"not every one up to batch {batches[-1]} ({touched[-1]:.0f} there)")
    saturated = rows.loc[rows["saturated"].astype(str).str.lower().isin(("true", "1")), "batch"]
    composed = np.isfinite(pd.to_numeric(rows["tokens_per_s"], errors="coerce").to_numpy(float))
    knee = (f"throughput saturates at batch {int(saturated.iloc[0])}" if len(saturated) else
            f"throughput still grows up to batch {batches[composed][-1]}" if composed.any() else
            "no batch's throughput composed (its ops missing or every row noisy)")
    first = f"{touched[0]:.0f} of {experts} at batch {batches[0]}"
    return [f"Routed experts (top {top_k} of {experts}, uniform routing): a step touches {first}, {drawn}; "
            f"E·(1 - (1 - k/E)^B) passes {experts - 0.5:g} at batch {expected_all_batch(experts, top_k)} "
            f"({float(expected_touched(experts, top_k, batches[-1])):.1f} expected at batch {batches[-1]}); {knee}."
            + ("" if np.isfinite(touched).all() else " (some batches have no count)")]


LEFT_OUT = ("embedding lookup (the reference feeds hidden states)", "a real pass's own glue between its ops (views, "
            "splits, module calls) within each layer", "sampling beyond the greedy pick")
# a mixture of experts also leaves out its router's softmax and top-k (route), and the real pass routes its own
# tokens (a random router's: about uniform) where the composition reads rows of a drawn uniform routing
MOE_LEFT_OUT = ("the router's softmax and top-k (the router's linear layer is composed)", "the real pass's own "
                "routing: a random router's, about uniform, against the composed rows' drawn uniform routing")
# what the attention kinds' compositions leave out, and what transformers' classes run otherwise (bench.spec.steps)
KIND_LEFT_OUT = {
    "mla": ("MLA's absorptions are batched matmuls over heads, composed as one linear of the same FLOPs and weights",),
    "sinks": ("gpt-oss's attention and expert biases and its clamped SwiGLU (the moe rows run a plain SwiGLU)",)}
TRANSFORMERS_LEFT_OUT = {
    "mla": ("transformers' DeepseekV2 decompresses every cached latent at each decode step (kv_b over the whole "
            "cache): its decode runs that against the composition's absorbed decode",),
    "sinks": ("transformers' GptOss runs eager attention (the scores materialised, a sink column appended): it has "
              "no SDPA path for sinks",)}


def left_out(model: DecoderConfig, reference: str) -> str:
    """What the composition of `model` leaves out against `reference`'s forward pass, in one line."""
    kinds = [k for k in ("mla", "sinks") if (model.attention == "mla" if k == "mla" else model.sinks)]
    notes = LEFT_OUT + (MOE_LEFT_OUT if model.is_moe else ()) + tuple(n for k in kinds for n in KIND_LEFT_OUT[k])
    if reference == "transformers":
        notes += tuple(n for k in kinds for n in TRANSFORMERS_LEFT_OUT[k])
    return "; ".join(notes)


KV_KINDS = {"gqa": "a K and a V head per kv head and layer", "mla": "one latent per layer",
            "window": "window layers keep at most their window"}


def kv_lines(decode: pd.DataFrame) -> list[str]:
    """One sentence for a decode table with kv_bytes_per_token: the cache a token costs, by the attention kind, and
    the largest batch's cache."""
    if "kv_bytes_per_token" not in decode or not len(decode):
        return []
    last = decode.sort_values("batch").iloc[-1]
    kind = str(last.get("attention", "gqa"))
    return [f"KV cache ({kind.upper()}: {KV_KINDS.get(kind, kind)}): {float(last['kv_bytes_per_token']):,.0f} "
            f"bytes per token at {int(last['context']) + 1:,} tokens; "
            f"{float(last['kv_cache_bytes']) / 2**20:,.1f} MiB for batch {int(last['batch'])}."]


def iteration_notes(tables: dict) -> list[str]:
    """A line per published step whose per-iteration cost is below zero beyond its interval: the composed head is
    slower than the zero-layer pass runs (one inside its interval is the head's noise, and says nothing)."""
    out = []
    for name, key in (("prefill", "prompt"), ("decode", "batch")):
        table = tables.get(name)
        if table is None or "iteration_high_ms" not in table:
            continue
        for row in table.to_dict("records"):
            if row["iteration_high_ms"] < 0:
                out.append(f"{name} {key} {row[key]}: the per-iteration cost reads {row['iteration_ms']:.3g} ms "
                           f"[{row['iteration_low_ms']:.3g}, {row['iteration_high_ms']:.3g}]: the composed head is "
                           "slower than the zero-layer pass runs (cold against warm weights, or another impl than "
                           "the decoder's)")
    return out
