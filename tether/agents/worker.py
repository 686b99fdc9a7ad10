"""Episodes drawn by a rollout worker beside the trainer (rollout/async_worker.py, rollout.max_staleness): the
worker's own AgentSampler, built in its process from what the trainer's was built from, and what of each episode
travels back to the trainer."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, fields, replace

from tether.agents.environment import EnvironmentFault, Outcome
from tether.agents.episodes import AgentSampler, Episode


@dataclass(frozen=True)
class SentTranscript:
    """What the trainer reads of a transcript drawn in a rollout worker's process (the rest stays there)."""

    prompt_ids: list[int]
    text: str
    tools: list | None = None


def detached(episode: Episode) -> Episode:
    """The episode without its environment, its transcript reduced to what the trainer reads of it (prompt ids,
    text, tools): what the worker sends back."""
    t = episode.transcript
    return replace(episode, env=None, transcript=SentTranscript(t.prompt_ids, t.text, t.tools) if t else None)


def episode_json(episode: Episode) -> dict:
    """A detached episode as JSON values: what the worker sends back, and what process 0 hands the others under
    rollout_workers = one (UTF-8 JSON, never pickle). A float's shortest repr reads back as the same float, so the
    sampler's log-probs and the reward parts survive the trip exactly."""
    out = {f.name: getattr(episode, f.name) for f in fields(Episode) if f.name not in ("env", "transcript", "outcome")}
    t, o = episode.transcript, episode.outcome
    out.update(calls=dict(episode.calls), outcome=asdict(o) if o is not None else None)
    out["transcript"] = [list(t.prompt_ids), t.text, t.tools] if t is not None else None
    return out


def episode_from_json(data: dict) -> Episode:
    values = dict(data)
    transcript, outcome, calls = values.pop("transcript"), values.pop("outcome"), values.pop("calls")
    return Episode(
        **values,
        transcript=SentTranscript(*transcript) if transcript is not None else None,
        outcome=Outcome(**outcome) if outcome is not None else None,
        calls=Counter(calls),
    )


def serve_episodes(sampler: AgentSampler, backend) -> None:
    """With a backend that draws episodes in a worker (one with ``serve_episodes``): tell it how to build that
    worker's AgentSampler — the same agent section, dry-run rows and stop set as ``sampler``'s, and an environment
    handed to the Python API by value. Nothing with any other backend."""
    serve = getattr(backend, "serve_episodes", None)
    if serve is not None:
        env = sampler.cfg.env
        objects = {env.removeprefix("python:"): sampler.factory} if env.startswith("python:") else {}
        serve(WorkerEpisodes, (sampler.cfg, list(sampler.check_rows), objects), episode_from_json)


class WorkerEpisodes:
    """The rollout worker's side of episodes drawn beside the trainer (rollout/async_worker.py): an AgentSampler
    built in the worker's process from what the trainer's was built from (``spec``: the agent section, its dry-run
    rows, an environment handed to the Python API), sampling with the worker's copy of the policy. It answers one
    episode per row with the episodes detached from their environments and the faults it counted, or the fault that
    stops the run (env_on_error = raise). The episodes travel as JSON values (episode_json)."""

    def __init__(self, spec: tuple, tokenizer, backend, sampling, stops: list[int]):
        from tether.rewards.loading import PYTHON_OBJECTS

        agent_cfg, check_rows, objects = spec
        PYTHON_OBJECTS.update(objects)
        self.sampler = AgentSampler(agent_cfg, tokenizer, backend, sampling, stops, check_rows)

    def __call__(self, rows: list[dict], seeds: list[int] | None, greedy: bool) -> dict:
        before = self.sampler.errors
        try:
            drawn = self.sampler.run(rows, seeds, greedy)
        except EnvironmentFault as err:
            return {"fault": str(err)}
        return {"episodes": [episode_json(detached(e)) for e in drawn], "faults": self.sampler.errors - before}

    def close(self) -> None:
        self.sampler.close()
