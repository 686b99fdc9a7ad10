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

In every layout the LM head sees only the positions that predict a trained token (``head_sees_only``): a prompt's
logits are never computed, offline as online.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from tether.algorithms.logprobs import at_least_float32, linear_token_logprobs, token_logprobs
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


def describe_head(chunked: bool) -> str:
    """The plan table's line for where the LM head runs (the offline log-prob objectives)."""
    if chunked:
        return "at the trained positions, a chunk of positions at a time, recomputed in the backward (--chunked-head)"
    return "at the trained positions only (--chunked-head: in chunks, for memory)"


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
    names = ("input_ids", "attention_mask", "position_ids", "last_index", "tree_mask", *VISION_INPUTS)
    return {k: batch[k] for k in names if k in batch}


def group_rows(batch: dict, group: int, per_group: int) -> dict[str, torch.Tensor]:
    """The rows of one group (response block) of a padded or packed batch, its sequences renumbered from 0."""
    if "tree_mask" in batch:
        raise ValueError("a shared-prompt batch has no response blocks: its responses share their prompt's rows")
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


def lm_head(model):
    """The module that turns the last (normed) hidden states into logits: the output embeddings of the model under a
    data-parallel wrapper or a PEFT one. None for a model that names none (its logits are then computed everywhere
    and selected afterwards)."""
    model = getattr(model, "module", model)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None


@contextmanager
def head_sees_only(model, select):
    """Inside, the model's LM head is given ``select(hidden)`` instead of the whole (R, W, H) hidden states, so the
    logits are computed only where ``select`` keeps a position; ``captured["hidden"]`` is what it was given (the
    final, normed hidden states there), and None is yielded for a model with no head module (the caller then applies
    ``select`` to the logits). Any head-side work the model does after the head (a soft cap, a scale) still applies.
    Why not the library's ``logits_to_keep``: its tensor form is a 1-D index into one sequence dimension, and
    transformers 5.19's Llama raised IndexError on the 2-D mask of packed rows *after* running the whole backbone
    (a silent retry then ran every forward twice); selecting here is one forward on any version. Why at all: a
    prompt's positions score nothing, and at a large vocabulary the head and its log-softmax are much of a
    forward's arithmetic and most of its activation memory (docs/performance.md)."""
    head, captured = lm_head(model), {}
    if head is None:
        yield None
        return

    def pre_hook(module, args):
        captured["hidden"] = select(args[0])
        return (captured["hidden"], *args[1:])

    handle = head.register_forward_pre_hook(pre_hook)
    try:
        yield captured
    finally:
        handle.remove()


def selected_logprobs(model, inputs: dict, select, targets: torch.Tensor, chunked: bool = False) -> torch.Tensor:
    """log π(targets) (N,) at the N positions ``select`` picks from the (R, W, ·) outputs as (1, N, ·), with the LM
    head computing logits at those positions only. ``chunked``: the head is handed no position at all, and its
    weight is applied to the picked hidden states a chunk at a time (linear_token_logprobs; check_chunked_head has
    checked that the head is a plain linear layer with nothing after it)."""
    if chunked:
        picked = {}

        def nothing(hidden):
            picked["hidden"] = select(hidden)[0]  # (N, H)
            # the head's own autocast (--mixed-precision wraps the model's forward, not this function), replayed
            device = hidden.device.type
            picked["autocast"] = (device, torch.is_autocast_enabled(device), torch.get_autocast_dtype(device))
            return hidden[..., :0, :]  # the model's own head call computes no logits

        with head_sees_only(model, nothing):
            model(**inputs, use_cache=False)
        head, (device, enabled, dtype) = lm_head(model), picked["autocast"]
        with torch.autocast(device, dtype=dtype, enabled=enabled):
            return linear_token_logprobs(picked["hidden"], head.weight, head.bias, targets)
    with head_sees_only(model, select) as captured:
        logits = model(**inputs, use_cache=False).logits
    rows = logits if captured is not None else select(logits)  # no head module: every position's logits, then picked
    if not targets.numel():  # no trained token: an empty result still on the graph, so a backward (and DDP's) runs
        return at_least_float32(rows[0, :, 0]) * 0
    return token_logprobs(rows, targets[None])[0]


def scored_token_logprobs(model, batch: dict, chunked: bool = False) -> torch.Tensor:
    """(R, W−1) log π of each loss-masked token (position t predicts token t+1), 0 elsewhere, from one forward of a
    padded or packed batch whose LM head computes logits only at the positions that predict a trained token. An
    unscored position's log-prob is never computed, so it cannot leak into a sum (an online vision policy's image
    placeholder is −inf there: models/vision.py)."""
    scored = batch["loss_mask"][:, 1:] > 0  # (R, W−1)
    keep = torch.nn.functional.pad(scored, (0, 1))  # (R, W): the last position predicts nothing
    targets = batch["input_ids"][:, 1:][scored]
    kept = selected_logprobs(model, model_inputs(batch), lambda h: h[keep][None], targets, chunked)
    return torch.zeros(scored.shape, dtype=kept.dtype, device=kept.device).masked_scatter(scored, kept)


def sequence_logprob_sums(
    model, batch: dict, sequences: int, chunked: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """(Σ log π over each sequence's loss-masked tokens, their count), both (sequences,), in sequence order, from
    one forward of a padded batch (one sequence per row), a packed one or a shared-prompt one; ``chunked``: the
    head applied in chunks (selected_logprobs)."""
    if "tree_mask" in batch:
        return shared_logprob_sums(model, batch, sequences, chunked)
    per_token = scored_token_logprobs(model, batch, chunked)
    mask = batch["loss_mask"][:, 1:].to(per_token.device, per_token.dtype)
    if "sequence_index" not in batch:
        return per_token.sum(-1), mask.sum(-1)
    index = batch["sequence_index"][:, 1:].to(per_token.device)
    return segment_sum(per_token, index, sequences), segment_sum(mask, index, sequences)


# ── Shared prompts: an example's responses after one forward of the tokens they all begin with ──
#
# A preference example's K responses repeat its prompt K times in the layouts above. Here each example is one
# "tree" of positions: the longest prefix its sequences share (the prompt, and any first response tokens they
# agree on), then each response's remaining tokens as a branch. A branch attends to the shared prefix and to
# itself, never to another branch; its position ids continue from the prefix's end, so every position sees exactly
# the tokens and positions it would see in a row of its own: the same log-probs up to rounding, with the prefix
# computed once. Trees are laid end to end like the packed sequences above (first-fit-decreasing rows); the mask
# that says who attends to whom is a 4-D one (R, 1, W, W), which transformers hands to the attention as it is.


def common_prefix(sequences: list[list[int]]) -> int:
    """How many first tokens every one of ``sequences`` shares."""
    shortest = min(len(s) for s in sequences)
    for i in range(shortest):
        if any(s[i] != sequences[0][i] for s in sequences[1:]):
            return i
    return shortest


def _runs_within(seqs: list[list[int]], cap: int) -> list[list[int]]:
    """The indices of ``seqs`` in consecutive runs whose tree (their common prefix once, then each one's rest) is at
    most ``cap`` positions; a run of one always fits (``cap`` is at least the longest sequence)."""
    runs: list[list[int]] = []
    for j in range(len(seqs)):
        trial = (runs[-1] if runs else []) + [j]
        p = common_prefix([seqs[i] for i in trial])
        if runs and p + sum(len(seqs[i]) - p for i in trial) <= cap:
            runs[-1] = trial
        else:
            runs.append([j])
    return runs


def _tree_rows(sizes: list[int], cap: int) -> list[list[int]]:
    """Rows of trees: of the capacities from the widest tree up to ``cap`` (twice the longest sequence: the width
    packed rows reach at most, so a row's attention stays within what packing computes), the first-fit-decreasing
    layout that computes the fewest positions (ties to the narrower)."""
    widest = max(sizes)
    best = None
    for capacity in sorted({min(cap, widest + (widest * k) // 8) for k in range(9)}):
        rows = first_fit_decreasing(sizes, capacity)
        positions = len(rows) * max(sum(sizes[t] for t in row) for row in rows)
        if best is None or positions < best[0]:
            best = (positions, rows)
    return best[1]


class SharedPrompts:
    """Each of ``examples`` (a list of sequences that begin alike) laid out as trees: the tokens a tree's sequences
    all begin with once, then each sequence's rest as a branch. A tree is at most twice the longest sequence wide,
    as packed rows are (pack_sequences): a group too wide for one tree (GRPO's G responses to a short prompt) is
    split into consecutive runs, each a tree, since the dense mask's attention grows with the square of a row's
    width (measured: 540-position trees of 8 responses to a 20-token prompt cost the GRPO update what they saved in
    positions). Trees go end to end in first-fit-decreasing rows no wider than twice the longest sequence either
    (``_tree_rows``), padding at a row's end (its positions restarting at 0, as pack_sequences pads). ``flat(b, j, index)`` says where token ``index`` of
    example b's j-th sequence sits, as a flat index into the R·W positions."""

    def __init__(self, examples: list[list[list[int]]], pad_id: int = 0):
        cap = 2 * max(len(s) for seqs in examples for s in seqs)
        trees = [(b, run) for b, seqs in enumerate(examples) for run in _runs_within(seqs, cap)]
        self.place = {(b, j): (t, k) for t, (b, run) in enumerate(trees) for k, j in enumerate(run)}
        members = [[examples[b][j] for j in run] for b, run in trees]
        self.shared = [common_prefix(seqs) for seqs in members]
        sizes = [p + sum(len(s) - p for s in seqs) for p, seqs in zip(self.shared, members)]
        rows = _tree_rows(sizes, cap)
        self.width = width = max(sum(sizes[t] for t in row) for row in rows)
        self.input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        self.position_ids = torch.zeros((len(rows), width), dtype=torch.long)
        tree = torch.full((len(rows), width), -1, dtype=torch.long)
        branch = torch.full((len(rows), width), -1, dtype=torch.long)  # 0: the shared prefix, k + 1: sequence k's rest
        self.start: list[int] = [0] * len(members)  # each tree's first flat position
        self.branch_start: list[list[int]] = [[] for _ in members]  # each branch's first flat position
        for r, row in enumerate(rows):
            col = 0
            for t in row:
                seqs, p = members[t], self.shared[t]
                self.start[t] = r * width + col
                self.input_ids[r, col : col + p] = torch.tensor(seqs[0][:p], dtype=torch.long)
                self.position_ids[r, col : col + p] = torch.arange(p)
                tree[r, col : col + sizes[t]], branch[r, col : col + p] = t, 0
                lo = col + p
                for k, seq in enumerate(seqs):
                    hi = lo + len(seq) - p
                    self.input_ids[r, lo:hi] = torch.tensor(seq[p:], dtype=torch.long)
                    self.position_ids[r, lo:hi] = torch.arange(p, len(seq))
                    branch[r, lo:hi] = k + 1
                    self.branch_start[t].append(r * width + lo)
                    lo = hi
                col += sizes[t]
            self.position_ids[r, col:] = torch.arange(width - col)
        self.tree_mask = _tree_mask(tree, branch)

    def flat(self, b: int, j: int, index: torch.Tensor) -> torch.Tensor:
        """Flat positions of tokens ``index`` (a tensor of token indices) of example b's j-th sequence."""
        t, k = self.place[(b, j)]
        p = self.shared[t]
        return torch.where(index < p, self.start[t] + index, self.branch_start[t][k] + index - p)


def pack_shared_prompts(
    examples: list[list[list[int]]], loss_masks: list[list[list[int]]], pad_id: int, k: int
) -> dict[str, torch.Tensor]:
    """The preference examples' layout (SharedPrompts): ``examples[b]`` its real responses, each prompt + response
    ids, best first; ``k``: responses per example in the batch (a shorter list's missing ones score as its last, as
    in collate_policy_preferences).

    Returns input_ids, position_ids (R, W); tree_mask (R, 1, W, W), True where a query position (row 2) may attend
    to a key position (row 3); and the scored tokens, response-major as the other layouts number sequences
    (sequence j·B + b is example b's j-th response): scored_position (flat index into R·W of the position whose
    logits predict the token), scored_target (the token) and scored_sequence. A token is scored where its loss mask
    is 1, its first token never (nothing before it predicts it)."""
    layout = SharedPrompts(examples, pad_id)
    b_count = len(examples)
    positions, targets, sequences = [], [], []
    for j in range(k):
        for b in range(b_count):
            jj = min(j, len(examples[b]) - 1)
            i = torch.nonzero(torch.tensor(loss_masks[b][jj][1:], dtype=torch.bool)).flatten() + 1
            positions.append(layout.flat(b, jj, i - 1))  # token i is predicted at token i - 1's position
            targets.append(torch.tensor(examples[b][jj], dtype=torch.long)[i])
            sequences.append(torch.full_like(i, j * b_count + b))
    return {
        "input_ids": layout.input_ids,
        "position_ids": layout.position_ids,
        "tree_mask": layout.tree_mask,
        "scored_position": torch.cat(positions),
        "scored_target": torch.cat(targets),
        "scored_sequence": torch.cat(sequences),
    }


def _tree_mask(tree: torch.Tensor, branch: torch.Tensor) -> torch.Tensor:
    """(R, 1, W, W): a position attends to the earlier positions of its own tree that are in the shared prefix or
    in its own branch; a padding position to itself alone (no row of the attention is empty)."""
    width = tree.shape[1]
    col = torch.arange(width)
    causal = col[None, :] <= col[:, None]  # (W, W): key column <= query column
    same_tree = tree[:, :, None] == tree[:, None, :]
    visible = (branch[:, None, :] == 0) | (branch[:, None, :] == branch[:, :, None])
    mask = same_tree & visible & causal & (tree[:, :, None] >= 0)
    mask |= torch.eye(width, dtype=torch.bool)[None] & (tree < 0)[:, :, None]
    return mask[:, None]


def tree_attention_mask(model, mask: torch.Tensor) -> torch.Tensor:
    """``mask`` (True: attend) in the form the model's attention reads a 4-D mask: as it is for SDPA, additive for
    eager attention (0 where it attends, the dtype's lowest value elsewhere; eager adds the mask to the scores). A
    data-parallel wrapper's module is the model."""
    model = getattr(model, "module", model)
    if model.config._attn_implementation == "sdpa":
        return mask
    dtype = next(model.parameters()).dtype
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)


def prompt_sharing_refusal(model) -> str:
    """Why ``model`` cannot take the shared-prompt layout ('' when it can): the 4-D mask replaces the one
    transformers would build, so only attentions that read such a mask (SDPA, eager), and no sliding window (the
    mask would not hold the window) and no per-layer attention kinds. A data-parallel wrapper's module is the model."""
    config = getattr(model, "module", model).config
    attention = config._attn_implementation
    if attention not in ("sdpa", "eager"):
        return f"its attention ({attention}) takes no custom 4-D mask"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True) is not False:
        return "its sliding-window attention (the shared layout's mask would not hold the window)"
    kinds = set(getattr(config, "layer_types", None) or ["full_attention"])
    if kinds != {"full_attention"}:
        return f"its layers' attention kinds ({', '.join(sorted(kinds))})"
    return ""


def shared_logprob_sums(model, batch: dict, sequences: int, chunked: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """sequence_logprob_sums of a pack_shared_prompts batch: one forward of every tree, each scored token's log-prob
    read at the position that predicts it."""
    inputs = {
        "input_ids": batch["input_ids"],
        "position_ids": batch["position_ids"],
        "attention_mask": tree_attention_mask(model, batch["tree_mask"]),
    }
    flat = batch["scored_position"]  # (N,): each scored token's predictor, a flat index into the R·W positions
    pick = lambda h: h.reshape(-1, h.shape[-1])[flat][None]
    per_token = selected_logprobs(model, inputs, pick, batch["scored_target"], chunked)
    index = batch["scored_sequence"]
    return segment_sum(per_token, index, sequences), segment_sum(torch.ones_like(per_token), index, sequences)


def prompt_sharing(model_cfg, model) -> tuple[bool, str]:
    """Whether padding-free rows lay a prompt's responses after one copy of it for ``model`` (the run's model section
    ``model_cfg``: share_prompt, no dropout, an attention that reads the layout's mask), and the plan's words for the
    choice ('' where the option is off)."""
    if not (model_cfg.padding_free and model_cfg.share_prompt):
        return False, ""
    if not model_cfg.shares_prompts:
        return False, "; prompts not shared: dropout is on (each response draws its own mask over its prompt)"
    refusal = prompt_sharing_refusal(model)
    if refusal:
        return False, f"; prompts not shared: {refusal}"
    return True, "; a prompt's responses after one copy of it (--no-share-prompt: one copy each)"
