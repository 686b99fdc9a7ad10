"""Issue 41: what a LLaMA-Factory user brings — alpaca, sharegpt (with tool calls), preference and KTO files in both
styles, a data folder's dataset_info.json, and the project's example YAMLs — read as LLaMA-Factory reads them. The
files are our own, in LLaMA-Factory's shapes; the model is the session's tiny Llama with a ChatML template."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from transformers import AutoTokenizer

from tether.cli import main
from tether.config import ConfigError, build_config, load_yaml
from tether.data.dpo import tokenize_policy_preferences, tokenize_unpaired
from tether.data.records import DataError, read_records
from tether.data.sft import tokenize_records


def _json(path, rows):
    path.write_text(json.dumps(rows))
    return str(path)


@pytest.fixture
def tok(llama_dir):
    return AutoTokenizer.from_pretrained(llama_dir)


def _trained_text(tok, example) -> str:
    return tok.decode([t for t, m in zip(example.input_ids, example.loss_mask) if m])


def test_an_alpaca_preference_file_keeps_its_prompt(tmp_path, tok):
    """It was read as two strings with no prompt at all: instruction and input were dropped without a word."""
    path = _json(
        tmp_path / "pref.json",
        [
            {
                "instruction": "Add the numbers.",
                "input": "2 and 3",
                "chosen": "5",
                "rejected": "6",
                "system": "Be brief.",
            }
        ],
    )
    (pair,), report = tokenize_policy_preferences(read_records(path), tok, 256)
    text = tok.decode(pair.responses[0].input_ids)
    assert "Be brief." in text and "Add the numbers.\n2 and 3" in text and text.rstrip().endswith("5<|im_end|>")
    assert _trained_text(tok, pair.responses[0]).startswith("5") and not report.unused


def test_alpaca_sft_rows_train_the_history_and_the_output_as_llamafactory_does(tmp_path, tok):
    path = _json(
        tmp_path / "alpaca.json",
        [{"instruction": "Add.", "input": "2 and 3", "output": "5", "history": [["Hi", "Hello!"]]}],
    )
    (example,), report = tokenize_records(read_records(path), tok, 256)
    assert report.format == "messages" and not report.unused
    trained = _trained_text(tok, example)
    assert "Hello!" in trained and "5" in trained and "Add." not in trained and "Hi" not in trained


def test_sharegpt_tool_calls_system_and_tools_are_rendered(tmp_path, tok):
    tools = [
        {
            "name": "weather",
            "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        }
    ]
    row = {
        "conversations": [
            {"from": "human", "value": "Weather in Paris?"},
            {"from": "function_call", "value": json.dumps({"name": "weather", "arguments": {"city": "Paris"}})},
            {"from": "observation", "value": '{"temp": 20}'},
            {"from": "gpt", "value": "20 degrees."},
        ],
        "system": "You help.",
        "tools": json.dumps(tools),
    }
    (example,), report = tokenize_records(read_records(_json(tmp_path / "sg.json", [row])), tok, 1024)
    text = tok.decode(example.input_ids)
    assert "You help." in text and '"name": "weather"' in text.split("Weather in Paris?")[0]  # the tools, listed
    trained = _trained_text(tok, example)  # a template that writes no calls of its own: the Hermes text
    assert '<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call>' in trained
    assert "20 degrees." in trained and '{"temp": 20}' not in trained and not report.unused


def test_preference_and_kto_rows_in_both_styles(tmp_path, tok):
    sharegpt_pair = {
        "conversations": [{"from": "human", "value": "2+3?"}],
        "chosen": {"from": "gpt", "value": "5"},
        "rejected": {"from": "gpt", "value": "6"},
    }
    (pair,), _ = tokenize_policy_preferences(read_records(_json(tmp_path / "p.json", [sharegpt_pair])), tok, 256)
    assert "2+3?" in tok.decode(pair.responses[1].input_ids) and _trained_text(tok, pair.responses[1]).startswith("6")
    kto = [
        {"instruction": "2+3?", "output": "5", "kto_tag": True},
        {"conversations": [{"from": "human", "value": "2+4?"}, {"from": "gpt", "value": "7"}], "kto_tag": False},
    ]
    examples, _ = tokenize_unpaired(read_records(_json(tmp_path / "kto.json", kto)), tok, 256)
    assert [e.desirable for e in examples] == [True, False]
    assert _trained_text(tok, examples[1].responses[0]).startswith("7")
    with pytest.raises(Exception, match="unpaired preference data"):
        tokenize_records(read_records(str(tmp_path / "kto.json")), tok, 256)


def test_dataset_info_names_a_dataset_with_its_columns_and_tags(tmp_path, tok):
    folder = tmp_path / "data"
    folder.mkdir()
    _json(folder / "chat.json", [{"msgs": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]}])
    _json(folder / "qa.json", [{"q": "Add.", "a": "5"}])
    (folder / "dataset_info.json").write_text(
        json.dumps(
            {
                "chat": {
                    "file_name": "chat.json",
                    "formatting": "sharegpt",
                    "columns": {"messages": "msgs"},
                    "tags": {
                        "role_tag": "role",
                        "content_tag": "content",
                        "user_tag": "user",
                        "assistant_tag": "assistant",
                    },
                },
                "qa": {"file_name": "qa.json", "columns": {"prompt": "q", "response": "a"}},
                "hub": {"hf_hub_url": "someone/data"},
            }
        )
    )
    records = read_records(f"{folder}/dataset_info.json:chat,qa")
    assert [r.fields["messages"][-1]["content"] for r in records] == ["Yo", "5"]
    with pytest.raises(Exception, match="tether reads local files"):
        read_records(f"{folder}:hub")
    with pytest.raises(Exception, match=r"no dataset 'nope'; it lists \['chat', 'hub', 'qa'\]"):
        read_records(f"{folder}:nope")


LF_DPO_YAML = """\
### model
model_name_or_path: {model}
trust_remote_code: true
### method
stage: dpo
do_train: true
finetuning_type: lora
lora_rank: 8
lora_target: all
pref_beta: 0.1
pref_loss: sigmoid  # choices: [sigmoid (dpo), orpo, simpo]
### dataset
dataset: dpo_en_demo
dataset_dir: {data}
template: llama3
cutoff_len: 256
max_samples: 1000
overwrite_cache: true
preprocessing_num_workers: 16
dataloader_num_workers: 4
### output
output_dir: {out}
logging_steps: 10
save_steps: 500
plot_loss: true
overwrite_output_dir: true
save_only_model: false
report_to: none
### train
per_device_train_batch_size: 1
gradient_accumulation_steps: 4
learning_rate: 5.0e-6
num_train_epochs: 1.0
lr_scheduler_type: cosine
warmup_ratio: 0.1
bf16: false
ddp_timeout: 180000000
resume_from_checkpoint: null
"""


def _lf_folder(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir(exist_ok=True)
    rows = [
        {"instruction": f"Add {i} and {i + 1}.", "input": "", "chosen": f"{2 * i + 1}", "rejected": "no"}
        for i in range(8)
    ]
    _json(folder / "dpo_en_demo.json", rows)
    (folder / "dataset_info.json").write_text(
        json.dumps({"dpo_en_demo": {"file_name": "dpo_en_demo.json", "ranking": True}})
    )
    return folder


def test_the_llamafactory_dpo_example_yaml_runs_unchanged(llama_dir, tmp_path, capsys):
    folder = _lf_folder(tmp_path)
    config = tmp_path / "llama3_lora_dpo.yaml"
    config.write_text(LF_DPO_YAML.format(model=llama_dir, data=folder, out=tmp_path / "saves"))
    assert main(["dpo", "--config", str(config)]) == 0
    said = capsys.readouterr()
    assert "no effect in tether: do_train" in said.out + said.err  # accepted, and named
    saved = (tmp_path / "saves" / "config.yaml").read_text()
    assert "lora_r: 8" in saved and "- all-linear" in saved and "eval_fraction: 0.0" in saved
    assert "batch_size: 4" in saved and "max_records: 1000" in saved
    assert json.loads((tmp_path / "saves" / "summary.json").read_text())["steps"] == 2  # 8 pairs / 4


def test_a_llamafactory_config_for_another_stage_names_the_command(llama_dir, tmp_path):
    from tether.stages.sft_config import SFTConfig

    config = tmp_path / "c.yaml"
    config.write_text(LF_DPO_YAML.format(model=llama_dir, data=_lf_folder(tmp_path), out=tmp_path / "o"))
    with pytest.raises(ConfigError, match="stage: dpo: this config is for tether dpo, not tether sft"):
        build_config(SFTConfig, load_yaml(config), source="c.yaml")
    with pytest.raises(ConfigError, match=r"pref_loss: 'kto_pair' has no tether equivalent \(accepted: sigmoid"):
        from tether.stages.dpo_config import DPOConfig

        build_config(DPOConfig, {**load_yaml(config), "pref_loss": "kto_pair"}, source="c.yaml")


def test_the_migration_tables_in_the_docs_are_the_ones_the_code_generates():
    from pathlib import Path

    from tether.compat import docs_with_tables

    root = Path(__file__).resolve().parent.parent
    for path, text in docs_with_tables(root).items():
        assert (root / path).read_text() == text, f"{path}: run python -m tether.compat to regenerate its table"


def test_an_alpaca_file_gives_ppo_its_prompts_as_llamafactory_does(tmp_path):
    from tether.data.prompts import prompt_rows

    path = _json(tmp_path / "alpaca.json", [{"instruction": "Add.", "input": "2 and 3", "output": "5"}])
    assert prompt_rows(path) == [{"prompt": [{"role": "user", "content": "Add.\n2 and 3"}], "completion": "5"}]


def test_a_registry_of_the_wrong_structure_is_named_by_file_and_field(tmp_path, capsys, llama_dir):
    """Issue 52 items 33 and 36: a dataset_info.json that is a list, columns or tags given as lists, num_samples
    "ten" were tracebacks; an entry that is not an object was "no dataset 'x'; it lists [... 'x' ...]"."""
    folder = tmp_path / "data"
    folder.mkdir()
    _json(folder / "qa.json", [{"instruction": "Add.", "output": "5"}])
    info = folder / "dataset_info.json"
    cases = [
        ([{"file_name": "qa.json"}], "must be a JSON object mapping each dataset's name to its entry"),
        ({"qa": "qa.json"}, "dataset 'qa' must be an object (file_name, formatting, columns, ...), not a str"),
        ({"qa": {"file_name": "qa.json", "columns": ["prompt"]}}, "dataset 'qa': columns must be an object"),
        ({"qa": {"file_name": "qa.json", "tags": ["role"]}}, "dataset 'qa': tags must be an object"),
        ({"qa": {"file_name": "qa.json", "num_samples": "ten"}}, "num_samples must be a whole number >= 1, got 'ten'"),
        ({"qa": {"file_name": "qa.json", "formatting": "xml"}}, "formatting 'xml' is not one of alpaca, sharegpt"),
    ]
    for table, message in cases:
        info.write_text(json.dumps(table))
        with pytest.raises(DataError, match=re.escape(message)) as err:
            read_records(f"{info}:qa")
        assert str(info) in str(err.value)
    # through the command line: one line, exit 2, no traceback
    info.write_text(json.dumps({"qa": {"file_name": "qa.json", "columns": ["prompt"]}}))
    assert main(["data", "check", f"{folder}:qa", "--model", str(llama_dir)]) == 2
    err = capsys.readouterr().err
    assert "columns must be an object" in err and "Traceback" not in err


def test_registry_entries_in_openai_formatting_and_registries_named_another_way(tmp_path):
    """Issue 52 item 24: formatting "openai" was refused though the same file given directly is read; a registry
    named without :NAME, or saved under another name, got errors about something else."""
    folder = tmp_path / "data"
    folder.mkdir()
    rows = [{"msgs": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]}]
    _json(folder / "chat.json", rows)
    table = {"chat": {"file_name": "chat.json", "formatting": "openai", "columns": {"messages": "msgs"}}}
    (folder / "dataset_info.json").write_text(json.dumps(table))
    (records,) = read_records(f"{folder}/dataset_info.json:chat")
    assert records.fields["messages"][-1] == {"role": "assistant", "content": "Yo"}
    for bare in (folder, folder / "dataset_info.json"):
        with pytest.raises(DataError, match=r"registry; name the dataset\(s\) to read: .*:NAME.*it lists \['chat'\]"):
            read_records(str(bare))
    (folder / "my_registry.json").write_text(json.dumps(table))
    assert read_records(f"{folder}/my_registry.json:chat")[0].fields == records.fields


def test_a_value_of_the_wrong_type_is_named_by_the_files_key(tmp_path, llama_dir, capsys):
    """Issue 52 item 36: `cutoff_len: long` was reported as data.max_length, a key the file does not have."""
    from tether.stages.dpo_config import DPOConfig

    config = tmp_path / "c.yaml"
    config.write_text(f"model_name_or_path: {llama_dir}\ncutoff_len: long\n")
    assert main(["dpo", "--config", str(config)]) == 2
    assert "c.yaml: cutoff_len (tether's data.max_length) must be int, got 'long'" in capsys.readouterr().err
    config.write_text("data:\n  max_length: long\n")
    with pytest.raises(ConfigError, match=r"c.yaml: data.max_length must be int, got 'long'"):
        build_config(DPOConfig, load_yaml(config), source=str(config))


LF_PPO_YAML = """\
model_name_or_path: {model}
reward_model: {model}
stage: ppo
finetuning_type: lora
lora_target: all
dataset: identity
cutoff_len: 2048
max_samples: 1000
output_dir: {out}
plot_loss: true
report_to: none
per_device_train_batch_size: 1
gradient_accumulation_steps: 8
learning_rate: 1.0e-5
num_train_epochs: 3.0
"""


def test_llamafactory_ppo_keys_and_other_projects_keys_name_their_replacement(llama_dir, tmp_path, capsys):
    """Issue 52 item 24: a LLaMA-Factory PPO YAML was refused for cutoff_len, max_samples and num_train_epochs
    with no replacement named (without them the run did 100 steps where LLaMA-Factory does 3 epochs); mask_history
    was unknown; plot_loss promised a report.html no run writes; TRL's tools / environment_factory and OpenRLHF's
    input_key / label_key were "unknown key" with no pointer to tether's environment class and --columns."""
    from tether.stages.dpo_config import DPOConfig
    from tether.stages.grpo_config import GRPOConfig
    from tether.stages.ppo_config import PPOConfig
    from tether.stages.sft_config import SFTConfig

    config = tmp_path / "ppo.yaml"
    config.write_text(LF_PPO_YAML.format(model=llama_dir, out=tmp_path / "o"))
    assert main(["ppo", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "3.0 epochs over 1000 (max_samples) at 8 prompts per step is max_steps 375: give max_steps" in err
    assert "max_samples: 1000: the online stages read every prompt of the file" in err
    assert "cutoff_len" not in err and "unknown key" not in err  # cutoff_len: no effect online, and said so
    fixed = LF_PPO_YAML.replace("max_samples: 1000\n", "").replace("num_train_epochs: 3.0", "max_steps: 375")
    cfg = build_config(PPOConfig, yaml.safe_load(fixed.format(model=llama_dir, out=tmp_path / "o")), source="y")
    assert (cfg.train.max_steps, cfg.rollout.prompts_per_step, cfg.optim.lr) == (375, 8, 1e-5)
    said = capsys.readouterr()
    assert "cutoff_len (tether keeps every prompt whole" in said.out + said.err
    assert "plot_loss (tether logs every curve to metrics.jsonl" in said.out + said.err  # no report.html promised
    assert build_config(SFTConfig, {"mask_history": False}).data.max_length == 1024
    with pytest.raises(ConfigError, match="true .train the last turn alone. is not built: tether trains every"):
        build_config(SFTConfig, {"mask_history": True}, source="y")
    for stage_cls, values, message in (
        (GRPOConfig, {"tools": ["m.f"]}, "--env with a tether.agents.tools.ToolEnvironment subclass"),
        (GRPOConfig, {"environment_factory": "m.Env"}, "an environment is --env module:Class"),
        (GRPOConfig, {"input_key": "question"}, "--prompt-columns prompt=question"),
        (DPOConfig, {"input_key": "question"}, "--columns prompt=question"),
        (GRPOConfig, {"label_key": "answer"}, "reward functions get every column of a prompt row under its own"),
    ):
        with pytest.raises(ConfigError, match=re.escape(message)) as err:
            build_config(stage_cls, values, source="y")
        assert "unknown key" not in str(err.value)
