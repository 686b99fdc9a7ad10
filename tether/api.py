"""The Python API: every stage as one function, over the same configs, checks and loops as the command line.

    import tether

    run = tether.sft(model="path/to/model", data=my_dataset, output="runs/sft", lr=1e-5, max_steps=200)
    run = tether.grpo(model=run.final, prompts=prompt_rows, reward_funcs=[my_reward], output="runs/grpo",
                      num_generations=8, beta=0.04)
    model, tokenizer = run.load()

Settings come three ways, validated alike (tether/config.py): a stage config dataclass (``tether.GRPOConfig``) as
the first argument, keyword settings named as the flags are (``max_steps=100``, ``lr=1e-5``, or TRL's names such
as ``learning_rate``, ``num_generations``), and the inputs below. Keywords win over the config.

Inputs may be objects as well as paths:

- ``data`` / ``eval_data`` / ``prompts`` / ``eval_prompts``: a path, a ``datasets.Dataset``, a pandas DataFrame or a
  list of dicts (rows in any format the stage reads from a file);
- ``model`` / ``reference``: a path or a loaded ``transformers`` model (with ``tokenizer=``, a path or an object);
- ``reward_funcs``: callables, ``module:function`` specs, or ``(callable, weight)`` pairs; ``env``: an
  environment class (or any factory of instances) or a spec; ``judge`` (online DPO): a callable or a spec.

Objects are written to ``<output>-inputs/`` (rows as JSONL, models in Hugging Face format) and the config names
those paths, so the run folder's config.yaml says exactly what was trained on and ``resume=True`` finds the same
inputs. Callables are registered in this process under a ``python:<name>`` spec (tether/rewards/functions.py):
resume such a run from Python with the same callables. The command line (tether/cli/) builds a config from
flags and YAML and calls ``run_stage``, the function this module's stages call too; both find a stage's config
class and run function in the stage table (``tether.config.STAGES``).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from tether.config import ConfigError, build_config, config_to_dict
from tether.config import stage as stage_row

# keyword input -> the dotted option it fills, per stage
_ROW_INPUTS = {
    "data": "data.path",
    "eval_data": "data.eval_path",
    "prompts": "rollout.prompts",
    "eval_prompts": "rollout.eval_prompts",
}
_MODEL_INPUTS = {"model": "model.path", "tokenizer": "model.tokenizer", "reference": "model.reference"}
_INPUTS = {**_ROW_INPUTS, **_MODEL_INPUTS}


def config_class(stage: str):
    """The config dataclass of a stage: ``config_class("grpo") is tether.GRPOConfig``."""
    return stage_row(stage).config_class()


@dataclass
class RunResult:
    """A finished run: its folder, its summary.json as a dict, and the trained model's folder."""

    stage: str
    output: Path
    summary: dict

    @property
    def final(self) -> Path:
        """``<output>/final``: the trained model in Hugging Face format (LoRA merged; a reward model for ``rm``)."""
        return self.output / "final"

    def load(self):
        """(model, tokenizer) from final/: a causal LM, or for ``rm`` a tether RewardModel (score per text)."""
        from tether.models.lm import load_model, load_tokenizer

        tokenizer = load_tokenizer(self.final)
        if self.stage in ("rm", "prm"):
            from tether.models.reward import load_reward_model

            return load_reward_model(self.final, tokenizer), tokenizer
        return load_model(self.final, tokenizer), tokenizer


def run_stage(stage: str, config, **hooks) -> dict:
    """Run a built config (the CLI's entry); ``hooks`` are the run function's extras (``evaluate_fn``...). However
    the run ends, its folder is released for the next run (a run that finishes releases it itself)."""
    from tether.train.run import release_run_folder

    try:
        return stage_row(stage).run_function()(config, **hooks)
    finally:
        release_run_folder()


# ----------------------------------------------------------------------------------------------- inputs


def _is_main_process() -> bool:
    import os

    return int(os.environ.get("RANK", "0")) == 0


def _barrier(device: str) -> None:
    """Under a multi-process launch, the other processes wait for process 0 to write the inputs."""
    import os

    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        from tether.train.run import wait_for_everyone

        wait_for_everyone(device)


def _rows_of(value, name: str) -> list[dict] | None:
    """Rows of an in-memory dataset, or None for a path."""
    if isinstance(value, (str, Path)):
        return None
    if hasattr(value, "keys") and hasattr(value, "column_names") and not hasattr(value, "to_list"):
        raise ConfigError(
            f"{name}: a DatasetDict with splits {sorted(value.keys())}; pass one split, e.g. {name}=ds['train']"
        )
    if hasattr(value, "to_list"):  # datasets.Dataset
        rows = value.to_list()
    elif hasattr(value, "to_dict") and hasattr(value, "columns"):  # pandas.DataFrame
        rows = value.to_dict("records")
    elif isinstance(value, (list, tuple)):
        rows = list(value)
    else:
        raise ConfigError(
            f"{name}: expected a path, a datasets.Dataset, a pandas DataFrame or a list of dicts; "
            f"got {type(value).__name__}"
        )
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ConfigError(f"{name}[{i}]: rows must be dicts (column -> value), got {type(row).__name__}")
    if not rows:
        raise ConfigError(f"{name}: no rows")
    return rows


def _plain(value):
    """numpy scalars and arrays (pandas, datasets) as JSON values."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "isoformat"):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")


def _write_rows(rows: list[dict], path: Path, name: str) -> None:
    try:
        text = "".join(json.dumps(row, default=_plain, ensure_ascii=False) + "\n" for row in rows)
    except TypeError as err:
        raise ConfigError(f"{name}: a row cannot be written as JSON ({err})") from None
    if path.is_file() and path.read_text() == text:
        return
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _save_pretrained(obj, folder: Path, name: str) -> None:
    from tether.models.lm import is_peft

    if is_peft(obj):
        raise ConfigError(
            f"{name}: a PEFT model; pass its base model with lora_r=... (tether adds the adapters), "
            "or merge_and_unload() it first"
        )
    if not hasattr(obj, "save_pretrained"):
        raise ConfigError(f"{name}: expected a path or a transformers model/tokenizer, got {type(obj).__name__}")
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    obj.save_pretrained(str(tmp))
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)


def _materialise(stage: str, inputs: dict, output: str, device: str) -> dict[str, Any]:
    """{dotted option: path} for every input; objects are written under ``<output>-inputs/`` by process 0."""
    if not output:
        raise ConfigError("output is required (the run folder), e.g. output='runs/my-run'")
    if not isinstance(inputs.get("model"), (str, Path, type(None))) and inputs.get("tokenizer") is None:
        raise ConfigError("model: a loaded model needs its tokenizer too (tokenizer=..., an object or a path)")
    rows = {name: _rows_of(value, name) for name, value in inputs.items() if name in _ROW_INPUTS and value is not None}
    folder = Path(output).parent / (Path(output).name + "-inputs")
    main = _is_main_process()
    out: dict[str, Any] = {}
    written = False
    for name, value in inputs.items():
        if value is None:
            continue
        if name in _ROW_INPUTS:
            if rows[name] is None:
                out[_ROW_INPUTS[name]] = str(value)
                continue
            path = folder / f"{name}.jsonl"
            if main:
                folder.mkdir(parents=True, exist_ok=True)
                _write_rows(rows[name], path, name)
            out[_ROW_INPUTS[name]], written = str(path), True
        elif name in _MODEL_INPUTS:
            if isinstance(value, (str, Path)):
                out[_MODEL_INPUTS[name]] = str(value)
                continue
            path = folder / name
            if main:
                folder.mkdir(parents=True, exist_ok=True)
                _save_pretrained(value, path, name)
            out[_MODEL_INPUTS[name]], written = str(path), True
    if written:
        _barrier(device)
    return out


def _specs(funcs, name: str) -> list[str]:
    """Reward functions as specs: strings stay, callables are registered (python:<name>), weights appended."""
    from tether.rewards.loading import register_python_object

    if callable(funcs) or isinstance(funcs, (str, tuple)):
        funcs = [funcs]
    specs = []
    for item in funcs:
        weight = None
        if isinstance(item, tuple):
            if len(item) != 2 or not isinstance(item[1], (int, float)):
                raise ConfigError(f"{name}: a pair must be (function, weight), got {item!r}")
            item, weight = item
        if isinstance(item, str):
            spec = item
        elif callable(item):
            spec = register_python_object(item)
        else:
            raise ConfigError(f"{name}: expected callables or module:function specs, got {type(item).__name__}")
        specs.append(spec if weight is None else f"{spec}={float(weight):g}")
    return specs


def _object_spec(value, name: str) -> str:
    from tether.rewards.loading import register_python_object

    if isinstance(value, str):
        return value
    if callable(value):
        return register_python_object(value)
    raise ConfigError(f"{name}: expected a class, a callable or a module:Name spec, got {type(value).__name__}")


def _trl_arguments(stage: str, settings: dict, inputs: dict, callables: dict) -> None:
    """TRL's trainer arguments moved to tether's (in place): ``args`` (its config object's non-default fields, the
    keywords winning), train_dataset / eval_dataset (data, or prompts online),
    processing_class (tokenizer), ref_model (reference), peft_config (a LoraConfig, as lora_* settings) and
    reward_weights given as a list (the weights of reward_funcs, in order)."""
    from tether.compat import API_INPUTS, ONLINE, TheirDefault, api_input, args_settings, peft_settings

    if settings.get("args") is not None:  # TRL's config object: its values, under the keywords given
        args = settings.pop("args")
        theirs = args_settings(args)
        if not isinstance(args, dict) and stage not in ONLINE:
            theirs.setdefault("eval_fraction", TheirDefault(0.0))  # their trainers never hold training rows out
        merged = {**theirs, **settings}
        settings.clear()
        settings.update(merged)
    for theirs in [k for k in settings if k in API_INPUTS]:
        ours = api_input(stage, theirs, bool(settings.get("online")))
        if ours not in inputs:
            raise ConfigError(f"{theirs} (TRL's name for {ours}=): tether.{stage}() takes no {ours}")
        if inputs[ours] is not None:
            raise ConfigError(f"{theirs} and {ours} are the same input (TRL's name and tether's): give one")
        inputs[ours] = settings.pop(theirs)
    if settings.get("peft_config") is not None:
        settings.update(peft_settings(settings.pop("peft_config")))
    weights = settings.get("reward_weights")
    if isinstance(weights, (list, tuple)) and callables.get("reward_funcs") is not None:
        funcs = callables["reward_funcs"]
        funcs = list(funcs) if isinstance(funcs, (list, tuple)) else [funcs]
        if len(funcs) != len(weights):
            raise ConfigError(f"reward_weights has {len(weights)} weights for {len(funcs)} reward_funcs")
        callables["reward_funcs"] = list(zip(funcs, weights))
        del settings["reward_weights"]


def _run(stage: str, config, settings: dict, inputs: dict, callables: dict, hooks: dict) -> RunResult:
    from tether.console import quiet_libraries

    _trl_arguments(stage, settings, inputs, callables)  # first: args= defaults may follow the logging verbosity
    quiet_libraries()  # as the command line: no third-party progress bars between tether's lines
    cls = config_class(stage)
    if config is not None and not isinstance(config, cls):
        raise ConfigError(f"config: expected a {cls.__name__}, got {type(config).__name__}")
    # the config object's values are the base, the keywords (flag names, TRL's names) above it: a recipe keyword's
    # preset then applies over the object's values (build_config), as --recipe does over a --config file's
    base: dict[str, Any] = config_to_dict(config) if config is not None else {}
    values: dict[str, Any] = dict(settings)
    overrides: dict[str, Any] = {}
    if callables.get("reward_funcs") is not None:
        overrides["rewards.reward"] = _specs(callables["reward_funcs"], "reward_funcs")
    if callables.get("env") is not None:
        overrides["agent.env"] = _object_spec(callables["env"], "env")
    if callables.get("judge") is not None:
        overrides["online.judge"] = _object_spec(callables["judge"], "judge")
    if callables.get("reward_model") is not None:
        if not isinstance(callables["reward_model"], (str, Path)):
            raise ConfigError("reward_model: the path of a `tether rm` folder (final/ of an rm run)")
        overrides["rewards.reward_model"] = str(callables["reward_model"])
    paths = {k: str(v) for k, v in inputs.items() if isinstance(v, (str, Path))}
    draft = build_config(
        cls, values, {**overrides, **{_INPUTS[k]: v for k, v in paths.items()}}, f"tether.{stage}()", base
    )  # every setting validated before anything is written
    overrides.update(_materialise(stage, inputs, draft.train.output, draft.model.device))
    cfg = build_config(cls, values, overrides, source=f"tether.{stage}()", base=base)
    summary = run_stage(stage, cfg, **{k: v for k, v in hooks.items() if v is not None})
    return RunResult(stage, Path(cfg.train.output), summary)


# ----------------------------------------------------------------------------------------------- stages


def sft(config=None, *, model=None, tokenizer=None, data=None, eval_data=None, **settings) -> RunResult:
    """Supervised fine-tuning (docs/algorithms.md §1): ``tether.sft(model=..., data=..., output=..., lr=...)``."""
    return _run("sft", config, settings, dict(model=model, tokenizer=tokenizer, data=data, eval_data=eval_data), {}, {})


def judge(config=None, *, model=None, tokenizer=None, data=None, eval_data=None, **settings) -> RunResult:
    """A generative reward model: a pairwise judge's verdict learned from preference pairs (docs/algorithms.md §12)."""
    return _run(
        "judge", config, settings, dict(model=model, tokenizer=tokenizer, data=data, eval_data=eval_data), {}, {}
    )


def rm(config=None, *, model=None, tokenizer=None, data=None, eval_data=None, **settings) -> RunResult:
    """A reward model from preference pairs or rankings, with bias probes (docs/algorithms.md §2)."""
    return _run("rm", config, settings, dict(model=model, tokenizer=tokenizer, data=data, eval_data=eval_data), {}, {})


def prm(config=None, *, model=None, tokenizer=None, data=None, eval_data=None, **settings) -> RunResult:
    """A process reward model from step-labelled solutions (docs/algorithms.md §2.4): a probability per step."""
    return _run("prm", config, settings, dict(model=model, tokenizer=tokenizer, data=data, eval_data=eval_data), {}, {})


def dpo(
    config=None,
    *,
    model=None,
    tokenizer=None,
    reference=None,
    data=None,
    eval_data=None,
    prompts=None,
    reward_funcs=None,
    reward_model=None,
    judge=None,
    evaluate: Callable | None = None,
    **settings,
) -> RunResult:
    """The direct-preference family, offline (``data``) or online (``online=True``, ``prompts`` and a labeller:
    ``reward_funcs``, ``reward_model`` or ``judge``). ``evaluate(policy, tokenizer, step) -> dict`` adds task metrics to
    every evaluation."""
    return _run(
        "dpo",
        config,
        settings,
        dict(model=model, tokenizer=tokenizer, reference=reference, data=data, eval_data=eval_data, prompts=prompts),
        dict(reward_funcs=reward_funcs, reward_model=reward_model, judge=judge),
        dict(evaluate_fn=evaluate),
    )


def ppo(
    config=None,
    *,
    model=None,
    tokenizer=None,
    reference=None,
    prompts=None,
    eval_prompts=None,
    reward_funcs=None,
    reward_model=None,
    env=None,
    evaluate: Callable | None = None,
    **settings,
) -> RunResult:
    """PPO with a critic against a reward model and/or reward functions, or an environment (``env``)."""
    return _run(
        "ppo",
        config,
        settings,
        dict(model=model, tokenizer=tokenizer, reference=reference, prompts=prompts, eval_prompts=eval_prompts),
        dict(reward_funcs=reward_funcs, reward_model=reward_model, env=env),
        dict(evaluate_fn=evaluate),
    )


def grpo(
    config=None,
    *,
    model=None,
    tokenizer=None,
    reference=None,
    prompts=None,
    eval_prompts=None,
    reward_funcs=None,
    reward_model=None,
    env=None,
    evaluate: Callable | None = None,
    **settings,
) -> RunResult:
    """The group family (``recipe="dapo"``...) against reward functions, a reward model, or an environment."""
    return _run(
        "grpo",
        config,
        settings,
        dict(model=model, tokenizer=tokenizer, reference=reference, prompts=prompts, eval_prompts=eval_prompts),
        dict(reward_funcs=reward_funcs, reward_model=reward_model, env=env),
        dict(evaluate_fn=evaluate),
    )


# The stages whose TRL config class an args= object comes from, for the table of defaults that differ
TRL_CLASSES = {"sft": "SFTConfig", "rm": "RewardConfig", "dpo": "DPOConfig", "grpo": "GRPOConfig"}
DEFAULTS_MARK = "<!-- generated by python -m tether.api from TRL's config classes: the defaults that differ -->"


def default_differences() -> list[tuple[str, str, str, str]]:
    """(stage, tether setting, tether's default, TRL's) for every setting where a TRL config class's default
    (the installed TRL's, built as on a CPU) differs from tether's, and every TRL default tether does not build:
    what a YAML or keywords in TRL's names get from tether where args= would carry TRL's own."""
    import trl

    from tether.compat import TheirDefault, args_settings, translate, translate_key
    from tether.config import flag_fields

    rows = []
    for stage, name in TRL_CLASSES.items():
        cls = config_class(stage)
        obj = getattr(trl, name)(output_dir="out", bf16=False)
        theirs = args_settings(obj)
        values = {k: v.value for k, v in theirs.items() if isinstance(v, TheirDefault)}
        written: dict[str, str] = {}
        translated = translate(
            stage, {k: TheirDefault(v) for k, v in values.items()}, flag_fields(cls), "", [], written, say=False
        )
        ours = config_to_dict(build_config(cls))
        for dotted in sorted(translated):
            section, key = dotted.split(".", 1)
            if translated[dotted] != ours[section][key]:
                their = written.get(dotted)
                shown = f"`{their}: {values[their]!r}`" if their else f"{translated[dotted]!r} (from the batch sizes)"
                if their == "warmup_ratio" and not hasattr(obj, "warmup_ratio"):  # transformers 5: one field
                    shown = f"`warmup_steps: {obj.warmup_steps!r}`"
                rows.append((stage, f"`{dotted}`", repr(ours[section][key]), shown))
        for key, value in values.items():
            if translate_key(stage, key, value, values, flag_fields(cls))[1]:
                rows.append((stage, "(not built)", "", f"`{key}: {value!r}`"))
    return rows


def defaults_table() -> str:
    rows = ["| stage | tether setting | tether's default | TRL's default |", "|---|---|---|---|"]
    rows += [f"| {' | '.join(row)} |" for row in default_differences()]
    return "\n".join(rows)


if __name__ == "__main__":  # the docs' table of TRL's other defaults, from the installed TRL
    from tether.compat import replace_between

    doc = Path(__file__).resolve().parent.parent / "docs" / "python-api.md"
    doc.write_text(replace_between(doc.read_text(), DEFAULTS_MARK, defaults_table()))
    print(f"wrote the table of TRL's other defaults in {doc}")


__all__ = ["RunResult", "config_class", "dpo", "grpo", "ppo", "prm", "rm", "run_stage", "sft"]
