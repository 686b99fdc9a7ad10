"""Data parallelism for the online stages: N processes, one global step.

Layout (docs/scaling.md): every process holds the whole policy, reference, reward model (and critic); a step's
prompts are split into N contiguous shards, and each process samples and scores its own shard — a GRPO group is
sampled whole on one process, and every reward function runs once per response, on the process that sampled it.
The shards are then gathered so that every process holds the step's whole experience in the order one process
would have produced it. Everything computed from the experience (group statistics, advantage whitening, the
adaptive KL, dynamic sampling's counts, the metrics and samples.jsonl) is therefore global by construction;
forwards over it (old / reference log-probs, values) are split by rows and gathered. Each optimizer update takes
its minibatch of the global order, process r the r-th contiguous part of it, with the loss normalised by the
whole minibatch's counts; the gradients are summed over processes (bucketed all-reduces) before clipping. That
is the one-process update exactly (tests/test_online_parallel.py).

Nothing here pickles: tensors travel as tensors, text as UTF-8 JSON in a byte tensor.
"""

from __future__ import annotations

import json

import torch


def shard_bounds(count: int, world: int, rank: int) -> tuple[int, int]:
    """[start, stop) of rank's contiguous share of ``count`` items; the first count % world ranks take one more."""
    base, extra = divmod(count, world)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


class DataParallel:
    """The process group of an online run (one process: every method is the identity)."""

    def __init__(self, accelerator=None):
        self.world = accelerator.num_processes if accelerator is not None else 1
        self.rank = accelerator.process_index if accelerator is not None else 0
        self.device = accelerator.device if accelerator is not None else torch.device("cpu")

    @property
    def active(self) -> bool:
        return self.world > 1

    def shard(self, items: list) -> list:
        start, stop = shard_bounds(len(items), self.world, self.rank)
        return items[start:stop]

    # ------------------------------------------------------------------------------------------ collectives

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        """Σ over processes (float64 on the wire: counts and token-weighted sums stay exact)."""
        if not self.active:
            return values
        import torch.distributed as dist

        out = values.detach().to(self.device, torch.float64).clone()
        dist.all_reduce(out)
        return out.cpu()

    def sum_dict(self, values: dict[str, float]) -> dict[str, float]:
        """{name: Σ over processes}; every process passes the same names."""
        names = sorted(values)
        if not self.active or not names:
            return dict(values)
        total = self.sum(torch.tensor([float(values[k]) for k in names], dtype=torch.float64))
        return {k: float(v) for k, v in zip(names, total.tolist())}

    def any(self, flag: bool) -> bool:
        return bool(self.sum(torch.tensor([1.0 if flag else 0.0]))[0] > 0) if self.active else flag

    def broadcast_flag(self, flag: bool) -> bool:
        """Process 0's flag on every process (decisions made from files only process 0 reads)."""
        if not self.active:
            return flag
        import torch.distributed as dist

        value = torch.tensor([1 if flag else 0], dtype=torch.long, device=self.device)
        dist.broadcast(value, src=0)
        return bool(value.item())

    def gather_rows(self, x: torch.Tensor, pad_value=0, left: bool = False) -> torch.Tensor:
        """Concatenate every process's rows (dim 0) in rank order; dim 1 (if any) is padded to the widest
        (``left``: on the left, as prompts are)."""
        if not self.active:
            return x
        import torch.distributed as dist

        shape = torch.tensor([x.shape[0], x.shape[1] if x.dim() > 1 else 0], dtype=torch.long, device=self.device)
        shapes = [torch.zeros_like(shape) for _ in range(self.world)]
        dist.all_gather(shapes, shape)
        rows = [int(s[0]) for s in shapes]
        width = max(int(s[1]) for s in shapes)
        padded = x.to(self.device)
        if x.dim() > 1 and x.shape[1] < width:
            extra = padded.new_full((x.shape[0], width - x.shape[1], *x.shape[2:]), pad_value)
            padded = torch.cat([extra, padded] if left else [padded, extra], 1)
        full = padded.new_full((max(rows), *padded.shape[1:]), pad_value)
        full[: padded.shape[0]] = padded
        parts = [torch.empty_like(full) for _ in range(self.world)]
        dist.all_gather(parts, full.contiguous())
        return torch.cat([p[:n] for p, n in zip(parts, rows)]).to(x.device)

    def gather_json(self, items: list) -> list:
        """Concatenate every process's JSON-able list in rank order (UTF-8 JSON bytes, never pickle)."""
        if not self.active:
            return list(items)
        data = torch.tensor(list(json.dumps(items).encode("utf-8")), dtype=torch.uint8)
        gathered = self.gather_rows(data[None, :], pad_value=32)  # pad with spaces: still valid JSON
        return [x for row in gathered for x in json.loads(bytes(row.tolist()).decode("utf-8"))]

    def broadcast_json(self, value):
        """Process 0's JSON-able ``value`` on every process (UTF-8 JSON bytes, never pickle); the others pass None."""
        if not self.active:
            return value
        import torch.distributed as dist

        data = json.dumps(value).encode("utf-8") if self.rank == 0 else b""
        size = torch.tensor([len(data)], dtype=torch.long, device=self.device)
        dist.broadcast(size, src=0)
        if self.rank == 0:
            buffer = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(self.device)
        else:
            buffer = torch.empty(int(size.item()), dtype=torch.uint8, device=self.device)
        dist.broadcast(buffer, src=0)
        return json.loads(buffer.cpu().numpy().tobytes().decode("utf-8"))

    # ------------------------------------------------------------------------------------------ gradients

    BUCKET = 1 << 25  # gradient elements per all-reduce (128 MiB of fp32): bounded extra memory, few messages

    def sum_gradients(self, params: list[torch.Tensor]) -> None:
        """Σ of each parameter's gradient over processes, in flat all-reduces of up to BUCKET elements. A process
        whose share of the update was empty contributes zeros; a parameter no process gave a gradient keeps none
        (as on one process, where AdamW then skips it). A sharded parameter (--fsdp) is skipped: its reduce-scatter
        summed it already (tether/train/sharding.py shard_trained_online)."""
        if not self.active:
            return
        import torch.distributed as dist
        from torch.distributed.tensor import DTensor

        params = [p for p in params if not isinstance(p, DTensor)]

        had = torch.tensor([0.0 if p.grad is None else 1.0 for p in params], device=self.device)
        dist.all_reduce(had)
        bucket: list[torch.Tensor] = []
        size = 0
        for k, p in enumerate(params):
            if had[k] == 0:
                p.grad = None
                continue
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            bucket.append(p)
            size += p.numel()
            if size >= self.BUCKET:
                self._all_reduce_grads(bucket)
                bucket, size = [], 0
        if bucket:
            self._all_reduce_grads(bucket)

    def _all_reduce_grads(self, params: list[torch.Tensor]) -> None:
        import torch.distributed as dist

        # summed in float32 at least (bf16 gradients too), float64 for a float64 model
        dtype = torch.float64 if any(p.grad.dtype == torch.float64 for p in params) else torch.float32
        flat = torch.cat([p.grad.reshape(-1).to(dtype) for p in params]).to(self.device)
        dist.all_reduce(flat)
        offset = 0
        for p in params:
            n = p.numel()
            p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
            offset += n

    def broadcast_parameters(self, params: list[torch.Tensor]) -> None:
        """Process 0's values of ``params`` everywhere (a randomly initialised value head starts equal on all)."""
        if not self.active:
            return
        import torch.distributed as dist

        with torch.no_grad():
            for p in params:
                value = p.detach().to(self.device).clone()
                dist.broadcast(value, src=0)
                p.copy_(value.to(p.device))

    def all_or_none(self, fn):
        """fn() on every process; a RewardFunctionError on any of them is raised on all (so every process stops at
        the same step and writes the same checkpoint) — on one process, simply fn()."""
        from tether.rewards.functions import RewardFunctionError

        if not self.active:
            return fn()
        error, result = None, None
        try:
            result = fn()
        except RewardFunctionError as err:
            error = err
        if self.any(error is not None):
            raise error or RewardFunctionError(
                "a reward function failed on another process (its message is in that process's output)"
            )
        return result

    # ------------------------------------------------------------------------------------------ row splits

    def local_part(self, idx: torch.Tensor) -> torch.Tensor:
        """This process's contiguous part of an update's (global) row indices."""
        start, stop = shard_bounds(len(idx), self.world, self.rank)
        return idx[start:stop]

    def micro_batches(self, idx: torch.Tensor, size: int, lockstep: bool = False) -> list[tuple[torch.Tensor, bool]]:
        """This process's micro-batches of an update's (global) rows ``idx``: [(rows, real)], its contiguous part cut
        into ``size`` rows. ``lockstep`` (a sharded model, whose every forward and backward is collective): every
        process runs as many micro-batches as the process with the largest part (process 0, shard_bounds), a
        process short of them running the update's first row with real=False — its loss is multiplied by 0, so the
        collectives run and nothing is learned from it."""
        local = self.local_part(idx)
        parts = [(local[i : i + size], True) for i in range(0, len(local), size)]
        if lockstep and self.active:
            start, stop = shard_bounds(len(idx), self.world, 0)
            most = -(-(stop - start) // size)
            parts += [(idx[:1], False)] * (most - len(parts))
        return parts

    def map_rows(self, fn, rollout, *row_tensors):
        """fn(sub_rollout, *sub_tensors) -> tensor or tuple of (rows, ...) tensors, computed on this process's
        contiguous share of the rows and gathered: a no-grad forward over the global experience, split N ways."""
        if not self.active:
            return fn(rollout, *row_tensors)
        start, stop = shard_bounds(len(rollout.responses), self.world, self.rank)
        # fewer rows than processes: a process without rows computes row 0 and keeps none of it (shapes and
        # dtypes of its empty share then match the others')
        idx = torch.arange(start, stop) if stop > start else torch.tensor([0])
        out = fn(rollout.select(idx), *(t[idx] for t in row_tensors))
        keep = stop - start
        if isinstance(out, tuple):
            return tuple(self.gather_rows(o[:keep]) for o in out)
        return self.gather_rows(out[:keep])


def empty_rollout():
    """A process's share of a generation round that gave it no prompts."""
    from tether.rollout.batch import Rollout

    none = torch.zeros((0, 0), dtype=torch.long)
    return Rollout(none, none, none, none, torch.zeros(0, dtype=torch.bool), [], [])


def gather_rollout(dp: DataParallel, rollout, pad_id: int):
    """Every process's sampled responses, concatenated in rank order (prompts re-left-padded, responses
    re-right-padded to the widest)."""
    if not dp.active:
        return rollout
    from tether.rollout.batch import Rollout

    prompts, responses = dp.gather_json(rollout.prompts), dp.gather_json(rollout.responses)
    return Rollout(
        dp.gather_rows(rollout.prompt_ids, pad_id, left=True),
        dp.gather_rows(rollout.prompt_mask, 0, left=True),
        dp.gather_rows(rollout.response_ids, pad_id),
        dp.gather_rows(rollout.response_mask, 0),
        dp.gather_rows(rollout.truncated.long()).bool(),
        prompts,
        responses,
        dp.gather_rows(rollout.attention, 0) if dp.any(rollout.response_attention is not None) else None,
        dp.gather_rows(_sampler_logprobs(rollout), 0.0) if dp.any(rollout.sampler_logprobs is not None) else None,
        _gather_versions(dp, rollout),
        _gather_vision(dp, rollout),
    )


def _gather_vision(dp: DataParallel, rollout) -> list | None:
    """Every process's rows' pixel tensors (a vision-language policy's), in rank order, or None where no process
    has any: each tensor name's values laid end to end per process, gathered, and cut back into each row's tensors
    by the shapes and dtypes every process also gathers (no pickle)."""
    if not dp.any(rollout.vision is not None):
        return None
    mine = rollout.vision if rollout.vision is not None else [None] * len(rollout.responses)
    meta = dp.gather_json(
        [
            {k: [list(v.shape), str(v.dtype).removeprefix("torch.")] for k, v in row.items()} if row else None
            for row in mine
        ]
    )
    rows: list = [{} if m else None for m in meta]
    for key in sorted({k for m in meta if m for k in m}):
        dtype = getattr(torch, next(m[key][1] for m in meta if m and key in m))
        wire = torch.uint8 if dtype == torch.bool else dtype  # gloo gathers no bool
        local = [row[key].reshape(-1).to(wire) for row in mine if row and key in row]
        flat = dp.gather_rows((torch.cat(local) if local else torch.zeros(0, dtype=wire))[None, :])
        counts = dp.gather_json([sum(t.numel() for t in local)])
        values = torch.cat([flat[r, :n] for r, n in enumerate(counts)])
        at = 0
        for m, row in zip(meta, rows):
            if m and key in m:
                shape = m[key][0]
                n = int(torch.tensor(shape).prod()) if shape else 1
                row[key] = values[at : at + n].reshape(shape).to(dtype)
                at += n
    return rows


def _gather_versions(dp: DataParallel, rollout):
    """Every process's policy versions (rollout.max_staleness: each process's own rollout worker), or None where
    no process has any (the trainer's own weights sampled)."""
    if not dp.any(rollout.policy_versions is not None):
        return None
    mine = rollout.policy_versions.tolist() if rollout.policy_versions is not None else []
    return torch.tensor(dp.gather_json(mine), dtype=torch.long)


def _sampler_logprobs(rollout) -> torch.Tensor:
    """The rollout's sampler log-probs, or zeros of its shape (a process given no prompts this round)."""
    if rollout.sampler_logprobs is not None:
        return rollout.sampler_logprobs
    return torch.zeros(rollout.response_ids.shape, dtype=torch.float32)


def gather_scores(dp: DataParallel, scores):
    """Every process's Scores (None: a process that scored nothing), concatenated in rank order."""
    if not dp.active:
        return scores
    from tether.rewards.score import Scores

    local = scores if scores is not None else None
    names = [n for n in dp.gather_json([list(local.parts)] if local is not None else []) if n][:1]
    names = names[0] if names else []
    total = local.total if local is not None else torch.zeros(0)
    parts = (
        torch.stack([local.parts[k] for k in names], 1)
        if local is not None and names
        else torch.zeros((len(total), len(names)))
    )
    has_steps = dp.any(local is not None and local.step_scores is not None)
    steps = (
        dp.gather_json(local.step_scores if local is not None and local.step_scores is not None else [])
        if has_steps
        else None
    )
    has_outcome = dp.any(local is not None and local.has_outcome)
    all_parts = dp.gather_rows(parts.float())
    ends = (
        dp.gather_json(local.step_ends if local is not None and local.step_ends is not None else [])
        if dp.any(local is not None and local.step_ends is not None)
        else None
    )
    records = (
        dp.gather_json(local.records if local is not None and local.records is not None else [])
        if dp.any(local is not None and local.records is not None)
        else None
    )
    return Scores(
        dp.gather_rows(total.float()),
        {k: all_parts[:, j] for j, k in enumerate(names)},
        steps,
        has_outcome,
        ends,
        records,
    )
