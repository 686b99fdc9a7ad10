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

import inspect
import logging
import math
from collections import Counter
from dataclasses import dataclass, field

import torch

from tether.agents.environment import (
    EnvironmentFault,
    GuardedCall,
    Outcome,
    StepResult,
    check_info,
    check_messages,
    check_parts,
    check_protocol,
    checked_schemas,
    environment_name,
    load_environment,
)
from tether.agents.formats import ID_LENGTH, answer_text, call_id, foreign_format, tool_format
from tether.agents.transcripts import (
    ONE_CALL,
    TemplateError,
    Transcript,
    check_template,
    instruction_writer,
    structured_call,
    tool_replies,
)
from tether.config import ConfigError
from tether.models.chat import takes_tools, template_conversation, template_name, template_text
from tether.models.work import current_section
from tether.rewards.score import Scores, audit_sums
from tether.rollout.batch import Rollout, left_pad

log = logging.getLogger("tether")


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
    final: str = ""  # the policy's last turn, without a thinking model's reasoning
    final_tokens: int = 0  # its length in tokens
    final_ids: list[int] = field(default_factory=list)  # its tokens (what reward functions beside --env read)
    calls: Counter = field(default_factory=Counter)  # tool calls by name
    failed_calls: int = 0
    calls_made: int = 0  # calls parsed so far (the next call's id)
    unparsed_turns: int = 0  # turns that look like a call in the family's format, none of which parsed
    info: dict = field(default_factory=dict)  # the environment's numbers from StepResult.info, summed over turns
    end: str = ""  # done | turns | tokens | error: why it ended
    error: str = ""
    outcome: Outcome | None = None
    policy_version: int | None = None  # drawn by a rollout worker (agents/worker.py): its weights' version

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
            "unparsed_turns": self.unparsed_turns,
            **({"info": dict(self.info)} if self.info else {}),
            **({"error": self.error} if self.error else {}),
        }


class AgentSampler:
    """Episodes in place of sample-then-score for the online stages: __call__(rows, seeds) -> (Rollout, Scores).
    It is also the stage's scorer as far as the loop is concerned (describe, error counts, close).

    ``reward_set``: reward functions beside the environment (rewards/functions.py), scoring each episode's final
    answer; their weighted scores are added to the environment's outcome, each logged as its own part. ``audit``:
    the trusted check (--audit, a RewardSet of one function) on ``audit_share`` of the training episodes, reading
    each one's readable transcript (samples.jsonl's) and its row — logged as audit/*, never trained on."""

    def __init__(
        self,
        agent_cfg,
        tokenizer,
        backend,
        sampling,
        stops: list[int],
        check_rows: list[dict] = (),
        reward_set=None,
        audit=None,
        audit_share: float = 0.0,
    ):
        self.cfg, self.tokenizer, self.backend, self.sampling = agent_cfg, tokenizer, backend, sampling
        self.factory = load_environment(agent_cfg.env)
        self.name = environment_name(agent_cfg.env)
        self.guard = GuardedCall(self.name, agent_cfg.env_timeout)
        self.concurrency = max(1, int(getattr(agent_cfg, "env_concurrency", 1)))
        self.format, self.format_source = tool_format(
            getattr(agent_cfg, "tool_parser", ""), template_text(tokenizer, tools=True)
        )
        self.stops = list(stops) + [t for t in format_stop_ids(tokenizer, self.format) if t not in stops]
        self.markers = tuple(dict.fromkeys(tokenizer.decode([t]) for t in self.stops))
        self.reward_set, self.audit, self.audit_share = reward_set, audit, audit_share
        self.global_step, self.audit_sums = 0, {}  # the step picks the audited episodes
        self.errors, self.unparsed_warned, self.one_call_per_turn = 0, set(), False
        self.write_calls = instruction_writer(tokenizer, self.format)
        episodes, self.check_rows = [], list(check_rows)[:2]
        for row in self.check_rows:  # a dry reset before any model is used: the spec and the rows fit
            try:
                episodes.append(self.start(row))
            except EnvironmentFault as err:
                raise ConfigError(f"dry run of --env {agent_cfg.env} on the first prompts: {err}") from err
            except TemplateError as err:
                raise ConfigError(
                    f"--env {agent_cfg.env}: {err}. Episodes cannot be started with this template; fix with "
                    "--chat-template FILE (a training template) or --chat-template-kwargs"
                ) from None
        tools = next((e.transcript.tools for e in episodes if e.transcript.tools), None)
        tool_use = bool(  # an environment with tools (or one whose class lists them): probe a tool call
            any(getattr(e.env, "tools", None) for e in episodes) if episodes else getattr(self.factory, "tools", None)
        )
        check = check_template(
            tokenizer, self.format, self.stops, tools, chosen=self.format_source == "--tool-parser", tool_use=tool_use
        )
        self.template_notes, self.one_call_per_turn = check.notes, check.one_call_per_turn

    def describe(self) -> str:
        rewards = ""
        if self.reward_set is not None:
            terms = " + ".join(f"{c.weight:g} x {c.name}" for c in self.reward_set.components)
            rewards = f" + {terms} on the final answer"
        audit = ""
        if self.audit is not None:
            audit = (
                f"; audited by {self.audit.components[0].name} on {self.audit_share:.0%} of the training episodes "
                "(their transcripts; logged, not trained on)"
            )
        return (
            f"environment {self.cfg.env}: its outcome and per-turn rewards{rewards}; up to {self.cfg.max_turns} turns and "
            f"{self.cfg.max_total_tokens} tokens per episode{audit}"
        )

    def plan(self) -> dict:
        """The plan's lines about episodes: how calls are read, which template renders, what the check found."""
        return {
            "episodes": "multi-turn, continued by appending tokens; loss, KL and entropy on the policy's tokens only; "
            f"{self.concurrency} environment call(s) at a time",
            "tool calls": f"{self.format.describe()}, {self.format_source}; parsed from the turn's text with special "
            "tokens"
            + (
                "; one call per turn (the template refuses two: a turn's later calls are answered with an error, "
                "not made)"
                if self.one_call_per_turn
                else ""
            ),
            "chat template": template_name(self.tokenizer, tools=True)
            + (
                f" with {self.tokenizer.tether_chat.kwargs}"
                if getattr(self.tokenizer, "tether_chat", None) and self.tokenizer.tether_chat.kwargs
                else ""
            ),
            **({"template note": " | ".join(self.template_notes)} if self.template_notes else {}),
        }

    def error_counts(self) -> dict[str, int]:
        return {"env": self.errors}

    def restore_error_counts(self, counts: dict[str, int]) -> None:
        self.errors = counts.get("env", 0)

    def step_figures(self, section: str | None = None) -> dict[str, float]:
        """The audit's sums of the step (no judge here: an environment scores its episodes)."""
        if section is not None:
            return {}
        out, self.audit_sums = self.audit_sums, {}
        return out

    def set_progress(self, global_step: int, max_steps: int) -> None:
        """The step the reward functions' trainer_state says, and the one that picks the audited episodes."""
        self.global_step = global_step
        for functions in (self.reward_set, self.audit):
            if functions is not None:
                functions.set_progress(global_step, max_steps)

    def close(self) -> None:
        self.guard.close()  # the environment's event loop
        for functions in (self.reward_set, self.audit):
            if functions is not None:
                functions.close()

    def start(self, row: dict) -> Episode:
        prompt = row.get("prompt")
        env = self.guard("__init__", self.factory, prompt=prompt)
        check_protocol(env, self.cfg.env)
        tools = None
        # the template lists the tools, unless the environment lists none (describe_tools=False: learnt from demos)
        if takes_tools(self.tokenizer) and getattr(env, "schemas", None) and getattr(env, "describe_tools", True):
            env.describe_tools, tools = False, checked_schemas(env.schemas, self.name)
        if hasattr(env, "tool_format"):
            env.tool_format = self.format
        if hasattr(env, "write_calls"):
            env.write_calls = self.write_calls  # the system message's example call: the parser reads it
        messages = check_messages(self.guard("reset", env.reset, row, prompt=prompt), self.name, "reset")
        messages = template_conversation(self.tokenizer, messages, bool(tools))  # a prompt's own tool traffic
        return Episode(row, Transcript(self.tokenizer, messages, tools, self.markers), env)

    def fail(self, episode: Episode, err: EnvironmentFault) -> None:
        if self.cfg.env_on_error == "raise":
            raise err
        self.errors += 1
        episode.end, episode.error = "error", str(err)

    def each(self, fn, items: list) -> list:
        """fn over items, at most env_concurrency at a time, results in order (an exception is returned, not
        raised, so every item's call completes before any is acted on)."""

        def call(item):
            try:
                return fn(item)
            except EnvironmentFault as err:
                return err

        if self.concurrency == 1 or len(items) < 2:
            return [call(item) for item in items]
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(items)), thread_name_prefix="env") as pool:
            return list(pool.map(call, items))

    def __call__(self, rows: list[dict], seeds: list[int] | None = None, greedy: bool = False):
        episodes = self.draw(rows, seeds, greedy)
        return self.rollout(episodes), self.scores(episodes)

    def draw(self, rows: list[dict], seeds: list[int] | None = None, greedy: bool = False) -> list[Episode]:
        """One episode per row: run here, or drawn whole by a rollout worker beside the trainer (a backend that
        serves episodes: rollout/async_worker.py), its environments' counted faults added to this run's."""
        served = getattr(self.backend, "episodes", None)
        if served is None:
            return self.run(rows, seeds, greedy)
        version, answer = served(rows, self.stops, seeds, greedy)
        if "fault" in answer:  # env_on_error = raise, in the worker: the run stops as it would here
            raise EnvironmentFault(answer["fault"])
        self.errors += answer["faults"]
        for e in answer["episodes"]:
            e.policy_version = version
        return answer["episodes"]

    def ahead(self, rows: list[dict], seeds: list[int] | None = None) -> None:
        """A later step's episodes, queued now with a backend that draws them beside the trainer; nothing with any
        other backend."""
        prefetch = getattr(self.backend, "prefetch_episodes", None)
        if prefetch is not None:
            prefetch(rows, self.stops, seeds)

    def run(self, rows: list[dict], seeds: list[int] | None = None, greedy: bool = False) -> list[Episode]:
        cfg = self.cfg
        episodes = []
        for row, started in zip(rows, self.each(self.start, rows)):
            episodes.append(started if isinstance(started, Episode) else Episode(row))
            if isinstance(started, EnvironmentFault):
                self.fail(episodes[-1], started)
        for turn in range(cfg.max_turns):
            live = [e for e in episodes if e.live]
            if not live:
                break
            budgets = [min(self.sampling.max_new_tokens, cfg.max_total_tokens - len(e.ids)) for e in live]
            turn_seeds = None
            if seeds is not None:
                turn_seeds = [seeds[k] + 1_000_003 * turn for k, e in enumerate(episodes) if e.live]
            out = self.backend.generate_ids(
                [e.transcript.prompt_ids + e.ids for e in live],
                self.sampling,
                self.stops,
                turn_seeds,
                max(budgets),
                greedy,
            )
            turns = []
            for j, e in enumerate(live):
                n = int(out.response_mask[j].sum())
                ids = out.response_ids[j, :n].tolist()
                stopped = not bool(out.truncated[j])
                if len(ids) > budgets[j]:  # the batch's budget is the largest; this episode's is its own
                    ids, stopped = ids[: budgets[j]], False
                if out.sampler_logprobs is not None:  # a backend that is not the trainer (vllm): keep its log-probs
                    e.sampler_logprobs = (e.sampler_logprobs or [0.0] * len(e.ids)) + out.sampler_logprobs[
                        j, : len(ids)
                    ].tolist()
                turns.append(self.record_turn(e, ids, stopped))
            stepping = [(e, t) for e, t in zip(live, turns) if t is not None]
            results = self.each(lambda et: self.step(*et), stepping)
            for (e, t), result in zip(stepping, results):
                self.apply_step(e, t, result, turn)
        self.finish(episodes)
        return episodes

    def record_turn(self, e: Episode, ids: list[int], stopped: bool):
        """Append the policy's turn and parse it; the turn (text, content, calls), or None when it ended the
        episode (out of tokens: the environment never sees a half-written turn)."""
        tok = self.tokenizer
        e.ids += ids
        e.actions += [1] * len(ids)
        e.turn_ends.append(len(e.ids) - 1)
        text = tok.decode(ids, skip_special_tokens=True)
        e.final, e.final_tokens, e.final_ids = answer_text(text), len(ids), list(ids)
        e.lines.append(f"assistant: {text}")
        if not stopped:
            e.turn_rewards.append({})
            e.end = "tokens"
            return None
        raw = tok.decode(ids[:-1], skip_special_tokens=False)  # call markers may be special tokens
        content, calls = self.format.parse(raw)  # a user's parser that fails: a ConfigError naming it
        if not calls:
            other = foreign_format(raw, self.format)
            if other or self.format.looks_like_call(raw):
                e.unparsed_turns += 1
                self.warn_unparsed(raw, other)
        for call in calls:
            e.calls_made += 1
            call["id"] = call.get("id") if len(str(call.get("id", ""))) == ID_LENGTH else call_id(e.calls_made)
        if self.one_call_per_turn and len(calls) > 1:  # the template refuses more: the policy is told, not the run
            calls[1:] = [{"name": c.get("name") or "invalid_call", "id": c["id"], "error": ONE_CALL} for c in calls[1:]]
        return text, content, calls

    def warn_unparsed(self, raw: str, other: str | None) -> None:
        """The first turn of each kind whose call does not parse: one in the run's format that does not parse, or
        one written in another family's format (a model taught another template's calls calls nothing)."""
        if (other or "") in self.unparsed_warned:
            return
        self.unparsed_warned.add(other or "")
        if other:
            log.warning(
                "a turn writes a tool call in the %s format, but this run reads %s (%s), which finds no call in it: "
                "counted in agent/unparsed_call_frac. A model taught another family's calls calls nothing here; "
                "--tool-parser %s reads this one: %r",
                other,
                self.format.name,
                self.format_source,
                other,
                raw[:200],
            )
        else:
            log.warning(
                "a turn looks like a tool call in the %s format but none parses (counted in "
                "agent/unparsed_call_frac; --tool-parser chooses the format): %r",
                self.format.name,
                raw[:200],
            )

    def step(self, e: Episode, turn) -> StepResult:
        text, _, calls = turn
        step = e.env.step
        wants_calls = "calls" in getattr(inspect.signature(step), "parameters", {})
        if wants_calls:
            result = self.guard("step", step, text, calls=[dict(c) for c in calls], prompt=e.row.get("prompt"))
        else:
            result = self.guard("step", step, text, prompt=e.row.get("prompt"))
        if not isinstance(result, StepResult):
            raise EnvironmentFault(
                f"environment {self.name}.step must return a StepResult, not {type(result).__name__}"
            )
        return result

    def apply_step(self, e: Episode, turn, result, index: int) -> None:
        """Append the environment's answer to the policy's turn (or end the episode)."""
        cfg = self.cfg
        try:
            if isinstance(result, EnvironmentFault):
                raise result
            messages = check_messages(result.messages, self.name, "step")
            rewards = check_parts(result.rewards, self.name, "step")
            info = check_info(result.info, self.name)
            if not result.done and not messages and index + 1 < cfg.max_turns:
                raise EnvironmentFault(
                    f"environment {self.name}.step: done=False with no messages; the policy's next turn would answer "
                    "nothing (answer with a message, or end the episode with done=True)"
                )
        except EnvironmentFault as err:
            e.turn_rewards.append({})
            self.fail(e, err)
            return
        e.turn_rewards.append(rewards)
        for call in info.get("calls", []):
            e.calls[str(call.get("name", "?"))] += 1
            e.failed_calls += 0 if call.get("ok", True) else 1
        for name, value in info.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                e.info[str(name)] = e.info.get(str(name), 0.0) + float(value)
        e.lines += [f"{m['role']}: {m.get('content', '')}" for m in messages]
        if result.done:
            e.end = "done"
            return
        if index + 1 == cfg.max_turns:
            e.end = "turns"
            return
        _, content, calls = turn
        following = e.transcript.continue_with(self.assistant_message(content, calls), tool_replies(messages, calls))
        if len(e.ids) + len(following) >= cfg.max_total_tokens:  # no room left for a policy token
            e.end = "tokens"
            return
        e.ids += following
        e.actions += [0] * len(following)
        if e.sampler_logprobs is not None:
            e.sampler_logprobs += [0.0] * len(following)

    def assistant_message(self, content: str, calls: list[dict]) -> dict:
        """The policy's turn as the conversation keeps it: its text, and its calls as structured tool_calls (with
        their ids; arguments a JSON string where the family's templates want one)."""
        message = {"role": "assistant", "content": content}
        if calls:  # a template that takes one call per turn gets the first; the others were answered with an error
            kept = calls[:1] if self.one_call_per_turn else calls
            message["tool_calls"] = [structured_call(c, self.format.arguments_as_string) for c in kept]
        return message

    def finish(self, episodes: list[Episode]) -> None:
        for e in episodes:
            if e.live:  # cannot happen: the last turn ends every episode; kept as a guard for the invariant
                e.end = "turns"
        ended = [e for e in episodes if e.end != "error"]

        def outcome(e: Episode) -> Outcome:
            o = self.guard("outcome", e.env.outcome, prompt=e.row.get("prompt"))
            if not isinstance(o, Outcome):
                raise EnvironmentFault(
                    f"environment {self.name}.outcome must return an Outcome, not {type(o).__name__}"
                )
            return Outcome(check_parts(o.rewards, self.name, "outcome"), o.success, o.claimed)

        for e, o in zip(ended, self.each(outcome, ended)):
            if isinstance(o, EnvironmentFault):
                self.fail(e, o)
            else:
                e.outcome = o

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
        versions = [e.policy_version for e in episodes]
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
            policy_versions=torch.tensor(versions) if episodes and None not in versions else None,
        )

    def scores(self, episodes: list[Episode]) -> Scores:
        """Outcome parts sum to the total; each turn's parts sum to that turn's step score (a process reward on the
        turn's last token); every part is logged by name (a per-turn part as its sum over the episode). Reward
        functions beside the environment add their weighted score of the final answer to the total."""
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
        if self.reward_set is not None:
            scored = torch.tensor([e.end != "error" for e in episodes], dtype=torch.float32)
            for name, (weight, values) in self.final_answer_scores(episodes).items():
                if name in parts:
                    raise ConfigError(f"reward function {name} has the name of one of the environment's rewards")
                parts[name] = values
                total += weight * values * scored
        if self.audit is not None and current_section() is None:  # training episodes only
            # the proxy is what an episode earns: its outcome and its turns' rewards
            self.audit_episodes(episodes, total + torch.tensor([float(sum(s)) for s in steps]))
        return Scores(total, parts, steps, True, step_ends=ends, records=[e.record() for e in episodes])

    def audit_episodes(self, episodes: list[Episode], total: torch.Tensor) -> None:
        """The trusted check on the episodes audited_response picks (by the step, the row's prompt and the readable
        transcript), beside what each earned; summed until step_figures takes them."""
        transcripts = ["\n".join(e.lines) for e in episodes]
        sums = audit_sums(
            self.audit,
            self.global_step,
            self.audit_share,
            [e.row for e in episodes],
            [repr(e.row.get("prompt")) for e in episodes],
            transcripts,
            [list(e.ids) for e in episodes],
            [e.truncated for e in episodes],
            total,
        )
        for key, value in sums.items():
            self.audit_sums[key] = self.audit_sums.get(key, 0.0) + value

    def final_answer_scores(self, episodes: list[Episode]) -> dict:
        """{name: (weight, scores)} of the reward functions beside the environment, on each final answer."""
        values = self.reward_set.score(
            [e.row for e in episodes],
            [e.final for e in episodes],
            [list(e.final_ids) for e in episodes],
            [e.truncated for e in episodes],
        )
        out = {}
        for c in self.reward_set.components:
            v = values[c.name]
            if any(isinstance(x, list) for x in v):
                raise ConfigError(
                    f"reward function {c.name} returned step scores; beside --env a reward function scores the "
                    "final answer (per-turn rewards are the environment's: StepResult.rewards)"
                )
            if any(x is None for x in v):  # "no opinion": adds 0, counted
                c.nones += sum(x is None for x in v)
            out[c.name] = (c.weight, torch.tensor([0.0 if x is None else float(x) for x in v]))
        return out


def format_stop_ids(tokenizer, fmt) -> list[int]:
    """Tokens the format ends a call turn with besides the template's end of turn (Llama 3's <|eom_id|>), where
    the tokenizer has them as single tokens."""
    out = []
    for marker in fmt.stop_markers:
        ids = tokenizer(marker, add_special_tokens=False)["input_ids"]
        if len(ids) == 1 and tokenizer.decode(ids) == marker:
            out.append(int(ids[0]))
    return out


def check_episodes(agent_cfg, tokenizer, rows: list[dict]) -> None:
    """Before any model is loaded: the environment resets on the first prompts, and the chat template continues a
    scripted tool episode with the chosen parser (check_template); nothing fails mid-run for a template reason."""
    if agent_cfg is None or not agent_cfg.env:
        return
    from tether.rollout.prompts import stop_token_ids

    AgentSampler(agent_cfg, tokenizer, None, None, stop_token_ids(tokenizer), rows).close()
