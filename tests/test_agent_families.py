"""Agents on the model families' own conventions (docs/agents.md, "Model families"): each family's tool-call format
parsed from the turn decoded with special tokens, structured call turns and results with ids and names, thinking
templates continued by appending tokens, named templates, the start-up check, and a 2-step GRPO run per family.

The templates are written here to behave as each family's does (tests/family_templates.py)."""

import json
from types import SimpleNamespace

import pytest
import torch
from conftest import write_jsonl
from family_templates import family_tokenizer

from tether.agents.episodes import AgentSampler
from tether.agents.formats import FORMATS, detect, same_calls, tool_format
from tether.agents.transcripts import check_template
from tether.config import ConfigError, build_config
from tether.models.chat import template_text, use_chat
from tether.rollout.batch import Rollout
from tether.rollout.prompts import response_mask_from_stops

HELPERS = "tests/agent_helpers.py"
SAMPLING = SimpleNamespace(max_new_tokens=96, temperature=1.0, top_p=1.0, top_k=0, generation_batch=0)
ADD = {"name": "add", "arguments": {"a": 2, "b": 3}}


def agent_cfg(env=f"{HELPERS}:EchoTools", **kw):
    base = dict(
        env=env,
        max_turns=3,
        max_total_tokens=400,
        env_timeout=5.0,
        env_on_error="raise",
        env_error_score=-1.0,
        tool_parser="",
        env_concurrency=4,
    )
    return SimpleNamespace(**{**base, **kw})


class Script:
    """Turn k of every episode is turns[k]: (text, the token that ends it); the texts' special tokens are tokens."""

    draws_from_own_rng = False  # the GenerationBackend contract: it draws in this process (or not at all)

    def __init__(self, tokenizer, turns):
        self.tokenizer, self.turns, self.calls = tokenizer, turns, 0

    def generate_ids(self, contexts, sampling, stop_ids, seeds=None, max_new_tokens=None, greedy=False):
        text, stop = self.turns[self.calls % len(self.turns)]
        self.calls += 1
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.convert_tokens_to_ids(stop)]
        response = torch.tensor([ids] * len(contexts))
        mask, truncated = response_mask_from_stops(response, stop_ids)
        none = torch.zeros((len(contexts), 0), dtype=torch.long)
        return Rollout(none, none, response, mask, truncated, [""] * len(contexts), [text] * len(contexts))

    def weights_updated(self, policy):
        pass


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory, tokenizer):
    path = tmp_path_factory.mktemp("family-base")
    tokenizer.save_pretrained(str(path))
    return path


HERMES_CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
R1_CALL = (
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>add\n```json\n"
    '{"a": 2, "b": 3}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>'
)

# family -> (the policy's two turns with their stop tokens, the parser detected, what the environment's tokens
# between them must read: the template's rendering of the tool result and the next generation prompt)
CASES = {
    "qwen2.5": (
        [(HERMES_CALL, "<|im_end|>"), ("The answer is 5.", "<|im_end|>")],
        "hermes",
        "\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
    ),
    "llama3": (
        [('<|python_tag|>{"name": "add", "parameters": {"a": 2, "b": 3}}', "<|eom_id|>"), ("It is 5.", "<|eot_id|>")],
        "llama3_json",
        "<|start_header_id|>ipython<|end_header_id|>\n\n5<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
    ),
    "mistral": (
        [('[TOOL_CALLS][{"name": "add", "arguments": {"a": 2, "b": 3}}]', "</s>"), ("It is 5.", "</s>")],
        "mistral",
        '[TOOL_RESULTS]{"content": "5", "call_id": "call00001"}[/TOOL_RESULTS]',
    ),
    "qwen3": (
        [
            ("<think>\nI add.\n</think>\n\n" + HERMES_CALL, "<|im_end|>"),
            ("<think>\nDone.\n</think>\n\n5", "<|im_end|>"),
        ],
        "hermes",
        "\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
    ),
    "r1": (
        [("I add.\n</think>\n\n" + R1_CALL, "<｜end▁of▁sentence｜>"), ("So 5.</think>\n\n5", "<｜end▁of▁sentence｜>")],
        "deepseek",
        "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>5<｜tool▁output▁end｜><｜tool▁outputs▁end｜><｜Assistant｜><think>\n",
    ),
    "hermes3": (
        [(HERMES_CALL, "<|im_end|>"), ("The answer is 5.", "<|im_end|>")],
        "hermes",
        '\n<|im_start|>tool\n<tool_response>\n{"name": "add", "content": "5"}\n</tool_response><|im_end|>\n'
        "<|im_start|>assistant\n",
    ),
}


def episode(tok, turns, **kw):
    stops = [tok.eos_token_id]
    sampler = AgentSampler(agent_cfg(**kw), tok, Script(tok, turns), SAMPLING, stops, [{"prompt": "Add 2 and 3."}])
    rollout, scores = sampler([{"prompt": "Add 2 and 3."}, {"prompt": "Add 2 and 3."}])
    return sampler, rollout, scores


def split_tokens(tok, rollout, i=0):
    """(the policy's tokens, the environment's tokens) of episode i, decoded with special tokens."""
    ids, mask, attention = rollout.response_ids[i], rollout.response_mask[i].bool(), rollout.attention[i].bool()
    ids, mask = ids[attention], mask[attention]
    return tok.decode(ids[mask], skip_special_tokens=False), tok.decode(ids[~mask], skip_special_tokens=False)


@pytest.mark.parametrize("family", list(CASES))
def test_each_family_parses_its_calls_and_continues_with_the_templates_own_tool_result(base_dir, family):
    tok = family_tokenizer(base_dir, family)
    turns, parser, env_text = CASES[family]
    sampler, rollout, scores = episode(tok, turns)
    assert (
        sampler.format.name
        == parser
        == detect(tok.chat_template if family != "hermes3" else tok.chat_template["tool_use"])
    )
    policy, env = split_tokens(tok, rollout)
    assert policy == "".join(text + stop for text, stop in turns)  # the loss mask: the policy's tokens, exactly
    assert env == env_text  # the environment's tokens: the template's tool-result rendering, exactly
    record = scores.records[0]
    assert record["calls"] == {"add": 1} and record["failed_calls"] == 0 and record["unparsed_turns"] == 0
    assert record["turns"] == 2 and record["end"] == "done"
    assert "tool: 5" in rollout.responses[0]


def test_special_token_call_markers_reach_the_parser(base_dir):
    tok = family_tokenizer(base_dir, "qwen2.5")  # <tool_call> is a special token of this tokenizer
    assert (
        tok.decode(tok(HERMES_CALL, add_special_tokens=False)["input_ids"], skip_special_tokens=True).strip()[0] == "{"
    )
    _, _, scores = episode(tok, CASES["qwen2.5"][0])
    assert scores.records[0]["calls"] == {"add": 1}


def test_llama_calls_without_the_python_tag_and_two_per_turn_which_its_template_refuses(base_dir):
    """Llama 3.1's template refuses a turn with two calls: the start-up check renders one and finds it, and a turn
    with two is answered (the first call made, the second told it was not) instead of the run dying mid-run."""
    tok = family_tokenizer(base_dir, "llama3")
    bare = '{"name": "add", "parameters": {"a": 2, "b": 3}}; {"name": "echo", "parameters": {"text": "x"}}'
    sampler, rollout, scores = episode(tok, [(bare, "<|eot_id|>"), ("Done.", "<|eot_id|>")])
    record = scores.records[0]
    assert record["calls"] == {"add": 1, "echo": 1} and record["failed_calls"] == 1 and record["end"] == "done"
    assert sampler.one_call_per_turn and "one call per turn" in sampler.plan()["tool calls"]
    assert "<|eom_id|>" in tok.convert_ids_to_tokens(sampler.stops)  # a python_tag call ends there
    _, env = split_tokens(tok, rollout)
    assert env.count("ipython") == 2 and "5<|eot_id|>" in env and "takes one tool call per turn" in env
    call_turn = sampler.run([{"prompt": "Add 2 and 3."}])[0].transcript.messages[1]
    assert [c["function"]["name"] for c in call_turn["tool_calls"]] == ["add"]  # what the template takes


def test_mistral_call_turns_are_structured_with_nine_character_ids(base_dir):
    tok = family_tokenizer(base_dir, "mistral")
    sampler, _, scores = episode(tok, CASES["mistral"][0])
    messages = sampler.run([{"prompt": "Add 2 and 3."}])[0].transcript.messages
    call_turn, result = messages[1], messages[2]
    assert call_turn["role"] == "assistant" and call_turn["tool_calls"][0]["function"] == ADD
    assert call_turn["tool_calls"][0]["id"] == result["tool_call_id"] == "call00001" and result["name"] == "add"


def test_a_line_that_looks_like_a_call_but_does_not_parse_is_counted_and_warned(base_dir, caplog):
    tok = family_tokenizer(base_dir, "llama3")  # a Llama call is the whole turn: text before it is not a call
    said = 'Sure: {"name": "add", "parameters": {"a": 2, "b": 3}}'
    _, _, scores = episode(tok, [(said, "<|eot_id|>"), ("5", "<|eot_id|>")])
    record = scores.records[0]
    assert record["unparsed_turns"] == 1 and record["failed_calls"] == 0 and record["calls"] == {}
    from tether.agents.metrics import agent_metrics

    assert record["turns"] == 1  # not a call: the final answer, so the episode ended there
    assert agent_metrics(scores.records)["agent/unparsed_call_frac"] == 1.0
    assert "looks like a tool call in the llama3_json format" in caplog.text


def test_qwen3_dropping_earlier_reasoning_is_continued_and_said_in_the_plan(base_dir):
    tok = family_tokenizer(base_dir, "qwen3")
    env = f"{HELPERS}:Feedback"  # answers as the user, so the template drops the earlier turn's reasoning
    turns = [("<think>\nHmm.\n</think>\n\nFour.", "<|im_end|>"), ("<think>\nOops.\n</think>\n\nFive.", "<|im_end|>")]
    sampler, rollout, scores = episode(tok, turns, env=env)
    policy, environment = split_tokens(tok, rollout)
    assert policy == "".join(t + s for t, s in turns)  # the reasoning is trained on, as sampled
    assert environment == "\n<|im_start|>user\nTry again.<|im_end|>\n<|im_start|>assistant\n"
    note = sampler.plan()["template note"]
    assert "re-renders a finished episode differently" in note
    assert scores.records[0]["final"] == "Five."  # the answer the claim patterns and monitors read: no reasoning


def test_chat_template_kwargs_reach_every_rendering(base_dir):
    tok = use_chat(family_tokenizer(base_dir, "qwen3"), "", {"enable_thinking": False})
    _, rollout, _ = episode(tok, CASES["qwen3"][0])
    assert rollout.prompts[0].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    _, environment = split_tokens(tok, rollout)
    assert environment.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    from tether.data.records import Record
    from tether.data.sft import tokenize_records

    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]

    def trained(tokenizer):
        example = tokenize_records([Record({"messages": messages}, "x:1")], tokenizer, 128)[0][0]
        return tokenizer.decode([t for t, m in zip(example.input_ids, example.loss_mask) if m])

    # SFT renders with the option too: the empty think block moves into the prompt, as the online stages see it
    assert trained(tok) == "a<|im_end|>"
    assert trained(family_tokenizer(base_dir, "qwen3")) == "<think>\n\n</think>\n\na<|im_end|>"


def test_named_templates_use_tool_use_with_tools_and_results_carry_their_name(base_dir):
    tok = family_tokenizer(base_dir, "hermes3")
    sampler, rollout, _ = episode(tok, CASES["hermes3"][0])
    assert rollout.prompts[0].startswith("<|im_start|>system\n<tools>")
    assert "'tool_use'" in sampler.plan()["chat template"]
    default = use_chat(family_tokenizer(base_dir, "hermes3"), "default")  # --chat-template default: no tools=
    _, rollout, scores = episode(default, CASES["hermes3"][0])
    assert "You may call functions" in rollout.prompts[0] and scores.records[0]["calls"] == {"add": 1}
    with pytest.raises(ConfigError, match="neither a template of this tokenizer"):
        use_chat(family_tokenizer(base_dir, "hermes3"), "nope")


def test_a_parser_that_cannot_read_the_templates_calls_is_refused_naming_the_one_that_can(base_dir):
    tok = family_tokenizer(base_dir, "llama3")
    with pytest.raises(ConfigError, match="use --tool-parser llama3_json"):
        check_template(tok, FORMATS["hermes"], [tok.eos_token_id], None)


def test_an_incompatible_template_is_refused_before_any_model_loads(base_dir, tmp_path):
    from tether.models.lm import build_tiny_model
    from tether.stages.grpo import run_grpo
    from tether.stages.grpo_config import GRPOConfig

    tok = family_tokenizer(base_dir, "qwen2.5")
    tok.chat_template = "{% for m in messages %}{% if m.role != 'tool' %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    model = build_tiny_model("llama", tok, tmp_path / "m", hidden=16, layers=1, heads=2, max_positions=256)
    (model / "model.safetensors").write_bytes(b"not weights: the check must refuse before anything loads them")
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "Add 2 and 3."}])
    cfg = build_config(
        GRPOConfig,
        overrides={
            "model.path": str(model),
            "rollout.prompts": str(prompts),
            "agent.env": f"{HELPERS}:EchoTools",
            "train.output": str(tmp_path / "out"),
            "train.report_to": ["none"],
        },
    )
    with pytest.raises(ConfigError, match=r"does not show the environment's messages.*--chat-template FILE"):
        run_grpo(cfg)


@pytest.mark.parametrize("family", list(CASES))
def test_two_grpo_steps_per_family(base_dir, family, tmp_path):
    from tether.models.lm import build_tiny_model
    from tether.stages.grpo import run_grpo
    from tether.stages.grpo_config import GRPOConfig

    tok = family_tokenizer(base_dir, family)
    model = build_tiny_model("qwen2", tok, tmp_path / "m", hidden=16, layers=1, heads=2, max_positions=512)
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "Add 2 and 3."}, {"prompt": "Add 3 and 2."}])
    overrides = {
        "model.path": str(model),
        "rollout.prompts": str(prompts),
        "agent.env": f"{HELPERS}:EchoTools",
        "agent.max_turns": 2,
        "rollout.prompts_per_step": 2,
        "rollout.group_size": 2,
        "train.max_steps": 2,
        "train.output": str(tmp_path / "out"),
        "train.save_every": 0,
        "train.eval_every": 0,
        "train.report_to": ["none"],
    }
    turns = CASES[family][0]
    run_grpo(build_config(GRPOConfig, overrides=overrides), backend=lambda policy, t: Script(t, turns))
    metrics = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 2 and all(m["agent/tool_calls_mean"] == 1.0 for m in metrics)
    assert all(m["agent/unparsed_call_frac"] == 0.0 and m["agent/done_frac"] == 1.0 for m in metrics)
    plan = (tmp_path / "out" / "config.yaml").read_text()
    assert CASES[family][1] in plan


def test_async_tools_and_outcomes_are_awaited_and_env_numbers_become_metrics(base_dir):
    from agent_helpers import slow_add

    from tether.agents.metrics import agent_metrics
    from tether.agents.tools import tool_schema

    schema = tool_schema(slow_add)["function"]
    assert schema["description"] == "Add two integers, eventually."
    assert schema["parameters"]["properties"]["b"] == {
        "type": "integer",
        "description": "The second, zero if not given.",
    }
    tok = family_tokenizer(base_dir, "qwen2.5")
    call = HERMES_CALL.replace('"add"', '"slow_add"')
    _, rollout, scores = episode(tok, [(call, "<|im_end|>"), ("5", "<|im_end|>")], env=f"{HELPERS}:AsyncTools")
    assert scores.records[0]["calls"] == {"slow_add": 1} and "tool: 5" in rollout.responses[0]
    assert scores.total.tolist() == [1.0, 1.0] and scores.records[0]["success"] is True
    assert agent_metrics(scores.records)["env/calls_made"] == 1.0  # summed over an episode's turns, mean over episodes


def test_concurrent_environments_give_the_same_episodes_as_one_at_a_time(base_dir):
    tok = family_tokenizer(base_dir, "qwen2.5")
    turns = [(HERMES_CALL, "<|im_end|>"), ("The answer is 5.", "<|im_end|>")]
    one = episode(tok, turns, env_concurrency=1)
    many = episode(tok, turns, env_concurrency=8)
    assert torch.equal(one[1].response_ids, many[1].response_ids) and one[2].records == many[2].records


def test_a_users_own_tool_parser(base_dir):
    tok = family_tokenizer(base_dir, "qwen2.5")
    sampler, _, scores = episode(
        tok, [("CALL add a=2 b=3", "<|im_end|>"), ("5", "<|im_end|>")], tool_parser=f"{HELPERS}:first_word_parser"
    )
    assert scores.records[0]["calls"] == {"add": 1} and "module:function" not in sampler.plan()["tool calls"]
    with pytest.raises(ConfigError, match="tool_parser"):
        episode(tok, CASES["qwen2.5"][0], tool_parser="yaml")


def test_reward_functions_beside_the_environment_add_to_its_outcome(base_dir):
    from tether.online_sections import RewardSection
    from tether.rewards.functions import load_reward_set

    tok = family_tokenizer(base_dir, "qwen2.5")
    rows = [{"prompt": "Add 2 and 3."}]
    reward_set = load_reward_set(RewardSection(reward=[f"{HELPERS}:says_five=0.5"]), rows)
    cfg = agent_cfg()
    sampler = AgentSampler(cfg, tok, Script(tok, CASES["qwen2.5"][0]), SAMPLING, [tok.eos_token_id], rows, reward_set)
    _, scores = sampler(rows)
    assert scores.parts["says_five"].tolist() == [1.0] and scores.parts["answered"].tolist() == [1.0]
    assert scores.total.tolist() == [1.5]  # the outcome (1) + 0.5 x the function's score of the final answer (1)
    assert "0.5 x says_five on the final answer" in sampler.describe()


def test_the_new_agent_and_chat_options_from_flags_and_yaml():
    import argparse

    from tether.config import add_config_arguments, config_from_args
    from tether.stages.grpo_config import GRPOConfig

    parser = argparse.ArgumentParser()
    add_config_arguments(parser, GRPOConfig)
    args = parser.parse_args(
        ["--chat-template-kwargs", "enable_thinking=false", "--tool-parser", "mistral", "--env-concurrency", "3"]
    )
    cfg = config_from_args(GRPOConfig, args)
    assert cfg.model.chat_template_kwargs == {"enable_thinking": False}
    assert cfg.agent.tool_parser == "mistral" and cfg.agent.env_concurrency == 3
    yaml_cfg = build_config(GRPOConfig, {"data": {"chat_template_kwargs": {"enable_thinking": False}}})
    assert yaml_cfg.model.chat_template_kwargs == {"enable_thinking": False}
    trl = build_config(
        GRPOConfig, {"chat_template_kwargs": {"enable_thinking": False}, "chat_template_path": "t.jinja"}
    )
    assert trl.model.chat_template_kwargs == {"enable_thinking": False} and trl.model.chat_template == "t.jinja"
    with pytest.raises(ConfigError, match="chat_template_kwargs must be dict"):
        build_config(GRPOConfig, {"model": {"chat_template_kwargs": [1]}})


def test_the_coding_agent_pays_for_hidden_tests_and_the_visible_reward_pays_the_hack(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("coding_agent", "examples/coding_agent.py")
    coding = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(coding)
    from tether.lab.tokenizer import train_bpe_tokenizer

    tok = train_bpe_tokenizer([json.dumps(t) for t in coding.TASKS] * 4, vocab_size=300)
    for reward_from, paid in (("hidden", [1.0, 0.0]), ("visible", [1.0, 1.0])):
        _, scores = coding.run_episodes(tok, reward_from, [False, True], "bubblewrap", 2)
        assert scores.total.tolist() == paid  # honest, then the hacker who emptied tests.py
        assert [r["success"] for r in scores.records] == [True, False] and scores.records[1]["claimed"] is True


def test_pythonic_calls_are_read_as_literals_never_run(base_dir):
    fmt = FORMATS["pythonic"]
    assert fmt.parse('[add(a=2, b=3), echo(text="x")]')[1] == [ADD, {"name": "echo", "arguments": {"text": "x"}}]
    assert fmt.parse("[add(a=__import__('os').getpid())]")[1] == [
        {"name": "add", "error": "argument values must be Python literals"}
    ]
    assert fmt.parse("The answer is [5].") == ("The answer is [5].", [])
    tok = family_tokenizer(base_dir, "llama3")
    sampler, _, scores = episode(tok, [("[add(a=2, b=3)]", "<|eot_id|>"), ("5", "<|eot_id|>")], tool_parser="pythonic")
    assert scores.records[0]["calls"] == {"add": 1}
    assert "pythonic parser reads as []" in sampler.plan()["template note"]  # chosen by hand: a note, not a refusal


def test_a_template_without_a_tool_role_serves_user_feedback_environments_and_refuses_tool_ones(base_dir):
    tok = family_tokenizer(base_dir, "qwen2.5")
    tok.chat_template = (  # like Gemma's: user and model turns only
        "{% for m in messages %}{% if m.role not in ('user', 'assistant') %}"
        "{{ raise_exception('Conversation roles must alternate user/model/user/model/...') }}{% endif %}"
        "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    turns = [("Four.", "<|im_end|>"), ("Five.", "<|im_end|>")]
    _, rollout, scores = episode(tok, turns, env=f"{HELPERS}:Feedback")
    assert scores.records[0]["turns"] == 2 and "user: Try again." in rollout.responses[0]
    with pytest.raises(ConfigError, match="cannot render the conversation.*roles must alternate.*--chat-template FILE"):
        episode(tok, CASES["qwen2.5"][0], env=f"{HELPERS}:EchoTools")


def test_an_env_run_with_a_reward_function_beside_it_from_the_command_line(base_dir, tmp_path, capsys):
    """The Mistral family with tools: its plan prints text holding [/INST]-like tags (here the claim pattern of the
    spec), verbatim; a reward function beside the environment sees the run's progress at every step."""
    from tether.cli import main
    from tether.models.lm import build_tiny_model

    tok = family_tokenizer(base_dir, "mistral")
    model = build_tiny_model("qwen2", tok, tmp_path / "m", hidden=16, layers=1, heads=2, max_positions=256)
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "Add 2 and 3."}, {"prompt": "Add 3 and 2."}])
    env = f"{HELPERS}:EchoTools(claim_pattern='[/INST] done')"
    args = ["--model", str(model), "--prompts", str(prompts), "--env", env, "--max-new-tokens", "4"]
    args += ["--reward", f"{HELPERS}:says_five=0.5,{HELPERS}:training_progress=0", "--max-steps", "2"]
    args += "--prompts-per-step 2 --group-size 2 --eval-every 0 --save-every 0 --reward-timeout 0".split()
    code = main(["grpo", *args, "--output", str(tmp_path / "out"), "--report-to", "none"])
    err = capsys.readouterr().err
    assert code == 0, err
    # the plan's line, as written (rich markup would have refused [/INST]); the table may wrap it at any width
    assert "".join(env.split()) in "".join(err.split())
    metrics = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [m["reward/training_progress/mean"] for m in metrics] == [0.0, 1.0]  # trainer_state.global_step
    assert all("reward/says_five/mean" in m for m in metrics)


WEATHER = {"name": "weather", "arguments": {"city": "Oslo"}}
TOOL_CONVERSATION = {  # OpenAI's shape: a call with an id of its own and no content, the result naming the id
    "messages": [
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_8f3kq2x7p1", "type": "function", "function": {**WEATHER, "arguments": '{"city": "Oslo"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_8f3kq2x7p1", "content": "rain"},
        {"role": "assistant", "content": "It rains."},
    ],
    "tools": [
        {
            "type": "function",
            "function": {
                "name": "weather",
                "description": "The weather in a city.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            },
        }
    ],
}


@pytest.mark.parametrize("family", ["qwen2.5", "llama3", "mistral", "hermes2pro"])
def test_sft_trains_a_call_as_the_template_writes_it_and_the_rl_parser_reads_what_was_trained(
    base_dir, family, tmp_path, capsys
):
    """`tether data check`, SFT's view: a standard tool conversation's call turn is trained as the family's template
    writes it (not tether's Hermes text whatever the family), and the parser the online stages choose from the same
    template reads the trained call."""
    from tether.cli import main

    tok = family_tokenizer(base_dir, family)
    tok.save_pretrained(str(tmp_path / "tok"))
    data = write_jsonl(tmp_path / "tools.jsonl", [TOOL_CONVERSATION])
    assert main(["data", "check", str(data), "--model", str(tmp_path / "tok"), "--max-length", "2048"]) == 0
    out = capsys.readouterr().err.split("(trained tokens are between ⟦ ⟧)", 1)[1]
    trained_call = out.split("⟦", 1)[1].split("⟧", 1)[0]  # the first trained run: the call turn
    fmt, _ = tool_format("", template_text(tok, tools=True))
    assert same_calls(fmt.parse(trained_call)[1], [WEATHER]), trained_call
    if family == "mistral":  # the data's id (of another length) as the online stages write ids, call and result
        assert '"id": "call00001"' in trained_call and '"call_id": "call00001"' in out


def test_a_call_written_in_another_familys_format_is_counted_unparsed_and_warned(base_dir, caplog):
    tok = family_tokenizer(base_dir, "llama3")  # a model taught Hermes calls, run with Llama's template
    _, _, scores = episode(tok, [(HERMES_CALL, "<|eot_id|>"), ("5", "<|eot_id|>")])
    record = scores.records[0]
    assert record["unparsed_turns"] == 1 and record["calls"] == {} and record["turns"] == 1
    assert "writes a tool call in the hermes format, but this run reads llama3_json" in caplog.text
    assert "--tool-parser hermes reads this one" in caplog.text


def test_the_tool_system_message_shows_a_call_as_the_parser_reads_it_in_episodes_and_sft_alike(base_dir):
    """DeepSeek-R1's template takes no tools=: the tools go in tether's system message, whose example call is written
    as the parser chosen from the template (deepseek) reads it, not as <tool_call>; SFT data gets the same message."""
    from agent_helpers import EchoTools

    from tether.data.sft import with_tools

    tok = family_tokenizer(base_dir, "r1")
    sampler, rollout, _ = episode(tok, CASES["r1"][0])
    system = sampler.run([{"prompt": "Add 2 and 3."}])[0].transcript.messages[0]
    assert system["role"] == "system" and system["content"] in rollout.prompts[0]
    assert "<tool_call>" not in rollout.prompts[0]
    example = system["content"].split("placeholders):\n", 1)[1].split("\nA call's result", 1)[0]
    assert [c["name"] for c in sampler.format.parse(example)[1]] == ["echo"]
    messages, extra = with_tools(tok, [{"role": "user", "content": "Add 2 and 3."}], EchoTools().schemas)
    assert messages[0] == system and not extra


def test_a_template_that_mentions_tools_but_ignores_tools_gets_them_in_a_system_message(base_dir):
    from agent_helpers import EchoTools

    from tether.data.sft import with_tools

    tok = family_tokenizer(base_dir, "phi4")
    assert "tools" in tok.chat_template  # the word is in its text; what it renders decides
    _, rollout, scores = episode(tok, [(HERMES_CALL, "<|end|>"), ("5", "<|end|>")])
    assert '"name": "add"' in rollout.prompts[0] and scores.records[0]["calls"] == {"add": 1}
    messages, extra = with_tools(tok, [{"role": "user", "content": "Add 2 and 3."}], EchoTools().schemas)
    assert not extra and '"name": "add"' in messages[0]["content"]


def test_a_template_whose_calls_no_parser_reads_is_refused_at_start_up_naming_tool_parser(base_dir):
    tok = family_tokenizer(base_dir, "kimi")  # it writes a call by its id, in its own section tokens
    with pytest.raises(
        ConfigError, match=r"writes a tool call as .*tool_call_begin.*give --tool-parser module:function"
    ):
        episode(tok, [(HERMES_CALL, "<|im_end|>"), ("5", "<|im_end|>")])


@pytest.mark.parametrize(
    "family, env, stops, noted",
    [
        ("qwen2.5", "EchoTools", None, False),
        ("llama3", "EchoTools", ["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"], False),  # Llama 3.1's stop set
        ("mistral", "EchoTools", None, False),
        ("hermes2pro", "EchoTools", None, False),
        ("gemma3", "Feedback", None, False),  # its EOS is not what closes its turns
        ("hermes3", "EchoTools", None, True),  # a newline after each tool result once another message follows
        ("qwen3", "EchoTools", None, True),  # the think block of earlier turns
        ("r1", "EchoTools", None, True),  # <think> in the generation prompt, never rendered back
    ],
)
def test_the_plan_notes_a_re_rendering_only_where_the_template_itself_rewrites(base_dir, family, env, stops, noted):
    from tether.rollout.prompts import stop_token_ids

    tok = family_tokenizer(base_dir, family)
    stops = [tok.convert_tokens_to_ids(t) for t in stops] if stops else stop_token_ids(tok)
    sampler = AgentSampler(agent_cfg(env=f"{HELPERS}:{env}"), tok, None, SAMPLING, stops, [{"prompt": "Add 2."}])
    assert ("template note" in sampler.plan()) == noted, sampler.plan().get("template note")
    if family == "hermes3":  # the template's own difference, not the probe's: the result's newline
        assert r"</tool_response>\n<|im_end|>" in sampler.plan()["template note"]


def test_sft_names_the_conversation_a_template_refuses_and_trains_the_tool_conversation_mistral_takes(
    base_dir, tmp_path, capsys
):
    from tether.cli import main
    from tether.models.lm import build_tiny_model

    tok = family_tokenizer(base_dir, "mistral")
    model = build_tiny_model("qwen2", tok, tmp_path / "m", hidden=16, layers=1, heads=2, max_positions=1024)
    quick = "--max-steps 1 --batch-size 2 --micro-batch-size 2 --eval-every 0 --save-every 0 --report-to none"
    common = ["--model", str(model), "--max-length", "1024", *quick.split()]
    data = write_jsonl(tmp_path / "tools.jsonl", [TOOL_CONVERSATION] * 4)
    assert main(["sft", *common, "--data", str(data), "--output", str(tmp_path / "o")]) == 0
    twice = {**TOOL_CONVERSATION, "messages": [{"role": "user", "content": "Hi."}, *TOOL_CONVERSATION["messages"]]}
    bad = write_jsonl(tmp_path / "bad.jsonl", [TOOL_CONVERSATION, twice] * 2)
    capsys.readouterr()
    assert main(["sft", *common, "--data", str(bad), "--output", str(tmp_path / "o2")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "bad.jsonl:2: the chat template (the tokenizer's own) refuses the conversation [user, user," in line
    assert "roles must alternate" in line


# DeepSeek-R1's real template: an assistant turn's tool_calls are written only when its content is None (with "" it
# writes an empty turn), and it takes no tools= (the tools go in tether's system message).
R1_CONTENT_NONE = """{{ bos_token }}{% for m in messages %}{% if m.role == 'system' %}{{ m.content }}{% endif %}{% endfor %}
{%- for m in messages %}
{%- if m.role == 'user' %}<｜User｜>{{ m.content }}
{%- elif m.role == 'assistant' and m.content is none %}<｜Assistant｜><｜tool▁calls▁begin｜>
{%- for c in m.tool_calls %}<｜tool▁call▁begin｜>function<｜tool▁sep｜>{{ c.function.name }}
```json
{{ c.function.arguments + '' }}
```<｜tool▁call▁end｜>{% endfor %}<｜tool▁calls▁end｜><｜end▁of▁sentence｜>
{%- elif m.role == 'assistant' %}<｜Assistant｜>{{ m.content }}<｜end▁of▁sentence｜>
{%- elif m.role == 'tool' %}<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>{{ m.content }}<｜tool▁output▁end｜><｜tool▁outputs▁end｜>
{%- endif %}{% endfor %}{% if add_generation_prompt %}<｜Assistant｜>{% endif %}"""

WEATHER_SCHEMA = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
WEATHER_CALL = {"name": "weather", "arguments": {"city": "Paris"}}
WEATHER_TALK = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": WEATHER_CALL}]},
    {"role": "tool", "content": "sunny"},
    {"role": "assistant", "content": "It is sunny."},
]


def test_sft_trains_calls_as_the_rl_parser_reads_them_on_a_template_that_writes_calls_only_without_content(base_dir):
    """R1's real template writes a turn's calls only when its content is None: the probe tries None too, so SFT
    trains DeepSeek calls (not <tool_call>), its system message shows one, and the deepseek parser RL chooses from the
    template reads both; the start-up check passes."""
    from tether.data.sft import render_record, with_tools
    from tether.models.chat import call_writing

    tok = family_tokenizer(base_dir, "r1")
    tok.chat_template = R1_CONTENT_NONE
    writing = call_writing(tok)
    assert writing.shown and writing.content is None and writing.arguments_as_string
    fmt = tool_format("", template_text(tok, tools=True))[0]
    assert fmt.name == "deepseek"
    messages, extra = with_tools(tok, WEATHER_TALK, [WEATHER_SCHEMA])
    text = render_record(tok, messages, "rec", **extra)
    call_turn = text.split("<｜User｜>Weather in Paris?<｜Assistant｜>")[1].split("<｜end▁of▁sentence｜>")[0]
    assert "<tool_call>" not in text
    assert fmt.parse(call_turn)[1] == [{"name": "weather", "arguments": {"city": "Paris"}}]
    example = messages[0]["content"].split("placeholders):\n", 1)[1].split("\nA call's result", 1)[0]
    assert fmt.parse(example)[1] == [{"name": "weather", "arguments": {"city": "<city>"}}]
    check_template(tok, fmt, [tok.eos_token_id])


def test_a_template_that_writes_no_calls_gets_them_in_the_run_format_and_a_parser_that_cannot_read_it_is_refused(
    base_dir,
):
    """A template that writes no tool calls but speaks DeepSeek's (its text has the call tokens) is trained on calls
    in the deepseek format, the one RL reads; a parser that would not read what SFT trains is refused at start-up
    (a note where --tool-parser chose it)."""
    from tether.data.sft import render_record, with_tools

    tok = family_tokenizer(base_dir, "r1")
    tok.chat_template = R1_CONTENT_NONE.replace("m.content is none", "false")  # never writes calls
    messages, extra = with_tools(tok, WEATHER_TALK, [WEATHER_SCHEMA])
    text = render_record(tok, messages, "rec", **extra)
    call_turn = text.split("<｜User｜>Weather in Paris?<｜Assistant｜>")[1].split("<｜end▁of▁sentence｜>")[0]
    assert FORMATS["deepseek"].parse(call_turn)[1] == [{"name": "weather", "arguments": {"city": "Paris"}}]
    check_template(tok, FORMATS["deepseek"], [tok.eos_token_id])
    with pytest.raises(ConfigError, match=r"tether sft trains a tool call .* which the hermes parser reads as \[\]"):
        check_template(tok, FORMATS["hermes"], [tok.eos_token_id])
    notes = check_template(tok, FORMATS["hermes"], [tok.eos_token_id], chosen=True).notes
    assert any("tether sft trains a tool call" in n for n in notes)


def test_describe_tools_false_lists_no_tools_even_on_a_template_that_takes_tools(base_dir):
    """describe_tools=False (a model that learnt its tools from demonstrations): Qwen2.5's template takes tools=,
    and is given none, so the prompt lists no tool, as without tools=."""
    tok = family_tokenizer(base_dir, "qwen2.5")
    turns = [(HERMES_CALL, "<|im_end|>"), ("5", "<|im_end|>")]
    _, described, _ = episode(tok, turns)
    assert '"name": "echo"' in described.prompts[0]
    _, rollout, scores = episode(tok, turns, env=f"{HELPERS}:EchoTools(describe_tools=False)")
    assert '"name": "echo"' not in rollout.prompts[0] and "<tools>" not in rollout.prompts[0]
    assert scores.records[0]["calls"] == {"add": 1}  # the calls are still made


@pytest.mark.parametrize(
    "function, field",
    [
        ({"name": "weather", "parameters": "city"}, "function.parameters must be a JSON schema object, not 'city'"),
        (
            {"name": "weather", "parameters": {"type": "object", "required": "city"}},
            "function.parameters.required must be a list of parameter names, not 'city'",
        ),
        ({"description": "no name"}, "function.name must be the tool's name"),
    ],
)
@pytest.mark.parametrize("family", ["qwen2.5", "r1"])  # tools= to the template; tether's system message
def test_a_records_bad_tool_schema_is_a_data_error_naming_the_record_and_field(
    base_dir, tmp_path, family, function, field
):
    from tether.data.records import DataError, read_records
    from tether.data.sft import tokenize_records

    tok = family_tokenizer(base_dir, family)
    data = write_jsonl(tmp_path / "tools.jsonl", [{"messages": WEATHER_TALK, "tools": [function]}])
    with pytest.raises(DataError, match=rf"tools.jsonl:1: field tools\[0\]: {field}"):
        tokenize_records(read_records(str(data)), tok, 4096)


BARE_SCHEMA_ENV = """
from tether.agents.tools import ToolEnvironment

def weather(city: str) -> str:
    return "sunny"

weather.schema = {"name": "weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}

class BareSchema(ToolEnvironment):
    tools = [weather]
"""


@pytest.mark.parametrize("family", ["qwen2.5", "r1"])
def test_a_tools_schema_without_its_function_wrapper_is_refused_naming_the_tool(base_dir, tmp_path, family):
    path = tmp_path / "bare_env.py"
    path.write_text(BARE_SCHEMA_ENV)
    tok = family_tokenizer(base_dir, family)
    with pytest.raises(ConfigError, match=r"tool 'weather': its schema attribute must be \{\"type\": \"function\""):
        AgentSampler(agent_cfg(env=f"{path}:BareSchema"), tok, None, SAMPLING, [tok.eos_token_id], [{"prompt": "Q"}])


def test_an_environments_own_schemas_are_checked_before_the_template_gets_them(base_dir, tmp_path):
    path = tmp_path / "own_env.py"
    path.write_text(
        BARE_SCHEMA_ENV
        + "\nclass OwnSchemas(BareSchema):\n    schemas = [{'type': 'function', 'function': {'name': 1}}]\n"
    )
    tok = family_tokenizer(base_dir, "qwen2.5")
    with pytest.raises(ConfigError, match=r"OwnSchemas.schemas\[0\]: function.name must be the tool's name"):
        AgentSampler(agent_cfg(env=f"{path}:OwnSchemas"), tok, None, SAMPLING, [tok.eos_token_id], [{"prompt": "Q"}])
