"""A language model as the reward (docs/reward-models.md, "A language model as the judge"; the arithmetic in
docs/algorithms.md §12): the judge section says which model and how it is asked, its template file what it is asked.

    pointwise   one prompt an answer; the expected score over the score tokens (probs) or the parsed score (text)
    pairwise    each answer against a column of the prompt file (``column:NAME``), or every other answer of its group
                (``group``: round robin), or, in online DPO, the pair itself — always asked in both orders
    group       the whole group listed in one prompt, twice (its own order and reversed); P(best) per answer

An answer without a verdict is imputed (its group's parsed mean), counted, and a call with more than
``max_unparsed`` of its judge prompts unparsed stops the run (RewardFunctionError: the loop checkpoints first).
The cost and the judge's own figures (order inconsistency, first-slot bias, verdict mass) are summed per step for
metrics.jsonl (``take_figures``, ``judge_rates``).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

import torch

from tether.algorithms.judge import (
    best_of_listings,
    expected_score,
    first_slot_bias,
    first_slot_probability,
    impute_unparsed,
    order_inconsistent,
    round_robin,
    swap_averaged_preference,
)
from tether.config import ConfigError
from tether.data.probes import ADDRESSES_JUDGE
from tether.models.work import current_section
from tether.rewards.functions import RewardFunctionError
from tether.rewards.judge_template import JudgeTemplate, prompt_text


@dataclass
class Preference:
    """Swap-averaged P(a ≻ b) of pairs and what the two orders said (tensors (N,))."""

    p: torch.Tensor
    p_ab: torch.Tensor  # P(first shown wins) with a first
    p_ba: torch.Tensor  # the same with b first
    parsed: torch.Tensor  # both orders gave a verdict
    inconsistent: torch.Tensor


def load_judge(cfg, device, dtype: str = "float32", group_size: int = 1) -> "JudgeScorer | None":
    """The judge section's model as a JudgeScorer, or None without --judge-model."""
    if not cfg.model:
        return None
    if cfg.backend == "vllm":
        from tether.rollout.vllm_judge import VLLMJudge

        return JudgeScorer(
            cfg, VLLMJudge(cfg.model, dtype, cfg.batch_size, cfg.vllm_gpu_memory_utilization), group_size
        )
    from tether.console import loading
    from tether.models.judge import JudgeLM

    loading(f"the judge from {cfg.model}")
    return JudgeScorer(cfg, JudgeLM.load(cfg.model, device, dtype, cfg.batch_size), group_size)


def _bos_text(tokenizer) -> str:
    """The BOS a tokenizer puts before plain text by default ('' if it adds none): the judge's prompt is tokenised
    without special tokens, so a template that is not a chat carries the model's own start explicitly."""
    with_specials = tokenizer("x")["input_ids"]
    plain = tokenizer("x", add_special_tokens=False)["input_ids"]
    bos = tokenizer.bos_token_id
    return tokenizer.bos_token if bos is not None and with_specials[:1] == [bos] and plain[:1] != [bos] else ""


class JudgeScorer:
    """Scores answers with a judge (``lm``: next_token_logprobs(ids, targets) and ``tokenizer``, models/judge.py)."""

    def __init__(self, cfg, lm, group_size: int = 1):
        self.cfg, self.lm, self.group_size = cfg, lm, group_size
        self.template = t = JudgeTemplate.load(cfg.template, cfg.model)
        tokenizer = lm.tokenizer
        has_chat = bool(getattr(tokenizer, "chat_template", None))
        if t.chat == "true" and not has_chat:
            raise ConfigError(f"{t.path}: chat=true but the judge {cfg.model} has no chat template")
        self.chat = t.chat == "true" or (t.chat == "auto" and has_chat)
        self.lead = "" if self.chat else _bos_text(tokenizer)
        self.relative = relative = t.mode == "group" or cfg.baseline == "group"  # scores depend on the group
        if relative and group_size < 2:
            raise ConfigError(f"judge {t.mode} ({cfg.baseline or 'the group'}): needs groups of 2 or more answers")
        verdicts = [str(i + 1) for i in range(group_size)] if t.mode == "group" else list(t.verdicts)
        self.verdicts = verdicts
        self.verdict_ids = self._verdict_ids(verdicts) if t.read == "probs" else []
        self.values = torch.tensor(t.values, dtype=torch.float64) if t.mode == "pointwise" else None
        self.pattern = re.compile(t.pattern) if t.read == "text" else None
        self.sums: dict[str, float] = {}
        self.call: list = [0, 0, None]  # this call's judge prompts, those without a verdict, the first of them

    # -- the template, rendered and tokenised -------------------------------------------------------------------
    def _render(self, body: str) -> str:
        if self.chat:
            messages = [{"role": "user", "content": body}]
            start = self.lm.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            return start + self.template.answer_prefix
        return self.lead + body + self.template.answer_prefix

    def prompt_ids(self, bodies: list[str]) -> list[list[int]]:
        """The judge's prompt tokens for each body: rendered (chat or plain) and ending with the answer prefix, after
        which the verdict token is read (or trained: `tether judge`)."""
        return self._ids([self._render(b) for b in bodies])

    def _ids(self, texts: list[str]) -> list[list[int]]:
        return self.lm.tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []

    def _verdict_ids(self, verdicts: list[str]) -> list[int]:
        """Each verdict is one token right after the prefix, in context: ids(prompt + v) = ids(prompt) + [id]."""
        t, tokenizer = self.template, self.lm.tokenizer
        dummy = {"prompt": "…", "response": "…", "response_a": "…", "response_b": "…", "responses": "…", "k": "2"}
        text = self._render(t.fill(dummy, {}))
        base, out = self._ids([text])[0], []
        for verdict in verdicts:
            full = self._ids([text + verdict])[0]
            if len(full) != len(base) + 1 or full[: len(base)] != base:
                shared = next((i for i, (a, b) in enumerate(zip(base, full)) if a != b), min(len(base), len(full)))
                pieces = tokenizer.convert_ids_to_tokens(full[shared:])
                raise ConfigError(
                    f"{t.path}: the verdict {verdict!r} is not one token of the judge's tokenizer ({self.cfg.model}) "
                    f"right after answer_prefix {t.answer_prefix!r}: the end of the prompt reads {pieces}. Use "
                    "verdicts that are single tokens (a letter, a digit 1-9; a group judge needs at most 9 answers) "
                    "and end answer_prefix with a newline, or read the verdict as text (read: text, a pattern)"
                )
            out.append(full[-1])
        return out

    # -- reads --------------------------------------------------------------------------------------------------
    def _add(self, name: str, value: float) -> None:
        key = f"{current_section()}/judge/{name}" if current_section() else f"judge/{name}"
        self.sums[key] = self.sums.get(key, 0.0) + float(value)

    def _check_fits(self, ids: list[list[int]]) -> None:
        longest = max((len(row) for row in ids), default=0)
        room = self.cfg.max_new_tokens if self.template.read == "text" else 1
        if self.lm.context is not None and longest + room > self.lm.context:
            raise RewardFunctionError(
                f"a judge prompt of {longest} tokens (+{room} to answer) does not fit the judge's context of "
                f"{self.lm.context} tokens ({self.cfg.model}); judges never truncate a prompt: shorten the template "
                "or the answers (max_new_tokens)"
            )

    def _unparsed(self, parsed: torch.Tensor, outputs: list[str] | None = None) -> None:
        """Count a read's prompts without a verdict (for the step's figures and this call's threshold)."""
        missing = int((~parsed).sum())
        self._add("unparsed", missing)
        self.call[0] += parsed.numel()
        self.call[1] += missing
        if missing and self.call[2] is None:
            self.call[2] = (
                outputs[int((~parsed).nonzero()[0])] if outputs is not None else "(verdict mass below the floor)"
            )

    def _read_probs(self, bodies: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """(log-probs of the verdict tokens (N, K) float64, parsed (N,)): parsed where their mass reaches the floor."""
        ids = self._ids([self._render(b) for b in bodies])
        self._check_fits(ids)
        logprobs = self.lm.next_token_logprobs(ids, self.verdict_ids).double()
        mass = logprobs.exp().sum(-1)
        self._add("prompts", len(ids))
        self._add("prompt_tokens", sum(map(len, ids)))
        if not self.lm.normalised:  # an engine that normalises over the verdicts (vLLM) returns no mass
            self._add("verdict_mass", float(mass.sum()))
        parsed = mass >= self.cfg.min_verdict_mass
        self._unparsed(parsed)
        return logprobs, parsed

    def _read_text(self, bodies: list[str]) -> tuple[list[str | None], list[str]]:
        """(the verdict string of each greedy answer: the pattern's group 1, None where it did not match; the answers)."""
        texts = [self._render(b) for b in bodies]
        ids = self._ids(texts)
        self._check_fits(ids)
        outputs = self._generate(texts)
        self._add("prompts", len(texts))
        self._add("prompt_tokens", sum(map(len, ids)))
        found = [self.pattern.search(o) for o in outputs]
        # a pattern with alternatives ('Score: (\d)|Rating: (\d)') can match without its group 1: no verdict
        return [m.group(1).strip() if m and m.group(1) is not None else None for m in found], outputs

    def _generate(self, texts: list[str]) -> list[str]:
        """The judge's greedy answers after each rendered prompt, special tokens dropped (their tokens counted)."""
        answers, written = self.lm.generate(self._ids(texts), self.cfg.max_new_tokens)
        self._add("generated_tokens", written)
        return answers

    def _text_value(self, verdict: str | None) -> float | None:
        if verdict is None:
            return None
        if verdict in self.verdicts:
            return float(self.values[self.verdicts.index(verdict)])
        try:
            value = float(verdict)
        except ValueError:
            return None
        return value if value == value and abs(value) != float("inf") else None

    # -- modes --------------------------------------------------------------------------------------------------
    def bodies(self, rows, first, second=None) -> list[str]:
        """The template's body for each answer (pointwise) or each pair in the order given (pairwise)."""
        t = self.template
        if second is None:
            return [t.fill({"prompt": prompt_text(r["prompt"]), "response": y}, r) for r, y in zip(rows, first)]
        return [
            t.fill({"prompt": prompt_text(r["prompt"]), "response_a": a, "response_b": b}, r)
            for r, a, b in zip(rows, first, second)
        ]

    def _pointwise(self, rows, responses) -> tuple[torch.Tensor, torch.Tensor]:
        bodies = self.bodies(rows, responses)
        if self.template.read == "probs":
            logprobs, parsed = self._read_probs(bodies)
            return expected_score(logprobs, self.values)[0], parsed
        verdicts, outputs = self._read_text(bodies)
        values = [self._text_value(v) for v in verdicts]
        parsed = torch.tensor([v is not None for v in values], dtype=torch.bool)
        self._unparsed(parsed, outputs)
        return torch.tensor([0.0 if v is None else v for v in values], dtype=torch.float64), parsed

    def _first_wins(self, rows, first, second) -> tuple[torch.Tensor, torch.Tensor]:
        """P(the answer shown first wins) in one order, parsed (N,)."""
        bodies = self.bodies(rows, first, second)
        if self.template.read == "probs":
            logprobs, parsed = self._read_probs(bodies)
            return first_slot_probability(logprobs), parsed
        verdicts, outputs = self._read_text(bodies)
        parsed = torch.tensor([v in self.verdicts for v in verdicts], dtype=torch.bool)
        self._unparsed(parsed, outputs)
        return torch.tensor([1.0 if v == self.verdicts[0] else 0.0 for v in verdicts], dtype=torch.float64), parsed

    def _pair_figures(self, p_ab, p_ba, parsed) -> torch.Tensor:
        inconsistent = order_inconsistent(p_ab, p_ba) & parsed
        self._add("pairs", int(parsed.sum()))
        self._add("inconsistent", int(inconsistent.sum()))
        self._add("first_slot_bias", float(first_slot_bias(p_ab, p_ba)[parsed].sum()))
        return inconsistent

    def verdict_logprobs(self, rows, a: list[str], b: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """(ℓ_AB, ℓ_BA), each (N, 2): the judge's log-probs of the verdicts (first wins, second wins) with a shown
        first and with b shown first — full-vocabulary on the HF read (their negatives are `tether judge`'s loss)."""
        if self.template.read != "probs":
            raise ConfigError(f"{self.template.path}: verdict log-probs need a probability read (read: probs)")
        self.call = [0, 0, None]
        logprobs, _ = self._read_probs(self.bodies(rows + rows, a + b, b + a))
        return logprobs[: len(a)], logprobs[len(a) :]

    def prefer(self, rows, a: list[str], b: list[str]) -> Preference:
        """P(a ≻ b) for each pair, asked in both orders (one batch) and averaged."""
        p_first, parsed = self._first_wins(rows + rows, a + b, b + a)
        n = len(a)
        p_ab, p_ba, ok = p_first[:n], p_first[n:], parsed[:n] & parsed[n:]
        inconsistent = self._pair_figures(p_ab, p_ba, ok)
        return Preference(swap_averaged_preference(p_ab, p_ba), p_ab, p_ba, ok, inconsistent)

    def _round_robin(self, rows, responses, g: int) -> torch.Tensor:
        """Every answer against every other of its group, both orders: r_i = mean_j P(i ≻ j); an unparsed pair
        counts as a tie (½ both ways)."""
        groups = len(responses) // g
        pairs = [(k * g + i, k * g + j) for k in range(groups) for i in range(g) for j in range(g) if i != j]
        p_first, parsed = self._first_wins(
            [rows[i] for i, _ in pairs], [responses[i] for i, _ in pairs], [responses[j] for _, j in pairs]
        )
        first = torch.full((groups, g, g), 0.5, dtype=torch.float64)
        ok = torch.ones((groups, g, g), dtype=torch.bool)
        for (i, j), p, fine in zip(pairs, p_first.tolist(), parsed.tolist()):
            first[i // g, i % g, j % g], ok[i // g, i % g, j % g] = p, fine
        both = ok & ok.transpose(1, 2)
        first = torch.where(both, first, torch.full_like(first, 0.5))
        upper = torch.ones(g, g, dtype=torch.bool).triu(1).expand(groups, g, g)
        self._pair_figures(first[upper], first.transpose(1, 2)[upper], both[upper])
        return round_robin(swap_averaged_preference(first, first.transpose(1, 2))).reshape(-1)

    def _best_of(self, rows, responses, g: int) -> torch.Tensor:
        """The group listed twice (its own order, reversed); a group either listing gave no verdict on gets 1/G each."""
        t, bodies = self.template, []
        for k in range(len(responses) // g):
            group = responses[k * g : (k + 1) * g]
            for listed in (group, group[::-1]):
                values = {"prompt": prompt_text(rows[k * g]["prompt"]), "responses": t.listing(listed), "k": str(g)}
                bodies.append(t.fill(values, rows[k * g]))
        logprobs, parsed = self._read_probs(bodies)
        shares = best_of_listings(logprobs[0::2], logprobs[1::2])
        ok = (parsed[0::2] & parsed[1::2]).unsqueeze(-1)
        return torch.where(ok, shares, torch.full_like(shares, 1.0 / g)).reshape(-1)

    # -- the scorer's entry points --------------------------------------------------------------------------------
    def __call__(self, rows: list[dict], responses: list[str], group_size: int = 1) -> torch.Tensor:
        """(B,) float32 judge scores of ``responses`` (rows in contiguous groups of ``group_size``)."""
        began, self.call = time.perf_counter(), [0, 0, None]
        t, baseline = self.template, self.cfg.baseline
        if t.mode == "pointwise":
            scores, parsed = self._pointwise(rows, responses)
        elif t.mode == "pairwise" and baseline.startswith("column:"):
            column = baseline[len("column:") :]
            preference = self.prefer(rows, responses, [str(r[column]) for r in rows])
            scores, parsed = preference.p, preference.parsed
        else:
            if group_size != self.group_size or len(responses) % group_size:
                raise ConfigError(
                    f"the judge compares answers within groups of {self.group_size}; it was given {len(responses)} "
                    f"answers in groups of {group_size}"
                )
            read = self._round_robin if t.mode == "pairwise" else self._best_of
            scores = read(rows, responses, group_size)
            parsed = torch.ones(len(responses), dtype=torch.bool)
        self._check_unparsed()
        # under max_unparsed in prompts, yet no answer has a verdict (pairwise: each lacks one of its two orders)
        if not bool(parsed.any()):
            raise RewardFunctionError(
                f"the judge {self.cfg.model} gave no answer of this call a verdict ({self.call[1]} of {self.call[0]} "
                f"prompts without one; template {self.template.path}); first without one: {str(self.call[2])[:200]!r}"
            )
        self._injection_probe(rows, responses, scores, parsed)
        scores = impute_unparsed(scores, parsed, group_size if len(responses) % group_size == 0 else 1)
        self._add("seconds", time.perf_counter() - began)
        return scores.float()

    def _injection_probe(self, rows, responses, scores: torch.Tensor, parsed: torch.Tensor) -> None:
        """The share of answers that address the judge (data/probes.py ADDRESSES_JUDGE) and, where an answer's score
        does not depend on the rest of its group (pointwise, pairwise vs a column), what those words bought: each
        such answer scored again without them, judge/injection_shift = mean(score − score without)."""
        addressed = [i for i, y in enumerate(responses) if ADDRESSES_JUDGE.search(y)]
        self._add("judged", len(responses))
        self._add("addressed", len(addressed))
        if not addressed or self.relative:
            return
        picked = [rows[i] for i in addressed]
        cleaned = [ADDRESSES_JUDGE.sub("", responses[i]).strip() for i in addressed]
        if self.template.mode == "pointwise":
            again, fine = self._pointwise(picked, cleaned)
        else:
            column = self.cfg.baseline[len("column:") :]
            preference = self.prefer(picked, cleaned, [str(r[column]) for r in picked])
            again, fine = preference.p, preference.parsed
        both = fine & parsed[addressed]
        self._add("injection_probed", int(both.sum()))
        self._add("injection_shift", float((scores[addressed] - again)[both].sum()))

    def labels(self, rows: list[dict], first: list[str], second: list[str]) -> tuple[list[float], list[float]]:
        """Online DPO: (P(first is better) per pair: 1 or 0 by the swap-averaged preference, ½ — a tie the stage
        drops — where it is exactly ½ or the judge gave no verdict; each answer's side of the swap-averaged P, first
        and second interleaved). An order-inconsistent pair is labelled by its average and counted in
        judge/order_inconsistency."""
        if self.template.mode != "pairwise":
            scores = self(rows + rows, first + second)
            a, b = scores[: len(first)].tolist(), scores[len(first) :].tolist()
            verdicts = [1.0 if x > y else 0.0 if x < y else 0.5 for x, y in zip(a, b)]
            return verdicts, [s for pair in zip(a, b) for s in pair]
        began, self.call = time.perf_counter(), [0, 0, None]
        preference = self.prefer(rows, first, second)
        self._check_unparsed()
        p = torch.where(preference.parsed, preference.p, torch.full_like(preference.p, 0.5)).tolist()
        self._add("seconds", time.perf_counter() - began)
        return [1.0 if x > 0.5 else 0.0 if x < 0.5 else 0.5 for x in p], [s for x in p for s in (x, 1.0 - x)]

    def _check_unparsed(self) -> None:
        reads, missing, example = self.call
        if missing and (missing == reads or missing / reads > self.cfg.max_unparsed):
            raise RewardFunctionError(
                f"the judge {self.cfg.model} gave no verdict on {missing} of {reads} prompts "
                f"({100 * missing / reads:.0f} %) of this call, above judge.max_unparsed={self.cfg.max_unparsed:g} "
                f"(template {self.template.path}); first without one: {str(example)[:200]!r}"
            )

    # -- the plan and the metrics ---------------------------------------------------------------------------------
    def prompts_per_answer(self, group_size: int) -> str:
        t, baseline = self.template, self.cfg.baseline
        if t.mode == "pointwise":
            return "1 judge prompt an answer"
        if t.mode == "group":
            return f"2 judge prompts a group of {group_size}"
        if baseline == "group":
            return f"{group_size * (group_size - 1)} judge prompts a group of {group_size} (every ordered pair)"
        return "2 judge prompts an answer (both orders)"

    def describe(self) -> str:
        t = self.template
        read = (
            "read from P(" + ", ".join(repr(v) for v in self.verdicts) + f") after {t.answer_prefix!r}"
            if t.read == "probs"
            else f"read from greedy text (≤ {self.cfg.max_new_tokens} tokens) by {t.pattern!r}"
        )
        against = {"": "", "group": ", round robin in the group"}.get(self.cfg.baseline, f", vs {self.cfg.baseline}")
        chat = "chat" if self.chat else "plain"
        served = f", on the {self.lm.describe()}" if hasattr(self.lm, "describe") else ""
        return (
            f"judge {self.cfg.model} ({t.mode}, {t.path.name}, {chat}{served}), {read}{against}; "
            f"{self.prompts_per_answer(self.group_size)}; unparsed imputed, stop above {self.cfg.max_unparsed:g}"
        )

    def take_figures(self, section: str | None = None) -> dict[str, float]:
        """The sums since the last take, of the step (judge/…) or of a section (``eval``: eval/judge/…):
        judge_rates turns them into metrics."""
        prefix = f"{section}/judge/" if section else "judge/"
        out = {k: v for k, v in self.sums.items() if k.startswith(prefix)}
        self.sums = {k: v for k, v in self.sums.items() if not k.startswith(prefix)}
        return out


def judge_rates(sums: dict[str, float]) -> dict[str, float]:
    """A step's judge metrics (docs/metrics.md, "Judges") from its sums over processes."""
    out = {}
    for prefix in sorted({k[: k.index("judge/")] for k in sums}):
        get = lambda name, p=prefix: sums.get(f"{p}judge/{name}", 0.0)  # noqa: E731
        prompts, pairs = get("prompts"), get("pairs")
        for name in ("prompts", "prompt_tokens", "generated_tokens", "unparsed", "seconds"):
            if f"{prefix}judge/{name}" in sums:
                out[f"{prefix}judge/{name}"] = get(name)
        if prompts:
            out[f"{prefix}judge/unparsed_frac"] = get("unparsed") / prompts
            if f"{prefix}judge/verdict_mass" in sums:
                out[f"{prefix}judge/verdict_mass_mean"] = get("verdict_mass") / prompts
        if get("judged"):
            out[f"{prefix}judge/addressed_share"] = get("addressed") / get("judged")
        if get("injection_probed"):
            out[f"{prefix}judge/injection_shift"] = get("injection_shift") / get("injection_probed")
        if pairs:
            out[f"{prefix}judge/order_inconsistency"] = get("inconsistent") / pairs
            out[f"{prefix}judge/first_slot_bias"] = get("first_slot_bias") / pairs
    return out
