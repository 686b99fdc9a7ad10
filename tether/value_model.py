"""The critic: V(s_t) for every response position, from a scalar head on a causal-LM backbone.

Initialised from a reward model folder (backbone and head, as InstructGPT does) or from the policy folder
(a new zero head). The value of state s_t = (x, a_<t) is read at the position that predicts a_t.
"""
from __future__ import annotations

import torch
from torch import nn

from tether.reward_model import load_reward_model
from tether.rollout import Rollout


class ValueModel(nn.Module):
    def __init__(self, reward_model):
        super().__init__()
        self.rm = reward_model  # a tether RewardModel: backbone + 'score' head

    def forward(self, rollout: Rollout) -> torch.Tensor:
        inner = self.rm.inner
        input_ids = torch.cat([rollout.prompt_ids, rollout.response_ids], 1)  # (B, P+T)
        attention = torch.cat([rollout.prompt_mask, rollout.response_mask], 1)  # (B, P+T)
        position_ids = (attention.long().cumsum(-1) - 1).clamp(min=0)
        hidden = inner.base_model(input_ids=input_ids, attention_mask=attention, position_ids=position_ids,
                                  use_cache=False).last_hidden_state  # (B, P+T, H)
        t = rollout.response_ids.shape[1]
        states = hidden[:, -(t + 1):-1]  # (B, T, H): position P−1+t is state s_t
        values = self.rm.score_head(states)[..., 0].float()  # (B, T)
        return values * rollout.response_mask

    def save_pretrained(self, folder, **kwargs) -> None:
        self.rm.save_pretrained(folder, **kwargs)


def load_value_model(path, tokenizer, dtype: str = "float32") -> ValueModel:
    rm = load_reward_model(path, tokenizer, None, dtype)
    if len(rm.head_names) != 1:  # a multi-head reward model: keep one head for the value
        raise ValueError(f"critic init from {path}: it has heads {rm.head_names}; use a single-head model or the policy")
    return ValueModel(rm)
