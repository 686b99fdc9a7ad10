"""Checks a loaded model must pass before tether relies on it: whether packed sequences stay apart, and whether a
response laid after a shared prompt sees only that prompt."""

from __future__ import annotations

import torch

from tether.errors import ConfigError
from tether.models.lm import compute_dtype
from tether.models.packing import (
    head_sees_only,
    lm_head,
    model_inputs,
    pack_sequences,
    pack_shared_prompts,
    score_inputs,
    tree_attention_mask,
)
from tether.models.reward import RewardModel


def _in_eval_mode(model, forwards):
    """forwards() with ``model`` in eval mode (no dropout), its mode restored after."""
    was_training = model.training
    model.eval()
    try:
        return forwards()
    finally:
        model.train(was_training)


def _differ(got: torch.Tensor, alone: torch.Tensor, model) -> bool:
    """Whether the same tokens' outputs in a layout and alone differ by more than rounding. The two run the same
    arithmetic on differently shaped tensors: ~1e-7 of the outputs' scale in fp32 (eager attention's softmax runs in
    float32 whatever the dtype), but bf16 (weights or autocast) keeps 8 bits, ~4e-3 a rounding, compounded over the
    layers; a sequence that sees a neighbour it should not is off by the outputs' own scale."""
    got, alone = got.float(), alone.float()
    tolerance = (1e-4 if compute_dtype(model) == torch.float32 else 5e-2) * (1 + float(alone.abs().max()))
    return float((got - alone).abs().max()) > tolerance


@torch.no_grad()
def check_position_restarts(model, where: str) -> None:
    """Raise a ConfigError naming ``where`` (the model path) when ``model`` (a causal LM or tether's RewardModel)
    lets a packed sequence attend to the one before it, e.g. a remote-code attention that ignores position-id
    restarts: packed rows would then train on wrong log-probs without any error. Three tiny forwards."""
    config = (model.inner if isinstance(model, RewardModel) else model).config
    vocab = getattr(config, "vocab_size", None) or 16
    first, second = [(3 + i) % vocab for i in range(5)], [(11 + i) % vocab for i in range(3)]
    batch = pack_sequences([first, second], pad_id=0)
    device = next(model.parameters()).device
    batch = {k: v.to(device) for k, v in batch.items()}
    alone_ids = torch.tensor([second], device=device)

    def forwards():
        if isinstance(model, RewardModel):
            return model(**score_inputs(batch))[1], model(alone_ids, torch.ones_like(alone_ids))[0]
        logits = model(**model_inputs(batch), use_cache=False).logits.reshape(-1, config.vocab_size)
        last = int(batch["last_index"][1])
        return logits[last - 2 : last + 1], model(input_ids=alone_ids, use_cache=False).logits[0]

    if _differ(*_in_eval_mode(model, forwards), model):
        raise ConfigError(
            f"{where}: this model lets a sequence packed after another attend to it (its attention "
            "ignores position-id restarts), so padding-free micro-batches would be wrong for it: "
            "pass --no-padding-free (padded rows)"
        )


@torch.no_grad()
def check_prompt_sharing(model, where: str) -> None:
    """Raise a ConfigError naming ``where`` when ``model`` (a causal LM, or a backbone: its last hidden states are
    compared) does not give a response laid after a shared prompt (packing.pack_shared_prompts: a 4-D mask and
    continued position ids) the logits it gets in a row of its own, e.g. a remote-code attention that ignores the
    mask. Three tiny forwards."""
    vocab = getattr(model.config, "vocab_size", None) or 16
    prompt = [(3 + i) % vocab for i in range(4)]
    first, second = prompt + [(11 + i) % vocab for i in range(3)], prompt + [(7 + i) % vocab for i in range(2)]
    batch = pack_shared_prompts([[first, second]], [[[1] * len(first), [1] * len(second)]], 0, 2)
    device = next(model.parameters()).device
    inputs = {"input_ids": batch["input_ids"].to(device), "position_ids": batch["position_ids"].to(device)}
    inputs["attention_mask"] = tree_attention_mask(model, batch["tree_mask"].to(device))
    read = lambda out: out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state

    def forwards():
        shared = read(model(**inputs, use_cache=False))[0, -len(second) + len(prompt) :]
        return shared, read(model(input_ids=torch.tensor([second], device=device), use_cache=False))[0, len(prompt) :]

    if _differ(*_in_eval_mode(model, forwards), model):
        raise ConfigError(
            f"{where}: this model does not give a response laid after a shared prompt the log-probs it gets alone "
            "(its attention ignores a 4-D attention mask), so shared-prompt micro-batches would be wrong for it: "
            "pass --no-share-prompt"
        )


@torch.no_grad()
def check_chunked_head(model, where: str, vision: bool = False) -> None:
    """Raise a ConfigError naming ``where`` unless ``model``'s logits are its LM head's plain linear map of the last
    hidden states, as ``--chunked-head`` assumes when it applies the head's weight itself (packing.selected_logprobs):
    a head module that is a ``torch.nn.Linear`` (not an adapter's wrapper or a quantised layer) and no work after it
    (a soft cap, a scale), compared on one tiny forward. Not a vision-language model (``vision``): tether masks its
    image placeholder's logit after the head (models/vision.py)."""
    if vision:
        raise ConfigError(f"{where}: --chunked-head is not built for a vision-language model (its logits are edited)")

    head = lm_head(model)
    if type(head) is not torch.nn.Linear:
        kind = "names no output embeddings" if head is None else f"has a {type(head).__name__} as its LM head"
        raise ConfigError(f"{where}: --chunked-head applies a plain linear head itself; this model {kind}")
    inner = getattr(model, "module", model)
    config = getattr(inner.config, "text_config", None) or inner.config
    # the transforms transformers' models apply after their heads (Gemma's soft cap, Cohere's and Granite's scales):
    # named, since on a small random model a soft cap moves the logits by less than a comparison could tell
    after = {k: getattr(config, k, None) for k in ("final_logit_softcapping", "logit_scale", "logits_scaling")}
    after = {k: v for k, v in after.items() if v is not None and v != 1.0}
    if after:
        raise ConfigError(
            f"{where}: this model transforms its logits after the LM head ({after}), which --chunked-head would "
            "leave out: leave --chunked-head off"
        )
    vocab = getattr(config, "vocab_size", None) or 16
    ids = torch.tensor([[(3 + i) % vocab for i in range(5)]], device=head.weight.device)
    with head_sees_only(model, lambda hidden: hidden) as captured:
        logits = _in_eval_mode(model, lambda: model(input_ids=ids, use_cache=False).logits)
    if "hidden" not in captured:
        raise ConfigError(f"{where}: --chunked-head: this model's forward does not call its output embeddings")
    own = torch.nn.functional.linear(captured["hidden"], head.weight, head.bias)
    if _differ(own, logits, inner):
        raise ConfigError(
            f"{where}: this model changes its logits after the LM head (a soft cap or a scale), which --chunked-head "
            "would leave out: leave --chunked-head off"
        )
