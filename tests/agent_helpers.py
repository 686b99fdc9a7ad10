"""Test doubles for agent episodes: environments and generation backends with known behaviour."""

from __future__ import annotations

import asyncio
import time

import torch

from tether.agents.environment import Outcome, StepResult
from tether.agents.tools import ToolEnvironment
from tether.rollout.batch import Rollout
from tether.rollout.prompts import response_mask_from_stops


def echo(text: str) -> str:
    """Repeat the text in capitals."""
    return text.upper()


def add(a: int, b: int = 0) -> int:
    """Add two integers."""
    return a + b


def broken(x: str) -> str:
    """Always fails."""
    raise ValueError("out of order")


class EchoTools(ToolEnvironment):
    tools = [echo, add, broken]

    def score(self, final_text):
        return {"answered": 1.0 if final_text else 0.0}

    def success(self):
        return "ECHO" in str(self.final_text)


class Counting:
    """Every turn is answered with "obs N" and a per-turn reward of N/10; done after ``turns`` turns."""

    def __init__(self, turns: int = 3, fail_at: int = 0, hang_at: int = 0):
        self.turns, self.fail_at, self.hang_at, self.n = turns, fail_at, hang_at, 0

    def reset(self, row):
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, text):
        self.n += 1
        if self.n == self.fail_at:
            raise RuntimeError("the environment broke")
        if self.n == self.hang_at:
            time.sleep(30)
        return StepResult([{"role": "tool", "content": f"obs {self.n}"}], {"turn": 0.1 * self.n}, self.n >= self.turns)

    def outcome(self):
        return Outcome({"final": float(self.n)}, success=self.n >= 2, claimed=True)


class Feedback:
    """A user who says "Try again." after the first answer and accepts the second (no tools)."""

    def reset(self, row):
        self.n = 0
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, text):
        self.n += 1
        if self.n == 1:
            return StepResult([{"role": "user", "content": "Try again."}])
        return StepResult(done=True)

    def outcome(self):
        return Outcome({"answered": 1.0}, success=True)


class ScriptedBackend:
    """Turn k of every episode is turns[k] (cycled), tokenised, followed by EOS: a policy with a known script."""

    draws_from_own_rng = False  # the GenerationBackend contract: it draws in this process (or not at all)

    def __init__(self, tokenizer, turns: list[str]):
        self.tokenizer, self.turns, self.calls = tokenizer, turns, 0

    def generate_ids(self, contexts, sampling, stop_ids, seeds=None, max_new_tokens=None, greedy=False):
        text = self.turns[self.calls % len(self.turns)]
        self.calls += 1
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
        ids = ids[: max_new_tokens or sampling.max_new_tokens]
        response = torch.tensor([ids] * len(contexts))
        mask, truncated = response_mask_from_stops(response, stop_ids)
        none = torch.zeros((len(contexts), 0), dtype=torch.long)
        return Rollout(
            none,
            none,
            response,
            mask,
            truncated,
            [""] * len(contexts),
            [self.tokenizer.decode(ids, skip_special_tokens=True)] * len(contexts),
        )

    def weights_updated(self, policy):
        pass


class ShortTurns:
    """Hugging Face sampling from the policy, with EOS forced after ``length`` tokens (a random tiny model would
    otherwise never end a turn): real multi-turn episodes for training tests."""

    draws_from_own_rng = False  # the GenerationBackend contract: it draws in this process (or not at all)

    def __init__(self, model, tokenizer, length: int = 3):
        self.model, self.tokenizer, self.length = model, tokenizer, length

    def generate_ids(self, contexts, sampling, stop_ids, seeds=None, max_new_tokens=None, greedy=False):
        from transformers import LogitsProcessorList

        eos, length = self.tokenizer.eos_token_id, self.length
        width = max(len(c) for c in contexts)

        def force_stop(input_ids, scores):
            if input_ids.shape[1] - width >= length - 1:
                scores = torch.full_like(scores, float("-inf"))
                scores[:, eos] = 0.0
            return scores

        device = next(self.model.parameters()).device
        from tether.rollout.batch import left_pad

        ids, mask = left_pad(contexts, self.tokenizer.pad_token_id, device)
        out = self.model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            temperature=sampling.temperature,
            top_k=0,
            top_p=1.0,
            logits_processor=LogitsProcessorList([force_stop]),
            max_new_tokens=max_new_tokens or sampling.max_new_tokens,
            eos_token_id=stop_ids,
            pad_token_id=self.tokenizer.pad_token_id,
        )
        response = out[:, ids.shape[1] :]
        rmask, truncated = response_mask_from_stops(response, stop_ids)
        response = torch.where(rmask.bool(), response, torch.full_like(response, self.tokenizer.pad_token_id))
        return Rollout(
            ids,
            mask,
            response,
            rmask,
            truncated,
            [""] * len(contexts),
            self.tokenizer.batch_decode(response, skip_special_tokens=True),
        )

    def generate(self, prompts, sampling, stop_ids, seeds=None):
        ids = self.tokenizer(prompts, add_special_tokens=False)["input_ids"]
        return self.generate_ids(ids, sampling, stop_ids, seeds)

    def weights_updated(self, policy):
        pass


STEP_CALLS = {"n": 0}  # over all episodes of a process: lets an environment fail late in a run


class FailsAfter(Counting):
    """Counting, whose step() raises once more than ``calls`` steps have been taken in this process."""

    def __init__(self, calls: int = 20):
        super().__init__(turns=3)
        self.limit = calls

    def step(self, text):
        STEP_CALLS["n"] += 1
        if STEP_CALLS["n"] > self.limit:
            raise ConnectionError("the service went away")
        return super().step(text)


async def slow_add(a: int, b: int = 0) -> int:
    """Add two integers, eventually.

    Args:
        a: The first.
        b: The second,
            zero if not given.
    """
    import asyncio

    await asyncio.sleep(0.01)
    return a + b


class AsyncTools(ToolEnvironment):
    """An async tool and an async outcome; each step reports how many calls it made as info (env/calls_made)."""

    tools = [slow_add]

    def step(self, text, calls=None):
        result = super().step(text, calls)
        result.info["calls_made"] = len(result.info.get("calls", []))
        return result

    async def outcome(self):
        return Outcome({"answered": 1.0 if self.final_text else 0.0}, success=bool(self.calls))


def first_word_parser(text):
    """A user's own format: CALL name a=1 b=2."""
    if not text.startswith("CALL "):
        return []
    name, *pairs = text[5:].split()
    return [{"name": name, "arguments": {k: int(v) for k, v in (p.split("=") for p in pairs)}}]


first_word_parser.markers = ("CALL",)


def training_progress(completions, trainer_state, **_):
    """The steps done before this batch, as the run's trainer_state says."""
    return [float(trainer_state.global_step)] * len(completions)


def says_five(completions, **_):
    return [1.0 if "5" in c else 0.0 for c in completions]


async def shout_back(reader, writer):
    """A line server: each line comes back in capitals."""
    while line := await reader.readline():
        writer.write(line.upper())
        await writer.drain()
    writer.close()


class ConnectedTools(ToolEnvironment):
    """Its tool talks to a server over a connection opened in ``reset`` and closed in ``outcome``, as an HTTP or MCP
    client does: the connection belongs to the event loop it was opened on."""

    def __init__(self):
        super().__init__(tools=[self.shout])

    async def reset(self, row):
        self.server = await asyncio.start_server(shout_back, "127.0.0.1", 0)
        self.reader, self.writer = await asyncio.open_connection(*self.server.sockets[0].getsockname()[:2])
        return super().reset(row)

    async def shout(self, text: str) -> str:
        """Say it louder, through the server.

        Args:
            text: What to say.
        """
        self.writer.write(text.encode() + b"\n")
        await self.writer.drain()
        return (await self.reader.readline()).decode().strip()

    async def outcome(self):
        reply = await self.shout("bye")
        self.writer.close()
        await self.writer.wait_closed()
        self.server.close()
        await self.server.wait_closed()
        return Outcome({"answered": 1.0 if reply == "BYE" else 0.0}, success=bool(self.calls))
