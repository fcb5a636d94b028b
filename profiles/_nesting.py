"""Vectorised lookup of the innermost range enclosing a time point on the same thread."""

from __future__ import annotations

import numpy as np
import pandas as pd

OPEN_END = np.iinfo(np.int64).max  # end of a range still open when the capture stopped


class Nesting:
    """Properly nested ranges [start, end) grouped by thread; find the innermost one around a time.

    A range's depth is the number of ranges open on its thread just after it starts. At time t the
    innermost enclosing range is the last range starting at or before t whose depth equals the
    number of ranges open at t; everything is a searchsorted over sorted integer keys.
    """

    def __init__(self, group, start, end, names=None):
        start = np.asarray(start, dtype=np.int64)
        end = np.asarray(end, dtype=np.int64)
        keep = end > start  # zero-length ranges enclose nothing
        self._orig = np.flatnonzero(keep)
        self.names = None if names is None else np.asarray(names, dtype=object)
        self._groups = pd.Index(pd.unique(np.asarray(group)[keep]))
        g = self._groups.get_indexer(np.asarray(group)[keep]).astype(np.int64)
        s, e = start[keep], end[keep]
        self._times = np.unique(np.concatenate([s, e]))
        self._m = np.int64(len(self._times) + 1)
        rs = np.searchsorted(self._times, s).astype(np.int64)
        re_ = np.searchsorted(self._times, e).astype(np.int64)
        self._g, self._s, self._e = g, s, e
        self._open_keys = np.sort(g * self._m + rs)
        self._close_keys = np.sort(g * self._m + re_)
        # depth: ranges opened up to this one (outer first on equal starts) minus those closed by its start
        order = np.lexsort((-e, s, g))
        opened = np.empty(len(s), dtype=np.int64)
        first = np.searchsorted(g[order], g[order], side="left")
        opened[order] = np.arange(len(s)) - first + 1
        self._depth = opened - self._closed(g, rs)
        self._dmax = np.int64(self._depth.max() + 2) if len(s) else np.int64(2)
        key = (g * self._dmax + self._depth) * self._m + rs
        self._by_depth = np.argsort(key, kind="stable")
        self._depth_keys = key[self._by_depth]
        has_parent = self._depth > 1
        self._parent = np.full(len(s), -1, dtype=np.int64)
        if has_parent.any():
            cand = self._last_at_depth(g[has_parent], self._depth[has_parent] - 1, rs[has_parent])
            ok = cand >= 0
            ok[ok] &= self._e[cand[ok]] >= e[has_parent][ok]
            self._parent[np.flatnonzero(has_parent)[ok]] = cand[ok]

    def _closed(self, g, rank):
        lo = np.searchsorted(self._close_keys, g * self._m, side="left")
        return np.searchsorted(self._close_keys, g * self._m + rank, side="right") - lo

    def _opened(self, g, rank):
        lo = np.searchsorted(self._open_keys, g * self._m, side="left")
        return np.searchsorted(self._open_keys, g * self._m + rank, side="right") - lo

    def _last_at_depth(self, g, depth, rank):
        """Local index of the last range of (group, depth) starting at time rank <= `rank`, else -1."""
        prefix = g * self._dmax + depth
        pos = np.searchsorted(self._depth_keys, prefix * self._m + rank, side="right") - 1
        safe = np.clip(pos, 0, None)
        ok = (pos >= 0) & (self._depth_keys[safe] // self._m == prefix)
        return np.where(ok, self._by_depth[safe], -1)

    def innermost(self, group, t):
        """Index (into the ranges given) of the innermost range enclosing t on `group`, -1 for none."""
        t = np.asarray(t, dtype=np.int64)
        out = np.full(len(t), -1, dtype=np.int64)
        if not len(self._s) or not len(t):
            return out
        g = self._groups.get_indexer(np.asarray(group)).astype(np.int64)
        known = g >= 0
        g, tq = g[known], t[known]
        rank = np.searchsorted(self._times, tq, side="right") - 1  # times <= t have rank <= this
        depth = self._opened(g, rank) - self._closed(g, rank)
        cand = np.where(depth > 0, self._last_at_depth(g, depth, rank), -1)
        safe = np.clip(cand, 0, None)
        ok = (cand >= 0) & (self._s[safe] <= tq) & (tq < self._e[safe])
        out[np.flatnonzero(known)] = np.where(ok, self._orig[safe], -1)
        return out

    def paths(self, idx):
        """For each index from innermost(): the tuple of enclosing range names, outermost first."""
        local = np.full(len(idx), -1, dtype=np.int64)
        idx = np.asarray(idx, dtype=np.int64)
        hit = idx >= 0
        local[hit] = np.searchsorted(self._orig, idx[hit])
        levels = []
        while (local >= 0).any():
            safe = np.clip(local, 0, None)
            levels.append(np.where(local >= 0, self.names[self._orig[safe]], None))
            local = np.where(local >= 0, self._parent[safe], -1)
        if not levels:
            return [()] * len(idx)
        return [tuple(n for n in reversed(row) if n is not None) for row in zip(*levels, strict=True)]
