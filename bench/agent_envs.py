"""How long a turn's environment calls take across a batch, one after another and concurrently (agent.env_concurrency).

Eight episodes whose one tool call sleeps 0.5 s (a plain function, then an ``async def`` one), each run through
tether's episode runner with a scripted policy: the wall time of the batch at env_concurrency 1 and 8. The
sandboxed case (a coding agent's test runs in bubblewrap) is examples/coding_agent.py's last line.

    .venv/bin/python bench/agent_envs.py
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tether.agents.tools import ToolEnvironment  # noqa: E402


def wait(seconds: float) -> str:
    """Wait, then say so.

    Args:
        seconds: How long.
    """
    time.sleep(seconds)
    return "waited"


async def wait_async(seconds: float) -> str:
    """Wait without blocking, then say so.

    Args:
        seconds: How long.
    """
    await asyncio.sleep(seconds)
    return "waited"


class Waits(ToolEnvironment):
    tools = [wait, wait_async]


class Script:
    def __init__(self, tokenizer, turns):
        self.tokenizer, self.turns, self.n = tokenizer, turns, 0

    def generate_ids(self, contexts, sampling, stop_ids, seeds=None, max_new_tokens=None, greedy=False):
        import torch

        from tether.rollout.batch import Rollout
        from tether.rollout.prompts import response_mask_from_stops

        text = self.turns[self.n % len(self.turns)]
        self.n += 1
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
        response = torch.tensor([ids] * len(contexts))
        mask, truncated = response_mask_from_stops(response, stop_ids)
        none = torch.zeros((len(contexts), 0), dtype=torch.long)
        return Rollout(none, none, response, mask, truncated, [""] * len(contexts), [text] * len(contexts))

    def weights_updated(self, policy):
        pass


def batch_seconds(tokenizer, tool: str, concurrency: int, episodes: int = 8) -> float:
    from tether.agents.episodes import AgentSampler

    call = f'<tool_call>{{"name": "{tool}", "arguments": {{"seconds": 0.5}}}}</tool_call>'
    cfg = SimpleNamespace(
        env=f"{__file__}:Waits",
        max_turns=2,
        max_total_tokens=2048,
        env_timeout=10.0,
        env_on_error="raise",
        env_error_score=0.0,
        tool_parser="",
        env_concurrency=concurrency,
    )
    sampling = SimpleNamespace(max_new_tokens=256, temperature=1.0, top_p=1.0, top_k=0, generation_batch=0)
    sampler = AgentSampler(cfg, tokenizer, Script(tokenizer, [call, "done"]), sampling, [tokenizer.eos_token_id])
    start = time.perf_counter()
    _, scores = sampler([{"prompt": "wait"}] * episodes)
    seconds = time.perf_counter() - start
    assert all(r["calls"] == {tool: 1} and r["failed_calls"] == 0 for r in scores.records), scores.records
    return round(seconds, 2)


def main() -> None:
    from tether.lab.tokenizer import train_bpe_tokenizer

    tokenizer = train_bpe_tokenizer(['{"name": "wait", "arguments": {"seconds": 0.5}} done'] * 8, vocab_size=300)
    table = {
        tool: {f"env_concurrency={c}": batch_seconds(tokenizer, tool, c) for c in (1, 8)}
        for tool in ("wait", "wait_async")
    }
    print(json.dumps({"8 calls of 0.5 s, seconds per batch": table}))


if __name__ == "__main__":
    main()
