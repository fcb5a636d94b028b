"""The `phasebench` command line: one verb per job, each importing its module only when it runs."""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import PackageNotFoundError, version


def package_version() -> str:
    try:
        return version("phasebench")
    except PackageNotFoundError:
        return "unknown"


def cmd_list(args) -> int:
    import torch

    from ..kernels import describe_impls

    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for device in devices:
        print(f"implementations on {device}:")
        for row in describe_impls(device):
            where = row["backend"] if row["available"] else f"unavailable: {row['reason']}"
            print(f"  {row['impl']:<15} {where}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="phasebench", description=__doc__)
    parser.add_argument("--version", action="version", version=f"phasebench {package_version()}")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")
    listing = verbs.add_parser("list", help="implementations available here and their concrete backends")
    listing.set_defaults(func=cmd_list)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.verb is None:
        parser.print_help()
        return 2
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
