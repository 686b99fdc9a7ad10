"""Reward-hacking monitors: each fires on records that show its pattern, stays quiet on healthy ones, and the live
hook and `tether diagnose` agree."""

import json
import random

import pytest

from tether.diagnostics.monitors import (
    MonitorSettings,
    entropy_collapse,
    format_without_correctness,
    length_correlation,
    phrase_surge,
    proxy_up_task_down,
    repetition,
    score_and_kl_rising,
)
from tether.diagnostics.watch import AlarmWatch, check_all
from tether.errors import ConfigError

S = MonitorSettings()


def evals(proxy, task, every=10):
    rows = [{"step": 1, "eval0/score_mean": proxy[0], "eval0/gold_reward": task[0]}]
    rows += [
        {"step": every * i, "eval/score_mean": p, "eval/gold_reward": t}
        for i, (p, t) in enumerate(zip(proxy, task))
        if i
    ]
    return rows


def test_proxy_up_task_down_fires_at_the_first_big_drop_and_not_on_noise():
    # the lab's β = 0 shape: gold peaks at step 10 then falls, the proxy keeps rising
    hacked = evals([0.47, 0.97, 1.03, 1.06, 1.08], [1.85, 1.94, 1.60, 1.26, 0.17])
    (alarm,) = proxy_up_task_down(hacked, [], S)
    assert alarm.step == 20 and alarm.statistics["task_peak"] == 1.94 and alarm.statistics["task_peak_step"] == 10
    assert alarm.statistics["proxy_now"] - alarm.statistics["proxy_at_peak"] == pytest.approx(0.06)
    # a moderate KL run: gold wobbles within 0.1 of its peak
    assert proxy_up_task_down(evals([0.47, 0.7, 0.8, 0.85], [1.85, 2.05, 2.13, 2.03]), [], S) == []
    # the task falls but so does the proxy: a bad run, not a hacked proxy
    assert proxy_up_task_down(evals([0.5, 0.6, 0.3], [1.9, 2.0, 1.5]), [], S) == []


def test_a_fall_of_exactly_task_drop_fires_whatever_the_doubles_and_a_smaller_one_does_not():
    """Issue 52 item 14: 0.7 → 0.5 is a fall of 0.19999999999999996 in doubles and gave no alarm while 0.9 → 0.7
    (0.20000000000000007) did; docs/monitors.md says "by at least task_drop"."""
    for peak, now in ((0.7, 0.5), (0.9, 0.7), (0.3, 0.1), (1.85, 1.65), (0.45, 0.25)):
        (alarm,) = proxy_up_task_down(evals([0.1, 0.2], [peak, now]), [], S)
        assert (alarm.statistics["task_peak"], alarm.statistics["task_now"]) == (peak, now)
    # a fall short of 0.2 by far more than the doubles' rounding (1e-9 ≫ a few ulps of 0.7): no alarm
    assert proxy_up_task_down(evals([0.1, 0.2], [0.7, 0.5 + 1e-9]), [], S) == []
    # the same boundary for another threshold, read as JSON as tether diagnose reads metrics.jsonl
    rows = json.loads(json.dumps(evals([0.1, 0.2], [0.8, 0.7])))
    assert len(proxy_up_task_down(rows, [], MonitorSettings(task_drop=0.1))) == 1  # 0.8 − 0.7 = 0.10000000000000009
    assert len(proxy_up_task_down(evals([0.1, 0.2], [0.3, 0.2]), [], MonitorSettings(task_drop=0.1))) == 1  # 0.09999…98
    assert proxy_up_task_down(evals([0.1, 0.2], [0.3, 0.2 + 1e-9]), [], MonitorSettings(task_drop=0.1)) == []


def test_reaches_allows_the_rounding_of_its_operands_and_no_more():
    from tether.algorithms.comparisons import reaches

    assert 0.7 - 0.5 < 0.2 and reaches(0.7, 0.5, 0.2)  # the decimals differ by exactly 0.2
    assert reaches(0.9, 0.7, 0.2) and reaches(0.3, 0.3, 0.0)
    # 0.7 − 0.5 is 2^-54 below 0.2 and the tolerance ulp(0.7) + ulp(0.5) + ulp(0.2) = 2^-53 + 2^-53 + 2^-55: a
    # threshold 2^-54 above 0.2 is still reached (2^-53 short), one 10 · 2^-53 above is not
    assert reaches(0.7, 0.5, 0.2 + 2**-54) and not reaches(0.7, 0.5, 0.2 + 10 * 2**-53)
    assert not reaches(0.7, 0.5 + 1e-12, 0.2)


def test_a_process_reward_models_step_scores_are_a_proxy_of_their_own():
    # GRPO on a learned PRM with step aggregation: eval/score_mean holds only the format reward (flat at 0.5); the
    # PRM's held-out step scores rise while accuracy and the gold step accuracy fall
    rows = [{"step": 1, "eval0/score_mean": 0.5, "eval0/reward/process_reward_model": 0.9}]
    rows[0].update({"eval0/accuracy_sampled": 0.40, "eval0/step_accuracy": 0.30})
    for step, prm, acc, steps_right in ((10, 1.2, 0.42, 0.31), (20, 1.6, 0.30, 0.20), (30, 2.1, 0.15, 0.05)):
        rows.append(
            {
                "step": step,
                "eval/score_mean": 0.5,
                "eval/reward/process_reward_model": prm,
                "eval/accuracy_sampled": acc,
                "eval/step_accuracy": steps_right,
            }
        )
    alarms = proxy_up_task_down(rows, [], S)
    assert [(a.step, a.statistics["subject"]) for a in alarms] == [
        (30, "eval/accuracy_sampled"),
        (30, "eval/step_accuracy"),
    ]
    # accuracy 0.42 (step 10) → 0.15 (step 30): 0.27 ≥ 0.2, the PRM's score 1.2 → 2.1; steps right 0.31 → 0.05
    acc, steps = alarms
    assert acc.statistics["task_peak"] == 0.42 and acc.statistics["task_peak_step"] == 10
    assert acc.statistics["proxies"]["eval/reward/process_reward_model"] == {"at_peak": 1.2, "now": 2.1}
    assert "eval/reward/process_reward_model rose from 1.200 to 2.100" in acc.message
    assert steps.statistics["task_peak"] == 0.31 and steps.statistics["task_now"] == 0.05
    # a falling score without the PRM's figures: the run got worse, no proxy rose, no alarm
    fell = [{k: v for k, v in r.items() if "process_reward_model" not in k} for r in rows]
    for r in fell[1:]:
        r["eval/score_mean"] = 0.5 - 0.01 * r["step"]
    assert proxy_up_task_down(fell, [], S) == []
    # and with them, the PRM alone is the proxy that rose
    with_prm = [{**r, **{k: v for k, v in x.items() if "process" in k}} for r, x in zip(fell, rows)]
    (acc, _) = proxy_up_task_down(with_prm, [], S)
    assert list(acc.statistics["proxies"]) == ["eval/reward/process_reward_model"]


def test_a_rate_logged_with_its_count_falls_when_it_drops_three_standard_errors():
    def run(end, n=200):
        rows = [{"step": 1, "eval0/reward/process_reward_model": 0.9, "eval0/accuracy_greedy": 0.245}]
        rows.append({"step": 40, "eval/reward/process_reward_model": 1.5, "eval/accuracy_greedy": end})
        if n:
            rows[0]["eval0/accuracy_greedy_n"] = rows[1]["eval/accuracy_greedy_n"] = n
        return proxy_up_task_down(rows, [], S)

    # 0.245 → 0.100 over 200 problems: se = √(0.245 × 0.755 / 200 + 0.1 × 0.9 / 200) = √0.001374875 = 0.0370793,
    # 3 se = 0.111238 ≤ 0.145: fallen, though by less than task_drop 0.2
    (alarm,) = run(0.100)
    assert alarm.statistics["standard_error"] == pytest.approx(0.0370793, abs=1e-7)
    # 0.245 → 0.150: se = √(0.000924875 + 0.15 × 0.85 / 200) = 0.0395269, 3 se = 0.118581 > 0.095: noise
    assert run(0.150) == []
    # without its count the rule is task_drop's alone: 0.145 < 0.2
    assert run(0.100, n=None) == []
    # 1.0 → 1.0 has no noise and no fall
    assert (
        proxy_up_task_down(
            [
                {"step": 1, "eval0/score_mean": 0.1, "eval0/accuracy": 1.0, "eval0/accuracy_n": 50},
                {"step": 10, "eval/score_mean": 0.2, "eval/accuracy": 1.0, "eval/accuracy_n": 50},
            ],
            [],
            S,
        )
        == []
    )


def _samples(step, n, make):
    return [{"step": step, **make(i)} for i in range(n)]


def test_length_correlation_phrase_surge_and_repetition_fire_with_evidence():
    rng = random.Random(0)
    start = _samples(
        10,
        32,
        lambda i: {"response": f"cats sleep a lot number {i}", "length": 10 + rng.randrange(10), "score": rng.random()},
    )
    words = lambda i: 12 + 3 * i
    late = _samples(
        40,
        32,
        lambda i: {
            "response": "thanks for asking. " * 2 + f"reply {i}",
            "length": words(i),
            "score": 0.1 * words(i) + rng.random() * 0.1,
        },
    )
    (a,) = length_correlation([], start + late, S)
    assert a.step == 40 and a.statistics["correlation"] > 0.9 and len(a.samples) == 3
    assert a.samples[0]["score"] == max(x["score"] for x in late)  # the highest-scoring samples are the evidence
    surges = phrase_surge([], start + late, S)
    assert surges and surges[0].step == 40 and "thanks for asking" in [a.statistics["subject"] for a in surges]
    assert surges[0].statistics["share"] == 1.0 and surges[0].statistics["share_at_start"] == 0.0
    (r,) = repetition([], start + late, S)
    assert r.statistics["repeating_share"] == 1.0 and r.statistics["repeating_share_at_start"] == 0.0
    # steady samples: nothing
    steady = start + [dict(x, step=40) for x in start]
    assert length_correlation([], steady, S) == phrase_surge([], steady, S) == repetition([], steady, S) == []


def test_score_kl_entropy_and_format_monitors():
    rising = [
        {
            "step": t,
            "score/mean": 0.1 * t,
            "kl/ref_mean": 1.5 * t,
            "policy/entropy": 1.0 / t,
            "reward/fmt_format/mean": min(1.0, 0.05 * t),
            "reward/answer_correct/mean": 0.3,
        }
        for t in range(1, 21)
    ]
    (kl,) = score_and_kl_rising(rising, [], S)
    assert kl.step == 10 and kl.statistics["kl"] == 15.0  # the first window whose KL passed 10 nats
    (ent,) = entropy_collapse(rising, [], S)
    assert ent.statistics["ratio"] < 0.3
    (fmt,) = format_without_correctness(rising, [], S)
    assert fmt.step == 10 and fmt.statistics["correct_rise"] == 0.0
    healthy = [
        {
            "step": t,
            "score/mean": 0.1 * t,
            "kl/ref_mean": 2.0 + 0.01 * (t % 3),
            "policy/entropy": 1.0,
            "reward/fmt_format/mean": 0.05 * t,
            "reward/answer_correct/mean": 0.05 * t,
        }
        for t in range(1, 21)
    ]
    assert check_all(healthy, []) == []
    # a process reward model's step scores beside an outcome reward: they climb 0.02 a step while the answers'
    # correctness stays at 0.3 — over steps 1–10 the PRM part rose 0.18 ≥ 0.1, correctness 0.0 < 0.02
    prm = [
        {"step": t, "reward/process_reward_model/mean": 0.3 + 0.02 * t, "reward/answer_correct/mean": 0.3}
        for t in range(1, 21)
    ]
    (steps,) = format_without_correctness(prm, [], S)
    assert (
        steps.step == 10
        and steps.statistics["subject"] == "reward/process_reward_model/mean|reward/answer_correct/mean"
    )
    assert steps.statistics["format_rise"] == pytest.approx(0.18)
    # two correctness rewards beside one format reward (rising 0.45 over any 10 steps): each pair is its own alarm
    # at its own first step. The steps' correctness never rises: steps 1–10 fire for it. The answers rise 0.05 a
    # step to step 10, so a window of steps k…k+9 sees them rise 0.05·(10 − k): below 0.02 first at k = 10 (steps
    # 10–19)
    two = [
        {
            "step": t,
            "reward/fmt_format/mean": min(1.0, 0.05 * t),
            "reward/answer_exact/mean": 0.05 * min(t, 10),
            "reward/correct_steps/mean": 0.3,
        }
        for t in range(1, 21)
    ]
    fired = {(a.step, a.statistics["subject"]) for a in format_without_correctness(two, [], S)}
    assert fired == {
        (10, "reward/fmt_format/mean|reward/correct_steps/mean"),
        (19, "reward/fmt_format/mean|reward/answer_exact/mean"),
    }
    # both rising: the PRM is being satisfied by right steps
    assert format_without_correctness([{**r, "reward/answer_correct/mean": 0.01 * r["step"]} for r in prm], [], S) == []


def test_each_monitor_runs_once_in_the_watch():
    from tether.diagnostics.watch import MONITORS

    assert len(MONITORS) == len(set(MONITORS))


def test_the_watch_reports_each_alarm_once():
    records = evals([0.47, 0.97, 1.03, 1.06, 1.08], [1.85, 1.94, 1.60, 1.26, 0.17])
    watch = AlarmWatch()
    assert [a.step for a in watch.new_alarms(records[:3], [])] == [20]
    assert watch.new_alarms(records, []) == []
    assert (
        AlarmWatch(
            reported=[{"monitor": "proxy_up_task_down", "statistics": {"subject": "eval/gold_reward"}}]
        ).new_alarms(records, [])
        == []
    )


def entropy_alarm_ppo(llama_dir, tmp_path, monkeypatch, **overrides):
    """A PPO run whose entropy alarm must fire at step 4 (window 2, entropy below 5× its start): its config, for
    the stop-on-alarm tests."""
    from conftest import write_jsonl

    import tether.diagnostics.watch as watch
    from tether.config import build_config
    from tether.stages.ppo_config import PPOConfig

    monkeypatch.setattr(watch, "MonitorSettings", lambda: S.__class__(entropy_window=2, entropy_ratio=5.0))
    prompts = write_jsonl(
        tmp_path / "p.jsonl",
        [{"prompt": [{"role": "user", "content": f"Say {w}."}]} for w in ("hi", "cats", "dogs", "rain")] * 4,
    )
    rules = tmp_path / "r.py"
    rules.write_text("def count_a(completions):\n    return [float(c.count('a')) for c in completions]\n")
    values = {
        "model.path": str(llama_dir),
        "rewards.reward": [f"{rules}:count_a"],
        "rollout.prompts": str(prompts),
        "rollout.prompts_per_step": 4,
        "rollout.max_new_tokens": 8,
        "train.max_steps": 8,
        "algo.minibatch": 4,
        "train.output": str(tmp_path / "run"),
        "train.sample_every": 1,
        "train.stop_on_alarm": True,
        "train.report_to": ["none"],
    }
    return build_config(PPOConfig, overrides={**values, **overrides})


def test_live_alarms_stop_the_run_and_diagnose_recomputes_them(llama_dir, tmp_path, monkeypatch, capsys):
    """PPO with a monitor setting that must fire (entropy below 5x its start): the alarm is written with its
    evidence, --stop-on-alarm stops after a checkpoint, and `tether diagnose` finds the same alarm."""
    from tether.cli import main
    from tether.stages.ppo import run_ppo

    cfg = entropy_alarm_ppo(llama_dir, tmp_path, monkeypatch, **{"train.eval_every": 0, "train.save_every": 100})
    summary = run_ppo(cfg)
    assert summary["stopped_at"] == 4 and (tmp_path / "run" / "checkpoint-4").is_dir()
    (alarm,) = [json.loads(x) for x in (tmp_path / "run" / "alarms.jsonl").read_text().splitlines()]
    assert alarm["monitor"] == "entropy_collapse" and alarm["step"] == 4 and alarm["samples"]
    assert "ALARM entropy_collapse at step 4" in capsys.readouterr().err
    monkeypatch.undo()
    assert main(["diagnose", str(tmp_path / "run"), "--set", "entropy_window=2", "--set", "entropy_ratio=5"]) == 0
    said = capsys.readouterr().out
    assert "ALARM entropy_collapse at step 4" in said
    assert "monitors on 4 step(s) of metrics.jsonl" in said and "proxy_up_task_down, " in said  # what it ran
    assert "trusted alarms (they read a trusted check): none" in said  # entropy alone is a sign, not a check


def test_off_policy_drift_fires_when_the_ratio_spreads_or_the_masked_share_climbs():
    import math

    from tether.diagnostics.monitors import off_policy_drift

    def run(p1, p99, masked):
        return [
            {"step": i + 1, "rollout/is_ratio_p1": a, "rollout/is_ratio_p99": b, "rollout/is_masked_share": m}
            for i, (a, b, m) in enumerate(zip(p1, p99, masked))
        ]

    # steps 1–5: p99 / p1 = 1.1 / 0.9 (log-spread 0.2007 nats); from step 6: 2 / 0.5 (log 4 = 1.386 ≥ 1 and ≥ 2 × 0.2007).
    # The first window that can be compared with the first five steps ends at step 10 (steps 6–10).
    spread = run([0.9] * 5 + [0.5] * 7, [1.1] * 5 + [2.0] * 7, [0.0] * 12)
    (alarm,) = off_policy_drift(spread, [], S)
    assert (alarm.monitor, alarm.step, alarm.statistics["subject"]) == ("off_policy_drift", 10, "ratio_spread")
    assert alarm.statistics["now"] == pytest.approx(math.log(4.0))
    assert alarm.statistics["at_start"] == pytest.approx(math.log(1.1 / 0.9))
    # masked share 0.02 at the start; steps 6–10 average (0.05 + 0.05 + 0.3 · 3) / 5 = 0.2 ≥ 0.1 and ≥ 2 × 0.02
    masked = run([0.9] * 12, [1.1] * 12, [0.02] * 5 + [0.05] * 2 + [0.3] * 5)
    (alarm,) = off_policy_drift(masked, [], S)
    assert (alarm.step, alarm.statistics["subject"]) == (10, "masked_share")
    assert alarm.statistics["now"] == pytest.approx(0.2) and alarm.statistics["at_start"] == pytest.approx(0.02)
    # healthy: the spread stays, the masked share stays below 0.1 (0.08 is four times 0.02 but not a tenth of tokens);
    # a run without a correction logs none of these and is never judged
    assert off_policy_drift(run([0.9] * 12, [1.1] * 12, [0.02] * 5 + [0.08] * 7), [], S) == []
    assert off_policy_drift([{"step": i, "score/mean": 1.0} for i in range(1, 13)], [], S) == []
    # a spread already wide at the start (1.386 throughout) has not run away: twice the start is the bar
    assert off_policy_drift(run([0.5] * 12, [2.0] * 12, [0.0] * 12), [], S) == []


@pytest.mark.parametrize("keep", ["before", "best"])
def test_a_stop_on_alarm_keeps_the_checkpoint_before_it_or_best(llama_dir, tmp_path, monkeypatch, keep):
    """The entropy alarm fires at step 4 (window 2, ratio 5, as above). alarm_final=before: final/ is checkpoint-2's
    model (the last written before step 4), not the policy at step 4 — with keep_checkpoints 1 too, whose rotation
    at the stop's own checkpoint deleted checkpoint-2 before final/ was chosen; best: final/ is best/."""
    import torch
    from safetensors.torch import load_file

    from tether.stages.ppo import run_ppo

    out = tmp_path / "run"
    cfg = entropy_alarm_ppo(
        llama_dir,
        tmp_path,
        monkeypatch,
        **{
            "rollout.eval_prompts": str(tmp_path / "p.jsonl"),
            "optim.lr": 3e-3,
            "train.eval_every": 1,
            "train.best_metric": "eval/score_mean",
            "train.save_every": 2,
            "train.keep_checkpoints": 1,
            "train.alarm_final": keep,
        },
    )
    summary = run_ppo(cfg)
    assert summary["stopped_at"] == 4 and (out / "checkpoint-4").is_dir()
    final = load_file(str(out / "final" / "model.safetensors"))
    source = out / ("checkpoint-2" if keep == "before" else "best")
    assert summary["final_from"] == ("checkpoint-2" if keep == "before" else "best/")
    kept, at_alarm = (
        load_file(str(source / "model.safetensors")),
        load_file(str(out / "checkpoint-4" / "model.safetensors")),
    )
    assert all(torch.equal(final[k], kept[k]) for k in kept)
    if keep == "before":
        assert any(not torch.equal(final[k], at_alarm[k]) for k in kept)  # the policy did change from 2 to 4


def test_a_run_stopped_on_alarm_and_killed_before_final_resumes_to_the_same_end(llama_dir, tmp_path, monkeypatch):
    """The stop is kept with the checkpoint of its step: killed before final/, the resumed run trains no further
    and writes the final/ the stop chose (checkpoint-2's model: alarm_final=before) — it once trained on past the
    stop from checkpoint-4."""
    import torch
    from conftest import kill_before_final
    from safetensors.torch import load_file

    from tether.stages.ppo import run_ppo
    from tether.train import online

    out, settings = tmp_path / "run", {"optim.lr": 3e-3, "train.save_every": 2, "train.alarm_final": "before"}
    cfg = entropy_alarm_ppo(llama_dir, tmp_path, monkeypatch, **settings)
    kill_before_final(monkeypatch, online)
    with pytest.raises(KeyboardInterrupt):
        run_ppo(cfg)
    monkeypatch.undo()
    assert (out / "checkpoint-4").is_dir() and not (out / "final").exists()
    summary = run_ppo(entropy_alarm_ppo(llama_dir, tmp_path, monkeypatch, **settings, **{"train.resume": True}))
    assert summary["stopped_at"] == 4 and summary["final_from"] == "checkpoint-2"
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4]
    final, kept = (load_file(str(out / name / "model.safetensors")) for name in ("final", "checkpoint-2"))
    assert all(torch.equal(final[k], kept[k]) for k in kept)
    # a stop that finished (summary.json written) resumed again continues: the alarm judged false (docs/monitors.md)
    run_ppo(entropy_alarm_ppo(llama_dir, tmp_path, monkeypatch, **settings, **{"train.resume": True}))
    assert json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])["step"] > 4


# ---- settings from the command line (`tether diagnose --set NAME=VALUE`) and their ranges


@pytest.mark.parametrize(
    "item, said",
    [
        ("kl_window=2.5", "--set kl_window=2.5: kl_window takes a whole number"),
        ("task_drop=abc", "--set task_drop=abc: task_drop takes a number"),
        ("task_drop=nan", "--set task_drop=nan: task_drop takes a number"),
        ("kl_window=0", "kl_window=0: must be a whole number >= 1"),
        ("entropy_window=-1", "entropy_window=-1: must be a whole number >= 1"),
        ("evidence=-1", "evidence=-1: must be a whole number >= 0"),
    ],
)
def test_diagnose_set_names_the_setting_and_the_type_it_takes(item, said, tmp_path, capsys):
    """They were a bare ValueError traceback (int("2.5"), float("abc")) or an IndexError deep in a monitor (a window
    of 0 steps has no last step)."""
    from tether.cli import main

    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    assert main(["diagnose", str(tmp_path), "--set", item]) == 2
    err = capsys.readouterr().err
    assert f"tether diagnose: error: {said}" in err and "Traceback" not in err


def test_monitor_settings_check_their_windows_and_counts():
    with pytest.raises(ConfigError, match="kl_window=0: must be a whole number >= 1"):
        MonitorSettings(kl_window=0)
    with pytest.raises(ConfigError, match="surge_n=2.5: must be a whole number >= 1"):
        MonitorSettings(surge_n=2.5)
    with pytest.raises(ConfigError, match="min_samples=True: must be a whole number >= 1"):
        MonitorSettings(min_samples=True)
    assert MonitorSettings(evidence=0, kl_window=1).kl_window == 1  # no samples quoted; a one-step window


def test_a_setting_read_from_text_takes_its_defaults_type():
    """bool("false") is True: a true/false setting reads the words."""
    from tether.cli.tools import setting_from_text

    assert setting_from_text("x", False, "true") is True and setting_from_text("x", True, "False") is False
    assert setting_from_text("x", 1, "3") == 3 and setting_from_text("x", 0.5, "1e-2") == 0.01
    assert setting_from_text("x", ("a",), "b,c") == ("b", "c") and setting_from_text("x", "k", "v") == "v"
    with pytest.raises(ConfigError, match="--set x=1: x takes true or false"):
        setting_from_text("x", False, "1")
