"""The online core shared by PPO and the GRPO family: sampling rollouts and scoring their tokens.

One stop set decides, alike for the generator, the response mask, the
truncation flag and the metrics, where a response ends. One log-prob function
serves old, reference and current log-probs, always under the sampling
transform (logits / temperature), and asks the model for response logits only.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from tether.algorithms.logprobs import token_logprobs
from tether.decoding import Sampler, can_compact, decode, greedy as greedy_choice, seeded_generators
from tether.packing import pack_sequences


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
        return Rollout(self.prompt_ids[idx], self.prompt_mask[idx], self.response_ids[idx], self.response_mask[idx],
                       self.truncated[idx], [self.prompts[i] for i in pick], [self.responses[i] for i in pick],
                       self.response_attention[idx] if self.response_attention is not None else None)

    def completion_ids(self) -> list[list[int]]:
        """The sampled token ids of each response, up to and including its stop token (what reward functions get)."""
        return [ids[mask.bool()].tolist() for ids, mask in zip(self.response_ids, self.response_mask)]


def render_prompts(tokenizer, rows: list[dict], where: str) -> list[str]:
    """The text each prompt row is sampled from: a string as it is, chat messages through the chat template."""
    from tether.data.records import DataError

    out = []
    for i, row in enumerate(rows):
        prompt = row.get("prompt")
        if isinstance(prompt, list):
            if not getattr(tokenizer, "chat_template", None):
                raise DataError(f"{where} row {i + 1}: 'prompt' is a list of chat messages, and the tokenizer has no "
                                "chat template to render them (give the prompts as plain strings, or use a model "
                                "folder whose tokenizer_config.json has a chat_template)")
            out.append(tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True))
        elif isinstance(prompt, str):
            out.append(prompt)
        else:
            raise DataError(f"{where} row {i + 1}: 'prompt' must be a string or a list of chat messages")
    return out


def end_of_turn_id(tokenizer) -> int | None:
    """The special token the chat template closes an assistant turn with (ChatML's <|im_end|>, Llama 3's <|eot_id|>,
    Gemma's <end_of_turn>), found by rendering a turn; None without a template or when none follows the turn."""
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        return None
    key = (id(tokenizer), str(template), tokenizer.eos_token)
    if key not in _END_OF_TURN:  # once per tokenizer and template: data preparation asks for every conversation
        _END_OF_TURN[key] = _probe_end_of_turn(tokenizer)
    return _END_OF_TURN[key]


_END_OF_TURN: dict = {}


def _probe_end_of_turn(tokenizer) -> int | None:
    marker = "TETHERENDOFTURNPROBE"
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}, {"role": "assistant", "content": marker}],
                                             tokenize=False)
    except Exception:  # noqa: BLE001 - a template with its own rules (roles, system turns): no probe, no extra stop
        return None
    after = text[text.rfind(marker) + len(marker):] if marker in text else ""
    ids = tokenizer(after, add_special_tokens=False)["input_ids"] if after else []
    if not ids:
        return None
    special = set(getattr(tokenizer, "all_special_ids", [])) | set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    return int(ids[0]) if ids[0] in special else None


def stop_token_ids(tokenizer, model=None) -> list[int]:
    """The stop set: the generation config's EOS ids, the tokenizer's EOS and the chat template's end-of-turn token
    (a model whose EOS is not what closes its turns — Mistral's </s> with a ChatML template — stops at either)."""
    ids: list[int] = []
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for value in ([gen_eos] if isinstance(gen_eos, int) else list(gen_eos or [])) + [tokenizer.eos_token_id,
                                                                                      end_of_turn_id(tokenizer)]:
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


def response_seeds(seed: int, positions: list[int], samples: int = 1) -> list[int]:
    """One seed per response: prompt ``positions`` (in the run's prompt stream) × ``samples`` answers each."""
    return [(seed * 1_000_003 + p) * 1009 + j for p in positions for j in range(samples)]


class SeededSampler:
    """generate()'s logits processor for per-response seeds: samples each row's next token from
    softmax(top-k/top-p(logits / τ)) with the row's own generator, and returns scores whose argmax is that token
    (generation then runs greedy): a response depends on its seed and its prompt only, not on the batch it is
    generated in nor on the process — so N processes sample what one does. `decode` draws the same tokens with
    decoding.Sampler; this serves the generate() path (compact=False, or a model decode cannot run)."""

    def __init__(self, seeds: list[int], temperature: float, top_p: float, top_k: int, device):
        self.sampler = Sampler(temperature, top_p, top_k, seeded_generators(seeds, device))

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        picked = self.sampler(scores, torch.arange(scores.shape[0]))
        out = torch.full_like(scores, float("-inf"))
        return out.scatter(-1, picked[:, None], 0.0)


@torch.no_grad()
def generate_rollout(model, tokenizer, prompts: list[str], max_new_tokens: int, temperature: float = 1.0,
                     top_p: float = 1.0, top_k: int = 0, stop_ids: list[int] | None = None,
                     seeds: list[int] | None = None, compact: bool = True) -> Rollout:
    """Sample one response per prompt with the KV cache; prompts are left-padded, positions come from the mask.
    ``seeds`` (one per prompt): each response is drawn with its own generator instead of the global RNG.
    ``compact``: as in generate_from_ids."""
    ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    rollout = generate_from_ids(model, tokenizer, ids, max_new_tokens, temperature, top_p, top_k, stop_ids, seeds,
                                compact=compact)
    rollout.prompts = list(prompts)
    return rollout


def left_pad(contexts: list[list[int]], pad_id: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids (B, P), mask (B, P)): token lists left-padded to the longest."""
    width = max((len(c) for c in contexts), default=0)
    ids = torch.full((len(contexts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(contexts), width), dtype=torch.long)
    for i, c in enumerate(contexts):
        if c:
            ids[i, width - len(c):] = torch.tensor(c, dtype=torch.long)
            mask[i, width - len(c):] = 1
    return ids.to(device), mask.to(device)


@torch.no_grad()
def generate_from_ids(model, tokenizer, contexts: list[list[int]], max_new_tokens: int, temperature: float = 1.0,
                      top_p: float = 1.0, top_k: int = 0, stop_ids: list[int] | None = None,
                      seeds: list[int] | None = None, greedy: bool = False, compact: bool = True) -> Rollout:
    """generate_rollout from token ids (a multi-turn transcript is continued from the exact tokens it holds, never
    a re-tokenisation of its text). ``greedy``: argmax decoding (evaluation only; training rollouts sample).
    ``compact``: sample with decoding.decode, which stops computing finished rows; False (or a model it cannot
    run) uses Hugging Face's generate(), its naive twin."""
    if temperature <= 0 and not greedy:
        raise ValueError("rollouts sample: temperature must be > 0 (the log-probs are computed at that temperature)")
    stop_ids = stop_ids or stop_token_ids(tokenizer, model)
    device = next(model.parameters()).device
    input_ids, attention = left_pad(contexts, tokenizer.pad_token_id, device)
    if seeds is not None and len(seeds) != len(contexts):
        raise ValueError(f"{len(seeds)} seeds for {len(contexts)} prompts")
    was_training = model.training
    model.eval()
    if compact and can_compact(model):
        choose = greedy_choice if greedy else Sampler(temperature, top_p, top_k,
                                                       seeded_generators(seeds, device) if seeds is not None else None)
        response_ids = decode(model, input_ids, attention, max_new_tokens, stop_ids, tokenizer.pad_token_id, choose)
    else:
        response_ids = _hf_generate(model, tokenizer, input_ids, attention, max_new_tokens, temperature, top_p, top_k,
                                    stop_ids, seeds, greedy)
    model.train(was_training)
    mask, truncated = response_mask_from_stops(response_ids, stop_ids)
    response_ids = torch.where(mask.bool(), response_ids, torch.full_like(response_ids, tokenizer.pad_token_id))
    texts = tokenizer.batch_decode(response_ids, skip_special_tokens=True)
    return Rollout(input_ids, attention, response_ids, mask, truncated, [""] * len(contexts), texts)


def _hf_generate(model, tokenizer, input_ids, attention, max_new_tokens, temperature, top_p, top_k, stop_ids, seeds,
                 greedy) -> torch.Tensor:
    """(B, T) new tokens from Hugging Face's generate(): every row runs until the longest stops."""
    if greedy:
        sampling = dict(do_sample=False, temperature=None, top_p=None, top_k=None)
    elif seeds is None:
        sampling = dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=top_k)
    else:
        from transformers import LogitsProcessorList

        sampler = SeededSampler(seeds, temperature, top_p, top_k, input_ids.device)
        sampling = dict(do_sample=False, logits_processor=LogitsProcessorList([sampler]), temperature=None, top_p=None,
                        top_k=None)
    out = model.generate(input_ids=input_ids, attention_mask=attention, **sampling, max_new_tokens=max_new_tokens,
                         eos_token_id=stop_ids, pad_token_id=tokenizer.pad_token_id)
    return out[:, input_ids.shape[1]:]


class GenerationBackend(Protocol):
    """What samples the online stages' responses (docs/scaling.md, "Generation backends"). The stages call
    generate() for every rollout and evaluation, and weights_updated() after each step's optimizer updates; they
    never look inside. A backend returns the sampled token ids right-padded after the stop token, the response
    mask and truncation flags of the one stop set (response_mask_from_stops) and the decoded text; log-probs are
    always recomputed by the trainer's own forward, so a backend's numerics never enter the loss unseen."""

    def generate(self, prompts: list[str], sampling, stop_ids: list[int], seeds: list[int] | None = None) -> Rollout:
        """One response per prompt, sampled with ``sampling``'s max_new_tokens, temperature, top_p and top_k;
        ``seeds``: one per prompt (rollout.response_seeds) or None for the backend's own RNG."""

    def weights_updated(self, policy) -> None:
        """The policy's weights changed: a backend holding its own copy (a vLLM engine) loads them here."""

    def generate_ids(self, contexts: list[list[int]], sampling, stop_ids: list[int], seeds: list[int] | None = None,
                     max_new_tokens: int | None = None, greedy: bool = False) -> Rollout:
        """Continue token-id contexts (multi-turn transcripts, tether/agents); as generate() otherwise.
        ``max_new_tokens`` overrides sampling's; ``greedy``: argmax (evaluation)."""


class HFGenerate:
    """The trained policy itself, sampled with the KV cache (decoding.decode, finished rows dropped; generate()
    when sampling.drop_finished_rows is off): it samples from the weights being trained, so there is nothing to
    copy after an update."""

    def __init__(self, model, tokenizer):
        self.model, self.tokenizer = model, tokenizer

    def generate(self, prompts: list[str], sampling, stop_ids: list[int], seeds: list[int] | None = None) -> Rollout:
        size = getattr(sampling, "generation_batch", 0) or len(prompts)
        parts = [generate_rollout(self.model, self.tokenizer, prompts[i : i + size], sampling.max_new_tokens,
                                  sampling.temperature, sampling.top_p, sampling.top_k, stop_ids,
                                  seeds=seeds[i : i + size] if seeds is not None else None,
                                  compact=getattr(sampling, "drop_finished_rows", True))
                 for i in range(0, len(prompts), size)]
        return concat_rollouts(parts, self.tokenizer.pad_token_id)

    def generate_ids(self, contexts: list[list[int]], sampling, stop_ids: list[int], seeds: list[int] | None = None,
                     max_new_tokens: int | None = None, greedy: bool = False) -> Rollout:
        size = getattr(sampling, "generation_batch", 0) or len(contexts)
        parts = [generate_from_ids(self.model, self.tokenizer, contexts[i : i + size],
                                   max_new_tokens or sampling.max_new_tokens, sampling.temperature, sampling.top_p,
                                   sampling.top_k, stop_ids, seeds[i : i + size] if seeds is not None else None,
                                   greedy=greedy, compact=getattr(sampling, "drop_finished_rows", True))
                 for i in range(0, len(contexts), size)]
        return concat_rollouts(parts, self.tokenizer.pad_token_id)

    def weights_updated(self, policy) -> None:
        pass


def _forward_response(model, rollout: Rollout, with_hidden: bool = False, padding_free: bool = False):
    """(logits (B, T, V), last hidden states (B, T, H) or None) at the positions that predict response tokens.

    Prompt logits are never computed (logits_to_keep); position P−1+t predicts response token t. With
    ``padding_free`` the rows' tokens are laid end to end (``_forward_packed``) wherever the rollout allows it.
    """
    if padding_free:
        layout = _packed_layout(rollout)
        if layout is not None:
            return _forward_packed(model, rollout, layout, with_hidden)
    input_ids = torch.cat([rollout.prompt_ids, rollout.response_ids], dim=1)  # (B, P+T)
    attention = torch.cat([rollout.prompt_mask, rollout.attention], dim=1)  # (B, P+T)
    position_ids = (attention.long().cumsum(-1) - 1).clamp(min=0)  # left padding: real tokens start at 0
    t = rollout.response_ids.shape[1]
    kwargs = dict(input_ids=input_ids, attention_mask=attention, position_ids=position_ids, use_cache=False,
                  output_hidden_states=with_hidden)
    try:
        out = model(**kwargs, logits_to_keep=t + 1)
    except TypeError:  # a model without logits_to_keep: compute all, keep the tail
        out = model(**kwargs)
    hidden = out.hidden_states[-1][:, -(t + 1):-1] if with_hidden else None  # final (normed) layer output
    return out.logits[:, -(t + 1):-1], hidden


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
    if (not torch.equal(prompt_run, rollout.prompt_mask) or not torch.equal(response_run, rollout.attention)
            or bool((scored & ~response_run.bool()).any()) or bool((scored.any(-1) & (prompt_len == 0)).any())):
        return None
    return prompt_len.cpu(), response_len.cpu()


class _PackedRollout:
    """A rollout's rows laid end to end (tether/packing.py): each row's prompt and attended response as one
    sequence, position ids restarting per sequence, so each sequence attends only to itself and gets the states
    and logits it gets alone. ``keep`` (R, W) marks the positions that predict a response-mask token."""

    def __init__(self, rollout: Rollout, layout):
        prompt_len, response_len = layout
        p = rollout.prompt_ids.shape[1]
        prompt_ids, response_ids = rollout.prompt_ids.cpu(), rollout.response_ids.cpu()
        sequences = [prompt_ids[b, p - int(prompt_len[b]):].tolist() + response_ids[b, : int(response_len[b])].tolist()
                     for b in range(len(prompt_len))]
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


def _forward_packed(model, rollout: Rollout, layout, with_hidden: bool):
    """``_forward_response`` on padding-free rows. Only the positions that predict a response-mask token go through
    the LM head (a boolean ``logits_to_keep``); the results are scattered back into the rollout's (B, T) layout."""
    packed = _PackedRollout(rollout, layout)
    kwargs = dict(**packed.inputs, use_cache=False, output_hidden_states=with_hidden)
    try:
        out = model(**kwargs, logits_to_keep=packed.keep)
        logits = out.logits if out.logits.dim() == 2 and out.logits.shape[0] == packed.kept else None
    except (TypeError, IndexError):
        logits = None
    if logits is None:  # no boolean logits_to_keep (an older or a remote-code model): every position's logits
        out = model(**kwargs)
        logits = out.logits[packed.keep]
    hidden = packed.scatter(out.hidden_states[-1][packed.keep]) if with_hidden else None  # final (normed) layer
    return packed.scatter(logits), hidden


def response_states(backbone, rollout: Rollout, padding_free: bool = False) -> torch.Tensor:
    """(B, T, H) last hidden states of a causal-LM backbone (no LM head) at the positions that predict response
    tokens: state s_t of the critic. 0 where nothing is scored when ``padding_free`` lays the rows end to end."""
    layout = _packed_layout(rollout) if padding_free else None
    if layout is not None:
        packed = _PackedRollout(rollout, layout)
        return packed.scatter(backbone(**packed.inputs, use_cache=False).last_hidden_state[packed.keep])
    input_ids = torch.cat([rollout.prompt_ids, rollout.response_ids], 1)  # (B, P+T)
    attention = torch.cat([rollout.prompt_mask, rollout.attention], 1)  # (B, P+T)
    position_ids = (attention.long().cumsum(-1) - 1).clamp(min=0)
    hidden = backbone(input_ids=input_ids, attention_mask=attention, position_ids=position_ids,
                      use_cache=False).last_hidden_state  # (B, P+T, H)
    t = rollout.response_ids.shape[1]
    return hidden[:, -(t + 1):-1]  # position P−1+t is state s_t


def _entropy(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    entropy = torch.empty(logits.shape[:2], dtype=torch.float32, device=logits.device)
    for start in range(0, logits.shape[0], 8):  # chunked like token_logprobs: never a full (B, T, V) float copy
        rows = logits[start : start + 8].float() / temperature
        logp = torch.log_softmax(rows, -1)
        entropy[start : start + 8] = -(logp.exp() * logp).sum(-1)
    return entropy


def response_logprobs(model, rollout: Rollout, temperature: float, with_entropy: bool = False,
                      padding_free: bool = False):
    """log π(a_t | s_t) of the response tokens under the sampling transform; (B, T), 0 on padding.

    With with_entropy, also the per-token entropy of π(· | s_t) at that temperature, (B, T). ``padding_free``:
    one forward of the rows laid end to end (the same values; tests/test_packing.py).
    """
    logits, _ = _forward_response(model, rollout, padding_free=padding_free)
    logprobs = token_logprobs(logits, rollout.response_ids, temperature) * rollout.response_mask
    if not with_entropy:
        return logprobs
    return logprobs, _entropy(logits, temperature) * rollout.response_mask


def response_logprobs_and_values(model, value_head, rollout: Rollout, temperature: float, padding_free: bool = False):
    """One forward of a policy whose backbone also carries the critic (a value head on the last hidden state).

    Returns (log-probs (B, T), entropy (B, T), values V(s_t) (B, T)), all 0 on padding.
    """
    logits, hidden = _forward_response(model, rollout, with_hidden=True, padding_free=padding_free)
    mask = rollout.response_mask
    logprobs = token_logprobs(logits, rollout.response_ids, temperature) * mask
    values = value_head(hidden.to(value_head.weight.dtype))[..., 0].float() * mask
    return logprobs, _entropy(logits, temperature) * mask, values


def reference_logprobs(reference, policy, rollout: Rollout, temperature: float, padding_free: bool = False) -> torch.Tensor:
    """Reference log-probs: from the frozen copy, or (LoRA, reference None) from the policy with its adapter off."""
    if reference is not None:
        return response_logprobs(reference, rollout, temperature, padding_free=padding_free)
    with policy.disable_adapter():
        return response_logprobs(policy, rollout, temperature, padding_free=padding_free)


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
    return Rollout(torch.cat([pad(r.prompt_ids, p_len, pad_id, True) for r in parts]),
                   torch.cat([pad(r.prompt_mask, p_len, 0, True) for r in parts]),
                   torch.cat([pad(r.response_ids, t_len, pad_id, False) for r in parts]),
                   torch.cat([pad(r.response_mask, t_len, 0, False) for r in parts]),
                   torch.cat([r.truncated for r in parts]), [p for r in parts for p in r.prompts],
                   [x for r in parts for x in r.responses], attention)


def step_end_tokens(tokenizer, ids: list[int], text_ends: list[int]) -> list[int]:
    """Map character offsets in the decoded response to the index of the token that completes each of them.

    The response text is decoded prefix by prefix (one batch call), so the mapping follows the sampled tokens
    exactly, whatever the tokenizer would have produced for the text. Offsets past the end map to the last token.
    """
    if not ids:
        return [0 for _ in text_ends]
    prefix_lengths = [len(t) for t in tokenizer.batch_decode([ids[: k + 1] for k in range(len(ids))],
                                                             skip_special_tokens=True)]
    out = []
    for end in text_ends:
        k = next((i for i, n in enumerate(prefix_lengths) if n >= end), len(ids) - 1)
        out.append(k)
    return out
