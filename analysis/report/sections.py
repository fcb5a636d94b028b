"""The report's sections in page order (SECTIONS): the headline beside the roofline, the figures, then the
tables. A section is a function of the Context that returns a Section, or None when it has nothing to say."""

from __future__ import annotations

import html

from ...bench.spec.store.files import write_table
from ..comparison.pairs import VERDICTS
from ..figures.kit import end_names, op_rows
from ..figures.linear import linear_crossings
from ..figures.moe import CAPTION as MOE_CAPTION
from ..figures.moe import all_touched_batch, moe_coverage, moe_coverage_table
from ..figures.quantized import CAPTION as QUANT_CAPTION
from ..figures.quantized import quant_speedup, quant_speedup_table
from ..phases.check import check_sentence
from ..phases.coverage import kv_lines
from ..phases.figures import PHASE_FIGURES, reference_table, with_ends
from ..phases.speculative import best_gammas, break_evens
from ..phases.speculative_figures import SPECULATIVE_FIGURES
from .context import Context, Section, figure_grid, folded
from .headline_table import headline
from .interference_section import interference_section
from .paged_section import paged_section
from .tables import (
    above_roof_rows,
    ceilings_table,
    correctness_table,
    noisy_rows,
    not_ok_rows,
    problems_table,
    runs_table,
    status_table,
    summary_table,
)

CAPTIONS = {
    "roofline": "Each point is one ok row; the roofs are the ceilings measured on the machine: the bandwidth slopes "
                "of a read stream (solid, with its ridge point: the roof of decode and GEMV), a write (dotted) and a "
                "copy (dash-dotted); a grey dash is each row's own roof, FLOPs over its floor of read bytes / read "
                "GB/s + write bytes / write GB/s; dashed roofs are the datasheet figures; hollow points are rows above "
                "their roof (findings).",
    "phase_comparison": "Latency and percentage of the measured roofline per implementation, prefill against "
                        "decode; a bar is the median.",
    "tokens_per_second": "Prompt tokens/s (batch·q_len / latency) against generated tokens/s (batch / latency) "
                         "for the same model preset: the prefill/decode gap.",
    "prefill_scaling": "Prefill latency and TFLOP/s as the sequence grows.",
    "decode_scaling": "Decode bandwidth as the KV cache grows, against the measured read ceiling (the copy "
                      "lighter).",
    "speedup": "Speedup over the baseline implementation on identical cases of one device, mode and timer.",
    "linear_sweep": "Each projection's achieved TFLOP/s, GB/s and latency against M under the measured roofs as "
                    "functions of M; the dash-dot line is the M from which it is compute-bound, the dotted one on "
                    "the latency panel the time to read the weights once at the measured read GB/s.",
    "layer_tokens_per_second": "M / (qkv + o + gate_up + down latency): tokens per second through one decoder "
                               "layer's projections, at the M values where all four were measured.",
    "phases_ttft": "Time to first token of one prompt (layers x the layer at M = prompt tokens, then the head) and "
                   "prompt tokens/s = prompt / TTFT.",
    "phases_decode": "Time per output token and output tokens/s = batch / TPOT against the decode batch; the dashed "
                     "line is the batch where throughput stops growing. Right: tokens/s each user sees, against "
                     "3 and 10 tok/s.",
    "phases_chunk": "Chunked prefill (Sarathi-Serve): one point per chunk size, the prompt's TTFT against the mean "
                    "inter-token latency of the decode users it shares steps with; the lines are the unchunked "
                    "TTFT and the decode-only step.",
    "phases_breakdown": "Where a decode step's time goes, by part; on the reference decoder's layer count, the "
                        "hatched top is what its measured step takes beyond the composition (launch gaps and the "
                        "rest), drawn only when positive.",
    "phases_speculative": "Speculative decoding: tokens/s over plain decode's against the acceptance rate α, one "
                          "line per draft length γ (E(α, γ) = (1 - α^(γ+1)) / (1 - α) tokens per iteration of γ "
                          "measured draft steps and one measured verify pass); dots are the α composed, diamonds "
                          "the break-even α on the 1x line.",
    "phases_best_gamma": "The draft length with the most tokens/s at each α, per batch, with its speedup.",
}
LEFT_OUT = ("Interpreter-mode rows (correctness only) and noisy rows (timed while the device was contended) are left "
            "out of every figure; rows above their roof (findings) are drawn hollow and labelled, in no median or "
            "line; each figure's title counts both.")


def _phase_suffix(index: int) -> str:
    """File-stem suffix of the index-th phases folder's figures: none for the first."""
    return "" if index == 0 else f"_{index + 1}"


def headline_section(ctx: Context) -> Section:
    """The answer first: the headline blocks, and the roofline beside them (below them on a narrow page)."""
    lead = headline(ctx.df, ctx.of("phases"), include_profiled=True)  # ctx.df already holds what is shown
    roof = ctx.performance_figures()["roofline"]
    return Section("headline", "Headline", [
        '<div class="answer"><h2>Headline</h2>', lead.html(),
        *(part for block in HEADLINE_BLOCKS for part in block(ctx)),
        '<p class="note">Per device, mode, timer and dtype, for each operator and phase: the implementation with the '
        "highest share of the measured roof (geometric mean over the cases every implementation measured), that "
        "share and the best case's, the bound of its rows, and how much faster it is than the next on those "
        "cases.</p></div>",
        ctx.figure("roofline", roof, CAPTIONS["roofline"], wide=False),
    ], css="lead", heading=False)


def comparison_block(ctx: Context) -> list[str]:
    """The comparison's counts in the headline, when there is one."""
    if ctx.comparison is None:
        return []
    return ['<div class="hl-block"><h3>Comparison: new against base</h3>',
            f'<p>{html.escape(comparison_counts(ctx.comparison))} → <a href="#comparison">comparison</a></p></div>']


def figures_section(ctx: Context) -> Section | None:
    """The phase figures of each phases folder, then every other figure of the rows."""
    parts = []
    for index, tables in enumerate(ctx.of("phases")):
        shown = {**PHASE_FIGURES, **(SPECULATIVE_FIGURES if tables.get("speculative") is not None else {})}
        for name, draw in shown.items():
            parts.append(ctx.figure(name + _phase_suffix(index), draw(tables), CAPTIONS[name]))
    for name, fig in ctx.performance_figures().items():
        if name != "roofline":
            parts.append(ctx.figure(name, fig, CAPTIONS.get(name, "")))
    if not parts:
        return None
    return Section("figures", "Figures", [f'<p class="note">{html.escape(LEFT_OUT)}</p>', figure_grid(parts)])


def phases_section(ctx: Context) -> Section | None:
    """Each phases folder's tables: what the composition of the measured ops gives for a whole model."""
    found = ctx.of("phases")
    if not found:
        return None
    body = ['<p class="note">Each step is the sum of count x median latency of the measured cases it runs '
            "(<code>phasebench phases</code>); the last table checks the sum against a real forward pass "
            "(error = 100 (composed - reference) / reference; negative: the composition is faster, by what it "
            "leaves out): error_pct is the error of the L-layer composition from ops/ (with the zero-layer pass), "
            "published_per_layer_error_pct that of one layer of the same rows (what speaks for the tables' full "
            "depth), per_layer_error_pct that of one layer of the check's own rounds of the ops, each against the "
            "real passes around it ((t(2L) - t(0)) / 2L: whatever runs once per pass cancels). Each error carries "
            "its 95% interval "
            "(_low_pct, _high_pct) and a verdict against the goal (goal_pct): within, OVER GOAL (the whole "
            "interval beyond it) or unresolved (the interval straddles it). The chunked table's check_verdict is "
            "that of the measured hybrid iterations of its own shapes (the hybrid check, through the layers each "
            "row timed).</p>"]
    for tables in found:
        meta = tables.get("meta") or {}
        model = meta.get("model") if isinstance(meta.get("model"), dict) else {}
        setting = ", ".join(str(meta[key]) for key in ("device", "dtype") if meta.get(key))
        body.append(f"<h3>{html.escape(str(model.get('name', '?')))} ({model.get('layers', '?')} layers)"
                    f"{', ' + html.escape(setting) if setting else ''}</h3>")
        checked = reference_table(tables)
        for name, title in (("prefill", "Prefill: TTFT per prompt"), ("decode", "Decode: the batch sweep"),
                            ("chunked", "Chunked prefill"), ("interactive", "Interactive limits")):
            if tables.get(name) is not None:
                # the per-iteration cost's ends stay in the CSV: a third interval cell would widen the table past
                # the page, and its point says the part (its interval: the summary's note, when below zero)
                shown = merged_ends(tables[name].drop(columns=["iteration_low_ms", "iteration_high_ms"],
                                                      errors="ignore"))
                notes = shown.pop("monotone_note") if "monotone_note" in shown else []  # sentences, not columns
                if "context" in shown and shown["context"].nunique() == 1:  # said once, in the title
                    title, shown = f"{title} at context {shown['context'].iloc[0]}", shown.drop(columns="context")
                body.append(folded(title, shown))
                body += [f"<p>batch {html.escape(str(b))}: {html.escape(n)}</p>" for b, n in
                         zip(shown.get("batch", []), notes, strict=False) if isinstance(n, str) and n]
                body += [f"<p>{html.escape(line)}</p>" for line in (kv_lines(tables[name]) if name == "decode"
                                                                    else [])]
                sentence = check_sentence(checked, name)
                if sentence:
                    flag = ' class="over-goal"' if "OVER GOAL" in sentence else ""
                    body.append(f"<p{flag}>{html.escape(sentence)}</p>")
        body.append(folded("The composition against a real forward pass", shown_with_ends(checked)))
        hybrid = tables.get("hybrid_check")
        if hybrid is not None and len(hybrid):  # with --interference hybrid rows of this model only
            body.append(folded("The hybrid iterations against phasebench interference's, through each row's layers",
                               hybrid))
        body += speculative_tables(tables)
    return Section("phases", "Phases: the whole model composed from the measured ops", body)


ENDED = ("error_pct", "published_per_layer_error_pct", "per_layer_error_pct")


def merged_ends(table):
    """A composed table as the page shows it: each column with its 95% interval ends in one cell ('12.3 [11.9,
    12.8]') and the ends' own columns dropped, so that wide tables fit the page."""
    ended = [c for c in table.columns if all(n in table for n in end_names(c))]
    return with_ends(table, *ended).drop(columns=[n for c in ended for n in end_names(c)])


def shown_with_ends(checked):
    """The reference table as the page shows it: each figure with its interval in one cell ('12.3 [11.9, 12.8]'),
    so that the table fits the page's width."""
    ends = [f"{c.rsplit('_', 1)[0]}_{side}_{c.rsplit('_', 1)[1]}" for c in ENDED for side in ("low", "high")]
    shown = with_ends(checked, *ENDED).drop(columns=[c for c in (*ends, *CSV_ONLY) if c in checked])
    return shown.rename(columns=SHORT_HEADS)


# the page's heads of the three errors (reference.csv keeps the names): the long names alone widened the table
SHORT_HEADS = {"error_pct": "error %", "published_per_layer_error_pct": "published per layer %",
               "per_layer_error_pct": "check's per layer %"}


# reference.csv keeps them; the page shows the errors and their verdicts
CSV_ONLY = ("goal_pct", "gap_ms", "tokens")


SPECULATIVE_NOTE = ("Speculative decoding (phasebench phases --speculate): per batch and acceptance rate α the draft "
                    "length γ with the most tokens/s, composed from the draft's measured decode steps and the "
                    "target's measured verify pass over γ + 1 positions; the break-even α per γ (speedup 1); and the "
                    "composition of the loop's cut models against a real speculative loop, at the loop's realised "
                    "tokens per iteration (error_pct; OVER GOAL beyond goal_pct), with the realised tokens against "
                    "E(α, γ) in standard errors (realised_z).")


LOOP_COLUMNS = ("batch", "gamma", "alpha", "realised_z", "published_error_pct", "published_verdict",
                "per_layer_error_pct", "per_layer_verdict", "loop_speedup", "composed_speedup", "speedup_error_pct",
                "speedup_verdict", "verdict")


def speculative_tables(tables: dict) -> list[str]:
    """The speculative tables of a phases folder written with --speculate (none otherwise)."""
    table = tables.get("speculative")
    if table is None or not len(table):
        return []
    table = table.assign(best_gamma=table["best_gamma"].astype(str).str.lower().isin(["true", "1"]))
    out = [f'<p class="note">{html.escape(SPECULATIVE_NOTE)}</p>',
           folded("Speculative decoding: the best γ per α", merged_ends(best_gammas(table))),
           folded("Speculative decoding: the break-even α per γ", break_evens(table))]
    check = tables.get("speculative_check")
    if check is not None:
        shown = [c for c in LOOP_COLUMNS if c in check]  # speculative_check.csv keeps the rest
        out.append(folded("Speculative decoding against a real loop", merged_ends(check)[shown]))
    return out


def linear_section(ctx: Context) -> Section | None:
    """The crossings table, only for rows with linear ones."""
    if op_rows(ctx.df, "linear").empty:
        return None
    note = ("Per projection and implementation: the M from which this N, K is compute-bound under the measured roof "
            "(crossing_m: 2·M·N·K at the matmul peak reaches the floor of elem·(M·K + N·K) bytes read and elem·M·N "
            "written at the read and write ceilings) and the intensity there (ridge_intensity), the M range "
            "measured and whether its ends are memory- and compute-bound. The achieved figures at the smallest and "
            "largest M, and the latency against the weight-streaming floor (elem·N·K bytes at the measured read "
            "GB/s; floor_pct = 100 · floor / latency), are over the rows neither noisy nor above their roof; "
            "interpreter-mode rows take no part.")
    return Section("linear", "Linear layers: where decode turns compute-bound",
                   [folded("Crossings", linear_crossings(ctx.df), note=note)])


QUANT_NOTE = ("Per projection, M, scheme and implementation: the speedup over the same projection unquantized (the "
              "vendor GEMM in the activation dtype, same group) and the ideal: the unquantized row's time over the "
              "quantized row's roof time on the measured ceilings (roof_ms), given only where the quantized row is "
              "memory-bound (below the ridge); pct_of_ideal = 100 · speedup / ideal; bytes_ratio (unquantized bytes / "
              "quantized bytes) for reference. The naive "
              "impl dequantizes the whole weight before a dense GEMM and so cannot gain; torch and Triton read the "
              "packed weights. Interpreter-mode rows (Triton without a GPU) prove correctness only and are in the "
              "correctness table.")


def quant_section(ctx: Context) -> Section | None:
    """Quantized linear layers against their unquantized projection, only for rows with qlinear ones."""
    if op_rows(ctx.df, "qlinear").empty:
        return None
    body = [f'<p class="note">{html.escape(QUANT_NOTE)}</p>',
            folded("Speedup against the ideal at the roof", quant_speedup_table(ctx.df)),
            figure_grid([ctx.figure("quant_speedup", quant_speedup(ctx.df), QUANT_CAPTION)])]
    return Section("quantized", "Quantized weights: speedup against the bytes they save", body)


MOE_NOTE = ("touched_experts: the distinct experts the case's seeded routing sends a token to, beside expected_touched "
            "= E·(1 - (1 - k/E)^M) under uniform routing; read_bytes: those experts' weights, x and the routing "
            "weights and ids (never the untouched experts). latency_ms (median, with the 95% interval of that median) "
            "and pct_roofline come from the rows neither interpreter-mode nor noisy (timed_rows of them; blank where "
            "none); above_roof marks a key where one of them stands above its roof (a finding, drawn hollow).")


def moe_section(ctx: Context) -> Section | None:
    """Routed experts against the batch (coverage, bytes, latency, % of roof), only for rows with moe ones."""
    table = moe_coverage_table(ctx.df)
    if table.empty:
        return None
    every = "; ".join(f"{model} {routing}: " + (f"from M = {m}" if m else "not within the batches measured")
                      for (model, routing), m in all_touched_batch(table).items())
    body = [f'<p class="note">{html.escape(MOE_NOTE)}</p>', f"<p>Every expert touched: {html.escape(every)}.</p>",
            folded("Coverage, bytes and latency per batch", table),
            figure_grid([ctx.figure("moe_coverage", moe_coverage(ctx.df), MOE_CAPTION)])]
    return Section("moe", "Routed experts: the experts a step reads as the batch grows", body)


def comparison_section(ctx: Context) -> Section | None:
    """New against base (analysis.comparison), only when a comparison was made: its figure, the pairs, the status
    changes, and the rows on one side only as counts with their lists folded."""
    if ctx.comparison is None:
        return None
    from ..comparison.display import comparison_figure, comparison_note, comparison_tables, no_pair_hint

    frame = ctx.comparison
    ctx.paths["comparison_csv"] = ctx.out / "comparison.csv"
    write_table(ctx.paths["comparison_csv"], frame)
    tables = comparison_tables(frame)
    counts = {title: len(table) for title, table in tables.items()}
    hint = no_pair_hint(frame) or ("" if counts["Pairs"] or counts["Status changes"] else
                                   "No pairs: no case of one side was measured on the other.")
    body = [f"<p><b>{html.escape(comparison_counts(frame))}</b>.</p>",
            f'<p class="note">{html.escape(comparison_note(frame))} {html.escape(hint)}</p>']
    if counts["Pairs"]:
        body.append(figure_grid([ctx.figure("comparison", comparison_figure(frame), wide=True)]))
    else:
        ctx.figure("comparison", comparison_figure(frame))  # the file, for `compare --out`; not worth a place here
    for title, table in tables.items():
        body.append(folded(title, table, fold_over=0 if title.startswith("Only in") else 12))
    return Section("comparison", "Comparison: new against base", body)


def comparison_counts(frame) -> str:
    """'3 pairs (1 slower, 0 faster, 2 within noise), 0 status changes, 9 only in base, 48 only in new'."""
    pairs = frame[frame["pairing"] == "pair"]
    verdicts = ", ".join(f"{int((pairs['verdict'] == verdict).sum())} {verdict}" for verdict in VERDICTS)
    return (f"{len(pairs)} pairs ({verdicts}), " + ", ".join(
        f"{int((frame['pairing'] == kind).sum())} {words}" for kind, words in
        (("status change", "status changes"), ("base only", "only in base"), ("new only", "only in new"))))


def summary_section(ctx: Context) -> Section:
    summary = summary_table(ctx.df)
    ctx.paths["summary"] = ctx.out / "summary.csv"
    write_table(ctx.paths["summary"], summary)
    note = ("Per group of ok rows (interpreter-mode rows are in the correctness table): how many, how many were "
            "noisy, how many stood above their roof and how many stopped at their time limit with the 95% interval "
            "of their median wider than its target (unconverged), the median half-width of those intervals in % of "
            "the median, over the ones neither noisy nor above their roof best and "
            "median % of the measured roofline, median TFLOP/s and GB/s, and the highest % of roof of those above "
            "it (findings, marked here, in no median).")
    return Section("summary", "Summary: by device, mode, timer, operator, phase and implementation",
                   [folded("Summary", summary, note=note)])


CEILINGS_NOTE = ("Measured on the machine past its last-level cache (L2 on a GPU), in the run (host) or cached behind "
                 "a probe (GPU): read_gbps a reduction (the roof of decode and GEMV), write_gbps a fill, copy_gbps a "
                 "copy counting the bytes read and written (peak_gbps). A row's memory floor is read bytes / "
                 "read_gbps + write bytes / write_gbps (a read-and-write pair at the copy's rate where that is "
                 "faster), its roof min(peak_tflops, FLOPs / floor), peak_tflops the matmul ceiling of what its "
                 "kernel multiplies in (compute_dtype: torch's host weight-only kernels multiply bf16 inputs in "
                 "fp32; '+' joins equal shares); copy_roof_rows have the copy roof instead (all "
                 "their bytes at copy_gbps): rows of files before schema 5, or of an operator whose cost model "
                 "gives no read/write split. `phasebench ceilings` prints each figure with when, how long and under "
                 "what load it was measured.")


def ceilings_section(ctx: Context) -> Section | None:
    """The read, write and copy ceilings and the matmul peak the rows were judged against."""
    table = ceilings_table(ctx.df)
    if table.empty:
        return None
    return Section("ceilings", "Ceilings: what each row's roof is made of",
                   [folded("Ceilings", table, note=CEILINGS_NOTE)])


def flagged_section(ctx: Context) -> Section:
    """Every row the headline counts as noisy, above its roof or not ok, listed."""
    return Section("flagged", "Rows to look at", [
        folded("Noisy rows: timed while the device was contended", noisy_rows(ctx.df), anchor="noisy-rows"),
        folded("Rows above their measured roof: findings, never results", above_roof_rows(ctx.df),
               anchor="above-roof-rows"),
        folded("Rows that are not ok, by reason", problems_table(ctx.df), anchor="not-ok-rows"),
        folded("Rows that are not ok, one by one", not_ok_rows(ctx.df), fold_over=0),
    ])


def correctness_section(ctx: Context) -> Section:
    return Section("correctness", "Correctness: the interpreter-mode rows", [
        '<p class="note">Triton in its interpreter proves correctness; its timings are not performance.</p>',
        folded("Interpreter-mode rows", correctness_table(ctx.df))])


def status_section(ctx: Context) -> Section:
    return Section("status", "Status", [folded("Rows by status", status_table(ctx.df))])


def runs_section(ctx: Context) -> Section:
    return Section("runs", "Runs", [folded("Runs", runs_table(ctx.df))])


# Blocks under the headline's own: each a function (ctx) -> list of HTML parts ([] when it has nothing to say).
HEADLINE_BLOCKS = [comparison_block]

# The page, in order. A new section: a function (ctx) -> Section | None, in its own module, put in its place here.
SECTIONS = [
    headline_section,
    figures_section,
    phases_section,
    interference_section,
    paged_section,
    linear_section,
    quant_section,
    moe_section,
    comparison_section,
    ceilings_section,
    summary_section,
    flagged_section,
    correctness_section,
    status_section,
    runs_section,
]
