"""A `phasebench phases` folder's TTFT / decode / chunking / breakdown figures and its summary."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogFormatter

from ..figures.kit import SERIES_GID, column_bars, column_ends, floats, new_figure, no_data, save_png
from .check import COLUMNS as CHECK_COLUMNS
from .check import check_sentence, verdict_counts, verdict_notes
from .coverage import coverage_lines, iteration_notes, kv_lines
from .folder import as_bool
from .hybrid_check import hybrid_lines
from .model import ONCE, SATURATION_MARGIN, USER_TARGETS
from .remedies import remedy_lines

PART_LABELS = {"weights": "weights (linear)", "experts": "routed experts (moe)", "attention": "KV reads (attention)",
               "elementwise": "elementwise", "head": "head (lm_head + pick)",
               "iteration": "per-iteration cost (zero-layer pass less the head)"}
GAP_LABEL = "launch gaps and the rest"
PART_COLORS = {"weights": "#1f77b4", "experts": "#17becf", "attention": "#d62728", "elementwise": "#2ca02c",
               "iteration": "#ff7f0e", "head": "#9467bd", "gap": "#bbbbbb"}


# ---------------------------------------------------------------- figures


def _heading(tables: dict, what: str) -> str:
    """'what · model · device · dtype' from phases.json, as far as it says."""
    meta = tables.get("meta") or {}
    model = (meta.get("model") or {}).get("name") if isinstance(meta.get("model"), dict) else meta.get("model")
    parts = [what] + [str(v) for v in (model, meta.get("device"), meta.get("dtype")) if v]
    return " · ".join(parts)


def _incomplete_note(table: pd.DataFrame) -> str:
    count = int((floats(table["missing"]) > 0).sum()) if "missing" in table else 0
    return f"\n({count} point(s) left out: ops not measured)" if count else ""


def _unmeasured(table: pd.DataFrame, column: str) -> bool:
    """No point of the table has a figure (every one lacks a measured op, e.g. all of them noisy): nothing to
    draw on a log axis."""
    return not np.isfinite(floats(table[column])).any()


def _log2_batches(ax, values) -> None:
    ax.set_xscale("log", base=2)
    ticks = sorted({int(v) for v in values if np.isfinite(v)})
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.minorticks_off()


def _plain_log(ax) -> None:
    """Log y with plain numbers on the ticks (4, 40, 400 rather than 4x10^1); linear while nothing is positive."""
    if not any((np.asarray(line.get_ydata(), float) > 0).any() for line in ax.get_lines()):
        return  # every point missing (noisy rows left out): matplotlib refuses to log-scale nothing
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    ax.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False))  # labels some minor ticks on a short range


def _empty(tables: dict, name: str) -> bool:
    table = tables.get(name)
    return table is None or len(table) == 0


def ttft_figure(tables: dict, *, figsize=None) -> Figure:
    """Time to first token against prompt length, and prompt tokens/s (prompt / TTFT) beside it."""
    title = _heading(tables, "Prefill: time to first token")
    if _empty(tables, "prefill"):
        return no_data(title, "no prefill table")
    if _unmeasured(tables["prefill"], "ttft_ms"):
        return no_data(title, "no prompt composed: " + _incomplete_note(tables["prefill"]).strip("\n()"))
    table = tables["prefill"].sort_values("prompt")
    prompts = floats(table["prompt"])
    fig, axes = new_figure(1, 2, figsize=figsize)
    for ax, column, label, color in ((axes[0, 0], "ttft_ms", "TTFT (ms)", "#1f77b4"),
                                     (axes[0, 1], "prompt_tokens_per_s", "prompt tokens/s", "#ff7f0e")):
        ax.plot(prompts, floats(table[column]), marker="o", color=color, gid=SERIES_GID, label=column)
        column_bars(ax, prompts, table, column, color)
        _log2_batches(ax, prompts)
        _plain_log(ax)
        ax.set_xlabel("prompt length (tokens)")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    axes[0, 0].set_title("TTFT (prompt alone)")
    axes[0, 1].set_title("prefill throughput")
    fig.suptitle(title + _incomplete_note(table))
    return fig


def decode_figure(tables: dict, *, figsize=None) -> Figure:
    """TPOT and output tokens/s (batch / TPOT) against batch with the saturation batch marked; tokens/s per
    user against the interactive targets on a second panel."""
    title = _heading(tables, "Decode: the batch sweep")
    if _empty(tables, "decode"):
        return no_data(title, "no decode table")
    if _unmeasured(tables["decode"], "tpot_ms"):
        return no_data(title, "no batch composed: " + _incomplete_note(tables["decode"]).strip("\n()"))
    table = tables["decode"].sort_values("batch")
    batches = floats(table["batch"])
    context = table["context"].iloc[0]
    fig, axes = new_figure(1, 2, figsize=figsize)
    ax = axes[0, 0]
    ax.plot(batches, floats(table["tpot_ms"]), marker="o", color="#1f77b4", gid=SERIES_GID, label="TPOT (ms)")
    column_bars(ax, batches, table, "tpot_ms", "#1f77b4")
    ax.set_ylabel("TPOT (ms), 95% CI", color="#1f77b4")
    twin = ax.twinx()
    twin.plot(batches, floats(table["tokens_per_s"]), marker="s", color="#ff7f0e", gid=SERIES_GID,
              label="output tokens/s")
    column_bars(twin, batches, table, "tokens_per_s", "#ff7f0e")
    twin.set_ylabel("output tokens/s (batch / TPOT)", color="#ff7f0e")
    saturated = table[table["saturated"].map(as_bool)]
    if len(saturated):
        knee = float(saturated["batch"].iloc[0])
        ax.axvline(knee, color="0.35", linestyle="--", linewidth=1, gid="saturation")
        ax.annotate(f"saturates at batch {int(knee)}", (knee, 0.96), xycoords=("data", "axes fraction"),
                    xytext=(4, 0), textcoords="offset points", va="top", fontsize="small", color="0.25")
        state = saturation_text(int(knee), None)
    else:
        state = saturation_text(None, int(np.nanmax(batches)))
    for axis in (ax, twin):
        _log2_batches(axis, batches)
    ax.set_xlabel("decode batch")
    ax.set_title(f"context {context}: {state}", fontsize="medium")
    ax.grid(True, alpha=0.3)

    ax = axes[0, 1]
    ax.plot(batches, floats(table["tokens_per_s_per_user"]), marker="o", color="#2ca02c", gid=SERIES_GID,
            label="tokens/s per user")
    column_bars(ax, batches, table, "tokens_per_s_per_user", "#2ca02c")
    for target, style in zip(USER_TARGETS, (":", "--"), strict=True):
        ax.axhline(target, color="0.4", linestyle=style, linewidth=1, gid="target", label=f"{target:g} tok/s")
    _log2_batches(ax, batches)
    _plain_log(ax)
    ax.set_xlabel("decode batch")
    ax.set_ylabel("tokens/s per user (1 / TPOT)")
    ax.set_title("what each user sees", fontsize="medium")
    ax.legend(fontsize="small")
    ax.grid(True, alpha=0.3)
    fig.suptitle(title + _incomplete_note(table))
    return fig


def chunk_figure(tables: dict, *, figsize=(7.0, 5.0)) -> Figure:
    """Chunked prefill: the prompt's TTFT against the mean inter-token latency the decode users see, one point
    per chunk size, with the unchunked TTFT and the decode-only ITL as reference lines."""
    title = _heading(tables, "Chunked prefill: TTFT against the decode users' ITL")
    if _empty(tables, "chunked"):
        return no_data(title, "no chunked table")
    if _unmeasured(tables["chunked"], "ttft_ms"):
        return no_data(title, "no chunk size composed: " + _incomplete_note(tables["chunked"]).strip("\n()"))
    table = tables["chunked"].sort_values("chunk")
    first = table.iloc[0]
    fig, axes = new_figure(figsize=figsize)
    ax = axes[0, 0]
    itl, ttft = floats(table["itl_ms"]), floats(table["ttft_ms"])
    ax.plot(itl, ttft, marker="o", color="#1f77b4", gid=SERIES_GID, label="chunked (mean ITL)")
    column_bars(ax, itl, table, "ttft_ms", "#1f77b4")  # TTFT's interval; the ITL's is in the table
    for x, y, chunk in zip(itl, ttft, table["chunk"], strict=True):
        if np.isfinite(x) and np.isfinite(y):
            ax.annotate(f"C={chunk}", (x, y), xytext=(5, 4), textcoords="offset points", fontsize="small",
                        gid="chunk_label")
    ax.axhline(first["unchunked_ttft_ms"], color="0.4", linestyle="--", linewidth=1, gid="unchunked_ttft",
               label=f"unchunked TTFT ({first['unchunked_ttft_ms']:.3g} ms)")
    ax.axvline(first["decode_only_ms"], color="0.4", linestyle=":", linewidth=1, gid="decode_only_itl",
               label=f"decode-only ITL ({first['decode_only_ms']:.3g} ms)")
    ax.set_xlabel(f"inter-token latency of the {_number(first['decode_batch'])} decode users (ms)")
    ax.set_ylabel(f"TTFT of the {_number(first['prompt'])}-token prompt (ms)")
    ax.legend(fontsize="small")
    ax.grid(True, alpha=0.3)
    fig.suptitle(f"{title}\n{_number(first['decode_batch'])} users at context {_number(first['context'])}"
                 + _incomplete_note(table))
    return fig


def breakdown_bars(tables: dict) -> list[tuple[str, dict[str, float]]]:
    """(bar label, {part: ms}) for the decode breakdown: the model's step as composed, and where the reference
    decoder ran, the same step at its layer count with the measured remainder as "gap" (only when positive)."""
    if _empty(tables, "decode_parts"):
        return []
    items = tables["decode_parts"]
    per_part = {part: float(items.loc[items["part"] == part, "ms"].sum()) for part in PART_LABELS}
    in_layers = items[~items["part"].isin(ONCE)]
    # the model's layers (a table from before the column: the ops run once per layer or twice, all layers alike)
    layers = int(items["layers"].iloc[0]) if "layers" in items and len(items) else \
        int(floats(in_layers["count"]).min()) if len(in_layers) else 0
    bars = [(f"composed\n{layers} layers", per_part)]
    reference = reference_table(tables)
    decode = reference[(reference["phase"] == "decode") & (reference["reference"] == "phasebench")]
    batch = items["batch"].iloc[0] if "batch" in items and len(items) else None
    if batch is not None:  # the reference step of the breakdown's own batch
        decode = decode[decode["batch"] == batch]
    if layers and len(decode):
        row = decode.iloc[0]
        scale = float(row["layers"]) / layers
        scaled = {part: ms * (1.0 if part in ONCE else scale) for part, ms in per_part.items()}
        gap = float(row["gap_ms"])  # against the published composition, whose parts the bar scales
        if np.isfinite(gap) and gap > 0:
            scaled["gap"] = gap
        bars.append((f"reference\n{int(row['layers'])} layers", scaled))
    return bars


def decode_breakdown_figure(tables: dict, *, figsize=(6.5, 5.0)) -> Figure:
    """Where a decode step's time goes: a stacked bar per composition (weights, KV reads, elementwise, head)
    and, on the reference decoder's layer count, what the measured step adds on top (launch gaps and the rest)."""
    title = _heading(tables, "Decode step: where the time goes")
    bars = breakdown_bars(tables)
    if not bars:
        return no_data(title, "no decode_parts table")
    fig, axes = new_figure(figsize=figsize)
    ax = axes[0, 0]
    labelled = set()
    for position, (_, parts) in enumerate(bars):
        bottom = 0.0
        for part, ms in parts.items():
            if not ms > 0:
                continue
            name = GAP_LABEL if part == "gap" else PART_LABELS[part]
            (patch,) = ax.bar(position, ms, bottom=bottom, width=0.55, color=PART_COLORS[part], edgecolor="0.3",
                              hatch="//" if part == "gap" else None,
                              label=name if name not in labelled else "_nolegend_")
            patch.set_gid(part)
            labelled.add(name)
            bottom += ms
        # the total of every part: a negative per-iteration cost (the head composed slower than the zero-layer pass
        # runs) is not drawn but counts
        ax.annotate(f"{sum(parts.values()):.3g} ms", (position, bottom), xytext=(0, 3), textcoords="offset points",
                    ha="center", fontsize="small")
    ax.set_xticks(range(len(bars)), [label for label, _ in bars])
    ax.set_xlim(-0.7, len(bars) - 0.3)
    ax.set_ylabel("ms per decode step")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(True, axis="y", alpha=0.3)
    parts = tables.get("decode_parts")
    setting = f"\nbatch {int(parts['batch'].iloc[0])} at context {int(parts['context'].iloc[0])}" \
        if parts is not None and len(parts) and {"batch", "context"} <= set(parts) else ""
    fig.suptitle(title + setting)
    return fig


# ---------------------------------------------------------------- tables and text


def reference_table(tables: dict) -> pd.DataFrame:
    """The composition against real forward passes (reference.csv: analysis.phases.check.COLUMNS), with the gap
    between the reference and the published composition. Errors are negative where the composition is faster."""
    reference = tables.get("reference")
    if reference is None or not len(reference):
        return pd.DataFrame(columns=[*CHECK_COLUMNS, "gap_ms"])
    table = reference.reindex(columns=list(CHECK_COLUMNS))
    return table.assign(gap_ms=floats(table["reference_ms"]) - floats(table["composed_ms"])).reset_index(drop=True)


def _number(value) -> str:
    if not isinstance(value, (int, float, np.integer, np.floating)) or isinstance(value, bool):
        return str(value)
    if not np.isfinite(value):
        return "–"
    if float(value).is_integer() and abs(value) < 1e6:
        return str(int(value))
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}" if abs(value) < 1 else f"{value:.2f}"


def saturation_text(knee: int | None, largest: int | None) -> str:
    """What the batch sweep says of throughput, from its saturated batch (None: none) and its largest batch."""
    margin = f"{SATURATION_MARGIN:.0%}"
    if knee is not None:
        return f"no larger batch adds more than {margin} throughput beyond batch {knee}"
    return f"throughput still grows by more than {margin} up to batch {largest}"


def _text(table: pd.DataFrame, columns) -> str:
    shown = table[[c for c in columns if c in table.columns]]
    return shown.to_string(index=False, formatters={c: _number for c in shown.columns})


def with_ends(table: pd.DataFrame, *columns: str, suffix: str = "") -> pd.DataFrame:
    """The table with each column's value written with its 95% interval, '12.3 [11.9, 12.8]', where the table has
    its ends (kit.column_ends)."""
    out = table.copy()
    for column in columns:
        ends = column_ends(out, column, suffix) if column in out else None
        if ends is not None:
            out[column] = [_number(v) + (f" [{_number(lo)}, {_number(hi)}]" if np.isfinite(lo) and np.isfinite(hi)
                                         else "") for v, lo, hi in zip(floats(out[column]), *ends, strict=True)]
    return out


def phases_summary(tables: dict) -> str:
    """What `phasebench phases` prints: TTFT per prompt, the decode sweep with its saturation batch, the chunk
    table, the interactive limits and the composition's error against a real forward pass."""
    out = [_heading(tables, "phases")]
    meta = tables.get("meta") or {}
    if meta.get("impls"):
        out[0] += " · " + ", ".join(f"{op}={impl}" for op, impl in meta["impls"].items())
    if meta.get("page_size"):
        out[0] += f" · KV cache in pages of {meta['page_size']} (decode and chunks)"
    reference = reference_table(tables)
    if not _empty(tables, "prefill"):
        out += ["", "Prefill (one prompt; [95% interval]):", _text(
            with_ends(tables["prefill"], "ttft_ms", "prompt_tokens_per_s"),
            ("prompt", "ttft_ms", "prompt_tokens_per_s", "noisy_left_out"))]
        out += [line for line in (check_sentence(reference, "prefill"),) if line]
    if not _empty(tables, "decode"):
        decode = tables["decode"].sort_values("batch")
        marked = decode.assign(saturated=["<- saturates" if as_bool(s) else "" for s in decode["saturated"]])
        knee = decode.loc[decode["saturated"].map(as_bool), "batch"]
        state = saturation_text(int(knee.iloc[0]) if len(knee) else None, int(decode["batch"].max())) \
            if np.isfinite(floats(decode["tokens_per_s"])).any() else "no batch composed: ops missing or noisy"
        out += ["", f"Decode at context {decode['context'].iloc[0]} ({state}):",
                _text(with_ends(marked, "tpot_ms", "weights_speedup", "tokens_per_s"),
                      ("batch", "tpot_ms", "unquantized_tpot_ms", "weights_speedup", "tokens_per_s",
                       "tokens_per_s_per_user", "experts_ms", "touched_experts", "expected_touched", "saturated",
                       "noisy_left_out"))]
        out += [f"batch {int(b)}: TPOT {note}" for b, note in zip(decode["batch"], decode.get(
            "monotone_note", pd.Series("", index=decode.index)), strict=True) if isinstance(note, str) and note]
        out += coverage_lines(decode) + kv_lines(decode)
        out += [line for line in (check_sentence(reference, "decode"),) if line]
    if not _empty(tables, "chunked"):
        chunked = tables["chunked"].sort_values("chunk")
        first = chunked.iloc[0]
        out += ["", f"Chunked prefill of {_number(first['prompt'])} tokens beside {_number(first['decode_batch'])} "
                    f"decode users at context {_number(first['context'])} (unchunked TTFT "
                    f"{_number(first['unchunked_ttft_ms'])} ms, decode-only ITL "
                    f"{_number(first['decode_only_ms'])} ms):",
                _text(with_ends(chunked, "ttft_ms", "itl_ms", "itl_increase_pct", "chunking_cost_pct"),
                      ("chunk", "steps", "ttft_ms", "itl_ms", "itl_max_ms", "itl_increase_pct", "chunking_cost_pct",
                       "check_verdict")),
                "Not checked: itl_increase_pct and chunking_cost_pct (the hybrid check judges the prompt's TTFT and "
                "the slowest iteration, check_verdict)."]
    out += hybrid_lines(tables.get("hybrid_check")) + remedy_lines(tables)
    if not _empty(tables, "interactive"):
        limits = tables["interactive"]
        wide = limits.pivot_table(index="prompt", columns="user_tokens_per_s_target", values="largest_batch",
                                  aggfunc="max")
        wide.columns = [f"batch@{c:g}tok/s" for c in wide.columns]
        ttft = limits.groupby("prompt")["ttft_ms"].first()
        wide = pd.concat([ttft, wide], axis=1).reset_index()
        out += ["", f"Interactive limits (TTFT within {_number(limits['ttft_target_s'].iloc[0])} s; the largest "
                    "batch giving each user the rate):", _text(wide, wide.columns)]
    if len(reference):
        counts = verdict_counts(reference)
        out += iteration_notes(tables)
        out += ["", "Composition against a real forward pass (errors < 0: the composition is faster; [95% interval]; "
                    "error: the published L-layer composition, with the zero-layer pass; published per layer: one "
                    "layer of the published rows, what speaks for the tables' full depth; check's per layer: one "
                    "layer of the check's own rounds of the ops against (t(2L) - t(0)) / 2L of the passes around "
                    "each):",
                _text(with_ends(reference, "reference_ms", "error_pct", "published_per_layer_error_pct",
                                "per_layer_error_pct"),
                      ("reference", "phase", "layers", "batch", "reference_ms", "composed_ms", "error_pct",
                       "published_per_layer_error_pct", "per_layer_error_pct", "verdict")),
                f"verdicts: {counts['within']} within, {counts['over']} over, {counts['unresolved']} unresolved"
                + (" (most unresolved: the check could not resolve the goal on this host)"
                   if counts["unresolved_share"] > 0.5 else "")]
        out += [f"OVER GOAL: {note}" for note in verdict_notes(reference, "over")]
        out += [f"unresolved: {note}" for note in verdict_notes(reference, "unresolved")]
        details = tables.get("reference_details")
        said = details["left_out"] if details is not None and "left_out" in details else []
        left_out = "; ".join(dict.fromkeys(part for s in said if isinstance(s, str) for part in s.split("; ") if part))
        if left_out:
            out.append(f"left out of the composition: {left_out}")
    return "\n".join(out)


PHASE_FIGURES = {"phases_ttft": ttft_figure, "phases_decode": decode_figure, "phases_chunk": chunk_figure,
                 "phases_breakdown": decode_breakdown_figure}


def write_phase_figures(tables: dict, out_dir, *, dpi: int = 110, figures: dict | None = None) -> list[Path]:
    """The four phase figures (or `figures`: name -> draw) as PNG files in out_dir, named as PHASE_FIGURES."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, draw in (figures or PHASE_FIGURES).items():
        path = out / f"{name}.png"
        save_png(draw(tables), path, dpi)
        paths.append(path)
    return paths
