"""Sampling that drops finished rows (tether/rollout/decoding.py): the same tokens as generate() on four architectures and
a LoRA model, the rows each forward computes counted by hand, a repeated prompt prefilled once, and the sampling
distribution."""

from __future__ import annotations

import pytest
import torch
from conftest import BF16_REFUSED, bf16_refused_here

from tether.models.lm import build_tiny_model, load_model, load_tokenizer
from tether.rollout import decoding
from tether.rollout.backends import generate_from_ids, response_seeds
from tether.rollout.decoding import Sampler, can_compact

ARCHS = ("gpt2", "llama", "qwen2", "mistral")
PROMPTS = ["What is 1 + 2?\n", "Tell me about cats.", "hi", "hello there", "cats", "12 + 7 = 19"] * 3
STOPS = list(range(5, 40))  # a random model stops at one of these about one token in ten: rows end far apart


@pytest.fixture(scope="module")
def arch_models(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("decoding")
    out = {}
    for arch in ARCHS:
        folder = build_tiny_model(arch, tokenizer, root / arch, seed=0, hidden=32, layers=2, heads=2, max_positions=128)
        tok = load_tokenizer(folder)
        out[arch] = (load_model(folder, tok), tok)
    return out


def contexts(tok) -> list[list[int]]:
    return [tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]


SAMPLINGS = {
    "greedy": dict(greedy=True),
    "seeded": dict(seeds=response_seeds(0, range(len(PROMPTS))), temperature=0.9, top_p=0.95, top_k=40),
}


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("sampling", list(SAMPLINGS))
def test_decode_draws_the_tokens_generate_draws(arch_models, arch, sampling):
    model, tok = arch_models[arch]
    kw = SAMPLINGS[sampling]
    compact = generate_from_ids(model, tok, contexts(tok), 20, stop_ids=STOPS, compact=True, **kw)
    padded = generate_from_ids(model, tok, contexts(tok), 20, stop_ids=STOPS, compact=False, **kw)
    assert can_compact(model)
    assert torch.equal(compact.response_ids, padded.response_ids)  # same width too: the longest response
    assert torch.equal(compact.response_mask, padded.response_mask) and torch.equal(compact.truncated, padded.truncated)
    assert compact.responses == padded.responses
    assert len(set(compact.lengths.tolist())) >= 2  # rows did finish at different steps


def test_a_lora_model_decodes_as_generate_does(arch_models):
    from peft import LoraConfig, get_peft_model

    model, tok = arch_models["llama"]
    lora = get_peft_model(
        load_model(model.name_or_path, tok), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    )
    kw = SAMPLINGS["seeded"]
    assert can_compact(lora)
    a = generate_from_ids(lora, tok, contexts(tok), 16, stop_ids=STOPS, compact=True, **kw)
    b = generate_from_ids(lora, tok, contexts(tok), 16, stop_ids=STOPS, compact=False, **kw)
    assert torch.equal(a.response_ids, b.response_ids)


def rows_per_forward(model, tok, monkeypatch, share: float) -> tuple[list[int], list[int]]:
    """(each forward's batch rows, the live rows it needs: #{rows: response longer than k} for forward k ≥ 1, the 6
    distinct prompts of the 18 rows for the prefill), sampling PROMPTS with COMPACT_SHARE = ``share``."""
    monkeypatch.setattr(decoding, "COMPACT_SHARE", share)
    rows: list[int] = []
    forward = model.forward
    monkeypatch.setattr(model, "forward", lambda *a, **k: rows.append(k["input_ids"].shape[0]) or forward(*a, **k))
    lengths = generate_from_ids(model, tok, contexts(tok), 20, stop_ids=STOPS, **SAMPLINGS["seeded"]).lengths.tolist()
    return rows, [len(set(PROMPTS))] + [sum(n > k for n in lengths) for k in range(1, max(lengths))]


def test_each_forward_computes_only_the_live_rows(arch_models, monkeypatch):
    """Compacting at every finished row: forward k ≥ 1 reads token k − 1 of the rows whose responses are longer
    than k tokens, so its batch is exactly those rows; the prefill reads each distinct prompt once."""
    rows, live = rows_per_forward(*arch_models["llama"], monkeypatch, 0.0)
    assert rows == live
    assert sum(live[1:]) < len(PROMPTS) * (len(live) - 1)  # generate() computes every row at every step


def test_compaction_waits_for_a_share_of_finished_rows(arch_models, monkeypatch):
    """With COMPACT_SHARE = 1/2, the batch shrinks only once half of its rows have finished: every forward's batch
    lies between the live rows and twice as many, and it shrinks at least once."""
    rows, live = rows_per_forward(*arch_models["llama"], monkeypatch, 0.5)
    assert all(n <= r < 2 * n or r == live[0] for r, n in zip(rows, live))
    assert len(rows) == len(live) and min(rows[1:]) < len(PROMPTS)


@pytest.mark.parametrize("arch", ("llama", "qwen2"))
def test_a_repeated_prompt_is_prefilled_once_and_samples_as_if_every_row_were(arch_models, monkeypatch, arch):
    """Each of the 6 prompts stands in 3 of the 18 rows: the prefill reads the 6 (6 × P positions, not 18 × P) and
    copies each one's cache and logits to its rows, so the tokens and each token's sampled log-prob are those of
    prefilling all 18 rows (SHARE_PREFILL off). In float64 the only difference is the summation order of a
    prefill over 6 rows against 18, far below the 1e-9 allowed (each log-prob sums a few hundred products of
    magnitude < 10 at ε = 2.2e-16)."""
    model, tok = arch_models[arch]
    model64 = load_model(model.name_or_path, tok, dtype="float64")
    prefill_rows = []
    forward = model64.forward

    def counted(*a, **k):
        if k.get("position_ids") is not None and k["input_ids"].shape[1] > 1:
            prefill_rows.append(tuple(k["input_ids"].shape))
        return forward(*a, **k)

    monkeypatch.setattr(model64, "forward", counted)
    kw = dict(stop_ids=STOPS, compact=True, sampler_logprobs=True, **SAMPLINGS["seeded"])
    shared = generate_from_ids(model64, tok, contexts(tok), 20, **kw)
    monkeypatch.setattr(decoding, "SHARE_PREFILL", False)
    every_row = generate_from_ids(model64, tok, contexts(tok), 20, **kw)
    width = max(len(c) for c in contexts(tok))
    assert prefill_rows == [(len(set(PROMPTS)), width), (len(PROMPTS), width)]
    assert torch.equal(shared.response_ids, every_row.response_ids) and len(set(shared.lengths.tolist())) >= 2
    assert torch.allclose(shared.sampler_logprobs, every_row.sampler_logprobs, rtol=0, atol=1e-9)


def test_distinct_prompts_by_hand():
    """Rows equal in tokens and mask share a prompt (in order of first appearance); a row equal in tokens but
    not in mask is another prompt; no repeat: None."""
    ids = torch.tensor([[0, 5, 6], [7, 8, 9], [0, 5, 6], [0, 5, 6], [7, 8, 9]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 1], [0, 1, 1], [1, 1, 1], [1, 1, 1]])
    first, index = decoding.distinct_prompts(ids, mask)
    assert first.tolist() == [0, 1, 3] and index.tolist() == [0, 1, 0, 2, 1]
    assert decoding.distinct_prompts(ids[:2], mask[:2]) is None


def test_the_global_rng_sampler_draws_from_the_warped_distribution():
    """Sampler without generators draws softmax(top-k/top-p(logits / τ)) from the global RNG: logits (2, 1, 0, −1),
    τ = 0.5, top-p 0.9 → (e⁴, e²)/(e⁴ + e²) = (.881, .119, 0, 0) (hand computation in test_rollout.py)."""
    torch.manual_seed(0)
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).repeat(4000, 1)
    picked = Sampler(0.5, 0.9, 0)(logits, torch.arange(4000))
    freq = torch.bincount(picked, minlength=4).float() / 4000
    e = torch.tensor([4.0, 2.0]).exp()
    assert torch.allclose(freq, torch.cat([e / e.sum(), torch.zeros(2)]), atol=0.03), freq


def test_a_model_without_a_cache_argument_is_left_to_generate(arch_models):
    model, tok = arch_models["llama"]

    class NoCache(torch.nn.Module):  # remote code with its own forward signature
        def __init__(self, inner):
            super().__init__()
            self.inner, self.config = inner, inner.config

        def forward(self, input_ids, attention_mask=None):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask)

    assert not can_compact(NoCache(model))


def test_evaluation_texts_equal_generates(arch_models, monkeypatch):
    """generate_texts (evaluation, demos) decodes greedily what generate() decodes."""
    from tether.rollout.texts import generate_texts

    model, tok = arch_models["qwen2"]
    compact = generate_texts(model, tok, PROMPTS, max_new_tokens=12)
    monkeypatch.setattr("tether.rollout.texts.can_compact", lambda m: False)
    assert generate_texts(model, tok, PROMPTS, max_new_tokens=12) == compact


def test_drop_finished_rows_off_samples_the_same_with_generate(arch_models, monkeypatch):
    """rollout.drop_finished_rows: the backend decodes compactly when on and through generate() when off; with
    response seeds the two draw the same responses."""
    from types import SimpleNamespace

    from tether.rollout.backends import HFGenerate

    model, tok = arch_models["llama"]
    calls = []
    monkeypatch.setattr(model, "generate", lambda *a, _g=model.generate, **k: calls.append(1) or _g(*a, **k))
    seeds = response_seeds(0, range(len(PROMPTS)))
    on = SimpleNamespace(
        max_new_tokens=12, temperature=1.0, top_p=1.0, top_k=0, generation_batch=0, drop_finished_rows=True
    )
    off = SimpleNamespace(**{**vars(on), "drop_finished_rows": False})
    backend = HFGenerate(model, tok)
    a = backend.generate(PROMPTS, on, STOPS, seeds)
    assert not calls
    b = backend.generate(PROMPTS, off, STOPS, seeds)
    assert calls and a.responses == b.responses and torch.equal(a.response_ids, b.response_ids)


def test_the_sampler_gives_each_drawn_tokens_log_prob_under_the_warped_distribution():
    """Sampler.draw: the same tokens as Sampler's call, and log p(token) under softmax(top-p(logits / τ)): logits
    (2, 1, 0, −1), τ = 0.5, top-p 0.9 keep tokens 0 and 1 with p = (e⁴, e²)/(e⁴ + e²), so log p = −log(1 + e⁻²) =
    −0.126928 and −log(1 + e²) = −2.126928."""
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).repeat(64, 1)
    rows = torch.arange(64)
    tokens = Sampler(0.5, 0.9, 0, decoding.seeded_generators(list(range(64)), "cpu"))(logits, rows)
    drawn, logp = Sampler(0.5, 0.9, 0, decoding.seeded_generators(list(range(64)), "cpu")).draw(logits, rows)
    assert torch.equal(drawn, tokens) and set(tokens.tolist()) == {0, 1}
    hand = torch.tensor([-0.126928, -2.126928])
    assert torch.allclose(logp, hand[tokens], atol=1e-6)


def test_decode_keeps_each_sampled_tokens_log_prob_and_draws_the_same_tokens(arch_models):
    """generate_from_ids(sampler_logprobs=True) on a float64 model: the tokens of the run that keeps nothing, and at
    every response token log softmax(top-k/top-p(logits / τ)) of a whole-sequence forward, 0 off the mask; rows end
    at different steps. The two forwards' float64 logits agree to ~1e-13, then sampling_probs takes both in float32:
    a logit may round one float32 ulp apart (2⁻²³ relative, |logit / τ| < 8 here), which moves a log-probability by
    at most 2 · 8 · 2⁻²³ ≈ 2e-6; 1e-5 asked."""
    from tether.rollout.decoding import sampling_probs

    model, tok = arch_models["llama"]
    model = load_model(model.name_or_path, tok).double()
    kw = dict(seeds=response_seeds(0, range(len(PROMPTS))), temperature=0.9, top_p=0.95, top_k=40, stop_ids=STOPS)
    kept = generate_from_ids(model, tok, contexts(tok), 20, sampler_logprobs=True, **kw)
    plain = generate_from_ids(model, tok, contexts(tok), 20, **kw)
    assert torch.equal(kept.response_ids, plain.response_ids) and plain.sampler_logprobs is None
    assert len(set(kept.lengths.tolist())) >= 2
    ids = torch.cat([kept.prompt_ids, kept.response_ids], 1)
    mask = torch.cat([kept.prompt_mask, kept.response_mask], 1)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
    p = kept.prompt_ids.shape[1]
    step = logits[:, p - 1 : -1]  # the logits each response token was drawn from
    flat = sampling_probs(step.reshape(-1, step.shape[-1]), 0.9, 0.95, 40).reshape(step.shape)
    want = flat.gather(-1, kept.response_ids[..., None]).squeeze(-1).log().double()
    on = kept.response_mask.bool()
    assert float((step / 0.9).abs().max()) < 8
    assert torch.allclose(kept.sampler_logprobs[on].double(), want[on], atol=1e-5, rtol=0)
    assert torch.all(kept.sampler_logprobs[~on] == 0)


def test_a_bf16_sampling_copy_follows_the_policy_and_keeps_its_log_probs(arch_models):
    """rollout.sampling_dtype bf16 on the hf backend: a bfloat16 copy samples, equal to the fp32 policy cast, again
    after an update (weights_updated); its rollouts carry the copy's log-probs (0 off the mask) and differ from the
    fp32 trainer's (the gap the stages log and TIS corrects); greedy evaluation keeps none. A LoRA policy and
    drop_finished_rows off are refused by name."""
    from types import SimpleNamespace

    from tether.algorithms.mismatch import sampler_mismatch
    from tether.config import ConfigError
    from tether.rollout.backends import HFGenerate
    from tether.rollout.forward import response_logprobs

    model, tok = arch_models["llama"]
    policy = load_model(model.name_or_path, tok)
    settings = SimpleNamespace(
        sampling_dtype="bf16", drop_finished_rows=True, max_new_tokens=12, temperature=1.0, top_p=1.0, top_k=0
    )
    if bf16_refused_here():
        with pytest.raises(ConfigError, match=BF16_REFUSED):
            HFGenerate(policy, tok, settings)
        return
    backend = HFGenerate(policy, tok, settings)
    assert not backend.samples_trainer_weights and "bfloat16 copy" in backend.describe()

    def same_as_cast():
        copy = dict(backend.sampler.named_parameters())
        return all(torch.equal(copy[n], p.detach().to(torch.bfloat16)) for n, p in policy.named_parameters())

    assert same_as_cast()
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.01)
    assert not same_as_cast()
    backend.weights_updated(policy)
    assert same_as_cast()
    rollout = backend.generate(PROMPTS, settings, STOPS, seeds=response_seeds(0, range(len(PROMPTS))))
    assert torch.all(rollout.sampler_logprobs[~rollout.response_mask.bool()] == 0)
    with torch.no_grad():
        trainer = response_logprobs(policy, rollout, 1.0)
    gap = sampler_mismatch(trainer, rollout.sampler_logprobs, rollout.response_mask)
    assert gap["abs_max"] > 0 and gap["kl"] >= 0
    greedy = backend.generate_ids(contexts(tok), settings, STOPS, greedy=True)
    assert greedy.sampler_logprobs is None
    with pytest.raises(ConfigError, match="needs --drop-finished-rows"):
        HFGenerate(policy, tok, SimpleNamespace(**{**vars(settings), "drop_finished_rows": False}))
    from peft import LoraConfig, get_peft_model

    lora = get_peft_model(load_model(model.name_or_path, tok), LoraConfig(r=4, target_modules=["q_proj"]))
    with pytest.raises(ConfigError, match="not a LoRA or --fsdp policy"):
        HFGenerate(lora, tok, settings)
