"""Reward models: padding invariance, the objective, tether rm end to end, over-fitting, normalisation."""

import json
import math
import re

import pytest
import torch
from conftest import assert_resumes_exactly, write_jsonl
from transformers import AutoModelForSequenceClassification

from tether.config import ConfigError, build_config
from tether.data.preferences import collate_preferences, tokenize_preferences
from tether.data.records import DataError, Record
from tether.lab.world import WorldConfig, build_world
from tether.models.lm import load_tokenizer
from tether.models.reward import load_normalization, load_reward_model, score_texts
from tether.stages.rm import RewardObjective, RMConfig, run_rm
from tether.train.early_stop import OverfitDetector


@pytest.mark.parametrize("arch", ["gpt2", "llama", "qwen2"])
def test_score_is_invariant_to_padding_side_and_amount(arch, model_dirs):
    tok = load_tokenizer(model_dirs[arch])
    rm = load_reward_model(model_dirs[arch], tok)
    torch.manual_seed(0)
    with torch.no_grad():
        rm.inner.score.weight.normal_()  # a non-zero head, so scores differ between texts
    rm.eval()
    ids = [[5, 6, 7, 8, 9], [10, 11, 12]]
    alone = torch.stack([rm(torch.tensor([r]), torch.ones(1, len(r), dtype=torch.long))[0] for r in ids])
    for side in ("right", "left"):
        for extra in (0, 4):
            width = 5 + extra
            batch = torch.full((2, width), tok.pad_token_id)
            mask = torch.zeros((2, width), dtype=torch.long)
            for i, r in enumerate(ids):
                if side == "right":
                    batch[i, : len(r)], mask[i, : len(r)] = torch.tensor(r), 1
                else:
                    batch[i, width - len(r) :], mask[i, width - len(r) :] = torch.tensor(r), 1
            torch.testing.assert_close(rm(batch, mask), alone, atol=1e-5, rtol=1e-4)
    # The pad id plays no part: padding with EOS (a real token id) gives the same scores.
    eos_padded = torch.tensor([[10, 11, 12, tok.eos_token_id, tok.eos_token_id]])
    torch.testing.assert_close(rm(eos_padded, torch.tensor([[1, 1, 1, 0, 0]]))[0], alone[1], atol=1e-5, rtol=1e-4)


def test_new_heads_start_at_zero_and_are_named(llama_dir):
    tok = load_tokenizer(llama_dir)
    rm = load_reward_model(llama_dir, tok, ["helpful", "safe"])
    assert rm.head_names == ["helpful", "safe"]
    assert torch.all(rm(torch.tensor([[5, 6]]), torch.ones(1, 2, dtype=torch.long)) == 0)


def test_pair_objective_hand_computed():
    objective = RewardObjective(center_coef=0.5)
    scores = torch.tensor(
        [
            [2.0, 0.0],
            [1.0, 1.0],  # chosen rows: pair 0, pair 1
            [0.0, 1.0],
            [1.0, 0.0],
        ]
    )  # rejected rows
    batch = {"margin": torch.tensor([1.0, 0.0]), "head_labels": torch.tensor([[1, -1], [1, 0]])}
    loss, stats = objective.pair_losses(scores, batch)
    sp = lambda d: math.log1p(math.exp(-d))  # −log σ(d)
    # pair 0: head 0 −log σ(2−0−1) + 0.5·(2+0)²; head 1 labelled "rejected": −log σ(1−0) + 0.5·(0+1)²
    # pair 1: head 0 −log σ(1−1) + 0.5·(1+1)²; head 1 unlabelled: nothing
    expected = (sp(1) + 2.0) + (sp(1) + 0.5) + (sp(0) + 2.0)
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    assert stats["accuracy"].item() == 1.0  # pair 0 right (2 > 0), pair 1 tied (1 > 1 is false)
    assert stats["margin"].item() == pytest.approx(2.0)


def test_ranked_list_objective_matches_plackett_luce():
    from tether.algorithms.reward import plackett_luce_loss

    objective = RewardObjective("plackett-luce")
    scores = torch.tensor([[3.0], [1.0], [2.0], [0.5], [0.0], [9.0]])  # 2 lists of K=3, best first
    mask = torch.tensor([[True, True, True], [True, True, False]])

    class Fixed(torch.nn.Module):
        def forward(self, input_ids, attention_mask):
            return scores

    loss, stats = objective.loss_sum(Fixed(), {"input_ids": None, "attention_mask": None, "list_mask": mask})
    assert loss.item() == pytest.approx(plackett_luce_loss(scores.view(2, 3), mask).sum().item())
    assert stats["accuracy"].item() == pytest.approx(2 / 3 + 1.0)  # list 1: (3>1, 3>2, 1<2); list 2: 0.5 > 0


def test_ranked_lists_refuse_the_pair_only_options_by_name(llama_dir, tokenizer, tmp_path):
    """A list's loss reads the first head's scores alone: a margin column, extra heads and reward centring would be
    ignored, so each is refused by flag and file before anything trains (and never counted as a column read)."""
    lists = [{"prompt": "Q: ", "responses": ["a b", "c d", "e"], "ranking": [1, 2, 0], "m": 1.0, "safe": "chosen"}] * 8
    path = write_jsonl(tmp_path / "lists.jsonl", lists)
    records = [Record(r, f"lists.jsonl:{i}") for i, r in enumerate(lists, start=1)]
    with pytest.raises(DataError, match=r"lists.jsonl: .*--margin-column m"):
        tokenize_preferences(records, tokenizer, 64, ["reward"], "m", path="lists.jsonl")
    with pytest.raises(DataError, match=r"lists.jsonl: .*--heads reward,safe"):
        tokenize_preferences(records, tokenizer, 64, ["reward", "safe"], path="lists.jsonl")
    _, report = tokenize_preferences(records, tokenizer, 64, ["reward"], path="lists.jsonl")
    assert report.unused == ["m", "safe"]
    for over, flag in (
        ({"rm__center_coef": 0.1}, r"--center-coef 0.1"),
        ({"data__margin_column": "m"}, r"--margin-column m"),
        ({"rm__heads": ["reward", "safe"]}, r"--heads reward,safe"),
    ):
        out = tmp_path / flag.split()[0].strip("-")
        with pytest.raises((ConfigError, DataError), match=rf"{re.escape(str(path))}.*{flag}"):
            run_rm(rm_config(llama_dir, path, path, out, **over))
        assert not out.exists()  # refused before the run folder was made


def test_preference_data_errors_and_drops(tokenizer):
    rec = lambda fields, i=1: Record(fields, f"p.jsonl:{i}")
    with pytest.raises(DataError, match=r"p.jsonl:1: preference data needs 'chosen' and 'rejected'"):
        tokenize_preferences([rec({"prompt": "a", "answer": "b"})], tokenizer, 64, ["reward"])
    with pytest.raises(DataError, match=r"p.jsonl:1: field 'score' must be a number"):
        tokenize_preferences(
            [rec({"prompt": "a", "chosen": "b", "rejected": "c", "score": "big"})],
            tokenizer,
            64,
            ["reward"],
            margin_column="score",
        )
    with pytest.raises(
        DataError, match=r"p.jsonl:1: field 'safe' \(label of head safe\) must be 'chosen', 'rejected' or null"
    ):
        tokenize_preferences([rec({"chosen": "b", "rejected": "c", "safe": "yes"})], tokenizer, 64, ["reward", "safe"])
    with pytest.raises(DataError, match=r"p.jsonl:1: field 'ranking' must list every index"):
        tokenize_preferences([rec({"responses": ["a", "b"], "ranking": [0, 0]})], tokenizer, 64, ["reward"])
    rows = [
        rec({"prompt": "q", "chosen": "same", "rejected": "same"}),
        rec({"prompt": "q", "chosen": "x" * 200, "rejected": "y"}, 2),
        rec({"prompt": "q", "chosen": "good", "rejected": "bad"}, 3),
    ]
    examples, report = tokenize_preferences(rows, tokenizer, 64, ["reward"])
    assert len(examples) == 1
    assert report.dropped == {"with chosen equal to rejected": 1, "longer than max_length=64 tokens": 1}
    with pytest.raises(DataError, match=r"p.jsonl:1: example with chosen equal to rejected \(--strict\)"):
        tokenize_preferences(rows, tokenizer, 64, ["reward"], strict=True)
    batch = collate_preferences(examples, tokenizer.pad_token_id)
    assert batch["input_ids"].shape[0] == 2  # chosen and rejected in one forward


def test_overfit_detector_logic():
    det = OverfitDetector(drop=0.02, patience=2)
    fired = [det.update(s, a) for s, a in [(1, 0.6), (2, 0.7), (3, 0.69), (4, 0.67), (5, 0.66), (6, 0.5)]]
    # 0.69 is within 0.02 of the best 0.7; 0.67 and 0.66 are two in a row below 0.68 -> fires at step 5, once
    assert fired == [False, False, False, False, True, False]
    assert det.best == 0.7 and det.best_step == 2 and det.fired_at == 5


@pytest.fixture(scope="module")
def lab_prefs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("prefs")
    build_world(
        folder,
        WorldConfig(
            n_pretrain_arith=10,
            n_pretrain_assist=20,
            n_sft_arith=10,
            n_sft_assist=10,
            n_rl_arith=10,
            n_eval_arith=10,
            n_pairs=400,
            n_pairs_eval=150,
            n_rankings=40,
        ),
    )
    return folder


@pytest.fixture(scope="module")
def llama256(tmp_path_factory, tokenizer):
    """The tiny llama with 256 positions (the lab pairs run to 256 tokens with the test tokenizer): the same
    weights as llama_dir's — a Llama has no position table — but a context that holds the data."""
    from tether.models.lm import build_tiny_model

    folder = tmp_path_factory.mktemp("rm-base") / "llama"
    return build_tiny_model("llama", tokenizer, folder, seed=0, hidden=32, layers=2, heads=2, max_positions=256)


def rm_config(model_dir, train, evals, out, **extra):
    overrides = {
        "model.path": str(model_dir),
        "data.path": str(train),
        "data.eval_path": str(evals),
        "data.max_length": 256,
        "optim.lr": 3e-3,
        "train.output": str(out),
        "train.batch_size": 16,
        "train.micro_batch_size": 8,
        "train.save_every": 0,
        "train.report_to": ["none"],
    }
    overrides.update({k.replace("__", "."): v for k, v in extra.items()})
    return build_config(RMConfig, overrides=overrides)


@pytest.mark.slow
def test_overfitting_run_fires_the_detector_and_stops(llama256, lab_prefs, tmp_path):
    rows = (lab_prefs / "prefs.jsonl").read_text().splitlines()
    small = tmp_path / "small.jsonl"
    small.write_text("\n".join(rows[:48]) + "\n")  # tiny data, many epochs
    summary = run_rm(
        rm_config(
            llama256,
            small,
            lab_prefs / "prefs_eval.jsonl",
            tmp_path / "rm",
            train__epochs=60.0,
            train__eval_every=5,
            rm__overfit_patience=3,
            rm__early_stop=True,
        )
    )
    assert summary["overfit_alarm_step"] is not None
    assert summary["steps"] == summary["overfit_alarm_step"] < 180  # stopped early
    best = max(a for _, a in summary["eval_history"])
    assert summary["best_accuracy"] == best and summary["eval/accuracy"] < best - 0.02
    metrics = [json.loads(line) for line in (tmp_path / "rm" / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["eval/overfit_alarm"] == 1.0
    assert (tmp_path / "rm" / "best" / "reward_normalization.json").is_file()


def test_an_early_stopped_run_killed_before_final_resumes_to_the_same_end(llama256, lab_prefs, tmp_path, monkeypatch):
    """The stop is kept with its checkpoint: killed before final/, the resumed run trains no further (it once trained
    on to --max-steps past the stop) and writes the uninterrupted run's final/ and summary; killed after final/ and
    before summary.json, it writes them again (it once refused: 'nothing left to train')."""
    from conftest import kill_before_final
    from safetensors.torch import load_file

    from tether.stages import rm as rm_stage
    from tether.train import offline_run

    small = tmp_path / "small.jsonl"
    small.write_text("\n".join((lab_prefs / "prefs.jsonl").read_text().splitlines()[:48]) + "\n")
    settings = dict(train__epochs=60.0, train__eval_every=5, train__save_every=5, rm__early_stop=True)
    cfg = lambda out, **kw: rm_config(llama256, small, lab_prefs / "prefs_eval.jsonl", out, **settings, **kw)
    whole = run_rm(cfg(tmp_path / "whole"))
    assert whole["steps"] == whole["overfit_alarm_step"] < 180
    kill_before_final(monkeypatch, rm_stage)
    with pytest.raises(KeyboardInterrupt):
        run_rm(cfg(tmp_path / "killed"))
    monkeypatch.undo()
    assert not (tmp_path / "killed" / "final").exists()
    resumed = run_rm(cfg(tmp_path / "killed", train__resume=True))
    weights = [load_file(tmp_path / out / "final" / "model.safetensors") for out in ("whole", "killed")]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    for out in ("whole", "killed"):
        assert (tmp_path / out / "best" / "reward_normalization.json").is_file()
    # the resumed run's probes score the held-out answers again (the final evaluation's scores are not at hand:
    # texts_scored counts that work), in other batches, so its statistics of the same weights differ by float32
    # rounding: 284 scores (|r| < 10 here) by at most 284 · 2⁻²⁴ · 10 ≈ 2e-4 in their mean; everything else is equal
    scored = ("normalization", "probes")

    def leaves(tree, path=""):
        if isinstance(tree, dict):
            return {k: v for key in tree for k, v in leaves(tree[key], f"{path}/{key}").items()}
        return {path: tree}

    for key in scored:
        got, want = leaves(resumed[key]), leaves(whole[key])
        got.pop("/texts_scored", None), want.pop("/texts_scored", None)
        numbers = {k for k, v in want.items() if isinstance(v, float)}
        assert {k: got[k] for k in numbers} == pytest.approx({k: want[k] for k in numbers}, abs=2e-4, rel=0)
        assert {k: v for k, v in got.items() if k not in numbers} == {k: v for k, v in want.items() if k not in numbers}
    other = ("wall_s", "peak_memory", "resumed_from", *scored)
    assert {k: v for k, v in resumed.items() if k not in other} == {k: v for k, v in whole.items() if k not in other}
    # killed after final/, before summary.json: resumed, the tail is written again
    (tmp_path / "killed" / "summary.json").unlink()
    monkeypatch.setattr(offline_run, "write_json", lambda path, data: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        run_rm(cfg(tmp_path / "killed", train__resume=True))
    monkeypatch.undo()
    again = run_rm(cfg(tmp_path / "killed", train__resume=True))
    assert again["steps"] == whole["steps"] and (tmp_path / "killed" / "summary.json").is_file()


@pytest.mark.slow
def test_rm_learns_the_lab_preferences_and_writes_probes_and_normalisation(llama256, lab_prefs, tmp_path):
    out = tmp_path / "rm"
    summary = run_rm(
        rm_config(
            llama256,
            lab_prefs / "prefs.jsonl",
            lab_prefs / "prefs_eval.jsonl",
            out,
            train__epochs=2.0,
            train__eval_every=10,
        )
    )
    assert summary["eval/accuracy"] > 0.6  # above chance (0.5) on held-out prompts, from a random tiny model
    for key in ("eval/margin", "eval/chosen_mean", "eval/chosen_q90", "eval/rejected_std"):
        assert key in summary
    probes = summary["probes"]
    assert -1 <= probes["length_correlation"] <= 1 and set(probes["counterfactual"]) == {"filler", "confident"}
    norm = load_normalization(out / "final")
    assert norm["reward"]["n"] > 200 and norm["reward"]["std"] > 0
    # nothing scored twice: the held-out responses (the length probe's texts, the counterfactual originals and the
    # normalisation set) come from the final evaluation; only the two probes' modified chosen answers (one per pair
    # each: n in all) go through the model — scoring every call's texts afresh took 4n more
    assert probes["texts_scored"] == norm["reward"]["n"]
    # final/ is a standard sequence-classification folder
    hf = AutoModelForSequenceClassification.from_pretrained(out / "final")
    assert hf.config.num_labels == 1 and hf.config.id2label[0] == "reward"
    # normalised scores over the reference set have mean 0 and std 1
    tok = load_tokenizer(out / "final")
    rm = load_reward_model(out / "final", tok)
    from tether.data.preferences import render_response

    rows = [json.loads(line) for line in (lab_prefs / "prefs_eval.jsonl").read_text().splitlines()]
    fits = lambda r: all(
        len(tok(render_response(tok, r["prompt"], r[s], "t", s))["input_ids"]) <= 256 for s in ("chosen", "rejected")
    )
    texts = [render_response(tok, r["prompt"], r[s], "t", s) for r in rows if fits(r) for s in ("chosen", "rejected")]
    assert len(texts) == norm["reward"]["n"]  # the reference set: held-out pairs kept by the length policy
    z = (score_texts(rm, tok, texts)[:, 0] - norm["reward"]["mean"]) / norm["reward"]["std"]
    assert abs(z.mean().item()) < 1e-3 and abs(z.std(unbiased=False).item() - 1) < 1e-3


def test_normalisation_asked_but_missing_is_an_error(llama_dir):
    with pytest.raises(ConfigError, match="reward_normalization.json does not exist"):
        load_normalization(llama_dir)


@pytest.mark.slow
def test_multi_head_ranked_and_lora_variants_train(llama_dir, tmp_path):
    pairs = [
        {
            "prompt": f"Q{i}: ",
            "chosen": "Cats sleep a lot.",
            "rejected": "Cats are dogs.",
            "safe": ["chosen", "rejected", None][i % 3],
        }
        for i in range(24)
    ]
    write_jsonl(tmp_path / "pairs.jsonl", pairs)
    s = run_rm(
        rm_config(
            llama_dir,
            tmp_path / "pairs.jsonl",
            tmp_path / "pairs.jsonl",
            tmp_path / "multi",
            rm__heads=["helpful", "safe"],
            train__max_steps=6,
        )
    )
    assert "eval/accuracy_safe" in s and s["heads"] == ["helpful", "safe"]
    lists = [{"prompt": "Q: ", "responses": ["a b", "Cats sleep a lot.", "Cats are dogs."], "ranking": [1, 2, 0]}] * 16
    write_jsonl(tmp_path / "lists.jsonl", lists)
    for loss in ("plackett-luce", "all-pairs"):
        s = run_rm(
            rm_config(
                llama_dir,
                tmp_path / "lists.jsonl",
                tmp_path / "lists.jsonl",
                tmp_path / loss,
                rm__ranking_loss=loss,
                train__max_steps=8,
            )
        )
        assert s["eval/accuracy"] > 0.5
    s = run_rm(
        rm_config(
            llama_dir,
            tmp_path / "pairs.jsonl",
            tmp_path / "pairs.jsonl",
            tmp_path / "lora",
            model__lora_r=4,
            model__lora_alpha=8.0,
            train__max_steps=4,
        )
    )
    merged = AutoModelForSequenceClassification.from_pretrained(tmp_path / "lora" / "final")
    assert not any("lora" in n for n, _ in merged.named_parameters())


def test_rm_resume_matches_the_uninterrupted_run(llama256, lab_prefs, tmp_path, monkeypatch):
    rows = (lab_prefs / "prefs.jsonl").read_text().splitlines()
    small = tmp_path / "small.jsonl"
    small.write_text("\n".join(rows[:64]) + "\n")
    cfg = lambda out, **kw: rm_config(
        llama256,
        small,
        lab_prefs / "prefs_eval.jsonl",
        out,
        train__max_steps=6,
        train__save_every=2,
        train__eval_every=3,
        **kw,
    )
    assert_resumes_exactly(run_rm, cfg, tmp_path, monkeypatch, kill_after=5, resumed_from=4)


def test_scorer_normalises_combines_heads_and_probe_file(llama_dir, tmp_path):
    from tether.models.reward import RewardScorer

    pairs = [
        {
            "prompt": f"Q{i}: ",
            "chosen": "Cats sleep a lot.",
            "rejected": "Cats are dogs.",
            "safe": "rejected" if i % 2 else "chosen",
        }
        for i in range(16)
    ]
    write_jsonl(tmp_path / "pairs.jsonl", pairs)
    probes = [
        {
            "prompt": "Q: ",
            "original": "Cats sleep a lot.",
            "modified": "Cats sleep a lot. Cats sleep a lot.",
            "probe": "repeat",
        }
    ] * 3
    write_jsonl(tmp_path / "probes.jsonl", probes)
    out = tmp_path / "rm"
    summary = run_rm(
        rm_config(
            llama_dir,
            tmp_path / "pairs.jsonl",
            tmp_path / "pairs.jsonl",
            out,
            rm__heads=["helpful", "safe"],
            train__max_steps=4,
            data__probe_path=str(tmp_path / "probes.jsonl"),
        )
    )
    assert summary["probes"]["counterfactual"]["repeat"]["n"] == 3
    texts = ["Q: Cats sleep a lot.<|im_end|>", "Q: Cats are dogs.<|im_end|>"]
    raw = RewardScorer(out / "final", normalize=False).head_scores(texts)
    stats = load_normalization(out / "final")
    scorer = RewardScorer(out / "final", weights={"helpful": 1.0, "safe": 0.5})
    expected = (raw[:, 0] - stats["helpful"]["mean"]) / stats["helpful"]["std"] + 0.5 * (
        raw[:, 1] - stats["safe"]["mean"]
    ) / stats["safe"]["std"]
    assert scorer(texts) == pytest.approx(expected.tolist(), rel=1e-5, abs=1e-6)
    with pytest.raises(ConfigError, match=r"reward weights name heads \['harmless'\]"):
        RewardScorer(out / "final", weights={"harmless": 1.0})
    (out / "final" / "reward_normalization.json").unlink()
    with pytest.raises(ConfigError, match="normalisation was asked for"):
        RewardScorer(out / "final")


def test_margins_must_be_finite_and_non_negative_and_rankings_integers(tokenizer, tmp_path):
    from tether.data.preferences import tokenize_preferences
    from tether.data.records import DataError, read_records

    def rows(*records):
        path = tmp_path / "prefs.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
        return read_records(path)

    pair = {"prompt": "Q", "chosen": "good answer", "rejected": "bad"}
    for margin in (float("nan"), float("inf"), -1.0):
        with pytest.raises(DataError, match=r"prefs.jsonl:1: field 'margin' must be a finite number >= 0"):
            tokenize_preferences(rows({**pair, "margin": margin}), tokenizer, 64, ["reward"], "margin")
    with pytest.raises(DataError, match=r"prefs.jsonl:1: field 'ranking' must list every index"):
        tokenize_preferences(
            rows({"prompt": "Q", "responses": ["a b", "c"], "ranking": [1.0, 0.0]}), tokenizer, 64, ["reward"]
        )


def test_score_texts_scores_each_text_once_and_its_batch_does_not_matter(llama_dir):
    """Sorted by length into batches, duplicates scored once: every score equals the text scored alone."""
    tok = load_tokenizer(llama_dir)
    rm = load_reward_model(llama_dir, tok)
    with torch.no_grad():
        rm.score_head.weight.normal_(0, 1.0)
    texts = ["hello there", "What is 12 + 7? 12 + 7 = 19. The answer is 19.", "hello there", "cats", "I am fine"]
    calls = []
    original = rm.forward
    rm.forward = lambda ids, mask: calls.append(ids.shape[0]) or original(ids, mask)
    together = score_texts(rm, tok, texts, batch_size=2)
    assert sum(calls) == 4  # four distinct texts
    for text, row in zip(texts, together):
        assert torch.allclose(row, score_texts(rm, tok, [text]), atol=1e-5)


def test_no_held_out_pairs_means_no_best_folder_and_no_claim_of_one(llama_dir, tmp_path, capsys):
    pairs = [{"prompt": f"Q{i}: ", "chosen": "Cats sleep a lot.", "rejected": "Cats are dogs."} for i in range(16)]
    write_jsonl(tmp_path / "pairs.jsonl", pairs)
    config = rm_config(
        llama_dir, tmp_path / "pairs.jsonl", "", tmp_path / "rm", data__eval_fraction=0.0, train__max_steps=2
    )
    summary = run_rm(config)
    printed = " ".join(capsys.readouterr().err.split())  # the console writes to stderr, wrapped
    assert not (tmp_path / "rm" / "best").exists() and summary["best_step"] is None
    assert (
        "no held-out pairs, so no validation accuracy and no best/" in printed and "best by validation" not in printed
    )


def test_the_probe_readings_follow_their_stated_rules():
    """By hand. Length: high from |r| = max(0.3, 2/√n). Shifts: high when raised − lowered > 2√(raised + lowered)."""
    from tether.stages.rm_probes import read_length_correlation, read_shift

    length = lambda r, n: (read_length_correlation(r, n)["high"], read_length_correlation(r, n)["threshold"])
    assert length(0.45, 400) == (True, 0.3)  # 2/√400 = 0.1 < 0.3: the 9 % share decides
    assert length(-0.6, 100) == (True, 0.3)  # a score that falls with length is as much a length bias
    assert length(0.25, 10_000) == (False, 0.3)  # beyond chance, but length explains 6 % of the variance
    assert length(0.5, 16) == (True, 0.5)  # 2/√16 = 0.5 exactly (float: 2 / 4.0): the bound is inclusive
    assert length(0.6, 9) == (False, 0.6667)  # 2/√9 = 0.667: nine responses give |r| = 0.6 by chance
    assert read_length_correlation(math.nan, 1)["reading"].startswith("no reading")
    assert (
        "falls with length, which alone accounts for 36 % of its variance"
        in read_length_correlation(-0.6, 100)["reading"]
    )
    # shifts with the held-out scores' std 1.0: a mean change of 0.1 is the least that reads high
    shift = lambda up, down, mean=0.1: read_shift("x", {"up": up, "down": down, "n": 200, "mean_shift": mean}, 1.0)
    assert shift(142, 50)["high"]  # 92² = 8464 > 4 · 192 = 768
    assert not shift(110, 90)["high"]  # 20² = 400 < 4 · 200 = 800: within chance
    assert not shift(12, 4)["high"] and shift(13, 4)["high"]  # 8² = 64 = 4 · 16 (not above); 9² = 81 > 4 · 17 = 68
    assert "lowers the score" in shift(3, 12)["reading"] and not shift(3, 12)["high"]  # (-9)² = 81 > 4 · 15 = 60
    assert "within what a model indifferent" in shift(0, 0)["reading"] and shift(0, 0)["threshold"] == 0.0
    assert shift(142, 50)["threshold"] == round(2 * math.sqrt(192), 4)
    small = shift(142, 50, mean=0.0999)  # consistent, but under a tenth of the std
    assert not small["high"] and "by less than 0.1 of the scores' std" in small["reading"]
    assert "(mean change +0.100, +0.10 of the held-out scores' std)" in shift(142, 50)["reading"]


def test_tether_rm_prints_each_probe_figure_with_its_reading_and_writes_them_to_the_summary(
    llama_dir, tmp_path, capsys
):
    from tether.cli import main

    pairs = [{"prompt": f"Q{i}: ", "chosen": "Cats sleep a lot.", "rejected": "Cats are dogs."} for i in range(8)]
    probes = [{"prompt": "Q: ", "original": "Cats sleep.", "modified": "Cats sleep. Cats sleep.", "probe": "repeat"}]
    data, probe_file, out = (
        write_jsonl(tmp_path / "p.jsonl", pairs),
        write_jsonl(tmp_path / "r.jsonl", probes),
        tmp_path / "rm",
    )
    args = ["--model", str(llama_dir), "--data", str(data), "--eval-data", str(data), "--probe-path", str(probe_file)]
    assert main(["rm", *args, "--max-steps", "2", "--output", str(out), "--report-to", "none"]) == 0
    err = capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    readings = summary["probes"]["readings"]
    assert set(readings) == {"length_correlation", "filler", "confident", "repeat"}
    for name, figure in (
        ("length_correlation", "length correlation"),
        ("filler", "filler shift"),
        ("repeat", "repeat shift"),
    ):
        line = next(line for line in err.splitlines() if line.strip().startswith(figure))
        assert line.endswith(readings[name]["reading"]) and ("high" in line), line
    assert "the sentence 'That is a great question.' put first raised the score of" in readings["filler"]["reading"]
    assert readings["repeat"]["reading"].startswith("probe 'repeat' (the probe file's modified answer) raised")


def test_rm_scores_a_pair_after_one_copy_of_its_prompt(llama256, lab_prefs, tmp_path):
    """The plan says the responses share their prompt's copy (the default); the first step's loss and accuracy
    equal those of one copy per response to float32 rounding; the held-out evaluation's too."""
    import yaml

    rows, plans = [], []
    for share in (True, False):
        out = tmp_path / f"share-{share}"
        cfg = rm_config(
            llama256,
            lab_prefs / "prefs.jsonl",
            lab_prefs / "prefs_eval.jsonl",
            out,
            train__max_steps=2,
            train__eval_every=2,
            train__log_every=1,
            model__share_prompt=share,
        )
        run_rm(cfg)
        rows.append([json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()])
        plans.append(yaml.safe_load((out / "config.yaml").read_text())["plan"]["micro-batch rows"])
    assert "responses after one copy of it" in plans[0] and ";" not in plans[1]
    shared, alone = rows
    for key in ("train/loss", "train/accuracy"):
        assert shared[0][key] == pytest.approx(alone[0][key], rel=1e-5), key
    assert shared[-1]["eval/loss"] == pytest.approx(alone[-1]["eval/loss"], rel=1e-4)
