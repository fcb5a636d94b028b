"""Sweeps split by case into shards (`run --shard K/N`), the sweep each shard folder belongs to, and their merge."""

from __future__ import annotations

import csv
import datetime as dt
import hashlib
import io
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd

from ...spec.store.files import note, read_whole, replaced, write_file
from ...spec.store.folder_lock import holding
from ..results import COLUMNS, KEY_COLUMNS, SAMPLES, read_results_csv, read_samples, sample_key

SHARD_JSON = "shard.json"
SHARD_COLUMN = "shard"
# Two rows of one (case, impl): the measurement key without where and how it was timed (shards may differ there).
PAIR_COLUMNS = tuple(c for c in KEY_COLUMNS if c not in ("device", "mode", "timer"))


class ShardError(ValueError):
    """A bad shard spec, a shard folder of another sweep, or shards that do not merge (one line)."""


def parse_shard(text: str) -> tuple[int, int]:
    """"K/N" (1-based: shards 1/N .. N/N) as (K, N)."""
    k, sep, n = str(text).partition("/")
    try:
        k, n = int(k), int(n)
    except ValueError:
        k = n = 0
    if not sep or not 1 <= k <= n:
        raise ShardError(f"shard: expected K/N with 1 <= K <= N (1-based, e.g. 1/4), got {text!r}")
    return k, n


def _rows(case, impls) -> int:
    from ..runner import impls_for

    return len(impls_for(case, impls)) if impls is not None else 1


def _size(case) -> float:
    from ...ops import operator_of

    op = operator_of(case)
    return float(op.flops(case)) + float(op.min_bytes(case))


def assign(cases, n: int, impls=None) -> list[int]:
    """The shard (1..n) of each case: every impl of a case in one shard, shards balanced by rows.

    Each row costs about one timer budget, so rows are the cost; cases are dealt largest first
    (rows, then flops + bytes, then sweep order) to the shard with the fewest rows so far, lowest
    shard first. That is round-robin over the size order when every case has as many impls, and it
    depends only on the case list and impls, which the sweep id fixes."""
    if n < 1:
        raise ShardError(f"shard: the number of shards must be at least 1, got {n}")
    unique = list(dict.fromkeys(cases))  # a case named twice is measured once, so it goes to one shard
    weights = [_rows(c, impls) for c in unique]
    order = sorted(range(len(unique)), key=lambda i: (-weights[i], -_size(unique[i]), i))
    load, shard_of = [0] * n, {}
    for i in order:
        s = min(range(n), key=lambda j: (load[j], j))
        shard_of[unique[i]] = s + 1
        load[s] += weights[i]
    return [shard_of[c] for c in cases]


def shard_cases(cases, k: int, n: int, impls=None) -> list:
    """The cases of shard k of n (1-based), in the sweep's order."""
    if not 1 <= k <= n:
        raise ShardError(f"shard: expected 1 <= K <= N, got {k}/{n}")
    return [c for c, s in zip(cases, assign(cases, n, impls), strict=True) if s == k]


def sweep_options(options: dict) -> dict:
    """The measurement options every shard must share: all but the device (a fleet mixes cards)."""
    return {k: v for k, v in options.items() if k != "device"}


def sweep_id(cases, impls, options: dict) -> str:
    """A hash of the full case list, the impls and the measurement options (without the device)."""
    names = {op: list(v) for op, v in sorted(impls.items())} if isinstance(impls, dict) else list(impls)
    text = json.dumps({"cases": [repr(c) for c in cases], "impls": names, "options": sweep_options(options)},
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class ShardInfo:
    """What shard.json records of a shard folder: its sweep, its place in it and its planned rows."""

    sweep_id: str
    shard: int
    of: int
    cases: int
    rows: int
    sweep_cases: int
    sweep_rows: int
    suite: str
    impls: list | dict
    options: dict
    command: str = ""

    @property
    def label(self) -> str:
        return f"{self.shard}/{self.of}"


def plan_shard(cases, impls, k: int, n: int, options: dict, suite: str, command: str = "") -> tuple[list, ShardInfo]:
    """Shard k of n of a sweep: its cases and its ShardInfo."""
    mine = shard_cases(cases, k, n, impls)
    if not mine:
        raise ShardError(f"shard: {k}/{n} holds no cases (the sweep has {len(cases)}); use fewer shards")
    names = {op: list(v) for op, v in impls.items()} if isinstance(impls, dict) else list(impls)
    info = ShardInfo(sweep_id(cases, impls, options), k, n, len(mine), sum(_rows(c, impls) for c in mine),
                     len(cases), sum(_rows(c, impls) for c in cases), suite, names, sweep_options(options), command)
    return mine, info


def shard_folder(root: Path, k: int, n: int) -> Path:
    return Path(root) / f"shard-{k}-of-{n}"


def read_shard(folder: Path) -> ShardInfo | None:
    """The folder's shard.json; None where there is none, or it does not read as a shard's."""
    try:
        info = ShardInfo(**json.loads((Path(folder) / SHARD_JSON).read_text()))
    except (OSError, ValueError, TypeError):
        return None
    counts = (info.shard, info.of, info.cases, info.rows, info.sweep_cases, info.sweep_rows)
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in counts) or not 1 <= info.shard <= info.of:
        return None
    return info if isinstance(info.sweep_id, str) else None


def _write_json(path: Path, data: dict) -> None:
    write_file(path, json.dumps(data, indent=1, default=str))


def mark_shard(folder: Path, info: ShardInfo, resume: bool) -> None:
    """Write shard.json before any row, so a killed shard still says which sweep it belongs to;
    a resume into a shard of another sweep, or another shard, is refused."""
    folder = Path(folder)
    before = read_shard(folder)
    if resume and before is not None and (before.sweep_id, before.label) != (info.sweep_id, info.label):
        raise ShardError(f"resume: {folder} holds shard {before.label} of sweep {before.sweep_id}, this run is shard "
                         f"{info.label} of sweep {info.sweep_id} (other cases, impls or options); use another --out")
    folder.mkdir(parents=True, exist_ok=True)
    _write_json(folder / SHARD_JSON, asdict(info))


def finish_shard(folder: Path, info: ShardInfo, worker: dict | None = None) -> None:
    """Add the sweep (and the Ray worker that measured it) to the run.json the runner wrote; the runner
    rewrites run.json whole while it runs, so this comes after it."""
    path = Path(folder) / "run.json"
    meta = json.loads(path.read_text())
    meta["sweep"] = {"id": info.sweep_id, "shard": info.shard, "of": info.of, "rows": info.rows,
                     "sweep_rows": info.sweep_rows, **({"worker": worker} if worker else {})}
    _write_json(path, meta)


def csv_rows(folder: Path) -> list[dict]:
    """The whole rows of a folder's results.csv as text (a row that a kill tore is left out, and said so)."""
    try:
        whole, torn = read_whole(Path(folder) / "results.csv")
    except FileNotFoundError:
        return []
    if torn:
        note(torn.line())
    return list(csv.DictReader(io.StringIO(whole.decode(), newline="")))


def shard_complete(folder: Path, sweep: str) -> bool:
    """The folder holds a finished shard of this sweep with every planned row."""
    info = read_shard(folder)
    try:
        meta = json.loads((Path(folder) / "run.json").read_text())
    except (OSError, ValueError):
        return False
    return (info is not None and info.sweep_id == sweep and bool(meta.get("finished"))
            and len(csv_rows(folder)) == info.rows)


# ---------------------------------------------------------------- merge


def _pair(row: dict) -> str:
    return " ".join(f"{c}={row.get(c, '')}" for c in PAIR_COLUMNS if row.get(c, "") != "")


def merge(folders, out: Path, partial: bool = False) -> dict:
    """Join the shard folders of one sweep into `out` (results.csv and .parquet with a `shard` column,
    samples.jsonl, one run.json whose "shards" keep each shard's run.json: device, ceilings, versions).

    Refused: a folder without shard.json, shards of different sweeps, a shard given twice, a (case, impl)
    in two shards, and (unless `partial`) a missing or unfinished shard. Returns the merged run.json."""
    out = Path(out)
    shards = []
    for folder in map(Path, folders):
        info = read_shard(folder)
        if info is None:
            raise ShardError(f"shards: {folder} is not a shard folder (no readable {SHARD_JSON}); run it with "
                             "--shard K/N")
        if out.resolve() == folder.resolve():
            raise ShardError(f"out: {out} is shard {info.label}'s own folder; choose another")
        shards.append((folder, info))
    if not shards:
        raise ShardError("shards: give at least one shard folder")
    first_dir, first = shards[0]
    seen: dict[int, Path] = {}
    for folder, info in shards:
        if (info.sweep_id, info.of) != (first.sweep_id, first.of):
            raise ShardError(f"shards: {folder} is shard {info.label} of sweep {info.sweep_id}, {first_dir} is shard "
                             f"{first.label} of sweep {first.sweep_id}; shards of different sweeps do not merge")
        if info.shard in seen:
            raise ShardError(f"shards: shard {info.label} given twice ({seen[info.shard]} and {folder})")
        seen[info.shard] = folder
    missing = [k for k in range(1, first.of + 1) if k not in seen]
    if missing and not partial:
        raise ShardError(f"shards: shard(s) {', '.join(f'{k}/{first.of}' for k in missing)} of sweep "
                         f"{first.sweep_id} missing; give every shard folder (or --partial)")
    shards.sort(key=lambda s: s[1].shard)
    metas, text_rows, samples, owner = [], [], {}, {}
    for folder, info in shards:
        try:
            meta = json.loads((folder / "run.json").read_text())
        except (OSError, ValueError):
            meta = {}
        meta = meta if isinstance(meta, dict) else {}
        try:
            rows = csv_rows(folder)
            samples.update(read_samples(folder / "samples.jsonl"))
        except (OSError, csv.Error, UnicodeDecodeError) as err:
            raise ShardError(f"shards: {folder}: its rows cannot be read ({type(err).__name__}: "
                             f"{' '.join(str(err).split())})") from None
        if not partial and (not meta.get("finished") or len(rows) != info.rows):
            hint = f": {info.command}" if info.command else f" with --shard {info.label} --resume --out {folder}"
            raise ShardError(f"shards: shard {info.label} in {folder} is unfinished ({len(rows)} of {info.rows} rows); "
                             f"resume it{hint}")
        for row in rows:
            pair = _pair(row)
            if pair in owner:
                raise ShardError(f"shards: ({pair}) is in shard {owner[pair]} and in shard {info.label} ({folder})")
            owner[pair] = info.label
            text_rows.append({**row, SHARD_COLUMN: info.shard})
        meta.pop("schema", None)
        metas.append({"shard": info.shard, "of": info.of, "dir": _relative(folder, out), "rows": len(rows), **meta})
    return _write_merged(out, first, metas, text_rows, samples, missing)


def _relative(folder: Path, out: Path) -> str:
    try:
        return os.path.relpath(folder.resolve(), out.resolve())
    except ValueError:  # another drive
        return str(folder.resolve())


def _write_merged(out: Path, info: ShardInfo, metas: list, text_rows: list, samples: dict, missing: list) -> dict:
    with holding(out):  # one writer per folder; each file renamed into place whole, run.json last
        return _write_files(out, info, metas, text_rows, samples, missing)


def _write_files(out: Path, info: ShardInfo, metas: list, text_rows: list, samples: dict, missing: list) -> dict:
    from ..results import SCHEMA_VERSION

    run_json = out / "run.json"
    try:
        before = json.loads(run_json.read_text()) if run_json.exists() else {}
    except (OSError, ValueError):
        before = None
    if (out / "results.csv").exists() and not (isinstance(before, dict) and "shards" in before):
        raise ShardError(f"out: {out} holds a run's own results; choose another --out")
    csv_path = out / "results.csv"
    (out / "results.parquet").unlink(missing_ok=True)  # stale from here until it is written again below
    with replaced(csv_path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=[*COLUMNS, SHARD_COLUMN], extrasaction="ignore")
        writer.writeheader()
        writer.writerows(text_rows)
    with replaced(out / "samples.jsonl", "w") as fh:
        for key, values in samples.items():
            fh.write(json.dumps({"key": dict(zip(KEY_COLUMNS, key, strict=True)), SAMPLES: values}) + "\n")
    table = read_results_csv(csv_path)
    table[SAMPLES] = pd.Series([samples.get(sample_key(r)) for r in text_rows], index=table.index, dtype=object)
    with replaced(out / "results.parquet", "wb") as fh:
        table.to_parquet(fh, index=False)
    times = [m for m in metas if m.get("started")]
    merged = {"schema": SCHEMA_VERSION, "run_id": f"sweep-{info.sweep_id}", "suite": info.suite,
              "started": min((m["started"] for m in times), default=None),
              "finished": max((m.get("finished") or "" for m in metas), default=None) or None,
              "merged": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "profiled": any(m.get("profiled") is True for m in metas), "measurement": info.options,
              "sweep": {"id": info.sweep_id, "of": info.of, "cases": info.sweep_cases, "rows": info.sweep_rows,
                        "impls": info.impls, "missing": missing},
              "shards": metas}
    _write_json(run_json, merged)
    return merged
