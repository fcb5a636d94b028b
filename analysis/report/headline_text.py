"""The headline as a reader gets it: the Headline (the answer, as headline_table computes it) and its words, blocks
of sentences and small tables rendered as HTML (the report, a notebook) or markdown (a terminal, a notebook's text)."""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field

import pandas as pd

from ...bench.spec.schema import cell_float, cell_true, key_text
from ..phases.check import check_sentence

# Where the report lists what a count counts (tables.py's lists; page ids in sections.py).
LINKS = {"noisy": "noisy-rows", "above_roof": "above-roof-rows", "failed": "not-ok-rows", "incorrect": "not-ok-rows",
         "skipped": "not-ok-rows", "correctness": "correctness", "phases": "phases"}
COUNT_WORDS = {"noisy": "noisy", "above_roof": "above roof", "failed": "failed", "incorrect": "incorrect",
               "skipped": "skipped"}
OPS_HEADER = ("op", "phase", "best", "% of roof", "cases", "bound", "next best")
GROUP_BY = ("device", "mode", "timer", "profiled", "dtype")  # a headline group: rows never pooled across these
CEILINGS_MOVED_PCT = 10.0  # the headline says so where a row's roof moved by more than this while it ran


@dataclass(repr=False)
class Headline:
    """The answer a reader came for. `frame`: one row per performance group, op and phase (headline_table.COLUMNS);
    `correctness`: the interpreter-mode rows per device, dtype, op and impl; `counts`: per group the rows ok,
    noisy, above their roof, failed, incorrect and skipped; `phases`: one dict of small tables per phases
    folder. `html()` and `markdown()` render it; a notebook shows it as HTML."""

    frame: pd.DataFrame
    correctness: pd.DataFrame
    counts: pd.DataFrame
    phases: list[dict] = field(default_factory=list)

    def html(self, *, links: bool = True) -> str:
        return headline_html(self, links=links)

    def markdown(self) -> str:
        return headline_markdown(self)

    def _repr_html_(self) -> str:
        return self.html(links=False)

    def __repr__(self) -> str:  # a terminal, and a notebook's text/plain
        return self.markdown()


def pct(value) -> str:
    number = cell_float(value)
    if not math.isfinite(number):
        return "–"
    return f"{number:.0f}%" if abs(number) >= 10 else f"{number:.2g}%"


def duration(ms) -> str:
    number = cell_float(ms)
    if not math.isfinite(number):
        return "–"
    return f"{number / 1e3:.3g} s" if number >= 1e3 else f"{number:.3g} ms"


def number(value) -> str:
    value = cell_float(value)
    return "–" if not math.isfinite(value) else f"{value:.3g}"


# A block is a title and a list of items: ("p", [piece, ...]) with a piece text or (text, anchor), or
# ("table", header, rows) with rows of text cells; the first column of a table with header None is its header.


def blocks(headline: Headline) -> list[tuple[str, list]]:
    out = []
    for counts in headline.counts.to_dict("records"):
        title = " · ".join(key_text(counts.get(name)) for name in GROUP_BY if name in counts
                           and name not in ("profiled", "timer") and key_text(counts.get(name)))
        title += f" ({counts.get('timer')}{', profiled' if cell_true(counts.get('profiled')) else ''})"
        if counts.get("mode") == "interpreter":
            out.append((title, _correctness_items(headline.correctness, counts)))
        else:
            out.append((title, _ops_items(headline.frame, counts)))
    out += [_phases_block(found) for found in headline.phases]
    return out


def _count_pieces(counts: dict, what: tuple[str, ...]) -> list:
    pieces = [f"{counts['ok']} ok rows"]
    for name in what:
        text = f"{counts[name]} {COUNT_WORDS[name]}"
        pieces += [" · ", (text, LINKS[name]) if counts[name] else text]
    return pieces


def _ops_items(frame: pd.DataFrame, counts: dict) -> list:
    fields = [name for name in GROUP_BY if name in frame.columns]
    mine = frame[(frame[fields].apply(lambda column: column.map(key_text))
                  == [key_text(counts.get(name)) for name in fields]).all(axis=1)]
    rows, marks, highest = [], {}, []
    for row in mine.to_dict("records"):
        above = cell_float(row.get("above_roof"))
        if math.isfinite(above) and above:  # marked under the table: the findings beside this best, in no mean
            marks.setdefault(row["op"], []).append(f"{row['phase']} {int(above)}")
            highest.append(cell_float(row["max_pct_above_roof"]))
        if not row["best_impl"]:
            rows.append([row["op"], row["phase"], "–", "–", "–", "–", row["note"]])
            continue
        runner = row["note"]
        if key_text(row.get("runner_up")):
            faster = cell_float(row["speedup"])
            runner = f"{row['runner_up']} {pct(row['runner_up_pct'])}" + (
                f", {faster:.2f}× slower" if math.isfinite(faster) else "")
            runner += "" if row["shared"] else " (no case in common)"
        rows.append([row["op"], row["phase"], row["best_impl"],
                     f"{pct(row['pct_roofline'])} · max {pct(row['max_pct_roofline'])}", key_text(row["cases"]),
                     row["bound"], runner])
    tail = [" (in no median)"] if counts["noisy"] + counts["above_roof"] else []
    items = [("p", _count_pieces(counts, ("noisy", "above_roof", "failed", "incorrect", "skipped")) + tail)]
    moved = cell_float(counts.get("ceilings_moved_pct"))
    if math.isfinite(moved) and moved > CEILINGS_MOVED_PCT:
        items.append(("p", [f"The ceilings moved by up to {moved:.0f}% while these rows ran: each row is judged at the "
                            f"measurement nearest its rounds, and {counts.get('roof_unresolved', 0)} stay unresolved "
                            "against their roof over all of them (pct_roof_low to pct_roof_high)."]))
    items.append(("table", OPS_HEADER, rows))
    if marks:
        where = "; ".join(f"{op} {', '.join(phases)}" for op, phases in marks.items())
        items.append(("p", [f"Above their roof beside these (findings, hollow in the figures): {where}; up to "
                            f"{pct(max(highest))} → ", ("the list", LINKS["above_roof"])]))
    return items


def _correctness_items(table: pd.DataFrame, counts: dict) -> list:
    mine = table[(table["device"] == counts.get("device")) & (table["dtype"] == counts.get("dtype"))]
    parts = ", ".join(f"{row['impl']} {row['op']} {row['ok']} ok" + (f" / {row['not_ok']} not" if row["not_ok"] else "")
                      for row in mine.to_dict("records"))
    worst = cell_float(mine["worst_max_rel_err"].max()) if len(mine) else math.nan
    pieces = ["Correctness only (Triton's interpreter: its timings are not speed): ", parts or "no rows",
              f"; worst max_rel_err {worst:.2g}" if math.isfinite(worst) else "", " → ", ("correctness table",
                                                                                          LINKS["correctness"])]
    not_ok = counts["failed"] + counts["incorrect"] + counts["skipped"]
    if not_ok:
        pieces += [" · ", (f"{not_ok} not ok", LINKS["failed"])]
    return [("p", pieces)]


def _phases_block(found: dict) -> tuple[str, list]:
    setting = [f"{found['model']}" + (f", {found['layers']} layers" if found.get("layers") else "")]
    setting += [str(found[name]) for name in ("device", "dtype") if found.get(name)]
    items = []
    if found.get("impls"):
        items.append(("p", ["Composed from the measured ops (" + ", ".join(
            f"{op}={impl}" for op, impl in found["impls"].items()) + ") → ", ("phase tables", LINKS["phases"])]))
    ttft = found.get("ttft")
    if ttft is not None:
        times = ", ".join(f"{duration(row['ttft_ms'])} at {key_text(row['prompt'])} tokens"
                          for row in ttft.to_dict("records"))
        items.append(("p", [f"TTFT {times}; up to {number(ttft['prompt_tokens_per_s'].max())} prompt tokens/s."
                            + _checked(found.get("composition"), "prefill")]))
    decode = found.get("decode")
    if decode is not None:
        items.append(("table", None, [
            [f"decode batch (context {key_text(found['context'])})", *(key_text(v) for v in decode["batch"])],
            ["TPOT", *(duration(v) for v in decode["tpot_ms"])],
            ["output tokens/s", *(number(v) for v in decode["tokens_per_s"])],
            ["tokens/s per user", *(number(v) for v in decode["tokens_per_s_per_user"])]]))
        knee = found.get("saturation_batch")
        lead = f"Saturation batch {knee}: " if knee is not None else "No saturation batch: "
        items.append(("p", [lead + found["saturation"] + "." + _checked(found.get("composition"), "decode",
                                                                         legend=False)]))
    if found.get("left_out"):
        items.append(("p", [f"{found['left_out']} of {found['points']} TTFT and TPOT points left out: an op they "
                            "need was not measured or only noisily (see the phase tables' missing and "
                            "noisy_left_out)."]))
    limits = found.get("interactive")
    if limits is not None:
        items.append(("p", [_interactive_sentence(limits)]))
    return "Phases · " + " · ".join(setting), items


def _checked(composition: pd.DataFrame | None, phase: str, legend: bool = True) -> str:
    """' Checked against real passes (goal 15%): ...' beside a phase's figures; empty where none checked it."""
    sentence = check_sentence(composition, phase, legend) if composition is not None else ""
    return " " + sentence if sentence else ""


def _interactive_sentence(limits: pd.DataFrame) -> str:
    """'Interactive (TTFT within 3 s; 3 or 10 tokens/s per user): prompt 32: TTFT 10.9 s, missed; ...'."""
    targets = [name for name in limits.columns if name.startswith("batch_at_")]
    rates = " or ".join(name.split("_")[2] for name in targets)
    parts = []
    for row in limits.to_dict("records"):
        text = f"prompt {key_text(row['prompt'])}: TTFT {duration(row['ttft_ms'])}"
        if not row["meets_ttft"]:
            parts.append(f"prompt {key_text(row['prompt'])}: missed")  # its TTFT is said above; no batch keeps it
            continue
        batches = [f"batch {int(row[name])} at {name.split('_')[2]}" if row[name] else f"no batch at "
                   f"{name.split('_')[2]}" for name in targets]
        parts.append(text + ", " + ", ".join(batches))
    first = limits.iloc[0]
    return (f"Interactive limits (TTFT within {number(first['ttft_target_s'])} s; {rates} tokens/s per user): "
            + "; ".join(parts) + ".")


# ---------------------------------------------------------------- rendering


def _html_pieces(pieces, links: bool) -> str:
    out = []
    for piece in pieces:
        if isinstance(piece, tuple):
            text, anchor = piece
            out.append(f'<a href="#{anchor}">{html.escape(text)}</a>' if links else html.escape(text))
        else:
            out.append(html.escape(piece))
    return "".join(out)


def _html_table(header, rows) -> str:
    head = "" if header is None else "<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in header) + "</tr>"
    body = "".join("<tr>" + "".join((f"<th>{html.escape(c)}</th>" if header is None and i == 0 else
                                     f"<td>{html.escape(c)}</td>") for i, c in enumerate(row)) + "</tr>"
                   for row in rows)
    return f'<div class="scroll"><table class="hl">{head}{body}</table></div>'


def headline_html(headline: Headline, *, links: bool = True) -> str:
    """The headline as HTML blocks (class "hl-block"); `links` points the counts at the report's lists."""
    parts = []
    for title, items in blocks(headline):
        parts.append(f'<div class="hl-block"><h3>{html.escape(title)}</h3>')
        for item in items:
            parts.append(f"<p>{_html_pieces(item[1], links)}</p>" if item[0] == "p" else _html_table(*item[1:]))
        parts.append("</div>")
    return "\n".join(parts) or '<p class="note">Nothing to report: no rows.</p>'


def headline_markdown(headline: Headline) -> str:
    """The headline as markdown: a heading per block, its sentences and pipe tables."""
    out = []
    for title, items in blocks(headline):
        out += [f"### {title}", ""]
        for item in items:
            if item[0] == "p":
                out += ["".join(p[0] if isinstance(p, tuple) else p for p in item[1]), ""]
                continue
            header, rows = item[1:]
            if header is None:
                header, rows = rows[0], rows[1:]
            out += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            out += ["| " + " | ".join(row) + " |" for row in rows] + [""]
    return "\n".join(out).rstrip() + "\n" if out else "Nothing to report: no rows.\n"
