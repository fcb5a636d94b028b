"""The `phases` verb: TTFT, TPOT and tokens/s of a model composed from measured kernels, checked against a real
forward pass (bench.phases.run_phases measures, analysis.phases composes and draws)."""

from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path

from ..sweep.selection import UsageError, load_plugins, resolve_device
from . import STARTED
from .options import (
    DEFAULT_ROUNDS,
    WARM_HELP,
    add_isolation_arguments,
    add_sampling_arguments,
    check_counts,
    check_seconds,
    check_writable,
    ci_target_of,
    isolation_of,
    rounds_of,
)


def parse_op_impls(items) -> dict[str, str]:
    """`attention=triton linear=torch` as a dict; one-line UsageError otherwise."""
    from ...kernels import OPS

    out = {}
    for item in items or ():
        op, sep, impl = item.partition("=")
        if not sep or op not in OPS or impl not in OPS[op]:
            raise UsageError(f"impl: expected OP=IMPL with OP in {', '.join(OPS)} and one of its impls, got {item!r}")
        out[op] = impl
    return out


NO_VENDOR_SCHEMES = ("fp8-e4m3", "fp8-b128", "mxfp4", "nvfp4")  # torch has no weight-only GEMM of these


def served_weights(args, device, impls: dict, model):
    """The ServedFormat the composition takes: the preset's own (bench.spec.quant.SERVED_FORMATS) without
    --weights, none with `--weights none`, else the scheme for the projections and a mixture's routed experts.
    Schemes torch has no weight-only GEMM for take Triton on a GPU and naive on the host, and packed experts the
    same moe impls, unless --impl names them. Only phasebench's decoder checks quantized weights."""
    from ..spec.quant import WEIGHT_CHOICES, ServedFormat, served_format

    if not args.weights:
        served = served_format(model.name)
    elif args.weights == "none":
        served = ServedFormat()
    else:
        scheme = WEIGHT_CHOICES[args.weights]
        served = ServedFormat(scheme, scheme if model.is_moe else "")
    if (served.projections or served.experts) and "transformers" in (args.reference or ()):
        raise UsageError(f"reference: transformers' models have unquantized weights; {model.name} is composed with "
                         f"{served.label}: with --weights none, or without --reference transformers")
    named = {item.partition("=")[0] for item in args.impl or ()}
    fallback = "triton" if device.type == "cuda" else "naive"
    if served.projections in NO_VENDOR_SCHEMES and "qlinear" not in named:
        impls["qlinear"] = fallback
    if served.experts and "moe" not in named:  # torch's _grouped_mm takes float experts only
        impls["moe"] = fallback
    return served


KV_DTYPES = ("fp8",)  # --kv-dtype choices: the KV cache (MLA: the latent) stored as e4m3 with float32 scales


def kv_dtype_of(args, model, device, impls: dict) -> str:
    """The KV cache's storage of --kv-dtype ("" without it: the model's dtype). SDPA and flex read no fp8 cache, so
    attention (and MLA's decode) take Triton on a GPU and naive on the host unless --impl names them."""
    if not args.kv_dtype:
        return ""
    named = {item.partition("=")[0] for item in args.impl or ()}
    for op in ("attention", "mla"):
        if op not in named:
            impls[op] = "triton" if device.type == "cuda" else "naive"
    return args.kv_dtype


def served_here(model, impls: dict, device, dtype: str | None) -> None:
    """A one-line UsageError where the composition's attention or mla impl cannot serve the model's kind here (a
    window or sinks, MLA decode), before anything is measured."""
    if model.attention == "gqa" and not model.sinks:
        return
    from ..instruments.roofline import TORCH_DTYPES
    from ..phases.attention_blocks import unserved
    from ..sweep.selection import default_dtype

    torch_dtype = TORCH_DTYPES.get(dtype or default_dtype(device))
    why = torch_dtype is not None and unserved(model, impls, device, torch_dtype)
    if why:
        raise UsageError(f"impl: {why}")


def speculate_of(args, model, device):
    """The --speculate settings (a SpeculateConfig) or None; a one-line UsageError for α outside (0, 1), γ < 1, or
    a draft of another vocabulary or not smaller than the target, before anything is written."""
    if not args.speculate:
        given = [name for name in ("draft", "gamma", "acceptance") if getattr(args, name) is not None]
        if given:
            raise UsageError(f"{given[0]}: applies to --speculate only")
        return None
    from ...analysis.phases import speculative as sp
    from ..phases.run_phases import LOOP_ITERATIONS, SpeculateConfig
    from ..spec.models import draft_config

    try:
        draft = draft_config(model, args.draft)
        gammas = tuple(sp.check_gamma(g) for g in args.gamma or SpeculateConfig.gammas)
        alphas = tuple(sp.check_alpha(a, open_interval=True) for a in args.acceptance or SpeculateConfig.alphas)
    except ValueError as err:
        raise UsageError(str(err)) from None
    return SpeculateConfig(draft, tuple(dict.fromkeys(gammas)), tuple(dict.fromkeys(alphas)),
                           iterations=LOOP_ITERATIONS["cuda" if device.type == "cuda" else "cpu"])


def cmd_phases(args) -> int:
    check_seconds(args, "sample_time", "case_timeout", "time_budget")
    ci_target = ci_target_of(args)
    check_counts(args, "prompt", "batch", "context", "chunk", "chunk_batch", "reference_layers", "reference_batch",
                 "reference_rounds")
    check_counts(args, "retry_noisy", minimum=0)
    args.rounds = rounds_of(args)
    isolation = isolation_of(args, start=True)
    load_plugins(args.plugin)
    device = resolve_device(args.device)
    from ..spec.models import model_config

    try:
        model = model_config(args.model)
    except ValueError as err:
        raise UsageError(str(err)) from None
    if model.attention != "gqa" and args.speculate:
        raise UsageError(f"speculate: the speculative loop runs GQA decoders; {model.name} has "
                         f"{model.attention.upper()} attention")
    if args.reference_layers is not None and args.reference_layers > model.layers:
        raise UsageError(f"reference-layers: {model.name} has {model.layers} layers, got {args.reference_layers}")
    if args.reference_layers is not None and args.reference_layers < model.dense_layers:
        raise UsageError(f"reference-layers: {model.name}'s first {model.dense_layers} layers are dense; L must be "
                         f"at least {model.dense_layers} so that the layers 2L adds are mixture layers, "
                         f"got {args.reference_layers}")
    references = tuple(dict.fromkeys(("phasebench", *(args.reference or ()))))
    from ...analysis.phases import model as pm

    impls = {**pm.DEFAULT_IMPLS, **parse_op_impls(args.impl)}
    served = served_weights(args, device, impls, model)
    kv_dtype = kv_dtype_of(args, model, device, impls)
    served_here(model, impls, device, args.dtype)
    if "transformers" in references:
        from ..phases.hf_reference import architecture, transformers_module

        try:
            architecture(transformers_module(), model)
        except (ImportError, ValueError) as err:
            raise UsageError(str(err).removeprefix("reference: ").splitlines()[0]) from None
    speculate = speculate_of(args, model, device)
    out = Path(args.out) if args.out else Path("results") / dt.datetime.now().strftime("phases-%Y%m%d-%H%M%S")
    check_writable(out)
    from ..phases.run_phases import PhasesConfig, ops_timer, run_phases
    from ..sweep.console import Progress

    if args.page_size is not None and args.page_size < 0:
        raise UsageError(f"page-size: must be a non-negative number of tokens (0: contiguous), got {args.page_size}")
    cfg = PhasesConfig.defaults(model, device, out, prompts=tuple(args.prompt) if args.prompt else None,
                                batches=tuple(args.batch) if args.batch else None, context=args.context,
                                chunks=tuple(args.chunk) if args.chunk else None, chunk_batch=args.chunk_batch,
                                reference_layers=args.reference_layers, dtype=args.dtype, page_size=args.page_size,
                                reference_batches=tuple(args.reference_batch) if args.reference_batch else None,
                                references=references,
                                reference_rounds=args.reference_rounds or (1 if args.time_budget else None))
    cfg.impls, cfg.on_row, cfg.isolation = impls, Progress(), isolation
    cfg.weights, cfg.experts, cfg.speculate = served.projections, served.experts, speculate
    cfg.kv_dtype = kv_dtype
    cfg.time_budget_s, cfg.started, cfg.retry_noisy = args.time_budget, STARTED, args.retry_noisy
    cfg.rounds = args.rounds
    cfg.timer = ops_timer(device, args.sample_time, warm=args.warm, ci_target=ci_target)
    reuse = None
    try:
        if args.reuse:
            from ...analysis import load

            reuse = load(*args.reuse)
        if args.interference:
            from ...analysis.interference.rows import load_interference

            cfg.interference = load_interference(*args.interference)
    except (ValueError, FileNotFoundError) as err:
        raise UsageError(str(err).splitlines()[0]) from None
    paged = f", KV cache in pages of {cfg.page_size}" if cfg.page_size else ""
    packed = "".join((f", projections {served.projections} by qlinear {impls['qlinear']}" if served.projections
                      else "", f", experts {served.experts} by moe {impls['moe']}" if served.experts else ""))
    kv = f", KV cache {cfg.kv_dtype} by attention {impls['attention']}" if cfg.kv_dtype else ""
    print(f"phasebench phases: {model.name} on {device} ({cfg.dtype}{paged}{packed}{kv}) -> {out}",
          file=sys.stderr)
    if cfg.kv_dtype:
        print(f"note: the check's real forward pass (phasebench's decoder) keeps its KV cache in {cfg.dtype}: it "
              f"checks the composition over {cfg.dtype} KV rows; the {cfg.kv_dtype}-KV tables are composed, not "
              "checked",
              file=sys.stderr)
    from ...analysis.phases.figures import phases_summary, write_phase_figures
    from ...analysis.phases.speculative_figures import speculative_summary, write_speculative_figures
    from ..spec.store.folder_lock import holding

    with holding(out):  # one writer per folder, the figures included
        tables = run_phases(cfg, reuse)
        print(phases_summary(tables))
        figures = write_phase_figures(tables, out)
        if speculate:
            import json

            described = {**tables, "meta": json.loads((out / "phases.json").read_text())}
            print(speculative_summary(described))
            figures += write_speculative_figures(described, out)
    print(f"\ntables: {out}/*.csv, phases.json; rows: {out}/ops; figures: {', '.join(p.name for p in figures)}")
    return 0


def add_phases_verb(verbs) -> None:
    """The `phases` verb and its options."""
    phases = verbs.add_parser("phases", help="TTFT, TPOT and tokens/s of a model composed from measured kernels, "
                                             "checked against a real forward pass")
    phases.add_argument("--model", default="llama-3-8b",
                        help="a preset or name=...,hidden=...,... (default llama-3-8b)")
    phases.add_argument("--prompt", nargs="+", type=int, metavar="P", help="prompt lengths (TTFT)")
    phases.add_argument("--batch", nargs="+", type=int, metavar="B", help="decode batches (TPOT, the batch sweep)")
    phases.add_argument("--context", type=int, help="tokens already in each decode sequence's cache")
    phases.add_argument("--chunk", nargs="+", type=int, metavar="C", help="chunked-prefill chunk sizes")
    phases.add_argument("--chunk-batch", type=int, help="decode batch running beside the chunked prompt")
    phases.add_argument("--reference-layers", type=int, help="layers of the real forward pass timed as a check")
    phases.add_argument("--reference-batch", nargs="+", type=int, metavar="B",
                        help="decode batches the real forward pass checks (default 1 and 8 on the host, 1 and 16 "
                             "on a GPU; the prefill check is the longest prompt)")
    phases.add_argument("--reference", nargs="+", choices=("phasebench", "transformers"), metavar="IMPL",
                        help="real forward passes to check the composition against: phasebench's decoder (always) "
                             "and transformers' LlamaForCausalLM with random weights where installed")
    phases.add_argument("--reference-rounds", type=int, metavar="N",
                        help="rounds of the check's ops, each between two timings of the real forward pass, so "
                             "that both sides see the same machine (default 5; 1 with --time-budget)")
    phases.add_argument("--speculate", action="store_true",
                        help="compose speculative decoding at the reference batches (a draft's decode steps and the "
                             "target's verify passes: speculative.csv) and check it against a real speculative loop")
    phases.add_argument("--draft", metavar="MODEL",
                        help="the draft: a preset or name=...,hidden=...,... of the target's vocabulary (default: the "
                             "target family's small preset, e.g. llama-3.2-1b for llama-3-8b)")
    phases.add_argument("--gamma", nargs="+", type=int, metavar="G",
                        help="draft tokens per iteration (default 1 2 4 8)")
    phases.add_argument("--acceptance", nargs="+", type=float, metavar="A",
                        help="i.i.d. acceptance rates α in (0, 1) (default 0.5 0.6 0.7 0.8 0.9)")
    phases.add_argument("--impl", nargs="+", metavar="OP=IMPL", help="e.g. attention=triton linear=triton")
    phases.add_argument("--weights", choices=("int8", "int4-g128", "int4-g32", "fp8", "mxfp4", "nvfp4", "fp8-b128",
                                              "none"),
                        help="the layers' projections and a mixture's routed experts weight-only quantized: measured "
                             "qlinear and moe rows of the scheme (default: the preset's served format, `phasebench "
                             "list`; none: unquantized); the router, MLA's absorbed kv_b halves and the lm_head "
                             "stay in the activation dtype")
    phases.add_argument("--kv-dtype", choices=KV_DTYPES,
                        help="the decode steps read the KV cache (an MLA model's latent) stored as fp8 e4m3 with a "
                             "float32 scale per KV head (default: the model's dtype); attention and mla take naive "
                             "on the host and triton on a GPU unless --impl names them; the decode table sets the "
                             "TPOT over a cache in the dtype beside it. The check's real forward pass keeps its cache "
                             "in the dtype")
    phases.add_argument("--page-size", type=int, metavar="P",
                        help="decode and chunk attention read a paged KV cache, pages of P tokens (default 0: "
                             "contiguous); the prompt's own attention stays contiguous")
    add_sampling_arguments(phases, "default 0.5 s on CUDA, 0.25 s on the host")
    phases.add_argument("--warm", action="store_true", help=WARM_HELP)
    phases.add_argument("--time-budget", type=float, metavar="S",
                        help="wall seconds for the whole command: the ops that would overrun are recorded skipped "
                             "(the scenarios that need them left blank), time kept for the reference and tables")
    add_isolation_arguments(phases)
    phases.add_argument("--rounds", type=int, metavar="N",
                        help="measure the ops N times, each round after the first in a fresh worker process: every "
                             "composed figure's interval is where a repeat of the command lands, from the spread of "
                             f"its per-round totals (default {DEFAULT_ROUNDS}, env PHASEBENCH_ROUNDS; 1, and with "
                             "--no-isolate: the rows' within-run intervals only)")
    phases.add_argument("--retry-noisy", type=int, default=2, metavar="N",
                        help="measure the ops timed on a busy machine again at the end, up to N times each (default "
                             "2): the composition takes quiet rows only")
    phases.add_argument("--reuse", nargs="+", metavar="RESULTS", help="measured rows to reuse (measure the rest)")
    phases.add_argument("--interference", nargs="+", metavar="DIR",
                        help="`phasebench interference` folders: their measured stretches (of this device and the "
                             "model's layer count; the table says why others are not used) replace the co-located "
                             "estimate and give the protected one; their hybrid rows are composed too, through the "
                             "layers each timed, against what they measured (hybrid_check.csv), and the chunked "
                             "table's rows take the verdict of the hybrid rows of their own shape")
    phases.add_argument("--device", help="cpu, cuda or cuda:N (default: the best device here)")
    phases.add_argument("--dtype", help="float32, float16 or bfloat16 (default: bfloat16 on CUDA, float32 on CPU)")
    phases.add_argument("--plugin", action="append", metavar="MODULE", help="import MODULE first (its kernels)")
    phases.add_argument("--out", help="folder (default: a new ./results/phases-<timestamp>/)")
    phases.set_defaults(func=cmd_phases)
