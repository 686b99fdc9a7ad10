"""`tether dpo`: the loss dispatcher by hand, response masks, one-forward scoring, micro-batch invariance,
the reference cache (used, and keyed), LoRA's reference, learning, online rounds, resume and the CLI."""

import json
import math
import subprocess
import sys

import pytest
import torch
import yaml
from conftest import BF16_REFUSED, bf16_refused_here, killed_after_step, write_jsonl

from tether.algorithms.preference import (
    beta_dpo_pair_weights,
    dpo_sigmoid_loss,
    hinge_loss,
    ipo_loss,
    preference_loss,
    robust_dpo_loss,
    simpo_loss,
)
from tether.config import ConfigError, build_config
from tether.data.dpo import collate_policy_preferences, tokenize_policy_preferences
from tether.data.records import DataError, read_records
from tether.models.lm import load_model, load_tokenizer
from tether.stages.dpo import run_dpo
from tether.stages.dpo_config import DPOConfig
from tether.stages.dpo_objective import DPOObjective

sp = lambda x: math.log1p(math.exp(-x))  # −log σ(x)
# chosen: policy −10 over 5 tokens, ref −12; rejected: policy −11 over 10 tokens, ref −10; u_w − u_l = 3
LOGPS, REF, TOKENS = torch.tensor([[-10.0, -11.0]]), torch.tensor([[-12.0, -10.0]]), torch.tensor([[5.0, 10.0]])


def test_one_signature_dispatches_to_each_formula_by_hand():
    loss = lambda name, **kw: preference_loss(name, LOGPS, REF, TOKENS, **kw).item()
    assert loss("sigmoid", beta=0.1) == pytest.approx(sp(0.3))
    assert loss("beta_dpo", beta=0.2) == pytest.approx(sp(0.6))  # the batch's β is the caller's
    assert loss("cdpo", beta=0.1, label_smoothing=0.2) == pytest.approx(0.8 * sp(0.3) + 0.2 * sp(-0.3))
    assert loss("robust", beta=0.1, label_smoothing=0.2) == pytest.approx((0.8 * sp(0.3) - 0.2 * sp(-0.3)) / 0.6)
    assert loss("ipo", beta=0.1) == pytest.approx((3 - 5) ** 2)
    assert loss("hinge", beta=0.1) == pytest.approx(0.7)
    assert loss("listwise", beta=0.1) == pytest.approx(sp(0.3))  # Plackett–Luce over two is DPO
    # SimPO: 2·(−10)/5 − 2·(−11)/10 − 0.5 = −2.3; no reference needed
    assert preference_loss("simpo", LOGPS, None, TOKENS, beta=2.0, gamma=0.5).item() == pytest.approx(sp(-2.3))
    # ORPO: mean logps −2 and −1.1; odds p/(1−p); −mean_w + λ·(−log σ(log odds_w − log odds_l))
    pw, pl = math.exp(-2.0), math.exp(-1.1)
    log_odds = math.log(pw / (1 - pw)) - math.log(pl / (1 - pl))
    got = preference_loss("orpo", LOGPS, None, TOKENS, beta=0.1, orpo_lambda=0.5).item()
    assert got == pytest.approx(2.0 + 0.5 * sp(log_odds), rel=1e-5)
    # the pure functions agree with the dispatcher
    w, l, rw, rl = LOGPS[:, 0], LOGPS[:, 1], REF[:, 0], REF[:, 1]
    assert loss("ipo", beta=0.1) == pytest.approx(ipo_loss(w, l, rw, rl, 0.1).item())
    assert loss("hinge", beta=0.1) == pytest.approx(hinge_loss(w, l, rw, rl, 0.1).item())
    assert loss("robust", beta=0.1, label_smoothing=0.2) == pytest.approx(
        robust_dpo_loss(w, l, rw, rl, 0.1, 0.2).item()
    )
    assert simpo_loss(w, l, TOKENS[:, 0], TOKENS[:, 1]).shape == (1,)
    with pytest.raises(ValueError, match="needs reference"):
        preference_loss("sigmoid", LOGPS, None, TOKENS, beta=0.1)
    with pytest.raises(ValueError, match="listwise"):
        preference_loss("sigmoid", torch.zeros(1, 3), torch.zeros(1, 3), torch.ones(1, 3), beta=0.1)


def test_label_smoothing_is_refused_by_a_loss_that_does_not_read_it():
    """ε is in cdpo's and robust's formulas only; any other loss would train as if ε were 0 while the plan printed it
    (TRL's sigmoid ignores label_smoothing too), so the setting is refused, naming the losses that read it."""
    for loss in ("sigmoid", "ipo", "ipo_norm", "hinge", "simpo", "orpo", "beta_dpo", "listwise", "kto"):
        with pytest.raises(ConfigError, match=rf"label_smoothing=0.2: loss {loss} does not read ε.*cdpo.*robust"):
            build_config(DPOConfig, overrides={"dpo.loss": loss, "dpo.label_smoothing": 0.2})
    with pytest.raises(ConfigError, match=r"use --loss cdpo for conservative DPO"):
        build_config(DPOConfig, overrides={"dpo.label_smoothing": 0.2})  # the default loss, sigmoid
    no_smoothed_part = {"dpo.loss": "weighted", "dpo.loss_weights": {"sigmoid": 1.0, "cdpo": 0.0, "ipo": 1.0}}
    with pytest.raises(ConfigError, match=r"loss weighted does not read ε"):
        build_config(DPOConfig, overrides={**no_smoothed_part, "dpo.label_smoothing": 0.2})
    for reads in ({"dpo.loss": "cdpo"}, {"dpo.loss": "robust"}, {**no_smoothed_part, "dpo.loss_weights": {"cdpo": 1}}):
        assert build_config(DPOConfig, overrides={**reads, "dpo.label_smoothing": 0.2}).dpo.label_smoothing == 0.2


def test_listwise_over_three_by_hand_and_swapping_flips_the_sign_of_the_margin():
    # β u = (1, 0, −1): −log(e¹/(e¹+e⁰+e⁻¹)) − log(e⁰/(e⁰+e⁻¹))
    logps, ref = torch.tensor([[1.0, 0.0, -1.0]]), torch.zeros(1, 3)
    want = -(1 - math.log(math.e + 1 + math.exp(-1))) - (0 - math.log(1 + math.exp(-1)))
    assert preference_loss("listwise", logps, ref, torch.ones(1, 3), beta=1.0).item() == pytest.approx(want)
    torch.manual_seed(0)
    a, b = torch.randn(5, 2), torch.randn(5, 2)
    for name in ("sigmoid", "ipo", "hinge"):  # the swapped pair is the better one's mirror image
        straight = preference_loss(name, a, b, torch.ones(5, 2), beta=0.5)
        swapped = preference_loss(name, a.flip(1), b.flip(1), torch.ones(5, 2), beta=0.5)
        assert not torch.allclose(straight, swapped)
    assert torch.allclose(
        dpo_sigmoid_loss(a[:, 0], a[:, 1], b[:, 0], b[:, 1], 0.5)
        - dpo_sigmoid_loss(a[:, 1], a[:, 0], b[:, 1], b[:, 0], 0.5),
        -((a[:, 0] - b[:, 0]) - (a[:, 1] - b[:, 1])) * 0.5,
    )  # softplus(−h) − softplus(h) = −h


def test_beta_dpo_pair_weights_by_hand():
    w = beta_dpo_pair_weights(torch.tensor([1.0, 3.0]), running_mean=1.0, running_std=2.0)
    assert w.tolist() == pytest.approx([1.0, math.exp(-4 / 8)])


def test_beta_dpo_weight_multiplies_the_sft_term_too_by_hand():
    """docs/algorithms.md §9: L = Σ_i w_i [ℓ(i) + α_sft NLL̄(i)] (before the loop's 1/N): a pair the filter weighs
    near 0 is left out whole, its SFT term included."""
    # u_w = (1, 1, 2, 0), u_l = (0, −1, −1, 1): d = u_w − u_l = (1, 2, 3, −1); chosen NLL̄ = −log π(y_w)/|y_w| = (2, 2, 3, 2)
    logps = torch.tensor([[-10.0, -11.0], [-8.0, -9.0], [-12.0, -13.0], [-6.0, -7.0]], dtype=torch.float64)
    ref = torch.tensor([[-11.0, -11.0], [-9.0, -8.0], [-14.0, -12.0], [-6.0, -8.0]], dtype=torch.float64)
    tokens = torch.tensor([[5.0, 7.0], [4.0, 7.0], [4.0, 7.0], [3.0, 7.0]], dtype=torch.float64)
    batch = {"list_mask": torch.ones(4, 2, dtype=torch.bool), "reference_logps": ref}
    cfg = build_config(DPOConfig, overrides={"dpo.loss": "beta_dpo", "dpo.beta_dpo_weighting": True, "dpo.sft_coef": 1})
    objective = DPOObjective(cfg.dpo, {"mean": 0.1, "std": 0.3})  # M_0 = 0.1, σ = 0.3 from earlier steps
    objective.sequence_logps = lambda model, batch: (logps, tokens)  # the policy's log-probs, fixed
    model = torch.nn.Module()  # training mode, as in the loop
    objective.begin_step(model, [batch], lambda total: total)
    loss, _ = objective.loss_sum(model, batch)
    # M_i = β_0 d_i = (0.1, 0.2, 0.3, −0.1); w_i = exp(−(M_i − 0.1)²/(2·0.09)) = (1, e^(−1/18), e^(−2/9), e^(−2/9)),
    # divided by their mean; β = 0.1 (1 + 0.6 (mean M − M_0)) = 0.1 (1 + 0.6·0.025) = 0.1015
    w = [1.0, math.exp(-1 / 18), math.exp(-2 / 9), math.exp(-2 / 9)]
    w = [x / (sum(w) / 4) for x in w]
    beta = 0.1 * (1 + 0.6 * ((0.1 + 0.2 + 0.3 - 0.1) / 4 - 0.1))
    want = sum(wi * (sp(beta * d) + nll) for wi, d, nll in zip(w, (1, 2, 3, -1), (2, 2, 3, 2)))
    assert objective.beta == pytest.approx(0.1015, rel=1e-12)
    assert loss.item() == pytest.approx(want, rel=1e-12)  # 11.43687… (the SFT term left unweighted: 11.53398…)


@pytest.fixture
def prefs(tmp_path):
    """Chosen answers talk about cats, rejected ones about dogs; chat pairs and a ranked-list file."""
    topics = ["rain", "the sea", "trees", "music", "bread", "stars", "rivers", "snow"]
    rows = [
        {
            "prompt": [{"role": "user", "content": f"Tell me about {t}."}],
            "chosen": [{"role": "assistant", "content": f"Cats like {t}. Cats sleep a lot."}],
            "rejected": [{"role": "assistant", "content": f"Dogs bark at {t}."}],
        }
        for t in topics
    ] * 4
    lists = [
        {"prompt": f"About {t}: ", "responses": [f"dogs and {t}", f"cats and {t}", f"{t} only"], "ranking": [1, 2, 0]}
        for t in topics
    ]
    return write_jsonl(tmp_path / "prefs.jsonl", rows), write_jsonl(tmp_path / "lists.jsonl", lists)


def _cfg(model_dir, data, out, **over):
    values = {
        "model.path": str(model_dir),
        "data.path": str(data),
        "data.eval_fraction": 0.0,
        "train.output": str(out),
        "train.batch_size": 8,
        "train.micro_batch_size": 4,
        "train.max_steps": 6,
        "train.eval_every": 0,
        "train.save_every": 3,
        "train.log_every": 3,
        "train.report_to": ["none"],
        "train.overwrite": True,
        "optim.lr": 1e-3,
        "optim.warmup_ratio": 0.0,
    }
    values.update(over)
    return build_config(DPOConfig, overrides=values)


def _metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_response_mask_covers_the_answer_and_eos_only(tokenizer, prefs):
    examples, report = tokenize_policy_preferences(read_records(prefs[0]), tokenizer, 256)
    assert report.format == "pairs" and report.examples == 32
    chosen = examples[0].responses[0]
    trained = [t for t, m in zip(chosen.input_ids, chosen.loss_mask) if m]
    text = tokenizer.decode(trained)
    assert "Cats like rain. Cats sleep a lot." in text and "Tell me" not in text
    assert trained[-1] == tokenizer.eos_token_id
    lists, _ = tokenize_policy_preferences(read_records(prefs[1]), tokenizer, 256)
    best = lists[0].responses[0]
    assert (
        tokenizer.decode([t for t, m in zip(best.input_ids, best.loss_mask) if m]).strip().startswith("cats and rain")
    )
    batch = collate_policy_preferences(lists[:3], tokenizer.pad_token_id)
    assert batch["input_ids"].shape[0] == 9 and batch["list_mask"].all()


def test_bad_rows_are_named_or_counted(tokenizer, tmp_path):
    bad = write_jsonl(
        tmp_path / "bad.jsonl",
        [{"prompt": "a", "chosen": "b", "rejected": "c"}, {"prompt": "a", "chosen": 3, "rejected": "c"}],
    )
    with pytest.raises(DataError, match=r"bad.jsonl:2: field 'chosen' must be a string"):
        tokenize_policy_preferences(read_records(bad), tokenizer, 256)
    same = write_jsonl(
        tmp_path / "same.jsonl",
        [
            {"prompt": "a", "chosen": "b", "rejected": "c"},
            {"prompt": "a", "chosen": "b", "rejected": "b"},
            {"prompt": "a", "chosen": "b " * 300, "rejected": "c"},
        ],
    )
    examples, report = tokenize_policy_preferences(read_records(same), tokenizer, 64)
    assert len(examples) == 1
    assert report.dropped == {"with chosen equal to rejected": 1, "longer than max_length=64 tokens": 1}
    with pytest.raises(DataError, match="same.jsonl:2: example with chosen equal to rejected"):
        tokenize_policy_preferences(read_records(same), tokenizer, 64, strict=True)


def test_one_forward_equals_separate_forwards_and_micro_batches_do_not_change_the_gradient(llama_dir, tokenizer, prefs):
    model = load_model(llama_dir, tokenizer)
    examples, _ = tokenize_policy_preferences(read_records(prefs[0]), tokenizer, 256)
    examples = examples[:4]
    for i, ex in enumerate(examples):
        ex.reference_logps = [-30.0 - i, -25.0 + i]
    cfg = _cfg(llama_dir, prefs[0], "unused")
    objective = DPOObjective(cfg.dpo)
    batch = collate_policy_preferences(examples, tokenizer.pad_token_id)
    together, tokens = objective.sequence_logps(model, batch)
    for i, ex in enumerate(examples):
        for k in range(2):
            alone = collate_policy_preferences([type(ex)([ex.responses[k]], ex.where)], tokenizer.pad_token_id)
            logp, _ = objective.sequence_logps(model, alone)
            assert logp.item() == pytest.approx(together[i, k].item(), abs=1e-4)
    assert tokens[0, 0] == sum(examples[0].responses[0].loss_mask[1:])

    def grads(split, loss_name):
        objective = DPOObjective(_cfg(llama_dir, prefs[0], "x", **{"dpo.loss": loss_name}).dpo)
        model.zero_grad()
        parts = [examples[i : i + split] for i in range(0, 4, split)]
        batches = [collate_policy_preferences(p, tokenizer.pad_token_id) for p in parts]
        if hasattr(objective, "begin_step"):
            objective.begin_step(model, batches, lambda v: v)
        for b in batches:
            loss, _ = objective.loss_sum(model, b)
            (loss / 4).backward()
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    for name in ("sigmoid", "ipo", "simpo", "beta_dpo", "kto"):  # KTO's z_0 comes from the whole step
        if name == "kto":  # a label, the second response as the mismatched one, a reference near the policy
            for i, ex in enumerate(examples):
                ex.desirable = i % 2 == 0
                ex.reference_logps = [together[i, 0].item() + 2.0 - i, together[i, 1].item() - 3.0 + i]
            model.train()  # training reads the step's z_0 from begin_step (evaluation: each micro-batch's own)
        one, four = grads(1, name), grads(4, name)
        assert four.abs().max() > 1e-3  # a real gradient, compared at 1e-5 of its scale
        torch.testing.assert_close(one, four, rtol=1e-3, atol=1e-5 * float(four.abs().max()))


def test_learning_raises_the_margin_and_accuracy(llama_dir, prefs, tmp_path):
    out = tmp_path / "run"
    summary = run_dpo(
        _cfg(llama_dir, prefs[0], out, **{"train.max_steps": 12, "data.eval_fraction": 0.25, "train.eval_every": 12})
    )
    rows = _metrics(out)
    assert rows[0]["step"] == 0 and rows[0]["eval0/rewards/margins"] == pytest.approx(0.0, abs=1e-5)  # π = π_ref
    train = [r for r in rows if r["step"] > 0]
    assert train[0]["train/rewards/margins"] == pytest.approx(0.0, abs=1e-5)
    assert train[-1]["train/rewards/margins"] > 0.5
    assert summary["eval/rewards/accuracy"] == 1.0 and summary["eval/rewards/margins"] > 0.5
    assert (out / "final" / "config.json").is_file() and summary["eval_history"][0]["step"] == 0


@pytest.mark.parametrize("loss", ["cdpo", "robust", "ipo", "hinge", "simpo", "orpo", "beta_dpo"])
def test_every_pairwise_loss_runs_and_moves_the_margin(llama_dir, prefs, tmp_path, loss):
    over = {"dpo.loss": loss, "dpo.label_smoothing": 0.1 if loss in ("cdpo", "robust") else 0.0}
    if loss == "beta_dpo":
        over["dpo.beta_dpo_weighting"] = True
    run_dpo(_cfg(llama_dir, prefs[0], tmp_path / loss, **over))
    rows = _metrics(tmp_path / loss)
    assert all(math.isfinite(r["train/loss"]) for r in rows)
    assert rows[-1]["train/rewards/margins"] > rows[0]["train/rewards/margins"]
    if loss == "beta_dpo":
        assert len({round(r["train/beta"], 6) for r in rows}) > 1  # β moves with the batch margin
    if loss in ("simpo", "orpo"):
        assert not (tmp_path / loss / "reference_cache").exists()  # no reference pass


def test_listwise_on_ranked_lists(llama_dir, prefs, tmp_path):
    run_dpo(
        _cfg(
            llama_dir,
            prefs[1],
            tmp_path / "lists",
            **{"dpo.loss": "listwise", "train.batch_size": 4, "train.micro_batch_size": 2},
        )
    )
    rows = _metrics(tmp_path / "lists")
    assert rows[-1]["train/rewards/margins"] > rows[0]["train/rewards/margins"]
    with pytest.raises(ConfigError, match="listwise"):
        run_dpo(_cfg(llama_dir, prefs[1], tmp_path / "lists2"))


def test_reference_cache_is_used_keyed_and_shared(llama_dir, prefs, tmp_path):
    cache = tmp_path / "shared-cache"
    first = run_dpo(_cfg(llama_dir, prefs[0], tmp_path / "a", **{"dpo.reference_cache": str(cache)}))
    assert first["reference_examples_computed"] == 32
    files = list(cache.glob("reference-logps-*.json"))
    assert len(files) == 1
    second = run_dpo(_cfg(llama_dir, prefs[0], tmp_path / "b", **{"dpo.reference_cache": str(cache)}))
    assert second["reference_examples_computed"] == 0  # found, not recomputed
    assert _metrics(tmp_path / "a")[0]["train/loss"] == _metrics(tmp_path / "b")[0]["train/loss"]
    # a wrong cache under the right key changes the loss: proof the cached values are what training uses
    stored = json.loads(files[0].read_text())
    stored["logps"] = [[c - 5.0, r + 5.0] for c, r in stored["logps"]]
    files[0].write_text(json.dumps(stored))
    run_dpo(_cfg(llama_dir, prefs[0], tmp_path / "c", **{"dpo.reference_cache": str(cache)}))
    assert _metrics(tmp_path / "c")[0]["train/loss"] != pytest.approx(
        _metrics(tmp_path / "a")[0]["train/loss"], abs=1e-3
    )
    # other data (or another reference) gets its own key and is computed afresh
    fewer = write_jsonl(tmp_path / "fewer.jsonl", [json.loads(x) for x in prefs[0].read_text().splitlines()[:16]])
    third = run_dpo(_cfg(llama_dir, fewer, tmp_path / "d", **{"dpo.reference_cache": str(cache)}))
    assert third["reference_examples_computed"] == 16 and len(list(cache.glob("*.json"))) == 2


def test_the_reference_cache_is_keyed_by_the_precision_that_scores(llama_dir, prefs, tmp_path):
    """Reference log-probs in bf16 are not fp32 ones: one cache folder, fp32 then bf16 (autocast, or bf16 weights),
    and each precision computes its own, then finds it."""
    from tether.stages.dpo_reference import ReferenceLogps

    cache = str(tmp_path / "shared-cache")
    one_step = {"dpo.reference_cache": cache, "train.max_steps": 1, "train.save_every": 0}
    assert run_dpo(_cfg(llama_dir, prefs[0], tmp_path / "fp32", **one_step))["reference_examples_computed"] == 8
    for name, precision in (("autocast", {"model.mixed_precision": "bf16"}), ("weights", {"model.dtype": "bf16"})):
        if bf16_refused_here():
            with pytest.raises(ConfigError, match=BF16_REFUSED):
                run_dpo(_cfg(llama_dir, prefs[0], tmp_path / name, **one_step, **precision))
            continue
        for again, computed in (("", 8), ("-again", 0)):  # a miss, then found
            summary = run_dpo(_cfg(llama_dir, prefs[0], tmp_path / (name + again), **one_step, **precision))
            assert summary["reference_examples_computed"] == computed, (name, again)

    def key(fresh=True, **model):
        model_cfg = _cfg(llama_dir, prefs[0], tmp_path / "k", **model).model
        reference = ReferenceLogps(model_cfg, cache, 8, load_tokenizer(llama_dir), None, "cpu", fresh_policy=fresh)
        return reference.scoring

    assert key(**{"model.dtype": "fp32"}) == key(**{"model.dtype": "float32"})  # one dtype, two spellings
    assert key(**{"model.chunked_head": True}) == key()  # the same log-probs up to rounding, as the layouts
    # a fresh run scores with the policy in --dtype, a resumed one with the reference loaded in --frozen-dtype
    assert key(**{"model.frozen_dtype": "bf16"}) == key()
    assert key(**{"model.frozen_dtype": "bf16"}, fresh=False) != key(fresh=False)


def test_the_reference_scores_only_the_pairs_the_run_visits(llama_dir, prefs, tmp_path):
    """One step of 8 pairs out of 32: the reference pass scores those 8, not the whole file."""
    summary = run_dpo(_cfg(llama_dir, prefs[0], tmp_path / "one", **{"train.max_steps": 1, "train.save_every": 0}))
    assert summary["reference_examples_computed"] == 8 and summary["train_examples"] == 32


def test_lora_reference_is_the_adapter_disabled_model(llama_dir, tokenizer, prefs, tmp_path):
    from tether.stages.dpo_reference import sequence_logps

    out = tmp_path / "lora"
    run_dpo(_cfg(llama_dir, prefs[0], out, **{"model.lora_r": 4, "optim.lr": 1e-2}))
    cached = json.loads(next((out / "reference_cache").glob("*.json")).read_text())
    examples, _ = tokenize_policy_preferences(read_records(prefs[0]), tokenizer, 1024)
    base = sequence_logps(load_model(llama_dir, tokenizer), examples, tokenizer.pad_token_id, 8, "cpu")
    assert torch.allclose(torch.tensor(cached["logps"]), torch.tensor(base), atol=1e-4)
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    with pytest.raises(ConfigError, match="LoRA adapter folder"):
        run_dpo(_cfg(adapter, prefs[0], tmp_path / "refused", **{"model.lora_r": 4}))


def test_a_killed_run_resumes_to_the_same_metrics(llama_dir, prefs, tmp_path, monkeypatch):
    over = {"dpo.loss": "beta_dpo", "dpo.beta_dpo_weighting": True}
    run_dpo(_cfg(llama_dir, prefs[0], tmp_path / "whole", **over))
    with killed_after_step(monkeypatch, 4), pytest.raises(KeyboardInterrupt):
        run_dpo(_cfg(llama_dir, prefs[0], tmp_path / "killed", **over))
    monkeypatch.undo()
    summary = run_dpo(
        _cfg(llama_dir, prefs[0], tmp_path / "killed", **{**over, "train.overwrite": False, "train.resume": True})
    )
    assert summary["resumed_from"] == 3 and summary["reference_examples_computed"] == 0
    whole = {r["step"]: r for r in _metrics(tmp_path / "whole")}
    for r in _metrics(tmp_path / "killed"):
        if r["step"] > 3:
            assert r["train/loss"] == pytest.approx(whole[r["step"]]["train/loss"], rel=1e-5)
            assert r["train/beta"] == pytest.approx(whole[r["step"]]["train/beta"], rel=1e-5)


JUDGE = """
def more_a(prompts, first, second, **_):
    return [1.0 if a.count("a") > b.count("a") else 0.0 if a.count("a") < b.count("a") else 0.5
            for a, b in zip(first, second)]

def nan_verdict(prompts, first, second, **_):
    return [float("nan")] * len(first)


def out_of_range(prompts, first, second, **_):
    return [2.0] * len(first)


def text_verdict(prompts, first, second, **_):
    return ["first"] * len(first)


def raising(prompts, first, second, **_):
    return [1 / 0]


def wrong_count(prompts, first, second, **_):
    return [1.0]
"""


def test_a_round_drops_pairs_with_an_empty_answer_and_counts_them(llama_dir, tokenizer, tmp_path):
    """An answer that is only its stop token (vLLM samples one now and then) has no text for the round's pairs file:
    its pair is dropped and counted as "empty", beside ties, identical and truncated pairs."""
    from tether.rollout.batch import Rollout
    from tether.rollout.prompts import response_mask_from_stops
    from tether.stages.dpo_online import sample_round_pairs

    answers = ["a a", "", "b", "b", "a", "c", "  ", "a"]  # per prompt: empty, identical, a pair, blank
    stop_ids = [tokenizer.eos_token_id]

    class Answers:  # the sampler's face sample_round_pairs reads: its rendered prompts, generate(indices, seeds)
        prompts = ["one", "two", "three", "four"]

        def generate(self, indices, seeds=None):
            prompts = [self.prompts[i] for i in indices]
            ids = [tokenizer(a, add_special_tokens=False)["input_ids"] + [stop_ids[0]] for a in answers]
            width = max(map(len, ids))
            response = torch.tensor([x + [stop_ids[0]] * (width - len(x)) for x in ids])
            mask, truncated = response_mask_from_stops(response, stop_ids)
            enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
            return Rollout(enc["input_ids"], enc["attention_mask"], response, mask, truncated, prompts, answers)

    def more_a(rows, rollout):
        n = [r.count("a") for r in rollout.responses]
        pref = [1.0 if x > y else 0.0 if x < y else 0.5 for x, y in zip(n[0::2], n[1::2])]
        return pref, [float(x) for x in n]

    judge = tmp_path / "judge.py"
    judge.write_text(JUDGE)
    over = {"data.path": "", "online.online": True, "rollout.prompts": "x.jsonl", "online.judge": f"{judge}:more_a"}
    cfg = _cfg(llama_dir, "", tmp_path, **over)  # the judge named; the labeller below is the same rule in-process
    rows = [{"prompt": w} for w in Answers.prompts]
    pairs, counts, samples, _ = sample_round_pairs(Answers(), rows, [0, 1, 2, 3], more_a, cfg, 0, 1)
    assert counts == {"prompts": 4, "ties": 0, "truncated": 0, "identical": 1, "empty": 2, "pairs": 1}
    assert [(p["chosen"], p["rejected"]) for p in pairs] == [("a", "c")] and len(samples) == 8


def test_online_rounds_sample_label_train_and_resume(llama_dir, tmp_path, monkeypatch):
    judge = tmp_path / "judge.py"
    judge.write_text(JUDGE)
    prompts = write_jsonl(
        tmp_path / "prompts.jsonl",
        [{"prompt": [{"role": "user", "content": f"Say {w}."}]} for w in ("hi", "cats", "dogs", "rain")] * 4,
    )
    over = {
        "data.path": "",
        "online.online": True,
        "rollout.prompts": str(prompts),
        "online.judge": f"{judge}:more_a",
        "online.rounds": 3,
        "rollout.prompts_per_step": 8,
        "online.steps_per_round": 2,
        "rollout.max_new_tokens": 12,
        "online.keep_truncated": True,
        "train.batch_size": 4,
        "train.micro_batch_size": 4,
        "train.save_every": 2,
    }
    summary = run_dpo(_cfg(llama_dir, "", tmp_path / "online", **over))
    rounds = sorted((tmp_path / "online" / "rounds").glob("round-*.jsonl"))
    assert len(rounds) == 3 and len(summary["online_rounds"]) == 3
    for row in (json.loads(x) for x in rounds[0].read_text().splitlines()):
        assert row["chosen"][0]["content"].count("a") > row["rejected"][0]["content"].count("a")
    counts = summary["online_rounds"][0]
    assert counts["pairs"] + counts["ties"] + counts["identical"] + counts["truncated"] == 8
    # every sampled answer reaches samples.jsonl with its side of the verdict, for the monitors
    samples = [json.loads(x) for x in (tmp_path / "online" / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 3 * 8 * 2 and sorted({x["step"] for x in samples}) == [1, 3, 5]  # each round's first step
    first_pair = json.loads(rounds[0].read_text().splitlines()[0])
    (chosen,) = [x for x in samples if x["step"] == 1 and x["response"] == first_pair["chosen"][0]["content"]][:1]
    assert chosen["score"] == 1.0 and "alarms" in summary
    whole = {r["step"]: r for r in _metrics(tmp_path / "online")}
    with killed_after_step(monkeypatch, 3), pytest.raises(KeyboardInterrupt):
        run_dpo(_cfg(llama_dir, "", tmp_path / "again", **over))
    monkeypatch.undo()
    run_dpo(_cfg(llama_dir, "", tmp_path / "again", **{**over, "train.overwrite": False, "train.resume": True}))
    for r in _metrics(tmp_path / "again"):
        assert r["train/loss"] == pytest.approx(whole[r["step"]]["train/loss"], rel=1e-5)
    assert (tmp_path / "again" / "samples.jsonl").read_text() == (tmp_path / "online" / "samples.jsonl").read_text()
    with pytest.raises(ConfigError, match="returned 1 values for"):
        run_dpo(_cfg(llama_dir, "", tmp_path / "bad", **{**over, "online.judge": f"{judge}:wrong_count"}))
    for bad, message in (
        ("nan_verdict", r"verdict 0 is nan"),
        ("out_of_range", r"verdict 0 is 2.0"),
        ("text_verdict", r"verdict 0 is 'first'"),
        ("raising", r"raised ZeroDivisionError"),
    ):
        with pytest.raises(ConfigError, match=rf"step 1: --judge .*:{bad}.*{message}"):
            run_dpo(_cfg(llama_dir, "", tmp_path / bad, **{**over, "online.judge": f"{judge}:{bad}"}))


def test_cli_runs_and_missing_data_is_a_clean_error(llama_dir, prefs, tmp_path):
    ok = subprocess.run(
        [
            sys.executable,
            "-m",
            "tether",
            "dpo",
            "--model",
            str(llama_dir),
            "--data",
            str(prefs[0]),
            "--output",
            str(tmp_path / "cli"),
            "--loss",
            "ipo",
            "--max-steps",
            "2",
            "--batch-size",
            "4",
            "--micro-batch-size",
            "4",
            "--report-to",
            "none",
        ],
        capture_output=True,
        text=True,
    )
    assert ok.returncode == 0, ok.stderr
    assert json.loads((tmp_path / "cli" / "summary.json").read_text())["loss"] == "ipo"
    bad = subprocess.run(
        [sys.executable, "-m", "tether", "dpo", "--model", str(llama_dir), "--output", str(tmp_path / "x")],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "--data is required" in bad.stderr and "Traceback" not in bad.stderr


def test_dropout_is_off_by_default_so_the_first_loss_is_log_2(tokenizer, prefs, tmp_path):
    """A model with dropout 0.3: the policy (training mode) and the reference (eval mode) agree only when dropout is
    disabled, as it is by default; keep_dropout brings it back (and the first loss moves off log 2)."""
    from tether.models.lm import build_tiny_model

    folder = build_tiny_model(
        "gpt2", tokenizer, tmp_path / "dropout-model", seed=0, hidden=32, layers=2, heads=2, max_positions=128
    )
    config = json.loads((folder / "config.json").read_text())
    config.update(resid_pdrop=0.3, embd_pdrop=0.3, attn_pdrop=0.3)
    (folder / "config.json").write_text(json.dumps(config))
    first = lambda out: _metrics(out)[0]["train/loss"]
    run_dpo(_cfg(folder, prefs[0], tmp_path / "off", **{"train.max_steps": 1}))
    assert first(tmp_path / "off") == pytest.approx(math.log(2), abs=1e-6)
    run_dpo(_cfg(folder, prefs[0], tmp_path / "on", **{"train.max_steps": 1, "model.keep_dropout": True}))
    assert abs(first(tmp_path / "on") - math.log(2)) > 1e-4
    plan = yaml.safe_load((tmp_path / "on" / "config.yaml").read_text())["plan"]["micro-batch rows"]
    assert "prompts not shared: dropout is on" in plan  # each response its own dropout mask, as in its own row


def test_implicit_prompt_pairs_read_as_the_explicit_ones(tokenizer, tmp_path):
    """TRL's implicit prompt: two whole conversations; the messages both open with are the prompt."""
    user = [{"role": "user", "content": "Name a cat."}]
    good, bad = [{"role": "assistant", "content": "Tom."}], [{"role": "assistant", "content": "A dog."}]
    explicit = write_jsonl(tmp_path / "explicit.jsonl", [{"prompt": user, "chosen": good, "rejected": bad}])
    implicit = write_jsonl(tmp_path / "implicit.jsonl", [{"chosen": user + good, "rejected": user + bad}])
    (a,), _ = tokenize_policy_preferences(read_records(explicit), tokenizer, 256)
    (b,), _ = tokenize_policy_preferences(read_records(implicit), tokenizer, 256)
    assert [(r.input_ids, r.loss_mask) for r in a.responses] == [(r.input_ids, r.loss_mask) for r in b.responses]
    unrelated = write_jsonl(tmp_path / "unrelated.jsonl", [{"chosen": good, "rejected": bad}])
    with pytest.raises(DataError, match=r"unrelated.jsonl:1: .*share no opening message"):
        tokenize_policy_preferences(read_records(unrelated), tokenizer, 256)
    prefix = write_jsonl(tmp_path / "prefix.jsonl", [{"chosen": user + good, "rejected": user}])
    with pytest.raises(DataError, match="is the start of the other"):
        tokenize_policy_preferences(read_records(prefix), tokenizer, 256)


def test_shared_prompts_train_as_one_prompt_per_response(llama_dir, prefs, tmp_path):
    """The same run with each pair's prompt forwarded once (the default) and once per response, and with the LM head
    in chunks (--chunked-head, the reference pass too): the plan says which, and the first step's log-probs and
    loss agree to float32 rounding (the forwards differ in shape and order of sums only)."""

    rows, plans = [], []
    for share, chunked in ((True, False), (False, False), (True, True)):
        out = tmp_path / f"share-{share}-{chunked}"
        settings = {"train.max_steps": 2, "train.log_every": 1, "model.share_prompt": share}
        run_dpo(_cfg(llama_dir, prefs[0], out, **settings, **{"model.chunked_head": chunked}))
        rows.append(_metrics(out)[0])
        plans.append(yaml.safe_load((out / "config.yaml").read_text())["plan"])
    assert "responses after one copy of it" in plans[0]["micro-batch rows"] and ";" not in plans[1]["micro-batch rows"]
    assert "recomputed in the backward" in plans[2]["LM head"] and "only" in plans[0]["LM head"]
    for key in ("train/logps/chosen", "train/logps/rejected", "train/loss"):
        assert rows[0][key] == pytest.approx(rows[1][key], rel=1e-5), key
        assert rows[2][key] == pytest.approx(rows[0][key], rel=1e-5), key
    out = tmp_path / "kto"
    run_dpo(_cfg(llama_dir, prefs[0], out, **{"train.max_steps": 1, "dpo.loss": "kto"}))
    plan = yaml.safe_load((out / "config.yaml").read_text())["plan"]["micro-batch rows"]
    assert "prompts not shared: KTO forwards its two blocks apart" in plan


def test_kto_on_pairs_compares_with_another_records_answer_and_drops_equal_pairs(tokenizer, tmp_path):
    """KTO on pairs took a row's "mismatched" completion from the same pair (chosen's was its own rejected), and a
    pair with chosen == rejected was an error without its line, where the pairwise losses drop and count it."""
    from tether.data.dpo import tokenize_unpaired

    rows = [{"prompt": f"Q{i}?", "chosen": f" good {i}", "rejected": f" bad {i}"} for i in range(4)]
    rows[1]["rejected"] = rows[1]["chosen"]
    path = write_jsonl(tmp_path / "pairs.jsonl", rows)
    examples, report = tokenize_unpaired(read_records(path), tokenizer, 128, path=str(path))
    mismatched = [tokenizer.decode(e.responses[1].input_ids) for e in examples]
    # records 1, 3, 4 kept (2 dropped): each half of a pair is compared with the next kept record's chosen
    assert [e.where.rsplit("/", 1)[1] for e in examples[::2]] == [
        "pairs.jsonl:1 (chosen)",
        "pairs.jsonl:3 (chosen)",
        "pairs.jsonl:4 (chosen)",
    ]
    assert [m.split("?", 1)[1].split("<")[0] for m in mismatched] == [
        " good 2",
        " good 2",
        " good 3",
        " good 3",
        " good 0",
        " good 0",
    ]
    assert report.dropped == {"with chosen equal to rejected": 1} and report.examples == 6
    with pytest.raises(DataError, match=r"pairs.jsonl:2: example with chosen equal to rejected \(--strict\)"):
        tokenize_unpaired(read_records(path), tokenizer, 128, strict=True, path=str(path))
    with pytest.raises(DataError, match="KTO needs at least 2 records"):
        tokenize_unpaired(read_records(write_jsonl(tmp_path / "one.jsonl", rows[:1])), tokenizer, 128)
