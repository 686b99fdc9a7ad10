"""The rollout record: a batch of sampled responses, their masks and truncation flags, and how batches are padded
and joined. No sampling and no model here."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Rollout:
    """A batch of sampled responses. B rows (prompts × samples), P prompt and T response positions."""

    prompt_ids: torch.Tensor  # (B, P) left-padded prompt tokens
    prompt_mask: torch.Tensor  # (B, P) 1 on real prompt tokens
    response_ids: torch.Tensor  # (B, T) generated tokens, right-padded with pad_id after the stop token
    response_mask: torch.Tensor  # (B, T) 1 on generated tokens up to and including the stop token
    truncated: torch.Tensor  # (B,) bool: no stop token within max_new_tokens
    prompts: list[str]  # (B,) rendered prompt text
    responses: list[str]  # (B,) response text, special tokens removed
    # (B, T) 1 on every token of a multi-turn transcript, the environment's included (tether/agents): those are
    # context, attended to, while response_mask marks the policy's own tokens, the only actions. None: the same
    # as response_mask (one sampled response).
    response_attention: torch.Tensor | None = None
    # (B, T) log π_sampler(token) of each sampled token as the backend that drew it computed it (logits / τ after
    # its top-k/top-p), 0 off the response mask; None from a backend that samples with the trained weights
    # themselves (hf). The trainer's own forward still gives every log-prob the loss uses; these measure how far
    # the sampler's numerics are from it and weight the loss under an off-policy correction (rollout.off_policy_correction).
    sampler_logprobs: torch.Tensor | None = None
    # (B,) the policy version (updates done) whose weights drew each row; None: the trainer's current weights
    # (every backend but the rollout worker, rollout/async_worker.py)
    policy_versions: torch.Tensor | None = None
    # (B,) a vision-language model's pixel tensors of each row's prompt (the processor's outputs beside its token ids,
    # models/vision.py VISION_INPUTS; None for a row without images), which every forward of the row is given; None:
    # no row has images
    vision: list | None = None

    @property
    def lengths(self) -> torch.Tensor:
        return self.response_mask.sum(-1)  # (B,) the policy's tokens

    @property
    def attention(self) -> torch.Tensor:
        """(B, T) the response positions the model attends to."""
        return self.response_mask if self.response_attention is None else self.response_attention

    def select(self, idx: torch.Tensor) -> "Rollout":
        """The rows ``idx`` (a 1-D index tensor), in that order."""
        pick = idx.tolist()
        return Rollout(
            self.prompt_ids[idx],
            self.prompt_mask[idx],
            self.response_ids[idx],
            self.response_mask[idx],
            self.truncated[idx],
            [self.prompts[i] for i in pick],
            [self.responses[i] for i in pick],
            self.response_attention[idx] if self.response_attention is not None else None,
            self.sampler_logprobs[idx] if self.sampler_logprobs is not None else None,
            self.policy_versions[idx] if self.policy_versions is not None else None,
            [self.vision[i] for i in pick] if self.vision is not None else None,
        )

    def completion_ids(self) -> list[list[int]]:
        """The sampled token ids of each response, up to and including its stop token (what reward functions get)."""
        return [ids[mask.bool()].tolist() for ids, mask in zip(self.response_ids, self.response_mask)]


def left_pad(contexts: list[list[int]], pad_id: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids (B, P), mask (B, P)): token lists left-padded to the longest."""
    width = max((len(c) for c in contexts), default=0)
    ids = torch.full((len(contexts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(contexts), width), dtype=torch.long)
    for i, c in enumerate(contexts):
        if c:
            ids[i, width - len(c) :] = torch.tensor(c, dtype=torch.long)
            mask[i, width - len(c) :] = 1
    return ids.to(device), mask.to(device)


def concat_rollouts(parts: list[Rollout], pad_id: int) -> Rollout:
    """One rollout from several (e.g. dynamic-sampling rounds): prompts re-left-padded, responses re-right-padded."""
    if len(parts) == 1:
        return parts[0]
    p_len = max(r.prompt_ids.shape[1] for r in parts)
    t_len = max(r.response_ids.shape[1] for r in parts)

    def pad(x: torch.Tensor, width: int, value: int, left: bool) -> torch.Tensor:
        extra = x.new_full((x.shape[0], width - x.shape[1]), value)
        return torch.cat([extra, x] if left else [x, extra], 1)

    attention = None
    if any(r.response_attention is not None for r in parts):
        attention = torch.cat([pad(r.attention, t_len, 0, False) for r in parts])
    sampler = versions = None
    if all(r.sampler_logprobs is not None for r in parts):
        sampler = torch.cat([pad(r.sampler_logprobs, t_len, 0.0, False) for r in parts])
    if all(r.policy_versions is not None for r in parts):
        versions = torch.cat([r.policy_versions for r in parts])
    vision = None
    if any(r.vision is not None for r in parts):
        vision = [v for r in parts for v in (r.vision if r.vision is not None else [None] * len(r.responses))]
    return Rollout(
        torch.cat([pad(r.prompt_ids, p_len, pad_id, True) for r in parts]),
        torch.cat([pad(r.prompt_mask, p_len, 0, True) for r in parts]),
        torch.cat([pad(r.response_ids, t_len, pad_id, False) for r in parts]),
        torch.cat([pad(r.response_mask, t_len, 0, False) for r in parts]),
        torch.cat([r.truncated for r in parts]),
        [p for r in parts for p in r.prompts],
        [x for r in parts for x in r.responses],
        attention,
        sampler,
        versions,
        vision,
    )
