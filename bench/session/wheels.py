"""The wheels a machine without a package index needs: phasebench from this checkout, plus what its image lacks."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from ..sweep.metadata import checkout_commit

# runtime dependencies the lent H200 image lacks (its package list read 2026-11-17: torch 2.11, triton 3.6.0,
# pandas, pyarrow, matplotlib, pytest, pytest-benchmark, pytest-xdist are there; nvtx, for ncu's and nsys's
# NVTX ranges, is not)
TARGET_MISSING = ("nvtx",)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")


def checkout_root() -> Path:
    """The source checkout this phasebench runs from (an editable install); a one-line error otherwise."""
    root = Path(__file__).resolve().parents[2]
    if not (root / "pyproject.toml").is_file():
        raise ValueError(f"wheels: {root} is not a phasebench checkout (pyproject.toml missing); run from a clone")
    return root


def pinned(names) -> list[str]:
    """Each package at the version installed here (the one the tests ran with), unpinned where absent."""
    out = []
    for name in names:
        if "=" in name or "<" in name or ">" in name:
            out.append(name)
            continue
        try:
            out.append(f"{name}=={version(name)}")
        except PackageNotFoundError:
            out.append(name)
    return out


def build_command(root: Path, out: Path, isolated: bool = False) -> list[str]:
    """pip wheel of the checkout: with the build backend installed here (no index asked for setuptools), or
    `isolated` in pip's own build environment, which fetches the backend pyproject.toml asks for."""
    return [sys.executable, "-m", "pip", "wheel", "--no-deps", *([] if isolated else ["--no-build-isolation"]),
            "--wheel-dir", str(out), str(root)]


def download_command(packages, out: Path, python_version: str) -> list[str]:
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    return [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version",
            python_version, "--implementation", "cp", *platforms, "--dest", str(out), *packages]


def commit_of(root: Path) -> str:
    """HEAD of the checkout, '-dirty' when it has uncommitted changes to tracked files; 'unknown' without one."""
    return checkout_commit(root) or "unknown"


def _pip(command: list[str]) -> str | None:
    """Run pip; None when it succeeded, else its last line of output."""
    proc = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=900)
    if proc.returncode == 0:
        return None
    lines = [line for line in (proc.stderr + proc.stdout).splitlines() if line.strip()]
    return lines[-1] if lines else f"exit status {proc.returncode}"


def build_wheel(root: Path, out: Path) -> str:
    """phasebench's wheel into `out`: with the backend installed here, else (an old setuptools, no `wheel`) in an
    isolated build; returns which build made it. RuntimeError with both pips' last lines when neither can."""
    here = _pip(build_command(root, out))
    if here is None:
        return "without build isolation (the setuptools installed here)"
    isolated = _pip(build_command(root, out, isolated=True))
    if isolated is None:
        return f"in an isolated build (the one here failed: {here})"
    raise RuntimeError(f"wheels: pip wheel failed here ({here}) and in an isolated build ({isolated})")


def make_wheels(out: Path, packages=TARGET_MISSING, python_version: str = "3.12",
                download: bool = True) -> tuple[list[Path], str]:
    """Build phasebench's wheel into `out`, download the other packages' wheels for that Python (x86-64 Linux),
    and write `out/COMMIT`; returns the wheels there and how phasebench's was built. A failing pip raises
    RuntimeError with its last line."""
    root = checkout_root()
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("phasebench-*.whl"):
        old.unlink()  # one version of each: two stop the install there
    how = build_wheel(root, out)
    if download and packages:
        failed = _pip(download_command(pinned(packages), out, python_version))
        if failed is not None:
            raise RuntimeError(f"wheels: pip download failed: {failed}")
    (out / "COMMIT").write_text(commit_of(root) + "\n")
    return sorted(out.glob("*.whl")), how
