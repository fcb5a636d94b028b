"""The report's Interference section: the rows of `phasebench interference` folders (a decode step alone, beside a
looped prefill, and protected from it), what each user target keeps, and both figures."""

from __future__ import annotations

import html

import pandas as pd

from ..interference.figures import CAPTIONS, INTERFERENCE_FIGURES
from ..interference.rows import SHOWN, ordered, verdicts
from .context import Context, Section, figure_grid, folded

NOTE = ("Measured, not composed (phasebench interference): the model's decode step timed alone, while a prefill of "
        "the same model loops beside it (a second process, or a second CUDA stream), and protected from it "
        "(disjoint cores on the host, a high-priority stream on a GPU). stretch = co-located / alone median; "
        "prefill_slowdown = the prefill's own slowdown.")


def interference_section(ctx: Context) -> Section | None:
    found = [rows for rows in ctx.of("interference") if len(rows)]
    if not found:
        return None
    rows = pd.concat(found, ignore_index=True)
    ok = ordered(rows[rows["status"] == "ok"])
    shown = [c for c in (*SHOWN, "noise_reason") if c in ok]
    body = [f'<p class="note">{html.escape(NOTE)}</p>',
            folded("The decode step alone, co-located and protected", ok[shown]),
            folded("Rows not measured", rows[rows["status"] != "ok"][["batch", "prompt", "mode", "mechanism",
                                                                       "status", "reason"]])]
    lines = [f"batch {v['batch']}, prompt {v['prompt']}, {v['target']:g} tok/s per user: kept by "
             f"{', '.join(v['kept']) or 'none'}; lost by {', '.join(v['lost']) or 'none'}"
             for v in verdicts(rows).to_dict("records")]
    body.append("<ul>" + "".join(f"<li>{html.escape(line)}</li>" for line in lines) + "</ul>")
    body.append(figure_grid([ctx.figure(name, draw(rows), CAPTIONS[name])
                             for name, draw in INTERFERENCE_FIGURES.items()]))
    return Section("interference", "Interference: a decode step beside a prefill on the same device", body)
