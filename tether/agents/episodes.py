"""Multi-turn episodes on the online loop (docs/agents.md): batched across conversations, the transcript kept as
the exact tokens the policy sampled, with the environment's tokens in between as context, not actions.

A turn: every live episode's transcript (prompt + turns so far, as token ids) is continued by one batched
generate call; each episode's new tokens up to its stop token are the policy's turn, whose text goes to its
environment; the environment's answer is rendered through the model's chat template and appended as tokens with
action mask 0. Finished episodes drop out of the batch. An episode ends when its environment says done, after
max_turns policy turns, or when its transcript would pass max_total_tokens (then it is marked truncated).

The episodes become one Rollout: response_ids is each transcript after the prompt, response_mask marks the
policy's tokens (the loss, the KL and the entropy are taken over them only), response_attention every token.
One forward over the whole transcript gives the log-prob of every policy token under exactly the context it was
sampled in (tests/test_agents.py checks it against the per-turn sampling forwards).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch

from tether.agents.environment import (
    EnvironmentFault,
    GuardedCall,
    Outcome,
    StepResult,
    check_messages,
    check_parts,
    environment_name,
    load_environment,
)
from tether.config import ConfigError
from tether.data.sft import template_takes_tools
from tether.rewards.score import Scores
from tether.rollout.batch import Rollout, left_pad


class Transcript:
    """A conversation rendered through the chat template, continued turn by turn: the environment's messages
    become the tokens the template puts between the policy's turn and the next generation prompt."""

    def __init__(self, tokenizer, messages: list[dict], tools: list[dict] | None = None):
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError(
                "--env: episodes are chat conversations, and the tokenizer has no chat template to render "
                "them (use a model folder whose tokenizer_config.json has a chat_template)"
            )
        self.tokenizer, self.messages, self.tools = tokenizer, list(messages), tools
        self.text = self.render(self.messages, True)
        self.prompt_ids = tokenizer(self.text, add_special_tokens=False)["input_ids"]

    def render(self, messages: list[dict], generation_prompt: bool) -> str:
        extra = {"tools": self.tools} if self.tools else {}
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation_prompt, **extra
        )

    def continue_with(self, turn_ids: list[int], turn_text: str, observations: list[dict]) -> list[int]:
        """The token ids that follow the policy's turn (sampled as ``turn_ids``, ending with its stop token): the
        template's end of the turn, the environment's messages and the next generation prompt."""
        assistant = {"role": "assistant", "content": turn_text}
        with_turn = self.render(self.messages + [assistant], False)
        after = self.render(self.messages + [assistant] + observations, True)
        if not with_turn.startswith(self.text) or not after.startswith(with_turn):
            raise ConfigError(
                "the chat template does not render a conversation as the prefix of its continuation "
                "(it rewrites earlier turns), so a multi-turn transcript cannot be extended token by "
                "token; use a template that keeps earlier turns as they were"
            )
        rendered_turn = with_turn[len(self.text) :]
        sampled = self.tokenizer.decode(turn_ids, skip_special_tokens=False)
        if rendered_turn.startswith(sampled):
            glue = rendered_turn[len(sampled) :]  # what the template adds after the stop token (a newline...)
        else:  # the template reformatted the turn's text; the tokens stay as sampled, the rest follows its end marker
            marker = self.tokenizer.decode(turn_ids[-1:], skip_special_tokens=False)
            at = rendered_turn.rfind(marker) if marker else -1
            glue = rendered_turn[at + len(marker) :] if at >= 0 else ""
        self.messages += [assistant] + observations
        self.text = after
        return self.tokenizer(glue + after[len(with_turn) :], add_special_tokens=False)["input_ids"]


@dataclass
class Episode:
    """One conversation: its transcript after the prompt, which tokens are the policy's, and what happened."""

    row: dict
    transcript: Transcript | None = None
    env: object = None
    ids: list[int] = field(default_factory=list)  # transcript tokens after the prompt
    actions: list[int] = field(default_factory=list)  # 1 on the policy's tokens
    sampler_logprobs: list[float] | None = None  # per token of ids: the sampler's log-prob (0 on the environment's)
    turn_ends: list[int] = field(default_factory=list)  # index in ids of each policy turn's last token
    turn_rewards: list[dict] = field(default_factory=list)  # reward parts earned by each policy turn
    lines: list[str] = field(default_factory=list)  # the readable transcript
    final: str = ""  # the policy's last turn
    final_tokens: int = 0  # its length in tokens
    calls: Counter = field(default_factory=Counter)  # tool calls by name
    failed_calls: int = 0
    end: str = ""  # done | turns | tokens | error: why it ended
    error: str = ""
    outcome: Outcome | None = None

    @property
    def live(self) -> bool:
        return not self.end

    @property
    def truncated(self) -> bool:
        return self.end in ("turns", "tokens")

    def record(self) -> dict:
        """What samples.jsonl keeps of the episode (the agent monitors read it)."""
        o = self.outcome or Outcome()
        return {
            "turns": len(self.turn_ends),
            "calls": dict(self.calls),
            "failed_calls": self.failed_calls,
            "end": self.end,
            "success": o.success,
            "claimed": o.claimed,
            "final": self.final,
            "final_tokens": self.final_tokens,
            "env_tokens": len(self.actions) - sum(self.actions),
            **({"error": self.error} if self.error else {}),
        }


class AgentSampler:
    """Episodes in place of sample-then-score for the online stages: __call__(rows, seeds) -> (Rollout, Scores).
    It is also the stage's scorer as far as the loop is concerned (describe, error counts, close)."""

    def __init__(self, agent_cfg, tokenizer, backend, sampling, stops: list[int], check_rows: list[dict] = ()):
        self.cfg, self.tokenizer, self.backend, self.sampling, self.stops = (
            agent_cfg,
            tokenizer,
            backend,
            sampling,
            stops,
        )
        self.factory = load_environment(agent_cfg.env)
        self.name = environment_name(agent_cfg.env)
        self.guard = GuardedCall(self.name, agent_cfg.env_timeout)
        self.errors = 0
        for row in list(check_rows)[:2]:  # a dry reset before any model is used: the spec and the rows fit
            try:
                self.start(row)
            except EnvironmentFault as err:
                raise ConfigError(f"dry run of --env {agent_cfg.env} on the first prompts: {err}") from err

    def describe(self) -> str:
        return (
            f"environment {self.cfg.env}: its outcome and per-turn rewards; up to {self.cfg.max_turns} turns "
            f"and {self.cfg.max_total_tokens} tokens per episode"
        )

    def error_counts(self) -> dict[str, int]:
        return {"env": self.errors}

    def restore_error_counts(self, counts: dict[str, int]) -> None:
        self.errors = counts.get("env", 0)

    def set_progress(self, global_step: int, max_steps: int) -> None:
        pass  # an environment is not told the run's progress (reward functions are: rewards/score.py)

    def close(self) -> None:
        pass

    def start(self, row: dict) -> Episode:
        prompt = row.get("prompt")
        env = self.guard("__init__", self.factory, prompt=prompt)
        tools = None
        if template_takes_tools(self.tokenizer) and getattr(env, "schemas", None):
            env.describe_tools, tools = False, env.schemas  # the template lists the tools in its own format
        messages = check_messages(self.guard("reset", env.reset, row, prompt=prompt), self.name, "reset")
        return Episode(row, Transcript(self.tokenizer, messages, tools), env)

    def fail(self, episode: Episode, err: EnvironmentFault) -> None:
        if self.cfg.env_on_error == "raise":
            raise err
        self.errors += 1
        episode.end, episode.error = "error", str(err)

    def __call__(self, rows: list[dict], seeds: list[int] | None = None, greedy: bool = False):
        episodes = self.run(rows, seeds, greedy)
        return self.rollout(episodes), self.scores(episodes)

    def run(self, rows: list[dict], seeds: list[int] | None = None, greedy: bool = False) -> list[Episode]:
        cfg = self.cfg
        episodes = []
        for row in rows:
            try:
                episodes.append(self.start(row))
            except EnvironmentFault as err:
                episodes.append(Episode(row))
                self.fail(episodes[-1], err)
        for turn in range(cfg.max_turns):
            live = [(k, e) for k, e in enumerate(episodes) if e.live]
            if not live:
                break
            budgets = [min(self.sampling.max_new_tokens, cfg.max_total_tokens - len(e.ids)) for _, e in live]
            turn_seeds = [seeds[k] + 1_000_003 * turn for k, _ in live] if seeds is not None else None
            out = self.backend.generate_ids(
                [e.transcript.prompt_ids + e.ids for _, e in live],
                self.sampling,
                self.stops,
                turn_seeds,
                max(budgets),
                greedy,
            )
            for j, (_, e) in enumerate(live):
                n = int(out.response_mask[j].sum())
                ids = out.response_ids[j, :n].tolist()
                stopped = not bool(out.truncated[j])
                if len(ids) > budgets[j]:  # the batch's budget is the largest; this episode's is its own
                    ids, stopped = ids[: budgets[j]], False
                if out.sampler_logprobs is not None:  # a backend that is not the trainer (vllm): keep its log-probs
                    e.sampler_logprobs = (e.sampler_logprobs or [0.0] * len(e.ids)) + out.sampler_logprobs[
                        j, : len(ids)
                    ].tolist()
                self.take_turn(e, ids, stopped, turn)
        for e in episodes:
            if e.live:  # cannot happen: the last turn ends every episode; kept as a guard for the invariant
                e.end = "turns"
            if e.end != "error":
                try:
                    o = self.guard("outcome", e.env.outcome, prompt=e.row.get("prompt"))
                    if not isinstance(o, Outcome):
                        raise EnvironmentFault(
                            f"environment {self.name}.outcome must return an Outcome, not {type(o).__name__}"
                        )
                    e.outcome = Outcome(check_parts(o.rewards, self.name, "outcome"), o.success, o.claimed)
                except EnvironmentFault as err:
                    self.fail(e, err)
        return episodes

    def take_turn(self, e: Episode, ids: list[int], stopped: bool, turn: int) -> None:
        """Append the policy's turn, step the environment, append its answer (or end the episode)."""
        tok, cfg = self.tokenizer, self.cfg
        e.ids += ids
        e.actions += [1] * len(ids)
        e.turn_ends.append(len(e.ids) - 1)
        text = tok.decode(ids, skip_special_tokens=True)
        e.final, e.final_tokens = text, len(ids)
        e.lines.append(f"assistant: {text}")
        if not stopped:  # the turn ran out of tokens: the environment never sees a half-written turn
            e.turn_rewards.append({})
            e.end = "tokens"
            return
        try:
            result = self.guard("step", e.env.step, text, prompt=e.row.get("prompt"))
            if not isinstance(result, StepResult):
                raise EnvironmentFault(
                    f"environment {self.name}.step must return a StepResult, not {type(result).__name__}"
                )
            messages = check_messages(result.messages, self.name, "step")
            e.turn_rewards.append(check_parts(result.rewards, self.name, "step"))
        except EnvironmentFault as err:
            e.turn_rewards.append({})
            self.fail(e, err)
            return
        for call in (result.info or {}).get("calls", []):
            e.calls[str(call.get("name", "?"))] += 1
            e.failed_calls += 0 if call.get("ok", True) else 1
        e.lines += [f"{m['role']}: {m.get('content', '')}" for m in messages]
        if result.done:
            e.end = "done"
            return
        if turn + 1 == cfg.max_turns:
            e.end = "turns"
            return
        following = e.transcript.continue_with(ids, text, messages)
        if len(e.ids) + len(following) >= cfg.max_total_tokens:  # no room left for a policy token
            e.end = "tokens"
            return
        e.ids += following
        e.actions += [0] * len(following)
        if e.sampler_logprobs is not None:
            e.sampler_logprobs += [0.0] * len(following)

    def rollout(self, episodes: list[Episode]) -> Rollout:
        pad = self.tokenizer.pad_token_id
        prompt_ids, prompt_mask = left_pad([e.transcript.prompt_ids if e.transcript else [] for e in episodes], pad)
        width = max((len(e.ids) for e in episodes), default=0)
        ids = torch.full((len(episodes), width), pad, dtype=torch.long)
        actions = torch.zeros((len(episodes), width), dtype=torch.long)
        attention = torch.zeros((len(episodes), width), dtype=torch.long)
        sampled = any(e.sampler_logprobs is not None for e in episodes)
        sampler = torch.zeros((len(episodes), width)) if sampled else None
        for i, e in enumerate(episodes):
            n = len(e.ids)
            if n:
                ids[i, :n] = torch.tensor(e.ids)
                actions[i, :n] = torch.tensor(e.actions)
                attention[i, :n] = 1
                if sampler is not None and e.sampler_logprobs is not None:
                    sampler[i, :n] = torch.tensor(e.sampler_logprobs)
        return Rollout(
            prompt_ids,
            prompt_mask,
            ids,
            actions,
            torch.tensor([e.truncated for e in episodes]),
            [e.transcript.text if e.transcript else "" for e in episodes],
            ["\n".join(e.lines) for e in episodes],
            attention,
            sampler,
        )

    def scores(self, episodes: list[Episode]) -> Scores:
        """Outcome parts sum to the total; each turn's parts sum to that turn's step score (a process reward on the
        turn's last token); every part is logged by name (a per-turn part as its sum over the episode)."""
        names = sorted(
            {
                k
                for e in episodes
                for k in ((e.outcome.rewards if e.outcome else {}) | {n: 0 for t in e.turn_rewards for n in t})
            }
        )
        parts = {n: torch.zeros(len(episodes)) for n in names}
        total = torch.zeros(len(episodes))
        steps, ends = [], []
        for i, e in enumerate(episodes):
            outcome = e.outcome.rewards if e.outcome else {}
            for n, v in outcome.items():
                parts[n][i] += v
            for t in e.turn_rewards:
                for n, v in t.items():
                    parts[n][i] += v
            total[i] = self.cfg.env_error_score if e.end == "error" else sum(outcome.values())
            steps.append([sum(t.values()) for t in e.turn_rewards])
            ends.append(list(e.turn_ends))
        return Scores(total, parts, steps, True, step_ends=ends, records=[e.record() for e in episodes])


def agent_metrics(records: list[dict]) -> dict:
    """agent/* of one step's episodes (docs/metrics.md)."""
    n = max(len(records), 1)
    calls = Counter()
    for r in records:
        calls.update(r["calls"])
    total_calls = sum(calls.values())
    out = {
        "agent/turns_mean": sum(r["turns"] for r in records) / n,
        "agent/tool_calls_mean": total_calls / n,
        "agent/failed_calls_mean": sum(r["failed_calls"] for r in records) / n,
        "agent/env_tokens_mean": sum(r["env_tokens"] for r in records) / n,
        "agent/done_frac": sum(r["end"] == "done" for r in records) / n,
        "agent/out_of_turns_frac": sum(r["end"] == "turns" for r in records) / n,
        "agent/out_of_tokens_frac": sum(r["end"] == "tokens" for r in records) / n,
        "agent/top_tool_share": max(calls.values()) / total_calls if total_calls else 0.0,
    }
    for name, count in sorted(calls.items()):
        out[f"agent/calls/{name}"] = count / n
    judged = [r for r in records if r["success"] is not None]
    if judged:
        out["agent/success_rate"] = sum(bool(r["success"]) for r in judged) / len(judged)
    claims = [r for r in records if r["claimed"] is not None]
    if claims:
        out["agent/claimed_rate"] = sum(bool(r["claimed"]) for r in claims) / len(claims)
        both = [r for r in claims if r["success"] is not None]
        if both:
            out["agent/claimed_unverified_rate"] = sum(bool(r["claimed"]) and not r["success"] for r in both) / len(
                both
            )
    return out
