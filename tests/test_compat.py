"""Other projects' keys read as their projects define them (tether/compat/): each expected value is worked out by hand
from TRL's, transformers', peft's or LLaMA-Factory's own definition, written beside it."""

from __future__ import annotations

import pytest

from tether.api import config_class
from tether.config import ConfigError, build_config


@pytest.fixture(autouse=True)
def one_process(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "1")


def _config(stage: str, values: dict):
    return build_config(config_class(stage), values, source="theirs.yaml")


# ---- TRL's PPO batch sizes


def test_trl_ppo_num_mini_batches_multiply_the_rollout_not_divide_it(monkeypatch):
    """TRL's PPOTrainer: batch_size = B·A·num_mini_batches·N prompts per rollout, mini_batch_size = B·A·N per
    optimizer update, ⌈total_episodes / batch_size⌉ rollouts. B 4, A 2, 2 mini-batches: 4·2·2 = 16 prompts, 4·2 = 8
    a minibatch, 64 / 16 = 4 rollouts; on 2 processes 32, 16 and ⌈64 / 32⌉ = 2."""
    trl = {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "num_mini_batches": 2}
    cfg = _config("ppo", {**trl, "total_episodes": 64})
    assert (cfg.rollout.prompts_per_step, cfg.algo.minibatch, cfg.train.max_steps) == (16, 8, 4)
    monkeypatch.setenv("WORLD_SIZE", "2")
    cfg = _config("ppo", {**trl, "total_episodes": 64})
    assert (cfg.rollout.prompts_per_step, cfg.algo.minibatch, cfg.train.max_steps) == (32, 16, 2)
    monkeypatch.setenv("WORLD_SIZE", "1")
    cfg = _config("ppo", {**trl, "num_mini_batches": 1, "total_episodes": 20})  # 8 a rollout, one update: ⌈20/8⌉
    assert (cfg.rollout.prompts_per_step, cfg.algo.minibatch, cfg.train.max_steps) == (8, 0, 3)


# ---- LLaMA-Factory


def test_llamafactory_orpo_pref_beta_is_the_odds_ratio_weight():
    """LLaMA-Factory's ORPO: loss = sft_loss + pref_beta · odds_ratio_loss, i.e. tether's orpo_lambda; β untouched
    (0, the loss's usual value). With another loss pref_beta is β and orpo_lambda keeps tether's 0.1."""
    cfg = _config("dpo", {"stage": "dpo", "pref_loss": "orpo", "pref_beta": 0.5})
    assert (cfg.dpo.loss, cfg.dpo.orpo_lambda, cfg.dpo.beta) == ("orpo", 0.5, 0.0)
    cfg = _config("dpo", {"stage": "dpo", "pref_loss": "sigmoid", "pref_beta": 0.5})
    assert (cfg.dpo.loss, cfg.dpo.orpo_lambda, cfg.dpo.beta) == ("sigmoid", 0.1, 0.5)
    with pytest.raises(ConfigError, match="pref_beta: not a setting of tether sft"):
        _config("sft", {"pref_beta": 0.5})


@pytest.mark.parametrize(
    "values, lora",
    [
        ({"finetuning_type": "lora", "lora_rank": 16}, (16, 32.0)),  # LF: lora_alpha = lora_rank · 2
        ({"finetuning_type": "lora"}, (8, 16.0)),  # LF's lora_rank 8: alpha 16
        ({"lora_rank": 4}, (4, 8.0)),  # LF's finetuning_type is lora by default: the rank turns it on
        ({"finetuning_type": "lora", "lora_rank": 16, "lora_alpha": 8}, (16, 8.0)),  # given: kept
        ({"use_peft": True, "lora_r": 8}, (8, 32.0)),  # TRL's ModelConfig: lora_alpha 32 whatever the rank
    ],
)
def test_llamafactory_lora_alpha_defaults_to_twice_the_rank(values, lora):
    cfg = _config("sft", values)
    assert (cfg.model.lora_r, cfg.model.lora_alpha) == lora


def test_llamafactory_ppo_adapts_beta_towards_ppo_target():
    """LLaMA-Factory builds TRL's old PPOConfig(target=ppo_target), whose adap_kl_ctrl is on by default: β adapts
    towards ppo_target (LF's default 6.0). The user's adaptive_kl wins."""
    cfg = _config("ppo", {"stage": "ppo", "ppo_target": 3.0})
    assert (cfg.algo.adaptive_kl, cfg.algo.target_kl) == (True, 3.0)
    cfg = _config("ppo", {"stage": "ppo"})
    assert (cfg.algo.adaptive_kl, cfg.algo.target_kl) == (True, 6.0)
    cfg = _config("ppo", {"ppo_target": 3.0})  # LF's key without its stage key: LF's PPO all the same
    assert (cfg.algo.adaptive_kl, cfg.algo.target_kl) == (True, 3.0)
    cfg = _config("ppo", {"stage": "ppo", "ppo_target": 3.0, "adaptive_kl": False})
    assert (cfg.algo.adaptive_kl, cfg.algo.target_kl) == (False, 3.0)
    assert _config("ppo", {"learning_rate": 1e-5}).algo.adaptive_kl is False  # not LF's PPO: tether's default


# ---- transformers' schedules


def test_transformers_cosine_decays_to_zero():
    """transformers' cosine: 0.5·(1 + cos(π·progress)), 0 at the end; tether's floor min_lr_ratio (0.1 by default)
    is 0 when the schedule is this key's, unless given."""
    cfg = _config("sft", {"lr_scheduler_type": "cosine"})
    assert (cfg.optim.lr_schedule, cfg.optim.min_lr_ratio) == ("cosine", 0.0)
    cfg = _config("sft", {"lr_scheduler_type": "cosine", "min_lr_ratio": 0.2})
    assert cfg.optim.min_lr_ratio == 0.2
    assert _config("sft", {"lr_schedule": "cosine"}).optim.min_lr_ratio == 0.1  # tether's own key: tether's floor
    assert _config("sft", {"lr_scheduler_type": "constant"}).optim.min_lr_ratio == 0.1  # no decay: no floor to set


@pytest.mark.parametrize(
    "values, message",
    [
        (
            {"lr_scheduler_type": "cosine_with_min_lr"},
            r"lr_scheduler_type: 'cosine_with_min_lr' .*min_lr_ratio: R \(R = min_lr_rate, or min_lr / learning_rate\)",
        ),
        ({"lr_scheduler_kwargs": "min_lr_rate=0.1"}, "lr_scheduler_kwargs: .*min_lr_ratio"),
    ],
)
def test_transformers_schedule_arguments_tether_cannot_read_are_refused_by_name(values, message):
    with pytest.raises(ConfigError, match=message):
        _config("sft", values)


# ---- TRL's clipping


def test_a_null_epsilon_high_is_trls_none_the_same_as_epsilon():
    """TRL: epsilon_high None → epsilon_high = epsilon; a config dump writes the None as null."""
    cfg = _config("grpo", {"epsilon": 0.3, "epsilon_high": None})
    assert (cfg.algo.clip_low, cfg.algo.clip_high) == (0.3, 0.3)
    cfg = _config("grpo", {"epsilon": 0.3, "epsilon_high": 0.28})
    assert (cfg.algo.clip_low, cfg.algo.clip_high) == (0.3, 0.28)


# ---- peft's LoraConfig


def test_peft_config_fields_tether_builds_are_read_and_harmless_ones_pass():
    from peft import LoraConfig

    from tether.compat import peft_settings

    config = LoraConfig(
        r=4, lora_alpha=8, lora_dropout=0.05, target_modules=["v_proj", "q_proj"], task_type="CAUSAL_LM"
    )
    assert peft_settings(config) == {
        "lora_r": 4,
        "lora_alpha": 8.0,
        "lora_dropout": 0.05,
        "lora_target_modules": ["q_proj", "v_proj"],
    }
    assert peft_settings(LoraConfig(r=4, fan_in_fan_out=True))["lora_r"] == 4  # peft sets it from the layer type


@pytest.mark.parametrize(
    "fields",
    [
        {"rank_pattern": {"q_proj": 32}},
        {"alpha_pattern": {"v_proj": 64}},
        {"bias": "all"},
        {"layers_to_transform": [0]},
        {"layers_to_transform": [0], "layers_pattern": "layers"},
        {"exclude_modules": ["lm_head"]},
        {"init_lora_weights": "gaussian"},
        {"use_dora": True},
        {"use_rslora": True},
        {"modules_to_save": ["lm_head"]},
        {"lora_bias": True},
        {"inference_mode": True},
    ],
)
def test_peft_config_fields_tether_does_not_build_are_refused_by_name(fields):
    from peft import LoraConfig

    from tether.compat import peft_settings

    with pytest.raises(ConfigError) as err:
        peft_settings(LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], **fields))
    for name in fields:
        assert f"peft_config.{name}=" in str(err.value)


def test_every_field_peft_config_refused_at_once():
    from peft import LoraConfig

    from tether.compat import peft_settings

    config = LoraConfig(
        r=8,
        lora_alpha=16,
        target_modules=["q_proj", "v_proj"],
        rank_pattern={"q_proj": 32},
        alpha_pattern={"v_proj": 64},
        bias="all",
        layers_to_transform=[0],
    )
    with pytest.raises(ConfigError) as err:
        peft_settings(config)
    said = str(err.value)
    for name in ("rank_pattern", "alpha_pattern", "bias", "layers_to_transform"):
        assert f"peft_config.{name}=" in said


# ---- transformers 5's warmup_steps


def test_a_warmup_steps_below_one_is_transformers_ratio_outside_args_too():
    """transformers 5: warmup_steps < 1 is a fraction of the run (warmup_ratio), ≥ 1 a count of updates; the flat
    key is tether's flag name too, whose integers keep their meaning. Tether's own section key stays strict."""
    cfg = _config("sft", {"warmup_steps": 0.1})
    assert (cfg.optim.warmup_ratio, cfg.optim.warmup_steps) == (0.1, 0)
    cfg = _config("sft", {"warmup_steps": 5})
    assert (cfg.optim.warmup_ratio, cfg.optim.warmup_steps) == (0.05, 5)
    with pytest.raises(ConfigError, match="warmup_steps"):
        _config("sft", {"optim": {"warmup_steps": 0.1}})
    with pytest.raises(ConfigError, match="warmup_steps"):
        _config("sft", {"warmup_steps": 2.5})  # neither a fraction nor a count


def test_a_warmup_steps_below_one_on_the_command_line_and_in_args():
    from tether.cli.parser import build_parser, foreign_flags
    from tether.compat import TheirDefault, args_settings
    from tether.config import config_from_args

    parser = build_parser()
    argv, foreign = foreign_flags(parser, ["sft", "--model", "m", "--data", "d.jsonl", "--warmup_steps", "0.1"])
    args = parser.parse_args(argv)
    args.foreign_flags = foreign
    cfg = config_from_args(config_class("sft"), args)
    assert (cfg.optim.warmup_ratio, cfg.optim.warmup_steps) == (0.1, 0)
    with pytest.raises(SystemExit):  # tether's own flag, as tether writes it: a whole number
        parser.parse_args(["sft", "--model", "m", "--data", "d.jsonl", "--warmup-steps", "0.1"])
    trl = pytest.importorskip("trl")
    theirs = args_settings(trl.SFTConfig(output_dir="o", bf16=False, warmup_steps=0.1))
    assert theirs["warmup_ratio"] == 0.1 and "warmup_steps" not in theirs
    theirs = args_settings(trl.SFTConfig(output_dir="o", bf16=False))  # TRL's 0: no warm-up, tether's ratio 0
    assert theirs["warmup_ratio"] == TheirDefault(0.0)
