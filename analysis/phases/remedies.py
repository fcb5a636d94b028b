"""Which of chunking, protection or separation keeps the decode users above the per-user targets while a prompt is
prefilled beside them: the co-located table (separated, co-located and protected, measured or composed), the options
of a `phasebench phases` folder side by side, and the lines that say so."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ...bench.spec.interference_schema import COVERED_MIN
from ...bench.spec.interval import scale_interval, sum_interval
from ...bench.spec.models import DecoderConfig
from .model import USER_TARGETS, Measured, tpot, ttft

OPTION_COLUMNS = ("option", "remedy", "itl_ms", "tokens_per_s_per_user", "ttft_ms", "source")
# what each option of the colocated table is, as a remedy
REMEDIES = {"separated": "separation", "co-located": "none", "protected": "protection"}


def options_table(tables: dict, targets=USER_TARGETS) -> pd.DataFrame:
    """One row per way to run the prompt beside the decode users: co-located with no remedy, each chunk size,
    protected and separated (the colocated and chunked tables), with the ITL the users see, their tokens/s, the
    prompt's TTFT, and per target whether the users keep it (`meets_3`, ...; NA where not measured)."""
    rows = []
    colocated = tables.get("colocated")
    if colocated is not None:
        rows += [{"option": r["option"], "remedy": REMEDIES.get(r["option"], r["option"]), "itl_ms": r["itl_ms"],
                  "ttft_ms": r["ttft_ms"], "source": r["source"]} for r in colocated.to_dict("records")]
    chunked = tables.get("chunked")
    if chunked is not None:
        rows += [{"option": f"chunked C={int(r['chunk'])}", "remedy": "chunking", "itl_ms": r["itl_ms"],
                  "ttft_ms": r["ttft_ms"], "source": "composed: mean ITL of the hybrid steps"}
                 for r in chunked.sort_values("chunk").to_dict("records")]
    table = pd.DataFrame(rows, columns=[c for c in OPTION_COLUMNS if c != "tokens_per_s_per_user"])
    itl = pd.to_numeric(table["itl_ms"], errors="coerce").astype(float)
    table.insert(3, "tokens_per_s_per_user", 1e3 / itl)
    for target in targets:
        table[f"meets_{target:g}"] = [pd.NA if not np.isfinite(rate) else bool(rate >= target)
                                      for rate in table["tokens_per_s_per_user"]]
    return table


def _names(table: pd.DataFrame) -> str:
    return ", ".join(f"{o} ({r:.3g} tok/s)" for o, r in zip(table["option"], table["tokens_per_s_per_user"],
                                                             strict=True)) or "none"


def remedy_lines(tables: dict, targets=USER_TARGETS) -> list[str]:
    """What the phases summary prints: the options side by side, then per target which remedies keep the users
    above it, which do not, and which were not measured."""
    colocated = tables.get("colocated")
    if colocated is None or not len(colocated):
        return []
    first = colocated.iloc[0]
    table = options_table(tables, targets)
    shown = table[["option", "itl_ms", "tokens_per_s_per_user", "ttft_ms", "source"]]
    out = ["", f"The {int(first['prompt'])}-token prompt beside {int(first['decode_batch'])} decode users at context "
               f"{int(first['context'])} (decode-only ITL {first['decode_only_ms']:.4g} ms): chunking, protection or "
               "separation?", shown.to_string(index=False, float_format=lambda v: f"{v:.4g}")]
    for target in targets:
        meets = [None if pd.isna(m) else bool(m) for m in table[f"meets_{target:g}"]]
        remedy = (table["remedy"] != "none").to_numpy()
        kept = table[np.array([m is True for m in meets], dtype=bool) & remedy]
        lost = table[np.array([m is False for m in meets], dtype=bool) & remedy]
        line = f"{target:g} tok/s per user: kept by {_names(kept)}; not by {_names(lost)}"
        bare = [m for m, r in zip(meets, remedy, strict=True) if not r and m is not None]
        if bare:
            line += f"; co-located with no remedy {'keeps' if any(bare) else 'misses'} it"
        unknown = [o for o, m in zip(table["option"], meets, strict=True) if m is None]
        if unknown:
            line += f"; not measured: {', '.join(unknown)}"
        out.append(line)
    return out


COLOCATED_COLUMNS = ("option", "prompt", "decode_batch", "context", "decode_only_ms", "itl_ms", "itl_low_ms",
                     "itl_high_ms", "stretch", "tokens_per_s_per_user", "ttft_ms", "ttft_low_ms", "ttft_high_ms",
                     "source")


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
    first = ttft(measured, config, prompt).interval
    step = tpot(measured, config, decode_batch, context, page_size).interval
    found = dict(model=measured.model, dtype=measured.dtype, batch=decode_batch, prompt=prompt, context=context,
                 device=measured.device, layers=config.layers)
    options = [("separated", step, first, "composed: the prefill on another device")]
    colocated, why = measured_stretch(interference, mode="colocated", **found)
    if colocated is None:
        shared = scale_interval(step, 2) if step[0] <= first[0] else sum_interval(((1, step), (1, first)))
        options.append(("co-located", shared, scale_interval(first, 2),
                        "fair share (composed)" + (f"; {why}" if why else "")))
    else:
        options.append(("co-located", scale_interval(step, colocated["stretch"]),
                        scale_interval(first, colocated["prefill_slowdown"]), colocated["source"]))
    protected, why = measured_stretch(interference, mode="protected", **found)
    if protected is None:
        options.append(("protected", (np.nan,) * 3, (np.nan,) * 3,
                        f"not measured ({why or 'phasebench interference'})"))
    else:
        options.append(("protected", scale_interval(step, protected["stretch"]),
                        scale_interval(first, protected["prefill_slowdown"]), protected["source"]))
    rows = [{"option": name, "prompt": prompt, "decode_batch": decode_batch, "context": context,
             "decode_only_ms": step[0], "itl_ms": itl[0], "itl_low_ms": itl[1], "itl_high_ms": itl[2],
             "stretch": itl[0] / step[0], "tokens_per_s_per_user": 1e3 / itl[0], "ttft_ms": when[0],
             "ttft_low_ms": when[1], "ttft_high_ms": when[2], "source": source}
            for name, itl, when, source in options]
    return pd.DataFrame(rows, columns=list(COLOCATED_COLUMNS))
