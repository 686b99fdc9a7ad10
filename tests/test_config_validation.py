"""Every option declared once and validated once: the same invalid value fails with an error naming the field
whether it comes from a YAML file, from build_config (the lab's programmatic configs) or from dataclasses built
in Python; renamed keys keep working with a warning; cross-field rules; derived values."""

import logging

import pytest

from tether.cli import build_parser
from tether.config import ConfigError, build_config, config_from_args
from tether.sections import ModelSection, OnlineRunSection, PolicySection, TrainSection
from tether.stages.dpo_config import DPOConfig, DPOSection
from tether.stages.grpo_config import GroupSection, GRPOConfig
from tether.stages.ppo_config import CriticSection, PPOConfig
from tether.stages.rm import RMConfig
from tether.stages.sft import SFTConfig

# (stage, config class, section, field, invalid value, what the error must say)
INVALID = [
    ("grpo", GRPOConfig, "algo", "kl_estimator", "k4", "kl_estimator='k4' is not one of k1, k2, k3"),
    ("grpo", GRPOConfig, "model", "dtype", "int8", "dtype='int8' is not one of"),
    ("grpo", GRPOConfig, "train", "best_mode", "median", "best_mode='median' is not one of max, min"),
    ("grpo", GRPOConfig, "algo", "advantage", "vibes", "advantage='vibes' is not one of"),
    ("ppo", PPOConfig, "critic", "layout", "weird", "layout='weird' is not one of separate, shared"),
    ("ppo", PPOConfig, "train", "best_mode", "median", "best_mode='median' is not one of max, min"),
    ("ppo", PPOConfig, "train", "report_to", ["foo"], "report_to='foo' is not one of"),
    ("ppo", PPOConfig, "model", "dtype", "int8", "dtype='int8' is not one of"),
    ("dpo", DPOConfig, "dpo", "loss", "nope", "loss='nope' is not one of sigmoid"),
    ("dpo", DPOConfig, "train", "report_to", ["foo"], "report_to='foo' is not one of"),
    ("dpo", DPOConfig, "dpo", "beta_dpo_margin", "half", "beta_dpo_margin='half' is not one of scaled, unscaled"),
    ("sft", SFTConfig, "model", "dtype", "int8", "dtype='int8' is not one of"),
    ("sft", SFTConfig, "optim", "lr_schedule", "linear", "lr_schedule='linear' is not one of cosine, constant"),
    ("rm", RMConfig, "rm", "ranking_loss", "ranked", "ranking_loss='ranked' is not one of"),
    ("rm", RMConfig, "train", "report_to", ["foo"], "report_to='foo' is not one of"),
    ("sft", SFTConfig, "train", "micro_batch_tokens", -5, "micro_batch_tokens=-5: must be >= 0"),
    ("sft", SFTConfig, "optim", "adam_beta1", 1.0, r"adam_beta1=1.0: must be in \[0, 1\)"),
    ("dpo", DPOConfig, "optim", "adam_beta2", -0.1, r"adam_beta2=-0.1: must be in \[0, 1\)"),
    ("grpo", GRPOConfig, "optim", "weight_decay", -0.01, "weight_decay=-0.01: must be >= 0"),
    ("rm", RMConfig, "optim", "max_grad_norm", -1.0, "max_grad_norm=-1.0: must be >= 0"),
]


def _yaml(tmp_path, section, field, value):
    import yaml

    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({section: {field: value}}))
    return path


@pytest.mark.parametrize("stage, config_cls, section, field, value, message", INVALID)
def test_an_invalid_value_names_its_field_from_yaml_and_from_python(
    tmp_path, stage, config_cls, section, field, value, message
):
    path = _yaml(tmp_path, section, field, value)
    args = build_parser().parse_args([stage, "--config", str(path)])
    with pytest.raises(ConfigError, match=rf"run.yaml: {section} section: {message}"):
        config_from_args(config_cls, args)  # a YAML file
    with pytest.raises(ConfigError, match=rf"lab: {section} section: {message}"):
        build_config(config_cls, overrides={f"{section}.{field}": value}, source="lab")  # a programmatic config
    section_cls = type(getattr(config_cls(), section))
    with pytest.raises(ConfigError, match=message):
        section_cls(**{field: value})  # a dataclass built in Python


# (YAML value, the field, what the error says): checked, not converted (2.5 is no int, true no number)
NOT_CONVERTED = [
    ("train", "batch_size", 2.5, "train.batch_size must be int, got 2.5"),
    ("train", "max_steps", True, "train.max_steps must be int, got True"),
    ("optim", "lr", True, "optim.lr must be a finite float, got True"),
    ("train", "epochs", float("nan"), "train.epochs must be a finite float, got nan"),
    ("optim", "lr", float("inf"), "optim.lr must be a finite float, got inf"),
    ("train", "max_steps", None, "train.max_steps must be int, got null"),
    ("data", "path", ["a.jsonl", "b.jsonl"], r"data.path must be str, got \['a.jsonl', 'b.jsonl'\]"),
]


@pytest.mark.parametrize("section, field, value, message", NOT_CONVERTED)
def test_a_value_of_the_wrong_kind_is_refused_not_converted(tmp_path, section, field, value, message):
    path = _yaml(tmp_path, section, field, value)
    args = build_parser().parse_args(["sft", "--config", str(path)])
    with pytest.raises(ConfigError, match=rf"run.yaml: {message}"):
        config_from_args(SFTConfig, args)  # a YAML file
    with pytest.raises(ConfigError, match=rf"tether.sft\(\): {message}"):
        build_config(SFTConfig, {section: {field: value}}, source="tether.sft()")  # the Python API's config values


def test_a_whole_float_is_an_int_and_a_nan_flag_is_refused():
    assert build_config(SFTConfig, {"train": {"batch_size": 4.0, "micro_batch_size": 2}}).train.batch_size == 4
    args = build_parser().parse_args(["sft", "--epochs", "nan"])
    with pytest.raises(ConfigError, match="command line: train.epochs must be a finite float, got nan"):
        config_from_args(SFTConfig, args)


def test_resume_and_overwrite_together_are_refused_everywhere():
    for config_cls in (SFTConfig, RMConfig, DPOConfig, PPOConfig, GRPOConfig):
        with pytest.raises(ConfigError, match="train section: resume and overwrite contradict each other"):
            build_config(config_cls, overrides={"train.resume": True, "train.overwrite": True})
    with pytest.raises(ConfigError, match="resume and overwrite"):
        OnlineRunSection(max_steps=3, resume=True, overwrite=True)


def test_a_flag_with_choices_is_refused_by_argparse_with_the_choices(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["grpo", "--kl-estimator", "k4"])
    assert "invalid choice: 'k4'" in capsys.readouterr().err


def test_cross_field_rules_are_checked_at_construction():
    with pytest.raises(ConfigError, match="kl_in_reward=0.1 folds the KL into token rewards"):
        build_config(GRPOConfig, overrides={"algo.kl_in_reward": 0.1})  # recipe grpo: advantage group
    assert build_config(GRPOConfig, overrides={"algo.recipe": "reinforce_pp"}).algo.kl_in_reward == 0.01
    with pytest.raises(ConfigError, match="lora_dropout=0.1 has no effect while dropout is disabled"):
        ModelSection(lora_r=4, lora_dropout=0.1)
    assert ModelSection(lora_r=4, lora_dropout=0.1, keep_dropout=True).lora_dropout == 0.1
    with pytest.raises(ConfigError, match="trainable_params selects weights to train"):
        PolicySection(lora_r=4, trainable_params="norm")
    with pytest.raises(ConfigError, match="group_size=1: a group baseline needs at least two"):
        build_config(GRPOConfig, overrides={"rollout.group_size": 1})
    with pytest.raises(ConfigError, match="online rounds make pairs"):
        build_config(DPOConfig, overrides={"online.online": True, "dpo.loss": "listwise", "online.judge": "m:f"})
    with pytest.raises(ConfigError, match="online.online needs a labeller"):
        build_config(DPOConfig, overrides={"online.online": True})
    with pytest.raises(ConfigError, match="best_metric=eval/score_mean needs rollout.eval_prompts"):
        build_config(PPOConfig, overrides={"train.best_metric": "eval/score_mean"})
    with pytest.raises(ConfigError, match="best_metric=eval/audit_score_mean needs rollout.eval_prompts"):
        build_config(PPOConfig, overrides={"train.best_metric": "eval/audit_score_mean"})  # without --audit
    with pytest.raises(ConfigError, match="overlong_cache=100 is larger than max_new_tokens=64"):
        build_config(PPOConfig, overrides={"rewards.overlong_cache": 100})
    with pytest.raises(ConfigError, match="dual_clip=0.5: must be > 1"):
        GroupSection(dual_clip=0.5)
    with pytest.raises(ConfigError, match="max_steps=0: an online run needs at least 1 step"):
        OnlineRunSection(max_steps=0)
    with pytest.raises(ConfigError, match="lr=0.0 must be > 0"):
        CriticSection(lr=0.0)
    with pytest.raises(ConfigError, match="loss robust needs 0 < label_smoothing"):
        DPOSection(loss="robust")
    with pytest.raises(ConfigError, match="batch_size=0"):
        TrainSection(batch_size=0)


def test_stage_defaults_recipes_and_derived_values():
    ppo, grpo, dpo = build_config(PPOConfig), build_config(GRPOConfig), build_config(DPOConfig)
    assert (ppo.rollout.max_new_tokens, ppo.algo.kl_estimator, ppo.optim.lr, ppo.optim.lr_schedule) == (
        64,
        "k1",
        1e-5,
        "constant",
    )
    assert (grpo.rollout.group_size, grpo.algo.kl_estimator, grpo.optim.lr) == (8, "k3", 1e-6)
    assert (dpo.optim.lr_schedule, dpo.rollout.group_size) == ("cosine", 2)
    assert PPOConfig() == ppo and GRPOConfig().algo.kl_coef == 0.04  # Python-built configs get the same defaults
    dapo = build_config(GRPOConfig, overrides={"algo.recipe": "dapo", "rollout.max_new_tokens": 40})
    assert dapo.rewards.overlong_cache == -1 and dapo.rewards.overlong_tokens(40) == 10  # -1: a quarter of the budget
    assert dapo.algo.dynamic_sampling and dapo.algo.clip_high == 0.28 and dapo.norm_length == 40
    drgrpo = build_config(GRPOConfig, overrides={"algo.recipe": "dr_grpo", "algo.norm_length": 32})
    assert drgrpo.norm_length == 32 and not drgrpo.needs_reference()
    from tether.online_sections import minibatch_size, updates_per_step

    assert minibatch_size(grpo.algo, grpo.rollout) == 16 * 8  # 0: the whole rollout batch
    assert updates_per_step(ppo.algo, ppo.rollout) == 2 * 2  # 32 responses / 16 per minibatch x 2 epochs


def test_renamed_keys_and_flags_keep_working_with_a_warning(tmp_path, caplog):
    old_yaml = tmp_path / "old.yaml"
    old_yaml.write_text(
        "roles:\n  policy: p\n  reward_model: r\nppo:\n  steps: 7\n  policy_lr: 0.003\n  ppo_epochs: 3\n"
        "run:\n  seed: 5\n"
    )
    with caplog.at_level(logging.WARNING, logger="tether.config"):
        cfg = config_from_args(PPOConfig, build_parser().parse_args(["ppo", "--config", str(old_yaml)]))
    assert (
        cfg.model.path,
        cfg.rewards.reward_model,
        cfg.train.max_steps,
        cfg.optim.lr,
        cfg.algo.update_epochs,
        cfg.train.seed,
    ) == ("p", "r", 7, 0.003, 3, 5)
    assert "ppo.steps is now called train.max_steps" in caplog.text
    args = build_parser().parse_args(["ppo", "--policy", "p", "--steps", "9", "--policy-lr", "0.01"])
    cfg = config_from_args(PPOConfig, args)
    assert (cfg.model.path, cfg.train.max_steps, cfg.optim.lr) == ("p", 9, 0.01)
    grpo = build_config(
        GRPOConfig, {"model": {"policy": "p"}, "algo": {"lr": 0.1, "inner_iterations": 2}, "run": {"steps": 4}}
    )
    assert (grpo.model.path, grpo.optim.lr, grpo.algo.update_epochs, grpo.train.max_steps) == ("p", 0.1, 2, 4)
    dpo = build_config(
        DPOConfig, {"online": {"prompts": "x.jsonl", "prompts_per_round": 12}, "dpo": {"reference": "r"}}
    )
    assert (dpo.rollout.prompts, dpo.rollout.prompts_per_step, dpo.model.reference) == ("x.jsonl", 12, "r")
    with pytest.raises(ConfigError, match=r"unknown field ppo.nonsense; algo has \['adaptive_kl'"):
        build_config(PPOConfig, {"ppo": {"nonsense": 1}})


def test_help_shows_the_yaml_key_and_the_stage_default(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["ppo", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "YAML rollout.max_new_tokens; default: 64" in out and "--policy" in out and "--critic-layout" in out


@pytest.mark.parametrize("loss", ["kto", "beta_dpo"])
def test_step_wide_losses_refuse_token_budgets_when_sharded(loss):
    base = {"model.path": "m", "data.path": "d", "train.output": "o", "dpo.loss": loss, "train.micro_batch_tokens": 512}
    build_config(DPOConfig, overrides=base)  # unsharded: fine
    build_config(DPOConfig, overrides={**base, "dpo.loss": "sigmoid", "model.fsdp": True})  # a per-pair loss: fine
    with pytest.raises(ConfigError, match=rf"dpo.loss={loss} with train.micro_batch_tokens and model.fsdp"):
        build_config(DPOConfig, overrides={**base, "model.fsdp": True})


def test_reward_settings_that_cannot_work_are_refused_at_config_time(tmp_path, capsys):
    """Issue 52 item 33: --step-pattern '([' was a re.error mid-run, NaN weights were accepted, a TRL YAML's
    `reward_funcs: 3` was a TypeError: each is now one line naming the file and the field, before any model loads."""
    from tether.cli import main

    trl = tmp_path / "trl.yaml"
    for text, message in (
        ("reward_funcs: 3\n", "trl.yaml: reward_funcs: 3: expected a reward function's dotted path"),
        ("reward_funcs: [a.b, c.d]\nreward_weights: [1, x]\n", "trl.yaml: reward_weights: 'x' is not a number"),
    ):
        trl.write_text(text)
        assert main(["grpo", "--config", str(trl)]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err
    for flags, message in (
        (["--step-pattern", "(["], "step_pattern='([': not a regular expression"),
        (["--process-reward-weight", "nan"], "rewards.process_reward_weight must be a finite float, got nan"),
        (["--reward-model-weight", "nan"], "rewards.reward_model_weight must be a finite float, got nan"),
    ):
        assert main(["grpo", *flags]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err


def test_offline_dpo_refuses_what_only_online_rounds_use(capsys):
    """Issue 52 item 36: --rollout-backend and --judge were silently ignored by offline dpo."""
    from tether.cli import main

    for flags in (["--rollout-backend", "vllm"], ["--judge", "m:f"], ["--reward", "m:f"]):
        assert main(["dpo", "--data", "d.jsonl", *flags]) == 2
        err = capsys.readouterr().err
        assert f"{flags[0]}" in err and "offline DPO trains on the pairs in --data" in err, err
    assert build_config(DPOConfig, overrides={"online.online": True, "online.judge": "m:f"}).online.judge == "m:f"


def test_two_names_of_one_setting_with_different_values_are_refused():
    """model.chat_template and its alias data.chat_template given different values: one was silently dropped."""
    both = {"model": {"chat_template": "a.jinja"}, "data": {"chat_template": "b.jinja"}}
    message = r"model.chat_template='a.jinja' and data.chat_template='b.jinja' are one setting \(model.chat_template\)"
    with pytest.raises(ConfigError, match=rf"f.yaml: {message}"):
        build_config(SFTConfig, both, source="f.yaml")
    same = {"model": {"chat_template": "a.jinja"}, "data": {"chat_template": "a.jinja"}}
    assert build_config(SFTConfig, same).model.chat_template == "a.jinja"  # the same value twice is no conflict


def test_a_flat_key_written_null_is_not_set_as_trl_and_llamafactory_mean_it():
    """A TRL or LLaMA-Factory config dump writes null for "not set", under tether's names too (top_k, max_steps,
    seed): the stage's defaults stand. tether's own sections take no null (above)."""
    dump = {"model_name_or_path": "m", "top_k": None, "max_steps": None, "seed": None}
    config = build_config(GRPOConfig, dump, source="trl.yaml")
    defaults = build_config(GRPOConfig, {"model_name_or_path": "m"}, source="trl.yaml")
    assert (config.rollout.top_k, config.train.max_steps, config.train.seed) == (
        defaults.rollout.top_k,
        defaults.train.max_steps,
        defaults.train.seed,
    )
