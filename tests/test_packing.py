"""Padding-free micro-batches (tether/models/packing.py): hand-checked layouts, and the same losses, scores and gradients
as padded rows for SFT, DPO (pairs, lists, KTO's blocks) and reward models on four architectures."""

from __future__ import annotations

import pytest
import torch

from tether.algorithms.reductions import segment_sum
from tether.config import build_config
from tether.data.dpo import PolicyPreference, collate_policy_preferences
from tether.data.preferences import PairExample, RankedExample, collate_preferences
from tether.data.sft import Example, collate
from tether.models.lm import build_tiny_model, load_model
from tether.models.packing import (
    first_fit_decreasing,
    model_inputs,
    pack_sequences,
    pack_shared_prompts,
    prompt_sharing_refusal,
    score_inputs,
    scored_token_logprobs,
)
from tether.models.reward import load_reward_model
from tether.stages.dpo_config import DPOConfig
from tether.stages.dpo_objective import DPOObjective
from tether.stages.rm import RewardObjective
from tether.stages.sft import SFTObjective

ARCHS = ("gpt2", "llama", "qwen2", "mistral")


def test_first_fit_decreasing_by_hand():
    # longest first: 5 → bin 0 (full); 4 → bin 1 (room 1); 3 → bin 2 (room 2); 2 → bin 2 (room 0); 1 → bin 1
    assert first_fit_decreasing([5, 3, 4, 2, 1], capacity=5) == [[0], [2, 4], [1, 3]]
    assert first_fit_decreasing([2, 2, 2], capacity=6) == [[0, 1, 2]]
    with pytest.raises(ValueError, match="sequence 1 has 7 tokens"):
        first_fit_decreasing([2, 7], capacity=6)


def test_pack_sequences_by_hand():
    batch = pack_sequences([[11, 12, 13], [21, 22], [31]], pad_id=0, loss_masks=[[1, 1, 1], [1, 1], [1]])
    # capacity 3 (the longest): [seq 0] and [seq 1, seq 2], 6 positions; capacity 6 also computes 6: the narrower wins
    assert batch["input_ids"].tolist() == [[11, 12, 13], [21, 22, 31]]
    assert batch["position_ids"].tolist() == [[0, 1, 2], [0, 1, 0]]
    assert batch["sequence_index"].tolist() == [[0, 0, 0], [1, 1, 2]]
    assert batch["last_index"].tolist() == [2, 4, 5]
    assert batch["loss_mask"].tolist() == [[0, 1, 1], [0, 1, 0]]  # a sequence's first token is never a label
    # capacity 3: group 0 in one row, group 1 in two: 3 rows x 3 = 9 positions; capacity 4: 2 rows x 4 = 8
    grouped = pack_sequences([[1, 2], [3], [4, 5, 6], [7]], pad_id=9, groups=[[0, 1], [2, 3]])
    assert grouped["input_ids"].tolist() == [[1, 2, 3, 9], [4, 5, 6, 7]]
    assert grouped["group_rows"].tolist() == [0, 1, 2]
    assert grouped["position_ids"][0].tolist() == [0, 1, 0, 0]  # padding restarts: a segment of its own
    assert grouped["sequence_index"].tolist() == [[0, 0, 1, 4], [2, 2, 2, 3]]


def test_segment_sum_by_hand_and_its_gradient():
    values = torch.tensor([[1.0, 2.0, 4.0], [8.0, 16.0, 32.0]], requires_grad=True)
    segment = torch.tensor([[0, 0, 1], [1, 2, 3]])  # 3 = n: padding, dropped
    sums = segment_sum(values, segment, 3)
    assert sums.tolist() == [3.0, 12.0, 16.0]
    (sums * torch.tensor([1.0, 10.0, 100.0])).sum().backward()
    assert values.grad.tolist() == [[1.0, 1.0, 10.0], [10.0, 100.0, 0.0]]


@pytest.fixture(scope="module")
def arch_dirs(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("packing")
    return {
        arch: build_tiny_model(arch, tokenizer, root / arch, seed=1, hidden=32, layers=2, heads=2, max_positions=128)
        for arch in ARCHS
    }


def _sequences(tokenizer, n, seed=0):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(4, 30, (n,), generator=gen).tolist()
    ids = [torch.randint(5, len(tokenizer), (k,), generator=gen).tolist() for k in lengths]
    masks = [[0] * (k // 2) + [1] * (k - k // 2) for k in lengths]  # prompt half, completion half
    return ids, masks


def _loss_and_grads(model, objective, batch):
    """(loss, statistics, flattened gradients) of one micro-batch, from zeroed gradients."""
    model.zero_grad()
    loss, stats = objective.loss_sum(model, batch)
    loss.backward()
    return loss.item(), stats, torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


@pytest.mark.parametrize("arch", ARCHS)
def test_sft_loss_and_gradients_equal_padded_rows(arch, arch_dirs, tokenizer):
    model = load_model(arch_dirs[arch], tokenizer)
    ids, masks = _sequences(tokenizer, 7)
    examples = [Example(i, m, "x") for i, m in zip(ids, masks)]
    objective = SFTObjective()
    results = []
    for padding_free in (False, True):
        batch = collate(examples, tokenizer.pad_token_id, padding_free)
        loss, _, grads = _loss_and_grads(model, objective, batch)
        results.append((loss, objective.count(batch), grads, batch["input_ids"].numel()))
    (padded_loss, padded_units, padded_grad, padded_positions), (loss, units, grad, positions) = results
    assert units == padded_units
    assert loss == pytest.approx(padded_loss, rel=1e-5)
    torch.testing.assert_close(grad, padded_grad, atol=1e-5, rtol=1e-4)
    assert positions < padded_positions  # fewer rows, no longer ones


def _dpo_cfg(**over):
    values = {"model.path": "unused", "data.path": "unused", "train.output": "unused", "train.report_to": ["none"]}
    return build_config(DPOConfig, overrides={**values, **over}).dpo


@pytest.mark.parametrize("arch", ARCHS)
def test_dpo_log_probs_losses_and_gradients_equal_padded_rows(arch, arch_dirs, tokenizer):
    model = load_model(arch_dirs[arch], tokenizer)
    ids, masks = _sequences(tokenizer, 12, seed=1)
    responses = [Example(i, m, "x") for i, m in zip(ids, masks)]
    pairs = [PolicyPreference(responses[2 * j : 2 * j + 2], "x") for j in range(4)]
    lists = [PolicyPreference(responses[j : j + 3], "x") for j in (0, 3, 6, 9)] + [PolicyPreference(responses[:2], "x")]
    for j, ex in enumerate(pairs + lists):
        ex.reference_logps = [-40.0 - j, -38.0 + j, -45.0][: len(ex.responses)]
    unpaired = [PolicyPreference(responses[2 * j : 2 * j + 2], "x", desirable=j % 2 == 0) for j in range(4)]
    for j, ex in enumerate(unpaired):
        ex.reference_logps = [-41.0 + j, -39.0]
    for loss_name, examples in (("sigmoid", pairs), ("listwise", lists), ("kto", unpaired)):
        objective = DPOObjective(_dpo_cfg(**{"dpo.loss": loss_name}))
        results = []
        for padding_free in (False, True):
            batch = collate_policy_preferences(examples, tokenizer.pad_token_id, padding_free)
            with torch.no_grad():
                logps, tokens = objective.sequence_logps(model, batch)
                block = objective.block_logps(model, batch, 1)
            loss, _, grads = _loss_and_grads(model, objective, batch)
            results.append((logps, tokens, block, loss, grads))
            if padding_free:  # the rows really hold several responses
                assert batch["input_ids"].shape[0] < batch["list_mask"].numel()
        (logps0, tokens0, block0, loss0, grad0), (logps1, tokens1, block1, loss1, grad1) = results
        torch.testing.assert_close(logps1, logps0, atol=1e-4, rtol=1e-5)
        assert torch.equal(tokens1, tokens0)
        torch.testing.assert_close(block1, block0, atol=1e-4, rtol=1e-5)
        torch.testing.assert_close(block1, logps0[:, 1], atol=1e-4, rtol=1e-5)
        assert loss1 == pytest.approx(loss0, rel=1e-5, abs=1e-6)
        torch.testing.assert_close(grad1, grad0, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("arch", ARCHS)
def test_reward_scores_losses_and_gradients_equal_padded_rows(arch, arch_dirs, tokenizer):
    rm = load_reward_model(arch_dirs[arch], tokenizer, ["reward"])
    ids, _ = _sequences(tokenizer, 9, seed=2)
    pairs = [PairExample(ids[2 * j], ids[2 * j + 1], 0.5 * j, [1], "x") for j in range(3)]
    lists = [RankedExample(ids[6:9], "x"), RankedExample(ids[:2], "x")]
    objective = RewardObjective()
    for examples in (pairs, lists):
        results = []
        for padding_free in (False, True):
            batch = collate_preferences(examples, tokenizer.pad_token_id, padding_free)
            loss, stats, grads = _loss_and_grads(rm, objective, batch)
            results.append((loss, stats["accuracy"].item(), grads))
            if padding_free:
                assert batch["input_ids"].shape[0] < len(batch["last_index"])
        (loss0, acc0, grad0), (loss1, acc1, grad1) = results
        assert loss1 == pytest.approx(loss0, rel=1e-5) and acc1 == acc0
        torch.testing.assert_close(grad1, grad0, atol=1e-5, rtol=1e-4)
    batch = collate_preferences(pairs, tokenizer.pad_token_id, padding_free=True)
    with torch.no_grad():
        packed = rm(**score_inputs(batch))
        alone = torch.cat(
            [
                rm(torch.tensor([s]), torch.ones(1, len(s), dtype=torch.long))
                for s in [e.chosen_ids for e in pairs] + [e.rejected_ids for e in pairs]
            ]
        )
    torch.testing.assert_close(packed, alone, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("arch", ARCHS)
def test_reward_scores_and_gradients_with_shared_prompts_equal_packed_rows(arch, arch_dirs, tokenizer):
    """Pairs and ranked lists (one shorter: its filler scores as its last response) whose responses share a prompt;
    float64, bounds as in the DPO test above (scores to float64 rounding, gradients to the Llama family's float32
    RMSNorm backward)."""
    rm = load_reward_model(arch_dirs[arch], tokenizer, ["reward"]).double()
    gen = torch.Generator().manual_seed(4)
    draw = lambda n: torch.randint(5, len(tokenizer), (n,), generator=gen).tolist()
    prompts = [draw(6 + j) for j in range(5)]
    pairs = [PairExample(p + draw(3 + j), p + draw(5), 0.5 * j, [1], "x") for j, p in enumerate(prompts[:3])]
    lists = [RankedExample([prompts[3] + draw(4), prompts[3] + draw(2), prompts[3] + draw(6)], "x")]
    lists.append(RankedExample([prompts[4] + draw(3), prompts[4] + draw(5)], "x"))
    objective = RewardObjective()
    for examples in (pairs, lists):
        results = []
        for share in (False, True):
            batch = collate_preferences(examples, tokenizer.pad_token_id, True, share)
            with torch.no_grad():
                scores = rm(**score_inputs(batch))
            loss, stats, grads = _loss_and_grads(rm, objective, batch)
            results.append((scores, loss, stats["accuracy"].item(), grads, batch["input_ids"].numel()))
        (s0, loss0, acc0, grad0, n0), (s1, loss1, acc1, grad1, n1) = results
        torch.testing.assert_close(s1, s0, atol=1e-10, rtol=0)
        assert loss1 == pytest.approx(loss0, abs=1e-10) and acc1 == acc0 and n1 < n0
        bound = 1e-10 if arch == "gpt2" else 1e-6 * float(grad0.abs().max())
        torch.testing.assert_close(grad1, grad0, atol=bound, rtol=0)


class _IgnoresRestarts(torch.nn.Module):
    """A causal LM whose forward drops position ids, as some remote-code attention does: sequences packed in one
    row then attend to each other."""

    def __init__(self, model):
        super().__init__()
        self.model, self.config = model, model.config

    def forward(self, input_ids, position_ids=None, **kwargs):
        return self.model(input_ids=input_ids, **kwargs)


def test_a_model_that_ignores_position_restarts_is_refused_before_training(arch_dirs, tokenizer, tmp_path):
    from tether.config import ConfigError
    from tether.models.checks import check_position_restarts

    model = load_model(arch_dirs["llama"], tokenizer)
    check_position_restarts(model, "llama")  # passes: transformers builds the block-diagonal mask
    check_position_restarts(load_reward_model(arch_dirs["qwen2"], tokenizer, ["reward"]), "qwen2")
    with pytest.raises(ConfigError, match=r"remote/model: .*pass --no-padding-free"):
        check_position_restarts(_IgnoresRestarts(model), "remote/model")


def test_pack_shared_prompts_by_hand():
    """Example 0: prompt 5 6 7, answers 8 9 and 8 4 (they share their first token too); example 1: prompt 5 6,
    answers 3 and 2 2. Trees of 6 and 5 positions: rows as wide as the widest tree, so one tree a row."""
    examples = [[[5, 6, 7, 8, 9], [5, 6, 7, 8, 4]], [[5, 6, 3], [5, 6, 2, 2]]]
    masks = [[[0, 0, 0, 1, 1], [0, 0, 0, 1, 1]], [[0, 0, 1], [0, 0, 1, 1]]]
    batch = pack_shared_prompts(examples, masks, pad_id=0, k=2)
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8, 9, 4], [5, 6, 3, 2, 2, 0]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3, 4, 4], [0, 1, 2, 2, 3, 0]]
    # response-major: sequence j·B + b. Token i is read at the position of token i - 1 (flat, rows of 6): 8 after 7
    # (2), 9 and 4 after the shared 8 (3), 3 and the first 2 after 6 (row 1, column 1: 7), the second 2 after the
    # first (row 1, column 3: 9)
    assert batch["scored_sequence"].tolist() == [0, 0, 1, 2, 2, 3, 3]
    assert batch["scored_position"].tolist() == [2, 3, 7, 2, 3, 7, 9]
    assert batch["scored_target"].tolist() == [8, 9, 3, 8, 4, 2, 2]
    mask = batch["tree_mask"][:, 0]
    sees = lambda r, q: torch.nonzero(mask[r, q]).flatten().tolist()
    assert sees(0, 3) == [0, 1, 2, 3]  # the shared prefix, causal
    assert sees(0, 4) == [0, 1, 2, 3, 4] and sees(0, 5) == [0, 1, 2, 3, 5]  # each branch: the prefix and itself
    assert sees(1, 2) == [0, 1, 2] and sees(1, 4) == [0, 1, 3, 4]
    assert sees(1, 5) == [5]  # padding sees itself alone (no empty row of attention)
    # a group wider than twice its longest sequence is split into trees that are not: prompt 1, four answers of 3
    # tokens (sequences of 4, so trees of at most 8): answers 0-1 after one copy of the prompt, answers 2-3 after
    # another, each tree 1 + 3 + 3 = 7 positions
    group = [[1, 10 + j, 20 + j, 30 + j] for j in range(4)]
    batch = pack_shared_prompts([group], [[[0, 1, 1, 1]] * 4], 0, 4)
    assert batch["input_ids"].tolist() == [[1, 10, 20, 30, 11, 21, 31], [1, 12, 22, 32, 13, 23, 33]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3, 1, 2, 3]] * 2
    assert batch["scored_position"].tolist() == [0, 1, 2, 0, 4, 5, 7, 8, 9, 7, 11, 12]
    # a list of three beside a pair: the pair's missing third response scores as its second (the filler)
    batch = pack_shared_prompts(
        [[[1, 2, 3], [1, 2, 4]], [[1, 5], [1, 6], [1, 7]]], [[[0, 1, 1]] * 2, [[0, 1]] * 3], 0, 3
    )
    by_sequence = lambda n: batch["scored_target"][batch["scored_sequence"] == n].tolist()
    assert [by_sequence(n) for n in range(6)] == [[2, 3], [5], [2, 4], [6], [2, 4], [7]]


def _double(folder, tokenizer, attention="sdpa"):
    model = load_model(folder, tokenizer)
    model.config._attn_implementation = attention
    return model.double()


@pytest.mark.parametrize("arch", ARCHS)
def test_shared_prompts_give_the_log_probs_losses_and_gradients_of_packed_rows(arch, arch_dirs, tokenizer):
    """float64, pairs, and ranked lists with a shorter list's filler. The forward is the same arithmetic position by
    position, so log-probs agree to float64 rounding (bound 1e-10). Two things transformers computes in float32
    whatever the model's dtype set the other bounds: eager attention's softmax (log-probs then differ by float32
    rounding of the attention weights, ~1e-7: bound 1e-5), and the Llama-family RMSNorm, whose backward runs in
    float32 — a prompt position's gradient arrives there as one sum over the branches here, as separate terms in
    packed rows, so gradients differ by float32 rounding (2^-24 ≈ 6e-8 of a term, a few terms and layers deep:
    bound 1e-6 of the largest gradient). GPT-2's LayerNorm keeps float64: 1e-10 there."""
    gen = torch.Generator().manual_seed(3)
    rand = lambda lo, hi: int(torch.randint(lo, hi, (1,), generator=gen))
    examples = []
    for b in range(6):
        prompt = torch.randint(5, len(tokenizer), (rand(3, 14),), generator=gen).tolist()
        answers = [torch.randint(5, len(tokenizer), (rand(1, 10),), generator=gen).tolist() for _ in range(2 + b % 2)]
        answers[1] = answers[0][:2] + answers[1]  # two answers that begin alike: the shared part goes past the prompt
        examples.append(
            PolicyPreference([Example(prompt + a, [0] * len(prompt) + [1] * len(a), "x") for a in answers], "x")
        )
    for attention, tolerance in (("sdpa", 1e-10), ("eager", 1e-5)):
        if attention == "eager" and arch != "llama":
            continue
        model = _double(arch_dirs[arch], tokenizer, attention)
        for loss_name, chosen in (("sigmoid", [e for e in examples if len(e.responses) == 2]), ("listwise", examples)):
            for j, ex in enumerate(chosen):
                ex.reference_logps = [-40.0 - j, -38.0 + j, -45.0][: len(ex.responses)]
            objective = DPOObjective(_dpo_cfg(**{"dpo.loss": loss_name}))
            results = []
            for share in (False, True):
                batch = collate_policy_preferences(chosen, tokenizer.pad_token_id, True, share)
                with torch.no_grad():
                    logps, tokens = objective.sequence_logps(model, batch)
                loss, _, grads = _loss_and_grads(model, objective, batch)
                results.append((logps, tokens, loss, grads, batch["input_ids"].numel()))
            (logps0, tokens0, loss0, grad0, positions0), (logps1, tokens1, loss1, grad1, positions1) = results
            torch.testing.assert_close(logps1, logps0, atol=tolerance, rtol=0)
            assert torch.equal(tokens1, tokens0)
            assert loss1 == pytest.approx(loss0, abs=tolerance)
            grad_tolerance = tolerance if arch == "gpt2" else 1e-6 * float(grad0.abs().max())
            torch.testing.assert_close(grad1, grad0, atol=grad_tolerance, rtol=0)
            shared_tokens = sum((len(e.responses) - 1) * _common(e) for e in chosen)
            assert positions1 <= positions0 - shared_tokens // 2  # the prompts' copies gone (rows re-laid: not all)


def _logprobs_alone(model, example) -> torch.Tensor:
    """Σ log π over an example's trained tokens, from a forward of it alone with every position's logits."""
    ids = torch.tensor([example.input_ids])
    logp = model(input_ids=ids, use_cache=False).logits[0, :-1].log_softmax(-1)
    picked = logp.gather(-1, ids[0, 1:, None])[:, 0]
    return (picked * torch.tensor(example.loss_mask[1:], dtype=picked.dtype)).sum()


@pytest.mark.parametrize("chunked", (False, True))
@pytest.mark.parametrize("arch", ("gpt2", "llama"))
def test_the_head_computes_only_trained_positions_and_the_sums_are_every_positions(
    arch, chunked, arch_dirs, tokenizer, tmp_path
):
    """The offline objectives (SFT's NLL, DPO's sequence sums: padded, packed and shared-prompt rows, and under a
    data-parallel wrapper) run the LM head on the positions that predict a trained token alone, and give what each
    sequence's forward alone with every position's logits gives. float64, SDPA: the same arithmetic position by
    position, so agreement to float64 rounding (bound 1e-10). GPT-2 ties its head to the input embeddings.
    ``chunked`` (--chunked-head): the model's own head call computes no logits at all, the head's weight is applied
    to the trained positions' hidden states in chunks, with the same sums, and the same gradients as the whole
    head's (float64 rounding again)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    model = _double(arch_dirs[arch], tokenizer)
    gen = torch.Generator().manual_seed(4)
    rand = lambda lo, hi: int(torch.randint(lo, hi, (1,), generator=gen))
    examples = []
    for _ in range(4):
        prompt = torch.randint(5, len(tokenizer), (rand(3, 20),), generator=gen).tolist()
        answers = [torch.randint(5, len(tokenizer), (rand(1, 8),), generator=gen).tolist() for _ in range(2)]
        examples.append(
            PolicyPreference([Example(prompt + a, [0] * len(prompt) + [1] * len(a), "x") for a in answers], "x")
        )
    responses = [e.responses[k] for k in range(2) for e in examples]  # response-major, as the collate lays them
    trained = sum(sum(r.loss_mask[1:]) for r in responses)
    with torch.no_grad():
        alone = torch.stack([_logprobs_alone(model, r) for r in responses])
    head_rows = []
    model.get_output_embeddings().register_forward_hook(lambda m, a, out: head_rows.append(out.shape[:-1].numel()))
    objective = DPOObjective(_dpo_cfg(**{"dpo.loss": "sigmoid"}), chunked_head=chunked)
    head_computes = 0 if chunked else trained
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        wrapped = DistributedDataParallel(model)
        for layout, padding_free, share in (("padded", False, False), ("packed", True, False), ("shared", True, True)):
            batch = collate_policy_preferences(examples, tokenizer.pad_token_id, padding_free, share)
            for runner in (model, wrapped):
                head_rows.clear()
                with torch.no_grad():
                    logps, tokens = objective.sequence_logps(runner, batch)
                torch.testing.assert_close(logps.T.reshape(-1), alone, atol=1e-10, rtol=0, msg=layout)
                assert head_rows == [head_computes], layout
            if not share:
                grads = []
                for sft in (SFTObjective(), SFTObjective(chunked)):
                    head_rows.clear()
                    model.zero_grad()
                    nll, _ = sft.loss_sum(wrapped, batch)
                    nll.backward()
                    assert float(nll.detach()) == pytest.approx(-float(alone.sum()), abs=1e-10)
                    assert sft.count(batch) == trained
                    grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
                assert head_rows == [head_computes]
                torch.testing.assert_close(grads[1], grads[0], atol=1e-10 * float(grads[0].abs().max()), rtol=0)
    finally:
        dist.destroy_process_group()


def _common(example):
    seqs = [r.input_ids for r in example.responses]
    n = 0
    while all(len(s) > n and s[n] == seqs[0][n] for s in seqs):
        n += 1
    return n


def test_shared_prompts_are_refused_where_the_mask_would_not_hold(arch_dirs, tokenizer):
    from types import SimpleNamespace

    from tether.config import ConfigError
    from tether.models.checks import check_prompt_sharing

    model = load_model(arch_dirs["llama"], tokenizer)
    assert prompt_sharing_refusal(model) == ""
    check_prompt_sharing(model, "llama")  # passes: the attention reads the 4-D mask
    config = lambda **kw: SimpleNamespace(config=SimpleNamespace(_attn_implementation="sdpa", **kw))
    assert "flash_attention_2" in prompt_sharing_refusal(
        SimpleNamespace(config=SimpleNamespace(_attn_implementation="flash_attention_2"))
    )
    assert "sliding-window" in prompt_sharing_refusal(config(sliding_window=4096))
    assert prompt_sharing_refusal(config(sliding_window=4096, use_sliding_window=False)) == ""
    assert "sliding_attention" in prompt_sharing_refusal(config(layer_types=["full_attention", "sliding_attention"]))
    with pytest.raises(ConfigError, match=r"remote/model: .*pass --no-share-prompt"):
        check_prompt_sharing(_IgnoresMask(model), "remote/model")


class _IgnoresMask(torch.nn.Module):
    """A causal LM whose forward drops the attention mask (plain causal attention): a branch then sees the branch
    laid before it."""

    def __init__(self, model):
        super().__init__()
        self.model, self.config = model, model.config

    def forward(self, input_ids, attention_mask=None, **kwargs):
        return self.model(input_ids=input_ids, **kwargs)


def test_token_budget_micro_batches_by_hand():
    from tether.data.preferences import RankedExample as Ranked
    from tether.models.packing import example_tokens
    from tether.train.offline import split_micro_batches

    examples = [Example([0] * n, [1] * n, "x") for n in (5, 3, 4, 2, 12, 1)]
    # budget 8: 5+3 = 8 | 4+2 = 6, +12 would pass it | 12 alone (longer than the budget) | 1
    parts = split_micro_batches(examples, micro_batch_size=4, micro_batch_tokens=8)
    assert [[len(e.input_ids) for e in part] for part in parts] == [[5, 3], [4, 2], [12], [1]]
    assert [len(p) for p in split_micro_batches(examples, micro_batch_size=4)] == [4, 2]  # by examples
    assert example_tokens(PairExample([1, 2, 3], [4, 5], 0.0, [1], "x")) == 5
    assert example_tokens(Ranked([[1], [2, 3], [4, 5, 6]], "x")) == 6
    assert example_tokens(PolicyPreference([Example([1, 2], [0, 1], "x"), Example([3], [1], "x")], "x")) == 3


def test_token_budget_gives_the_same_steps_as_micro_batches_of_examples(llama_dir, addition_files, tmp_path):
    from test_sft import read_metrics, sft_config

    from tether.stages.sft import run_sft

    run_sft(sft_config(llama_dir, addition_files, tmp_path / "examples", train__micro_batch_size=2))
    run_sft(
        sft_config(llama_dir, addition_files, tmp_path / "tokens", train__micro_batch_tokens=100)
    )  # 3 + 3 + 2 examples
    assert "up to 100 tokens" in (tmp_path / "tokens" / "config.yaml").read_text()
    for a, b in zip(read_metrics(tmp_path / "examples"), read_metrics(tmp_path / "tokens"), strict=True):
        assert b["train/tokens"] == a["train/tokens"]
        assert b["train/loss"] == pytest.approx(a["train/loss"], rel=1e-5)
        assert b["train/grad_norm"] == pytest.approx(a["train/grad_norm"], rel=1e-4)


def _rollout(tokenizer, seed=0, rows=7, agent=False):
    """A rollout of varying prompt (left-padded) and response (right-padded) lengths: one response fills the
    budget (truncated), one is a single token. ``agent``: transcripts whose environment tokens are attended to but
    not scored (response_attention wider than response_mask, with holes in the mask)."""
    from tether.rollout.batch import Rollout

    gen = torch.Generator().manual_seed(seed)
    p, t, pad = 9, 8, tokenizer.pad_token_id
    prompt_len = torch.randint(2, p + 1, (rows,), generator=gen)
    response_len = torch.randint(2, t + 1, (rows,), generator=gen)
    response_len[0], response_len[1] = t, 1
    prompt_ids = torch.full((rows, p), pad)
    prompt_mask = torch.zeros(rows, p, dtype=torch.long)
    response_ids = torch.full((rows, t), pad)
    attention = torch.zeros(rows, t, dtype=torch.long)
    for b in range(rows):
        k, n = int(prompt_len[b]), int(response_len[b])
        prompt_ids[b, p - k :] = torch.randint(5, len(tokenizer), (k,), generator=gen)
        prompt_mask[b, p - k :] = 1
        response_ids[b, :n] = torch.randint(5, len(tokenizer), (n,), generator=gen)
        attention[b, :n] = 1
    mask = attention.clone()
    if agent:  # the environment's tokens (every third response position) are context, not actions
        mask[:, 1::3] = 0
    return Rollout(
        prompt_ids,
        prompt_mask,
        response_ids,
        mask,
        response_len == t,
        ["x"] * rows,
        ["y"] * rows,
        attention if agent else None,
    )


@pytest.mark.parametrize("arch", ARCHS)
def test_online_log_probs_entropy_values_and_gradients_equal_padded_rows(arch, arch_dirs, tokenizer):
    from tether.rollout.forward import _packed_layout, _PackedRollout, response_logprobs, response_logprobs_and_values

    model = load_model(arch_dirs[arch], tokenizer)
    head = torch.nn.Linear(model.config.hidden_size if arch != "gpt2" else model.config.n_embd, 1)
    for agent in (False, True):
        rollout = _rollout(tokenizer, seed=3, agent=agent)
        layout = _packed_layout(rollout)
        assert layout is not None
        assert _PackedRollout(rollout, layout).inputs["input_ids"].shape[0] < 7  # the rows really hold several
        results = []
        for padding_free in (False, True):
            model.zero_grad()
            head.zero_grad()
            logp, entropy, values = response_logprobs_and_values(model, head, rollout, 0.7, padding_free)
            (logp.sum() + 0.1 * entropy.sum() + values.sum()).backward()
            grads = torch.cat([q.grad.flatten() for q in list(model.parameters()) + list(head.parameters())])
            alone = response_logprobs(model, rollout, 0.7, with_entropy=True, padding_free=padding_free)
            results.append((logp, entropy, values, grads, alone))
        for padded, packed in zip(*results):
            if isinstance(padded, tuple):
                for x, y in zip(padded, packed):
                    torch.testing.assert_close(y, x, atol=1e-5, rtol=1e-4)
            else:
                torch.testing.assert_close(packed, padded, atol=1e-5, rtol=1e-4)
        assert bool((results[0][0] != 0).any())  # the comparison is not between zeros


def _grouped(rollout, groups):
    """``rollout`` with each group's rows given its first row's prompt (GRPO's G responses to one prompt)."""
    for rows in groups:
        for b in rows[1:]:
            rollout.prompt_ids[b] = rollout.prompt_ids[rows[0]]
            rollout.prompt_mask[b] = rollout.prompt_mask[rows[0]]
    return rollout


@pytest.mark.parametrize("arch", ARCHS)
def test_online_shared_prompts_give_the_log_probs_values_and_gradients_of_packed_rows(arch, arch_dirs, tokenizer):
    """Rows 0-2 and 3-5 share a prompt, row 6 has its own; float64; plain and agent rollouts (context tokens in the
    response). Bounds as in the DPO test above: the forward agrees to float64 rounding, gradients to the float32
    backward of the Llama-family RMSNorm (1e-6 of the largest), GPT-2's to float64 rounding."""
    from tether.rollout.forward import (
        _packed_layout,
        _PackedRollout,
        _shared_rows,
        response_logprobs_and_values,
        response_states,
    )

    model = _double(arch_dirs[arch], tokenizer)
    width = model.config.hidden_size if arch != "gpt2" else model.config.n_embd
    head = torch.nn.Linear(width, 1, dtype=torch.float64)
    backbone = model.get_base_model() if hasattr(model, "get_base_model") else model.base_model
    for agent in (False, True):
        rollout = _grouped(_rollout(tokenizer, seed=5, agent=agent), [[0, 1, 2], [3, 4, 5]])
        layout = _packed_layout(rollout)
        shared = _shared_rows(model, rollout, layout)
        packed = _PackedRollout(rollout, layout)
        assert shared.inputs["input_ids"].numel() < packed.inputs["input_ids"].numel()
        results = []
        for share in (False, True):
            model.zero_grad()
            head.zero_grad()
            logp, entropy, values = response_logprobs_and_values(model, head, rollout, 0.7, True, share)
            (logp.sum() + 0.1 * entropy.sum() + values.sum()).backward()
            grads = torch.cat([q.grad.flatten() for q in list(model.parameters()) + list(head.parameters())])
            with torch.no_grad():
                states = response_states(backbone, rollout, True, share)
            results.append((logp, entropy, values, states, grads))
        for name, x, y in zip(("logp", "entropy", "values", "states"), results[0][:4], results[1][:4]):
            torch.testing.assert_close(y, x, atol=1e-10, rtol=0, msg=name)
        grad = results[0][4]
        bound = 1e-10 if arch == "gpt2" else 1e-6 * float(grad.abs().max())
        torch.testing.assert_close(results[1][4], grad, atol=bound, rtol=0)
        assert bool((results[0][0] != 0).any())
    rollout = _rollout(tokenizer, seed=5)  # every prompt its own: nothing to share, packed rows as before
    assert _shared_rows(model, rollout, _packed_layout(rollout)) is None


def test_online_critic_states_equal_padded_rows_and_unpackable_rollouts_fall_back(arch_dirs, tokenizer):
    from tether.rollout.forward import _packed_layout, response_logprobs
    from tether.stages.ppo_critic import ValueModel

    critic = ValueModel(load_reward_model(arch_dirs["llama"], tokenizer, ["reward"]))
    torch.manual_seed(0)
    for q in critic.rm.score_head.parameters():  # a fresh head may start at zero: values must differ by state
        torch.nn.init.normal_(q)
    rollout = _rollout(tokenizer, seed=4)
    with torch.no_grad():
        padded = critic(rollout)
        torch.testing.assert_close(critic(rollout, padding_free=True), padded, atol=1e-5, rtol=1e-4)
    assert padded[rollout.response_mask.bool()].std() > 0.01
    # a hole in a row's attended tokens (or a scored token without a prompt before it) cannot be laid end to end:
    # the rollout is then forwarded in padded rows, with the same result
    holed = _rollout(tokenizer, seed=4)
    holed.prompt_mask[0, -2] = 0
    assert _packed_layout(holed) is None
    no_prompt = _rollout(tokenizer, seed=4)
    no_prompt.prompt_mask[2] = 0
    assert _packed_layout(no_prompt) is None
    model = load_model(arch_dirs["llama"], tokenizer)
    with torch.no_grad():
        torch.testing.assert_close(
            response_logprobs(model, holed, 1.0, padding_free=True), response_logprobs(model, holed, 1.0)
        )


class _NoBooleanLogitsToKeep(torch.nn.Module):
    """A causal LM whose forward only takes an int logits_to_keep (as before transformers' boolean masks)."""

    def __init__(self, model):
        super().__init__()
        self.model, self.config = model, model.config

    def forward(self, logits_to_keep: int = 0, **kwargs):
        if not isinstance(logits_to_keep, int):
            raise TypeError("logits_to_keep must be an int")
        return self.model(logits_to_keep=logits_to_keep, **kwargs)


def test_online_packed_forward_without_boolean_logits_to_keep_computes_every_logit(arch_dirs, tokenizer):
    from tether.rollout.forward import response_logprobs

    model = load_model(arch_dirs["qwen2"], tokenizer)
    rollout = _rollout(tokenizer, seed=5)
    with torch.no_grad():
        torch.testing.assert_close(
            response_logprobs(_NoBooleanLogitsToKeep(model), rollout, 1.0, padding_free=True),
            response_logprobs(model, rollout, 1.0),
            atol=1e-5,
            rtol=1e-4,
        )


def test_the_chunked_head_runs_in_the_models_autocast_and_an_empty_selection_keeps_a_graph(arch_dirs, tokenizer):
    """--mixed-precision wraps the model's forward in bf16 autocast; the chunked head's products, made after that
    forward returns, run under the same autocast (every call of the head's weight sees it on), so its log-probs are
    the whole head's up to bf16 rounding. A micro-batch with no trained token gives an empty result that still
    back-propagates (zero gradients), chunked or not."""
    from tether.models.lm import autocast_forwards

    model = load_model(arch_dirs["llama"], tokenizer)
    autocast_forwards(model, "bf16")
    weight = model.get_output_embeddings().weight
    ids, masks = _sequences(tokenizer, 3, seed=5)
    batch = collate([Example(i, m, "x") for i, m in zip(ids, masks)], tokenizer.pad_token_id, True)
    seen, linear = [], torch.nn.functional.linear

    def spy(x, w, b=None):
        if w is weight:
            seen.append(torch.is_autocast_enabled("cpu"))
        return linear(x, w, b)

    torch.nn.functional.linear = spy
    try:
        whole = scored_token_logprobs(model, batch)
        chunked = scored_token_logprobs(model, batch, chunked=True)
        chunked.sum().backward()
    finally:
        torch.nn.functional.linear = linear
    assert len(seen) == 3 and all(seen)  # the whole head's call, the model's empty head call, the chunked forward's
    with torch.no_grad():
        largest = float(model(**model_inputs(batch)).logits.float().abs().max())
    torch.testing.assert_close(chunked, whole, atol=2 * 2.0**-8 * largest, rtol=0)  # a logit's bf16 rounding

    empty = {**batch, "loss_mask": torch.zeros_like(batch["loss_mask"])}
    for chunked in (False, True):
        model.zero_grad()
        out = scored_token_logprobs(model, empty, chunked)
        assert float(out.detach().abs().sum()) == 0.0
        out.sum().backward()
        assert float(weight.grad.abs().sum()) == 0.0
