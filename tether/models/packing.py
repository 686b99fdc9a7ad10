"""Padding-free micro-batches: a micro-batch's sequences laid end to end in as few rows as fit.

Padded rows compute every position up to the longest sequence of the micro-batch; on data of varying length a
third of a step's positions can be padding (docs/performance.md). Here each row holds several whole sequences.
Each sequence restarts its position ids at 0, and with no 2-D attention mask transformers builds a
block-diagonal causal mask from those restarts, so no token attends across sequences and each sequence's
logits are those it would get alone (tests check them, and the losses and gradients, against padded rows).

Row width: of the capacities from the micro-batch's longest sequence up to twice it, the one whose
first-fit-decreasing layout computes the fewest positions (rows × width). A packed micro-batch never computes
more positions than the padded one (the longest is a candidate, and it is the padded width), and attention, the
one cost that grows with the width, spans at most twice the padded rows'. Every loss the offline stages train
is a sum over tokens or over sequences, so the same sequences in fewer rows give the same loss.

A packed batch carries ``position_ids`` instead of ``attention_mask``, and ``sequence_index`` (R, W): the
sequence each position belongs to, n (the number of sequences) on padding. Reward models also get
``last_index`` (n,): each sequence's last token, as a flat index into the (R·W) positions.
"""

from __future__ import annotations

import torch

from tether.algorithms.logprobs import token_logprobs
from tether.algorithms.reductions import segment_sum
from tether.models.vision import PER_TOKEN, VISION_INPUTS


def first_fit_decreasing(lengths: list[int], capacity: int) -> list[list[int]]:
    """Bins of indices into ``lengths`` whose lengths sum to at most ``capacity``; longest placed first, each into
    the first bin with room. Within a bin, indices keep the order they were placed in."""
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda j: (-lengths[j], j)):
        if lengths[i] > capacity:
            raise ValueError(f"sequence {i} has {lengths[i]} tokens, more than the row capacity {capacity}")
        for b, free in enumerate(room):
            if lengths[i] <= free:
                bins[b].append(i)
                room[b] -= lengths[i]
                break
        else:
            bins.append([i])
            room.append(capacity - lengths[i])
    return bins


def pad_sequences(
    sequences: list[list[int]], pad_id: int, loss_masks: list[list[int]] | None = None
) -> dict[str, torch.Tensor]:
    """The padded layout: one right-padded row per sequence, input_ids and attention_mask (R, W), and loss_mask
    when masks are given."""
    width = max(len(s) for s in sequences)
    input_ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)
    loss_mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, seq in enumerate(sequences):
        input_ids[i, : len(seq)] = torch.tensor(seq)
        attention_mask[i, : len(seq)] = 1
        if loss_masks is not None:
            loss_mask[i, : len(seq)] = torch.tensor(loss_masks[i])
    batch = {"input_ids": input_ids, "attention_mask": attention_mask}
    if loss_masks is not None:
        batch["loss_mask"] = loss_mask
    return batch


def _rows(lengths: list[int], groups: list[list[int]], capacity: int) -> tuple[list[list[int]], list[int]]:
    rows, group_rows = [], [0]
    for group in groups:
        rows += [[group[j] for j in bin_] for bin_ in first_fit_decreasing([lengths[i] for i in group], capacity)]
        group_rows.append(len(rows))
    return rows, group_rows


def choose_rows(lengths: list[int], groups: list[list[int]]) -> tuple[list[list[int]], list[int]]:
    """(rows of sequence indices, each group's first row and the end): the layout that computes the fewest
    positions among capacities from the longest sequence to twice it (nine candidates; ties go to the narrower)."""
    longest = max(lengths)
    best = None
    for capacity in sorted({longest + (longest * k) // 8 for k in range(9)}):
        rows, group_rows = _rows(lengths, groups, capacity)
        positions = len(rows) * max(sum(lengths[i] for i in row) for row in rows)
        if best is None or positions < best[0]:
            best = (positions, rows, group_rows)
    return best[1], best[2]


def pack_sequences(
    sequences: list[list[int]],
    pad_id: int,
    loss_masks: list[list[int]] | None = None,
    groups: list[list[int]] | None = None,
) -> dict[str, torch.Tensor]:
    """Lay ``sequences`` into the rows ``choose_rows`` picks.

    ``groups`` (default: one group of all) partitions the sequence indices; a row only holds sequences of one
    group, and the rows come group by group, so ``group_rows`` (G+1,) gives each group's row range (DPO's
    chosen and rejected blocks can be forwarded apart). Returns input_ids, position_ids, sequence_index (R, W),
    last_index (n,), group_rows, and loss_mask (R, W) when masks are given.
    """
    n = len(sequences)
    groups = groups if groups is not None else [list(range(n))]
    rows, group_rows = choose_rows([len(s) for s in sequences], groups)
    width = max(sum(len(sequences[i]) for i in row) for row in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    position_ids = torch.zeros((len(rows), width), dtype=torch.long)
    sequence_index = torch.full((len(rows), width), n, dtype=torch.long)
    loss_mask = torch.zeros((len(rows), width), dtype=torch.long)
    last_index = torch.zeros(n, dtype=torch.long)
    for r, row in enumerate(rows):
        col = 0
        for i in row:
            k = len(sequences[i])
            input_ids[r, col : col + k] = torch.tensor(sequences[i])
            position_ids[r, col : col + k] = torch.arange(k)
            sequence_index[r, col : col + k] = i
            if loss_masks is not None:  # nothing predicts a sequence's first token: here it would be the previous one
                loss_mask[r, col + 1 : col + k] = torch.tensor(loss_masks[i][1:])
            last_index[i] = r * width + col + k - 1
            col += k
        position_ids[r, col:] = torch.arange(width - col)  # padding restarts too: a segment of its own
    batch = {
        "input_ids": input_ids,
        "position_ids": position_ids,
        "sequence_index": sequence_index,
        "last_index": last_index,
        "group_rows": torch.tensor(group_rows),
    }
    if loss_masks is not None:
        batch["loss_mask"] = loss_mask
    return batch


def example_tokens(example) -> int:
    """Tokens one training example puts through the model: an SFT example's, a reward pair's or list's responses
    together, a DPO example's responses together (what a token-budget micro-batch counts)."""
    if hasattr(example, "input_ids"):
        return len(example.input_ids)
    if hasattr(example, "chosen_ids"):
        return len(example.chosen_ids) + len(example.rejected_ids)
    if hasattr(example, "ranked_ids"):
        return sum(len(r) for r in example.ranked_ids)
    return sum(len(r.input_ids) for r in example.responses)


def describe(padding_free: bool) -> str:
    """The plan table's line for a micro-batch's layout."""
    return (
        "padding-free: sequences end to end, each attending to itself (--no-padding-free: padded rows)"
        if padding_free
        else "padded rows, one sequence each"
    )


def model_inputs(batch: dict) -> dict[str, torch.Tensor]:
    """The keyword arguments a causal LM's forward takes from a padded or a packed batch (a vision-language model's:
    its pixel tensors too)."""
    return {k: batch[k] for k in ("input_ids", "attention_mask", "position_ids", *VISION_INPUTS) if k in batch}


def score_inputs(batch: dict) -> dict[str, torch.Tensor]:
    """The keyword arguments tether's RewardModel takes from a padded or a packed batch (a vision-language backbone's:
    its pixel tensors too)."""
    names = ("input_ids", "attention_mask", "position_ids", "last_index", *VISION_INPUTS)
    return {k: batch[k] for k in names if k in batch}


def group_rows(batch: dict, group: int, per_group: int) -> dict[str, torch.Tensor]:
    """The rows of one group (response block) of a padded or packed batch, its sequences renumbered from 0."""
    if "sequence_index" not in batch:
        rows = slice(group * per_group, (group + 1) * per_group)
        out = {k: batch[k][rows] for k in ("input_ids", "attention_mask", "loss_mask", *PER_TOKEN) if k in batch}
        groups = batch["input_ids"].shape[0] // per_group
        for key in (k for k in VISION_INPUTS if k in batch and k not in PER_TOKEN):
            # every group shows the same images (each response of an example shows the example's): one group's share
            share, left = divmod(batch[key].shape[0], groups)
            if left:
                raise RuntimeError(f"{key}: {batch[key].shape[0]} rows do not split into {groups} equal groups")
            out[key] = batch[key][:share]
        return out
    lo, hi = int(batch["group_rows"][group]), int(batch["group_rows"][group + 1])
    index = batch["sequence_index"][lo:hi] - group * per_group
    index = torch.where((index >= 0) & (index < per_group), index, torch.full_like(index, per_group))
    return {
        "input_ids": batch["input_ids"][lo:hi],
        "position_ids": batch["position_ids"][lo:hi],
        "loss_mask": batch["loss_mask"][lo:hi],
        "sequence_index": index,
    }


def sequence_logprob_sums(model, batch: dict, sequences: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(Σ log π over each sequence's loss-masked tokens, their count), both (sequences,), in sequence order, from
    one forward of a padded batch (one sequence per row) or a packed one."""
    logits = model(**model_inputs(batch), use_cache=False).logits
    ids, mask = batch["input_ids"], batch["loss_mask"][:, 1:].float()
    # (R, W-1): position t predicts t+1. A where, not a product: a masked position may be -inf (an online vision
    # policy's image placeholder, which the prompt holds and the model is never let to sample: models/vision.py)
    per_token = torch.where(mask > 0, token_logprobs(logits[:, :-1], ids[:, 1:]), 0.0)
    if "sequence_index" not in batch:
        return per_token.sum(-1), mask.sum(-1)
    index = batch["sequence_index"][:, 1:].to(per_token.device)
    return segment_sum(per_token, index, sequences), segment_sum(mask, index, sequences)
