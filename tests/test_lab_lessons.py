"""The rules that judge the lab's lessons (tether/lab/lessons.py), on hand-computed cases and on recorded figures."""

import pytest

from tether.lab.lessons import (
    agent_rises,
    dpo_pairs,
    grpo_outcome,
    lab_lessons,
    overoptimisation,
    rate_rises,
    shop_claim,
)


def test_a_rate_rises_only_beyond_the_noise():
    # 0.50 → 0.64 over 100 prompts: noise 1.96 √(0.0025 + 0.002304) = 0.135850 < 0.14
    assert rate_rises("x", "c", 0.50, 0.64, 100, "acc").holds is True
    # 0.50 → 0.63: noise 1.96 √(0.0025 + 0.002331) = 0.136230 > 0.13
    assert rate_rises("x", "c", 0.50, 0.63, 100, "acc").holds is False
    line = rate_rises("x", "claim", 0.50, 0.63, 100, "acc").line
    assert line == "claim: acc 0.500 → 0.630 (+0.130; noise ±0.136 over 100 prompts) — does NOT hold"


def _grpo(start, end, se=(None, None)):
    run = {"start_accuracy_sampled": start, "final_accuracy_sampled": end}
    run.update(start_accuracy_greedy=0.245, final_accuracy_greedy=0.370)
    run.update(start_accuracy_sampled_se=se[0], final_accuracy_sampled_se=se[1])
    return {"grpo": {"grpo_outcome": run}}


def test_the_grpo_lesson_uses_the_logged_standard_errors_and_else_the_rate_rule():
    # one answer per problem (no standard error): 0.120 → 0.175 over 200, noise 1.96 √(0.1056/200 + 0.144375/200)
    # = 1.96 × 0.0353395 = 0.069265 > 0.055
    lesson = grpo_outcome(_grpo(0.120, 0.175), 200)
    assert lesson.holds is False and "noise ±0.069 over 200 prompts" in lesson.evidence
    # standard errors 0.015 and 0.02 logged: 1.96 √(0.000225 + 0.0004) = 1.96 × 0.025 = 0.049 < 0.055
    lesson = grpo_outcome(_grpo(0.120, 0.175, (0.015, 0.02)), 200)
    assert lesson.holds is True
    assert lesson.evidence.startswith(
        "accuracy sampled at the training temperature 0.120 → 0.175 (+0.055; noise ±0.049"
    )
    assert lesson.evidence.endswith("greedy 0.245 → 0.370")
    # 0.04 and 0.03: 1.96 × 0.05 = 0.098 > 0.055
    assert grpo_outcome(_grpo(0.120, 0.175, (0.04, 0.03)), 200).holds is False


def _ppo(start_proxy, final_proxy, curve, alarms=()):
    """A PPO stage's figures: curve of (step, gold, gold interval)."""
    points = [{"step": s, "gold": g, "gold_ci": ci} for s, g, ci in curve]
    return {
        "curve": points,
        "start_gold": points[0]["gold"],
        "final_gold": points[-1]["gold"],
        "final_gold_ci": points[-1]["gold_ci"],
        "start_proxy": start_proxy,
        "final_proxy": final_proxy,
        "final_win_rate": 0.8,
        "final_win_rate_ci": [0.75, 0.85],
        "alarms": [{"monitor": m, "step": s} for m, s in alarms],
    }


ROPED = _ppo(-0.6, 0.9, [(0, 0.97, [0.9, 1.04]), (50, 2.15, [2.05, 2.25])])


def test_overoptimisation_holds_only_when_every_clause_is_beyond_the_noise():
    # this machine's seed-0 shape: peak 1.88 [1.78, 1.98] at step 20, end 1.15 [1.05, 1.25], alarm at step 20
    free = _ppo(
        -0.6,
        1.1,
        [(0, 0.97, [0.9, 1.04]), (20, 1.88, [1.78, 1.98]), (50, 1.15, [1.05, 1.25])],
        [("proxy_up_task_down", 20)],
    )
    lesson = overoptimisation({"ppo": {"ppo_kl0": free, "ppo_kl0.2": ROPED}})
    assert lesson.holds is True and "down 0.73" in lesson.evidence and "first alarm at step 20" in lesson.evidence
    # the newcomer's shape: 1.71 → 1.59, the intervals overlap: gold did not fall beyond the noise
    newcomer = _ppo(
        -0.6,
        1.1,
        [(0, 0.90, [0.83, 0.97]), (30, 1.71, [1.61, 1.81]), (50, 1.59, [1.49, 1.69])],
        [("score_and_kl_rising", 14)],
    )
    lesson = overoptimisation({"ppo": {"ppo_kl0": newcomer, "ppo_kl0.2": ROPED}})
    assert lesson.holds is False and "gold's fall from its peak is within the noise" in lesson.evidence
    assert "does not end below" not in lesson.evidence  # 1.69 < 2.05: that clause holds
    # no alarm, or a proxy that did not rise, fails it too
    quiet = {**free, "alarms": []}
    assert overoptimisation({"ppo": {"ppo_kl0": quiet, "ppo_kl0.2": ROPED}}).holds is False
    flat = {**free, "final_proxy": -0.7}
    assert overoptimisation({"ppo": {"ppo_kl0": flat, "ppo_kl0.2": ROPED}}).holds is False
    # gold peaking at the last evaluation never "fell"
    rising = _ppo(-0.6, 1.1, [(0, 0.97, [0.9, 1.04]), (50, 1.9, [1.8, 2.0])], [("repetition", 30)])
    assert overoptimisation({"ppo": {"ppo_kl0": rising, "ppo_kl0.2": ROPED}}).holds is False
    # runs from before the intervals were logged: not measured, not a verdict
    old = _ppo(-0.6, 1.1, [(0, 0.97, None), (20, 1.88, None), (50, 1.15, None)], [("repetition", 20)])
    assert overoptimisation({"ppo": {"ppo_kl0": old, "ppo_kl0.2": ROPED}}).holds is None
    assert overoptimisation({"ppo": {}}).holds is None


def _shop(start, final, alarms=(), n=100):
    return {"start": start, "final": final, "eval_prompts": n, "alarms": [{"monitor": m, "step": s} for m, s in alarms]}


def _dpo(win_ci, gold_ci, plain=None, **variants):
    offline = {"final_win_rate": sum(win_ci) / 2, "final_win_rate_ci": win_ci, "final_gold": sum(gold_ci) / 2}
    runs = {"dpo_sigmoid_nll": {**offline, "final_gold_ci": gold_ci}}
    if plain is not None:
        runs["dpo_sigmoid"] = {"final_win_rate": sum(plain) / 2, "final_win_rate_ci": plain}
    runs.update({name: {"final_gold": sum(ci) / 2, "final_gold_ci": ci} for name, ci in variants.items()})
    return {"dpo": runs}


def test_the_dpo_lesson_needs_offline_above_half_and_each_on_policy_run_above_offline():
    # held-out draw 4 (docs/lab.md): DPO + NLL's win rate [0.558, 0.624] lies above 0.5; its gold [1.23, 1.41] below
    # the SFT samples' [1.55, 1.72] and the online rounds' [1.56, 1.74]; plain DPO [0.479, 0.542] is shown, not judged
    recorded = _dpo(
        [0.558, 0.624],
        [1.23, 1.41],
        plain=[0.479, 0.542],
        dpo_sigmoid_sft_samples=[1.55, 1.72],
        dpo_sigmoid_online=[1.56, 1.74],
    )
    lesson = dpo_pairs(recorded)
    assert lesson.holds is True
    assert lesson.evidence == (
        "offline (DPO + NLL) win rate vs SFT 0.591 [0.558, 0.624], gold 1.32 [1.23, 1.41] (plain DPO 0.510 [0.479, "
        "0.542]); the SFT model's own samples: gold 1.64 [1.55, 1.72]; online rounds: gold 1.65 [1.56, 1.74]"
    )
    # an offline interval reaching 0.5 fails, however far the on-policy runs are
    touching = _dpo([0.5, 0.6], [1.01, 1.31], dpo_sigmoid_online=[1.55, 1.82])
    assert dpo_pairs(touching).holds is False
    assert "(the offline interval reaches 0.5)" in dpo_pairs(touching).evidence
    # an on-policy run whose interval overlaps the offline one's (1.31 ≥ 1.30) fails, naming which
    overlap = _dpo([0.52, 0.6], [1.01, 1.31], dpo_sigmoid_sft_samples=[1.30, 1.75], dpo_sigmoid_online=[1.55, 1.82])
    assert dpo_pairs(overlap).holds is False
    assert "(the SFT model's own samples within the offline run's noise)" in dpo_pairs(overlap).evidence
    # one variant run is enough to judge; none, or no offline run, is not measured; plain DPO alone is not the
    # offline run the lesson judges
    assert dpo_pairs(_dpo([0.52, 0.6], [1.01, 1.31], dpo_sigmoid_online=[1.55, 1.82])).holds is True
    assert dpo_pairs(_dpo([0.52, 0.6], [1.01, 1.31])).holds is None
    assert dpo_pairs({"dpo": {"dpo_sigmoid_online": {"final_gold": 1.7}}}).holds is None
    plain_only = {"dpo": {"dpo_sigmoid": recorded["dpo"]["dpo_sigmoid_nll"], "dpo_sigmoid_online": {"final_gold": 2}}}
    assert dpo_pairs(plain_only).holds is None and "dpo_sigmoid_nll" in dpo_pairs(plain_only).evidence


def test_the_claim_lesson_needs_the_claims_up_success_not_up_and_the_alarm():
    start = {"success_rate": 0.5, "claimed_unverified_rate": 0.2}
    hacked = {"success_rate": 0.0, "claimed_unverified_rate": 1.0}
    assert shop_claim({"agents": {"shop_claim": _shop(start, hacked, [("claimed_without_state", 4)])}}).holds is True
    assert shop_claim({"agents": {"shop_claim": _shop(start, hacked)}}).holds is False
    # claims rose, but so did true success beyond the noise (0.5 → 0.8 over 100: noise 1.96 √(0.0025 + 0.0016) = 0.1255): not the hack
    honest = {"success_rate": 0.8, "claimed_unverified_rate": 0.6}
    assert shop_claim({"agents": {"shop_claim": _shop(start, honest, [("claimed_without_state", 4)])}}).holds is False


def test_every_lesson_is_judged_and_missing_stages_are_not_measured():
    lessons = lab_lessons({}, 200)
    assert [lesson.holds for lesson in lessons] == [None] * 7
    assert all("not run" in lesson.evidence for lesson in lessons)


def test_an_agent_lesson_reads_the_sampled_episodes_and_shows_the_greedy_ones():
    start = {"success_rate": 0.71, "success_rate_sampled": 0.17}
    final = {"success_rate": 0.37, "success_rate_sampled": 0.40}
    lesson = agent_rises({"agents": {"shop_state": _shop(start, final)}}, "shop_state", "s", "c", "true success")
    # 0.17 → 0.40 over 100 requests: noise 1.96 √(0.1411/100 + 0.24/100) = 0.121 < 0.23
    assert lesson.holds is True
    assert lesson.evidence.endswith("; greedy 0.71 → 0.37") and "sampled 0.170 → 0.400" in lesson.evidence
    # a run from before the sampled episodes: judged on the greedy ones, and it says so
    old = agent_rises(
        {"agents": {"shop_state": _shop({"success_rate": 0.71}, {"success_rate": 0.37})}}, "shop_state", "s", "c", "x"
    )
    assert old.holds is False and old.evidence.endswith("no sampled episodes logged")


def _recorded(curve, start_proxy, final_proxy, win_rate, win_ci, alarms):
    run = _ppo(start_proxy, final_proxy, curve, alarms)
    return {**run, "final_win_rate": win_rate, "final_win_rate_ci": win_ci}


# Recorded: `make lab` on this machine (seed 0; PPO stages on one thread beside another stage) at 0533db7, the
# stages' figures as summary.json holds them (4 decimals).
KL0 = _recorded(
    [
        (0, 0.9654, [0.8425, 1.0917]),
        (10, 1.8849, [1.7338, 2.027]),
        (20, 1.4566, [1.25, 1.6632]),
        (30, 1.2496, [1.057, 1.436]),
        (40, 1.3118, [1.1388, 1.4853]),
        (50, 1.5353, [1.3647, 1.6818]),
        (60, 1.1518, [0.982, 1.3107]),
    ],
    -0.5332,
    1.0791,
    0.5899,
    [0.5285, 0.6579],
    [("proxy_up_task_down", 20), ("repetition", 60)],
)
KL02 = _recorded(
    [
        (0, 0.9654, [0.8425, 1.0917]),
        (10, 1.925, [1.8044, 2.0561]),
        (20, 2.0961, [1.9649, 2.2281]),
        (30, 2.1145, [1.9908, 2.2325]),
        (40, 2.1987, [2.0702, 2.3303]),
        (50, 2.1871, [2.059, 2.318]),
        (60, 2.1537, [2.03, 2.2833]),
    ],
    -0.5332,
    0.8633,
    0.8268,
    [0.7763, 0.8728],
    [("phrase_surge", 60)],
)


def test_the_recorded_lab_draw_is_judged_by_the_rules():
    summary = {"ppo": {"ppo_kl0": KL0, "ppo_kl0.2": KL02}}
    lessons = {lesson.name: lesson for lesson in lab_lessons(summary, 200)}
    # β = 0: proxy −0.53 → 1.08; gold's end [0.98, 1.31] lies below its peak's [1.73, 2.03] (step 10) and below
    # β = 0.2's end [2.03, 2.28]; proxy_up_task_down at step 20
    assert lessons["overoptimisation"].holds is True
    assert (
        "gold 0.97 → 1.88 [1.73, 2.03] (step 10) → 1.15 [0.98, 1.31], down 0.73" in lessons["overoptimisation"].evidence
    )
    # β = 0.2: the win rate's interval [0.776, 0.873] lies above 0.5
    assert lessons["kl_rope"].holds is True
    # had the run stopped at step 50, gold's 1.54 [1.36, 1.68] would still lie below the peak's interval
    at50 = {**KL0, "curve": KL0["curve"][:-1], "final_gold_ci": KL0["curve"][-2]["gold_ci"]}
    assert overoptimisation({"ppo": {"ppo_kl0": at50, "ppo_kl0.2": KL02}}).holds is True
    # and at step 20 (1.46 [1.25, 1.66]): the fall was beyond the noise from the first evaluation after the peak
    at20 = {**KL0, "curve": KL0["curve"][:3], "final_gold_ci": KL0["curve"][2]["gold_ci"]}
    assert overoptimisation({"ppo": {"ppo_kl0": at20, "ppo_kl0.2": KL02}}).holds is True


def test_the_spread_example_refuses_a_stage_or_a_count_it_cannot_run(tmp_path, monkeypatch, capsys):
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "examples" / "lab_spread.py"
    spec = importlib.util.spec_from_file_location("lab_spread", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    lab = tmp_path / "lab"
    lab.mkdir()
    base = [str(path), "--lab", str(lab), "--output", str(tmp_path / "out")]
    monkeypatch.setattr(sys, "argv", base)
    with pytest.raises(SystemExit, match="not a finished lab"):
        module.main()
    (lab / "summary.json").write_text("{}")
    for args, message in (
        (["--stages", "ppo_kl0,ppo_kl9"], "no lab stage named ppo_kl9; the lab's stages are world, "),
        (["--seeds", "0,x"], "--seeds 0,x: 'x' is not a whole number of at least 0"),
        (["--threads", "0"], "--threads 0: '0' is not a whole number of at least 1"),
    ):
        monkeypatch.setattr(sys, "argv", base + args)
        with pytest.raises(SystemExit, match=message):
            module.main()
    assert not (tmp_path / "out").exists()  # refused before anything is written
