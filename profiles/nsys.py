"""Read CUDA kernels and NVTX ranges from an Nsight Systems SQLite export into pandas."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd

from ._nesting import OPEN_END, Nesting

KERNEL_TABLE = "CUPTI_ACTIVITY_KIND_KERNEL"
RUNTIME_TABLE = "CUPTI_ACTIVITY_KIND_RUNTIME"  # holds driver API calls (cuLaunchKernel) as well
NVTX_TABLE = "NVTX_EVENTS"
META_TABLES = ("META_DATA_EXPORT", "EXPORT_META_DATA")  # renamed between nsys versions
# eventType ids to use when the export has no ENUM_NSYS_EVENT_TYPE table
DEFAULT_EVENT_TYPES = {"NvtxPushPopRange": 59, "NvtxStartEndRange": 60, "NvtxDomainCreate": 75}

KERNEL_COLUMNS = [
    "name", "demangled_name", "start_ns", "end_ns", "duration_ns", "device_id", "stream_id",
    "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "registers_per_thread",
    "static_shared_bytes", "dynamic_shared_bytes", "shared_bytes", "correlation_id", "pid", "tid",
    "nvtx_range", "nvtx_path",
]
NVTX_COLUMNS = ["name", "start_ns", "end_ns", "duration_ns", "pid", "tid", "domain", "kind"]

# output column <- export column, for the plain integer fields of the kernel table
_KERNEL_INTS = {
    "device_id": "deviceId", "stream_id": "streamId", "grid_x": "gridX", "grid_y": "gridY",
    "grid_z": "gridZ", "block_x": "blockX", "block_y": "blockY", "block_z": "blockZ",
    "registers_per_thread": "registersPerThread", "static_shared_bytes": "staticSharedMemory",
    "dynamic_shared_bytes": "dynamicSharedMemory", "correlation_id": "correlationId",
}
_MISSING = -1  # stands for NULL in id columns, so they stay int64 (globalTid does not fit a float)


def _pid(gid):
    """Process id inside a serialized globalTid/globalPid (nsys packs it into bits 24..47)."""
    return (gid >> 24) & 0xFFFFFF


def _ints(values) -> pd.arrays.IntegerArray:
    return pd.array(pd.to_numeric(pd.Series(values), errors="coerce"), dtype="Int64")


class _Export:
    """An open export, with its tables and columns looked up instead of assumed."""

    def __init__(self, path):
        self.path = Path(path)
        self.conn = None
        if not self.path.is_file():
            self.fail("no such file")
        try:
            self.conn = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True)
            rows = self.conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')").fetchall()
            self.tables = {name: [c[1] for c in self.conn.execute(f'PRAGMA table_info("{name}")')]
                           for (name,) in rows}
        except sqlite3.DatabaseError as exc:
            self.fail(f"not a readable SQLite database ({' '.join(str(exc).split())})")
        markers = (*META_TABLES, KERNEL_TABLE, NVTX_TABLE, "StringIds")
        if not any(t in self.tables for t in markers):
            self.fail("not an Nsight Systems export (it has none of " + ", ".join(markers) + ")")
        self._strings = None

    def fail(self, what):
        if getattr(self, "conn", None) is not None:
            self.conn.close()
        raise ValueError(f"{self.path}: {what}")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.conn.close()

    def has(self, table, *columns):
        return table in self.tables and all(c in self.tables[table] for c in columns)

    def select(self, table, fields, where=""):
        """fields: alias -> (column, default); a column this export lacks reads as its default."""
        cols = self.tables.get(table, [])
        parts = []
        for alias, (col, default) in fields.items():
            value = "NULL" if default is None else repr(default)
            expr = f'COALESCE("{col}", {value})' if col in cols else value
            parts.append(f"{expr} AS {alias}")
        sql = f"SELECT {', '.join(parts)} FROM \"{table}\" {where}"
        try:
            return pd.read_sql_query(sql, self.conn)
        except (sqlite3.DatabaseError, pd.errors.DatabaseError) as exc:
            self.fail(f"cannot read {table} ({' '.join(str(exc).split())})")

    def resolve(self, values) -> pd.Series:
        """Name columns hold StringIds ids in current exports; text already there is kept."""
        if self._strings is None:
            self._strings = {}
            if self.has("StringIds", "id", "value"):
                df = self.select("StringIds", {"id": ("id", None), "value": ("value", None)})
                self._strings = dict(zip(df["id"].tolist(), df["value"].tolist(), strict=True))
        get = self._strings.get
        return pd.Series([v if isinstance(v, str) else get(v) for v in pd.Series(values).tolist()], dtype=object)

    def event_types(self):
        types = dict(DEFAULT_EVENT_TYPES)
        if self.has("ENUM_NSYS_EVENT_TYPE", "id", "name"):
            df = self.select("ENUM_NSYS_EVENT_TYPE", {"id": ("id", None), "name": ("name", None)})
            found = dict(zip(df["name"], df["id"], strict=True))
            types.update({k: int(found[k]) for k in types if k in found})
        return types

    def attrs(self):
        meta = {}
        for table in META_TABLES:
            if self.has(table, "name", "value"):
                df = self.select(table, {"name": ("name", None), "value": ("value", None)})
                meta = dict(zip(df["name"], df["value"], strict=True))
                break
        out = {"source": "nsys", "product_version": meta.get("EXPORT_PRODUCT_VERSION"),
               "schema_version": meta.get("EXPORT_SCHEMA_VERSION")}
        if self.has("TARGET_INFO_GPU", "id", "name"):
            gpus = self.select("TARGET_INFO_GPU", {"id": ("id", None), "name": ("name", None)})
            out["gpus"] = {int(i): str(n) for i, n in zip(gpus["id"], gpus["name"], strict=True)}
        return out

    def nvtx(self) -> pd.DataFrame:
        """Push/pop and start/end ranges: start, end (OPEN_END if never closed), gtid, name, domain, kind."""
        empty = pd.DataFrame({"start": [], "end": [], "gtid": [], "name": [], "domain": [], "kind": []})
        if not self.has(NVTX_TABLE, "start", "eventType"):
            return empty.astype({"start": np.int64, "end": np.int64, "gtid": np.int64})
        types = self.event_types()
        kinds = {types["NvtxPushPopRange"]: "push_pop", types["NvtxStartEndRange"]: "start_end"}
        create = types["NvtxDomainCreate"]
        df = self.select(NVTX_TABLE, {
            "start": ("start", None), "end": ("end", int(OPEN_END)), "type": ("eventType", None),
            "gtid": ("globalTid", _MISSING), "text": ("text", None), "text_id": ("textId", _MISSING),
            "domain_id": ("domainId", 0),
        }, where=f"WHERE eventType IN ({', '.join(str(int(t)) for t in (*kinds, create))})")
        text = df["text"].astype(object)
        df["name"] = text.where(text.notna(), self.resolve(df["text_id"])).astype(object)
        proc = np.where(df["gtid"] >= 0, df["gtid"].to_numpy(np.int64) >> 24, _MISSING)
        # a domain's name is the text of its NvtxDomainCreate event in the same process
        made = (df["type"] == create).to_numpy()
        domains = dict(zip(zip(proc[made], df["domain_id"][made], strict=True), df["name"][made], strict=True))
        df = df[~made].assign(proc=proc[~made])
        df["domain"] = pd.Series([domains.get(k) for k in zip(df["proc"], df["domain_id"], strict=True)],
                                 index=df.index, dtype=object)
        df["kind"] = df["type"].map(kinds)
        df = df[["start", "end", "gtid", "name", "domain", "kind"]].reset_index(drop=True)
        return df.astype({"start": np.int64, "end": np.int64, "gtid": np.int64})


def read_nvtx(path) -> pd.DataFrame:
    """NVTX push/pop and start/end ranges of an export, one row per closed range, sorted by start.

    Columns: name, start_ns, end_ns, duration_ns, pid, tid (of the thread that opened the range),
    domain (None for the default domain), kind ("push_pop" or "start_end").
    """
    with _Export(path) as exp:
        raw = exp.nvtx()
        attrs = exp.attrs()
    raw = raw[raw["end"] != OPEN_END].sort_values(["start", "end"], ascending=[True, False], kind="stable")
    gtid = raw["gtid"].to_numpy(np.int64)
    known = gtid >= 0
    df = pd.DataFrame({
        "name": raw["name"].to_numpy(object),
        "start_ns": raw["start"].to_numpy(np.int64),
        "end_ns": raw["end"].to_numpy(np.int64),
        "duration_ns": (raw["end"] - raw["start"]).to_numpy(np.int64),
        "pid": pd.array(np.where(known, _pid(gtid), 0), dtype="Int64"),
        "tid": pd.array(np.where(known, gtid & 0xFFFFFF, 0), dtype="Int64"),
        "domain": raw["domain"].to_numpy(object),
        "kind": raw["kind"].to_numpy(object),
    }, columns=NVTX_COLUMNS)
    df.loc[~known, ["pid", "tid"]] = pd.NA
    df.attrs.update(attrs)
    return df


def _launches(exp, corr, proc):
    """Launching thread (globalTid) and launch-call start of each kernel from the runtime table, -1 if none."""
    gtid, call = np.full(len(corr), _MISSING, np.int64), np.full(len(corr), _MISSING, np.int64)
    if not len(corr) or not exp.has(RUNTIME_TABLE, "correlationId", "globalTid", "start"):
        return gtid, call
    rt = exp.select(RUNTIME_TABLE, {"corr": ("correlationId", _MISSING), "gtid": ("globalTid", _MISSING),
                                    "start": ("start", None)},
                    where=f"WHERE correlationId IN (SELECT correlationId FROM {KERNEL_TABLE})")
    rt = rt[(rt["gtid"] >= 0) & rt["start"].notna()].astype(np.int64)
    rt["proc"] = rt["gtid"].to_numpy() >> 24  # pid plus the host/VM bits above it
    # correlation ids restart in each process; a repeat inside one process keeps its first call
    rt = rt.sort_values(["corr", "proc", "start", "gtid"], kind="stable")
    kernels = pd.DataFrame({"corr": corr, "proc": proc, "row": np.arange(len(corr))})
    # a kernel whose process is not recorded matches only a correlation id seen in a single process
    single = rt.groupby("corr")["proc"].transform("nunique") == 1
    passes = ((["corr", "proc"], kernels["proc"] >= 0, rt), (["corr"], kernels["proc"] < 0, rt[single]))
    for keys, rows, calls in passes:
        table = calls.drop_duplicates(keys)[[*keys, "gtid", "start"]]
        hit = kernels[rows & (kernels["corr"] >= 0)].merge(table, on=keys, how="inner")
        gtid[hit["row"].to_numpy()] = hit["gtid"].to_numpy()
        call[hit["row"].to_numpy()] = hit["start"].to_numpy()
    return gtid, call


def read_kernels(path) -> pd.DataFrame:
    """CUDA kernels of an export, one row per launch, sorted by start (columns: KERNEL_COLUMNS).

    pid/tid are those of the launching thread; nvtx_range is the innermost NVTX push/pop range open
    on that thread when the launch call started (None where unknown); nvtx_path holds every range
    open there, outermost first.
    """
    with _Export(path) as exp:
        return _read_kernels(exp)


def _read_kernels(exp) -> pd.DataFrame:
    if not exp.has(KERNEL_TABLE, "start", "end"):
        exp.fail(f"no {KERNEL_TABLE} table with start and end (were CUDA kernels traced?)")
    cols = exp.tables[KERNEL_TABLE]
    short = next((c for c in ("shortName", "name", "demangledName", "mangledName") if c in cols), None)
    full = next((c for c in ("demangledName", "mangledName", "name", "shortName") if c in cols), None)
    fields = {"start": ("start", None), "end": ("end", None), "gpid": ("globalPid", _MISSING),
              "short": (short, None), "full": (full, None)}
    fields.update({out: (src, None) for out, src in _KERNEL_INTS.items()})
    raw = exp.select(KERNEL_TABLE, fields, where='WHERE start IS NOT NULL AND "end" IS NOT NULL')
    start, end = raw["start"].to_numpy(np.int64), raw["end"].to_numpy(np.int64)
    df = pd.DataFrame({"name": exp.resolve(raw["short"]), "demangled_name": exp.resolve(raw["full"]),
                       "start_ns": start, "end_ns": end, "duration_ns": end - start})
    for out in _KERNEL_INTS:
        df[out] = _ints(raw[out])
    df["shared_bytes"] = df["static_shared_bytes"] + df["dynamic_shared_bytes"]
    gpid = raw["gpid"].to_numpy(np.int64)
    corr = df["correlation_id"].fillna(_MISSING).to_numpy(np.int64)
    gtid, call = _launches(exp, corr, np.where(gpid >= 0, gpid >> 24, _MISSING))
    known = gtid >= 0
    pid = np.where(known, _pid(gtid), np.where(gpid >= 0, _pid(gpid), _MISSING))
    df["pid"] = pd.array(pid, dtype="Int64")
    df["tid"] = pd.array(gtid & 0xFFFFFF, dtype="Int64")
    df.loc[pid < 0, "pid"] = pd.NA
    df.loc[~known, "tid"] = pd.NA
    ranges = exp.nvtx()
    ranges = ranges[ranges["kind"] == "push_pop"]
    names = ranges["name"].to_numpy(object)
    nest = Nesting(ranges["gtid"].to_numpy(), ranges["start"].to_numpy(), ranges["end"].to_numpy(), names)
    idx = np.full(len(df), -1, np.int64)
    idx[known] = nest.innermost(gtid[known], call[known])
    df["nvtx_range"] = pd.Series([names[i] if i >= 0 else None for i in idx], dtype=object)
    df["nvtx_path"] = pd.Series(nest.paths(idx), dtype=object)
    df = df.sort_values(["start_ns", "device_id", "stream_id", "correlation_id"], kind="stable")
    df = df.reset_index(drop=True)[KERNEL_COLUMNS]
    df.attrs.update(exp.attrs())
    return df
