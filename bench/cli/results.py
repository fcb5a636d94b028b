"""The verbs that compose and read results: `phases`, `report` and `compare`."""

from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path

from ..sweep.selection import UsageError, check_seconds, check_writable, load_plugins, resolve_device


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
    check_seconds(args, "sample_time")
    load_plugins(args.plugin)
    device = resolve_device(args.device)
    from ..spec.models import model_config

    try:
        model = model_config(args.model)
    except ValueError as err:
        raise UsageError(str(err)) from None
    out = Path(args.out) if args.out else Path("results") / dt.datetime.now().strftime("phases-%Y%m%d-%H%M%S")
    check_writable(out)
    from ...analysis import phase_model as pm
    from ..phases.run_phases import PhasesConfig, ops_timer, run_phases
    from ..sweep.console import Progress

    impls = {**pm.DEFAULT_IMPLS, **parse_op_impls(args.impl)}
    if args.page_size is not None and args.page_size < 0:
        raise UsageError(f"page-size: must be a non-negative number of tokens (0: contiguous), got {args.page_size}")
    cfg = PhasesConfig.defaults(model, device, out, prompts=tuple(args.prompt) if args.prompt else None,
                                batches=tuple(args.batch) if args.batch else None, context=args.context,
                                chunks=tuple(args.chunk) if args.chunk else None, chunk_batch=args.chunk_batch,
                                reference_layers=args.reference_layers, dtype=args.dtype, page_size=args.page_size)
    cfg.impls, cfg.on_row = impls, Progress()
    cfg.timer = ops_timer(device, args.sample_time, warm=args.warm)
    reuse = None
    if args.reuse:
        from ...analysis import load

        try:
            reuse = load(*args.reuse)
        except (ValueError, FileNotFoundError) as err:
            raise UsageError(str(err).splitlines()[0]) from None
    paged = f", KV cache in pages of {cfg.page_size}" if cfg.page_size else ""
    print(f"phasebench phases: {model.name} on {device} ({cfg.dtype}{paged}) -> {out}", file=sys.stderr)
    tables = run_phases(cfg, reuse)
    from ...analysis.phases import phases_summary, write_phase_figures

    print(phases_summary(tables))
    figures = write_phase_figures(tables, out)
    print(f"\ntables: {out}/*.csv, phases.json; rows: {out}/ops; figures: {', '.join(p.name for p in figures)}")
    return 0


def cmd_report(args) -> int:
    from ...analysis import load, load_phases, report_rows, write_report
    from ...analysis.report import summary_table

    sources = args.results or sorted(p for p in Path("results").glob("*") if p.is_dir())
    if not sources:
        raise UsageError("results: none given and no ./results/ folders; run `phasebench run` first")
    try:
        df = load(*sources)
        # a `phasebench phases` folder: its rows (under ops/) load as above, its tables make the Phases section
        phase_dirs = [Path(p) for p in sources if (Path(p) / "phases.json").is_file()]
        phases = load_phases(phase_dirs[-1]) if phase_dirs else None
    except (ValueError, FileNotFoundError) as err:
        raise UsageError(str(err).splitlines()[0]) from None
    comparison = None
    runs = [p for p in (args.results or []) if not (Path(p) / "phases.json").is_file()]
    if len(runs) == 2:  # two result sets: the report compares them as `phasebench compare` does
        from ...analysis.compare import compare

        try:
            comparison = compare(runs[0], runs[1])
        except ValueError as err:
            print(f"phasebench report: no comparison: {str(err).splitlines()[0]}", file=sys.stderr)
    out = Path(args.out)
    check_writable(out)
    paths = write_report(df, out, include_profiled=args.include_profiled, phases=phases, comparison=comparison)
    shown = report_rows(df, include_profiled=args.include_profiled)
    print(summary_table(shown).to_string())
    left_out = f" ({len(df) - len(shown)} profiled rows left out)" if len(shown) < len(df) else ""
    if phase_dirs:
        others = f"; {len(phase_dirs) - 1} other phases folder(s) not shown" if len(phase_dirs) > 1 else ""
        print(f"\nphases: {phase_dirs[-1]}{others}")
    print(f"\n{len(shown)} rows from {shown['run_id'].nunique()} run(s){left_out}; report: {paths['html']}")
    return 0


def cmd_compare(args) -> int:
    from ...analysis import load
    from ...analysis.compare import compare, parse_threshold, regression_line, regressions
    from ...analysis.compare_output import format_comparison

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
