"""What a composed mixture of experts says of its decode batches: the batch from which every expert is touched
(drawn and expected under uniform routing) beside the batch where throughput saturates."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

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
