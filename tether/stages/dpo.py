"""`tether dpo`: the direct-preference family, offline and online (docs/algorithms.md §6, docs/dpo.md).

Offline: preference pairs (or ranked lists) → reference log-probs in one cached no-grad pass → the shared offline
loop (tether/train/offline.py) with DPOObjective (all responses of a batch in one forward). Online: the shared
online loop (tether/train/online.py) with rounds — every steps_per_round steps, two answers per prompt are sampled
from the current policy, labelled (a judge function, or the shared scorer: a reward model and/or reward
functions), and the next steps train on those pairs against the fixed reference.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from tether.algorithms.preference import (
    REFERENCE_FREE,
    beta_dpo_beta,
    beta_dpo_margins,
    beta_dpo_pair_weights,
    implicit_rewards,
    kto_loss,
    kto_reference_point,
    kto_reference_point_from_sums,
    preference_loss,
)
from tether.config import ConfigError
from tether.console import console
from tether.data.dpo import collate_policy_preferences, tokenize_policy_preferences, tokenize_unpaired
from tether.data.records import read_records, tokenize_split
from tether.models.checks import check_position_restarts
from tether.models.lm import (
    check_lora_reference,
    frozen_dtype,
    length_limit,
    load_stage_tokenizer,
    load_trainable_model,
    parameter_summary,
)
from tether.models.packing import describe, group_rows, sequence_logprob_sums
from tether.models.work import phase
from tether.rewards.functions import RewardFunctionError
from tether.rewards.loading import load_reward_function
from tether.rewards.score import Scorer, load_reward_model_scorer
from tether.rollout.backends import BACKENDS, make_backend, response_seeds
from tether.rollout.prompts import render_prompts, stop_token_ids
from tether.stages.dpo_config import DPOConfig
from tether.stages.dpo_reference import ReferenceLogps
from tether.train.checkpoint import load_training_state, save_final
from tether.train.experience import SampleRecord
from tether.train.offline import EpochOrder, loop_settings, step_micro_batches, train_step
from tether.train.offline_run import offline_logger, plan_steps, prepare_trained, run_offline_loop
from tether.train.online import Schedule, run_online, start_online
from tether.train.parallel import DataParallel
from tether.train.run import announce, check_steps_left, peak_memory, start_run, write_json
from tether.train.sampling import weights_updated
from tether.train.sharding import is_sharded, sampling_copy_of


class DPOObjective:
    """Σ over preference examples of the chosen loss (+ sft_coef × the chosen answer's mean token NLL).

    One forward scores every response of the micro-batch (collate puts the K responses of each example in
    K row blocks); the loop divides by the step's example count, so accumulation and processes do not change
    the gradient. Statistics (summed here, averaged by the loop) are the glossary's train/rewards/*,
    train/logps/*, train/accuracy, train/beta.
    """

    unit = "pairs"

    def __init__(self, d, beta_state: dict | None = None):
        self.d = d
        self.beta = d.effective_beta
        self.needs_reference = d.loss not in REFERENCE_FREE
        # β-DPO's running margin statistics (M_0, σ) and those the step's weights use, restored on resume
        self.state = beta_state or {"mean": None, "std": 1.0}
        self._weight_norm = None  # the step's mean pair weight (β-DPO weighting)
        self.reference_point = None  # KTO's z_0 for this optimizer step (begin_step)

    def count(self, batch: dict) -> int:
        return int(batch["list_mask"].shape[0])

    def sequence_logps(self, model, batch: dict):
        """(B, K) Σ log π over each response's tokens and (B, K) token counts, from one forward (padded or packed)."""
        b, k = batch["list_mask"].shape
        sums, tokens = sequence_logprob_sums(model, batch, k * b)  # (K·B,) response-major
        return sums.view(k, b).T, tokens.view(k, b).T

    @staticmethod
    def block_logps(model, batch: dict, block: int) -> torch.Tensor:
        """(B,) Σ log π over the tokens of every example's ``block``-th response (one block of the batch's rows)."""
        b = batch["list_mask"].shape[0]
        return sequence_logprob_sums(model, group_rows(batch, block, b), b)[0]

    def _margins(self, logps, ref) -> torch.Tensor:
        return beta_dpo_margins(logps, ref, self.d.effective_beta, scaled=self.d.beta_dpo_margin == "scaled")

    @torch.no_grad()
    def begin_step(self, model, micro_batches: list[dict], reduce) -> None:
        """KTO: the step's reference point z_0 from every mismatched completion of the step (all processes).
        β-DPO: β for this step from the whole step batch's mean margin; the running M_0 and σ move after.
        The pair weights of this step use the statistics from before the move (kept as old_mean, old_std), the
        same ones their normalisation was computed with, so they average exactly 1 over the step."""
        if self.d.loss == "kto":
            total = torch.zeros(2, dtype=torch.float64)  # Σ mismatched log-ratio, n
            for batch in micro_batches:
                logps = self.block_logps(model, batch, 1)  # the mismatched completions
                ratio = (logps - batch["reference_logps"][:, 1].to(logps.device)).double().cpu()
                total += torch.stack([ratio.sum(), torch.tensor(float(len(ratio)), dtype=torch.float64)])
            total = reduce(total).cpu()
            self.reference_point = float(kto_reference_point_from_sums(total[0], total[1]))
            return
        if self.d.loss != "beta_dpo":
            return
        total = torch.zeros(4, dtype=torch.float64)  # Σ M, Σ M², Σ w, n
        old_mean, old_std = self.state["mean"], self.state["std"]
        for batch in micro_batches:
            logps, _ = self.sequence_logps(model, batch)
            m = self._margins(logps, batch["reference_logps"]).double().cpu()
            w = beta_dpo_pair_weights(m, old_mean, old_std) if old_mean is not None else torch.ones_like(m)
            total += torch.stack([m.sum(), (m * m).sum(), w.sum(), torch.tensor(float(len(m)), dtype=torch.float64)])
        total = reduce(total).cpu()
        n = float(total[3])
        batch_mean = float(total[0]) / n
        batch_std = max(float(total[1]) / n - batch_mean**2, 0.0) ** 0.5
        reference_margin = batch_mean if old_mean is None else old_mean
        self.beta = beta_dpo_beta(
            torch.tensor([batch_mean]), self.d.effective_beta, self.d.beta_dpo_alpha, reference_margin
        )
        self._weight_norm = float(total[2]) / n
        mom = self.d.beta_dpo_momentum
        self.state = {
            "mean": batch_mean if old_mean is None else mom * old_mean + (1 - mom) * batch_mean,
            "std": batch_std if old_mean is None else mom * old_std + (1 - mom) * batch_std,
            "old_mean": old_mean,
            "old_std": old_std,
        }

    def loss_sum(self, model, batch: dict):
        d = self.d
        if d.loss == "kto":
            return self._kto(model, batch)
        logps, tokens = self.sequence_logps(model, batch)
        ref = batch.get("reference_logps")
        if self.needs_reference and ref is None:
            raise RuntimeError("reference log-probabilities are missing from the batch")
        losses = preference_loss(
            d.loss,
            logps,
            ref if self.needs_reference else None,
            tokens,
            self.beta,
            d.label_smoothing,
            d.simpo_gamma,
            d.orpo_lambda,
            batch["list_mask"],
        )
        # Weighting needs a running σ from earlier steps; when every weight underflows (σ far smaller than the
        # spread of this step's margins) the step falls back to equal weights rather than dividing by zero.
        if (
            d.loss == "beta_dpo"
            and d.beta_dpo_weighting
            and model.training
            and self.state.get("old_mean") is not None
            and self._weight_norm
            and self._weight_norm > 1e-12
        ):
            m = self._margins(logps.detach(), ref)
            losses = (
                losses * beta_dpo_pair_weights(m, self.state["old_mean"], self.state["old_std"]) / self._weight_norm
            )
        chosen_nll = -logps[:, 0] / tokens[:, 0].clamp(min=1)
        if d.sft_coef:
            losses = losses + d.sft_coef * chosen_nll
        return losses.sum(), self._statistics(logps, ref, tokens, chosen_nll, batch["list_mask"], len(losses))

    def _kto(self, model, batch: dict):
        """Training: z_0 of the whole step (begin_step), so only the labelled completions are forwarded here;
        evaluation: this micro-batch's own estimate from its mismatched completions."""
        d = self.d
        ref = batch.get("reference_logps")
        if ref is None:
            raise RuntimeError("reference log-probabilities are missing from the batch")
        logps = self.block_logps(model, batch, 0)
        ref = ref.to(logps.device)
        desirable = batch["desirable"].to(logps.device)
        if model.training and self.reference_point is not None:
            z0 = torch.tensor(self.reference_point, device=logps.device)
        else:
            with torch.no_grad():
                z0 = kto_reference_point(self.block_logps(model, batch, 1), ref[:, 1])
        losses = kto_loss(logps, ref[:, 0], desirable, z0, self.beta, d.kto_desirable_weight, d.kto_undesirable_weight)
        with torch.no_grad():
            r = logps.detach() - ref[:, 0]
            n = len(losses)
            stats = {
                "kto/reference_point": z0.detach() * n,
                "kto/reward": (self.beta * r).sum(),
                "rewards/accuracy": ((r > z0) == desirable).float().sum(),
                "logps/chosen": logps.detach().sum(),
                "beta": torch.tensor(self.beta * n),
            }
        return losses.sum(), stats

    @torch.no_grad()
    def _statistics(self, logps, ref, tokens, chosen_nll, list_mask, n: int) -> dict:
        last = list_mask.sum(-1) - 1  # the worst-ranked real response
        worst = logps.gather(1, last[:, None]).squeeze(1)
        if self.needs_reference:
            r_chosen, r_rejected = implicit_rewards(
                logps[:, 0], worst, ref[:, 0], ref.gather(1, last[:, None]).squeeze(1), self.beta
            )
        else:  # the reference-free losses' own implicit reward: (β/|y|) log π(y)
            r_chosen = self.beta * logps[:, 0] / tokens[:, 0].clamp(min=1)
            r_rejected = self.beta * worst / tokens.gather(1, last[:, None]).squeeze(1).clamp(min=1)
        margins = r_chosen - r_rejected
        return {
            "rewards/chosen": r_chosen.sum(),
            "rewards/rejected": r_rejected.sum(),
            "rewards/margins": margins.sum(),
            "rewards/accuracy": (margins > 0).float().sum(),
            "logps/chosen": logps[:, 0].detach().sum(),
            "logps/rejected": worst.detach().sum(),
            "nll/chosen": chosen_nll.detach().sum(),
            "beta": torch.tensor(self.beta * n),
        }


# ------------------------------------------------------------------------------------------------- online


class PairLabeller:
    """Which of two answers is better: a judge function, or the higher score from the shared scorer."""

    def __init__(self, cfg: DPOConfig, tokenizer, reward_set, device):
        self.cfg = cfg
        self.judge = load_reward_function(cfg.online.judge) if cfg.online.judge else None
        self.scorer = (
            None
            if self.judge
            else Scorer(
                cfg.rewards,
                cfg.rollout.max_new_tokens,
                tokenizer,
                reward_set,
                load_reward_model_scorer(cfg.rewards, device, frozen_dtype(cfg.model)),
            )
        )

    def __call__(self, rows: list[dict], rollout) -> tuple[list[float], list[float]]:
        """(P(first is better) per prompt: 1, 0 or 0.5 — a tie, dropped; the score of every answer: the scorer's,
        or with a judge the answer's side of the verdict). rollout rows 2i and 2i+1 answer prompt i."""
        first, second = rollout.responses[0::2], rollout.responses[1::2]
        if self.judge is not None:
            preference = self._verdicts(rows, first, second)
            return preference, [p if i % 2 == 0 else 1.0 - p for p in preference for i in range(2)]
        totals = self.scorer(rollout, [r for r in rows for _ in range(2)]).flat().tolist()
        a, b = totals[0::2], totals[1::2]
        return [1.0 if x > y else 0.0 if x < y else 0.5 for x, y in zip(a, b)], totals

    def _verdicts(self, rows: list[dict], first: list[str], second: list[str]) -> list[float]:
        """The judge's P(first is better) per pair, each a number in [0, 1]; anything else is a RewardFunctionError
        (the online loop checkpoints the steps done and stops with it)."""
        name = self.cfg.online.judge
        columns = {k: [r.get(k) for r in rows] for k in rows[0] if k != "prompt"}
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
    backend,
    tokenizer,
    stops: list[int],
    rows: list[dict],
    labeller: PairLabeller,
    cfg: DPOConfig,
    seed: int,
    step: int,
    positions: list[int] | None = None,
):
    """Two answers per prompt from the current policy, labelled; ties, identical answers, empty ones and (unless
    keep_truncated) truncated ones dropped with their pair and counted. Returns (pairs, counts, SampleRecords of every answer). ``positions``:
    the prompts' places in the prompt stream, which seed each answer when rollout.response_seeds is on."""
    counts = {"prompts": len(rows), "ties": 0, "truncated": 0, "identical": 0, "empty": 0, "pairs": 0}
    if not rows:  # a process whose share of a small round is empty
        return [], counts, []
    torch.manual_seed(seed)
    texts = render_prompts(tokenizer, rows, cfg.rollout.prompts)
    ro = cfg.rollout
    seeds = response_seeds(seed, positions, 2) if ro.response_seeds and positions is not None else None
    rollout = backend.generate([t for t in texts for _ in range(2)], ro, stops, seeds)
    answers, truncated, lengths = rollout.responses, rollout.truncated.tolist(), rollout.lengths.tolist()
    preference, answer_scores = labeller(rows, rollout)
    samples = [
        SampleRecord(step, texts[i // 2], answers[i], float(answer_scores[i]), {}, int(lengths[i]), bool(truncated[i]))
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
    return pairs, counts, samples


class OnlineDPOStage:
    """Online DPO's step on the online loop: a new round of labelled pairs every steps_per_round steps, then the
    offline loop's optimizer step (tether/train/offline.py::train_step) on that round's pairs."""

    name = "dpo"

    def __init__(self, cfg: DPOConfig, setup: "DPOSetup", labeller: PairLabeller, prompt_rows: list[dict]):
        self.cfg, self.setup, self.labeller, self.prompt_rows = cfg, setup, labeller, prompt_rows
        self.policy, self.tokenizer = setup.unwrapped, setup.tokenizer
        self.dp = DataParallel(setup.accelerator)
        # --fsdp: the pairs are sampled from an ordinary copy of the sharded policy (the hf backend), or by an
        # engine pushed the gathered weights (train/sharding.py)
        self.sampling_policy = setup.sampling_copy if setup.sampling_copy is not None else self.policy
        self.backend = make_backend(cfg.rollout, self.sampling_policy, self.tokenizer)  # rollout.backend
        self.stops = stop_token_ids(self.tokenizer, self.sampling_policy)
        self.optimizer, self.scheduler = setup.optimizer, setup.scheduler
        self.scorer = labeller.scorer  # None with a judge
        self.order = EpochOrder(len(prompt_rows), cfg.train.seed)
        self.rounds: list[dict] = []  # counts of every sampled round
        self.round, self.examples = None, []

    def extra_parts(self) -> dict:
        return {}

    def state(self) -> dict:
        return {"beta_dpo": self.setup.objective.state, "online_rounds": self.rounds}

    def load_state(self, state: dict) -> None:
        self.setup.objective.state = state.get("beta_dpo") or self.setup.objective.state
        self.rounds = list(state.get("online_rounds", []))

    def summary(self) -> dict:
        return _summary(self.cfg, self.setup, {}, self.rounds)

    def plan(self) -> dict:
        o, ro = self.cfg.online, self.cfg.rollout
        return {
            **_plan(self.cfg, self.setup),
            "online": f"{o.rounds} rounds x {ro.prompts_per_step} prompts x 2 answers, {o.steps_per_round} steps each, "
            "labelled by " + (f"judge {o.judge}" if o.judge else self.labeller.scorer.describe()),
            "generation": self.backend.describe()
            + (
                "; a gathered copy of the sharded policy on every process"
                if self.setup.sampling_copy is not None
                else ""
            ),
        }

    def evaluate(self) -> dict:
        with phase("pairs"):
            return _evaluate_pairs(self.setup, self.cfg)

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
            read_records(path), self.tokenizer, length_limit(cfg.data.max_length, cfg.model.path), False, str(path)
        )
        if self.setup.reference is not None:
            self.setup.reference.fresh_policy = False
            with phase("reference"):
                self.setup.reference.attach(self.examples, use_cache=False)
        self.round, self.round_order = rnd, EpochOrder(len(self.examples), cfg.train.seed + rnd)
        return samples

    def _sample_round(self, rnd: int, step: int):
        """The round's pairs, counts and samples; on N processes each samples and labels a contiguous share of the
        round's prompts, and the shares are gathered in rank order (the one-process order)."""
        cfg, dp = self.cfg, self.dp
        first = rnd * cfg.rollout.prompts_per_step
        count = cfg.rollout.prompts_per_step
        mine = dp.shard(list(zip(self.order.slice(first, count), range(first, first + count))))  # (prompt, position)
        rows, positions = [self.prompt_rows[i] for i, _ in mine], [p for _, p in mine]
        pairs, counts, samples = dp.all_or_none(
            lambda: sample_round_pairs(
                self.backend,
                self.tokenizer,
                self.stops,
                rows,
                self.labeller,
                cfg,
                cfg.train.seed * 1000 + rnd,
                step + 1,
                positions,
            )
        )
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
            metrics = _offline_step(self.setup, self.cfg, self.examples, self.round_order, step)
        weights_updated(self.backend, self.policy, self.setup.sampling_copy)
        elapsed = time.perf_counter() - t1
        metrics.update(
            {
                "time/sample_s": t1 - t0,
                "time/step_s": elapsed,
                "perf/pairs_per_s": metrics["train/pairs"] / max(elapsed, 1e-9),
            }
        )
        return metrics, samples


def write_json_lines(path: Path, rows: list[dict]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.replace(path)


# ---------------------------------------------------------------------------------------- shared set-up


@dataclass
class DPOSetup:
    """What both DPO paths load: run folder, tokenizer, data, model, reference, optimizer."""

    accelerator: object
    config: dict
    out: Path
    start_step: int
    checkpoint: Path | None
    tokenizer: object
    train: list
    evals: list
    reports: list
    model: object
    unwrapped: object
    objective: DPOObjective
    reference: ReferenceLogps | None
    reference_source: str
    optimizer: object
    scheduler: object
    total_steps: int
    state: dict
    sampling_copy: object = None  # online --fsdp: an ordinary copy of the sharded policy, which samples the pairs


def _load_offline(cfg: DPOConfig, tokenizer):
    """Training and held-out examples; online runs may have held-out pairs only (--eval-data without --data)."""
    d = cfg.data
    eval_records = read_records(d.eval_path, d.columns, d.split) if d.eval_path else None
    limit = length_limit(d.max_length, cfg.model.path)
    tokenizer_of = tokenize_unpaired if cfg.dpo.loss == "kto" else tokenize_policy_preferences

    def tokenize(recs, label):
        return tokenizer_of(recs, tokenizer, limit, d.strict, label)

    if d.path:
        _, _, train, evals, reports = tokenize_split(
            read_records(d.path, d.columns, d.split, d.max_records),
            eval_records,
            d.eval_fraction,
            cfg.train.seed,
            d.path,
            tokenize,
            d.eval_path,
            (lambda rec: rec.fields.get("label")) if cfg.dpo.loss == "kto" else None,  # both labels on each side
        )
    else:  # online, held-out pairs only
        train, (evals, report) = [], tokenize(eval_records, d.eval_path)
        reports = [report]
    longest = max((len(e.responses) for e in train + evals), default=2)
    if longest > 2 and cfg.dpo.loss != "listwise":
        raise ConfigError(
            f"{d.path} holds ranked lists of up to {longest} responses; loss {cfg.dpo.loss} compares "
            "pairs — use --loss listwise (Plackett–Luce), or pairs data"
        )
    return train, evals, reports


def _load_data(cfg: DPOConfig):
    """(tokenizer, train, held-out, reports), read and checked before the run folder is touched."""
    tokenizer = load_stage_tokenizer(cfg.model)
    train, evals, reports = _load_offline(cfg, tokenizer) if (cfg.data.path or cfg.data.eval_path) else ([], [], [])
    return tokenizer, train, evals, reports


def _setup(cfg: DPOConfig, data, accelerator, config: dict, start_step: int, checkpoint: Path | None) -> DPOSetup:
    out = Path(cfg.train.output)
    tokenizer, train, evals, reports = data
    if cfg.online.online:
        total_steps = cfg.total_steps_online
        cfg.train.grad_accum(accelerator.num_processes)
        check_steps_left(start_step, total_steps, checkpoint)
    else:
        total_steps = plan_steps(cfg, accelerator, len(train), start_step, checkpoint)
    model = load_trainable_model(cfg.model, tokenizer, checkpoint).to(accelerator.device)
    if cfg.model.padding_free:
        check_position_restarts(model, cfg.model.path)
    state = json.loads((checkpoint / "trainer_state.json").read_text()) if checkpoint else {}
    objective = DPOObjective(cfg.dpo, state.get("beta_dpo"))
    reference, source = None, "not used (reference-free loss)"
    if objective.needs_reference:
        reference = ReferenceLogps(
            cfg.model,
            cfg.dpo.reference_cache or str(out / "reference_cache"),
            cfg.dpo.reference_batch_size,
            tokenizer,
            model,
            accelerator.device,
            fresh_policy=checkpoint is None,
            padding_free=cfg.model.padding_free,
        )
        source = f"computed each round from {reference.describe()}"
        used = _visited(train, cfg, total_steps) + evals  # a run that sees a third of the pairs scores a third
        if used:
            if accelerator.is_main_process:  # one process scores and caches, the others read the cache
                source = reference.attach(used)
            accelerator.wait_for_everyone()
            if not accelerator.is_main_process:
                reference.attach(used)
            if len(used) < len(train) + len(evals):
                source += f" for the {len(used) - len(evals)} of {len(train)} training examples the run's steps visit"
    sharded = cfg.model.fsdp and accelerator.num_processes > 1
    # the hf backend samples from a copy; an engine (vllm) is pushed the sharded weights gathered
    gathered_copy = cfg.online.online and sharded and BACKENDS[cfg.rollout.backend].samples_trainer_weights
    sampling_copy = sampling_copy_of(model) if gathered_copy else None
    # the optimizer's state is restored by the offline and online loops' own resume (_run_offline, run_online)
    model, optimizer, scheduler, _ = prepare_trained(model, cfg, accelerator, total_steps, None)
    return DPOSetup(
        accelerator,
        config,
        out,
        start_step,
        checkpoint,
        tokenizer,
        train,
        evals,
        reports,
        model,
        accelerator.unwrap_model(model),
        objective,
        reference,
        source,
        optimizer,
        scheduler,
        total_steps,
        state,
        sampling_copy,
    )


def _visited(train: list, cfg: DPOConfig, total_steps: int) -> list:
    """The training examples the offline loop's steps will draw (EpochOrder of the run's seed), in file order:
    only these need reference log-probs (online runs keep every example, as before)."""
    if not train or cfg.online.online:
        return train
    order = EpochOrder(len(train), cfg.train.seed)
    drawn = total_steps * cfg.train.batch_size
    if drawn >= len(train):  # an epoch or more: every example
        return train
    return [train[i] for i in sorted(set(order.slice(0, drawn)))]


def _plan(cfg: DPOConfig, s: DPOSetup) -> dict:
    d = cfg.dpo
    return {
        "loss": f"{d.loss} (β {d.effective_beta:g}"
        + (f", ε {d.label_smoothing:g}" if d.label_smoothing else "")
        + (f", SFT term {d.sft_coef:g}" if d.sft_coef else "")
        + (f", λ_D {d.kto_desirable_weight:g}, λ_U {d.kto_undesirable_weight:g}" if d.loss == "kto" else "")
        + ")",
        "examples (train / eval)": f"{len(s.train)} / {len(s.evals)}"
        + (f" {s.reports[0].format}" if s.reports else ""),
        "reference log-probs": s.reference_source,
        "batch per optimizer step": cfg.train.batch_size,
        "processes x micro-batch x accumulation": cfg.train.micro_batch_plan(s.accelerator.num_processes),
        "micro-batch rows": describe(cfg.model.padding_free),
        "optimizer steps": s.total_steps,
        "model": parameter_summary(s.model)
        + (f", sharded over {s.accelerator.num_processes} processes (FSDP2)" if is_sharded(s.model) else ""),
    }


def _collate(setup: DPOSetup, cfg: DPOConfig):
    return lambda exs: collate_policy_preferences(exs, setup.tokenizer.pad_token_id, cfg.model.padding_free)


def _evaluate_pairs(setup: DPOSetup, cfg: DPOConfig) -> dict:
    from tether.train.offline import evaluate as held_out

    if not setup.evals:
        return {}
    return held_out(
        setup.accelerator, setup.model, setup.evals, _collate(setup, cfg), setup.objective, cfg.train.micro_batch_size
    )


def _offline_step(setup: DPOSetup, cfg: DPOConfig, examples: list, order: EpochOrder, step: int) -> dict:
    """One optimizer step on ``examples`` in the offline loop's order and batching."""
    acc, t = setup.accelerator, cfg.train
    per_process = t.batch_size // acc.num_processes
    indices = order.batch(step, t.batch_size)[acc.process_index * per_process : (acc.process_index + 1) * per_process]
    micro, filler = step_micro_batches(
        acc,
        [examples[i] for i in indices],
        _collate(setup, cfg),
        loop_settings(cfg.train, setup.total_steps, cfg.optim.max_grad_norm),
    )
    setup.model.train()
    params = [p for p in setup.model.parameters() if p.requires_grad]
    metrics = train_step(
        acc,
        setup.model,
        setup.optimizer,
        setup.scheduler,
        micro,
        setup.objective,
        params,
        cfg.optim.max_grad_norm,
        filler,
    )
    return {**metrics, "train/epoch": order.epoch_at(step + 1, t.batch_size)}


def _summary(cfg: DPOConfig, setup: DPOSetup, last_eval: dict, rounds: list) -> dict:
    return {
        "loss": cfg.dpo.loss,
        "beta": cfg.dpo.effective_beta,
        "train_examples": len(setup.train),
        "eval_examples": len(setup.evals),
        **last_eval,
        "online_rounds": rounds,
        "reference_examples_computed": setup.reference.computed if setup.reference else 0,
        "data": [r.summary() for r in setup.reports],
    }


# ---------------------------------------------------------------------------------------------------- run


def run_dpo(cfg: DPOConfig, evaluate_fn=None) -> dict:
    """Train; ``evaluate_fn(policy, tokenizer) -> dict`` adds task metrics (on the lab: gold win rate) to every
    evaluation, including one before the first step."""
    return _run_online(cfg, evaluate_fn) if cfg.online.online else _run_offline(cfg, evaluate_fn)


def _run_online(cfg: DPOConfig, evaluate_fn) -> dict:
    data = _load_data(cfg)
    start = start_online(
        cfg, cfg.total_steps_online, cfg.rewards, cfg.rollout.prompts, "", stand_in_reward=bool(cfg.online.judge)
    )
    setup = _setup(cfg, data, start.accelerator, start.config, start.start_step, start.checkpoint)
    labeller = PairLabeller(cfg, setup.tokenizer, start.reward_set, start.accelerator.device)
    stage = OnlineDPOStage(cfg, setup, labeller, start.prompt_rows)
    schedule = Schedule.of(
        cfg.train,
        setup.total_steps,
        stop_on_alarm=cfg.online.stop_on_alarm,
        sample_every=1,
        round_steps=cfg.online.steps_per_round,
    )
    return run_online(
        stage, schedule, start.config, start.accelerator, start.out, start.checkpoint, "tether dpo", evaluate_fn
    )


def _run_offline(cfg: DPOConfig, evaluate_fn) -> dict:
    t_start = time.perf_counter()
    check_lora_reference(cfg.model)  # before anything is written
    if not cfg.data.path:
        raise ConfigError("--data is required")
    data = _load_data(cfg)
    accelerator, config, _, start_step, checkpoint = start_run(cfg, {"--output": cfg.train.output})
    s = _setup(cfg, data, accelerator, config, start_step, checkpoint)
    if checkpoint is not None:
        load_training_state(
            checkpoint,
            s.optimizer,
            s.scheduler,
            accelerator.process_index,
            sharded_model=s.model if is_sharded(s.model) else None,
        )
    if is_sharded(s.model) and evaluate_fn is not None:
        raise ConfigError(
            "--fsdp: a task evaluation (the lab's) runs on process 0 alone, which a sharded model "
            "cannot; run it without --fsdp"
        )
    if accelerator.is_main_process:
        announce("tether dpo", {**_plan(cfg, s), "start step": start_step}, config, s.out, s.reports, checkpoint)
    history: list[dict] = list(s.state.get("eval_history", []))

    def evaluate() -> dict:
        metrics = _evaluate_pairs(s, cfg)
        if evaluate_fn is not None and accelerator.is_main_process:
            metrics.update({f"eval/{k}": v for k, v in evaluate_fn(s.unwrapped, s.tokenizer).items()})
        return metrics

    logger = offline_logger(cfg, accelerator, s.out, config, start_step, s.total_steps, "dpo")
    if start_step == 0 and (s.evals or evaluate_fn is not None):
        baseline = evaluate()
        history.append({"step": 0, **baseline})
        logger.log({"step": 0, **{k.replace("eval/", "eval0/", 1): v for k, v in baseline.items()}})
    # with no held-out pairs but a task evaluation, a stand-in list makes the loop call evaluate()
    last_eval, _ = run_offline_loop(
        cfg,
        accelerator,
        logger,
        s.total_steps,
        model=s.model,
        optimizer=s.optimizer,
        scheduler=s.scheduler,
        train_examples=s.train,
        eval_examples=s.evals or ([None] if evaluate_fn is not None else []),
        collate_fn=_collate(s, cfg),
        objective=s.objective,
        start_step=start_step,
        output=s.out,
        tokenizer=s.tokenizer,
        on_eval=lambda step, m: history.append({"step": step, **m}) and False,
        checkpoint_state=lambda: {"beta_dpo": s.objective.state, "eval_history": history},
        evaluate_fn=evaluate,
    )
    summary = {
        "stage": "dpo",
        "steps": s.total_steps,
        "resumed_from": start_step or None,
        **_summary(cfg, s, last_eval, []),
        "eval_history": history,
        "alarms": [],
        "stopped_at": None,
        "wall_s": round(time.perf_counter() - t_start, 2),
        "peak_memory": peak_memory(accelerator),
    }
    save_final(accelerator, s.model, s.tokenizer, s.out / "final")
    if accelerator.is_main_process:
        write_json(s.out / "summary.json", summary)
        console.print(
            f"final model: {s.out / 'final'}  "
            + "  ".join(f"{k} {v:.4g}" for k, v in last_eval.items() if isinstance(v, float))
        )
    accelerator.wait_for_everyone()
    return summary
