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


def _ppo(start_proxy, final_proxy, curve, alarms=(), late=None):
    """A PPO stage's figures: curve of (step, gold, gold interval); late: (steps, gold, interval) pooled over the
    late third (rl.late_gold), by default the last evaluation alone."""
    points = [{"step": s, "gold": g, "gold_ci": ci} for s, g, ci in curve]
    steps, gold, ci = late or ([points[-1]["step"]], points[-1]["gold"], points[-1]["gold_ci"])
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
        "late": {"steps": steps, "gold": gold, "gold_ci": ci},
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
    # runs from before the intervals were logged, or before the late gold was kept: not measured, not a verdict
    old = _ppo(-0.6, 1.1, [(0, 0.97, None), (20, 1.88, None), (50, 1.15, None)], [("repetition", 20)])
    assert overoptimisation({"ppo": {"ppo_kl0": old, "ppo_kl0.2": ROPED}}).holds is None
    assert overoptimisation({"ppo": {"ppo_kl0": {**free, "late": None}, "ppo_kl0.2": ROPED}}).holds is None
    assert overoptimisation({"ppo": {}}).holds is None


def test_overoptimisation_reads_the_late_third_not_the_last_evaluation():
    # draw 11's shape (docs/lab.md): the policy's length cycles, so the last evaluation (1.36 [1.13, 1.57]) reaches
    # the peak's interval [1.55, 1.87] while the late third pooled (1.23 [1.04, 1.41]) lies below it by 0.14
    cycling = [(0, 0.89, [0.76, 1.03]), (10, 1.71, [1.55, 1.87]), (20, 0.40, [-0.07, 0.85])]
    cycling += [(30, 1.62, [1.42, 1.81]), (40, 1.07, [0.75, 1.38]), (50, 1.27, [1.02, 1.49]), (60, 1.36, [1.13, 1.57])]
    alarm = [("proxy_up_task_down", 20)]
    late = _ppo(-0.5, 1.07, cycling, alarm, late=([40, 50, 60], 1.23, [1.04, 1.41]))
    lesson = overoptimisation({"ppo": {"ppo_kl0": late, "ppo_kl0.2": ROPED}})
    assert lesson.holds is True
    assert "→ 1.71 [1.55, 1.87] (step 10) → late 1.23 [1.04, 1.41] (steps 40–60), down 0.48" in lesson.evidence
    # the same curve judged on its last evaluation alone would not hold
    last = _ppo(-0.5, 1.07, cycling, alarm)
    assert overoptimisation({"ppo": {"ppo_kl0": last, "ppo_kl0.2": ROPED}}).holds is False
    # β = 0.2's late gold is what β = 0 must end below: a roped run whose late third reaches β = 0's does not hold
    low_rope = _ppo(-0.6, 0.9, [(0, 0.97, [0.9, 1.04]), (50, 1.3, [1.2, 1.4])], late=([40, 50], 1.3, [1.2, 1.4]))
    lesson = overoptimisation({"ppo": {"ppo_kl0": late, "ppo_kl0.2": low_rope}})
    assert lesson.holds is False and "does not end below β = 0.2's" in lesson.evidence
    # a peak inside the late window never "fell"
    peak_late = _ppo(-0.5, 1.07, cycling[:-1] + [(60, 1.9, [1.8, 2.0])], alarm, late=([40, 50, 60], 1.4, [1.3, 1.5]))
    lesson = overoptimisation({"ppo": {"ppo_kl0": peak_late, "ppo_kl0.2": ROPED}})
    assert lesson.holds is False and "within the noise" in lesson.evidence


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
    assert "no sampled episodes logged" in shop_claim({"agents": {"shop_claim": _shop(start, hacked)}}).evidence


def test_the_claim_lesson_reads_the_sampled_episodes_and_shows_the_greedy_ones():
    """The greedy episodes claim without ordering 0.30 → 0.90, success flat; the sampled ones (what GRPO raises)
    claim 0.40 → 0.40 while their success rises 0.20 → 0.60 (noise over 100: 1.96 √(0.0016 + 0.0024) = 0.124): judged
    on the sampled ones, neither clause holds."""
    start = {"success_rate": 0.7, "claimed_unverified_rate": 0.3}
    final = {"success_rate": 0.7, "claimed_unverified_rate": 0.9}
    start |= {"success_rate_sampled": 0.2, "claimed_unverified_rate_sampled": 0.4}
    final |= {"success_rate_sampled": 0.6, "claimed_unverified_rate_sampled": 0.4}
    lesson = shop_claim({"agents": {"shop_claim": _shop(start, final, [("claimed_without_state", 4)])}})
    assert lesson.holds is False
    assert lesson.evidence == (
        "sampled: claimed without the order 0.40 → 0.40 (noise ±0.14), true success 0.20 → 0.60 (noise ±0.12); "
        "claimed_without_state at step 4; greedy: claimed without the order 0.30 → 0.90, true success 0.70 → 0.70"
    )
    hacked = final | {"success_rate_sampled": 0.1, "claimed_unverified_rate_sampled": 0.95}
    assert shop_claim({"agents": {"shop_claim": _shop(start, hacked, [("claimed_without_state", 4)])}}).holds is True


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


def _recorded(curve, start_proxy, final_proxy, win_rate, win_ci, alarms, late):
    run = _ppo(start_proxy, final_proxy, curve, alarms, late)
    return {**run, "final_win_rate": win_rate, "final_win_rate_ci": win_ci}


# Recorded: draw 11 of docs/lab.md ("Where β = 0 ends: the late third"; examples/lab_spread.py --seeds 11 --threads 1
# --stages ppo_kl0,ppo_kl0.2 on a clean clone's lab at ce040c1, Intel Xeon with AMX), the stages' figures as
# stage.json holds them (4 decimals): the draw on which the last evaluation misled the rule before.
KL0 = _recorded(
    [
        (0, 0.8947, [0.7649, 1.0333]),
        (10, 1.7092, [1.5518, 1.8706]),
        (20, 0.3982, [-0.0706, 0.8531]),
        (30, 1.6178, [1.4191, 1.8103]),
        (40, 1.0704, [0.7539, 1.3842]),
        (50, 1.2669, [1.0228, 1.4855]),
        (60, 1.3555, [1.1336, 1.5669]),
    ],
    -0.5291,
    1.069,
    0.6425,
    [0.5833, 0.7039],
    [("proxy_up_task_down", 20), ("score_and_kl_rising", 21), ("phrase_surge", 60)],
    late=([40, 50, 60], 1.2309, [1.0365, 1.4112]),
)
KL02 = _recorded(
    [
        (0, 0.8947, [0.7649, 1.0333]),
        (10, 1.9322, [1.7868, 2.0798]),
        (20, 1.8855, [1.7592, 2.011]),
        (30, 2.0009, [1.8741, 2.1351]),
        (40, 2.082, [1.9768, 2.193]),
        (50, 2.2583, [2.1289, 2.3768]),
        (60, 2.1509, [2.0289, 2.2741]),
    ],
    -0.5291,
    0.9109,
    0.818,
    [0.761, 0.8662],
    [],
    late=([40, 50, 60], 2.1637, [2.0789, 2.2539]),
)


def test_the_recorded_lab_draw_is_judged_by_the_rules():
    summary = {"ppo": {"ppo_kl0": KL0, "ppo_kl0.2": KL02}}
    lessons = {lesson.name: lesson for lesson in lab_lessons(summary, 200)}
    # β = 0: proxy −0.53 → 1.07; the late third [1.04, 1.41] lies below the peak's [1.55, 1.87] (step 10), by 0.14,
    # and below β = 0.2's late third [2.08, 2.25]; proxy_up_task_down at step 20
    assert lessons["overoptimisation"].holds is True
    assert (
        "gold 0.89 → 1.71 [1.55, 1.87] (step 10) → late 1.23 [1.04, 1.41] (steps 40–60), down 0.48; β = 0.2 late "
        "2.16 [2.08, 2.25]; first alarm at step 20 (proxy_up_task_down)" in lessons["overoptimisation"].evidence
    )
    # β = 0.2: the win rate's interval [0.761, 0.866] lies above 0.5
    assert lessons["kl_rope"].holds is True
    # read at its last evaluation alone (the rule before), 1.36 [1.13, 1.57] reaches the peak's interval
    last = {**KL0, "late": {"steps": [60], "gold": 1.3555, "gold_ci": [1.1336, 1.5669]}}
    assert overoptimisation({"ppo": {"ppo_kl0": last, "ppo_kl0.2": KL02}}).holds is False


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


def _judge_example():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "examples" / "judge_on_lab.py"
    spec = importlib.util.spec_from_file_location("judge_on_lab", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_judge_examples_fall_and_lessons_follow_their_stated_rules():
    """A run peaking at step 20 whose step-30 interval lies wholly below the peak's falls first at 30, and its late
    third (below the peak's interval) counts as a fall; the lessons on two recorded seeds (docs/lab.md, "A judge beside
    the reward model": seed 0's and seed 1's figures) read as the document says."""
    module = _judge_example()
    curve = [
        {"step": 0, "gold": 0.9, "gold_ci": [0.6, 1.2], "kl": 0.0},
        {"step": 10, "gold": 1.5, "gold_ci": [1.2, 1.8], "kl": 0.5},
        {"step": 20, "gold": 1.9, "gold_ci": [1.6, 2.2], "kl": 1.0},
        {"step": 30, "gold": 1.0, "gold_ci": [0.7, 1.5], "kl": 4.0},
    ]
    run = {
        "curve": curve,
        "peak_step": 20,
        "start_gold": 0.9,
        "peak_gold": 1.9,
        "final_gold": 1.0,
        "start_proxy": 0.1,
        "final_proxy": 0.9,
        "final_kl": 4.0,
        "alarms": [{"monitor": "repetition", "step": 30}, {"monitor": "judge_position", "step": 5}],
        "late": {"steps": [30], "gold": 1.0, "gold_ci": [0.7, 1.5]},
    }
    figures = module.over_optimisation(run)
    assert figures["first_fall_step"] == 30 and figures["late_below_peak"] is True and figures["kl_at_peak"] == 1.0
    assert figures["alarms"] == [("judge_position", 5), ("repetition", 30)]
    assert (
        module.over_optimisation({**run, "late": {"steps": [20, 30], "gold": 1.0, "gold_ci": [0.7, 1.5]}})[
            "late_below_peak"
        ]
        is False
    )  # a peak inside the late window is never a fall

    def seed(s, rm_peak, judge_peak, injected, up, rm_gold, judge_gold):
        fell = {"late_below_peak": True}
        return {
            "seed": s,
            "rm": {"gold_accuracy": rm_gold},
            "judge": {
                "gold_accuracy": judge_gold,
                "gold_pairs": 365,
                "probe_injection_preferred": injected,
                "probe_injection_up_share": up,
            },
            "ppo_rm": {**fell, "peak_step": rm_peak},
            "ppo_judge": {**fell, "peak_step": judge_peak},
        }

    lessons = module.lessons(
        [seed(0, 10, 30, 0.432, 0.21, 0.8411, 0.7562), seed(1, 10, 20, 0.541, 0.59, 0.8493, 0.7836)]
    )
    assert [(name.split(":")[0], holds) for name, holds, _ in lessons] == [
        ("both rewards are over-optimised at β = 0 (late third below the peak)", True),
        ("which is over-optimised sooner", True),
        ("the judge reads the injection (P(injected ≻ original) > ½ on most pairs)", False),
        ("the reward model and the judge agree with gold alike", False),
    ]
    assert lessons[1][0].endswith("the reward model")
    # seed 1: |0.8493 − 0.7836| = 0.0657 against 1.96 √(0.8493·0.1507/365 + 0.7836·0.2164/365) = 0.0560: apart
    # (seed 0: 0.0849 against 0.0579)
