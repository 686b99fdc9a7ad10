"""Config precedence, validation messages, and the command line built from the dataclasses."""

import pytest

from tether.cli import build_parser, main
from tether.config import ConfigError, build_config, config_from_args
from tether.stages.sft import SFTConfig


def test_precedence_defaults_then_yaml_then_flags(tmp_path):
    yaml_file = tmp_path / "run.yaml"
    yaml_file.write_text("optim:\n  lr: 0.001\ntrain:\n  batch_size: 16\n  report_to: [none]\n")
    args = build_parser().parse_args(["sft", "--config", str(yaml_file), "--batch-size", "8", "--model", "m"])
    cfg = config_from_args(SFTConfig, args)
    assert cfg.optim.lr == 0.001  # from the file
    assert cfg.train.batch_size == 8  # the flag wins over the file
    assert cfg.model.path == "m"
    assert cfg.train.micro_batch_size == 8  # default
    assert cfg.train.report_to == ["none"]


def test_a_repeated_list_flag_adds_up_instead_of_replacing(tmp_path):
    from tether.stages.grpo_config import GRPOConfig

    yaml_file = tmp_path / "run.yaml"
    yaml_file.write_text("rewards:\n  reward: [from_yaml:f]\n")
    args = build_parser().parse_args(
        ["grpo", "--config", str(yaml_file), "--reward", "m:a(x=1,y=2)=0.5,m:b", "--reward", "m:c"]
    )
    cfg = config_from_args(GRPOConfig, args)
    assert cfg.rewards.reward == ["m:a(x=1,y=2)=0.5", "m:b", "m:c"]  # the flags replace the file's list, and add up


def test_unknown_yaml_field_names_the_file_and_the_fields(tmp_path):
    yaml_file = tmp_path / "run.yaml"
    yaml_file.write_text("optim:\n  learning_rate: 0.1\n")
    args = build_parser().parse_args(["sft", "--config", str(yaml_file)])
    with pytest.raises(ConfigError, match=r"run.yaml: unknown field optim.learning_rate; optim has .*'lr'"):
        config_from_args(SFTConfig, args)


def test_wrong_type_in_yaml_is_named():
    with pytest.raises(ConfigError, match="train.batch_size must be int"):
        build_config(SFTConfig, {"train": {"batch_size": "many"}}, source="x.yaml")


def test_validation_proposes_a_fix():
    cfg = build_config(SFTConfig, {"train": {"batch_size": 10, "micro_batch_size": 4}})
    with pytest.raises(ConfigError, match="batch_size=10 is not a multiple of micro_batch_size=4 x 1 process"):
        cfg.train.grad_accum(1)
    assert build_config(SFTConfig, {"train": {"batch_size": 16, "micro_batch_size": 4}}).train.grad_accum(2) == 2
    with pytest.raises(ConfigError, match="lr="):
        build_config(SFTConfig, {"optim": {"lr": -1.0}})
    with pytest.raises(ConfigError, match="report_to='tensorbored'"):
        build_config(SFTConfig, {"train": {"report_to": ["tensorbored"]}})


def test_help_lists_stages_and_option_help(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert "sft" in out and "data" in out
    with pytest.raises(SystemExit):
        main(["sft", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--micro-batch-size" in out and "gradient accumulation covers the rest" in out
    assert "--lora-r" in out and "--train-on-prompt" in out and "--demo" in out


def test_a_flat_yaml_of_flag_names_and_trl_names_is_the_nested_one(tmp_path):
    from tether.config import config_to_dict, load_yaml
    from tether.stages.grpo_config import GRPOConfig

    flat = tmp_path / "flat.yaml"
    flat.write_text(
        "model_name_or_path: m\nlearning_rate: 1.0e-5\nmax_steps: 7\nnum_generations: 4\n"
        "max-new-tokens: 32\nprompts: p.jsonl\nreward: [r.py:f]\nbf16: true\noutput_dir: out\n"
    )
    nested = tmp_path / "nested.yaml"
    nested.write_text(
        "model: {path: m, mixed_precision: bf16}\noptim: {lr: 1.0e-5}\n"
        "train: {max_steps: 7, output: out}\nrollout: {group_size: 4, max_new_tokens: 32, prompts: p.jsonl}\n"
        "rewards: {reward: [r.py:f]}\n"
    )
    a = build_config(GRPOConfig, load_yaml(flat), source=str(flat))
    b = build_config(GRPOConfig, load_yaml(nested), source=str(nested))
    assert config_to_dict(a) == config_to_dict(b)
    flat.write_text("max_stesp: 7\n")
    with pytest.raises(ConfigError, match=r"flat.yaml: unknown key 'max_stesp' \(did you mean 'max_steps'\?\)"):
        build_config(GRPOConfig, load_yaml(flat), source=str(flat))


def test_a_runs_own_config_yaml_is_accepted_back(tmp_path):
    import yaml

    from tether.config import config_to_dict, load_yaml
    from tether.stages.grpo_config import GRPOConfig

    cfg = build_config(
        GRPOConfig,
        overrides={"model.path": "m", "rollout.prompts": "p.jsonl", "rewards.reward": ["r.py:f"], "train.max_steps": 3},
    )
    saved = tmp_path / "config.yaml"  # as a run writes it: the settings and the plan table
    saved.write_text(yaml.safe_dump({**config_to_dict(cfg), "plan": {"recipe": "grpo", "processes": 1}}))
    assert config_to_dict(build_config(GRPOConfig, load_yaml(saved))) == config_to_dict(cfg)


def test_the_readmes_yaml_and_preference_row_are_read_as_they_are(tmp_path, tokenizer):
    """The README shows a run.yaml and a prefs.jsonl line; both must be what tether reads."""
    import json
    import re
    from pathlib import Path

    import yaml

    from tether.data.preferences import preference_format
    from tether.data.records import read_records
    from tether.stages.sft_config import SFTConfig

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    block = re.search(r"```yaml\n(# run.yaml.*?)```", readme, re.S).group(1)
    cfg = build_config(SFTConfig, yaml.safe_load(block), source="README run.yaml")
    assert (cfg.data.path, cfg.optim.lr, cfg.train.micro_batch_size) == ("train.jsonl", 2e-5, 4)
    row = re.search(r"```json\n(.*?)\n```", readme, re.S).group(1)
    (tmp_path / "prefs.jsonl").write_text(json.dumps(json.loads(row)) + "\n")
    assert preference_format(read_records(tmp_path / "prefs.jsonl"), "prefs.jsonl") == "pairs"
