"""The verbs that read results: `report` (the page) and `compare` (two result sets), each with its parser."""

from __future__ import annotations

import sys
from pathlib import Path

from ..sweep.selection import UsageError
from .options import check_writable


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


def add_report_verb(verbs) -> None:
    """The `report` verb and its options."""
    report = verbs.add_parser("report", help="roofline and phase figures (PNG) and an HTML page from results")
    report.add_argument("results", nargs="*", help="run folders, results files, pytest-benchmark JSON, "
                                                   "`phasebench phases` and `phasebench interference` folders, in "
                                                   "any mix "
                                                   "(default: every folder under ./results/)")
    report.add_argument("--out", default="report", help="folder for the PNGs and report.html (default: ./report)")
    report.add_argument("--include-profiled", action="store_true",
                        help="keep rows measured under a profiler (`phasebench profile`); left out by default")
    report.add_argument("--compare", action="store_true",
                        help="compare the two result sets given even when they share no measurement (by default "
                             "two result sets get a comparison section only when they share one)")
    report.set_defaults(func=cmd_report)


def add_compare_verb(verbs) -> None:
    """The `compare` verb and its options."""
    comp = verbs.add_parser("compare", help="pair the same measurements of two result sets: ratio of medians with "
                                            "a confidence interval, faster / slower / within threshold / unresolved")
    comp.add_argument("base", help="base results: a run folder, results file or pytest-benchmark JSON")
    comp.add_argument("new", nargs="?", help="new results (with --by impl, default: BASE again)")
    comp.add_argument("--by", choices=("run", "impl", "device", "timer"), default="run",
                      help="what differs between the sides (default run: the same cases measured twice)")
    comp.add_argument("--base-impl", metavar="I", help="with --by impl: the base implementation")
    comp.add_argument("--new-impl", metavar="J", help="with --by impl: the implementation compared against it")
    comp.add_argument("--threshold", default="5%", help="smallest change called faster or slower (default 5%%)")
    comp.add_argument("--confidence", type=float, default=0.95, help="of the intervals (default 0.95)")
    comp.add_argument("--fail-on-regression", action="store_true",
                      help="exit 1 when a pair is slower beyond the threshold with confidence, a row that was ok is "
                           "not (incorrect, failed, skipped), or an ok row of BASE is missing from NEW (for CI)")
    comp.add_argument("--allow-missing", action="store_true",
                      help="with --fail-on-regression: rows missing from NEW do not fail it")
    comp.add_argument("--out", help="folder for comparison.csv, comparison.png and a report.html")
    comp.set_defaults(func=cmd_compare)
