"""The report's section on paged KV caches: what the block table costs each implementation, per page size, against
the same case with a contiguous cache (its table and its figure), when any case was measured paged."""

from __future__ import annotations

import html

from ..figures.paged import CAPTION, interpreted_paged, paged_figure, paged_rows, paged_table
from .context import Context, Section, figure_grid, folded

NOTE = ("vs_contiguous = GB/s at this page size / GB/s of the same case with a contiguous cache, per implementation "
        "(1: the pages cost nothing; below 1: the indirection or a gather costs bandwidth). naive and the SDPA route "
        "without flash_attn gather the pages into contiguous K/V inside the call (backend gather+...); flash_attn "
        "and Triton read the pages in place. Interpreter-mode rows prove correctness only and are in the "
        "correctness table.")


def paged_section(ctx: Context) -> Section | None:
    if paged_rows(ctx.df).empty and not interpreted_paged(ctx.df):
        return None
    body = [f'<p class="note">{html.escape(NOTE)}</p>',
            folded("Paged rows beside their contiguous case", paged_table(ctx.df)),
            figure_grid([ctx.figure("paged", paged_figure(ctx.df), CAPTION)])]
    return Section("paged", "Paged KV cache: what the block table costs", body)
