"""Issue 17's thirteen reproductions — what a user coming from TRL or LLaMA-Factory tried — each with the behaviour
expected now, on tiny local Qwen2, Llama, GPT-2 and Mistral-style models that cover the four pad/EOS cases:

    qwen2    a pad token of its own, EOS = the chat template's end of turn (<|im_end|>)
    llama    pad == EOS
    gpt2     no pad token
    mistral  no pad token, and an EOS (</s>, here <|bos|>) that is not the template's end of turn (<|im_end|>)
"""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys

import pytest
from conftest import flags

from tether.cli import main
from tether.config import ConfigError
from tether.models.lm import build_tiny_model

CASES = ("qwen2", "llama", "gpt2", "mistral")


@pytest.fixture(scope="session")
def case_dirs(tmp_path_factory, tokenizer):
    """{case: model folder}; the tokenizer of each is the session's BPE tokenizer with that case's specials."""
    root = tmp_path_factory.mktemp("pad-eos-cases")
    out = {}
    for case in CASES:
        tok = copy.deepcopy(tokenizer)
        if case == "llama":
            tok.pad_token = tok.eos_token
        elif case in ("gpt2", "mistral"):
            tok.pad_token = None
        if case == "mistral":
            tok.eos_token = "<|bos|>"  # stands for </s>: a special token the ChatML template never writes
        out[case] = build_tiny_model(case, tok, root / case, seed=0, hidden=32, layers=2, heads=2, max_positions=256)
        from transformers import AutoTokenizer

        loaded = AutoTokenizer.from_pretrained(out[case])  # Qwen2's tokenizer class adds its <|endoftext|>
        if len(loaded) != len(tok):  # as a real Qwen2 model has it: in the vocabulary the model was built with
            build_tiny_model(case, loaded, root / case, seed=0, hidden=32, layers=2, heads=2, max_positions=256)
    return out


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _chat(user: str, answer: str) -> list[dict]:
    return [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]


def _metrics(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


# Two steps of 4 rows in micro-batches of 2, no evaluation, checkpoints nor reporting, over any earlier output
QUICK = flags(
    max_steps=2, batch_size=4, micro_batch_size=2, eval_every=0, save_every=0, report_to="none", overwrite=True
)


# TRL's reward-function conventions, written as its documentation shows them: chat completions as message lists,
# columns as keyword arguments, None for "no opinion", the trainer state.
TRL_REWARDS = """
def reward_len(completions, **kwargs):
    return [-abs(20 - len(completion[0]["content"])) for completion in completions]

def answer_given(completions, answer, trainer_state, **kwargs):
    assert trainer_state.max_steps == 2 and 0 <= trainer_state.global_step < 2
    return [None if a is None else float(a in c[0]["content"]) for c, a in zip(completions, answer)]
"""


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_reproductions_1_2_4_6_7_on_each_pad_eos_case(case, case_dirs, tmp_path, capsys):
    """SFT from a flat TRL-style YAML with LoRA (4, 7), DPO on implicit-prompt conversations (1), GRPO on chat prompts
    with reward functions written the TRL way (2), the stop set from the template's end of turn and a loud warning
    when responses are all truncated (6)."""
    from transformers import AutoConfig

    model = case_dirs[case]
    vocab = AutoConfig.from_pretrained(model).vocab_size
    rows = [_chat(f"Say {w}.", f"{w} {w}.") for w in ("hi", "yes", "no", "ok", "hello", "fine", "good", "well")]
    sft_yaml = tmp_path / "sft.yaml"
    sft_yaml.write_text(
        f"model_name_or_path: {model}\n"
        f"data: {_write(tmp_path / 'chat.jsonl', [{'messages': m} for m in rows])}\n"
        f"output_dir: {tmp_path / 'sft'}\nlearning_rate: 1.0e-3\nmax_steps: 2\n"
        "per_device_train_batch_size: 2\nbatch_size: 4\nlora_r: 4\nlora_alpha: 8\nsave_steps: 1\n"
        "eval_steps: 0\nreport_to: none\nlogging_steps: 1\n"
    )
    assert main(["sft", "--config", str(sft_yaml)]) == 0
    # 7: padding added no token, so the LoRA adapter still fits the untouched base, and final/ keeps the vocabulary
    assert AutoConfig.from_pretrained(tmp_path / "sft" / "final").vocab_size == vocab
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    checkpoint = sorted((tmp_path / "sft").glob("checkpoint-*"))[-1]
    PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model), str(checkpoint))  # no size mismatch
    # 1: implicit-prompt pairs (two whole conversations, no prompt) in DPO
    pairs = [
        {"chosen": _chat(f"Say {w}.", f"{w}."), "rejected": _chat(f"Say {w}.", "no idea")}
        for w in ("hi", "yes", "ok", "fine", "good", "well")
    ]
    dpo = flags("dpo", model=tmp_path / "sft" / "final", data=_write(tmp_path / "pairs.jsonl", pairs), eval_fraction=0)
    assert main(dpo + flags(output=tmp_path / "dpo") + QUICK) == 0
    # 2 and 6: GRPO on chat prompts with TRL-style reward functions
    (tmp_path / "trl_rewards.py").write_text(TRL_REWARDS)
    prompts = [
        {"prompt": [{"role": "user", "content": f"Say {w}."}], "answer": w if i % 2 else None}
        for i, w in enumerate(("hi", "yes", "no", "ok"))
    ]
    capsys.readouterr()
    rewards = f"{tmp_path}/trl_rewards.py:reward_len,{tmp_path}/trl_rewards.py:answer_given"
    grpo = flags(
        "grpo", model=tmp_path / "sft" / "final", prompts=_write(tmp_path / "p.jsonl", prompts), reward=rewards
    )
    grpo += flags(output=tmp_path / "grpo", group_size=2, prompts_per_step=2, max_new_tokens=4, max_steps=2)
    assert main(grpo + flags(eval_every=0, save_every=0, report_to="none", overwrite=True)) == 0
    err = capsys.readouterr().err
    assert "<|im_end|>" in err.split("stop tokens", 1)[1].splitlines()[0]  # the plan's stop set has the end of turn
    last = _metrics(tmp_path / "grpo")[-1]
    assert "reward/reward_len/mean" in last and "reward/answer_given/mean" in last
    assert last["reward/answer_given/none"] >= 1  # None = no opinion, counted
    if last["rollout/truncated_frac"] == 1.0:  # a 4-token budget on a random model: said loudly
        assert "of the responses hit max_new_tokens without a stop token" in err


@pytest.mark.parametrize("case", CASES)
def test_reproduction_5_max_length_beyond_the_context(case, case_dirs, tmp_path, capsys):
    """Offline: a --max-length past the model's 256 positions is clamped, said once, and longer examples dropped
    and counted (GPT-2 used to die in wpe). Online: a prompt + budget past the context is a ConfigError naming the
    row (RoPE models used to run past their context silently)."""
    import tether.models.lm

    tether.models.lm._TOLD.clear()
    long_text = " ".join(["hello world"] * 200)
    data = _write(
        tmp_path / "d.jsonl",
        [{"prompt": "Say hi.", "completion": "hi."}] * 6 + [{"prompt": long_text, "completion": "ok."}],
    )
    assert (
        main(
            [
                "sft",
                "--model",
                str(case_dirs[case]),
                "--data",
                data,
                "--output",
                str(tmp_path / "sft"),
                "--max-length",
                "4096",
                "--eval-fraction",
                "0",
                *QUICK,
            ]
        )
        == 0
    )
    err = capsys.readouterr().err
    assert "--max-length 4096 is more than the model's context (256 positions" in err
    summary = json.loads((tmp_path / "sft" / "summary.json").read_text())
    assert (
        "-> 6 examples" in summary["data"][0] and "dropped: 1 longer than max_length=256 tokens" in summary["data"][0]
    )
    prompts = _write(tmp_path / "p.jsonl", [{"prompt": "Say hi."}, {"prompt": long_text}])
    code = main(
        [
            "grpo",
            "--model",
            str(case_dirs[case]),
            "--prompts",
            prompts,
            "--reward",
            "tether.rewards.builtin:length_penalty",
            "--output",
            str(tmp_path / "grpo"),
            "--max-new-tokens",
            "64",
            "--max-steps",
            "1",
            "--report-to",
            "none",
        ]
    )
    assert code == 2 and "row 2:" in capsys.readouterr().err


def test_reproduction_9_chat_prompts_without_a_chat_template(case_dirs, tmp_path, capsys):
    from transformers import AutoTokenizer

    plain = tmp_path / "plain"
    import shutil

    shutil.copytree(case_dirs["gpt2"], plain)
    tok = AutoTokenizer.from_pretrained(plain)
    tok.chat_template = None
    tok.save_pretrained(plain)
    (plain / "chat_template.jinja").unlink(missing_ok=True)
    prompts = _write(tmp_path / "p.jsonl", [{"prompt": [{"role": "user", "content": "hi"}]}])
    code = main(
        [
            "grpo",
            "--model",
            str(plain),
            "--prompts",
            prompts,
            "--reward",
            "tether.rewards.builtin:length_penalty",
            "--output",
            str(tmp_path / "g"),
            "--max-steps",
            "1",
            "--report-to",
            "none",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "is a list of chat messages, and the tokenizer has no chat template" in err
    assert "Traceback" not in err


def test_reproduction_4_yaml_and_flags_the_way_trl_users_write_them(case_dirs, tmp_path, capsys):
    """A flat YAML keyed by flag names or TRL's names; a run's own config.yaml fed back; the YAML key in --help;
    "did you mean" for unknown flags; TRL's accumulation flag explained rather than guessed."""
    from tether.config import build_config, load_yaml
    from tether.stages.grpo_config import GRPOConfig

    flat = tmp_path / "grpo.yaml"
    flat.write_text(
        "model_name_or_path: m\nlearning_rate: 3.0e-6\nnum_generations: 4\nmax_completion_length: 32\n"
        "beta: 0.02\nmax_steps: 7\nper_device_train_batch_size: 8\n"
    )
    cfg = build_config(GRPOConfig, load_yaml(flat))
    assert (
        cfg.model.path,
        cfg.optim.lr,
        cfg.rollout.group_size,
        cfg.rollout.max_new_tokens,
        cfg.algo.kl_coef,
        cfg.train.max_steps,
        cfg.rollout.prompts_per_step,
    ) == ("m", 3e-6, 4, 32, 0.02, 7, 2)
    # TRL's accumulation is derived with its batch (issue 41), not refused: 8 per device (TRL's default) x 4
    # steps per generation = 32 completions = 4 prompts of 8 (tether grpo's group_size), updated 8 at a time
    flat.write_text("gradient_accumulation_steps: 4\n")
    cfg = build_config(GRPOConfig, load_yaml(flat))
    assert (cfg.rollout.prompts_per_step, cfg.algo.minibatch) == (4, 0)
    with pytest.raises(SystemExit):
        main(["grpo", "--model_name", "X"])
    assert "did you mean --model" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["grpo", "--help"])
    assert "(YAML rollout.group_size; default: 8)" in " ".join(capsys.readouterr().out.split())


def test_reproduction_12_help_lists_each_stage_once_without_torch():
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from tether.cli import main\ntry:\n main(['--help'])\n"
            "except SystemExit: pass\nprint('torch' in sys.modules, 'transformers' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.stdout.count("Reward model from preference pairs") == 1
    assert out.stdout.strip().splitlines()[-1] == "False False"


def test_reproduction_12_log_lines_stay_above_the_progress_bar_and_tokenising_shows_progress(tmp_path, monkeypatch):
    """In a terminal the bar is live and every log line is still printed (rich puts it above the bar); tokenising
    many rows prints progress where there is no terminal."""
    import tether.console as console_module
    import tether.train.logger as logger

    printed = []
    monkeypatch.setattr(logger.sys.stderr, "isatty", lambda: True, raising=False)
    monkeypatch.setattr(logger.console, "print", lambda *a, **k: printed.append(str(a[0]) if a else ""))
    metrics = logger.MetricsLogger(tmp_path, ["none"], {}, 0, 4, log_every=2)
    assert metrics._progress is not None
    for step in range(1, 5):
        metrics.log({"step": step, "train/loss": 1.0 / step, **({"eval/loss": 0.9} if step == 3 else {})})
    metrics.close()
    assert [line.split()[1] for line in printed if line.startswith("step ")] == ["2/4", "3/4", "4/4"]
    printed.clear()
    monkeypatch.setattr(logger.sys.stderr, "isatty", lambda: False, raising=False)
    assert list(console_module.progress(range(5), 5, "tokenising d.jsonl", min_items=2, every_s=0.0)) == [0, 1, 2, 3, 4]
    assert printed[0].startswith("tokenising d.jsonl: 1/5") and len(printed) == 4


def test_reproduction_13_a_crash_before_the_first_checkpoint_gives_one_way_forward(
    case_dirs, tmp_path, capsys, monkeypatch
):
    from conftest import killed_after_step

    data = _write(tmp_path / "d.jsonl", [{"prompt": "Say hi.", "completion": "hi."}] * 8)
    args = [
        "sft",
        "--model",
        str(case_dirs["qwen2"]),
        "--data",
        data,
        "--output",
        str(tmp_path / "run"),
        "--eval-fraction",
        "0",
        "--max-steps",
        "4",
        "--batch-size",
        "2",
        "--micro-batch-size",
        "2",
        "--save-every",
        "0",
        "--report-to",
        "none",
    ]
    import tether.train.offline as offline

    with killed_after_step(monkeypatch, 1):
        assert main(args) == 130  # Ctrl-C: one line, not a traceback
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "tether sft: interrupted at step 1; no checkpoint was saved yet (--save-every), so the same command with "
        "--overwrite starts over"
    )
    assert main(args) == 2
    again = capsys.readouterr().err
    assert "no checkpoint to resume from; pass --overwrite" in again and "--resume" not in again.split("error:")[1]
    assert main(args + ["--resume"]) == 2
    resumed = capsys.readouterr().err
    assert "nothing to resume from" in resumed and "--overwrite (without --resume)" in resumed
    assert main(args + ["--overwrite"]) == 0
    del offline


def test_trackio_gets_the_metrics_and_the_config(tmp_path, monkeypatch, capsys):
    """report_to trackio: local (TRACKIO_DIR), project from TRACKIO_PROJECT, every step's scalars and the config;
    trackio's own set-up and closing notes replaced by one line of tether's."""
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio"))  # read when trackio is imported
    monkeypatch.setenv("TRACKIO_PROJECT", "tether-test")
    if "trackio" in sys.modules:
        pytest.skip("trackio was imported before TRACKIO_DIR could be set")
    pytest.importorskip("trackio")
    import sqlite3

    import tether.train.logger as logger

    (tmp_path / "run").mkdir()
    metrics = logger.MetricsLogger(tmp_path / "run", ["trackio"], {"optim": {"lr": 0.001}}, 0, 2, run_name="t")
    metrics.log({"step": 1, "train/loss": 0.5})
    metrics.log({"step": 2, "train/loss": 0.25})
    metrics.close()
    out, err = capsys.readouterr()
    assert "Trackio" not in out + err, out
    assert err.splitlines()[0] == "trackio: project tether-test, run t (`trackio show --project tether-test` shows it)"
    db = sqlite3.connect(tmp_path / "trackio" / "tether-test.db")
    rows = [(step, json.loads(text)) for step, text in db.execute("select step, metrics from metrics order by step")]
    assert rows == [(1, {"train/loss": 0.5}), (2, {"train/loss": 0.25})]
    assert "0.001" in " ".join(str(r) for r in db.execute("select * from configs"))


def test_reproduction_8_unpaired_labels_are_recognised_everywhere_preferences_are_read(case_dirs, tmp_path, capsys):
    """KTO-style rows (completion + true/false label): `data check` shows the KTO view, SFT, the reward model and
    the pairwise DPO losses refuse them with the reason, `dpo --loss kto` trains on them."""
    rows = [
        {"prompt": f"Say {w}.", "completion": f"{w}." if i % 2 else "no idea", "label": bool(i % 2)}
        for i, w in enumerate(("hi", "yes", "ok", "fine", "good", "well", "so", "no"))
    ]
    data = _write(tmp_path / "labels.jsonl", rows)
    model = str(case_dirs["llama"])
    assert main(["data", "check", data, "--model", model]) == 0
    assert "label False (`tether dpo --loss kto`)" in capsys.readouterr().err
    common = ["--model", model, "--data", data, "--report-to", "none", "--max-steps", "1"]
    for stage, reason in (
        ("sft", "unpaired preference data"),
        ("rm", "a reward model needs pairs or ranked lists"),
        ("dpo", "this loss compares pairs — use --loss kto"),
    ):
        assert main([stage, *common, "--output", str(tmp_path / stage)]) == 2
        assert reason in capsys.readouterr().err
    assert (
        main(
            [
                "dpo",
                *common,
                "--loss",
                "kto",
                "--output",
                str(tmp_path / "kto"),
                "--batch-size",
                "4",
                "--micro-batch-size",
                "2",
                "--eval-fraction",
                "0",
            ]
        )
        == 0
    )
    last = _metrics(tmp_path / "kto")[-1]
    assert last["train/loss"] == pytest.approx(0.5, abs=1e-4) and last["train/kto/reference_point"] == 0.0  # π = π_ref


# ------------------------------------------------------------------------------------------------------------------
# Issue 41: a TRL user's scripts, configs and datasets. The silent cases first: each test below failed before.


def _grpo_config(values: dict, world: int = 1, monkeypatch=None):
    from tether.config import build_config
    from tether.stages.grpo_config import GRPOConfig

    if monkeypatch is not None:
        monkeypatch.setenv("WORLD_SIZE", str(world))
    return build_config(GRPOConfig, values, source="trl.yaml")


def test_trl_per_device_batch_counts_completions_and_sets_prompts_per_step(monkeypatch):
    """TRL's per_device_train_batch_size counts completions per process: 8 per device, 4 per prompt, on 1 and on 2
    processes, is 2 and 4 prompts per step (not tether's default 32 with a micro-batch of 8); steps_per_generation
    and generation_batch_size, TRL's other two ways to say it, give the hand-computed figures too."""
    trl = {"per_device_train_batch_size": 8, "num_generations": 4}
    one, two = _grpo_config(trl, 1, monkeypatch), _grpo_config(trl, 2, monkeypatch)
    assert (one.rollout.prompts_per_step, one.rollout.group_size, one.algo.minibatch) == (2, 4, 0)
    assert (two.rollout.prompts_per_step, two.algo.micro_batch_size) == (4, 8)
    # 4 per device x 2 processes x 3 steps per generation = 24 completions = 6 prompts of 4; each update takes 8
    cfg = _grpo_config({**trl, "per_device_train_batch_size": 4, "steps_per_generation": 3}, 2, monkeypatch)
    assert (cfg.rollout.prompts_per_step, cfg.algo.minibatch, cfg.algo.micro_batch_size) == (6, 8, 4)
    cfg = _grpo_config({**trl, "generation_batch_size": 32, "max_steps": 100}, 1, monkeypatch)
    assert (cfg.rollout.prompts_per_step, cfg.algo.minibatch) == (8, 8)
    assert cfg.train.max_steps == 25  # TRL's max_steps counts updates: 4 per rollout here
    with pytest.raises(ConfigError, match="not a multiple of num_generations=4"):
        _grpo_config({**trl, "generation_batch_size": 30}, 1, monkeypatch)


def test_a_trl_grpo_config_is_read_in_one_go_with_every_value_translated(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "1")
    cfg = _grpo_config(
        {
            "learning_rate": 1e-6,
            "loss_type": "dr_grpo",
            "scale_rewards": False,
            "epsilon": 0.2,
            "epsilon_high": 0.28,
            "num_iterations": 2,
            "beta": 0.04,
            "bf16": True,
            "use_peft": True,
            "lora_target_modules": ["q_proj", "v_proj"],
            "max_prompt_length": None,  # null: not set
            "log_completions": True,
            "reward_funcs": ["my_rewards.accuracy", "my_rewards.format"],
            "reward_weights": [1.0, 0.5],
            "mask_truncated_completions": True,
        }
    )
    a = cfg.algo
    assert (a.aggregation, a.advantage, a.clip_low, a.clip_high, a.update_epochs) == (
        "seq-mean-token-sum-norm",
        "group_no_std",
        0.2,
        0.28,
        2,
    )
    assert a.kl_coef == 0.04 and a.mask_truncated and cfg.optim.lr == 1e-6
    assert (cfg.model.lora_r, cfg.model.lora_alpha, cfg.model.lora_dropout) == (16, 32.0, 0.0)
    assert cfg.model.lora_target_modules == ["q_proj", "v_proj"] and cfg.model.mixed_precision == "bf16"
    assert cfg.rewards.reward == ["my_rewards:accuracy=1", "my_rewards:format=0.5"]
    assert cfg.rewards.reward_weights == ""  # tether's own reward_weights (a reward model's heads) untouched


def test_names_that_mean_something_else_are_explained_and_every_unknown_key_is_named_at_once():
    with pytest.raises(ConfigError) as err:
        _grpo_config(
            {
                "generation_batch_size": 30,  # derived, fine on its own ...
                "max_prompt_length": 512,
                "ref_model": "path",
                "repetition_penalty": 1.1,
                "learnin_rate": 1e-5,
                "num_iteration": 2,
                "train": {"max_stepz": 3},
            }
        )
    text = str(err.value)
    assert "6 key(s) cannot be read" in text
    assert "max_prompt_length: tether keeps every prompt whole" in text
    assert "ref_model: the reference model is reference=" in text
    assert "repetition_penalty: not built" in text
    assert "unknown key 'learnin_rate' (did you mean 'learning_rate'?)" in text
    assert "unknown key 'num_iteration' (did you mean 'num_iterations'?)" in text  # never num_generations
    assert "unknown field train.max_stepz" in text
    assert "generation_batch" not in text.replace("generation_batch_size", "")  # never tether's other option


def test_trl_flags_on_the_command_line_are_read_like_the_yaml_keys(case_dirs, tmp_path, capsys, monkeypatch):
    from tether.cli.parser import build_parser, foreign_flags
    from tether.config import config_from_args
    from tether.stages.grpo_config import GRPOConfig

    monkeypatch.setenv("WORLD_SIZE", "1")
    parser = build_parser()
    argv, foreign = foreign_flags(
        parser,
        [
            "grpo",
            "--model_name_or_path",
            "m",
            "--bf16",
            "--loss_type",
            "dapo",
            "--reward_funcs",
            "rew.correct",
            "--per_device_train_batch_size",
            "8",
            "--num_generations",
            "4",
            "--prompts",
            "p.jsonl",
            "--max-steps",
            "3",
        ],
    )
    args = parser.parse_args(argv)
    args.foreign_flags = foreign
    cfg = config_from_args(GRPOConfig, args)
    assert (cfg.model.path, cfg.model.mixed_precision, cfg.algo.aggregation) == ("m", "bf16", "token-mean")
    assert (cfg.rewards.reward, cfg.rollout.prompts_per_step, cfg.train.max_steps) == (["rew:correct"], 2, 3)
    with pytest.raises(SystemExit):
        main(["grpo", "--reward_func", "x"])
    assert "--reward_func: unknown" in capsys.readouterr().err  # no "did you mean --reward-clip"


def test_a_margin_column_is_named_with_the_flag_that_uses_it(case_dirs, tmp_path):
    from transformers import AutoTokenizer

    from tether.data.preferences import tokenize_preferences
    from tether.data.records import read_records

    path = _write(tmp_path / "prefs.jsonl", [{"prompt": "Hi.", "chosen": " Hello.", "rejected": " No.", "margin": 2.0}])
    tok = AutoTokenizer.from_pretrained(case_dirs["llama"])
    _, report = tokenize_preferences(read_records(path), tok, 64, ["main"])
    assert "columns not used: margin (`tether rm --margin-column margin`" in report.summary()
    examples, report = tokenize_preferences(read_records(path), tok, 64, ["main"], margin_column="margin")
    assert examples[0].margin == 2.0 and "not used" not in report.summary()


def test_kto_rows_in_messages_form_are_refused_by_sft_and_read_by_kto(case_dirs, tmp_path, capsys):
    rows = [
        {"messages": _chat(f"Say {w}.", f"{w}." if i % 2 else "no idea"), "label": bool(i % 2)}
        for i, w in enumerate(("hi", "yes", "ok", "fine", "good", "well", "so", "no"))
    ]
    data = _write(tmp_path / "kto.jsonl", rows)
    common = ["--model", str(case_dirs["qwen2"]), "--data", data, *QUICK]
    assert main(["sft", *common, "--output", str(tmp_path / "sft")]) == 2
    err = capsys.readouterr().err
    assert "kto.jsonl:1: unpaired preference data" in err and "tether dpo --loss kto" in err
    # the default 5 % held out would draw one row, one label; each label is split on its own
    assert main(["dpo", *common, "--loss", "kto", "--output", str(tmp_path / "kto")]) == 0
    assert "(held out): 2 records" in capsys.readouterr().err


def test_the_kto_loss_names_the_formats_it_reads(case_dirs, tmp_path, capsys):
    data = _write(tmp_path / "chat.jsonl", [{"messages": _chat("Hi.", "Hello.")}] * 4)
    assert (
        main(
            [
                "dpo",
                "--model",
                str(case_dirs["qwen2"]),
                "--data",
                data,
                "--loss",
                "kto",
                *QUICK,
                "--output",
                str(tmp_path / "o"),
            ]
        )
        == 2
    )
    assert "KTO reads unpaired rows — prompt, completion and a true/false label" in capsys.readouterr().err


def test_the_api_takes_trls_argument_names(case_dirs, tmp_path):
    from peft import LoraConfig
    from transformers import AutoTokenizer, TrainingArguments

    import tether

    rows = [{"prompt": f"Say {w}.", "chosen": f" {w}.", "rejected": " no"} for w in ("hi", "yes", "ok", "fine")]
    run = tether.dpo(
        model=str(case_dirs["llama"]),
        processing_class=AutoTokenizer.from_pretrained(case_dirs["llama"]),
        ref_model=str(case_dirs["llama"]),
        train_dataset=rows,
        peft_config=LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"]),
        args=TrainingArguments(  # TRL's config objects are TrainingArguments: the fields set are read
            output_dir=str(tmp_path / "run"),
            per_device_train_batch_size=2,
            gradient_accumulation_steps=2,
            max_steps=1,
            learning_rate=1e-3,
        ),
        report_to="none",
        eval_fraction=0,
    )
    saved = (run.output / "config.yaml").read_text()
    assert "lr: 0.001" in saved and "lora_r: 4" in saved and "batch_size: 4" in saved and "micro_batch_size: 2" in saved
    assert "- q_proj" in saved and run.summary["steps"] == 1
    with pytest.raises(ConfigError, match="train_dataset and data are the same input"):
        tether.sft(model="m", data=rows, train_dataset=rows, output=str(tmp_path / "x"))


def test_a_gsm8k_shaped_prompt_file_is_read_with_columns_in_grpo(tmp_path):
    from tether.data.prompts import prompt_rows

    path = _write(tmp_path / "gsm8k.jsonl", [{"question": "What is 2 + 3?", "answer": "#### 5"}])
    assert prompt_rows(path, "prompt=question") == [{"prompt": "What is 2 + 3?", "answer": "#### 5"}]
    cfg = _grpo_config({"columns": "prompt=question"})
    assert cfg.rollout.columns == "prompt=question"


@pytest.mark.slow
def test_the_api_under_a_two_process_launch_is_one_data_parallel_run(case_dirs, tmp_path):
    """In-memory rows under `accelerate launch --multi_gpu --num_processes 2` (on CPU: gloo): one run of two
    processes (written once by process 0, read by both), whose weights equal one process's (the bound of
    tests/conftest.py assert_same_adamw_weights). It was two independent one-process runs in one folder."""
    from conftest import assert_same_adamw_weights
    from safetensors.torch import load_file
    from test_online_parallel import ENV, launch

    script = tmp_path / "api_run.py"
    script.write_text(
        "import sys, tether\n"
        "rows = [{'prompt': f'What is {i} + 1?', 'completion': f' {i + 1}'} for i in range(16)]\n"
        "run = tether.sft(model=sys.argv[1], data=rows, output=sys.argv[2], max_steps=3, batch_size=8,\n"
        "                 micro_batch_size=2, lr=1e-3, report_to=['none'], eval_fraction=0, dtype='float64')\n"
    )
    model = str(case_dirs["llama"])
    done = launch([model, str(tmp_path / "two")], script=str(script))
    said = done.stdout + done.stderr
    assert said.count("processes x micro-batch x accumulation  2 x 2 x 2") == 1, said[-3000:]  # one run, not two
    one = subprocess.run(
        [sys.executable, str(script), model, str(tmp_path / "one")],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert one.returncode == 0, one.stderr[-3000:]
    assert_same_adamw_weights(
        load_file(str(tmp_path / "one" / "final" / "model.safetensors")),
        load_file(str(tmp_path / "two" / "final" / "model.safetensors")),
        lr=1e-3,
        updates=3,
    )


# ------------------------------------------------------------------------------------------------------------------
# Issue 52: args= objects, in a fresh process (tests/conftest.py quiets transformers at import, which hid item 18)

ARGS_SCRIPT = """
import json, sys
import transformers, trl
import tether
from tether.compat import args_settings
from tether.config import build_config
from tether.stages.grpo_config import GRPOConfig

model, out = sys.argv[1], sys.argv[2]
rows = [{"prompt": f"Say {w}.", "completion": f" {w}."} for w in ("hi", "yes", "ok", "fine", "good", "well", "so", "no")]
# transformers' own class: the run that failed with "unknown key 'disable_tqdm'"
tether.sft(model=model, train_dataset=rows, args=transformers.TrainingArguments(output_dir=out + "/sft", max_steps=1))
pairs = [{"prompt": r["prompt"], "chosen": r["completion"], "rejected": " no idea"} for r in rows]
# TRL's class on a CPU (bf16=False, as TRL asks there): its defaults are TRL's learning rate, epochs, seed ...
tether.dpo(model=model, train_dataset=pairs, args=trl.DPOConfig(output_dir=out + "/dpo", max_steps=1, bf16=False,
           use_cpu=True, gradient_checkpointing=False, report_to="none"))
cfg = build_config(GRPOConfig, args_settings(trl.GRPOConfig(output_dir=out + "/grpo", bf16=False)), source="args")
print(json.dumps({"grpo": [cfg.optim.lr, cfg.algo.kl_coef, cfg.algo.aggregation, cfg.rollout.max_new_tokens,
                           cfg.rollout.prompts_per_step, cfg.rollout.group_size]}))
"""


def test_trl_and_transformers_config_objects_run_with_their_own_values_in_a_fresh_process(case_dirs, tmp_path):
    """Issue 52 items 18 and 19: every args= object failed outside the suite (the default instance compared with
    was built after tether quieted transformers, so disable_tqdm differed; TRL's classes did not build on a CPU),
    and behind that only non-default fields were read, so args=DPOConfig(...) trained at tether's lr 2e-5, not
    TRL's 1e-6. The run's config.yaml and plan say TRL's values now."""
    import yaml

    pytest.importorskip("trl")
    script = tmp_path / "args_run.py"
    script.write_text(ARGS_SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script), str(case_dirs["llama"]), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    said = done.stdout + done.stderr
    sft = yaml.safe_load((tmp_path / "sft" / "config.yaml").read_text())
    assert sft["optim"]["lr"] == 5e-5 and sft["train"]["epochs"] == 3.0 and sft["train"]["seed"] == 42
    assert sft["train"]["batch_size"] == 8 and sft["data"]["eval_fraction"] == 0.0  # TrainingArguments' values
    dpo = yaml.safe_load((tmp_path / "dpo" / "config.yaml").read_text())
    assert (dpo["optim"]["lr"], dpo["optim"]["warmup_ratio"], dpo["dpo"]["beta"]) == (1e-6, 0.0, 0.1)
    assert dpo["model"]["device"] == "cpu" and dpo["plan"]["learning rate"].startswith("1e-06 (warm-up 0")
    assert "lr_scheduler_type='linear'" in said.split("tether's own setting kept:")[1].splitlines()[0]
    grpo = json.loads(done.stdout.strip().splitlines()[-1])["grpo"]
    assert grpo == [1e-6, 0.0, "token-mean", 512, 1, 8]  # TRL GRPO: β 0, loss_type dapo, 512 tokens, 8 x 1


def test_the_table_of_trls_other_defaults_is_the_installed_trls():
    from pathlib import Path

    from tether.api import DEFAULTS_MARK, defaults_table
    from tether.compat import replace_between

    pytest.importorskip("trl")
    doc = Path(__file__).resolve().parent.parent / "docs" / "python-api.md"
    text = doc.read_text()
    assert replace_between(text, DEFAULTS_MARK, defaults_table()) == text, "run python -m tether.api"
    assert "| dpo | `optim.lr` | 2e-05 | `learning_rate: 1e-06` |" in text


def test_trl_dpo_loss_lists_are_composed_and_its_ipo_is_length_normalised(case_dirs, tmp_path, capsys):
    """Issue 52 items 20 and 21: TRL's `loss_type: ipo` divides the log-ratios by the completion length (tether's
    ipo sums them: another target at the same β); TRL's loss lists with loss_weights (RPO as [sigmoid, sft], MPO)
    were refused, even ["ipo"], by a message listing ipo as accepted. Now: ipo -> ipo_norm, a list -> --loss
    weighted (sft -> --sft-coef), a loss not built refused by name; the plan says which objective runs."""
    from tether.config import build_config
    from tether.stages.dpo_config import DPOConfig

    read = lambda values: build_config(DPOConfig, values, source="trl.yaml").dpo
    assert read({"loss_type": ["ipo"]}).loss == "ipo_norm" and read({"pref_loss": "ipo"}).loss == "ipo_norm"
    rpo = read({"loss_type": ["sigmoid", "sft"], "loss_weights": [1.0, 0.5]})
    assert (rpo.loss, rpo.sft_coef) == ("sigmoid", 0.5)
    mpo = read({"loss_type": ["sigmoid", "hinge"], "loss_weights": [0.8, 0.2]})
    assert (mpo.loss, mpo.loss_weights) == ("weighted", {"sigmoid": 0.8, "hinge": 0.2})
    with pytest.raises(ConfigError) as err:
        read({"loss_type": ["ipo", "exo_pair"]})
    assert "loss_type: exo_pair not built in tether" in str(err.value) and "accepted" not in str(err.value)
    with pytest.raises(ConfigError, match="loss_weights has 1 weights for 2 loss_type entries"):
        read({"loss_type": ["sigmoid", "hinge"], "loss_weights": [1.0]})
    # the composition trains: at step 1 π = π_ref, so u = 0: sigmoid log 2, ipo_norm (0 − 1/(2·0.1))² = 25, and the
    # step's loss 1 × log 2 + 0.5 × 25 = 13.1931. The reference log-probs come from another batching than the
    # policy's, so u is 0 only to float32 rounding of the sums (≤ 20 tokens × |log p| ≤ 10 × 6e-8 ≈ 1.2e-5 each):
    # ipo's slope 2 × 5 on a per-token difference bounds the change by 0.5 × 10 × 2 × 1.2e-5 ≈ 1.2e-4
    rows = [{"prompt": f"Say {w}.", "chosen": f" {w}.", "rejected": " no"} for w in ("hi", "yes", "ok", "fine")]
    config = tmp_path / "trl.yaml"
    config.write_text(
        f"model_name_or_path: {case_dirs['llama']}\ndataset_name: {_write(tmp_path / 'p.jsonl', rows)}\n"
        f"output_dir: {tmp_path / 'run'}\nloss_type: [sigmoid, ipo]\nloss_weights: [1.0, 0.5]\nmax_steps: 1\n"
        "per_device_train_batch_size: 2\ngradient_accumulation_steps: 2\nreport_to: none\neval_fraction: 0\n"
    )
    assert main(["dpo", "--config", str(config)]) == 0
    said = capsys.readouterr()
    plan = " ".join((said.out + said.err).split())
    assert "loss weighted: 1 x sigmoid + 0.5 x ipo_norm (β 0.1)" in plan
    assert "loss_type ipo: tether's ipo_norm (length-normalised, as TRL computes it)" in plan
    assert abs(_metrics(tmp_path / "run")[0]["train/loss"] - (math.log(2) + 12.5)) <= 1.2e-4


def test_trls_vllm_importance_sampling_keys_are_read_as_the_corrections_of_the_same_name(tmp_path, capsys):
    """Issue 52 item 16: vllm_importance_sampling_correction / _mode / _cap stopped with "unknown key"; since issue 55
    every TRL mode is built: each is tether's --off-policy-correction of that name, clip_max and clip_min its bounds,
    TRL's default (sequence_mask, 3) kept where TRL would apply it; the plan's generation line says which."""
    from tether.compat import args_settings
    from tether.config import build_config
    from tether.stages.grpo_config import GRPOConfig
    from tether.train.sampling import sampler_correction_line

    read = lambda values: build_config(GRPOConfig, values, source="trl.yaml").rollout
    rule = lambda ro: (ro.off_policy_correction, ro.is_ratio_min, ro.is_ratio_max)
    on = {"use_vllm": True, "vllm_importance_sampling_mode": "token_truncate"}
    assert read(on).backend == "vllm" and rule(read(on)) == ("token_truncate", 0.0, 3.0)  # TRL's default cap
    assert rule(read({**on, "vllm_importance_sampling_cap": 2})) == ("token_truncate", 0.0, 2.0)  # older name
    assert rule(read({**on, "vllm_importance_sampling_clip_max": 1.5})) == ("token_truncate", 0.0, 1.5)
    masked = {"use_vllm": True, "vllm_importance_sampling_mode": "token_mask", "vllm_importance_sampling_clip_min": 0.5}
    assert rule(read(masked)) == ("token_mask", 0.5, 3.0)
    assert rule(read({**masked, "vllm_importance_sampling_clip_max": None})) == ("token_mask", 0.5, 0.0)
    assert rule(read({"use_vllm": True, "vllm_importance_sampling_correction": True})) == ("sequence_mask", 0.0, 3.0)
    assert rule(read({"use_vllm": True, "vllm_importance_sampling_correction": False})) == ("", 0.0, 0.0)
    trl = tmp_path / "trl.yaml"
    for text, message in (
        ("use_vllm: true\nvllm_importance_sampling_mode: geo\n", "vllm_importance_sampling_mode: 'geo': TRL's modes"),
        ("use_vllm: true\nvllm_importance_sampling_clip_max: 0.5\nvllm_importance_sampling_clip_min: 2\n", "min < max"),
        ("use_bias_correction_kl: true\n", "multiplies the KL term by π_θ/π_old"),
    ):
        trl.write_text(text)
        assert main(["grpo", "--config", str(trl)]) == 2
        err = capsys.readouterr().err
        assert message in err and "unknown key" not in err, err
    assert rule(read({"use_bias_correction_kl": False})) == ("", 0.0, 0.0)  # tether's behaviour already
    assert sampler_correction_line(read(on)) == "; off-policy correction token_truncate, ratio bounds [0, 3]"
    assert sampler_correction_line(read({**masked, "vllm_importance_sampling_clip_max": None})) == (
        "; off-policy correction token_mask, ratio bounds [0.5, inf)"
    )
    pytest.importorskip("trl")
    import trl as trl_module

    theirs = read(args_settings(trl_module.GRPOConfig(output_dir=str(tmp_path), use_vllm=True, bf16=False)))
    assert theirs.backend == "vllm" and rule(theirs) == ("sequence_mask", 0.0, 3.0)
    said = capsys.readouterr()
    assert "TRL's default vLLM correction kept: sequence_mask, ratio bounds [0, 3]" in said.out + said.err
    plain = read({"use_vllm": True, "vllm_importance_sampling_correction": False})
    assert "not corrected: --off-policy-correction corrects it" in sampler_correction_line(plain)


def test_plain_string_preferences_say_they_are_trained_without_the_chat_template(case_dirs, tmp_path, capsys):
    """Issue 52 item 25: the README's plain-string preference row trains a chat model without its chat template
    (alpaca and messages rows use it), and nothing said so. The data report printed before the plan counts them."""
    plain = [{"prompt": f"Say {w}.", "chosen": f" {w}.", "rejected": " no"} for w in ("hi", "yes", "ok", "fine")]
    chat = [
        {
            "prompt": [{"role": "user", "content": r["prompt"]}],
            "chosen": [{"role": "assistant", "content": r["chosen"]}],
            "rejected": [{"role": "assistant", "content": r["rejected"]}],
        }
        for r in plain
    ]
    common = ["--model", str(case_dirs["qwen2"]), *QUICK, "--max-steps", "1", "--eval-fraction", "0"]
    for stage in ("dpo", "rm"):
        assert (
            main([stage, "--data", _write(tmp_path / "p.jsonl", plain), "--output", str(tmp_path / stage), *common])
            == 0
        )
        said = " ".join(capsys.readouterr().err.split())
        assert "4 of plain strings, rendered as prompt + response + EOS without the tokenizer's chat template" in said
    assert main(["dpo", "--data", _write(tmp_path / "c.jsonl", chat), "--output", str(tmp_path / "c"), *common]) == 0
    assert "of plain strings" not in capsys.readouterr().err
