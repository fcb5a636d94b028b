"""The program Nsight Compute profiles: one case and impl, compiled and autotuned first, then a few calls between
cudaProfilerStart and Stop, which is all `ncu --profile-from-start off` records."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

from ..sweep.selection import Selection, UsageError, build_cases, load_plugins, resolve_device


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m phasebench.bench.session.ncu_target", description=__doc__)
    parser.add_argument("--shape", required=True, help="the case, as phasebench run --shape")
    parser.add_argument("--model", nargs="+", help="model preset (or name=...) for the shape's heads")
    parser.add_argument("--impl", required=True)
    parser.add_argument("--device")
    parser.add_argument("--dtype")
    parser.add_argument("--calls", type=int, default=2, help="calls inside the profiled range (default 2)")
    parser.add_argument("--plugin", action="append", metavar="MODULE", help="import MODULE first (its kernels)")
    parser.add_argument("--json", help="write the case, its cost and the backend here")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        load_plugins(args.plugin)
        device = resolve_device(args.device)
        (case,), _ = build_cases(Selection(suite="custom", model=args.model, shape=(args.shape,), dtype=args.dtype),
                                 device)
    except (UsageError, ValueError) as err:
        print(f"ncu_target: error: {err}", file=sys.stderr)
        return 2
    from ...profiles.capture import cuda_profiler_range
    from ..instruments.roofline import on_device
    from ..sweep.measure import CaseState, gate, judged_call, poison_inputs, sync

    with on_device(device):
        state = CaseState(case, device)
        op = state.op
        call = op.prepare(case, state.inputs, args.impl)
        verdict = gate(state, call, args.impl)  # the first call compiles and autotunes; what is profiled is correct
        if not verdict.ok:
            print(f"ncu_target: error: {args.impl} is incorrect on this case: {verdict.reason}", file=sys.stderr)
            return 1
        call.run()
        # what an in-place op writes poisoned (the profiled calls must write it again), NaN where no call may read
        poison_inputs(state, state.inputs)
        sync(device)
        with cuda_profiler_range() if device.type == "cuda" else contextlib.nullcontext():
            for _ in range(args.calls):
                call.run()
            sync(device)
        # and one more call after them, outside the range, its allocations poisoned: its output cannot be a profiled
        # call's right answer left in a free block
        last = judged_call(state, state.standard, call.run)
        if not last.ok:
            print(f"ncu_target: error: {args.impl}'s call after the profiled ones is incorrect: {last.reason}",
                  file=sys.stderr)
            return 1
    info = {"case": case.row_fields(), "impl": args.impl, "backend": call.backend, "key": op.key(case, args.impl),
            "max_rel_err": verdict.error,
            "flops": op.flops(case), "bytes": op.min_bytes(case), "calls": args.calls, "device": str(device)}
    print(json.dumps(info))
    if args.json:
        Path(args.json).write_text(json.dumps(info, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
