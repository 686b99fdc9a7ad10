"""Online DPO on the online loop (docs/dpo.md): every steps_per_round steps a round — two answers per prompt sampled
from the current policy through the online stages' one sampling path (tether/train/sampling.py OnlineSampler),
labelled by a judge function or the shared scorer, ties and unusable pairs dropped and counted — then the offline
loop's optimizer steps on that round's pairs against the fixed reference."""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from tether.config import ConfigError
from tether.console import console
from tether.data.dpo import tokenize_policy_preferences
from tether.data.multimodal import prompt_images, sample_images
from tether.data.records import read_records
from tether.models.lm import frozen_dtype, length_limit
from tether.models.vision import is_vision_language
from tether.models.work import phase
from tether.rewards.functions import RewardFunctionError
from tether.rewards.judge import load_judge
from tether.rewards.loading import load_reward_function
from tether.rewards.score import Scorer, load_reward_model_scorer
from tether.rollout.backends import response_seeds
from tether.stages.dpo_config import DPOConfig
from tether.stages.dpo_setup import (
    DPOSetup,
    dpo_plan,
    dpo_summary,
    evaluate_pairs,
    load_dpo_data,
    offline_step,
    setup_dpo,
)
from tether.train.experience import SampleRecord
from tether.train.offline import EpochOrder
from tether.train.online import Schedule, run_online, start_online
from tether.train.parallel import DataParallel
from tether.train.sampling import OnlineSampler


class PairLabeller:
    """Which of two answers is better: a judge function, a pairwise judge model (the pair itself, both orders), or
    the higher score from the shared scorer (a reward model, reward functions, a pointwise judge model)."""

    def __init__(self, cfg: DPOConfig, tokenizer, reward_set, device):
        self.cfg = cfg
        self.judge = load_reward_function(cfg.online.judge) if cfg.online.judge else None
        # a vision-language policy's judge function is given each prompt's images (PIL), as reward functions are
        self.image_pixels = cfg.model.max_image_pixels if is_vision_language(cfg.model.path) else 0
        dtype = frozen_dtype(cfg.model)
        model_judge = load_judge(cfg.judge, device, dtype, group_size=2)
        self.pair_judge = model_judge if model_judge is not None and model_judge.template.mode == "pairwise" else None
        self.scorer = (
            None
            if self.judge
            else Scorer(
                cfg.rewards,
                cfg.rollout.max_new_tokens,
                tokenizer,
                reward_set,
                load_reward_model_scorer(cfg.rewards, device, dtype),
                judge=model_judge,
            )
        )

    def __call__(self, rows: list[dict], rollout) -> tuple[list[float], list[float]]:
        """(P(first is better) per prompt: 1, 0 or 0.5 — a tie, dropped; the score of every answer: the scorer's,
        or with a judge the answer's side of the verdict). rollout rows 2i and 2i+1 answer prompt i."""
        first, second = rollout.responses[0::2], rollout.responses[1::2]
        if self.judge is not None:
            preference = self._verdicts(rows, first, second)
            return preference, [p if i % 2 == 0 else 1.0 - p for p in preference for i in range(2)]
        if self.pair_judge is not None:
            return self.pair_judge.labels(rows, first, second)
        # a pair is a group of 2: an answer a pointwise judge gave no verdict takes its partner's score (a tie,
        # dropped), not the batch's mean, which would label the pair by the other answers of the step
        totals = self.scorer(rollout, [r for r in rows for _ in range(2)], group_size=2).flat().tolist()
        a, b = totals[0::2], totals[1::2]
        return [1.0 if x > y else 0.0 if x < y else 0.5 for x, y in zip(a, b)], totals

    def _verdicts(self, rows: list[dict], first: list[str], second: list[str]) -> list[float]:
        """The judge's P(first is better) per pair, each a number in [0, 1]; anything else is a RewardFunctionError
        (the online loop checkpoints the steps done and stops with it)."""
        name = self.cfg.online.judge
        columns = {k: [r.get(k) for r in rows] for k in rows[0] if k != "prompt"}
        if self.image_pixels:
            columns["images"] = [prompt_images(r, "a prompt row", self.image_pixels) for r in rows]
        try:
            values = list(self.judge(prompts=[r.get("prompt") for r in rows], first=first, second=second, **columns))
        except Exception as err:  # noqa: BLE001 - the user's judge; reported with its name
            raise RewardFunctionError(f"--judge {name} raised {type(err).__name__}: {err}") from err
        if len(values) != len(first):
            raise RewardFunctionError(f"--judge {name} returned {len(values)} values for {len(first)} pairs")
        for i, v in enumerate(values):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= float(v) <= 1.0:
                raise RewardFunctionError(
                    f"--judge {name}: verdict {i} is {v!r}; a verdict is P(first is better), a "
                    "number in [0, 1] (0.5 for a tie)"
                )
        return [float(v) for v in values]


def sample_round_pairs(
    sampler,
    rows: list[dict],
    prompt_indices: list[int],
    labeller: PairLabeller,
    cfg: DPOConfig,
    seed: int,
    step: int,
    positions: list[int] | None = None,
):
    """Two answers to each of ``rows`` (the prompt file's rows at ``prompt_indices`` of ``sampler``: an
    OnlineSampler, its rendered ``prompts`` and ``generate(indices, seeds)``) from the current policy, labelled;
    ties, identical answers, empty ones and (unless keep_truncated) truncated ones dropped with their pair and
    counted. Returns (pairs, counts, SampleRecords of every answer, the rollout or None). ``positions``: the prompts' places in the prompt
    stream, which seed each answer when rollout.response_seeds is on."""
    counts = {"prompts": len(rows), "ties": 0, "truncated": 0, "identical": 0, "empty": 0, "pairs": 0}
    if not rows:  # a process whose share of a small round is empty
        return [], counts, [], None
    torch.manual_seed(seed)
    texts = [sampler.prompts[i] for i in prompt_indices]
    ro = cfg.rollout
    seeds = response_seeds(seed, positions, 2) if ro.response_seeds and positions is not None else None
    rollout = sampler.generate([i for i in prompt_indices for _ in range(2)], seeds)
    answers, truncated, lengths = rollout.responses, rollout.truncated.tolist(), rollout.lengths.tolist()
    preference, answer_scores = labeller(rows, rollout)
    samples = [
        SampleRecord(
            step,
            texts[i // 2],
            answers[i],
            float(answer_scores[i]),
            {},
            int(lengths[i]),
            bool(truncated[i]),
            images=sample_images(rows[i // 2]),
        )
        for i in range(len(answers))
    ]
    pairs = []
    for i, row in enumerate(rows):
        first, second = answers[2 * i], answers[2 * i + 1]
        reason = (
            "truncated"
            if not cfg.online.keep_truncated and (truncated[2 * i] or truncated[2 * i + 1])
            # an answer that is only its stop (or blanks) has no text a pairs file can hold
            else "empty"
            if not first.strip() or not second.strip()
            else "identical"
            if first.strip() == second.strip()
            else "ties"
            if preference[i] == 0.5
            else None
        )
        if reason:
            counts[reason] += 1
            continue
        chosen, rejected = (first, second) if preference[i] > 0.5 else (second, first)
        wrap = (lambda a: [{"role": "assistant", "content": a}]) if isinstance(row["prompt"], list) else (lambda a: a)
        pairs.append(
            {
                **{k: v for k, v in row.items() if k not in ("chosen", "rejected")},
                "chosen": wrap(chosen),
                "rejected": wrap(rejected),
            }
        )
    counts["pairs"] = len(pairs)
    return pairs, counts, samples, rollout


class OnlineDPOStage:
    """Online DPO's step on the online loop: a new round of labelled pairs every steps_per_round steps, then the
    offline loop's optimizer step (tether/train/offline.py::train_step) on that round's pairs."""

    name = "dpo"

    def __init__(
        self, cfg: DPOConfig, setup: "DPOSetup", labeller: PairLabeller, prompt_rows: list[dict], backend=None
    ):
        self.cfg, self.setup, self.labeller, self.prompt_rows = cfg, setup, labeller, prompt_rows
        self.policy, self.tokenizer = setup.unwrapped, setup.tokenizer
        self.dp = DataParallel(setup.accelerator)
        # the online stages' one sampling path: rollout.backend (or a stand-in), the rendered prompts checked
        # against the context, the stop set; --fsdp: an ordinary copy of the sharded policy samples (the hf
        # backend), or an engine is pushed the gathered weights (train/sharding.py)
        self.sampler = OnlineSampler(
            cfg, setup.tokenizer, self.policy, prompt_rows, [], backend, None, setup.sampling_copy, self.dp
        )
        self.sampling_policy = self.sampler.sampling_policy
        self.backend = self.sampler.backend
        self.optimizer, self.scheduler = setup.optimizer, setup.scheduler
        self.scorer = labeller.scorer  # None with a judge
        self.order = EpochOrder(len(prompt_rows), cfg.train.seed)
        self.rounds: list[dict] = []  # counts of every sampled round
        self.round, self.examples = None, []
        self.queued = 0  # rounds queued with a rollout worker (rollout.max_staleness); none kept over a resume
        self.drawn: dict = {}  # the rollout worker's figures of the round's answers (async/*), logged at its first step

    def extra_parts(self) -> dict:
        return {}

    def state(self) -> dict:
        return {"beta_dpo": self.setup.objective.state, "online_rounds": self.rounds}

    def load_state(self, state: dict) -> None:
        self.setup.objective.state = state.get("beta_dpo") or self.setup.objective.state
        self.rounds = list(state.get("online_rounds", []))

    def summary(self) -> dict:
        return dpo_summary(self.cfg, self.setup, {}, self.rounds)

    def plan(self) -> dict:
        o, ro = self.cfg.online, self.cfg.rollout
        return {
            **dpo_plan(self.cfg, self.setup),
            "online": f"{o.rounds} rounds x {ro.prompts_per_step} prompts x 2 answers, {o.steps_per_round} steps each, "
            "labelled by " + (f"judge {o.judge}" if o.judge else self.labeller.scorer.describe()),
            "generation": self.sampler.describe()
            + (
                "; a gathered copy of the sharded policy on every process"
                if self.setup.sampling_copy is not None
                else ""
            ),
        }

    def evaluate(self) -> dict:
        with phase("pairs"):
            return evaluate_pairs(self.setup, self.cfg)

    def _start_round(self, rnd: int, step: int) -> list:
        """The round's pairs and their reference log-probs. A round is sampled and labelled at its first step; its
        answers go to samples.jsonl with that step. A pairs file that the checkpointed state does not know of was
        written by a run killed before its next checkpoint: it is sampled again, identically (same seed, same
        weights), so its answers reach samples.jsonl once."""
        cfg, samples = self.cfg, []
        path = self.setup.out / "rounds" / f"round-{rnd}.jsonl"
        if not any(r["round"] == rnd for r in self.rounds):
            with phase("sample"):  # a reward model labelling the pairs names its own phase
                pairs, counts, samples = self._sample_round(rnd, step)
            if not pairs:
                raise ConfigError(
                    f"online round {rnd}: no usable pair ({counts}); raise max_new_tokens or "
                    "the temperature, or check the labeller"
                )
            if self.setup.accelerator.is_main_process:
                path.parent.mkdir(exist_ok=True)
                write_json_lines(path, pairs)
            self.setup.accelerator.wait_for_everyone()
            self.rounds.append({"round": rnd, **counts})
            console.print(
                f"online round {rnd}: {counts['pairs']} pairs from {counts['prompts']} prompts (dropped: "
                f"{counts['ties']} ties, {counts['identical']} identical, {counts['truncated']} truncated, "
                f"{counts['empty']} with an empty answer)"
            )
        self.examples, _ = tokenize_policy_preferences(
            read_records(path),
            self.tokenizer,
            length_limit(cfg.data.max_length, cfg.model.path),
            False,
            str(path),
            self.setup.processor,  # a vision-language model's pairs show their prompt's images (absolute paths)
            cfg.model.max_image_pixels,
        )
        if self.setup.reference is not None:
            self.setup.reference.fresh_policy = False
            with phase("reference"):
                self.setup.reference.attach(self.examples, use_cache=False)
        self.round, self.round_order = rnd, EpochOrder(len(self.examples), cfg.train.seed + rnd)
        return samples

    def _round_share(self, rnd: int) -> tuple[list[int], list[int], int]:
        """This process's contiguous share of round ``rnd``'s prompts: (prompt indices, their places in the prompt
        stream, the round's seed)."""
        first, count = rnd * self.cfg.rollout.prompts_per_step, self.cfg.rollout.prompts_per_step
        mine = self.dp.shard(list(zip(self.order.slice(first, count), range(first, first + count))))
        return [i for i, _ in mine], [p for _, p in mine], self.cfg.train.seed * 1000 + rnd

    def queue_ahead(self, rnd: int) -> None:
        """With rollout.max_staleness K: the rounds whose answers are at most K updates old at their round's first
        step — rounds ``rnd`` … ``rnd`` + ⌊K / steps_per_round⌋, none past the last — queued with the rollout worker
        (the same prompts and seeds sample_round_pairs asks for), so the worker draws them while this round trains."""
        ro, o = self.cfg.rollout, self.cfg.online
        last = min(rnd + ro.max_staleness // o.steps_per_round, o.rounds - 1) if ro.max_staleness else rnd - 1
        for ahead in range(max(rnd, self.queued), last + 1):
            indices, positions, seed = self._round_share(ahead)
            if indices:
                seeds = response_seeds(seed, positions, 2) if ro.response_seeds else None
                self.sampler.ahead([i for i in indices for _ in range(2)], seeds)
            self.queued = ahead + 1

    def _sample_round(self, rnd: int, step: int):
        """The round's pairs, counts and samples; on N processes each samples and labels a contiguous share of the
        round's prompts, and the shares are gathered in rank order (the one-process order)."""
        cfg, dp = self.cfg, self.dp
        indices, positions, seed = self._round_share(rnd)
        rows = [self.prompt_rows[i] for i in indices]
        self.queue_ahead(rnd)
        pairs, counts, samples, rollout = dp.all_or_none(
            lambda: sample_round_pairs(self.sampler, rows, indices, self.labeller, cfg, seed, step + 1, positions)
        )
        self.drawn = self.sampler.async_figures(rollout) if rollout is not None else {}
        if not dp.active:
            return pairs, counts, samples
        samples = [SampleRecord(**row) for row in dp.gather_json([x.as_dict() for x in samples])]
        return dp.gather_json(pairs), {k: int(v) for k, v in dp.sum_dict(counts).items()}, samples

    def step(self, step: int) -> tuple[dict, list]:
        t0 = time.perf_counter()
        rnd = step // self.cfg.online.steps_per_round
        samples = self._start_round(rnd, step) if rnd != self.round else []
        t1 = time.perf_counter()
        with phase("update"):
            metrics = offline_step(self.setup, self.cfg, self.examples, self.round_order, step)
        self.sampler.weights_updated(self.policy)
        elapsed = time.perf_counter() - t1
        metrics.update(
            {
                "time/sample_s": t1 - t0,
                "time/step_s": elapsed,
                "perf/pairs_per_s": metrics["train/pairs"] / max(elapsed, 1e-9),
                **(self.drawn if samples else {}),
            }
        )
        return metrics, samples


def write_json_lines(path: Path, rows: list[dict]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.replace(path)


def run_online_dpo(cfg: DPOConfig, evaluate_fn=None, backend=None) -> dict:
    data = load_dpo_data(cfg)
    start = start_online(
        cfg, cfg.total_steps_online, cfg.rewards, cfg.rollout.prompts, "", stand_in_reward=bool(cfg.online.judge)
    )
    setup = setup_dpo(cfg, data, start.accelerator, start.config, start.start_step, start.checkpoint)
    labeller = PairLabeller(cfg, setup.tokenizer, start.reward_set, start.accelerator.device)
    stage = OnlineDPOStage(
        cfg,
        setup,
        labeller,
        start.prompt_rows,
        backend(setup.sampling_copy or setup.unwrapped, setup.tokenizer) if backend else None,
    )
    schedule = Schedule.of(
        cfg.train,
        setup.total_steps,
        stop_on_alarm=cfg.online.stop_on_alarm,
        alarm_final=cfg.online.alarm_final,
        alarm_stops=cfg.online.alarm_stops,
        sample_every=1,
        round_steps=cfg.online.steps_per_round,
    )
    return run_online(stage, schedule, start, "tether dpo", evaluate_fn)
