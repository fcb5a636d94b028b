"""The `interference` verb: a prompt's arrival in the decode users' iterations (whole or chunked), and a decode step
timed alone, beside a prefill on the same device, and protected from it."""

from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path

from ..sweep.selection import UsageError, resolve_device
from .options import check_seconds, check_writable


def cmd_interference(args) -> int:
    check_seconds(args, "window")
    device = resolve_device(args.device)
    from ..phases.interference.run_hybrid import parse_chunk
    from ..phases.interference.run_interference import HOST_MODEL, InterferenceConfig, run_interference
    from ..spec.models import model_config

    out = Path(args.out) if args.out else Path("results") / dt.datetime.now().strftime("interference-%Y%m%d-%H%M%S")
    try:
        model = model_config(args.model or (HOST_MODEL if device.type == "cpu" else "llama-3-8b"))
        if model.attention != "gqa" or model.sinks:
            raise ValueError(f"model: the interference decoder's hybrid step runs GQA attention over a full cache; "
                             f"{model.name} has {model.attention.upper()}{' with sinks' if model.sinks else ''}")
        cfg = InterferenceConfig.defaults(model, device, out, dtype=args.dtype,
                                          prompts=tuple(args.prompt) if args.prompt else None,
                                          batches=tuple(args.batch) if args.batch else None, context=args.context,
                                          layers=args.layers, window_s=args.window, rounds=args.rounds,
                                          chunks=tuple(map(parse_chunk, args.chunk)) if args.chunk else None,
                                          arrivals=args.arrivals, forms=tuple(args.form) if args.form else None)
    except ValueError as err:
        raise UsageError(str(err)) from None
    check_writable(out)
    cfg.on_line = lambda line: print(line, file=sys.stderr, flush=True)
    forms = []
    if "hybrid" in cfg.forms:
        forms.append(f"hybrid: chunks {' '.join(map(str, cfg.chunks))}, {cfg.arrivals} arrivals each")
    if "spatial" in cfg.forms:
        forms.append(f"spatial: {cfg.rounds} rounds of {cfg.window_s:g} s windows")
    print(f"phasebench interference: {model.name} ({cfg.layers} layers, {cfg.dtype}) on {device}, batches "
          f"{list(cfg.batches)} at context {cfg.context}, prompts {list(cfg.prompts)}; {'; '.join(forms)} -> "
          f"{cfg.out_dir}", file=sys.stderr, flush=True)
    from ...analysis.interference.figures import write_interference_figures
    from ...analysis.interference.rows import interference_summary
    from ..spec.store.folder_lock import holding

    figures = []
    cfg.on_written = lambda table: figures.extend(write_interference_figures(table, cfg.out_dir))  # before the close
    with holding(cfg.out_dir):  # one writer per folder, the figures included
        rows = run_interference(cfg)
        print(interference_summary(rows))
    print(f"\nrows: {cfg.out_dir}/interference.csv, run.json; figures: {', '.join(p.name for p in figures)}")
    return 130 if rows.attrs.get("interrupted") else 0


def add_interference_verb(verbs) -> None:
    verb = verbs.add_parser("interference", help="a prompt's arrival in the decode users' iterations (whole or "
                                                 "chunked), and a decode step beside a looped prefill on the same "
                                                 "device: the users' inter-token latency (mean, p90, p99) and TTFT")
    verb.add_argument("--model", help="a preset or name=...,hidden=...,... (default: llama-3-8b on a GPU, a small "
                                      "decoder on the host)")
    verb.add_argument("--prompt", nargs="+", type=int, metavar="P", help="tokens of the co-located prefill")
    verb.add_argument("--batch", nargs="+", type=int, metavar="B", help="decode batches")
    verb.add_argument("--context", type=int, help="tokens already in each decode sequence's KV cache")
    verb.add_argument("--layers", type=int, help="decoder layers (default: 2 on the host; on a GPU as many as fit)")
    verb.add_argument("--window", type=float, metavar="S", help="seconds of decode samples per mode and round "
                                                                "(default 1)")
    verb.add_argument("--rounds", type=int, help="rounds over the modes, their order turned each round (default: 2 "
                                                 "on the host, 3 on a GPU)")
    verb.add_argument("--chunk", nargs="+", metavar="C", help="the hybrid form's prompt tokens per iteration, and "
                                                              "'whole' (default: 64 128 256 512 whole on the host)")
    verb.add_argument("--arrivals", type=int, help="the hybrid form's arrivals per batch, prompt and chunk, their "
                                                   "order turned each time (default: 4 on the host, 10 on a GPU)")
    verb.add_argument("--form", nargs="+", choices=("hybrid", "spatial"), help="what to measure (default: both)")
    verb.add_argument("--device", help="cpu, cuda or cuda:N (default: the best device here)")
    verb.add_argument("--dtype", help="float32, float16 or bfloat16 (default: bfloat16 on CUDA, float32 on CPU)")
    verb.add_argument("--out", help="folder (default: a new ./results/interference-<timestamp>/)")
    verb.set_defaults(func=cmd_interference)
