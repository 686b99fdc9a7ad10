"""What a response is sampled from and where it ends: prompt rendering and the one stop set.

One stop set decides, alike for the generator, the response mask, the truncation flag and the metrics, where a
response ends (the generation config's EOS ids, the tokenizer's EOS, the chat template's end-of-turn token).
"""

from __future__ import annotations

import torch

from tether.errors import DataError
from tether.models.chat import has_template, render_chat, template_conversation
from tether.models.lm import end_of_turn_id


def render_prompts(tokenizer, rows: list[dict], where: str) -> list[str]:
    """The text each prompt row is sampled from: a string as it is, chat messages through the chat template."""
    out = []
    for i, row in enumerate(rows):
        prompt = row.get("prompt")
        if isinstance(prompt, list):
            if not has_template(tokenizer):
                raise DataError(
                    f"{where} row {i + 1}: 'prompt' is a list of chat messages, and the tokenizer has no "
                    "chat template to render them (give the prompts as plain strings, or use a model "
                    "folder whose tokenizer_config.json has a chat_template)"
                )
            out.append(render_chat(tokenizer, template_conversation(tokenizer, prompt), generation_prompt=True))
        elif isinstance(prompt, str):
            out.append(prompt)
        else:
            raise DataError(f"{where} row {i + 1}: 'prompt' must be a string or a list of chat messages")
    return out


def stop_token_ids(tokenizer, model=None) -> list[int]:
    """The stop set: the generation config's EOS ids, the tokenizer's EOS and the chat template's end-of-turn token
    (a model whose EOS is not what closes its turns — Mistral's </s> with a ChatML template — stops at either)."""
    ids: list[int] = []
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for value in ([gen_eos] if isinstance(gen_eos, int) else list(gen_eos or [])) + [
        tokenizer.eos_token_id,
        end_of_turn_id(tokenizer),
    ]:
        if value is not None and value not in ids:
            ids.append(int(value))
    if not ids:
        raise ValueError("no EOS token: neither the tokenizer nor the generation config defines one")
    return ids


def response_mask_from_stops(response_ids: torch.Tensor, stop_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(mask (B, T): 1 up to and including the first stop token; truncated (B,): no stop token at all)."""
    is_stop = torch.isin(response_ids, torch.tensor(stop_ids, device=response_ids.device))
    stops_before = torch.cumsum(is_stop.long(), dim=-1) - is_stop.long()  # stop tokens strictly before t
    mask = (stops_before == 0).long()
    truncated = ~is_stop.any(-1)
    return mask, truncated
