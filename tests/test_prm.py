"""Process reward models: step-labelled data, the stage learning a step rule, resume (docs/algorithms.md §2.4)."""

import json
import random

import pytest
import torch
from conftest import write_jsonl

from tether.config import build_config
from tether.data.records import DataError, read_records
from tether.data.steps import collate_steps, tokenize_steps
from tether.models.lm import load_tokenizer


def step_rows(n: int, seed: int = 0) -> list[dict]:
    """Solutions of 2-4 steps; a step is right when it ends in "yes" (a rule a tiny model can learn)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        labels = [rng.random() < 0.6 for _ in range(rng.randint(2, 4))]
        steps = [f"{rng.randint(1, 29)} + {rng.randint(1, 9)} is {'yes' if ok else 'no'}" for ok in labels]
        rows.append({"prompt": "Check each step. ", "completions": steps, "labels": labels})
    return rows


def test_both_shapes_score_each_step_at_its_last_token(tokenizer, tmp_path):
    rows = [
        {"prompt": "Q: ", "completions": ["1 + 1 = 2", "2 + 2 = 5"], "labels": [True, False]},
        {"prompt": "Q: ", "completion": "1 + 1 = 2\n2 + 2 = 5\n", "labels": [1, 0.25]},
    ]
    records = read_records(write_jsonl(tmp_path / "steps.jsonl", rows))
    examples, report = tokenize_steps(records, tokenizer, 128, "\n")
    assert report.examples == 2 and examples[0].input_ids == examples[1].input_ids  # the same text either way
    for e in examples:
        ends = [tokenizer.decode(e.input_ids[: i + 1]) for i in e.step_ends]
        assert ends == ["Q: 1 + 1 = 2", "Q: 1 + 1 = 2\n2 + 2 = 5"]
    assert examples[1].labels == [1.0, 0.25]
    batch = collate_steps(examples, tokenizer.pad_token_id)
    assert batch["step_mask"].tolist() == [[1, 1], [1, 1]] and batch["step_labels"][1].tolist() == [1.0, 0.25]


def test_a_tokenizer_that_appends_its_eos_still_reads_each_step_at_its_last_token(tmp_path):
    """A post-processor that adds BOS and EOS (Llama's add_eos_token): the special tokens hold no character (offsets
    (0, 0)), so they never stand for a step's end; the steps read as above, one token later for the BOS. The
    process reward model's own reading (models/reward.py text_steps) takes the same positions."""
    from conftest import CORPUS
    from tokenizers import processors

    from tether.lab.tokenizer import train_bpe_tokenizer
    from tether.models.reward import ProcessRewardScorer

    tokenizer = train_bpe_tokenizer(CORPUS, vocab_size=320)
    bos, eos = tokenizer.bos_token, tokenizer.eos_token
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A {eos}", special_tokens=[(bos, tokenizer.bos_token_id), (eos, tokenizer.eos_token_id)]
    )
    rows = [{"prompt": "Q: ", "completions": ["1 + 1 = 2", "2 + 2 = 5"], "labels": [True, False]}]
    [example], _ = tokenize_steps(read_records(write_jsonl(tmp_path / "steps.jsonl", rows)), tokenizer, 128, "\n")
    assert example.input_ids[0] == tokenizer.bos_token_id  # (the example ends at its last step: no EOS kept)
    ends = [tokenizer.decode(example.input_ids[1 : i + 1]) for i in example.step_ends]
    assert ends == ["Q: 1 + 1 = 2", "Q: 1 + 1 = 2\n2 + 2 = 5"]
    reader = ProcessRewardScorer.__new__(ProcessRewardScorer)
    reader.tokenizer = tokenizer
    text = "Q: 1 + 1 = 2\n2 + 2 = 5\n"
    assert reader.text_steps(text, [len("Q: 1 + 1 = 2"), len(text) - 1])[1] == example.step_ends


def test_bad_step_rows_name_the_record_and_field(tokenizer, tmp_path):
    cases = [
        ({"prompt": "Q", "completions": ["a", "b"], "labels": [True]}, "2 steps and 1 labels"),
        ({"prompt": "Q", "completions": ["a"], "labels": ["yes"]}, "labels\\[0\\] is 'yes'"),
        ({"prompt": "Q", "completions": "a", "labels": [True]}, "'completions' must be a list"),
        ({"prompt": "Q", "answer": "a"}, "needs 'prompt', 'labels'"),
        ({"prompt": "Q", "completions": ["a", ""], "labels": [True, True]}, "'completions': step 1 is an empty"),
        ({"prompt": "Q", "completion": "a\n\nb\n", "labels": [1, 0, 1]}, "'completion': step 1 is empty"),
    ]
    for k, (row, message) in enumerate(cases):
        path = write_jsonl(tmp_path / f"bad{k}.jsonl", [row])
        with pytest.raises(DataError, match=f"bad{k}.jsonl:1.*{message}"):
            tokenize_steps(read_records(path), tokenizer, 128, "\n")


def test_an_empty_step_is_refused_naming_the_file_line_and_field(llama_dir, tmp_path, capsys):
    """Issue 52 item 29: an empty prompt and an empty step gave `ValueError: max() arg is an empty sequence`; an
    empty step after a real prompt was scored at the prompt's last token. Both: one line, the file, line and field."""
    from tether.cli import main

    for k, row in enumerate(
        [
            {"prompt": "", "completions": [""], "labels": [True]},
            {"prompt": "Check: ", "completions": ["1 + 1 is yes", ""], "labels": [True, False]},
        ]
    ):
        data = write_jsonl(tmp_path / f"empty{k}.jsonl", [*step_rows(3), row])
        argv = ["prm", "--model", str(llama_dir), "--data", str(data), "--output", str(tmp_path / f"o{k}")]
        assert main([*argv, "--report-to", "none"]) == 2
        err = capsys.readouterr().err
        assert f"empty{k}.jsonl:4: field 'completions': step {k} is an empty string" in err and "Traceback" not in err
        assert not (tmp_path / f"o{k}").exists()  # refused before the run folder


def test_a_tiny_prm_learns_a_step_rule_and_resumes_exactly(llama_dir, tmp_path, monkeypatch):
    from conftest import killed_after_step, metrics_but_timings

    from tether.stages.prm import run_prm
    from tether.stages.prm_config import PRMConfig

    data = write_jsonl(tmp_path / "train.jsonl", step_rows(240))
    held = write_jsonl(tmp_path / "eval.jsonl", step_rows(60, seed=1))

    def cfg(out, **extra):
        overrides = {
            "model.path": str(llama_dir),
            "data.path": str(data),
            "data.eval_path": str(held),
            "train.batch_size": 16,
            "train.max_steps": 30,
            "train.eval_every": 15,
            "train.save_every": 10,
            "optim.lr": 3e-3,
            "train.output": str(out),
            "train.report_to": ["none"],
            **extra,
        }
        return build_config(PRMConfig, overrides=overrides)

    summary = run_prm(cfg(tmp_path / "whole"))
    metrics = [json.loads(line) for line in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()]
    evals = [m for m in metrics if "eval/step_accuracy" in m]
    assert summary["eval/step_accuracy"] >= 0.9 and summary["eval/auroc"] >= 0.95  # the rule, learnt
    assert metrics[0]["train/loss"] > metrics[-1]["train/loss"] and evals[0]["step"] == 15
    with killed_after_step(monkeypatch, 15), pytest.raises(KeyboardInterrupt):
        run_prm(cfg(tmp_path / "killed"))
    assert run_prm(cfg(tmp_path / "killed", **{"train.resume": True}))["resumed_from"] == 10
    assert metrics_but_timings(tmp_path / "killed") == metrics_but_timings(tmp_path / "whole")
    from tether.models.reward import load_reward_model

    tok = load_tokenizer(tmp_path / "whole" / "final")
    prm = load_reward_model(tmp_path / "whole" / "final", tok)
    assert prm.head_names == ["step"]
    e, _ = tokenize_steps(read_records(held), tok, 256, "\n")
    batch = collate_steps(e[:4], tok.pad_token_id)
    with torch.no_grad():
        p = torch.sigmoid(prm(batch["input_ids"], batch["attention_mask"], step_index=batch["step_index"])[..., 0])
    right = (p > 0.5) == (batch["step_labels"] > 0.5)
    assert right[batch["step_mask"].bool()].float().mean() >= 0.9  # final/ scores steps as the run measured


def test_math_shepherd_labels_on_a_scripted_policy_are_the_hand_computed_ones():
    from tether.stages.prm_labels import step_labels

    row = {"prompt": "Q: ", "completions": ["a", "b", "c"], "answer": "42"}
    reach = {"Q: a\n": [1, 1, 1, 0], "Q: a\nb\n": [1, 0, 1, 0], "Q: a\nb\nc\n": [0, 0, 0, 0]}  # sample -> reaches?

    def generate(contexts):
        assert contexts == [c for c in reach for _ in range(4)]  # each prefix, repeated samples times, in order
        out, seen = [], {}
        for c in contexts:
            k = seen[c] = seen.get(c, -1) + 1
            out.append(("so 42" if reach[c][k] else "so 7", 2))
        return out

    check = lambda rows, texts: [t.endswith(r["answer"]) for r, t in zip(rows, texts)]
    (hard,), cost = step_labels([row], lambda r: r["completions"], generate, check, samples=4)
    assert hard["labels"] == [True, True, False] and hard["label_scores"] == [0.75, 0.5, 0.0]
    assert cost.continuations == 12 and cost.tokens == 24
    (soft,), _ = step_labels([row], lambda r: r["completions"], generate, check, samples=4, soft=True)
    assert soft["labels"] == [0.75, 0.5, 0.0]


def test_prm_labels_from_the_command_line(llama_dir, tmp_path):
    import subprocess
    import sys

    rows = [{"prompt": "1 + 1 = ", "completions": ["2", "3"], "answer": "2"}]
    data = write_jsonl(tmp_path / "solutions.jsonl", rows)
    (tmp_path / "checks.py").write_text(
        "def mentions_answer(completions, answer, **_):\n    return [1.0 if a in c else 0.0 for c, a in zip(completions, answer)]\n"
    )
    out = tmp_path / "labelled.jsonl"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tether",
            "data",
            "prm-labels",
            str(data),
            "--model",
            str(llama_dir),
            "--check",
            f"{tmp_path}/checks.py:mentions_answer",
            "--output",
            str(out),
            "--samples",
            "2",
            "--max-new-tokens",
            "4",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    labelled = json.loads(out.read_text())
    assert labelled["labels"] == [True, True]  # every prefix already contains "2"
    assert "1 solutions, 2 steps: 4 continuations generated" in done.stdout + done.stderr


CHECKS = """
def raises_on_text(completions, answer, **_):
    return [1.0 if not c else 1 / 0 for c in completions]

def words(completions, **_):
    return ["yes" for _ in completions]

def one_score(completions, **_):
    return [1.0]

def nan_on_text(completions, **_):
    return [float("nan") if c else 0.0 for c in completions]

def steps(completions, **_):
    return [[1.0] for _ in completions]

def needs_ids(completions, completion_ids):
    return [0.0 for _ in completions]

def no_opinion_on_step_two(completions, **_):
    return [None if c.startswith("2\\nso 2\\n") else 1.0 for c in completions]
"""


@pytest.mark.parametrize(
    "check, rows, message",
    [
        ("raises_on_text", 1, "s.jsonl:1: --check function raises_on_text raised ZeroDivisionError: division by zero"),
        ("words", 1, "dry run of --check on the first rows with empty completions: --check function words: value 0"),
        ("one_score", 1, "s.jsonl:1: --check function one_score returned 1 values for 4 completions"),
        ("nan_on_text", 1, "s.jsonl:1: --check function nan_on_text: value 0 is nan (not finite)"),
        ("steps", 1, "s.jsonl:1: --check function steps: value 0 is a list; a check returns one number per text"),
        ("needs_ids", 1, "--check function needs_ids needs ['completion_ids'], but the prompt file has columns"),
        ("missing", 1, "--check '{tmp}/checks.py:missing': {tmp}/checks.py has no function 'missing'"),
        ("one_score", 2, "s.jsonl:2: no steps to label (field 'completions' or 'completion' is empty)"),
    ],
)
def test_prm_labels_check_is_guarded_as_a_reward_function_is(check, rows, message, llama_dir, tmp_path, capsys):
    """Issue 52 item 28 (and 36's "--reward named for --check"): a check that raised or returned strings was a
    traceback, one score for four texts exited 0 with wrong labels, NaN made every label false, `completions: []`
    was an IndexError, and errors named the prompt, not the file and line."""
    from tether.cli import main

    (tmp_path / "checks.py").write_text(CHECKS)
    solutions = [{"prompt": "1 + 1 = ", "completions": ["2", "so 2"], "answer": "2"}]
    solutions += [{"prompt": "2 + 2 = ", "completions": [], "answer": "4"}] * (rows - 1)
    out = tmp_path / "labelled.jsonl"
    argv = ["data", "prm-labels", str(write_jsonl(tmp_path / "s.jsonl", solutions)), "--model", str(llama_dir)]
    argv += ["--check", f"{tmp_path}/checks.py:{check}", "--output", str(out), "--samples", "2"]
    assert main([*argv, "--max-new-tokens", "3"]) == 2
    err = capsys.readouterr().err
    assert message.format(tmp=tmp_path) in err and "Traceback" not in err and "--reward" not in err, err
    assert not out.exists()


def test_prm_labels_counts_the_texts_a_check_has_no_opinion_on(llama_dir, tmp_path, capsys):
    """None is "no opinion", as for --reward: the text counts as not reaching the answer, and the count is printed."""
    from tether.cli import main

    (tmp_path / "checks.py").write_text(CHECKS)
    data = write_jsonl(tmp_path / "s.jsonl", [{"prompt": "1 + 1 = ", "completions": ["2", "so 2"], "answer": "2"}])
    argv = ["data", "prm-labels", str(data), "--model", str(llama_dir), "--samples", "2", "--max-new-tokens", "3"]
    out = tmp_path / "labelled.jsonl"
    assert main([*argv, "--check", f"{tmp_path}/checks.py:no_opinion_on_step_two", "--output", str(out)]) == 0
    # step 1's prefix "2\n" is judged 1.0 twice; step 2's prefix "2\nso 2\n" gets None twice: shares 1 and 0
    assert json.loads(out.read_text())["label_scores"] == [1.0, 0.0]
    assert "--check had no opinion (None) on 2 continuations" in capsys.readouterr().err


def tiny_prm(llama_dir, tmp_path) -> str:
    """A `tether prm` folder trained for a few steps on the step rule (what matters here is its shape)."""
    from tether.stages.prm import run_prm
    from tether.stages.prm_config import PRMConfig

    data = write_jsonl(tmp_path / "prm-train.jsonl", step_rows(32))
    overrides = {"model.path": str(llama_dir), "data.path": str(data), "train.batch_size": 8, "train.max_steps": 2}
    overrides.update({"train.output": str(tmp_path / "prm"), "train.report_to": ["none"], "train.save_every": 0})
    run_prm(build_config(PRMConfig, overrides=overrides))
    return str(tmp_path / "prm" / "final")


def test_grpo_with_a_process_reward_model_runs_and_resumes_exactly(llama_dir, tmp_path, monkeypatch):
    from conftest import killed_after_step, metrics_but_timings

    from tether.stages.grpo import run_grpo
    from tether.stages.grpo_config import GRPOConfig

    prm = tiny_prm(llama_dir, tmp_path)
    prompts = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": f"Say {w}."} for w in ("hi", "cats", "dogs", "rain")])

    def cfg(out, **extra):
        overrides = {"model.path": str(llama_dir), "rollout.prompts": str(prompts), "rewards.process_reward_model": prm}
        overrides.update({"rewards.step_pattern": " ", "rollout.prompts_per_step": 2, "rollout.group_size": 3})
        overrides.update({"rollout.max_new_tokens": 8, "train.max_steps": 4, "optim.lr": 3e-3, "train.save_every": 2})
        overrides.update({"train.sample_every": 1, "train.output": str(out), "train.report_to": ["none"], **extra})
        return build_config(GRPOConfig, overrides=overrides)

    run_grpo(cfg(tmp_path / "whole"))
    metrics = [json.loads(line) for line in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()]
    samples = [json.loads(line) for line in (tmp_path / "whole" / "samples.jsonl").read_text().splitlines()]
    assert all("reward/process_reward_model/mean" in m for m in metrics)
    steps = [s["step_scores"] for s in samples if s.get("step_scores")]
    assert steps and all(0 < p < 1 for row in steps for p in row)  # probabilities, one per matched step
    assert "process reward model (each step's probability" in (tmp_path / "whole" / "config.yaml").read_text()
    with killed_after_step(monkeypatch, 3), pytest.raises(KeyboardInterrupt):
        run_grpo(cfg(tmp_path / "killed"))
    assert run_grpo(cfg(tmp_path / "killed", **{"train.resume": True}))["resumed_from"] == 2
    assert metrics_but_timings(tmp_path / "killed") == metrics_but_timings(tmp_path / "whole")


def test_ppo_takes_an_aggregated_process_reward_model_and_refuses_step_scores(llama_dir, tmp_path):
    from tether.config import ConfigError
    from tether.stages.ppo import run_ppo
    from tether.stages.ppo_config import PPOConfig

    prm = tiny_prm(llama_dir, tmp_path)
    prompts = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": "Say hi."}, {"prompt": "Say cats."}])
    overrides = {"model.path": str(llama_dir), "rollout.prompts": str(prompts), "rewards.process_reward_model": prm}
    overrides.update({"rewards.step_pattern": " ", "rollout.prompts_per_step": 2, "rollout.max_new_tokens": 8})
    overrides.update({"train.max_steps": 2, "train.output": str(tmp_path / "ppo"), "train.report_to": ["none"]})
    with pytest.raises(ConfigError, match="choose --process-reward-aggregation min"):
        build_config(PPOConfig, overrides=overrides)
    run_ppo(build_config(PPOConfig, overrides={**overrides, "rewards.process_reward_aggregation": "min"}))
    metrics = [json.loads(line) for line in (tmp_path / "ppo" / "metrics.jsonl").read_text().splitlines()]
    assert all(0 <= m["reward/process_reward_model/mean"] <= 1 for m in metrics)


def test_a_step_is_read_where_training_read_it_whatever_the_pattern(llama_dir, tmp_path):
    """Issue 52 item 15: `tether prm` scores step k at the token holding its last character, before the separator;
    in RL a --step-pattern that consumes the separator ("\\n") made the scorer read at the newline, one token late.
    The PRM folder records its separator, and the scorer reads every pattern's steps where training did."""
    from tether.data.steps import trained_step_end
    from tether.models.reward import ProcessRewardScorer
    from tether.online_sections import RewardSection
    from tether.rewards.score import Scorer
    from tether.rollout.batch import Rollout

    # hand cases: a match ending after the separator, inside it, after two, and a step whose "." is its own
    assert [trained_step_end("a\nb\n", e, "\n") for e in (1, 2, 4)] == [1, 1, 3]
    assert trained_step_end("a. b.", 2, ". ") == 1 and trained_step_end("a. b.", 5, ". ") == 5
    assert trained_step_end("a\n\nb", 3, "\n") == 1 and trained_step_end("\n", 1, "\n") == 0
    prm = tiny_prm(llama_dir, tmp_path)
    assert json.loads((tmp_path / "prm" / "final" / "config.json").read_text())["tether_step_separator"] == "\n"
    process = ProcessRewardScorer(prm)
    row = step_rows(1, seed=3)[0]  # 2-4 steps
    (trained,), _ = tokenize_steps(
        read_records(write_jsonl(tmp_path / "one.jsonl", [row])), process.tokenizer, 256, "\n"
    )
    ids = torch.tensor([trained.input_ids])
    with torch.no_grad():  # the probabilities at the positions training used (one row, as the scorer runs it)
        logits = process.model(ids, torch.ones_like(ids), step_index=torch.tensor([trained.step_ends]))[..., 0]
    want = torch.sigmoid(logits)[0].tolist()
    response = "".join(step + "\n" for step in row["completions"])
    one = torch.ones(1, 1, dtype=torch.long)
    rollout = Rollout(one, one, one, one, torch.tensor([False]), [row["prompt"]], [response])
    for pattern in ("\n", "[^\n]+\n", "(?<=\n)", "(?=\n)", "[so](?=\n)"):  # consuming the separator or not
        scores = Scorer(
            RewardSection(process_reward_model=prm, step_pattern=pattern),
            8,
            process.tokenizer,
            None,
            process_model=process,
        )(rollout, [row])
        assert scores.step_scores == [want], pattern  # the same forward at the same positions: equal exactly
    # the plan says where steps are read
    assert (
        "read before the separator '\\n'"
        in Scorer(RewardSection(process_reward_model=prm), 8, None, None, process_model=process).describe()
    )


@pytest.mark.parametrize("folder", ["causal LM", "outcome reward model", "no separator"])
def test_process_reward_model_must_be_a_prm_folder(folder, llama_dir, tmp_path, capsys):
    """Issue 52 item 27: --process-reward-model took a plain causal LM (a new zero head: every step 0.5, exit 0) or
    an outcome reward model. Refused before any model loads, naming what the folder is."""
    import shutil

    from tether.cli import main
    from tether.models.reward import load_reward_model, save_reward_model

    path, message = llama_dir, "is a language model (LlamaForCausalLM), not a process reward model"
    if folder == "outcome reward model":
        path, tok = tmp_path / "rm", load_tokenizer(llama_dir)
        save_reward_model(load_reward_model(llama_dir, tok), tok, path, {"reward": {"mean": 0.0, "std": 1.0}})
        message = "is an outcome reward model (`tether rm`) with heads ['reward'], not a process reward model"
    elif folder == "no separator":
        path = tmp_path / "old-prm"
        shutil.copytree(tiny_prm(llama_dir, tmp_path), path)
        config = json.loads((path / "config.json").read_text())
        del config["tether_step_separator"]
        (path / "config.json").write_text(json.dumps(config))
        message = "has the 'step' head but no tether_step_separator in its config.json"
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "Say hi."}] * 2)
    argv = ["grpo", "--model", str(llama_dir), "--prompts", str(prompts), "--process-reward-model", str(path)]
    argv += ["--max-steps", "1", "--max-new-tokens", "4", "--prompts-per-step", "1", "--group-size", "2"]
    assert main([*argv, "--output", str(tmp_path / "o"), "--report-to", "none"]) == 2
    err = capsys.readouterr().err
    assert f"--process-reward-model {path} {message}" in err and "Traceback" not in err, err
    assert not (tmp_path / "o").exists()  # before the run folder
