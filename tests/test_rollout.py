"""The online core: stop set and response mask, step-0 invariants, log-prob padding/batch invariance."""

import copy

import pytest
import torch

from tether.models.lm import load_model, load_tokenizer
from tether.rollout.backends import generate_rollout
from tether.rollout.batch import Rollout
from tether.rollout.forward import response_logprobs
from tether.rollout.prompts import response_mask_from_stops


def test_response_mask_includes_the_first_stop_and_flags_truncation():
    ids = torch.tensor([[5, 6, 2, 7, 2], [5, 6, 7, 8, 9], [2, 3, 3, 3, 3]])
    mask, truncated = response_mask_from_stops(ids, [2])
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]
    assert truncated.tolist() == [False, True, False]


@pytest.fixture(scope="module")
def policy(llama_dir):
    tok = load_tokenizer(llama_dir)
    return load_model(llama_dir, tok), tok


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.3])
def test_step_zero_policy_equals_reference_ratio_one_kl_zero(policy, temperature):
    model, tok = policy
    reference = copy.deepcopy(model).eval()
    torch.manual_seed(0)
    prompts = ["What is 1 + 2?\n", "Tell me about cats.", "hi"]
    rollout = generate_rollout(model, tok, prompts, max_new_tokens=12, temperature=temperature)
    with torch.no_grad():
        old = response_logprobs(model, rollout, temperature)
        ref = response_logprobs(reference, rollout, temperature)
    new = response_logprobs(model, rollout, temperature)
    torch.testing.assert_close(old, ref)
    ratio = torch.exp(new - old)[rollout.response_mask.bool()]
    torch.testing.assert_close(ratio, torch.ones_like(ratio))
    assert (rollout.response_mask.sum(-1) >= 1).all()


def test_logprobs_match_the_sampling_distribution_of_generate(policy):
    """The log-probs at temperature τ are those generate() sampled from: check against a manual forward."""
    model, tok = policy
    torch.manual_seed(1)
    rollout = generate_rollout(model, tok, ["Tell me about cats."], max_new_tokens=6, temperature=0.8)
    full = torch.cat([rollout.prompt_ids, rollout.response_ids], 1)
    with torch.no_grad():
        logits = model(input_ids=full).logits[0] / 0.8
        expected = torch.log_softmax(logits, -1)[
            torch.arange(rollout.prompt_ids.shape[1] - 1, full.shape[1] - 1), rollout.response_ids[0]
        ]
        got = response_logprobs(model, rollout, 0.8)[0]
    n = int(rollout.response_mask.sum())
    torch.testing.assert_close(got[:n], expected[:n], atol=1e-5, rtol=1e-4)


def test_logprobs_do_not_depend_on_padding_or_batch_company(policy):
    model, tok = policy
    prompt_a, prompt_b = tok("What is 1 + 2?\n")["input_ids"], tok("hi")["input_ids"]
    resp_a, resp_b = [7, 8, 9, tok.eos_token_id], [10, 11]

    def batch(prompts, responses):
        p = max(len(x) for x in prompts)
        t = max(len(x) for x in responses)
        pid = torch.tensor([[tok.pad_token_id] * (p - len(x)) + x for x in prompts])
        pm = torch.tensor([[0] * (p - len(x)) + [1] * len(x) for x in prompts])
        rid = torch.tensor([x + [tok.pad_token_id] * (t - len(x)) for x in responses])
        rm = torch.tensor([[1] * len(x) + [0] * (t - len(x)) for x in responses])
        return Rollout(pid, pm, rid, rm, torch.zeros(len(prompts), dtype=torch.bool), [], [])

    with torch.no_grad():
        alone = response_logprobs(model, batch([prompt_b], [resp_b]), 1.0)[0, :2]
        together = response_logprobs(model, batch([prompt_a, prompt_b], [resp_a, resp_b]), 1.0)[1, :2]
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-4)


def test_entropy_is_positive_and_masked(policy):
    model, tok = policy
    torch.manual_seed(2)
    rollout = generate_rollout(model, tok, ["hi", "Tell me about cats."], max_new_tokens=8)
    with torch.no_grad():
        _, entropy = response_logprobs(model, rollout, 1.0, with_entropy=True)
    valid = rollout.response_mask.bool()
    assert (entropy[valid] > 0).all() and (entropy[~valid] == 0).all()
    assert entropy[valid].max() <= torch.log(torch.tensor(float(model.config.vocab_size))) + 1e-4


def bare_and_padded(prompt: list[int], pad: int) -> tuple[Rollout, Rollout]:
    """The same prompt and 3-token response, alone and with two pads on the left and one on the right."""
    one = Rollout(
        torch.tensor([prompt]),
        torch.ones(1, len(prompt), dtype=torch.long),
        torch.tensor([[7, 8, 9]]),
        torch.ones(1, 3, dtype=torch.long),
        torch.zeros(1, dtype=torch.bool),
        [],
        [],
    )
    padded = Rollout(
        torch.tensor([[pad] * 2 + prompt]),
        torch.tensor([[0, 0] + [1] * len(prompt)]),
        torch.tensor([[7, 8, 9, pad]]),
        torch.tensor([[1, 1, 1, 0]]),
        torch.zeros(1, dtype=torch.bool),
        [],
        [],
    )
    return one, padded


def test_value_model_reads_each_state_and_ignores_padding(llama_dir, policy):
    from tether.stages.ppo_critic import load_value_model

    _, tok = policy
    critic = load_value_model(llama_dir, tok)
    torch.manual_seed(0)
    with torch.no_grad():
        critic.rm.inner.score.weight.normal_()
    prompt = tok("hi")["input_ids"]
    one, padded = bare_and_padded(prompt, tok.pad_token_id)
    with torch.no_grad():
        v1, v2 = critic(one), critic(padded)
    torch.testing.assert_close(v2[:, :3], v1, atol=1e-5, rtol=1e-4)
    assert v2[0, 3] == 0
    # V(s_0) is read where the prompt ends: the same as the reward model's score of the prompt alone
    with torch.no_grad():
        prompt_score = critic.rm(torch.tensor([prompt]), torch.ones(1, len(prompt), dtype=torch.long))[0, 0]
    torch.testing.assert_close(v1[0, 0], prompt_score, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_shared_value_head_reads_the_policy_backbone_at_each_state(model_dirs, arch):
    """V(s_t) of the shared layout = head(last hidden state of the policy's backbone at the state's position),
    unchanged by left padding, and the single forward also gives the policy's log-probs."""
    from tether.models.lm import load_model, load_tokenizer
    from tether.rollout.forward import response_logprobs_and_values
    from tether.stages.ppo_critic import SharedValueHead

    tok = load_tokenizer(model_dirs[arch])
    model = load_model(model_dirs[arch], tok)
    critic = SharedValueHead.load(model, None)
    torch.manual_seed(0)
    with torch.no_grad():
        critic.head.weight.normal_()
    prompt = tok("hi there")["input_ids"]
    one, padded = bare_and_padded(prompt, tok.pad_token_id)
    with torch.no_grad():
        v1, v2 = critic(one), critic(padded)
        ids = torch.tensor([prompt + [7, 8]])
        hidden = model.base_model(input_ids=ids).last_hidden_state  # positions of s_0, s_1, s_2
        expected = critic.head(hidden[:, len(prompt) - 1 :])[..., 0]
        logp, _, values = response_logprobs_and_values(model, critic.head, one, 0.7)
    torch.testing.assert_close(v1, expected, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(v2[:, :3], v1, atol=1e-5, rtol=1e-4)
    assert v2[0, 3] == 0
    torch.testing.assert_close(values, v1)
    torch.testing.assert_close(logp, response_logprobs(model, one, 0.7))
    assert SharedValueHead.load(model, None).head.weight.abs().sum() == 0  # starts at V = 0


def test_step_ends_map_text_offsets_to_the_completing_token(policy):
    import re

    from tether.rollout.texts import step_end_tokens

    _, tok = policy
    text = "12 + 30 = 42. The answer is 42."
    ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    ends = [m.end() for m in re.finditer(r"\.(?=\s|$)", text)]
    tokens = step_end_tokens(tok, ids, ends)
    for end, k in zip(ends, tokens):
        assert len(tok.decode(ids[: k + 1], skip_special_tokens=True)) >= end  # the token completes the step...
        assert len(tok.decode(ids[:k], skip_special_tokens=True)) < end  # ...and the one before does not
    assert step_end_tokens(tok, ids, [10_000]) == [len(ids) - 1] and step_end_tokens(tok, [], [3]) == [0]


def test_seeded_responses_do_not_depend_on_the_batch(policy):
    """With a seed per response, a response is the same alone, in another batch order, or in a bigger batch:
    what lets N processes sample exactly what one process samples."""
    from tether.rollout.backends import response_seeds

    model, tok = policy
    prompts = ["What is 1 + 2?\n", "Tell me about cats.", "hi", "hello there"]
    seeds = response_seeds(3, [0, 1, 2, 3])
    together = generate_rollout(model, tok, prompts, 10, 0.9, 0.95, 40, seeds=seeds)
    torch.manual_seed(123)  # the global RNG plays no part
    apart = [generate_rollout(model, tok, [p], 10, 0.9, 0.95, 40, seeds=[s]) for p, s in zip(prompts, seeds)]
    reversed_ = generate_rollout(model, tok, prompts[::-1], 10, 0.9, 0.95, 40, seeds=seeds[::-1])
    assert together.responses == [a.responses[0] for a in apart] == reversed_.responses[::-1]
    assert (
        generate_rollout(model, tok, prompts, 10, 0.9, seeds=response_seeds(4, [0, 1, 2, 3])).responses
        != together.responses
    )


def test_seeded_sampler_draws_from_the_warped_distribution():
    """SeededSampler samples softmax(top-k/top-p(logits / τ)): frequencies over 4000 draws within 0.03 of the
    hand-computed probabilities. logits (2, 1, 0, −1), τ = 0.5 → (2/τ...) ∝ (e⁴, e², 1, e⁻²) = (.867, .117, .016,
    .002); top-p 0.9 keeps the two largest (mass above the third is .984 ≥ .9): (.881, .119, 0, 0)."""
    from tether.rollout.backends import SeededSampler

    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).repeat(4000, 1)
    picked = SeededSampler(list(range(4000)), 0.5, 0.9, 0, "cpu")(None, logits).argmax(-1)
    freq = torch.bincount(picked, minlength=4).float() / 4000
    e = torch.tensor([4.0, 2.0]).exp()
    expected = torch.cat([e / e.sum(), torch.zeros(2)])
    assert torch.allclose(freq, expected, atol=0.03), freq
    top1 = SeededSampler(list(range(50)), 1.0, 1.0, 1, "cpu")(None, logits[:50]).argmax(-1)
    assert (top1 == 0).all()


class ScriptedBackend:
    """A generation backend that answers every prompt with the same text: the stage must train on what the backend
    returns, and tell it after every step that the weights changed."""

    draws_from_own_rng = False  # the GenerationBackend contract: it draws in this process (or not at all)

    def __init__(self, policy, tokenizer, text="a a a"):
        self.tokenizer, self.text = tokenizer, text
        self.calls, self.updates = 0, 0

    def generate(self, prompts, sampling, stop_ids, seeds=None):
        from tether.rollout.prompts import response_mask_from_stops

        self.calls += 1
        tok = self.tokenizer
        side, tok.padding_side = tok.padding_side, "left"
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        tok.padding_side = side
        ids = tok(self.text, add_special_tokens=False)["input_ids"] + [stop_ids[0]]
        response = torch.tensor([ids] * len(prompts))
        mask, truncated = response_mask_from_stops(response, stop_ids)
        return Rollout(
            enc["input_ids"],
            enc["attention_mask"],
            response,
            mask,
            truncated,
            list(prompts),
            [self.text] * len(prompts),
        )

    def weights_updated(self, policy):
        self.updates += 1


def test_a_generation_backend_plugs_in_without_touching_the_stage(llama_dir, tmp_path):
    import json

    from tether.config import build_config
    from tether.stages.grpo import run_grpo
    from tether.stages.grpo_config import GRPOConfig

    rules = tmp_path / "rules.py"
    rules.write_text("def count_a(completions):\n    return [float(c.count('a')) for c in completions]\n")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Say {w}."}) + "\n" for w in ("hi", "cats", "dogs")))
    made = []
    cfg = build_config(
        GRPOConfig,
        overrides={
            "model.path": str(llama_dir),
            "rollout.prompts": str(prompts),
            "rollout.eval_prompts": str(prompts),
            "rewards.reward": [f"{rules}:count_a"],
            "rollout.prompts_per_step": 2,
            "rollout.group_size": 2,
            "rollout.max_new_tokens": 16,
            "train.max_steps": 3,
            "train.eval_every": 3,
            "train.save_every": 0,
            "train.sample_every": 1,
            "train.output": str(tmp_path / "out"),
            "train.report_to": ["none"],
        },
    )
    run_grpo(cfg, backend=lambda policy, tok: made.append(ScriptedBackend(policy, tok)) or made[-1])
    backend = made[0]
    assert backend.updates == 3 and backend.calls == 3 + 2  # one rollout per step, evaluations at steps 0 and 3
    samples = [json.loads(x) for x in (tmp_path / "out" / "samples.jsonl").read_text().splitlines()]
    assert (
        len(samples) == 12 and {s["response"] for s in samples} == {"a a a"} and {s["score"] for s in samples} == {3.0}
    )
    metrics = [json.loads(x) for x in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["eval/score_mean"] == 3.0


def test_generation_in_chunks_with_response_seeds_samples_the_same(policy):
    from types import SimpleNamespace

    from tether.rollout.backends import HFGenerate, response_seeds
    from tether.rollout.prompts import stop_token_ids

    model, tok = policy
    prompts = ["What is 1 + 2?\n", "Tell me about cats.", "hi", "hello there", "cats"]
    seeds = response_seeds(0, range(5))
    whole = SimpleNamespace(max_new_tokens=8, temperature=1.0, top_p=1.0, top_k=0, generation_batch=0)
    chunked = SimpleNamespace(**{**vars(whole), "generation_batch": 2})
    backend, stops = HFGenerate(model, tok), stop_token_ids(tok, model)
    a, b = backend.generate(prompts, whole, stops, seeds), backend.generate(prompts, chunked, stops, seeds)
    assert a.responses == b.responses
    assert torch.equal(a.response_mask.sum(-1), b.response_mask.sum(-1))


def test_the_stop_set_holds_the_templates_end_of_turn_when_eos_is_another_token(tokenizer):
    """Mistral-style: EOS is one token, the ChatML template closes turns with <|im_end|>; both stop generation."""
    import copy

    from tether.models.lm import end_of_turn_id
    from tether.rollout.prompts import stop_token_ids

    mistral_like = copy.deepcopy(tokenizer)
    mistral_like.eos_token = "<|bos|>"  # stands for </s>: a special token the template never writes
    im_end = mistral_like.convert_tokens_to_ids("<|im_end|>")
    assert end_of_turn_id(mistral_like) == im_end
    assert stop_token_ids(mistral_like) == [mistral_like.convert_tokens_to_ids("<|bos|>"), im_end]
    assert stop_token_ids(tokenizer) == [im_end]  # EOS is the end of turn: one stop token, not two
    plain = copy.deepcopy(tokenizer)
    plain.chat_template = None
    assert end_of_turn_id(plain) is None


def test_sft_trains_the_end_of_turn_token_when_the_model_eos_is_another(tokenizer):
    import copy

    from tether.data.records import Record
    from tether.data.sft import tokenize_records

    mistral_like = copy.deepcopy(tokenizer)
    mistral_like.eos_token = "<|bos|>"
    record = Record({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]}, "d:1")
    (example,), report = tokenize_records([record], mistral_like, 64)
    trained = mistral_like.decode([t for t, m in zip(example.input_ids, example.loss_mask) if m])
    assert trained == "ok<|im_end|>" and not report.warnings  # up to the end-of-turn token, no "may not stop" warning


def test_chat_prompts_without_a_chat_template_are_a_clear_error(tokenizer):
    import copy

    import pytest

    from tether.data.records import DataError
    from tether.rollout.prompts import render_prompts

    plain = copy.deepcopy(tokenizer)
    plain.chat_template = None
    assert render_prompts(plain, [{"prompt": "Say hi."}], "p.jsonl") == ["Say hi."]
    with pytest.raises(
        DataError,
        match=r"p.jsonl row 2: 'prompt' is a list of chat messages, and the tokenizer has no "
        "chat template",
    ):
        render_prompts(plain, [{"prompt": "a"}, {"prompt": [{"role": "user", "content": "b"}]}], "p.jsonl")


def test_rollout_backend_is_one_option_for_every_online_stage_and_its_table_names_the_same_backends():
    """rollout.backend (--rollout-backend) is declared once, in the sampling section PPO, GRPO and online DPO share;
    its choices are the backend table's keys, and an unknown name is refused when the config is built."""
    from tether.config import ConfigError, build_config
    from tether.online_sections import ROLLOUT_BACKENDS
    from tether.rollout.backends import BACKENDS, HFGenerate
    from tether.stages.dpo_config import DPOConfig
    from tether.stages.grpo_config import GRPOConfig
    from tether.stages.ppo_config import PPOConfig

    assert tuple(BACKENDS) == ROLLOUT_BACKENDS and BACKENDS["hf"] is HFGenerate
    for config in (PPOConfig, GRPOConfig, DPOConfig):
        assert build_config(config, overrides={"rollout.backend": "hf"}).rollout.backend == "hf"
        with pytest.raises(ConfigError, match="backend"):
            build_config(config, overrides={"rollout.backend": "sglang"})
