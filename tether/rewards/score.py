"""One scorer for every online stage: a reward model and/or reward functions, summed with weights, then shaped.

The same rules everywhere: the reward model reads prompt + response, plus EOS only where the response ended with
one (a truncated answer is scored as the unfinished text it is); reward functions get the sampled token ids
(never a re-tokenisation of the decoded text) and the truncation flags; every component is kept by name for
logging. A component that returns step scores is a process reward: its weighted step scores are kept apart
(the group family turns them into token advantages) and its step sum is logged.

    total = w_RM · RM(x, y) + w_J · judge(x, y) + Σ_i w_i · f_i(x, y) + overlong(|y|)    (outcome components only)
    then, if asked: truncated → truncation_penalty; clip to [−c, c]       (docs/algorithms.md §8)
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from tether.algorithms.shaping import clip_scores, overlong_penalty, truncation_penalty
from tether.config import ConfigError
from tether.data.images import IMAGES
from tether.data.steps import trained_step_end
from tether.models.work import current_section, phase
from tether.rewards.functions import RewardFunctionError, RewardSet


@dataclass
class Scores:
    """Scores of B responses."""

    total: torch.Tensor  # (B,) outcome score after shaping
    parts: dict[str, torch.Tensor]  # component -> (B,) raw values (a process reward: its step sum)
    step_scores: list[list[float]] | None  # (B,) weighted step scores of the process reward, if there is one
    has_outcome: bool  # some component other than the process reward scores whole responses
    step_ends: list[list[int]] | None = None  # (B,) the token index ending each step, where it is known (agent turns)
    records: list[dict] | None = None  # (B,) an agent episode's record (tether/agents/episodes.py)

    def flat(self) -> torch.Tensor:
        """(B,) outcome total plus the process reward's step sum: one number per response."""
        if self.step_scores is None:
            return self.total
        return self.total + torch.tensor([sum(s) for s in self.step_scores])

    def select(self, idx: torch.Tensor) -> "Scores":
        pick = idx.tolist()
        steps = [self.step_scores[i] for i in pick] if self.step_scores is not None else None
        ends = [self.step_ends[i] for i in pick] if self.step_ends is not None else None
        records = [self.records[i] for i in pick] if self.records is not None else None
        return Scores(
            self.total[idx], {k: v[idx] for k, v in self.parts.items()}, steps, self.has_outcome, ends, records
        )

    @staticmethod
    def cat(parts: list["Scores"]) -> "Scores":
        steps = [s for p in parts for s in p.step_scores] if parts[0].step_scores is not None else None
        ends = [s for p in parts for s in p.step_ends] if parts[0].step_ends is not None else None
        records = [s for p in parts for s in p.records] if parts[0].records is not None else None
        return Scores(
            torch.cat([p.total for p in parts]),
            {k: torch.cat([p.parts[k] for p in parts]) for k in parts[0].parts},
            steps,
            parts[0].has_outcome,
            ends,
            records,
        )


def load_process_reward_scorer(rewards_cfg, device, dtype: str = "float32"):
    """The RewardSection's process reward model as (texts, step end offsets) -> step probabilities, or None."""
    if not rewards_cfg.process_reward_model:
        return None
    from tether.console import loading
    from tether.models.reward import ProcessRewardScorer

    loading(f"the process reward model from {rewards_cfg.process_reward_model}")
    return ProcessRewardScorer(rewards_cfg.process_reward_model, device, dtype)


def load_reward_model_scorer(rewards_cfg, device, dtype: str = "float32"):
    """The RewardSection's reward model as texts -> scores (normalised, head weights applied), or None."""
    if not rewards_cfg.reward_model:
        return None
    from tether.console import loading
    from tether.models.reward import RewardScorer

    loading(f"the reward model from {rewards_cfg.reward_model}")
    return RewardScorer(
        rewards_cfg.reward_model, rewards_cfg.head_weights, rewards_cfg.normalize_reward, device, dtype=dtype
    )


def process_rows(process_model, texts: list[str], char_ends: list[list[int]], rows: list[dict]) -> list[list[float]]:
    """A vision-language process reward model's (models/reward.py ProcessRewardScorer) step probabilities of
    ``texts`` (rendered prompt + response) with their prompt ``rows``' images: each text widened by the model's
    processor, its steps at the tokens holding their last characters moved by the tokens the images add, and checked
    to be the same tokens (a processor of another family is an error, not a misread step)."""
    from tether.data.multimodal import Widened, prompt_images, vision_of

    encoded = []
    for text, ends, row in zip(texts, char_ends, rows):
        if not ends:
            encoded.append(None)
            continue
        ids, steps, specials = process_model.text_steps(text, ends)
        images = prompt_images(row, "a prompt row", 2**62)  # checked when the prompt file was read
        if not images:
            encoded.append((ids, steps, None))
            continue
        wide = Widened(process_model.processor, add_special=specials)(text, images)
        wide_ids = wide["input_ids"][0].tolist()
        shift, first = len(wide_ids) - len(ids), min(steps)
        if shift < 0 or wide_ids[first + shift :] != ids[first:]:
            raise ConfigError(
                "the process reward model's processor gives other tokens than its tokenizer after the images, so "
                "its steps cannot be located: is it of the policy's family?"
            )
        encoded.append((wide_ids, [t + shift for t in steps], vision_of(wide, process_model.processor) or None))
    return process_model.score_encoded(encoded)


def score_rows(reward_model, rows: list[dict], responses: list[str], max_pixels: int) -> list[float]:
    """A vision-language reward model's (models/reward.py RewardScorer) rewards of ``responses`` to the prompt ``rows``
    (their images' paths absolute: data/prompts.py), each rendered as its training pairs were (data/preferences.py
    encode_scored: a chat prompt's answer as an assistant turn, a plain prompt's + EOS) with the prompt's images."""
    from tether.data.preferences import encode_scored

    tokenizer, processor = reward_model.tokenizer, reward_model.processor
    encoded = []
    for i, (row, text) in enumerate(zip(rows, responses)):
        response = [{"role": "assistant", "content": text}] if isinstance(row.get("prompt"), list) else text
        encoded.append(
            encode_scored(row, response, tokenizer, processor, f"response {i}", "response", max_pixels, None)
        )
    return reward_model.score_encoded(encoded)


def audited_response(step: int, prompt: str, response: str, share: float) -> bool:
    """Whether the audit scores this response: the first 8 bytes of sha256(step, prompt, response), read as a number
    in [0, 1), fall below ``share`` — a choice that depends on nothing else, so N processes and a resumed run audit
    exactly the responses one uninterrupted process does."""
    digest = hashlib.sha256(f"{step}\x1f{prompt}\x1f{response}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < share


def audit_sums(audit, step: int, share: float, rows, prompts, responses, ids, truncated, proxy) -> dict[str, float]:
    """The trusted check (``audit``, a RewardSet of one function) on the responses audited_response picks at
    ``step``: its scores' sums beside the proxy's (``proxy``, what each response earned) on the same responses, for
    scorer_rates (audit/*, docs/metrics.md). Answers it has no opinion on (None) are counted, not scored. An episode
    is audited the same way, its readable transcript standing for the response (tether/agents/episodes.py)."""
    picked = [i for i, (p, r) in enumerate(zip(prompts, responses)) if audited_response(step, p, r, share)]
    if not picked:
        return {}
    values = audit.score(
        [rows[i] for i in picked],
        [responses[i] for i in picked],
        [ids[i] for i in picked],
        [truncated[i] for i in picked],
    )
    (scores,) = values.values()
    judged = [(i, float(v)) for i, v in zip(picked, scores) if v is not None and not isinstance(v, list)]
    return {
        "audit/n": len(judged),
        "audit/none": len(picked) - len(judged),
        "audit/score_sum": sum(v for _, v in judged),
        "audit/score_sq_sum": sum(v * v for _, v in judged),
        "audit/proxy_sum": sum(float(proxy[i]) for i, _ in judged),
        "audit/proxy_sq_sum": sum(float(proxy[i]) ** 2 for i, _ in judged),
        "audit/score_proxy_sum": sum(v * float(proxy[i]) for i, v in judged),
    }


def scorer_rates(sums: dict[str, float]) -> dict[str, float]:
    """A step's scorer metrics from its sums over processes: the judge's (rewards/judge.py judge_rates) and the
    audit's — audit/n, audit/none, audit/score_mean and audit/score_std (population) of the trusted check, and
    audit/proxy_mean and audit/proxy_std, the total score of the same responses, and audit/score_proxy_cov, the
    two's covariance over those responses (population: what a monitor needs to pool steps into blocks and compare
    the check with what the proxy predicts of it)."""
    from tether.rewards.judge import judge_rates

    out = judge_rates({k: v for k, v in sums.items() if "judge/" in k})
    n = sums.get("audit/n", 0.0)
    if "audit/n" in sums:
        out.update({"audit/n": n, "audit/none": sums["audit/none"]})
    if n:
        mean = sums["audit/score_sum"] / n
        out["audit/score_mean"] = mean
        out["audit/score_std"] = max(sums["audit/score_sq_sum"] / n - mean * mean, 0.0) ** 0.5
        proxy = sums["audit/proxy_sum"] / n
        out["audit/proxy_mean"] = proxy
        out["audit/proxy_std"] = max(sums["audit/proxy_sq_sum"] / n - proxy * proxy, 0.0) ** 0.5
        out["audit/score_proxy_cov"] = sums["audit/score_proxy_sum"] / n - mean * proxy
    return out


class Scorer:
    """Reward model + reward functions + shaping -> Scores (a RewardSection says which and how)."""

    def __init__(
        self,
        rewards_cfg,
        max_new_tokens: int,
        tokenizer,
        reward_set: RewardSet | None,
        reward_model=None,
        allow_process: bool = True,
        process_model=None,
        judge=None,
        audit=None,
    ):
        """``reward_set``: load_reward_set(rewards_cfg, rows), checked before any model is loaded;
        ``reward_model(texts) -> list[float]``: load_reward_model_scorer(), or a stand-in (the lab, tests);
        ``process_model(texts, step_end_offsets) -> step probabilities``: load_process_reward_scorer();
        ``judge(rows, responses, group_size) -> scores``: rewards/judge.py load_judge(); ``audit``: the RewardSet of
        --audit (rewards/functions.py load_audit_set), scored on rewards_cfg.audit_share of the responses."""
        self.cfg, self.tokenizer, self.max_new_tokens = rewards_cfg, tokenizer, max_new_tokens
        self.allow_process = allow_process
        self.rewards, self.reward_model, self.process_model = reward_set, reward_model, process_model
        self.judge, self.audit, self.step = judge, audit, 0
        self.audit_sums: dict[str, float] = {}
        if all(x is None for x in (reward_model, reward_set, process_model, judge)):
            raise ConfigError(
                "a reward is required: --reward-model DIR, --judge-model DIR and/or --reward module:function"
            )
        if process_model is not None and rewards_cfg.process_reward_aggregation == "steps" and not allow_process:
            raise ConfigError(
                "--process-reward-model with process_reward_aggregation=steps gives step scores; this stage needs "
                "one score per response: choose --process-reward-aggregation min, sum, mean or last"
            )
        self.overlong_cache = rewards_cfg.overlong_tokens(max_new_tokens)

    def describe(self) -> str:
        """The reward as the plan prints it."""
        terms = [f"{self.cfg.reward_model_weight:g} x reward model"] if self.reward_model is not None else []
        terms += [f"{self.judge.cfg.weight:g} x {self.judge.describe()}"] if self.judge is not None else []
        terms += [f"{c.weight:g} x {c.name}" for c in (self.rewards.components if self.rewards else [])]
        if self.process_model is not None:
            how = self.cfg.process_reward_aggregation
            terms.append(
                f"{self.cfg.process_reward_weight:g} x process reward model "
                + ("(each step's probability on its last token)" if how == "steps" else f"({how} over the steps)")
                + f", read before the separator {self.process_model.step_separator!r} it was trained with"
            )
        terms += [f"overlong (last {self.overlong_cache} tokens)"] if self.overlong_cache else []
        audit = (
            f"; audited by {self.cfg.audit} on {self.cfg.audit_share:.0%} of the training responses (logged, not trained on)"
            if self.audit is not None
            else ""
        )
        shaping = (["truncated -> %g" % self.cfg.truncation_penalty] if self.cfg.penalize_truncated else []) + (
            [f"clipped to ±{self.cfg.reward_clip:g}"] if self.cfg.reward_clip else []
        )
        return " + ".join(terms) + (f"; {', '.join(shaping)}" if shaping else "") + audit

    def image_shift(self, rows: list[dict], responses: list[str]) -> float | None:
        """The image probe on responses: mean |r(own images) − r(another row's images)| over the spread (population
        std) of r(own), the reward model's alone (a vision-language one; rows with an ``images`` column, each given the
        next such row's). A reward that barely moves is not looking at the picture (monitor image_blind_reward).
        None without such a reward model or with fewer than two rows showing images."""
        model = self.reward_model
        if model is None or not getattr(model, "reads_images", False):
            return None
        shown = [i for i, row in enumerate(rows) if row.get(IMAGES)]
        if len(shown) < 2 or len({str(rows[i][IMAGES]) for i in shown}) < 2:
            return None
        answers = [responses[i] for i in shown]
        swapped = [{**rows[i], IMAGES: rows[shown[(k + 1) % len(shown)]][IMAGES]} for k, i in enumerate(shown)]
        with phase("reward"):
            own = torch.tensor(score_rows(model, [rows[i] for i in shown], answers, max_pixels=2**62))
            other = torch.tensor(score_rows(model, swapped, answers, max_pixels=2**62))
        return float((own - other).abs().mean()) / max(float(own.std(unbiased=False)), 1e-12)

    def join_idle(self) -> None:
        """A process with no responses to score this time (N processes): it still runs its share of a sharded reward
        model's forwards, which every process runs in step (--fsdp, models/reward.py score_token_ids)."""
        if self.reward_model is not None and getattr(self.reward_model, "in_step", False):
            with phase("reward"):
                self.reward_model([])

    def __call__(self, rollout, rows: list[dict], group_size: int = 1) -> Scores:
        """Scores of ``rollout``'s responses to ``rows``, which come in contiguous groups of ``group_size`` (what a
        judge comparing a group's answers needs)."""
        parts: dict[str, torch.Tensor] = {}
        steps = None
        total = torch.zeros(len(rollout.responses))
        if self.reward_model is not None and getattr(self.reward_model, "reads_images", False):
            with phase("reward"):  # (prompt, images, response), rendered with the reward model's own processor
                # the rows' images were checked against --max-image-pixels when the prompt file was read
                values = score_rows(self.reward_model, rows, rollout.responses, max_pixels=2**62)
                parts["reward_model"] = torch.tensor(values, dtype=torch.float32)
            total += self.cfg.reward_model_weight * parts["reward_model"]
        elif self.reward_model is not None:
            eos = self.tokenizer.eos_token or ""
            texts = [
                p + r + ("" if t else eos)
                for p, r, t in zip(rollout.prompts, rollout.responses, rollout.truncated.tolist())
            ]
            with phase("reward"):
                parts["reward_model"] = torch.tensor(self.reward_model(texts), dtype=torch.float32)
            total += self.cfg.reward_model_weight * parts["reward_model"]
        if self.judge is not None:
            parts["judge"] = self.judge(rows, rollout.responses, group_size)
            total += self.judge.cfg.weight * parts["judge"]
        if self.rewards is not None:
            values = self.rewards.score(rows, rollout.responses, rollout.completion_ids(), rollout.truncated.tolist())
            others = self.reward_model is not None or self.judge is not None or self.process_model is not None
            if not others and all(x is None for v in values.values() for x in v):
                raise RewardFunctionError(
                    f"every reward function ({', '.join(values)}) returned None ('no opinion') for all "
                    f"{len(rollout.responses)} completions of step {self.rewards.trainer_state.global_step + 1}: the "
                    f"step would train on a score of 0 everywhere (first prompt: {str(rows[0].get('prompt'))[:80]!r})"
                )
            for c in self.rewards.components:
                v = values[c.name]
                process = any(isinstance(x, list) for x in v)
                if any(x is None for x in v):  # "no opinion" (TRL's convention): adds 0 (no step scores), counted
                    c.nones += sum(x is None for x in v)
                    v = [([] if process else 0.0) if x is None else x for x in v]
                if process:
                    steps = self._process(c, v, steps)
                    parts[c.name] = torch.tensor([sum(row) for row in v], dtype=torch.float32)  # logged as the step sum
                else:
                    parts[c.name] = torch.tensor(v, dtype=torch.float32)
                    total += c.weight * parts[c.name]
        if self.process_model is not None:
            steps, total = self._process_model_part(rollout, parts, steps, total, rows)
        if self.overlong_cache:
            # scores live on the CPU; the rollout may live on the device
            parts["overlong"] = overlong_penalty(rollout.lengths.cpu(), self.max_new_tokens, self.overlong_cache)
            total += parts["overlong"]
        if self.cfg.penalize_truncated:
            total = truncation_penalty(total, rollout.truncated.cpu(), self.cfg.truncation_penalty)
        total = clip_scores(total, self.cfg.reward_clip)
        if self.audit is not None and current_section() is None:  # training responses only
            # the proxy is what a response earns: its weighted step scores (a process reward) are paid like the rest
            earned = total if steps is None else total + torch.tensor([sum(row) for row in steps])
            self._audit(rollout, rows, earned)
        # the truncation penalty is an outcome too: with a process reward alone it is the only one (GRPO adds the
        # outcome's advantages to the steps' only when there is one)
        outcome = steps is None or len(parts) > 1 or bool(self.cfg.penalize_truncated)
        return Scores(total, parts, steps, has_outcome=outcome)

    def _audit(self, rollout, rows: list[dict], total: torch.Tensor) -> None:
        """The trusted check on the responses audited_response picks, beside the proxy (the total score, with a
        process reward's weighted step scores summed in), summed for the step (audit_sums)."""
        ids, truncated = rollout.completion_ids(), rollout.truncated.tolist()
        sums = audit_sums(
            self.audit, self.step, self.cfg.audit_share, rows, rollout.prompts, rollout.responses, ids, truncated, total
        )
        for key, value in sums.items():
            self.audit_sums[key] = self.audit_sums.get(key, 0.0) + value

    def _process_model_part(self, rollout, parts: dict, steps, total, rows: list[dict]):
        """The process reward model's step probabilities (steps end where --step-pattern matches): a process
        reward, or aggregated into one score per response (docs/algorithms.md §2.4). A vision-language one reads
        each text with its row's images (checked against --max-image-pixels when the prompt file was read)."""
        import re

        from tether.algorithms.reward import aggregate_step_scores

        regex, separator = re.compile(self.cfg.step_pattern), self.process_model.step_separator
        texts = [p + r for p, r in zip(rollout.prompts, rollout.responses)]
        # read where training read: at the step's last character, not past a separator the pattern consumed
        ends = [
            [trained_step_end(text, len(p) + m.end(), separator) for m in regex.finditer(r)]
            for text, p, r in zip(texts, rollout.prompts, rollout.responses)
        ]
        with phase("process_reward"):
            if getattr(self.process_model, "reads_images", False):
                probs = process_rows(self.process_model, texts, ends, rows)
            else:
                probs = self.process_model(texts, ends)
        w, how = self.cfg.process_reward_weight, self.cfg.process_reward_aggregation
        if how == "steps":
            if steps is not None:
                raise ConfigError("more than one process reward (functions returning step scores and a PRM)")
            parts["process_reward_model"] = torch.tensor([sum(row) for row in probs], dtype=torch.float32)
            return [[w * x for x in row] for row in probs], total
        width = max((len(row) for row in probs), default=0)
        padded = torch.tensor([row + [0.0] * (width - len(row)) for row in probs], dtype=torch.float32)
        mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in probs])
        parts["process_reward_model"] = aggregate_step_scores(
            padded.view(len(probs), width), mask.view(len(probs), width), how
        )
        return steps, total + w * parts["process_reward_model"]

    def _process(self, component, values: list[list[float]], steps):
        if not self.allow_process:
            raise ConfigError(
                f"reward function {component.name} returned step scores (a process reward); this stage "
                "needs one score per response. Process rewards are for `tether grpo`"
            )
        if steps is not None:
            raise ConfigError("more than one process reward (functions returning step scores); combine them into one")
        return [[component.weight * x for x in row] for row in values]

    def close(self) -> None:
        """Stop the reward functions' (and the audit's) worker process."""
        for functions in (self.rewards, self.audit):
            if functions is not None:
                functions.close()

    def set_progress(self, global_step: int, max_steps: int) -> None:
        """What the reward functions' ``trainer_state`` says from now on (the online loop calls it before each step);
        the step also picks the audited responses."""
        self.step = global_step
        for functions in (self.rewards, self.audit):
            if functions is not None:
                functions.set_progress(global_step, max_steps)

    @property
    def evaluation_group(self) -> int:
        """Answers the evaluation samples per held-out prompt: a judge comparing a group's answers needs a group."""
        return self.judge.group_size if self.judge is not None and self.judge.relative else 1

    def step_figures(self, section: str | None = None) -> dict[str, float]:
        """The judge's sums since the last call, of the step or of ``section`` (eval) (rewards/judge.py take_figures),
        and the audit's of the step; ``scorer_rates`` turns them into metrics."""
        out = self.judge.take_figures(section) if self.judge is not None else {}
        if section is None:
            out, self.audit_sums = {**out, **self.audit_sums}, {}
        return out

    def error_counts(self) -> dict[str, int]:
        """{name: failed calls} for every function, and {name/none: completions it had no opinion on} once any."""
        components = self.rewards.components if self.rewards else []
        return {**{c.name: c.errors for c in components}, **{f"{c.name}/none": c.nones for c in components if c.nones}}

    def restore_error_counts(self, counts: dict[str, int]) -> None:
        for c in self.rewards.components if self.rewards else []:
            c.errors, c.nones = counts.get(c.name, 0), counts.get(f"{c.name}/none", 0)
