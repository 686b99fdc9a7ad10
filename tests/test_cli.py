"""The command line: data check, and bad input reaching the user as one clear line, not a traceback."""

import argparse
import json
import subprocess
import sys

import pytest
from conftest import write_jsonl

from tether.cli import main


def test_data_check_prints_counts_and_the_loss_mask(llama_dir, tmp_path, capsys):
    path = write_jsonl(
        tmp_path / "d.jsonl", [{"prompt": "What is 1 + 2?\n", "completion": "3."}, {"prompt": "x", "completion": ""}]
    )
    assert main(["data", "check", str(path), "--model", str(llama_dir)]) == 0
    err = capsys.readouterr().err
    assert "2 records (prompt/completion) -> 1 examples" in err
    assert "dropped: 1 empty completion" in err
    assert "What is 1 + 2?\n⟦3.<|im_end|>⟧" in err


def test_bad_data_exits_2_with_the_file_and_line(llama_dir, tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "a", "completion": "b"}\n{"prompt": "a", "completion": "b"\n')
    code = main(
        ["sft", "--model", str(llama_dir), "--data", str(path), "--output", str(tmp_path / "o"), "--report-to", "none"]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert "tether sft: error:" in err and "bad.jsonl:2: not valid JSON" in err
    assert "Traceback" not in err


def test_missing_required_option_is_named(tmp_path, capsys):
    assert main(["sft", "--data", "x.jsonl", "--output", str(tmp_path / "o")]) == 2
    assert "--model is required" in capsys.readouterr().err


def test_module_entry_point_runs():
    proc = subprocess.run([sys.executable, "-m", "tether", "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "sft" in proc.stdout


def test_an_unknown_flag_gets_one_line_with_the_flag_it_most_likely_meant_and_no_usage(capsys):
    import pytest

    with pytest.raises(SystemExit) as stop:
        main(["grpo", "--modle", "m", "--lerning-rat", "1"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "usage:" not in err and len(err.splitlines()) == 4, err
    assert "--modle: unknown (did you mean --model?)" in err and "--lerning-rat: unknown\n" in err


def test_flags_spelt_with_underscores_are_the_dashed_flags(tmp_path, capsys):
    # TRL and LLaMA-Factory users write --max_steps; the run reaches the same check as with --max-steps
    assert (
        main(["sft", "--data", "x.jsonl", "--max_steps", "3", "--micro_batch_size=2", "--output", str(tmp_path / "o")])
        == 2
    )
    err = capsys.readouterr().err
    assert "--model is required" in err and "unrecognized" not in err


def test_trl_names_are_accepted_for_the_same_options(tmp_path, capsys):
    assert (
        main(
            [
                "sft",
                "--model_name_or_path",
                str(tmp_path / "m"),
                "--learning_rate",
                "1e-4",
                "--num_train_epochs",
                "2",
                "--data",
                str(tmp_path / "nope.jsonl"),
                "--output_dir",
                str(tmp_path / "o"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err  # every flag was understood: the run reached the missing model folder
    assert "/m: not a folder" in err and "unrecognized" not in err


def test_data_check_shows_preference_masks_and_rl_prompts(llama_dir, tmp_path, capsys):
    prefs = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "Q: ", "chosen": "yes", "rejected": "no"}])
    assert main(["data", "check", str(prefs), "--model", str(llama_dir)]) == 0
    err = capsys.readouterr().err
    assert "1 records (pairs) -> 1 examples" in err and "Q: ⟦yes<|im_end|>⟧" in err and "Q: ⟦no<|im_end|>⟧" in err
    prompts = write_jsonl(
        tmp_path / "rl.jsonl", [{"prompt": [{"role": "user", "content": "Add 1 and 2."}], "answer": 3}]
    )
    assert main(["data", "check", str(prompts), "--model", str(llama_dir)]) == 0
    err = capsys.readouterr().err
    assert "1 RL prompts (chat messages)" in err and "columns reward functions receive by name: ['answer']" in err
    assert "<|im_start|>user\nAdd 1 and 2.<|im_end|>\n<|im_start|>assistant" in err


def test_version_prints_the_installed_version(capsys):
    from importlib.metadata import version

    import pytest

    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0 and capsys.readouterr().out.strip() == f"tether {version('tether')}"


def test_ctrl_c_says_the_step_the_last_checkpoint_and_how_to_resume(tmp_path, monkeypatch, capsys):
    import tether.api

    out = tmp_path / "run"
    (out / "checkpoint-4").mkdir(parents=True)
    (out / "checkpoint-2").mkdir()
    (out / "metrics.jsonl").write_text("".join(f'{{"step": {s}}}\n' for s in range(1, 6)))

    def interrupted(stage, cfg, **_):
        raise KeyboardInterrupt

    monkeypatch.setattr(tether.api, "run_stage", interrupted)
    assert main(["grpo", "--model", "m", "--prompts", "p.jsonl", "--output", str(out)]) == 130
    err = capsys.readouterr().err
    assert err.strip() == (
        f"tether grpo: interrupted at step 5; the last checkpoint is step 4 in {out}; the same command with "
        "--resume continues from it"
    )


def test_commands_from_other_vocabularies_point_to_the_tether_command(capsys):
    assert main(["kto", "--data", "x.jsonl"]) == 2
    assert "tether kto: there is no such command; use tether dpo --loss kto" in capsys.readouterr().err
    assert main(["demo"]) == 2
    assert "use tether sft --demo" in capsys.readouterr().err


def test_the_console_prints_text_as_written_never_as_markup(capsys):
    """Template notes (Mistral's [/INST]), file names, model text reach the plan, warnings, errors and progress
    lines: every one appears as written."""
    import logging

    from tether.console import ConsoleLogHandler, console, progress
    from tether.train.run import show_plan

    text = "[/INST] [bold]not bold[/bold] [red]x"
    console.print(text)
    show_plan({"template note": text}, f"plan {text}")
    handler = ConsoleLogHandler()
    handler.emit(logging.LogRecord("tether", logging.WARNING, __file__, 1, text, None, None))
    assert list(progress(iter(range(3)), 3, text, min_items=1, every_s=0.0)) == [0, 1, 2]
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == text and lines[1].strip() == f"plan {text}" and text in lines[2]
    assert lines[3] == text and lines[4].startswith(f"{text}: 1/3")


def test_quieted_libraries_keep_their_errors_and_lose_their_notes():
    """After quiet_libraries (every command calls it): vLLM's, trackio's and accelerate's INFO and WARNING lines do
    not reach the console between tether's (vLLM's "Triton is installed, but doesn't include CPU backend" on every
    CPU run), their errors do."""
    import logging

    from tether.console import quiet_libraries

    quiet_libraries()
    for name in ("vllm.triton_utils.importing", "trackio", "accelerate.utils.other", "datasets.builder"):
        logger = logging.getLogger(name)
        assert not logger.isEnabledFor(logging.WARNING) and logger.isEnabledFor(logging.ERROR), name


BROKEN_TEMPLATES = {
    "syntax": (
        "{% for m in messages %}\n{{ m.content }\n{% endfor %}",
        ":2: not a valid Jinja template: unexpected '}'",
    ),
    "render": (
        "{% for m in messages %}{{ m.role }}\n{{ m.content + 1 }}\n{% endfor %}",
        ":2: rendering a user turn and the generation prompt raised TypeError: can only concatenate str",
    ),
    "answer": (
        "{% for m in messages %}{{ m.content }}{% if m.role == 'assistant' %}\n\n{{ raise_exception('no answers') }}"
        "{% endif %}{% endfor %}",
        ":3: rendering a user turn and its answer raised TemplateError: no answers",
    ),
}


@pytest.mark.parametrize("stage", ["sft", "dpo", "grpo"])
@pytest.mark.parametrize("kind", list(BROKEN_TEMPLATES))
def test_a_broken_chat_template_file_is_named_with_its_line_before_any_model_loads(
    stage, kind, llama_dir, tmp_path, capsys
):
    import shutil

    model = shutil.copytree(llama_dir, tmp_path / "m")
    (model / "model.safetensors").write_bytes(b"not weights: the check must refuse before anything loads them")
    text, message = BROKEN_TEMPLATES[kind]
    (tmp_path / "t.jinja").write_text(text)
    user, answer = [{"role": "user", "content": "Q"}], [{"role": "assistant", "content": "A"}]
    rows = {
        "sft": [{"messages": user + answer}] * 4,
        "dpo": [{"prompt": user, "chosen": answer, "rejected": [{"role": "assistant", "content": "B"}]}] * 4,
        "grpo": [{"prompt": user}] * 4,
    }[stage]
    data = [write_jsonl(tmp_path / "d.jsonl", rows)]
    data = (
        ["--prompts", *data, "--reward", "tether.rewards.builtin:length_penalty"]
        if stage == "grpo"
        else ["--data", *data]
    )
    argv = [stage, "--model", str(model), *map(str, data), "--chat-template", str(tmp_path / "t.jinja")]
    assert main([*argv, "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert f"tether {stage}: error: --chat-template {tmp_path / 't.jinja'}{message}" in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_sharegpt_turn_without_its_text_names_the_file_line_and_turn(llama_dir, tmp_path, capsys):
    turns = [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello."}]
    path = write_jsonl(tmp_path / "s.jsonl", [{"conversations": turns}, {"conversations": [turns[0], {"from": "gpt"}]}])
    assert main(["data", "check", str(path), "--model", str(llama_dir)]) == 2
    err = capsys.readouterr().err
    assert (
        err.strip()
        == f"tether data: error: {path}:2: conversations[1] has no 'value' (the turn's text); the turn is {{'from': 'gpt'}}"
    )


def test_data_subcommands_keep_their_own_flags_that_are_also_trl_names(llama_dir, tmp_path, capsys):
    """Issue 52 item 26: the foreign-flag translation looked only at `data`'s own options, so a subcommand's flag
    that is also a TRL name (--max-length, --step-separator, --temperature, --seed) vanished into the table."""
    from tether.cli.parser import build_parser, foreign_flags
    from tether.compat import knows

    long_answer = " ".join(["hello there"] * 6)
    path = write_jsonl(
        tmp_path / "d.jsonl", [{"prompt": "hi", "completion": "ok."}, {"prompt": "hi", "completion": long_answer}]
    )
    assert main(["data", "check", str(path), "--model", str(llama_dir), "--max-length", "8"]) == 0
    assert "dropped: 1 longer than max_length=8" in capsys.readouterr().err
    rows = [{"prompt": "1 + 1 = ", "completion": "1 + 1. So 2.", "answer": "2"}]
    (tmp_path / "checks.py").write_text(
        "def mentions(completions, answer, **_):\n    return [float(a in c) for c, a in zip(completions, answer)]\n"
    )
    common = ["--model", str(llama_dir), "--check", f"{tmp_path}/checks.py:mentions", "--samples", "1"]
    out = tmp_path / "labelled.jsonl"
    argv = [*common, "--output", str(out), "--max-new-tokens", "2", "--step-separator", ". ", "--seed", "3"]
    assert main(["data", "prm-labels", str(write_jsonl(tmp_path / "s.jsonl", rows)), *argv]) == 0
    assert "1 solutions, 2 steps" in capsys.readouterr().err  # split at ". ", not at the default newline
    assert len(json.loads(out.read_text())["labels"]) == 2
    # every flag of every tool subcommand that is also another project's name reaches that subcommand
    parser = build_parser()
    tools = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["data"]
    for name, command in next(a for a in tools._actions if isinstance(a, argparse._SubParsersAction)).choices.items():
        for flag in {o for a in command._actions for o in a.option_strings if o.startswith("--")}:
            if knows(flag[2:].replace("-", "_")):
                argv, foreign = foreign_flags(parser, ["data", name, flag, "1"])
                assert argv == ["data", name, flag, "1"] and not foreign, (name, flag)


CHAT_TEMPLATE = (  # renders every turn as <<role|content|greeting>>; refuses to render without greeting=...
    "{% if not greeting %}{{ raise_exception('this template needs --chat-template-kwargs greeting=...') }}{% endif %}"
    "{% for m in messages %}<<{{ m.role }}|{{ m.content }}|{{ greeting }}>>{% endfor %}"
    "{% if add_generation_prompt %}<<assistant>>{% endif %}"
)


def test_data_check_and_eval_render_with_the_runs_chat_template_and_its_options(llama_dir, tmp_path, capsys):
    """Issue 53: `data check` and `eval` rendered with the tokenizer's own template; they take the stages'
    --chat-template and --chat-template-kwargs (from the model section, declared once) and render with them."""
    template = tmp_path / "turns.jinja"
    template.write_text(CHAT_TEMPLATE)
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"prompt": [{"role": "user", "content": "Add 1 and 2."}]}])
    chat = ["--model", str(llama_dir), "--chat-template", str(template), "--chat-template-kwargs", "greeting=hey"]
    assert main(["data", "check", str(prompts), *chat]) == 0
    assert "<<user|Add 1 and 2.|hey>><<assistant>>" in capsys.readouterr().err
    question = "Compute 1 + 2."
    rows = write_jsonl(
        tmp_path / "arith.jsonl", [{"prompt": [{"role": "user", "content": question}], "question": question}]
    )
    run = ["eval", "--task", "lab-arith", "--data", str(rows), "--max-new-tokens", "2", "--output", str(tmp_path / "f")]
    assert main([*run, *chat[:4]]) == 2  # without greeting= the template refuses: eval renders with it
    assert f"--chat-template {template}" in capsys.readouterr().err
    assert main([*run, *chat]) == 0
    assert json.loads((tmp_path / "f").read_text())["n"] == 1


def test_every_flag_of_the_tool_commands_is_declared_once_through_option():
    """Issue 53: the tool commands' flags were hand-written argparse (19 names in 2-6 places, --max-new-tokens with
    defaults 64, 96 and 64). Every flag of every command now is a field of a config section (its dest is
    section.field), but --config, --demo and --help; and a flag name shared by two commands is one declaration
    whenever the two mean the same setting (one field of one section class)."""
    import dataclasses

    from tether.cli.data import DATA
    from tether.cli.parser import build_parser
    from tether.cli.tools import TOOLS
    from tether.config import build_config, flag_name

    def commands(parser, path=()):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield (*path, name), sub
                    yield from commands(sub, (*path, name))

    for path, parser in commands(build_parser()):
        for action in parser._actions:
            if action.option_strings and action.dest not in ("help", "config", "demo"):
                assert "." in action.dest, f"tether {' '.join(path)} {action.option_strings[0]} is hand-written"
    tools, data = {c.name: c for c in TOOLS}, {c.name: c for c in DATA.commands}
    declared = {}  # flag -> {the dataclass field that declares it}, over every tool command
    for command in (*TOOLS, *DATA.commands):
        for section in dataclasses.fields(command.config) if command.config else ():
            for f in dataclasses.fields(section.default):
                if command.config.takes(section.name, f.name):
                    declared.setdefault(flag_name(f), {})[id(f)] = f"{type(section.default).__name__}.{f.name}"
    twice = {flag for flag, fields in declared.items() if len(fields) > 1}
    # the same name, a different thing per command: the file each writes (report's page, lab's folder, eval's
    # figures, filter's and prm-labels' rows), lab's --set (LabConfig) and diagnose's (monitors), lab's seed (the
    # world, the model, every stage) and a sampling seed, eval's evaluation file and bench's training data
    assert twice == {"--output", "--set", "--seed", "--data", "file"}, {f: declared[f] for f in twice}
    assert {"--model", "--chat-template", "--columns", "--max-new-tokens", "--temperature", "--json"} <= set(declared)
    # one declaration, each command's own default: eval's 96 tokens (the lab's evaluations), prm-labels' 64
    assert [build_config(c.config).decoding.max_new_tokens for c in (tools["eval"], data["prm-labels"])] == [96, 64]


def test_the_stage_table_is_what_the_command_line_the_api_and_the_package_read():
    """Issue 53: a stage was named in four tables in three files (the command line's help and dispatch, the API's
    classes and run functions, the package's lazy names). Each row of tether.config.STAGES is now a command with its
    help and its config's flags, ``tether.<name>`` and ``tether.<Config>`` — and the package has no other stage."""
    import tether
    import tether.api
    from tether.cli.parser import build_parser
    from tether.config import STAGES

    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    for row in STAGES:
        cls = row.config_class()
        assert getattr(tether, row.config_name) is cls is tether.api.config_class(row.name)
        assert getattr(tether, row.name) is getattr(tether.api, row.name)
        assert commands[row.name].description.startswith(row.help)
        assert "--config" in commands[row.name].format_help() and row.run_function().__name__ == f"run_{row.name}"
    assert {name for name in tether.__all__ if name.islower()} == {row.name for row in STAGES}
    with pytest.raises(tether.ConfigError, match="no stage 'sfft'; stages are"):
        tether.api.config_class("sfft")


def test_data_check_counts_as_training_does_and_reads_prompts_with_columns(llama_dir, tmp_path, capsys):
    """`data check` kept examples longer than the model's context (128 positions here) that training drops, and
    read an RL prompt file without --columns (and silently from its train split whatever --split said)."""
    import datasets

    long_answer = " ".join(["hello there"] * 100)  # over 128 tokens, under the default max_length 1024
    path = write_jsonl(
        tmp_path / "d.jsonl", [{"prompt": "hi", "completion": "ok."}, {"prompt": "hi", "completion": long_answer}]
    )
    assert main(["data", "check", str(path), "--model", str(llama_dir)]) == 0
    assert "dropped: 1 longer than max_length=128" in capsys.readouterr().err
    prompts = write_jsonl(tmp_path / "gsm.jsonl", [{"question": "Add 1 and 2.", "answer": "3"}])
    assert main(["data", "check", str(prompts), "--model", str(llama_dir), "--columns", "prompt=question"]) == 0
    assert "1 RL prompts (text)" in capsys.readouterr().err
    rows = datasets.Dataset.from_list([{"prompt": "Add 1 and 2."}])
    datasets.DatasetDict({"train": rows, "test": rows}).save_to_disk(str(tmp_path / "dd"))
    assert main(["data", "check", str(tmp_path / "dd"), "--model", str(llama_dir), "--split", "test"]) == 2
    assert "--split test: " in capsys.readouterr().err


def test_eval_reads_plain_string_prompts_as_the_online_stages_do(llama_dir, tmp_path, capsys):
    """`tether eval --data` sent a plain-string prompt to the chat template (each character a message), then died
    with a TypeError; it now reads rows as the online stages do and renders a string prompt as it is."""
    question = "Compute 1 + 2."
    rows = write_jsonl(tmp_path / "arith.jsonl", [{"prompt": question + "\n", "question": question}])
    out = tmp_path / "f.json"
    run = ["eval", "--task", "lab-arith", "--model", str(llama_dir), "--max-new-tokens", "2", "--output", str(out)]
    assert main([*run, "--data", str(rows)]) == 0
    figures = json.loads(out.read_text())
    assert figures["n"] == 1 and figures["examples"][0]["prompt"] == question + "\n"
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": question}])
    capsys.readouterr()
    assert main([*run, "--data", str(bad)]) == 2
    assert "bad.jsonl:1: lab-arith rows need 'prompt' and 'question'; the row has ['prompt']" in capsys.readouterr().err
