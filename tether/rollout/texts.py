"""Text from token ids and back: batched generation of plain completions (demos and evaluation; RL rollouts are
Rollout records, rollout/backends.py), and where each step of a decoded response ends in its tokens."""

from __future__ import annotations

import torch

from tether.rollout.decoding import Sampler, can_compact, decode, greedy


@torch.no_grad()
def generate_texts(
    model,
    tokenizer,
    prompts: list[str],
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    batch_size: int = 32,
    seed: int = 0,
) -> list[str]:
    """Completions of ``prompts`` (greedy when temperature is 0), stopping at EOS.

    Prompts are left-padded so every row's last prompt token sits at the same
    position and the new tokens follow it directly; position ids come from the
    attention mask. Sampled by decoding.decode (finished rows stop computing),
    or by generate() for a model it cannot run.
    """
    model.eval()
    device = next(model.parameters()).device
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    generator_state = torch.get_rng_state()
    torch.manual_seed(seed)
    outputs: list[str] = []
    compact = can_compact(model)
    if temperature > 0:
        # Explicit top_k (0 = off) and top_p: a model's generation_config.json may set its own defaults.
        sampling = dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=top_k)
    else:
        sampling = dict(do_sample=False, temperature=None, top_p=None, top_k=None)
    try:
        for start in range(0, len(prompts), batch_size):
            enc = tokenizer(
                prompts[start : start + batch_size], return_tensors="pt", padding=True, add_special_tokens=False
            ).to(device)
            if compact:
                new_tokens = decode(
                    model,
                    enc["input_ids"],
                    enc["attention_mask"],
                    max_new_tokens,
                    [tokenizer.eos_token_id],
                    tokenizer.pad_token_id,
                    Sampler(temperature, top_p, top_k) if temperature > 0 else greedy,
                )
            else:
                out = model.generate(
                    **enc,
                    **sampling,
                    max_new_tokens=max_new_tokens,
                    pad_token_id=tokenizer.pad_token_id,
                    eos_token_id=tokenizer.eos_token_id,
                )
                new_tokens = out[:, enc["input_ids"].shape[1] :]
            outputs += tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
    finally:
        tokenizer.padding_side = side
        torch.set_rng_state(generator_state)
    return outputs


def step_end_tokens(tokenizer, ids: list[int], text_ends: list[int]) -> list[int]:
    """Map character offsets in the decoded response to the index of the token that completes each of them.

    The response text is decoded prefix by prefix (one batch call), so the mapping follows the sampled tokens
    exactly, whatever the tokenizer would have produced for the text. Offsets past the end map to the last token.
    """
    if not ids:
        return [0 for _ in text_ends]
    prefix_lengths = [
        len(t) for t in tokenizer.batch_decode([ids[: k + 1] for k in range(len(ids))], skip_special_tokens=True)
    ]
    out = []
    for end in text_ends:
        k = next((i for i, n in enumerate(prefix_lengths) if n >= end), len(ids) - 1)
        out.append(k)
    return out
