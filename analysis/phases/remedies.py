"""Which of chunking, protection or separation keeps the decode users above the per-user targets while a prompt is
prefilled beside them: the options of a `phasebench phases` folder side by side, and the lines that say so."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .model import USER_TARGETS

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
