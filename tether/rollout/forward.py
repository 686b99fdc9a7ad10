"""Scoring a rollout's tokens with the trainer's own forward: log-probs (always under the sampling transform,
logits / temperature), entropies, critic states, and the reference's log-probs. Only response logits are computed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from tether.algorithms.logprobs import at_least_float32, token_entropy, token_logprobs
from tether.errors import ConfigError
from tether.models.packing import (
    SharedPrompts,
    head_sees_only,
    lm_head,
    pack_sequences,
    prompt_sharing,
    prompt_sharing_refusal,
    tree_attention_mask,
)
from tether.models.vision import join_vision, on_model
from tether.models.work import phase
from tether.rollout.batch import Rollout


def vision_inputs(model, rollout: Rollout) -> dict[str, torch.Tensor]:
    """A vision-language model's pixel tensors for one padded forward of ``rollout``'s prompt + response columns
    (per-token ones at each row's first prompt column), on the model's device, floating ones in its dtype; {} when
    no row has images."""
    if rollout.vision is None:
        return {}
    p = rollout.prompt_ids.shape[1]
    offsets = (p - rollout.prompt_mask.long().sum(-1)).tolist()
    return on_model(model, join_vision(rollout.vision, p + rollout.response_ids.shape[1], offsets))


@dataclass
class ResponseLogits:
    """The logits at the positions that predict response tokens, as N rows: the B·T positions of padded rows, or the
    K scored tokens of packed ones. ``targets`` (N,): the token each row predicts; ``hidden`` (N, H) or None: the
    last (normed) hidden states there; ``place(values (N, ...)) -> (B, T, ...)``: per-position values back in the
    rollout's layout (0 where nothing is scored). Per-token quantities are computed on the N rows and only then
    placed, so no (B, T, V) copy of the logits is made."""

    logits: torch.Tensor
    targets: torch.Tensor
    hidden: torch.Tensor | None
    place: Callable

    def logprobs(self, temperature: float) -> torch.Tensor:
        return self.place(token_logprobs(self.logits[None], self.targets[None], temperature)[0])

    def entropy(self, temperature: float) -> torch.Tensor:
        return self.place(token_entropy(self.logits[None], temperature)[0])


def _forward_response(
    model, rollout: Rollout, with_hidden: bool = False, padding_free: bool = False, share_prompt: bool = False
) -> ResponseLogits:
    """The logits (and with ``with_hidden`` the last hidden states) at the positions that predict response tokens.

    Prompt logits are never computed (the LM head sees only those positions); position P−1+t predicts response token
    t. With ``padding_free`` the rows' tokens are laid end to end (``_forward_packed``) wherever the rollout allows it;
    with ``share_prompt`` too, rows with one prompt after one copy of it (``_forward_shared``) where the model reads
    the layout's mask.
    """
    if with_hidden and lm_head(model) is None:
        raise ConfigError(
            f"{type(model).__name__} names no output embeddings (get_output_embeddings() is None), so its last "
            "hidden states cannot be read before the LM head: a critic on its backbone needs them (use a separate "
            "critic)"
        )
    if padding_free and rollout.vision is None:  # a row's images go with padded rows (the plan says so)
        layout = _packed_layout(rollout)
        shared = _shared_rows(model, rollout, layout) if share_prompt and layout is not None else None
        if shared is not None:
            return _forward_shared(model, rollout, shared, with_hidden)
        if layout is not None:
            return _forward_packed(model, rollout, layout, with_hidden)
    input_ids = torch.cat([rollout.prompt_ids, rollout.response_ids], dim=1)  # (B, P+T)
    attention = torch.cat([rollout.prompt_mask, rollout.attention], dim=1)  # (B, P+T)
    position_ids = (attention.long().cumsum(-1) - 1).clamp(min=0)  # left padding: real tokens start at 0
    t = rollout.response_ids.shape[1]
    window = lambda hidden: hidden[:, -(t + 1) : -1]  # (B, T, H): position P−1+t predicts response token t
    with head_sees_only(model, window) as captured:
        out = model(
            input_ids=input_ids,
            attention_mask=attention,
            position_ids=position_ids,
            use_cache=False,
            **vision_inputs(model, rollout),
        )
    logits = window(out.logits) if captured is None else out.logits  # no LM head module: every position's logits
    hidden = captured["hidden"] if with_hidden else None
    b = rollout.response_ids.shape[0]
    return ResponseLogits(
        logits.reshape(b * t, -1),
        rollout.response_ids.reshape(-1),
        hidden.reshape(b * t, -1) if hidden is not None else None,
        lambda values: values.view(b, t, *values.shape[1:]),
    )


def _packed_layout(rollout: Rollout):
    """(prompt lengths (B,), attended response lengths (B,)) when every row is one unbroken run of tokens — its
    prompt right-aligned in the left padding, its attended response tokens from column 0, the response mask within
    them, a prompt before every scored token — else None (the rollout is then forwarded in padded rows)."""
    prompt_len = rollout.prompt_mask.long().sum(-1)
    response_len = rollout.attention.long().sum(-1)
    p, t = rollout.prompt_ids.shape[1], rollout.response_ids.shape[1]
    columns_p = torch.arange(p, device=prompt_len.device)
    columns_t = torch.arange(t, device=prompt_len.device)
    prompt_run = (columns_p[None] >= p - prompt_len[:, None]).to(rollout.prompt_mask.dtype)
    response_run = (columns_t[None] < response_len[:, None]).to(rollout.attention.dtype)
    scored = rollout.response_mask.bool()
    if (
        not torch.equal(prompt_run, rollout.prompt_mask)
        or not torch.equal(response_run, rollout.attention)
        or bool((scored & ~response_run.bool()).any())
        or bool((scored.any(-1) & (prompt_len == 0)).any())
    ):
        return None
    return prompt_len.cpu(), response_len.cpu()


class _PackedRollout:
    """A rollout's rows laid end to end (tether/models/packing.py): each row's prompt and attended response as one
    sequence, position ids restarting per sequence, so each sequence attends only to itself and gets the states
    and logits it gets alone. ``keep`` (R, W) marks the positions that predict a response-mask token."""

    def __init__(self, rollout: Rollout, layout):
        prompt_len, response_len = layout
        p = rollout.prompt_ids.shape[1]
        prompt_ids, response_ids = rollout.prompt_ids.cpu(), rollout.response_ids.cpu()
        sequences = [
            prompt_ids[b, p - int(prompt_len[b]) :].tolist() + response_ids[b, : int(response_len[b])].tolist()
            for b in range(len(prompt_len))
        ]
        batch = pack_sequences(sequences, pad_id=0)
        rows, width = batch["input_ids"].shape
        starts = batch["last_index"] - (prompt_len + response_len - 1)  # (B,) each sequence's first flat position
        b_idx, t_idx = rollout.response_mask.cpu().bool().nonzero(as_tuple=True)  # the scored tokens, row-major
        flat = starts[b_idx] + prompt_len[b_idx] - 1 + t_idx  # the flat position predicting each one
        keep = torch.zeros(rows * width, dtype=torch.bool)
        keep[flat] = True
        rank = torch.empty_like(flat)  # kept positions come in flat order: rank[j] is scored token j's place
        rank[flat.argsort()] = torch.arange(len(flat))
        device = rollout.response_ids.device
        self.inputs = {"input_ids": batch["input_ids"].to(device), "position_ids": batch["position_ids"].to(device)}
        self.keep = keep.view(rows, width).to(device)
        self.kept = len(flat)
        self.shape = tuple(rollout.response_ids.shape)
        self.b_idx, self.t_idx, self.rank = b_idx.to(device), t_idx.to(device), rank.to(device)

    def scatter(self, kept: torch.Tensor) -> torch.Tensor:
        """(B, T, ...) from the kept positions' values (K, ...), zeros where nothing is scored."""
        out = kept.new_zeros(self.shape + tuple(kept.shape[1:]))
        out[self.b_idx, self.t_idx] = kept[self.rank]
        return out


def _forward_packed(model, rollout: Rollout, layout, with_hidden: bool) -> ResponseLogits:
    """``_forward_response`` on padding-free rows. Only the positions that predict a response-mask token go through
    the LM head; what is computed there is placed back into the rollout's (B, T) layout."""
    packed = _PackedRollout(rollout, layout)
    kept = lambda hidden: hidden[packed.keep][None]  # (1, K, H), row-major: the K kept positions
    with head_sees_only(model, kept) as captured:
        out = model(**packed.inputs, use_cache=False)
    logits = kept(out.logits)[0] if captured is None else out.logits[0]  # no LM head module: every position's
    targets = torch.empty(packed.kept, dtype=torch.long, device=logits.device)
    targets[packed.rank] = rollout.response_ids[packed.b_idx, packed.t_idx]  # the token each kept position predicts
    hidden = captured["hidden"][0] if with_hidden else None  # final (normed) layer
    return ResponseLogits(logits, targets, hidden, packed.scatter)


class _SharedRollout:
    """A rollout's rows laid as trees (tether/models/packing.py SharedPrompts): the rows with one prompt after one
    copy of it, each row's attended response a branch that attends to the prompt and to itself, so each gets the
    states and logits it gets alone. ``flat`` (N,): for each scored token (row-major: ``b_idx``, ``t_idx``), the flat
    position that predicts it; a prompt's last position predicts the first token of every row that shares it."""

    def __init__(self, rollout: Rollout, layout, groups: list[list[int]], sequences: list[list[int]]):
        prompt_len = layout[0]
        tree = SharedPrompts([[sequences[b] for b in rows] for rows in groups])
        place = {b: (g, j) for g, rows in enumerate(groups) for j, b in enumerate(rows)}
        b_idx, t_idx = rollout.response_mask.cpu().bool().nonzero(as_tuple=True)
        flat = torch.empty_like(b_idx)
        for b in b_idx.unique().tolist():
            at = b_idx == b
            flat[at] = tree.flat(*place[b], prompt_len[b] - 1 + t_idx[at])  # token P_b + t read at P_b - 1 + t
        device = rollout.response_ids.device
        self.inputs = {"input_ids": tree.input_ids.to(device), "position_ids": tree.position_ids.to(device)}
        self.tree_mask = tree.tree_mask.to(device)
        self.flat, self.b_idx, self.t_idx = flat.to(device), b_idx.to(device), t_idx.to(device)
        self.shape = tuple(rollout.response_ids.shape)

    def forward_inputs(self, model) -> dict[str, torch.Tensor]:
        """The forward's keywords, the mask in the form ``model``'s attention reads."""
        return {**self.inputs, "attention_mask": tree_attention_mask(model, self.tree_mask)}

    def scatter(self, values: torch.Tensor) -> torch.Tensor:
        """(B, T, ...) from the scored tokens' values (N, ...), zeros where nothing is scored."""
        out = values.new_zeros(self.shape + tuple(values.shape[1:]))
        out[self.b_idx, self.t_idx] = values
        return out


def _shared_rows(model, rollout: Rollout, layout) -> _SharedRollout | None:
    """The tree layout of ``rollout``'s padding-free ``layout`` when two rows or more share a prompt and ``model``'s
    attention reads the layout's mask; else None (the rows are then packed one sequence each)."""
    if prompt_sharing_refusal(model):
        return None
    prompt_len, response_len = layout
    p = rollout.prompt_ids.shape[1]
    prompt_ids, response_ids = rollout.prompt_ids.cpu(), rollout.response_ids.cpu()
    groups: dict[tuple, list[int]] = {}
    sequences = []
    for b in range(len(prompt_len)):
        prompt = prompt_ids[b, p - int(prompt_len[b]) :].tolist()
        groups.setdefault(tuple(prompt), []).append(b)
        sequences.append(prompt + response_ids[b, : int(response_len[b])].tolist())
    if len(groups) == len(sequences):
        return None
    return _SharedRollout(rollout, layout, list(groups.values()), sequences)


def _forward_shared(model, rollout: Rollout, shared: _SharedRollout, with_hidden: bool) -> ResponseLogits:
    """``_forward_response`` on the tree layout: the LM head sees each scored token's predicting position, in the
    scored tokens' row-major order (a shared position once per token it predicts)."""
    select = lambda hidden: hidden.reshape(-1, hidden.shape[-1])[shared.flat][None]  # (1, N, H)
    with head_sees_only(model, select) as captured:
        out = model(**shared.forward_inputs(model), use_cache=False)
    logits = select(out.logits)[0] if captured is None else out.logits[0]  # no LM head module: every position's
    targets = rollout.response_ids[shared.b_idx, shared.t_idx]
    hidden = captured["hidden"][0] if with_hidden else None  # final (normed) layer
    return ResponseLogits(logits, targets, hidden, shared.scatter)


def response_states(backbone, rollout: Rollout, padding_free: bool = False, share_prompt: bool = False) -> torch.Tensor:
    """(B, T, H) last hidden states of a causal-LM backbone (no LM head) at the positions that predict response
    tokens: state s_t of the critic. 0 where nothing is scored when ``padding_free`` lays the rows end to end (and
    ``share_prompt`` a prompt's rows after one copy of it)."""
    layout = _packed_layout(rollout) if padding_free and rollout.vision is None else None
    shared = _shared_rows(backbone, rollout, layout) if share_prompt and layout is not None else None
    if shared is not None:
        hidden = backbone(**shared.forward_inputs(backbone), use_cache=False).last_hidden_state
        return shared.scatter(hidden.reshape(-1, hidden.shape[-1])[shared.flat])
    if layout is not None:
        packed = _PackedRollout(rollout, layout)
        return packed.scatter(backbone(**packed.inputs, use_cache=False).last_hidden_state[packed.keep])
    input_ids = torch.cat([rollout.prompt_ids, rollout.response_ids], 1)  # (B, P+T)
    attention = torch.cat([rollout.prompt_mask, rollout.attention], 1)  # (B, P+T)
    position_ids = (attention.long().cumsum(-1) - 1).clamp(min=0)
    hidden = backbone(
        input_ids=input_ids,
        attention_mask=attention,
        position_ids=position_ids,
        use_cache=False,
        **vision_inputs(backbone, rollout),
    ).last_hidden_state  # (B, P+T, H)
    t = rollout.response_ids.shape[1]
    return hidden[:, -(t + 1) : -1]  # position P−1+t is state s_t


def response_logprobs(
    model,
    rollout: Rollout,
    temperature: float,
    with_entropy: bool = False,
    padding_free: bool = False,
    share_prompt: bool = False,
):
    """log π(a_t | s_t) of the response tokens under the sampling transform; (B, T), 0 on padding.

    With with_entropy, also the per-token entropy of π(· | s_t) at that temperature, (B, T). ``padding_free``:
    one forward of the rows laid end to end; ``share_prompt``: a prompt's rows after one copy of it (the same
    values; tests/test_packing.py).
    """
    response = _forward_response(model, rollout, padding_free=padding_free, share_prompt=share_prompt)
    logprobs = response.logprobs(temperature) * rollout.response_mask
    if not with_entropy:
        return logprobs
    return logprobs, response.entropy(temperature) * rollout.response_mask


def response_logprobs_and_values(
    model, value_head, rollout: Rollout, temperature: float, padding_free: bool = False, share_prompt: bool = False
):
    """One forward of a policy whose backbone also carries the critic (a value head on the last hidden state).

    Returns (log-probs (B, T), entropy (B, T), values V(s_t) (B, T)), all 0 on padding.
    """
    response = _forward_response(model, rollout, True, padding_free, share_prompt)
    mask = rollout.response_mask
    values = response.place(at_least_float32(value_head(response.hidden.to(value_head.weight.dtype))[..., 0]))
    return response.logprobs(temperature) * mask, response.entropy(temperature) * mask, values * mask


def reference_logprobs(
    reference, policy, rollout: Rollout, temperature: float, padding_free: bool = False, share_prompt: bool = False
) -> torch.Tensor:
    """Reference log-probs: from the frozen copy, or (LoRA, reference None) from the policy with its adapter off."""
    rows = {"padding_free": padding_free, "share_prompt": share_prompt}
    with phase("reference"):
        if reference is not None:
            return response_logprobs(reference, rollout, temperature, **rows)
        with policy.disable_adapter():
            return response_logprobs(policy, rollout, temperature, **rows)


def describe_rows(model, model_cfg) -> str:
    """The plan's words for how the log-prob, value and update forwards lay a rollout's rows (``model_cfg``: the
    run's model section; ``model``: the policy)."""
    if not model_cfg.padding_free:
        return "padded rows, one response each (--no-padding-free)"
    line = "padding-free: each prompt and response end to end (a vision-language policy's rows stay padded)"
    return line + prompt_sharing(model_cfg, model)[1]
