"""Sampling with a KV cache that stops computing rows once they have finished.

`decode` is what every rollout and evaluation samples with. Hugging Face's `generate()` (its naive twin, kept as
`model.generate` in `rollout.generate_from_ids(..., compact=False)`) runs every row until the longest one stops:
a row that ended at token 5 of 48 is still fed pad tokens for 43 more forwards. `decode` removes finished rows
from the batch and from the cache, so each step costs what its live rows cost. The tokens are those generate()
draws (tests/test_decoding.py: greedy and per-response seeds give the same tokens on four architectures).
A prompt that stands in several rows (a group's G responses) is prefilled once and its cache copied to its rows.

Sampling is exactly softmax(top-k/top-p(logits / τ)), the distribution the trainers' log-probs are computed at;
a model's generation_config (repetition penalty, forced tokens) is not applied, since the loss would not see it.
"""

from __future__ import annotations

import inspect
from typing import Callable

import torch

# A chooser picks each live row's next token: (logits (b, V), rows (b,) the rows' places in the batch) -> (b,).
Chooser = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

# Compact the batch once this share of its rows has finished: a compaction copies the whole cache, so on a large
# batch (many rows ending one step apart) it waits for several finished rows rather than copying at every one.
COMPACT_SHARE = 1 / 8

# Prefill each distinct prompt once and copy its cache and last logits to the rows that repeat it (a group's G
# responses): the prefill reads U distinct prompts instead of B rows. Off only to test that it changes nothing.
SHARE_PREFILL = True


def sampling_probs(logits: torch.Tensor, temperature: float, top_p: float = 1.0, top_k: int = 0) -> torch.Tensor:
    """(b, V) softmax(top-k/top-p(logits / τ)): the k largest logits (k = 0: all), then the smallest set of the
    largest probabilities whose mass reaches top_p (1: all), renormalised."""
    logits = logits.float() / temperature
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        ordered, order = torch.sort(logits, descending=True, dim=-1)
        probs = torch.softmax(ordered, -1)
        above = probs.cumsum(-1) - probs  # mass strictly above each token: keep the smallest set reaching top_p
        drop = torch.zeros_like(above, dtype=torch.bool).scatter(-1, order, above >= top_p)
        logits = logits.masked_fill(drop, float("-inf"))
    return torch.softmax(logits, -1)


def greedy(logits: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    return logits.argmax(-1)


class Sampler:
    """Draws from sampling_probs: from the global RNG, or with ``generators`` (one per batch row) each row from its
    own, so a response depends on its seed and prompt only, never on which other rows share its batch."""

    def __init__(
        self, temperature: float, top_p: float = 1.0, top_k: int = 0, generators: list[torch.Generator] | None = None
    ):
        self.temperature, self.top_p, self.top_k, self.generators = temperature, top_p, top_k, generators

    def __call__(self, logits: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        return self.draw(logits, rows)[0]

    def draw(self, logits: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens (b,), log p(token) (b,) under the distribution they were drawn from: sampling_probs, in fp32)."""
        probs = sampling_probs(logits, self.temperature, self.top_p, self.top_k)
        if self.generators is None:
            tokens = torch.multinomial(probs, 1).squeeze(1)
        else:
            tokens = torch.cat(
                [torch.multinomial(probs[i], 1, generator=self.generators[r]) for i, r in enumerate(rows.tolist())]
            )
        return tokens, probs.gather(-1, tokens[:, None]).squeeze(1).log()


def seeded_generators(seeds: list[int], device) -> list[torch.Generator]:
    return [torch.Generator(device=device).manual_seed(int(s) % (2**63 - 1)) for s in seeds]


def can_compact(model) -> bool:
    """Whether `decode` can run this model: a transformers model whose forward takes a cache argument and whose
    cache layers can drop batch rows (full and sliding-window attention). Others (remote code, linear-attention
    layers) are sampled by generate()."""
    from transformers.cache_utils import DynamicCache, DynamicLayer, DynamicSlidingWindowLayer

    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # a peft model passes kwargs on
    if cache_keyword(base) is None or getattr(base, "config", None) is None:
        return False
    try:
        layers = DynamicCache(config=base.config).layers
    except Exception:  # noqa: BLE001 - a config the cache cannot read: leave the model to generate()
        return False
    return all(type(layer) in (DynamicLayer, DynamicSlidingWindowLayer) for layer in layers)


def distinct_prompts(input_ids: torch.Tensor, attention: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(the first row of each distinct prompt (U,), each row's prompt among them (B,)) for rows whose tokens and
    mask are equal, in order of first appearance; None when no prompt repeats."""
    keys = list(map(tuple, torch.cat([input_ids, attention.long()], 1).tolist()))
    place: dict[tuple, int] = {}  # each distinct prompt's place among them
    first: list[int] = []  # the row it first stands in
    for row, key in enumerate(keys):
        if key not in place:
            place[key] = len(first)
            first.append(row)
    if len(first) == len(keys):
        return None
    index = [place[key] for key in keys]
    device = input_ids.device
    return torch.tensor(first, device=device), torch.tensor(index, device=device)


def _forward_parameters(model) -> dict:
    return inspect.signature(type(model).forward).parameters


def cache_keyword(model) -> str | None:
    """The name the model's forward takes its KV cache by (and its output returns it by)."""
    params = _forward_parameters(model)
    return next((k for k in ("cache", "past_key_values") if k in params), None)  # transformers renamed it in 5.x


def _prefill(model, base, keyword: str, cache, input_ids: torch.Tensor, mask: torch.Tensor, shown) -> torch.Tensor:
    """The prompts' last-position logits (B, V), their keys and values left in ``cache``: one forward over the
    distinct prompts, each repeated prompt's cache and logits copied to its rows (SHARE_PREFILL)."""
    # pixel tensors are per row: a vision-language model's prompts are prefilled row by row
    shared = distinct_prompts(input_ids, mask) if SHARE_PREFILL and not shown else None
    read = shared[0] if shared is not None else slice(None)
    prefill = dict(
        input_ids=input_ids[read],
        attention_mask=mask[read],
        position_ids=(mask[read].cumsum(-1) - 1).clamp(min=0),
        use_cache=True,
        **{keyword: cache},
        **(shown or {}),
    )
    # the last position's logits only, where the model's forward takes logits_to_keep (else all, the last one read)
    out = model(**prefill, **({"logits_to_keep": 1} if "logits_to_keep" in _forward_parameters(base) else {}))
    logits = out.logits[:, -1]
    if shared is None:
        return logits
    cache.batch_select_indices(shared[1])  # each row takes its prompt's cache and logits
    return logits[shared[1]]


@torch.no_grad()
def decode(
    model,
    input_ids: torch.Tensor,
    attention: torch.Tensor,
    max_new_tokens: int,
    stop_ids: list[int],
    pad_id: int,
    choose: Chooser,
    sampled_logprobs: torch.Tensor | None = None,
    shown: dict | None = None,
) -> torch.Tensor:
    """(B, T) new tokens after left-padded prompts ``input_ids`` / ``attention`` (B, P), right-padded with
    ``pad_id`` after each row's first stop token; T is the longest response (at most max_new_tokens).
    ``sampled_logprobs`` (B, max_new_tokens), with a Sampler as ``choose``: filled in place with each drawn token's
    log-probability under the distribution it was drawn from (the sampler's side of the sampler/trainer gap).
    ``shown``: a vision-language model's pixel tensors of the prompts, given to the prefill (the cache holds what
    they became).

    One prefill forward over the distinct prompts (logits of the last position only; a repeated prompt's cache and
    logits copied to each of its rows, SHARE_PREFILL), then one forward per new token over the rows still live.
    Position ids come from the attention mask (real tokens start at 0), as in generate().
    """
    from transformers.cache_utils import DynamicCache

    batch, device = input_ids.shape[0], input_ids.device
    response = torch.full((batch, max_new_tokens), pad_id, dtype=torch.long, device=device)
    if batch == 0 or max_new_tokens == 0:
        return response[:, :0]
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    cache = DynamicCache(config=base.config)
    keyword = cache_keyword(base)
    stops = torch.tensor(stop_ids, device=device)
    rows = torch.arange(batch, device=device)  # each live row's place in the batch
    live = torch.ones(batch, dtype=torch.bool, device=device)  # among the rows still in the batch
    mask = attention.long()
    next_position = mask.sum(-1)  # (b,) the position id of the token each row is about to read
    logits = _prefill(model, base, keyword, cache, input_ids, mask, shown)
    steps = 0
    for t in range(max_new_tokens):
        if sampled_logprobs is None:
            tokens = choose(logits, rows)  # (b,)
        else:
            tokens, logp = choose.draw(logits, rows)
            sampled_logprobs[rows[live], t] = logp[live].to(sampled_logprobs.dtype)
        response[rows[live], t] = tokens[live]
        steps = t + 1
        live = live & ~torch.isin(tokens, stops)
        if steps == max_new_tokens or not live.any():
            break
        finished = len(rows) - int(live.sum())
        if finished and finished >= COMPACT_SHARE * len(rows):
            keep = live.nonzero().squeeze(1)
            cache.batch_select_indices(keep)
            rows, tokens, mask, next_position, live = (
                rows[keep],
                tokens[keep],
                mask[keep],
                next_position[keep],
                live[keep],
            )
        mask = torch.cat([mask, mask.new_ones((len(rows), 1))], dim=1)
        out = model(
            input_ids=tokens[:, None],
            attention_mask=mask,
            position_ids=next_position[:, None],
            use_cache=True,
            **{keyword: cache},
        )
        logits = out.logits[:, -1]
        next_position = next_position + 1
    return response[:, :steps]
