"""The verbs that compose and read results: `phases`, `report` and `compare`."""

from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path

from ..sweep.selection import UsageError, load_plugins, resolve_device
from . import STARTED
from .options import check_counts, check_seconds, check_writable, isolation_of


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


def cmd_phases(args) -> int:
    check_seconds(args, "sample_time", "case_timeout", "time_budget")
    check_counts(args, "prompt", "batch", "context", "chunk", "chunk_batch", "reference_layers", "reference_batch",
                 "reference_rounds")
    check_counts(args, "retry_noisy", minimum=0)
    isolation = isolation_of(args, start=True)
    load_plugins(args.plugin)
    device = resolve_device(args.device)
    from ..spec.models import model_config

    try:
        model = model_config(args.model)
    except ValueError as err:
        raise UsageError(str(err)) from None
    if args.reference_layers is not None and args.reference_layers > model.layers:
        raise UsageError(f"reference-layers: {model.name} has {model.layers} layers, got {args.reference_layers}")
    references = tuple(dict.fromkeys(("phasebench", *(args.reference or ()))))
    if "transformers" in references:
        from ..phases.hf_reference import transformers_module

        try:
            transformers_module()
        except ImportError as err:
            raise UsageError(str(err).removeprefix("reference: ").splitlines()[0]) from None
    out = Path(args.out) if args.out else Path("results") / dt.datetime.now().strftime("phases-%Y%m%d-%H%M%S")
    check_writable(out)
    from ...analysis.phases import model as pm
    from ..phases.run_phases import PhasesConfig, ops_timer, run_phases
    from ..sweep.console import Progress

    impls = {**pm.DEFAULT_IMPLS, **parse_op_impls(args.impl)}
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
    cfg.time_budget_s, cfg.started, cfg.retry_noisy = args.time_budget, STARTED, args.retry_noisy
    cfg.timer = ops_timer(device, args.sample_time, warm=args.warm)
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
    print(f"phasebench phases: {model.name} on {device} ({cfg.dtype}{paged}) -> {out}", file=sys.stderr)
    tables = run_phases(cfg, reuse)
    from ...analysis.phases.figures import phases_summary, write_phase_figures

    print(phases_summary(tables))
    figures = write_phase_figures(tables, out)
    print(f"\ntables: {out}/*.csv, phases.json; rows: {out}/ops; figures: {', '.join(p.name for p in figures)}")
    return 0


def cmd_report(args) -> int:
    from ...analysis import report_rows, write_report
    from ...analysis.report import comparison_of, headline, read_sources

    given = args.results or sorted(p for p in Path("results").glob("*") if p.is_dir())
    if not given:
        raise UsageError("results: none given and no ./results/ folders; run `phasebench run` first")
    try:  # each path is of one kind (analysis.report.sources.KINDS): run folders, results files, phases folders...
        sources = read_sources(*given)
        comparison, why_not = comparison_of(sources, force=args.compare)
    except (ValueError, FileNotFoundError) as err:
        raise UsageError(str(err).splitlines()[0]) from None
    if why_not:
        print(f"phasebench report: no comparison: {why_not}", file=sys.stderr)
    out = Path(args.out)
    check_writable(out)
    df = sources.rows
    paths = write_report(df, out, include_profiled=args.include_profiled, found=sources.found,
                         comparison=comparison)
    shown = report_rows(df, include_profiled=args.include_profiled)
    print(headline(shown, sources.of("phases"), include_profiled=True).markdown())
    left_out = f" ({len(df) - len(shown)} profiled rows left out)" if len(shown) < len(df) else ""
    for kind, given_paths in sources.paths.items():
        print(f"{kind}: {', '.join(map(str, given_paths))}")
    print(f"\n{len(shown)} rows from {shown['run_id'].nunique()} run(s){left_out}; report: {paths['html']}")
    return 0


def cmd_compare(args) -> int:
    from ...analysis import load
    from ...analysis.comparison.display import format_comparison
    from ...analysis.comparison.pairs import compare, parse_threshold, regression_line, regressions

    try:
        threshold = parse_threshold(args.threshold)
    except ValueError as err:
        raise UsageError(str(err)) from None
    if args.new is None and args.by != "impl":
        raise UsageError(f"new: --by {args.by} compares two result sets; give BASE and NEW (or use --by impl)")
    try:
        base = load(args.base)
        new = load(args.new) if args.new else None
        frame = compare(base, new, by=args.by, base_impl=args.base_impl, new_impl=args.new_impl,
                        threshold=threshold, confidence=args.confidence)
    except (ValueError, FileNotFoundError) as err:
        raise UsageError(str(err).splitlines()[0]) from None
    print(format_comparison(frame))
    if args.out:
        from ...analysis import write_report

        out = Path(args.out)
        check_writable(out)
        both = load(args.base, args.new) if args.new else base
        paths = write_report(both, out, title="phasebench comparison", comparison=frame)
        print(f"\ncomparison: {paths['comparison_csv']}, {paths['comparison']}; report: {paths['html']}")
    failed = regressions(frame, allow_missing=args.allow_missing)
    if args.fail_on_regression and len(failed):
        for _, row in failed.iterrows():
            print(f"phasebench compare: regression: {regression_line(row)}", file=sys.stderr)
        counts = failed["regression"].map(lambda r: "slower" if r == "slower" else
                                          "missing" if r.startswith("missing") else "status").value_counts()
        print(f"phasebench compare: {len(failed)} regression(s) ({', '.join(f'{n} {k}' for k, n in counts.items())}"
              f"; slower means by more than {threshold:.0%} with {args.confidence:.0%} confidence)", file=sys.stderr)
        return 1
    return 0
