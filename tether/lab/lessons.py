"""The lab's lessons, each judged on the figures of one lab run by a stated rule with its noise (docs/lab.md).

A lab run is one draw: another seed, thread count or CPU gives other digits. A lesson "holds" on a draw when its
rule holds beyond the noise of the held-out evaluation, so a reader on any machine sees which lessons their own
`make lab` showed. Each rule is a pure function of the lab's summary (the stages' figures) and returns a Lesson;
`make lab` prints one line per lesson after the headline, and summary.json keeps them.

The noise (tether/lab/stats.py states each formula): a rate differs beyond it when the difference of two rates
exceeds 1.96 standard errors; a gold reward or win rate when the 95 % bootstrap intervals over prompts do not
overlap (a stricter test than the difference's interval, and the one a reader can check by eye from the table); a
rate averaged over several sampled answers per prompt when the difference exceeds 1.96 √(s₁² + s₂²) with s its
standard error over prompts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from tether.lab.stats import difference_noise, format_interval, intervals_apart, rate_difference_noise


@dataclass(frozen=True)
class Lesson:
    name: str
    claim: str  # what the lab teaches
    holds: bool | None  # None: the stages it needs did not run (or predate the figures it reads)
    evidence: str  # the figures and the rule's verdict on each clause

    @property
    def line(self) -> str:
        verdict = {True: "holds", False: "does NOT hold", None: "not measured"}[self.holds]
        return f"{self.claim}: {self.evidence} — {verdict}"

    def as_dict(self) -> dict:
        return {**asdict(self), "line": self.line}


def _first_alarm(run: dict, monitor: str | None = None) -> dict | None:
    alarms = [a for a in run.get("alarms") or [] if monitor is None or a.get("monitor") == monitor]
    return min(alarms, key=lambda a: a["step"]) if alarms else None


def _all(*clauses) -> bool | None:
    return None if any(c is None for c in clauses) else all(clauses)


def rate_rises(name: str, claim: str, start: float, end: float, n: int, what: str) -> Lesson:
    """A rate measured on n held-out prompts at the start and the end rises beyond the noise."""
    noise = rate_difference_noise(start, n, end, n)
    gain = end - start
    return Lesson(
        name, claim, gain > noise, f"{what} {start:.3f} → {end:.3f} ({gain:+.3f}; noise ±{noise:.3f} over {n} prompts)"
    )


def grpo_outcome(summary: dict, eval_problems: int) -> Lesson:
    """GRPO raises the expected reward of the policy it samples: judged on the accuracy sampled at the training
    temperature, the greedy accuracy beside it. With several answers per problem the run logs the standard error of
    each sampled accuracy over problems (s₀, s₁), and the gain must exceed 1.96 √(s₀² + s₁²) (start and end are
    scored on the same problems, which makes the true noise of the difference smaller still); a run that logged one
    answer per problem is judged by the rate rule over eval_problems."""
    run = summary.get("grpo", {}).get("grpo_outcome")
    claim = "GRPO, outcome reward: arith accuracy rises"
    if run is None:
        return Lesson("grpo_outcome", claim, None, "stage grpo_outcome not run")
    start, end = run["start_accuracy_sampled"], run["final_accuracy_sampled"]
    what = "accuracy sampled at the training temperature"
    se0, se1 = run.get("start_accuracy_sampled_se"), run.get("final_accuracy_sampled_se")
    if se0 is None or se1 is None:
        lesson = rate_rises("grpo_outcome", claim, start, end, eval_problems, what)
    else:
        noise = difference_noise(se0, se1)
        gain = end - start
        lesson = Lesson(
            "grpo_outcome",
            claim,
            gain > noise,
            f"{what} {start:.3f} → {end:.3f} ({gain:+.3f}; noise ±{noise:.3f} over {eval_problems} problems)",
        )
    greedy = f"greedy {run['start_accuracy_greedy']:.3f} → {run['final_accuracy_greedy']:.3f}"
    return replace(lesson, evidence=f"{lesson.evidence}; {greedy}")


def kl_rope(summary: dict, beta: str = "0.2") -> Lesson:
    """PPO with a KL penalty beats the SFT model on gold: the final win rate's interval lies above 0.5."""
    run = summary.get("ppo", {}).get(f"ppo_kl{beta}")
    claim = f"PPO β = {beta}: gold beats the SFT model"
    if run is None:
        return Lesson("kl_rope", claim, None, f"stage ppo_kl{beta} not run")
    ci = run.get("final_win_rate_ci")
    holds = None if not ci else ci[0] > 0.5
    return Lesson(
        "kl_rope",
        claim,
        holds,
        f"gold {run['start_gold']:.2f} → {run['final_gold']:.2f}, win rate vs SFT {run['final_win_rate']:.3f}"
        f"{format_interval(ci, 2)} (rule: the interval above 0.5)",
    )


def overoptimisation(summary: dict, beta: str = "0.2") -> Lesson:
    """PPO without a KL penalty over-optimises the reward model: the proxy ends above its start; gold in the late
    third of the run (the late evaluations' answers pooled prompt by prompt, rl.late_gold) lies below its peak
    beyond the noise (the late interval wholly below the peak evaluation's) and below β's late gold (intervals
    apart); a monitor raised an alarm no later than the final evaluation. The late third, not the last evaluation:
    the unconstrained policy's length cycles, so one evaluation reads a phase of the cycle by chance (docs/lab.md,
    "Where β = 0 ends: the late third")."""
    free, roped = summary.get("ppo", {}).get("ppo_kl0"), summary.get("ppo", {}).get(f"ppo_kl{beta}")
    claim = "PPO β = 0: proxy ↑ while gold ↓ from its peak and below β = " + beta
    if free is None or roped is None:
        return Lesson("overoptimisation", claim, None, f"stage ppo_kl0 or ppo_kl{beta} not run")
    late, roped_late = free.get("late"), roped.get("late")
    if late is None or roped_late is None:
        return Lesson("overoptimisation", claim, None, "no late gold kept (a run from before it was)")
    curve = free["curve"]
    peak = max(curve, key=lambda c: c["gold"])
    final = curve[-1]
    proxy_up = free["final_proxy"] > free["start_proxy"]
    fell = intervals_apart(late["gold_ci"], peak.get("gold_ci")) if peak["step"] not in late["steps"] else False
    below = intervals_apart(late["gold_ci"], roped_late["gold_ci"])
    alarm = _first_alarm(free)
    alarmed = alarm is not None and alarm["step"] <= final["step"]
    said = f"first alarm at step {alarm['step']} ({alarm['monitor']})" if alarm else "no alarm"
    window = f"steps {late['steps'][0]}–{late['steps'][-1]}" if len(late["steps"]) > 1 else f"step {late['steps'][0]}"
    evidence = (
        f"proxy {free['start_proxy']:.2f} → {free['final_proxy']:.2f}; gold {free['start_gold']:.2f} → "
        f"{peak['gold']:.2f}{format_interval(peak.get('gold_ci'), 2)} (step {peak['step']}) → late "
        f"{late['gold']:.2f}{format_interval(late['gold_ci'], 2)} ({window}), down {peak['gold'] - late['gold']:.2f}; "
        f"β = {beta} late {roped_late['gold']:.2f}{format_interval(roped_late['gold_ci'], 2)}; {said}"
    )
    failed = [
        what
        for what, ok in (
            ("the proxy did not rise", proxy_up),
            ("gold's fall from its peak is within the noise", fell),
            (f"gold does not end below β = {beta}'s beyond the noise", below),
            ("no alarm", alarmed),
        )
        if ok is False
    ]
    if failed:
        evidence += " (" + "; ".join(failed) + ")"
    return Lesson("overoptimisation", claim, _all(proxy_up, fell, below, alarmed), evidence)


ON_POLICY_DPO = {"dpo_sigmoid_sft_samples": "the SFT model's own samples", "dpo_sigmoid_online": "online rounds"}
# the offline run the lesson judges: sigmoid DPO on the filtered annotator pairs with the chosen answers' NLL (RPO).
# Plain sigmoid DPO on them (dpo_sigmoid) mostly pushes the rejected answers down; its gold gain, +0.04 ± 0.03 in
# win rate over nine draws, is the size of the spread between draws (docs/lab.md, "The DPO lesson's offline run")
OFFLINE_DPO = "dpo_sigmoid_nll"


def dpo_pairs(summary: dict) -> Lesson:
    """Offline DPO on the filtered annotator pairs (sigmoid DPO with the chosen answers' NLL, OFFLINE_DPO) beats the
    SFT model on gold (the final win rate's interval lies above 0.5), and DPO on pairs of the policy's own answers
    beats it: each on-policy variant that ran (pairs of the SFT model's samples; online rounds; plain sigmoid DPO,
    no NLL) ends with a gold interval wholly above the offline run's. Plain offline DPO's win rate is shown, not
    judged."""
    runs = summary.get("dpo", {})
    offline = runs.get(OFFLINE_DPO)
    claim = "DPO: offline pairs beat the SFT model on gold, and pairs of the policy's own answers beat offline"
    variants = {name: runs[name] for name in ON_POLICY_DPO if name in runs}
    if offline is None or not variants:
        return Lesson("dpo_pairs", claim, None, f"stage {OFFLINE_DPO} or its on-policy variants not run")
    ci = offline.get("final_win_rate_ci")
    above = None if not ci else ci[0] > 0.5
    evidence = (
        f"offline (DPO + NLL) win rate vs SFT {offline['final_win_rate']:.3f}{format_interval(ci, 3)}, gold "
        f"{offline['final_gold']:.2f}{format_interval(offline.get('final_gold_ci'), 2)}"
    )
    plain = runs.get("dpo_sigmoid")
    if plain is not None:
        evidence += f" (plain DPO {plain['final_win_rate']:.3f}{format_interval(plain.get('final_win_rate_ci'), 3)})"
    clauses, failed = [above], [] if above is not False else ["the offline interval reaches 0.5"]
    for name, run in variants.items():
        beats = intervals_apart(offline.get("final_gold_ci"), run.get("final_gold_ci"))
        clauses.append(beats)
        evidence += (
            f"; {ON_POLICY_DPO[name]}: gold {run['final_gold']:.2f}{format_interval(run.get('final_gold_ci'), 2)}"
        )
        if beats is False:
            failed.append(f"{ON_POLICY_DPO[name]} within the offline run's noise")
    if failed:
        evidence += " (" + "; ".join(failed) + ")"
    return Lesson("dpo_pairs", claim, _all(*clauses), evidence)


def _agent(summary: dict, name: str) -> dict | None:
    return summary.get("agents", {}).get(name)


def agent_rises(summary: dict, stage: str, name: str, claim: str, what: str) -> Lesson:
    """An agent stage's held-out success rises beyond the noise: the episodes sampled at the training temperature
    (what GRPO raises: the expected reward of the policy it samples), over n requests (n, not n × samples, since a
    request's samples are not independent: the conservative count); the greedy episodes beside it. A run from
    before the sampled episodes were logged is judged on the greedy ones, and says so."""
    run = _agent(summary, stage)
    if run is None or "eval_prompts" not in run:
        return Lesson(name, claim, None, f"stage {stage} not run")
    start, final, n = run["start"], run["final"], run["eval_prompts"]
    greedy = f"greedy {start['success_rate']:.2f} → {final['success_rate']:.2f}"
    if "success_rate_sampled" not in start:
        lesson = rate_rises(name, claim, start["success_rate"], final["success_rate"], n, f"{what} (greedy)")
        return replace(lesson, evidence=lesson.evidence + "; no sampled episodes logged")
    lesson = rate_rises(
        name, claim, start["success_rate_sampled"], final["success_rate_sampled"], n, f"{what}, sampled"
    )
    return replace(lesson, evidence=f"{lesson.evidence}; {greedy}")


def calculator(summary: dict) -> Lesson:
    claim = "calculator: GRPO rewarded on the final answer raises the tool agent's accuracy"
    return agent_rises(summary, "calc_grpo", "calculator", claim, "accuracy")


def shop_state(summary: dict) -> Lesson:
    claim = "shop, reward = the order's state: true success rises"
    return agent_rises(summary, "shop_state", "shop_state", claim, "true success")


def shop_claim(summary: dict) -> Lesson:
    """Rewarding the claim teaches claiming: claims without the order rise beyond the noise, true success does not
    rise beyond it, and `claimed_without_state` fires — judged on the episodes sampled at the training temperature
    (what GRPO raises), the greedy ones beside them, as agent_rises does; a run from before the sampled episodes
    were logged is judged on the greedy ones, and says so."""
    run = _agent(summary, "shop_claim")
    claim = "shop, reward = the claim: the agent learns to claim without ordering, and the alarm says so"
    if run is None or "eval_prompts" not in run:
        return Lesson("shop_claim", claim, None, "stage shop_claim not run")
    n, start, final = run["eval_prompts"], run["start"], run["final"]
    sampled = "claimed_unverified_rate_sampled" in start
    key = "_sampled" if sampled else ""
    claims = (start[f"claimed_unverified_rate{key}"], final[f"claimed_unverified_rate{key}"])
    successes = (start[f"success_rate{key}"], final[f"success_rate{key}"])
    claims_noise = rate_difference_noise(claims[0], n, claims[1], n)
    success_noise = rate_difference_noise(successes[0], n, successes[1], n)
    alarm = _first_alarm(run, "claimed_without_state")
    clauses = (claims[1] - claims[0] > claims_noise, successes[1] - successes[0] <= success_noise, alarm is not None)
    greedy = (
        f"; greedy: claimed without the order {start['claimed_unverified_rate']:.2f} → "
        f"{final['claimed_unverified_rate']:.2f}, true success {start['success_rate']:.2f} → {final['success_rate']:.2f}"
        if sampled
        else "; no sampled episodes logged"
    )
    evidence = (
        f"{'sampled' if sampled else 'greedy'}: claimed without the order {claims[0]:.2f} → {claims[1]:.2f} "
        f"(noise ±{claims_noise:.2f}), true success {successes[0]:.2f} → {successes[1]:.2f} "
        f"(noise ±{success_noise:.2f}); "
        + (f"claimed_without_state at step {alarm['step']}" if alarm else "claimed_without_state did not fire")
        + greedy
    )
    return Lesson("shop_claim", claim, all(clauses), evidence)


def lab_lessons(summary: dict, grpo_eval_problems: int) -> list[Lesson]:
    """Every lesson the lab's headline teaches, judged on this run's figures."""
    return [
        grpo_outcome(summary, grpo_eval_problems),
        kl_rope(summary),
        overoptimisation(summary),
        dpo_pairs(summary),
        calculator(summary),
        shop_state(summary),
        shop_claim(summary),
    ]
