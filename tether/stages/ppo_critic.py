"""The critic: V(s_t) for every response position, from a scalar head on a causal-LM backbone.

Initialised from a reward model folder (backbone and head, as InstructGPT does) or from the policy folder
(a new zero head). The value of state s_t = (x, a_<t) is read at the position that predicts a_t.
"""

from __future__ import annotations

import torch
from torch import nn

from tether.algorithms.logprobs import at_least_float32, compute_dtype
from tether.models.reward import load_reward_model
from tether.models.work import phase
from tether.rollout.batch import Rollout
from tether.rollout.forward import response_states


class ValueModel(nn.Module):
    def __init__(self, reward_model):
        super().__init__()
        self.rm = reward_model  # a tether RewardModel: backbone + 'score' head

    def forward(self, rollout: Rollout, padding_free: bool = False, share_prompt: bool = False) -> torch.Tensor:
        with phase("critic"):  # (B, T, H): state s_t
            states = response_states(self.rm.inner.base_model, rollout, padding_free, share_prompt)
        values = at_least_float32(self.rm.score_head(states)[..., 0])  # (B, T)
        return values * rollout.response_mask

    def save_pretrained(self, folder, **kwargs) -> None:
        self.rm.save_pretrained(folder, **kwargs)


def load_value_model(path, tokenizer, dtype: str = "float32") -> ValueModel:
    rm = load_reward_model(path, tokenizer, None, dtype)
    if len(rm.head_names) != 1:  # a multi-head reward model: keep one head for the value
        raise ValueError(
            f"critic init from {path}: it has heads {rm.head_names}; use a single-head model or the policy"
        )
    return ValueModel(rm)


class SharedValueHead(nn.Module):
    """The critic as a linear head on the policy's own last hidden state (one backbone for actor and critic).

    The head starts at zero (V = 0 everywhere); the value loss trains it and, through value_loss_coef, the
    shared backbone. Only the head is saved (critic/value_head.safetensors): the backbone is the policy.
    """

    def __init__(self, policy, hidden_size: int):
        super().__init__()
        # fp32 under a bf16 or fp32 policy, fp64 under a float64 one (the values keep the policy's precision)
        self.head = nn.Linear(hidden_size, 1, dtype=compute_dtype(next(policy.parameters())))
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)
        object.__setattr__(self, "policy", policy)  # not a submodule: the policy's weights stay out of this module

    def forward(self, rollout: Rollout, padding_free: bool = False, share_prompt: bool = False) -> torch.Tensor:
        from tether.rollout.forward import response_logprobs_and_values

        return response_logprobs_and_values(self.policy, self.head, rollout, 1.0, padding_free, share_prompt)[2]

    def save_pretrained(self, folder, **kwargs) -> None:
        from pathlib import Path

        from safetensors.torch import save_file

        Path(folder).mkdir(parents=True, exist_ok=True)
        save_file(
            {k: v.contiguous() for k, v in self.head.state_dict().items()}, str(Path(folder) / "value_head.safetensors")
        )

    @classmethod
    def load(cls, policy, folder) -> "SharedValueHead":
        from pathlib import Path

        config = getattr(policy, "config", None) or policy.get_base_model().config
        head = cls(policy, config.get_text_config().hidden_size)  # a vision-language model: its language model's
        if folder is not None:
            from safetensors.torch import load_file

            head.head.load_state_dict(load_file(str(Path(folder) / "value_head.safetensors")))
        return head
