"""The roof of a linear layer x [M, K] · w [N, K] as a function of M: its intensity, its floor of the bytes it reads
and writes at the measured ceilings (bench.spec.roof), the M where it turns compute-bound, the weight floor."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ...bench.spec.roof import row_roof
from .kit import floats

# Only used where a row's bytes cannot give its element size.
_ELEMENT_BYTES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}


def linear_intensity(m, n, k, elem):
    """FLOP per byte of the minimum traffic: 2·M·N·K / (elem·(M·K + N·K + M·N))."""
    m, n, k, elem = (np.asarray(v, dtype=float) for v in (m, n, k, elem))
    return 2 * m * n * k / (elem * (m * k + n * k + m * n))


def linear_roof(m, n, k, elem, ceilings: dict) -> tuple:
    """row_roof (bench.spec.roof) of x [M, K] · w [N, K] at each M: it reads elem·(M·K + N·K) and writes elem·M·N.
    `ceilings`: tflops, read, write, copy (GB/s); without read and write (files before schema 5), the copy roof."""
    m = np.asarray(m, dtype=float)
    read, written = elem * (m * k + n * k), elem * m * n
    return row_roof(2 * m * n * k, read, written, read + written, ceilings["tflops"], ceilings["read"],
                    ceilings["write"], ceilings["copy"])


def crossing_m(n, k, elem, ceilings: dict) -> float:
    """The M from which x [M, K] · w [N, K] is compute-bound under the measured roof (its compute time reaches its
    memory floor); inf where it never is, NaN where the ceilings are unknown. Past it the floor grows slower than
    the FLOPs (the floor is concave in M, the FLOPs linear), so one bisection finds it."""
    def compute_bound(m) -> bool:
        return bool(linear_roof(m, n, k, elem, ceilings)[2] == "compute")

    low, high = 1e-6, 1e15
    far = linear_roof(high, n, k, elem, ceilings)[2]
    if far == "":
        return np.nan
    if far != "compute":
        return np.inf
    for _ in range(200):  # in log space: 21 decades to a relative 1e-12 and beyond
        middle = np.sqrt(low * high)
        low, high = (low, middle) if compute_bound(middle) else (middle, high)
    return float(high)


def weight_floor_ms(n, k, elem, gbps):
    """Milliseconds to read the weights once (elem·N·K bytes) at `gbps`."""
    return np.asarray(elem, dtype=float) * n * k / (np.asarray(gbps, dtype=float) * 1e6)


def element_bytes(rows: pd.DataFrame) -> np.ndarray:
    """Bytes per element of each linear row, from its bytes and shape (the dtype's size where bytes is missing)."""
    m, n, k = floats(rows["m"]), floats(rows["n"]), floats(rows["k"])
    from_bytes = floats(rows["bytes"]) / (m * k + n * k + m * n)
    by_dtype = rows["dtype"].map(_ELEMENT_BYTES).to_numpy(dtype=float, na_value=np.nan)
    return np.where(np.isfinite(from_bytes) & (from_bytes > 0), from_bytes, by_dtype)
