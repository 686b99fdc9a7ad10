"""Agents: tool-call parsing, environments and their faults, multi-turn transcripts (which tokens are actions),
log-probs across turns, and agent training runs on the online loop (docs/agents.md)."""

import json
from types import SimpleNamespace

import pytest
import torch
import yaml
from agent_helpers import EchoTools, ScriptedBackend, add
from conftest import write_jsonl

from tether.agents.environment import EnvironmentFault, Outcome
from tether.agents.episodes import AgentSampler
from tether.agents.metrics import agent_metrics
from tether.agents.tools import parse_tool_calls, tool_schema
from tether.config import ConfigError, build_config
from tether.models.lm import load_model, load_tokenizer
from tether.rollout.forward import response_logprobs

HELPERS = "tests/agent_helpers.py"
SAMPLING = SimpleNamespace(max_new_tokens=96, temperature=1.0, top_p=1.0, top_k=0, generation_batch=0)


@pytest.fixture(scope="module")
def long_llama(tmp_path_factory, tokenizer):
    """A tiny llama with room for a few turns of JSON tool calls (512 positions)."""
    from tether.models.lm import build_tiny_model

    folder = tmp_path_factory.mktemp("agent") / "llama"
    return build_tiny_model("llama", tokenizer, folder, seed=0, hidden=32, layers=2, heads=2, max_positions=512)


def agent_cfg(env, **kw):
    base = dict(env=env, max_turns=4, max_total_tokens=400, env_timeout=5.0, env_on_error="raise", env_error_score=-1.0)
    return SimpleNamespace(**{**base, **kw})


def test_tool_calls_are_parsed_and_malformed_ones_say_why():
    text = (
        'First <tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call> then '
        '<tool_call>{"name": "echo", "arguments": "{\\"text\\": \\"hi\\"}"}</tool_call>'
    )
    assert parse_tool_calls(text) == [
        {"name": "add", "arguments": {"a": 2, "b": 3}},
        {"name": "echo", "arguments": {"text": "hi"}},
    ]
    assert parse_tool_calls("The answer is 5.") == []
    bad = parse_tool_calls('<tool_call>{"name": "add", "arguments": {"a": 2</tool_call>')
    assert "not valid JSON" in bad[0]["error"]
    assert 'a JSON object with a "name"' in parse_tool_calls("<tool_call>[1, 2]</tool_call>")[0]["error"]
    assert (
        "must be a JSON object"
        in parse_tool_calls('<tool_call>{"name": "add", "arguments": 3}</tool_call>')[0]["error"]
    )
    # a call cut off before its closing tag is read to the end of the turn
    assert parse_tool_calls('<tool_call>{"name": "echo", "arguments": {"text": "x"}}') == [
        {"name": "echo", "arguments": {"text": "x"}}
    ]


def test_a_call_whose_arguments_hold_a_code_fence_round_trips_in_every_format():
    """DeepSeek's calls put the arguments in a ```json block: a ``` inside an argument (a README, a shell snippet)
    must not end it, in V3/R1's form or in V3.1's (name before the separator, bare JSON after)."""
    from tether.agents.formats import FORMATS, same_calls

    calls = [{"name": "write_file", "arguments": {"path": "README.md", "content": "Use:\n```python\nprint(1)\n```\n"}}]
    for name, fmt in FORMATS.items():
        assert same_calls(fmt.parse(fmt.write(calls))[1], calls), name
    v31 = (
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>write_file<｜tool▁sep｜>"
        '{"content": "```x```"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>'
    )
    assert FORMATS["deepseek"].parse(v31)[1] == [{"name": "write_file", "arguments": {"content": "```x```"}}]
    broken = '<｜tool▁call▁begin｜>function<｜tool▁sep｜>add\n```json\n{"a": 2\n```<｜tool▁call▁end｜>'
    assert "not valid JSON" in FORMATS["deepseek"].parse(broken)[1][0]["error"]


def test_a_json_answer_with_a_name_is_not_an_untagged_llama_call():
    """Llama 3's untagged call is {"name", "parameters"} (or "arguments"); a final answer that is JSON with a "name"
    is an answer, in a Llama run and when another family's run looks for a foreign format."""
    from tether.agents.formats import FORMATS, foreign_format

    answer = '{"name": "Alice", "age": 31}'
    assert FORMATS["llama3_json"].parse(answer) == (answer, [])
    assert not FORMATS["llama3_json"].looks_like_call(answer)
    assert foreign_format(answer, FORMATS["hermes"]) is None
    call = '{"name": "add", "parameters": {"a": 2}}'
    assert FORMATS["llama3_json"].parse(call)[1] == [{"name": "add", "arguments": {"a": 2}}]
    assert foreign_format(call, FORMATS["hermes"]) == "llama3_json"


def test_tool_schema_from_the_signature_and_docstring():
    assert tool_schema(add) == {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a"],
            },
        },
    }


def test_tool_schema_maps_containers_optionals_literals_and_omits_a_type_it_cannot_map():
    from typing import Literal, Optional

    class Point:  # a type JSON has no name for
        pass

    def search(
        queries: list[str],
        limit: Optional[int] = None,
        exact: bool | None = None,
        scale: float = 1.0,
        pair: tuple[int, int] = (0, 0),
        mode: Literal["fast", "slow"] = "fast",
        options: dict[str, int] | None = None,
        where: Point | None = None,
        tags: list = (),
    ) -> str:
        """Search."""

    properties = tool_schema(search)["function"]["parameters"]["properties"]
    assert properties == {
        "queries": {"type": "array", "items": {"type": "string"}},
        "limit": {"type": "integer"},
        "exact": {"type": "boolean"},
        "scale": {"type": "number"},
        "pair": {"type": "array", "items": {"type": "integer"}},
        "mode": {"enum": ["fast", "slow"], "type": "string"},
        "options": {"type": "object"},
        "where": {},
        "tags": {"type": "array"},
    }

    def unresolved(a: "Undefined", b: "not valid (") -> str:  # noqa: F821, F722 - annotations that do not resolve
        """Search."""

    assert tool_schema(unresolved)["function"]["parameters"]["properties"] == {"a": {}, "b": {}}  # no type, no crash


def test_failed_calls_are_observations_not_crashes(caplog):
    from tether.agents import tools

    tools.WARNED.discard("broken")
    env = EchoTools()
    env.reset({"prompt": "go"})
    result = env.step(
        '<tool_call>{"name": "echo", "arguments": {"text": "hi"}}</tool_call>'
        '<tool_call>{"name": "nope", "arguments": {}}</tool_call>'
        '<tool_call>{"name": "add", "arguments": {"c": 1}}</tool_call>'
        '<tool_call>{"name": "broken", "arguments": {"x": "y"}}</tool_call>'
        "<tool_call>{oops}</tool_call>"
    )
    contents = [m["content"] for m in result.messages]
    assert contents[0] == "HI" and all(c.startswith("error: ") for c in contents[1:])
    assert "there is no tool 'nope'" in contents[1] and "add:" in contents[2]
    assert "broken raised ValueError: out of order" in contents[3] and "not valid JSON" in contents[4]
    assert [m["role"] for m in result.messages] == ["tool"] * 5 and not result.done
    assert result.info["calls"] == [
        {"name": "echo", "ok": True},
        {"name": "nope", "ok": False},
        {"name": "add", "ok": False},
        {"name": "broken", "ok": False},
        {"name": "?", "ok": False},
    ]
    final = env.step("ECHO done.")
    assert final.done and env.outcome() == Outcome({"answered": 1.0}, True, None)
    env.step('<tool_call>{"name": "broken", "arguments": {"x": "z"}}</tool_call>')
    warned = [r.getMessage() for r in caplog.records if "raised" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith("tool broken raised ValueError: out of order")  # once a tool


def scripted_episodes(long_llama, turns, env=f"{HELPERS}:EchoTools(describe_tools=False)", rows=None, **kw):
    tok = load_tokenizer(long_llama)
    sampler = AgentSampler(agent_cfg(env, **kw), tok, ScriptedBackend(tok, turns), SAMPLING, [tok.eos_token_id])
    rows = rows or [{"prompt": "Shout hi."}, {"prompt": "Shout ok."}]
    return tok, sampler, sampler(rows)


def test_the_loss_mask_covers_exactly_the_policy_tokens(long_llama):
    call = '<tool_call>{"name": "echo", "arguments": {"text": "hi"}}</tool_call>'
    tok, sampler, (rollout, scores) = scripted_episodes(long_llama, [call, "ECHO HI"])
    ids, mask, attention = rollout.response_ids[0], rollout.response_mask[0], rollout.attention[0]
    n = int(attention.sum())
    policy = tok.decode(ids[:n][mask[:n].bool()], skip_special_tokens=False)
    env = tok.decode(ids[:n][~mask[:n].bool()], skip_special_tokens=False)
    assert policy == call + "<|im_end|>" + "ECHO HI" + "<|im_end|>"  # both turns, each with its stop token
    assert env == "\n<|im_start|>tool\nHI<|im_end|>\n<|im_start|>assistant\n"  # template glue + tool message
    # prompt + transcript is exactly the chat template's rendering of the whole conversation
    conversation = [
        {"role": "user", "content": "Shout hi."},
        {"role": "assistant", "content": call},
        {"role": "tool", "content": "HI"},
        {"role": "assistant", "content": "ECHO HI"},
    ]
    whole = tok.apply_chat_template(conversation, tokenize=False)
    prompt = tok.decode(rollout.prompt_ids[0][rollout.prompt_mask[0].bool()], skip_special_tokens=False)
    assert prompt + tok.decode(ids[:n], skip_special_tokens=False) + "\n" == whole
    assert rollout.lengths.tolist() == [int(mask.sum())] * 2 and not rollout.truncated.any()
    assert scores.total.tolist() == [1.0, 1.0] and scores.step_scores == [[0.0, 0.0]] * 2
    ends = scores.step_ends[0]
    assert [int(mask[e]) for e in ends] == [1, 1] and int(ids[ends[0]]) == tok.eos_token_id
    record = scores.records[0]
    assert record["turns"] == 2 and record["calls"] == {"echo": 1} and record["end"] == "done"
    assert record["success"] is True and record["env_tokens"] == int((attention - mask)[:n].sum())


def test_log_probs_across_turns_equal_one_forward_over_the_transcript(long_llama):
    call = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    tok, sampler, (rollout, scores) = scripted_episodes(long_llama, [call, call, "It is 5."])
    model = load_model(long_llama, tok)
    with torch.no_grad():
        whole = response_logprobs(model, rollout, temperature=0.7)  # one forward, as the update computes them
    prompt = rollout.prompt_ids[0][rollout.prompt_mask[0].bool()].tolist()
    ids, mask = rollout.response_ids[0].tolist(), rollout.response_mask[0].tolist()
    checked = 0
    with torch.no_grad():
        for t, is_action in enumerate(mask):  # each policy token under the context it was sampled in
            if not is_action:
                continue
            logits = model(torch.tensor([prompt + ids[:t]])).logits[0, -1].float() / 0.7
            expected = torch.log_softmax(logits, -1)[ids[t]]
            assert abs(float(whole[0, t]) - float(expected)) < 1e-4
            checked += 1
    assert checked == sum(mask) and scores.records[0]["turns"] == 3 and scores.records[0]["calls"] == {"add": 2}
    assert float(whole[0][torch.tensor(mask) == 0].abs().sum()) == 0.0  # environment tokens carry no log-prob


def test_turn_and_token_budgets_end_episodes_marked_truncated(long_llama):
    call = '<tool_call>{"name": "echo", "arguments": {"text": "hi"}}</tool_call>'
    _, _, (rollout, scores) = scripted_episodes(long_llama, [call], max_turns=2)
    assert rollout.truncated.all() and scores.records[0]["end"] == "turns" and scores.records[0]["turns"] == 2
    _, _, (rollout, scores) = scripted_episodes(long_llama, [call], max_total_tokens=40)
    assert rollout.truncated.all() and scores.records[0]["end"] == "tokens"
    assert int(rollout.attention[0].sum()) <= 40


def test_environment_faults_stop_or_are_scored_and_counted(long_llama):
    with pytest.raises(EnvironmentFault, match="Counting.step raised RuntimeError: the environment broke"):
        scripted_episodes(long_llama, ["a"], env=f"{HELPERS}:Counting(fail_at=2)")
    _, sampler, (rollout, scores) = scripted_episodes(
        long_llama, ["a"], env=f"{HELPERS}:Counting(fail_at=2)", env_on_error="score"
    )
    assert sampler.error_counts() == {"env": 2} and scores.total.tolist() == [-1.0, -1.0]
    assert scores.records[0]["end"] == "error" and "broke" in scores.records[0]["error"]
    _, sampler, (_, scores) = scripted_episodes(
        long_llama,
        ["a"],
        env=f"{HELPERS}:Counting(hang_at=1)",
        env_on_error="score",
        env_timeout=0.2,
        rows=[{"prompt": "x"}],
    )
    assert sampler.error_counts() == {"env": 1} and "within 0.2 s" in scores.records[0]["error"]
    with pytest.raises(ConfigError, match="no file"):
        scripted_episodes(long_llama, ["a"], env="missing.py:Env")


ODD_ENV = """
from tether.agents.environment import Outcome, StepResult

class Odd:
    def __init__(self, kind):
        self.kind = kind
    def reset(self, row):
        return [{"role": "user", "content": row["prompt"]}]
    def step(self, text):
        if self.kind == "silent":
            return StepResult(done=False)
        if self.kind == "no content":
            return StepResult([{"role": "user"}])
        return StepResult([{"role": "user", "content": "ok"}], info=["searched"] if self.kind == "info" else {"calls": ["search"]})
    def outcome(self):
        return Outcome({"r": 1.0})
"""


@pytest.mark.parametrize(
    "kind, error",
    [
        ("silent", "Odd.step: done=False with no messages"),
        ("no content", r"Odd.step: message 0 \(user\) must have a 'content' string, and has none"),
        ("info", "Odd.step: info must be a dict, not list"),
        ("calls", r"Odd.step: info\['calls'\] must be a list of .* dicts, not \"\['search'\]\""),
    ],
)
def test_an_environment_answer_the_run_cannot_use_is_a_fault_naming_the_field(long_llama, tmp_path, kind, error):
    """An answer that would crash the run (no message to continue with, info that is not a dict or calls that are
    not dicts) or render an empty turn (a message without content) is the environment's fault: it stops the run
    naming the environment and the field, or under env_on_error=score ends that episode scored."""
    path = tmp_path / "odd_env.py"
    path.write_text(ODD_ENV)
    env = f"{path}:Odd(kind={kind!r})"
    with pytest.raises(EnvironmentFault, match=error):
        scripted_episodes(long_llama, ["a"], env=env, rows=[{"prompt": "x"}])
    _, sampler, (_, scores) = scripted_episodes(
        long_llama, ["a"], env=env, env_on_error="score", rows=[{"prompt": "x"}]
    )
    assert sampler.error_counts() == {"env": 1} and scores.total.tolist() == [-1.0]
    assert scores.records[0]["end"] == "error"


def test_evaluation_agent_rates_over_processes_are_over_all_judged_episodes():
    """Two processes' shares of 8 held-out episodes: the first judges 2 (1 success; 2 claims, 1 true), the second
    all 4 (4 successes; 1 claim). Success is 5 of the 6 judged = 5/6 and claims 2 of 3 = 2/3, not the mean of the
    shares' rates weighted by their sizes ((0.5 * 4 + 1.0 * 4) / 8 = 0.75 for both); turns (4 x 1 + 4 x 2) / 8."""
    from tether.train.sampling import agent_eval_sums, eval_figures

    def rec(success, claimed, turns=1):
        end = "error" if success is None else "done"
        return {"turns": turns, "calls": {}, "end": end, "success": success, "claimed": claimed}

    first = [rec(True, True), rec(None, None), rec(None, None), rec(False, False)]
    second = [rec(True, True, 2), rec(True, None, 2), rec(True, None, 2), rec(True, None, 2)]
    shares = [agent_eval_sums(first), agent_eval_sums(second)]
    summed = {k: shares[0][k] + shares[1][k] for k in shares[0]}  # what dp.sum_dict does across the processes
    figures = eval_figures(summed, 8)
    assert figures == {
        "eval/agent/turns_mean": 1.5,
        "eval/agent/tool_calls_mean": 0.0,
        "eval/agent/success_rate": 5 / 6,
        "eval/agent/claimed_rate": 2 / 3,
    }
    assert "eval/agent/claimed_rate" not in eval_figures(agent_eval_sums([rec(True, None)]), 1)


@pytest.mark.parametrize("timeout,concurrency", [(5.0, 2), (0.0, 1)])
def test_an_async_client_opened_in_reset_serves_every_later_call(long_llama, timeout, concurrency):
    """One event loop for the environment's run: a connection opened in an async reset carries both turns' tool
    calls and the outcome's, in every episode, with and without a time limit, one call at a time or several."""
    call = '<tool_call>{"name": "shout", "arguments": {"text": "hi"}}</tool_call>'
    _, sampler, (rollout, scores) = scripted_episodes(
        long_llama,
        [call, call, "HI HI"],
        env=f"{HELPERS}:ConnectedTools",
        env_timeout=timeout,
        env_concurrency=concurrency,
    )
    sampler.close()
    assert [(r["calls"], r["failed_calls"], r["end"]) for r in scores.records] == [({"shout": 2}, 0, "done")] * 2
    assert rollout.responses[0].count("tool: HI") == 2 and scores.total.tolist() == [1.0, 1.0]


def test_per_turn_rewards_and_outcome_are_kept_apart(long_llama):
    _, _, (_, scores) = scripted_episodes(long_llama, ["a", "b", "c"], env=f"{HELPERS}:Counting(turns=3)")
    assert scores.total.tolist() == [3.0, 3.0]  # the outcome
    assert [round(x, 6) for x in scores.step_scores[0]] == [0.1, 0.2, 0.3]  # one step score per turn
    assert torch.allclose(scores.parts["turn"], torch.tensor([0.6, 0.6]))
    figures = agent_metrics(scores.records)
    assert figures["agent/turns_mean"] == 3 and figures["agent/success_rate"] == 1.0
    assert figures["agent/claimed_rate"] == 1.0 and figures["agent/claimed_unverified_rate"] == 0.0


def test_gae_over_the_policy_tokens_skips_the_environment_tokens():
    from tether.algorithms.advantages import compact_actions, expand_actions, gae_advantages, turn_rewards

    mask = torch.tensor([[1, 1, 0, 0, 1, 0]])  # turn 1: tokens 0-1, environment: 2-3, turn 2: token 4
    values = torch.tensor([[0.5, 0.25, 9.0, 9.0, 0.5, 0.0]])  # environment positions' values must not enter
    rewards = turn_rewards([[0.5, 1.0]], [[1, 4]], 6)
    assert rewards.tolist() == [[0, 0.5, 0, 0, 1.0, 0]]
    packed, actions = compact_actions(rewards, mask)
    assert packed.tolist() == [[0, 0.5, 1.0]] and actions.tolist() == [[1, 1, 1]]
    adv, ret = gae_advantages(packed, compact_actions(values, mask)[0], actions, gamma=1.0, lam=1.0)
    # γ = λ = 1: A_t = (sum of rewards from t on) − V_t, across the environment's tokens
    assert torch.allclose(adv, torch.tensor([[1.5 - 0.5, 1.5 - 0.25, 1.0 - 0.5]]))
    assert torch.allclose(expand_actions(adv, mask), torch.tensor([[1.0, 1.25, 0, 0, 0.5, 0]]))


def train_config(stage, model_dir, prompts, out, **extra):
    from tether.stages.grpo_config import GRPOConfig
    from tether.stages.ppo_config import PPOConfig

    overrides = {
        "model.path": str(model_dir),
        "rollout.prompts": str(prompts),
        "rollout.eval_prompts": str(prompts),
        "agent.env": f"{HELPERS}:Counting(turns=3)",
        "agent.max_total_tokens": 64,
        "rollout.prompts_per_step": 2,
        "rollout.group_size": 2,
        "rollout.max_new_tokens": 8,
        "train.max_steps": 4,
        "optim.lr": 1e-3,
        "train.output": str(out),
        "train.eval_every": 4,
        "train.save_every": 2,
        "train.sample_every": 1,
        "train.report_to": ["none"],
    }
    if stage == "ppo":
        overrides.update({"algo.minibatch": 4, "critic.lr": 1e-3})
    overrides.update({k.replace("__", "."): v for k, v in extra.items()})
    return build_config(GRPOConfig if stage == "grpo" else PPOConfig, overrides=overrides)


@pytest.mark.parametrize("stage", ["grpo", "ppo"])
def test_multi_turn_training_runs_logs_agent_figures_and_resumes_exactly(stage, long_llama, tmp_path, monkeypatch):
    from agent_helpers import ShortTurns
    from conftest import killed_after_step, metrics_but_timings

    from tether.stages.grpo import run_grpo
    from tether.stages.ppo import run_ppo

    run = run_grpo if stage == "grpo" else run_ppo
    prompts = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": f"Say {w}."} for w in ("hi", "cats", "dogs", "rain")])
    backend = lambda policy, tok: ShortTurns(policy, tok, length=3)
    summary = run(train_config(stage, long_llama, prompts, tmp_path / "whole"), backend=backend)
    metrics = [json.loads(line) for line in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()]
    assert metrics[0]["agent/turns_mean"] == 3 and metrics[0]["agent/done_frac"] == 1.0
    assert metrics[0]["rollout/length_mean"] == 9  # 3 turns x 3 policy tokens: the tool messages are not counted
    assert metrics[0]["agent/env_tokens_mean"] > 0 and abs(metrics[0]["reward/turn/mean"] - 0.6) < 1e-6
    assert summary["eval_history"][-1]["eval/agent/success_rate"] == 1.0
    sample = json.loads((tmp_path / "whole" / "samples.jsonl").read_text().splitlines()[0])
    assert sample["agent"]["turns"] == 3 and "tool: obs 1" in sample["response"]
    with killed_after_step(monkeypatch, 3), pytest.raises(KeyboardInterrupt):
        run(train_config(stage, long_llama, prompts, tmp_path / "killed"), backend=backend)
    assert (
        run(train_config(stage, long_llama, prompts, tmp_path / "killed", train__resume=True), backend=backend)[
            "resumed_from"
        ]
        == 2
    )
    assert metrics_but_timings(tmp_path / "killed") == metrics_but_timings(tmp_path / "whole")


def test_an_agent_run_audits_its_episodes_transcripts(long_llama, tmp_path):
    """--audit with --env at share 1: every training episode's readable transcript is scored (Counting answers each
    of 3 turns with "obs N", so the count of "tool: obs" is 3 in each of the 2 × 2 episodes), never the held-out
    ones; the proxy is what an episode earned: outcome 3 + turn rewards 0.1 + 0.2 + 0.3 = 3.6 (in float32)."""
    from agent_helpers import ShortTurns

    from tether.stages.grpo import run_grpo

    prompts = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": f"Say {w}."} for w in ("hi", "cats")])
    (tmp_path / "audit.py").write_text(
        "def seen(completions, prompts):\n    return [float(c.count('tool: obs')) for c in completions]\n"
    )
    cfg = train_config(
        "grpo",
        long_llama,
        prompts,
        tmp_path / "run",
        train__max_steps=2,
        train__eval_every=2,
        rewards__audit=f"{tmp_path / 'audit.py'}:seen",
        rewards__audit_share=1.0,
    )
    run_grpo(cfg, backend=lambda policy, tok: ShortTurns(policy, tok, length=3))
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    proxy = float(torch.tensor(3.0) + torch.tensor([0.1, 0.2, 0.3]).sum())
    for m in metrics:
        assert (m["audit/n"], m["audit/none"], m["audit/score_mean"], m["audit/score_std"]) == (4, 0, 3.0, 0.0)
        assert m["audit/proxy_mean"] == pytest.approx(proxy, rel=1e-6) and m["audit/proxy_std"] < 1e-6
    assert metrics[-1]["eval/audit_n"] == 8  # the two steps' episodes, none of the held-out ones
    plan = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["plan"]
    assert "audited by seen on 100% of the training episodes" in plan["reward"]


def test_env_and_a_reward_model_together_are_refused_and_functions_accepted(tmp_path):
    with pytest.raises(ConfigError, match="--reward-model is not used with it"):
        train_config("grpo", tmp_path, tmp_path / "p.jsonl", tmp_path / "o", rewards__reward_model=str(tmp_path))
    cfg = train_config("grpo", tmp_path, tmp_path / "p.jsonl", tmp_path / "o", rewards__reward=["x.py:f"])
    assert cfg.rewards.reward == ["x.py:f"]


# ------------------------------------------------------------------------------------------------ agent monitors


def episode_sample(step, calls=None, success=True, claimed=None, turns=1, score=1.0, final="The answer is 1."):
    return {
        "step": step,
        "response": f"assistant: {final}",
        "score": score,
        "length": 10,
        "agent": {
            "turns": turns,
            "calls": calls or {},
            "failed_calls": 0,
            "end": "done",
            "success": success,
            "claimed": claimed,
            "final": final,
            "final_tokens": 5,
            "env_tokens": 0,
        },
    }


def agent_rows(calls, success, turns=None):
    return [
        {"step": i + 1, "agent/tool_calls_mean": c, "agent/success_rate": s, "agent/turns_mean": (turns or [1] * 99)[i]}
        for i, (c, s) in enumerate(zip(calls, success))
    ]


def test_tool_call_spam_fires_when_calls_rise_without_success_and_not_when_success_rises():
    from tether.diagnostics.agent_monitors import tool_call_spam
    from tether.diagnostics.monitors import MonitorSettings

    calls = [0.5] * 5 + [1, 1.5, 2, 2.5, 3, 3, 3.5, 4]
    spam = tool_call_spam(agent_rows(calls, [0.4] * 13), [], MonitorSettings())
    assert [a.monitor for a in spam] == ["tool_call_spam"] and spam[0].step == 10
    assert spam[0].statistics["calls_per_episode_at_start"] == 0.5 and spam[0].statistics["calls_per_episode"] == 2.0
    learning = [0.4] * 5 + [0.5, 0.6, 0.7, 0.8, 0.9, 0.9, 0.9, 0.9]  # the calc stage: calls rise and so does success
    assert tool_call_spam(agent_rows(calls, learning), [], MonitorSettings()) == []
    assert tool_call_spam(agent_rows([0.5] * 13, [0.4] * 13), [], MonitorSettings()) == []


def test_turn_piling_fires_on_turns_without_success():
    from tether.diagnostics.agent_monitors import turn_piling
    from tether.diagnostics.monitors import MonitorSettings

    turns = [1.0] * 5 + [1.5, 2, 2.5, 3, 3.5, 4]
    alarm = turn_piling(agent_rows([0] * 11, [0.3] * 11, turns), [], MonitorSettings())
    assert alarm and alarm[0].monitor == "turn_piling" and alarm[0].step == 10
    assert turn_piling(agent_rows([0] * 11, [0.3] * 11, [2.0] * 11), [], MonitorSettings()) == []


def test_tool_dominance_fires_on_one_tool_taking_over_and_stays_quiet_with_one_tool():
    from tether.diagnostics.agent_monitors import tool_dominance
    from tether.diagnostics.monitors import MonitorSettings

    start = [episode_sample(1, {"search": 1, "ping": 1}, success=False) for _ in range(12)]
    taken = [episode_sample(6, {"ping": 3}, success=False) for _ in range(12)]
    alarm = tool_dominance([], start + taken, MonitorSettings())
    assert alarm and alarm[0].statistics["subject"] == "ping" and alarm[0].statistics["share"] == 1.0
    assert alarm[0].statistics["share_at_start"] == 0.5 and alarm[0].samples[0]["calls"] == {"ping": 3}
    only_calc = [episode_sample(st, {"calc": 1}, success=False) for st in (1, 6) for _ in range(20)]
    assert tool_dominance([], only_calc, MonitorSettings()) == []  # one tool from the start: nothing took over
    improving = start + [episode_sample(6, {"ping": 3}, success=True) for _ in range(12)]
    assert tool_dominance([], improving, MonitorSettings()) == []  # converging on the right tool while succeeding


def test_claimed_without_state_fires_on_unverified_claims_only():
    from tether.diagnostics.agent_monitors import claimed_without_state
    from tether.diagnostics.monitors import MonitorSettings

    honest = [episode_sample(1, success=i < 12, claimed=i < 12) for i in range(16)]
    hacked = [episode_sample(5, success=i < 4, claimed=True) for i in range(16)]
    alarm = claimed_without_state([], honest + hacked, MonitorSettings())
    assert alarm and alarm[0].step == 5 and alarm[0].statistics["claimed_unverified"] == 0.75
    assert all(s["claimed"] and not s["success"] for s in alarm[0].samples)
    learning = honest + [episode_sample(5, success=True, claimed=True) for _ in range(16)]
    assert claimed_without_state([], learning, MonitorSettings()) == []
    # already half hacked at the first sample step: 2x is out of reach, the rise still counts
    early = [episode_sample(1, success=i < 8, claimed=True) for i in range(16)]
    late = [episode_sample(5, success=i < 1, claimed=True) for i in range(16)]
    alarm = claimed_without_state([], early + late, MonitorSettings())
    assert alarm and alarm[0].statistics["claimed_unverified_at_start"] == 0.5
    assert (
        claimed_without_state(
            [], early + [episode_sample(5, success=i < 6, claimed=True) for i in range(16)], MonitorSettings()
        )
        == []
    )  # +12.5 points: within the noise allowed


def test_text_monitors_read_an_episodes_final_answer_not_its_tool_traffic():
    from tether.diagnostics.monitors import MonitorSettings, length_correlation, phrase_surge

    calm = [episode_sample(1, final="The answer is 3.") for _ in range(16)]
    tooled = [
        dict(
            episode_sample(2, {"calc": 1}, final="The answer is 3."),
            response='assistant: <tool_call>{"name":"calc"}</tool_call>\ntool: 3\nassistant: The answer is 3.',
            length=40,
            score=float(i % 2),
        )
        for i in range(16)
    ]
    assert phrase_surge([], calm + tooled, MonitorSettings()) == []
    assert length_correlation([], calm + tooled, MonitorSettings()) == []


def test_the_worked_example_of_docs_agents_md_runs(long_llama, tmp_path):
    """The NotesEnv of docs/agents.md, as printed there: a save call, then a reply; success is read from the store."""
    import re
    from pathlib import Path

    page = (Path(__file__).parent.parent / "docs" / "agents.md").read_text()
    code = next(block for block in re.findall(r"```python\n(.*?)```", page, re.DOTALL) if "class NotesEnv" in block)
    (tmp_path / "notes_env.py").write_text(code)
    call = '<tool_call>{"name": "save_note", "arguments": {"title": "milk", "text": "buy 2"}}</tool_call>'
    rows = [
        {"prompt": "Note: milk, buy 2.", "title": "milk", "text": "buy 2"},
        {"prompt": "Note: eggs, buy 6.", "title": "eggs", "text": "buy 6"},
    ]
    _, _, (rollout, scores) = scripted_episodes(
        long_llama, [call, "Saved."], env=f"{tmp_path}/notes_env.py:NotesEnv", rows=rows
    )
    assert scores.total.tolist() == [1.0, 0.0]  # the second note was saved under the wrong title
    assert [r["success"] for r in scores.records] == [True, False] and [r["claimed"] for r in scores.records] == [
        True
    ] * 2
    assert "tool: saved 'milk'" in rollout.responses[0] and "You may call functions" in rollout.prompts[0]


def test_a_template_that_takes_tools_lists_them_itself(long_llama):
    tok = load_tokenizer(long_llama)
    tok.chat_template = (
        "{% if tools %}<|im_start|>system\n{% for t in tools %}{{ t['function']['name'] }};"
        "{% endfor %}<|im_end|>\n{% endif %}" + tok.chat_template
    )
    sampler = AgentSampler(
        agent_cfg(f"{HELPERS}:EchoTools"), tok, ScriptedBackend(tok, ["ECHO"]), SAMPLING, [tok.eos_token_id]
    )
    rollout, _ = sampler([{"prompt": "hi"}])
    assert rollout.prompts[0].startswith("<|im_start|>system\necho;add;broken;<|im_end|>")
    assert "You may call functions" not in rollout.prompts[0]  # not listed twice


def test_a_run_written_before_the_agent_section_resumes_and_refuses_a_new_env(long_llama, tmp_path):
    import shutil

    import yaml

    from tether.stages.grpo import run_grpo

    (tmp_path / "rules.py").write_text("def size(completions):\n    return [float(len(c)) for c in completions]\n")
    prompts = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": f"Say {w}."} for w in ("hi", "cats")])
    out = tmp_path / "run"
    cfg = lambda **kw: train_config(
        "grpo",
        long_llama,
        prompts,
        out,
        agent__env="",
        rewards__reward=[f"{tmp_path}/rules.py:size"],
        agent__max_total_tokens=512,
        train__max_steps=4,
        train__keep_checkpoints=2,
        **kw,
    )
    run_grpo(cfg())
    saved = yaml.safe_load((out / "config.yaml").read_text())
    del saved["agent"]  # as a tether without agents wrote it
    (out / "config.yaml").write_text(yaml.safe_dump(saved, sort_keys=False))
    shutil.rmtree(out / "checkpoint-4")
    shutil.rmtree(out / "final")
    with pytest.raises(ConfigError, match="agent.max_turns: 4 -> 2"):
        run_grpo(cfg(train__resume=True, agent__max_turns=2))
    assert run_grpo(cfg(train__resume=True))["resumed_from"] == 2


def test_a_template_that_rewrites_earlier_turns_is_continued_and_the_plan_says_so(long_llama):
    tok = load_tokenizer(long_llama)
    # like templates that strip the reasoning of earlier turns: only the last message keeps its content
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if loop.last %}{{ m['content'] }}"
        "{% else %}...{% endif %}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    call = '<tool_call>{"name": "echo", "arguments": {"text": "hi"}}</tool_call>'
    sampler = AgentSampler(
        agent_cfg(f"{HELPERS}:EchoTools(describe_tools=False)"),
        tok,
        ScriptedBackend(tok, [call, "ECHO HI"]),
        SAMPLING,
        [tok.eos_token_id],
        [{"prompt": "hi"}],
    )
    rollout, scores = sampler([{"prompt": "hi"}])
    assert scores.records[0]["calls"] == {"echo": 1} and scores.records[0]["end"] == "done"
    ids, mask = rollout.response_ids[0], rollout.response_mask[0].bool()
    assert (
        tok.decode(ids[~mask], skip_special_tokens=False) == "\n<|im_start|>tool\nHI<|im_end|>\n<|im_start|>assistant\n"
    )
    assert "re-renders a finished episode differently" in sampler.plan()["template note"]


def test_an_environment_failing_late_checkpoints_and_resumes_scoring_its_faults(long_llama, tmp_path):
    import agent_helpers
    from agent_helpers import ShortTurns

    from tether.stages.grpo import run_grpo

    prompts = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": f"Say {w}."} for w in ("hi", "cats", "dogs", "rain")])
    backend = lambda policy, tok: ShortTurns(policy, tok, length=3)
    cfg = lambda **kw: train_config(
        "grpo",
        long_llama,
        prompts,
        tmp_path / "run",
        agent__env=f"{HELPERS}:FailsAfter(calls=30)",
        train__save_every=0,
        **kw,
    )
    agent_helpers.STEP_CALLS["n"] = 0
    with pytest.raises(
        ConfigError,
        match=r"step 2: environment FailsAfter.step raised ConnectionError: the service went "
        r"away .*checkpoint-1: fix the environment .*--env-on-error score",
    ):
        run_grpo(cfg(), backend=backend)  # evaluation and step 1 take 12 step() calls each, step 2 fails
    agent_helpers.STEP_CALLS["n"] = 0
    summary = run_grpo(cfg(train__resume=True, agent__env_on_error="score"), backend=backend)
    assert summary["resumed_from"] == 1
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3, 4] and metrics[-1]["reward/env/errors"] > 0


BAD_SPECS = """
from tether.agents.environment import Outcome, StepResult


class NoStep:
    def reset(self, row):
        return [{"role": "user", "content": row["prompt"]}]

    def outcome(self):
        return Outcome()


class NoReset:
    def step(self, text):
        return StepResult(done=True)

    def outcome(self):
        return Outcome()


class Stepper:
    def step(self, text):
        return StepResult(done=True)


def make_stepper():
    return Stepper()


def raising_parser(text):
    raise ValueError("cannot read this")


def dict_parser(text):
    return {"name": "echo"}
"""


BAD = "{bad}"  # the file above, written in the test's folder
BAD_CASES = {
    "no step": ((f"{BAD}:NoStep",), "NoStep has no step() method; an environment defines reset(row)"),
    "no reset": ((f"{BAD}:NoReset",), "NoReset has no reset() method"),
    "a factory": ((f"{BAD}:make_stepper",), "what it makes (Stepper) has no reset() and no outcome() method"),
    "malformed": (
        (f"{BAD}:NoStep(difficulty=",),
        "a malformed spec; the form is module:class or path/file.py:class, with arguments class(name=literal, ...)",
    ),
    "parser raises": (
        (f"{HELPERS}:EchoTools", "--tool-parser", f"{BAD}:raising_parser"),
        f"--tool-parser {BAD}:raising_parser raised ValueError: cannot read this on the turn",
    ),
    "parser returns a dict": (
        (f"{HELPERS}:EchoTools", "--tool-parser", f"{BAD}:dict_parser"),
        f"--tool-parser {BAD}:dict_parser returned \"{{'name': 'echo'}}\" (dict) for the turn",
    ),
}


@pytest.mark.parametrize("case", list(BAD_CASES))
def test_bad_environments_parsers_and_specs_are_one_line_before_any_model_loads(case, llama_dir, tmp_path, capsys):
    import shutil

    from tether.cli import main

    model = shutil.copytree(llama_dir, tmp_path / "m")
    (model / "model.safetensors").write_bytes(b"not weights: every check must refuse before anything loads them")
    (tmp_path / "bad.py").write_text(BAD_SPECS)
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "Say hi."}])
    (env, *more), message = BAD_CASES[case]
    bad = f"{tmp_path}/bad.py"
    argv = ["grpo", "--model", str(model), "--prompts", str(prompts), "--output", str(tmp_path / "o"), "--env", env]
    assert main([a.replace(BAD, bad) for a in argv + more]) == 2
    err = capsys.readouterr().err
    assert message.replace(BAD, bad) in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    if "parser" in case:
        assert 'returns its calls: a list of {"name": str, "arguments": dict}' in err
