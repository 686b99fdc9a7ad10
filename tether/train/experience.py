"""The records every online stage shares: one step's experience, and one sampled response as samples.jsonl stores
it (the monitors and the report read those rows; docs/monitors.md)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from tether.algorithms.mismatch import importance_statistics, importance_weights, sampler_mismatch
from tether.data.multimodal import sample_images
from tether.rewards.score import Scores
from tether.rollout.batch import Rollout


@dataclass
class SampleRecord:
    """One sampled response in samples.jsonl."""

    step: int  # the optimizer step whose metrics row it belongs to
    prompt: str
    response: str
    score: float  # the total the update used (online DPO: the answer's score, or its side of the verdict)
    parts: dict  # component -> raw value
    length: int  # response tokens, EOS included
    truncated: bool
    group: int | None = None  # which prompt of the step (group family)
    step_scores: list | None = None  # the process reward's weighted step scores
    advantage: float | None = None  # mean token advantage over the response
    kl: float | None = None  # sequence KL to the reference (Σ_t kl_t)
    agent: dict | None = None  # an agent episode: turns, tool calls, how it ended, success, claimed, final answer
    images: list | None = None  # the prompt's images: paths, or thumbnails of inline ones (data/images.py)

    def as_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass
class Experience:
    """One step's sampled responses and what was computed from them. B rows, T response positions."""

    rollout: Rollout
    rows: list[dict]  # (B,) the prompt file's row of each response
    scores: Scores
    old_logprobs: torch.Tensor | None = None  # (B, T) at sampling time; None when the ratio is exactly 1
    ref_logprobs: torch.Tensor | None = None  # (B, T) under the reference; None when nothing needs them
    values: torch.Tensor | None = None  # (B, T) critic values at rollout time (PPO)
    kl: torch.Tensor | None = None  # (B, T) per-token KL estimate to the reference, 0 on padding
    advantages: torch.Tensor | None = None  # (B, T), 0 on padding
    returns: torch.Tensor | None = None  # (B, T) (PPO)
    sampler_gap: dict | None = None  # a backend that is not the trainer: mismatch.sampler_mismatch's figures
    is_weights: torch.Tensor | None = None  # (B, T) importance weights (rollout.off_policy_correction), 0 on padding
    is_statistics: dict | None = None  # mismatch.importance_statistics of is_weights

    def measure_sampler(self, train_logprobs: torch.Tensor, rollout_cfg, weights: torch.Tensor | None = None) -> None:
        """With the sampler's own log-probs in the rollout (a vLLM backend, a bf16 sampler): the gap to the trainer's
        log-probs at sampling time (``train_logprobs`` (B, T)), and under rollout.off_policy_correction the importance
        weights (computed here, or the ``weights`` the update already applied) and what they did (docs/algorithms.md
        §11). Nothing without them (the hf backend samples with the trained weights)."""
        r = self.rollout
        if r.sampler_logprobs is None:
            return
        self.sampler_gap = sampler_mismatch(train_logprobs, r.sampler_logprobs, r.response_mask)
        if rollout_cfg.off_policy_correction:
            if weights is None:
                weights = correction_weights(train_logprobs, r.sampler_logprobs, r.response_mask, rollout_cfg)
            self.is_weights = weights
            self.is_statistics = importance_statistics(train_logprobs, r.sampler_logprobs, r.response_mask, weights)

    def samples(self, step: int, group_size: int | None = None) -> list[SampleRecord]:
        r = self.rollout
        mask = r.response_mask.float()
        seq_adv = (self.advantages * mask).sum(-1) / mask.sum(-1).clamp(min=1) if self.advantages is not None else None
        return [
            SampleRecord(
                step,
                r.prompts[i],
                r.responses[i],
                float(self.scores.total[i]),
                {k: float(v[i]) for k, v in self.scores.parts.items()},
                int(r.lengths[i]),
                bool(r.truncated[i]),
                group=i // group_size if group_size else None,
                step_scores=self.scores.step_scores[i] if self.scores.step_scores is not None else None,
                advantage=float(seq_adv[i]) if seq_adv is not None else None,
                kl=float(self.kl[i].sum()) if self.kl is not None else None,
                agent=self.scores.records[i] if self.scores.records is not None else None,
                images=sample_images(self.rows[i]),
            )
            for i in range(len(r.responses))
        ]


def correction_weights(
    train_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor, rollout_cfg
) -> torch.Tensor:
    """mismatch.importance_weights under the rollout section's rule and bounds (an unset bound: none)."""
    high = rollout_cfg.is_ratio_max or float("inf")
    return importance_weights(
        train_logprobs, sampler_logprobs, mask, rollout_cfg.off_policy_correction, rollout_cfg.is_ratio_min, high
    )


def stats(area: str, x: torch.Tensor) -> dict:
    """{area/mean, area/std, area/min, area/max} of a 1-D tensor (empty: nothing)."""
    if x.numel() == 0:
        return {}
    return {
        f"{area}/mean": float(x.mean()),
        f"{area}/std": float(x.std(unbiased=False)),
        f"{area}/min": float(x.min()),
        f"{area}/max": float(x.max()),
    }


def rollout_metrics(exp: Experience) -> dict:
    """What every online stage logs about its sampled responses and their scores (docs/metrics.md)."""
    r, s = exp.rollout, exp.scores
    lengths = r.lengths.float()
    done = ~r.truncated
    out = {
        "score/mean": float(s.total.mean()),
        "score/std": float(s.total.std(unbiased=False)),
        "rollout/length_mean": float(lengths.mean()),
        "rollout/terminated_length_mean": float(lengths[done].mean()) if done.any() else 0.0,
        "rollout/truncated_frac": float(r.truncated.float().mean()),
    }
    for name, v in s.parts.items():
        out[f"reward/{name}/mean"], out[f"reward/{name}/std"] = float(v.mean()), float(v.std(unbiased=False))
    if exp.sampler_gap is not None:
        out["rollout/sampler_logprob_diff_mean"] = exp.sampler_gap["abs_mean"]
        out["rollout/sampler_logprob_diff_max"] = exp.sampler_gap["abs_max"]
        out["rollout/sampler_kl"] = exp.sampler_gap["kl"]
    if exp.is_weights is not None:
        w = exp.is_weights[r.response_mask.bool()]
        out["rollout/is_weight_mean"] = float(w.mean()) if w.numel() else 1.0
        out.update({f"rollout/is_{name}": value for name, value in exp.is_statistics.items()})
    if s.records is not None:
        from tether.agents.metrics import agent_metrics

        out.update(agent_metrics(s.records))
    return out
