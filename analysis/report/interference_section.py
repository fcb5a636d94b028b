"""The report's Interference section: the rows of `phasebench interference` folders (the hybrid iteration per chunk
size; a decode step alone, beside a looped prefill, and protected from it), what each user target keeps of the whole
model, and the figures."""

from __future__ import annotations

import html

import pandas as pd

from ..interference.figures import CAPTIONS, drawn_figures
from ..interference.rows import HYBRID_SHOWN, SHOWN, hybrid, ordered, spatial, verdict_line, verdicts
from .context import Context, Section, figure_grid, folded

NOTE = ("Measured, not composed (phasebench interference). The hybrid iteration, as a serving engine with "
        "continuous batching makes it: a prompt arrives and is processed whole or a chunk per iteration, in the same "
        "forward pass as the decode users' tokens; each iteration is one inter-token latency (ITL) of every user, "
        "TTFT the sum of the prompt's iterations, chunk_cost = TTFT chunked / TTFT whole. Spatial sharing: the "
        "model's decode step timed alone, while a prefill of the same model loops beside it (a second process, or "
        "a second CUDA stream; on the host also with the threads split but unpinned, the control for pinning), and "
        "protected from it (disjoint cores on the host, a high-priority stream on a GPU). Both are judged on the "
        "ITL's mean and tail (p90 from 10 samples, p99 from 100; below, the tail is the max of N): a time-sliced "
        "latency hides its stalls from the median. Hybrid columns without model_ are of the layers timed; the "
        "model_ columns are the whole model, each iteration position's samples plus the untimed layers at the "
        "per-layer cost read from two depths, the per-iteration fixed cost (fixed_ms) once. The slowest position's "
        "median "
        "(itl_position_max_ms) and the arrivals' spread (arrival_range_pct) are shown apart. Per-user tokens/s are of "
        "the whole model (1000 / mean ITL), scaled from the layers timed where the rows say so.")


def interference_section(ctx: Context) -> Section | None:
    found = [rows for rows in ctx.of("interference") if len(rows)]
    if not found:
        return None
    rows = pd.concat(found, ignore_index=True)
    ok = ordered(rows[rows["status"] == "ok"])
    shown = [c for c in (*SHOWN, "whole_model", "noise_reason") if c in ok]
    body = [f'<p class="note">{html.escape(NOTE)}</p>']
    if len(hybrid(ok)):
        body.append(folded("The hybrid iteration per chunk size (ITL over the prompt's iterations, ms)",
                           hybrid(ok)[[*HYBRID_SHOWN, "prefill_alone_ms", "whole_model"]]))
    if len(spatial(ok)):
        body.append(folded("The decode step alone, co-located and protected", spatial(ok)[shown]))
    body.append(folded("Rows not measured", rows[rows["status"] != "ok"][["batch", "prompt", "mode", "mechanism",
                                                                          "chunk", "status", "reason"]]))
    lines = [verdict_line(v) for v in verdicts(rows).to_dict("records")]
    body.append("<ul>" + "".join(f"<li>{html.escape(line)}</li>" for line in lines) + "</ul>")
    body.append(figure_grid([ctx.figure(name, draw(rows), CAPTIONS[name])
                             for name, draw in drawn_figures(rows).items()]))
    return Section("interference", "Interference: a prompt's arrival beside the decode users", body)
