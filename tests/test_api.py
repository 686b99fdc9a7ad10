"""The Python API (tether/api.py, docs/python-api.md): in-memory data, loaded models and callables in, the same
configs, checks and run folders as the command line out."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import tether
from tether.config import ConfigError

REPO = Path(__file__).resolve().parent.parent


def _rows(n=16):
    return [
        {"prompt": f"What is {i} + 1?\n", "completion": f"{i} + 1 = {i + 1}.", "answer": str(i + 1)} for i in range(n)
    ]


QUICK = dict(max_steps=2, batch_size=4, micro_batch_size=4, eval_every=0, save_every=0, report_to=["none"])


def test_sft_takes_a_dataset_and_a_loaded_model_and_writes_them_beside_the_run(llama_dir, tmp_path):
    from datasets import Dataset

    from tether.models.lm import load_model, load_tokenizer

    tokenizer = load_tokenizer(llama_dir)
    model = load_model(llama_dir, tokenizer)
    # the same inputs both times, so the second call resumes the run; learning_rate is TRL's name for lr, as in a
    # flat YAML
    same = dict(model=model, tokenizer=tokenizer, output=str(tmp_path / "sft"), learning_rate=1e-3)
    run = tether.sft(**same, data=Dataset.from_list(_rows()), eval_data=_rows(4), **QUICK)
    assert isinstance(run, tether.RunResult) and run.stage == "sft" and run.summary["steps"] == 2
    inputs = tmp_path / "sft-inputs"
    assert (inputs / "data.jsonl").read_text().count("\n") == 16 and (inputs / "model" / "config.json").is_file()
    config = (tmp_path / "sft" / "config.yaml").read_text()
    assert f"path: {inputs / 'data.jsonl'}" in config and "lr: 0.001" in config
    trained, _ = run.load()
    assert trained.config.vocab_size == model.config.vocab_size
    # resume from Python with the same inputs: the written files are the same, so the run continues
    longer = {**QUICK, "max_steps": 3, "save_every": 1}
    again = tether.sft(**same, data=Dataset.from_list(_rows()), eval_data=_rows(4), **longer, overwrite=True)
    assert again.summary["steps"] == 3


def test_settings_are_validated_once_whatever_their_source(llama_dir, tmp_path):
    """A config dataclass, then keywords over it; a bad keyword names itself before anything is written."""
    from tether.sections import OptimSection
    from tether.stages.sft_config import SFTConfig

    config = SFTConfig(optim=OptimSection(lr=5e-4))
    run = tether.sft(config, model=str(llama_dir), data=_rows(), output=str(tmp_path / "a"), **QUICK)
    assert "lr: 0.0005" in (tmp_path / "a" / "config.yaml").read_text() and run.summary["steps"] == 2
    with pytest.raises(ConfigError, match="unknown key 'learnin_rate' \\(did you mean 'learning_rate'\\?\\)"):
        tether.sft(model=str(llama_dir), data=_rows(), output=str(tmp_path / "b"), learnin_rate=1e-3)
    with pytest.raises(ConfigError, match="expected a SFTConfig"):
        tether.sft(tether.GRPOConfig(), model=str(llama_dir), data=_rows(), output=str(tmp_path / "b"))
    with pytest.raises(ConfigError, match=r"data\[1\]: rows must be dicts"):
        tether.sft(model=str(llama_dir), data=[{"text": "a"}, "b"], output=str(tmp_path / "b"))
    with pytest.raises(ConfigError, match="a loaded model needs its tokenizer"):
        from tether.models.lm import load_model

        tether.sft(model=load_model(llama_dir), data=_rows(), output=str(tmp_path / "b"))
    assert not (tmp_path / "b").exists() and not (tmp_path / "b-inputs" / "model").exists()


def test_grpo_takes_reward_callables_and_resumes_with_them(llama_dir, tmp_path):
    """Callables are registered as python:<name>; weights come as (fn, w); a CLI resume of such a run says what to do."""
    seen = []

    def correct(completions, answer, trainer_state, **kwargs):
        seen.append(trainer_state.global_step)
        return [float(a in c) for c, a in zip(completions, answer)]

    def short(completions, **kwargs):
        return [-len(c) / 100 for c in completions]

    prompts = [{"prompt": r["prompt"], "answer": r["answer"]} for r in _rows(8)]
    # TRL's names for tether's settings, as a TRL user's script passes them
    settings = dict(model=str(llama_dir), prompts=prompts, reward_funcs=[correct, (short, 0.5)])
    settings.update(output=str(tmp_path / "g"), num_generations=2, prompts_per_step=2, max_completion_length=4)
    settings.update(eval_every=0, save_every=1, report_to=["none"])
    run = tether.grpo(**settings, max_steps=2)
    assert run.summary["steps"] == 2
    config = (tmp_path / "g" / "config.yaml").read_text()
    assert "python:correct" in config and "python:short=0.5" in config
    last = [json.loads(line) for line in (tmp_path / "g" / "metrics.jsonl").read_text().splitlines()][-1]
    assert "reward/correct/mean" in last and "reward/short/mean" in last
    assert seen[0] == 0 and seen[-1] == 1  # the dry call at step 0, then each step's trainer_state
    cli = subprocess.run(
        [
            sys.executable,
            "-m",
            "tether",
            "grpo",
            "--config",
            str(tmp_path / "g" / "config.yaml"),
            "--resume",
            "--max-steps",
            "3",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert cli.returncode == 2 and "handed to tether's Python API in another process" in cli.stderr
    resumed = tether.grpo(**settings, max_steps=3, resume=True)
    assert resumed.summary["resumed_from"] == 2 and resumed.summary["steps"] == 3


@pytest.mark.slow
def test_the_python_api_example_runs_every_stage(tmp_path):
    """examples/python_api.py: sft, rm, dpo, kto, grpo and ppo from Python, each with its in-memory inputs."""
    out = subprocess.run(
        [sys.executable, str(REPO / "examples" / "python_api.py"), "--output", str(tmp_path / "api"), "--steps", "2"],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(figures) == {"sft", "rm", "dpo", "kto", "grpo", "ppo"}
    assert figures["sft"]["steps"] == 60 and all(figures[s]["steps"] == 2 for s in ("rm", "dpo", "kto", "grpo", "ppo"))
    for stage in figures:
        assert (tmp_path / "api" / stage / "final" / "config.json").is_file()


def test_a_recipe_keyword_applies_its_preset_over_a_config_object_and_keywords_still_win(monkeypatch, tmp_path):
    """tether.grpo(cfg, recipe="dapo") recorded recipe dapo with GRPO's settings: every field of the config object
    was read as the user's and overrode the preset; the command line's --config FILE --recipe dapo likewise."""
    import yaml

    from tether.cli import build_parser
    from tether.config import build_config, config_from_args, config_to_dict
    from tether.stages.grpo_config import GRPOConfig

    built = []
    monkeypatch.setattr(tether.api, "run_stage", lambda stage, cfg, **hooks: built.append(cfg) or {})
    given = {"rollout.prompts": "p.jsonl", "model.path": "m", "train.output": str(tmp_path / "g")}
    cfg = build_config(GRPOConfig, overrides=given)  # recipe grpo: clip_high 0.2, kl_coef 0.04
    tether.grpo(cfg, recipe="dapo")
    tether.grpo(cfg, recipe="dapo", clip_high=0.3)
    dapo = built[0].algo
    assert (dapo.recipe, dapo.clip_high, dapo.kl_coef, dapo.dynamic_sampling) == ("dapo", 0.28, 0.0, True)
    assert (built[1].algo.clip_high, built[1].algo.kl_coef) == (0.3, 0.0)  # the keyword wins over the preset
    assert config_to_dict(built[0]) == config_to_dict(
        build_config(GRPOConfig, overrides={**given, "algo.recipe": "dapo"})
    )
    path = tmp_path / "grpo.yaml"
    path.write_text(yaml.safe_dump(config_to_dict(cfg)))
    args = build_parser().parse_args(["grpo", "--config", str(path), "--recipe", "dapo", "--clip-low", "0.1"])
    flagged = config_from_args(GRPOConfig, args).algo
    assert (flagged.clip_high, flagged.kl_coef, flagged.clip_low) == (0.28, 0.0, 0.1)
    path.write_text(yaml.safe_dump({"algo": {"recipe": "dapo", "clip_high": 0.3}}))  # a file's own recipe: under it
    assert (
        config_from_args(GRPOConfig, build_parser().parse_args(["grpo", "--config", str(path)])).algo.clip_high == 0.3
    )
