"""`phasebench run --ray`: one Ray actor per GPU (or per CPU worker) measures one shard each; the driver merges."""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from ..selection import Selection, UsageError, build_cases, case_ops, load_plugins, resolve_device, resolve_impls
from ..worker import IN_PROCESS, Isolation

MARKER = ".phasebench-sweep"  # written by the driver: a worker that sees it shares the driver's filesystem
SHIPPED = ("results.csv", "samples.jsonl", "results.parquet", "run.json", "shard.json")


@dataclass
class Plan:
    cases: list
    suite: str
    impls: list
    options: dict  # the sweep's measurement options (no device)
    worker: dict


@dataclass
class ShardJob:
    """One shard for one worker: its cases and where its rows go."""

    cases: list
    info: object  # shards.ShardInfo
    folder: str
    root: str
    token: str
    selection: Selection
    cuda_graph: bool = False
    resume: bool = False
    retry_failed: bool = False
    refresh_ceilings: bool = False
    isolation: Isolation = IN_PROCESS
    rounds: int = 1  # rounds of the shard, combined into one row per (case, impl) (bench.sweep.rounds)


def worker_device(sel: Selection):
    """The device a worker measures on: the GPU Ray made visible (cuda:0 there), else the host."""
    import torch

    if sel.device is None or sel.device == "cpu":
        return resolve_device(sel.device)
    if not torch.cuda.is_available():
        raise RuntimeError(f"device: {sel.device} asked for, but this worker on {socket.gethostname()} sees no GPU")
    return torch.device("cuda", 0)


def _timer(device, cuda_graph: bool):
    from ..runner import default_timer

    if cuda_graph and device.type != "cuda":
        raise UsageError("cuda-graph: needs a CUDA device")
    return default_timer(device, cuda_graph=cuda_graph)


def worker_env(device) -> dict:
    from ....kernels import triton_mode

    return {"host": socket.gethostname(), "pid": os.getpid(), "device": str(device),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "triton_interpret": os.environ.get("TRITON_INTERPRET"), "triton_mode": triton_mode.mode()}


class ShardWorker:
    """A Ray actor's body (wrapped by ray.remote in the driver): plans the sweep, measures shards, reports progress."""

    def __init__(self):
        self.done, self.total = 0, 0

    def _setup(self, sel: Selection, cuda_graph: bool):
        from ..runner import measurement_options

        load_plugins(sel.plugin)
        device = worker_device(sel)
        timer = _timer(device, cuda_graph)
        return device, timer, measurement_options(device, timer, False)

    def plan(self, sel: Selection, cuda_graph: bool = False) -> Plan:
        from .shards import sweep_options

        device, _, options = self._setup(sel, cuda_graph)
        cases, suite = build_cases(sel, device)
        impls = resolve_impls(sel.impl, device, case_ops(cases), compiled=suite != "quick")
        return Plan(cases, suite, impls, sweep_options(options), worker_env(device))

    def run_shard(self, job: ShardJob) -> dict:
        from ...spec.store.folder_lock import holding

        with holding(job.folder):  # a second worker or a `--shard K/N` run on this folder is refused
            return self._run_shard(job)

    def _run_shard(self, job: ShardJob) -> dict:
        from ..runner import RunConfig, run
        from .shards import csv_rows, finish_shard, mark_shard, sweep_options

        device, timer, options = self._setup(job.selection, job.cuda_graph)
        if sweep_options(options) != job.info.options:  # e.g. Triton compiled here, interpreted where planned
            raise RuntimeError(f"worker on {socket.gethostname()} measures with {sweep_options(options)}, the sweep "
                               f"was planned with {job.info.options}")
        folder = Path(job.folder)
        shared = (Path(job.root) / MARKER).is_file() and (Path(job.root) / MARKER).read_text() == job.token
        mark_shard(folder, job.info, job.resume)
        self.done = len(csv_rows(folder)) if job.resume else 0
        self.total = job.info.rows

        def on_row(row, index, total):
            self.done = index

        isolation = dataclasses.replace(job.isolation, plugins=job.selection.plugin)
        df = run(RunConfig(job.cases, job.info.impls, device, folder, suite=job.info.suite, resume=job.resume,
                           retry_failed=job.retry_failed, timer=timer, refresh_ceilings=job.refresh_ceilings,
                           on_row=on_row, isolation=isolation, rounds=job.rounds, combine_rounds=True))
        finish_shard(folder, job.info, worker=worker_env(device))
        self.done = len(df)
        files = {} if shared else {n: (folder / n).read_bytes() for n in SHIPPED if (folder / n).is_file()}
        return {"shard": job.info.shard, "rows": len(df), "status": df["status"].value_counts().to_dict(),
                "worker": worker_env(device), "files": files}

    def progress(self) -> tuple[int, int]:
        return self.done, self.total


@dataclass
class RaySweep:
    """A `phasebench run --ray`: the selection (plugin files by absolute path: Selection.portable), the Ray address
    (None: a local instance), the workers, and whether each times CUDA-graph replays."""

    selection: Selection
    out: Path
    address: str | None = None
    workers: int | None = None
    cuda_graph: bool = False
    resume: bool = False
    retry_failed: bool = False
    refresh_ceilings: bool = False
    command: str = "phasebench run"  # the selection as a command line, for the resume hints
    isolation: Isolation = IN_PROCESS  # where each worker measures its cases
    rounds: int = 1  # rounds of each shard (`run --rounds`)
    stream: object = field(default=None, repr=False)


def _say(cfg: RaySweep, text: str) -> None:
    print(f"phasebench run: {text}", file=cfg.stream or sys.stderr, flush=True)


def _workers(ray, cfg: RaySweep) -> tuple[int, dict]:
    """How many actors, and the resources of each: one GPU each where the cluster has GPUs, else one CPU."""
    res = ray.cluster_resources()
    gpus, cpus = int(res.get("GPU", 0)), int(res.get("CPU", 0))
    if gpus and cfg.selection.device != "cpu":
        return min(cfg.workers or gpus, gpus), {"num_gpus": 1}
    if cfg.selection.device not in (None, "cpu"):
        raise UsageError(f"device: {cfg.selection.device} asked for, but the Ray cluster has no GPUs")
    if not cfg.workers:
        raise UsageError("workers: the Ray cluster has no GPUs; give --workers N to measure on N CPU workers")
    if cfg.workers > cpus:
        raise UsageError(f"workers: {cfg.workers} CPU workers asked for, the Ray cluster has {cpus} CPUs")
    return cfg.workers, {"num_cpus": 1}


def _existing_shards(out: Path) -> dict[int, set[int]]:
    found: dict[int, set[int]] = {}
    for path in out.glob("shard-*-of-*"):
        parts = path.name.split("-")
        if path.is_dir() and len(parts) == 4 and parts[1].isdigit() and parts[3].isdigit():
            found.setdefault(int(parts[3]), set()).add(int(parts[1]))
    return found


def _shard_count(cfg: RaySweep, plan: Plan, workers: int, sweep: str) -> int:
    """The number of shards: the workers (at most one per case); on --resume, what the folder already holds."""
    from .shards import read_shard, shard_folder

    existing = _existing_shards(cfg.out)
    if not existing:
        return min(workers, len(plan.cases))
    if len(existing) > 1:
        raise UsageError(f"resume: {cfg.out} holds shards of {' and '.join(map(str, sorted(existing)))}; keep one set")
    (n, ks), = existing.items()
    for k in sorted(ks):
        info = read_shard(shard_folder(cfg.out, k, n))
        if info is not None and info.sweep_id != sweep:
            raise UsageError(f"resume: {cfg.out} holds shards of sweep {info.sweep_id}, this run is sweep {sweep} "
                             f"(other cases, impls or options); use another --out")
    return n


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text[:200]}"


def run_sweep(cfg: RaySweep) -> int:
    """Plan on a worker, measure every unfinished shard on the actors, show progress, merge; 0 when merged,
    1 when a shard failed (its rows are kept: --resume continues it)."""
    import ray

    from ...spec.store.folder_lock import holding

    started = not ray.is_initialized()
    if started:
        connect(ray, cfg.address)
    try:
        with holding(cfg.out):  # the driver holds the sweep's folder; each worker holds its shard's
            return _drive(ray, cfg)
    finally:
        if started:
            ray.shutdown()


CONNECT_S = 10.0  # a cluster's head answers a TCP connection at once; nothing answering by then is not one
NO_CLUSTER = "start one there with `ray start --head`, or drop ADDRESS for a Ray on this machine"


def head_endpoint(address: str) -> tuple[str, int] | None:
    """(host, port) of a Ray address to probe: `host:port`, `ray://host:port` (port 10001 by default) or `host`
    (6379); None for `auto`, which Ray resolves on this machine."""
    if address in ("auto", "local"):
        return None
    scheme, sep, rest = address.partition("://")
    client = sep and scheme == "ray"
    host, colon, port = (rest if sep else address).rpartition(":")
    if not colon or not port.isdigit():
        host, port = (rest if sep else address), ("10001" if client else "6379")
    return host.strip("[]"), int(port)


def probe_head(address: str | None) -> None:
    """A one-line UsageError within about CONNECT_S when nothing answers at ADDRESS (Ray itself retries for
    minutes against a port that refuses, and takes about 20 s to give up on a silent one)."""
    endpoint = head_endpoint(address) if address else None
    if endpoint is None:
        return
    try:
        socket.create_connection(endpoint, timeout=CONNECT_S).close()
    except OSError as err:
        reason = "timed out" if isinstance(err, TimeoutError) else (err.strerror or str(err))
        raise UsageError(f"ray: no Ray cluster answers at {address} ({reason}); {NO_CLUSTER}") from None


def connect(ray, address: str | None) -> None:
    """ray.init on ADDRESS (None: a local Ray), one line instead of Ray's traceback when it cannot connect."""
    probe_head(address)
    try:
        ray.init(address=address or None, include_dashboard=False)
    except (ConnectionError, RuntimeError, TimeoutError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UsageError(f"ray: cannot connect to {address or 'a local Ray'} ({first[:160]}); {NO_CLUSTER}") from None


def _drive(ray, cfg: RaySweep) -> int:
    from .shards import ShardError, plan_shard, shard_complete, shard_folder, sweep_id

    workers, resources = _workers(ray, cfg)
    if _existing_shards(cfg.out) and not cfg.resume:
        raise UsageError(f"out: {cfg.out} already holds shard folders; give --resume to continue them, or another "
                         f"--out")
    actor_class = ray.remote(ShardWorker).options(max_concurrency=2, **resources)
    actors = [actor_class.remote() for _ in range(workers)]  # all start at once; the first plans the sweep
    try:
        plan = ray.get(actors[0].plan.remote(cfg.selection, cfg.cuda_graph))
    except ray.exceptions.RayTaskError as err:
        cause = err.as_instanceof_cause() if hasattr(err, "as_instanceof_cause") else err
        raise UsageError(" ".join(str(getattr(cause, "cause", cause)).split())[:300]) from None
    sweep = sweep_id(plan.cases, plan.impls, plan.options)
    n = _shard_count(cfg, plan, workers, sweep)
    cfg.out.mkdir(parents=True, exist_ok=True)
    token = uuid.uuid4().hex
    (cfg.out / MARKER).write_text(token)
    jobs, done_rows = [], {}
    for k in range(1, n + 1):
        folder = shard_folder(cfg.out, k, n)
        resume_cmd = f"{cfg.command} --shard {k}/{n} --resume --out {folder}"
        try:
            cases, info = plan_shard(plan.cases, plan.impls, k, n, plan.options, plan.suite, resume_cmd)
        except ShardError as err:
            raise UsageError(str(err)) from None
        if cfg.resume and not cfg.retry_failed and shard_complete(folder, sweep):
            done_rows[k] = info.rows
            continue
        jobs.append(ShardJob(cases, info, str(folder.resolve()), str(cfg.out.resolve()), token, cfg.selection,
                             cuda_graph=cfg.cuda_graph, resume=cfg.resume, retry_failed=cfg.retry_failed,
                             refresh_ceilings=cfg.refresh_ceilings, isolation=cfg.isolation, rounds=cfg.rounds))
    total = sum(j.info.rows for j in jobs) + sum(done_rows.values())
    where = f"{workers} {'GPU' if 'num_gpus' in resources else 'CPU'} worker(s)"
    _say(cfg, f"sweep {sweep}: {len(plan.cases)} cases, {total} rows in {n} shard(s) on {where} "
              f"({len(done_rows)} already complete) -> {cfg.out}")
    for idle in actors[max(1, len(jobs)):]:
        ray.kill(idle)
    failed = _measure(ray, cfg, jobs, actors[:max(1, len(jobs))], done_rows, total)
    if failed:
        for k, reason in sorted(failed.items()):
            _say(cfg, f"shard {k}/{n} failed ({reason}); its rows are kept")
        _say(cfg, f"resume the unfinished shards with `{cfg.command} --ray --resume --out {cfg.out}`, or one alone "
                  f"with the command in its shard.json")
        return 1
    return _merge_and_show(cfg, [shard_folder(cfg.out, k, n) for k in range(1, n + 1)])


def _measure(ray, cfg: RaySweep, jobs: list, actors: list, done_rows: dict, total: int) -> dict[int, str]:
    """Run the jobs on the actors (a free actor takes the next shard), showing rows done / total; returns
    {shard: reason} of the shards that failed."""
    queue, free, running, failed = list(jobs), list(actors), {}, {}
    shown = None
    while queue or running:
        while queue and free:
            actor, job = free.pop(0), queue.pop(0)
            running[actor.run_shard.remote(job)] = (actor, job)
        ready, _ = ray.wait(list(running), num_returns=1, timeout=1.0)
        for ref in ready:
            actor, job = running.pop(ref)
            try:
                summary = ray.get(ref)
            except ray.exceptions.RayError as err:
                failed[job.info.shard] = _one_line(err)
                if isinstance(err, ray.exceptions.RayTaskError):  # a Python error: the actor lives on
                    free.append(actor)
                continue
            _store(Path(job.folder), summary.get("files") or {})
            done_rows[job.info.shard] = summary["rows"]
            free.append(actor)
            worker = summary["worker"]
            _say(cfg, f"shard {job.info.label} done on {worker['host']} {worker['device']}: {summary['status']}")
        if not free and not running and queue:
            for job in queue:
                failed[job.info.shard] = "not started: every worker died"
            queue.clear()
        live = {}
        for actor, job in running.values():
            try:
                live[job.info.shard] = ray.get(actor.progress.remote(), timeout=5)[0]
            except ray.exceptions.RayError:  # dying, or busy starting (a timeout): skip this beat
                pass
        rows = sum(done_rows.values()) + sum(live.values())
        if rows != shown:
            parts = ", ".join(f"shard {k}: {v}" for k, v in sorted(live.items()))
            _say(cfg, f"{rows}/{total} rows" + (f" ({parts} running)" if parts else ""))
            shown = rows
    return failed


def _store(folder: Path, files: dict) -> None:
    """A worker that did not see the driver's folder sent its shard's files back: write them here."""
    from ...spec.store.files import write_file

    if files:
        folder.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            write_file(folder / name, data)


def _merge_and_show(cfg: RaySweep, folders: list[Path]) -> int:
    from ..console import closing_lines, format_table
    from ..results import read_results_csv
    from .shards import ShardError, merge

    try:
        merged = merge(folders, cfg.out)
    except ShardError as err:
        raise UsageError(str(err)) from None
    df = read_results_csv(cfg.out / "results.csv")
    print(format_table(df))
    for line in closing_lines(df, cfg.out):
        print(line)
    _say(cfg, f"merged {len(merged['shards'])} shard(s) of sweep {merged['sweep']['id']} into {cfg.out}")
    return 0
