"""The decode-kinds roofline and its table on synthetic rows: GQA, window and MLA decode at the contexts they share,
each row with its own roof, interpreter rows left out and counted, an above-roof row hollow."""

from __future__ import annotations

import numpy as np
import pandas as pd
from phasebench.analysis import decode_kinds_roofline, decode_kinds_table
from phasebench.analysis.figures.roofline import ROW_ROOF_GID
from phasebench.bench.spec.schema import conform

from .conftest import make_rows


def kinds_frame(rng=None) -> pd.DataFrame:
    rng = rng or np.random.default_rng(46)
    gqa = make_rows(rng, impls=("flash", "triton"), not_ok=False, decode_kv_lens=(1024, 4096), decode_batches=(1, 8),
                    prefill_lens=(256,), interpreter_impls=("triton",))
    decode = gqa[gqa["phase"] == "decode"]
    window = decode[decode["kv_len"] == 1024].assign(window_left=127, sinks=True)  # window rows at 1024 only
    mla = decode.assign(op="mla", kv_heads=1, head_dim=576, head_dim_v=512, q_heads=128,
                        intensity=decode["intensity"] * 30, model="deepseek-v3")
    return conform(pd.concat([gqa, window, mla], ignore_index=True))


def test_the_table_keeps_the_contexts_every_kind_shares():
    table = decode_kinds_table(kinds_frame())
    assert set(table["kv_len"]) == {1024}  # GQA and MLA reach 4096, the window rows do not
    assert set(table["kind"]) == {"GQA", "window", "MLA"} and set(table["impl"]) == {"flash"}  # triton: interpreter
    assert list(dict.fromkeys(table["kind"])) == ["GQA", "window", "MLA"]
    mla = table[table["kind"] == "MLA"]
    assert (mla["intensity"] > 20 * table.loc[table["kind"] == "GQA", "intensity"].max()).all()


def test_the_figure_draws_every_row_beside_its_own_roof():
    frame = kinds_frame()
    above = frame.index[(frame["op"] == "mla") & (frame["impl"] == "flash") & (frame["kv_len"] == 1024)][0]
    frame.loc[above, ["above_roof", "pct_roofline"]] = [True, 112.0]
    fig = decode_kinds_roofline(frame)
    ax = fig.axes[0]
    points = sum(len(c.get_offsets()) for c in ax.collections if c.get_gid() == "series")
    hollow = sum(len(c.get_offsets()) for c in ax.collections if c.get_gid() == "above_roof")
    roofs = [c for c in ax.collections if c.get_gid() == ROW_ROOF_GID]
    assert points + hollow == len(decode_kinds_table(frame)) == 6 and hollow == 1
    assert len(roofs) == 1 and len(roofs[0].get_offsets()) == 6
    assert "context 1024" in ax.get_title() and "interpreter-mode" in fig._suptitle.get_text()


def test_no_decode_row_of_a_kind_says_so():
    prefill = kinds_frame().query("phase == 'prefill'")
    assert decode_kinds_table(prefill).empty
    assert "no ok decode row" in decode_kinds_roofline(prefill).axes[0].texts[0].get_text()


def test_fp8_kv_rows_are_kinds_of_their_own_up_the_read_slope():
    frame = kinds_frame()
    gqa = frame[(frame["op"] == "attention") & (frame["phase"] == "decode") & (frame["window_left"] < 0)]
    fp8 = gqa[gqa["kv_len"] == 1024].assign(kv_dtype="fp8", intensity=gqa["intensity"] * 2)  # at 1024 only
    table = decode_kinds_table(conform(pd.concat([frame, fp8], ignore_index=True)))
    assert set(table["kv_len"]) == {1024}  # an fp8 row keeps the contexts its kind shares, and removes none
    assert list(dict.fromkeys(table["kind"])) == ["GQA", "GQA fp8 KV", "window", "MLA"]
    fp8_rows = table[table["kind"] == "GQA fp8 KV"].set_index(["batch", "impl"])["intensity"]
    plain = table[table["kind"] == "GQA"].set_index(["batch", "impl"])["intensity"]
    assert (fp8_rows / plain).round(6).eq(2.0).all()
    assert decode_kinds_roofline(conform(pd.concat([frame, fp8], ignore_index=True))).axes  # its marker drawn
