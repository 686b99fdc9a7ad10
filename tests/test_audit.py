"""The audit (--audit): a trusted check on a small share of the training responses, picked the same way on any number
of processes, logged beside the proxy on the same responses, and read by the audit_divergence monitor."""

import json

import pytest
from conftest import write_jsonl
from test_scorer import rollout as two_responses

from tether.config import ConfigError, build_config
from tether.diagnostics.audit_monitors import audit_divergence
from tether.diagnostics.monitors import MonitorSettings
from tether.diagnostics.watch import RunMonitor, audit_confirmed
from tether.online_sections import RewardSection
from tether.rewards.functions import load_audit_set
from tether.rewards.score import Scorer, audited_response, scorer_rates

AUDIT = """
def gold(completions):
    return [float(len(c)) for c in completions]

def weighted(completions):
    return [1.0] * len(completions)
"""


def test_the_audited_share_is_a_hash_of_step_prompt_and_response():
    """Deterministic, and over 20,000 responses the share audited is 5 % within 4 binomial standard errors
    (√(0.05 · 0.95 / 20000) = 0.00154, so ±0.0062)."""
    picks = [audited_response(s, f"p{i}", f"r{i}", 0.05) for s in range(20) for i in range(1000)]
    assert abs(sum(picks) / len(picks) - 0.05) < 4 * (0.05 * 0.95 / len(picks)) ** 0.5
    assert picks == [audited_response(s, f"p{i}", f"r{i}", 0.05) for s in range(20) for i in range(1000)]
    assert audited_response(3, "p", "r", 1.0) and not audited_response(3, "p", "r", 1e-300)


def test_the_scorer_audits_the_picked_responses_beside_their_proxy(tmp_path):
    """share 1: both responses audited. gold = characters: 'a' → 1, 'bbb' → 3 (mean 2, population std 1); the proxy
    on them is the total, the reward model's 1 and 2 (mean 1.5, population std 0.5); their covariance
    (1·1 + 3·2)/2 − 2·1.5 = 0.5."""
    path = tmp_path / "audit.py"
    path.write_text(AUDIT)
    cfg = RewardSection(audit=f"{path}:gold", audit_share=1.0)
    audit = load_audit_set(cfg, [{"prompt": "Q1"}, {"prompt": "Q2"}])
    scorer = Scorer(cfg, 8, type("Tok", (), {"eos_token": "</s>"})(), None, lambda texts: [1.0, 2.0], audit=audit)
    scorer.set_progress(0, 10)
    scorer(two_responses(), [{"prompt": "Q1"}, {"prompt": "Q2"}])
    figures = scorer_rates(scorer.step_figures())
    assert figures == {
        "audit/n": 2,
        "audit/none": 0,
        "audit/score_mean": 2.0,
        "audit/score_std": 1.0,
        "audit/proxy_mean": 1.5,
        "audit/proxy_std": 0.5,
        "audit/score_proxy_cov": 0.5,
    }
    assert scorer.step_figures() == {}  # taken once
    assert "audited by" in scorer.describe() and "100% of the training responses" in scorer.describe()
    with pytest.raises(ConfigError, match="the audit has no weight"):
        load_audit_set(RewardSection(audit=f"{path}:weighted=2"), [{"prompt": "Q1"}])


def test_the_audits_proxy_is_what_a_response_earns_its_process_rewards_included(tmp_path):
    """A process reward's step scores are not in the per-response total (they are paid at their steps), but they are
    what the policy is trained on: the proxy beside the audit sums them in. Steps weighted 2: [1, 0] → 2 and [0.5]
    → 1, beside an outcome function of weight 1 (1 each): the proxy is 3 and 2 (mean 2.5, population std 0.5);
    gold = characters, 1 and 3: covariance (1·3 + 3·2)/2 − 2·2.5 = −0.5. Without the outcome function: 2 and 1."""
    from tether.rewards.functions import RewardComponent, RewardSet

    path = tmp_path / "audit.py"
    path.write_text(AUDIT)
    cfg = RewardSection(audit=f"{path}:gold", audit_share=1.0)
    rows = [{"prompt": "Q1"}, {"prompt": "Q2"}]
    steps = RewardComponent("steps", lambda completions: [[1.0, 0.0], [0.5]], 2.0)
    outcome = RewardComponent("outcome", lambda completions: [1.0, 1.0], 1.0)
    tok = type("Tok", (), {"eos_token": "</s>"})()
    for components, proxy, std, cov in (([steps, outcome], 2.5, 0.5, -0.5), ([steps], 1.5, 0.5, -0.5)):
        scorer = Scorer(cfg, 8, tok, RewardSet(components, columns=["prompt"]), audit=load_audit_set(cfg, rows))
        scorer.set_progress(0, 10)
        scorer(two_responses(), rows)
        figures = scorer_rates(scorer.step_figures())
        assert (figures["audit/proxy_mean"], figures["audit/proxy_std"]) == (proxy, std)
        assert figures["audit/score_proxy_cov"] == cov


def test_audit_divergence_fires_when_the_audit_falls_and_the_proxy_does_not():
    """Blocks of 10 steps, 3 standard errors (the defaults are 15 and 1.5: set on the benchmark's development seeds),
    2 audited responses a step (n = 20 a block). Block 1: audit 1.0 (std 0.5), proxy 0.5;
    block 2: audit 0.4 (std 0.5), proxy 0.9. Drop 0.6 against se = √(0.25/20 + 0.25/20) = 0.158: 3.79 standard
    errors ≥ 3, the proxy rose: fires at step 20. With the proxy fallen (0.3), or a drop of 0.4 (2.53 se), it does
    not."""

    def run(second_audit, second_proxy):
        rows = []
        for step in range(1, 21):
            audit, proxy = (1.0, 0.5) if step <= 10 else (second_audit, second_proxy)
            rows.append(
                {
                    "step": step,
                    "audit/n": 2,
                    "audit/score_mean": audit,
                    "audit/score_std": 0.5,
                    "audit/proxy_mean": proxy,
                }
            )
        return audit_divergence(rows, [], MonitorSettings(audit_window=10, audit_z=3.0))

    (alarm,) = run(0.4, 0.9)
    assert alarm.step == 20 and alarm.statistics["standard_errors"] == pytest.approx(0.6 / (0.025**0.5), rel=1e-12)
    assert run(0.4, 0.3) == [] and run(0.6, 0.9) == []


def test_audit_divergence_reads_whole_blocks_live_and_no_best_without_a_standard_error(tmp_path):
    """Blocks of 10 steps, 3 standard errors, 2 responses a step (std 0.5). (a) After step 12 block 2 holds steps
    11–12 (audit 0.0: a drop of 1.0 over se √(0.25/20 + 0.25/4) = 0.274, 3.65 ≥ 3). A replay of finished files
    tests it (the run ended there); the live check during a run does not (it would test the block it is in after
    each of its steps), until the run's last step. (b) A first block of one audited response (mean 1.0, no
    variance) is never the best: against block 2 (0.9) block 3 (0.1) falls 0.8 over √(0.25/20 + 0.25/20) = 0.158,
    5.06 standard errors, and fires at step 30."""
    import json

    from tether.diagnostics.watch import RunMonitor

    settings = MonitorSettings(audit_window=10, audit_z=3.0)

    def row(step, n, mean, proxy=0.5):
        return {"step": step, "audit/n": n, "audit/score_mean": mean, "audit/score_std": 0.5, "audit/proxy_mean": proxy}

    rows = [row(t, 2, 1.0) for t in range(1, 11)] + [row(11, 2, 0.0), row(12, 2, 0.0)]
    (ended,) = audit_divergence(rows, [], settings)
    assert ended.step == 12 and ended.statistics["standard_errors"] == pytest.approx(1.0 / 0.075**0.5, rel=1e-12)
    assert audit_divergence(rows, [], settings, whole_blocks=True) == []
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    live = RunMonitor(tmp_path, settings=settings)
    assert not live.check() and not (tmp_path / "alarms.jsonl").exists()
    live.check(last=True)
    assert [json.loads(x)["step"] for x in (tmp_path / "alarms.jsonl").read_text().splitlines()] == [12]
    lone = [row(3, 1, 1.0)] + [row(t, 2, 0.9) for t in range(11, 21)] + [row(t, 2, 0.1) for t in range(21, 31)]
    (alarm,) = audit_divergence(lone, [], settings)
    assert alarm.step == 30 and alarm.statistics["audit_mean_at_best"] == pytest.approx(0.9, rel=1e-12)
    assert alarm.statistics["standard_errors"] == pytest.approx(0.8 / (0.025**0.5), rel=1e-12)


def confirm_rows(fall_from: int, after: float, proxy_after: float, collapse: bool = True) -> list[dict]:
    """40 steps, 2 audited responses a step (std 0.5): audit 1.0 and proxy 0.5 up to step fall_from − 1, then
    ``after`` and ``proxy_after``; the token entropy 1.0, and 0.1 from step 20 when ``collapse`` (entropy_collapse,
    window 5, ratio 0.3: steps 19–23 average 1.4/5 = 0.28 < 0.3, a generic alarm at step 23)."""
    return [
        {
            "step": step,
            "policy/entropy": 0.1 if collapse and step >= 20 else 1.0,
            "audit/n": 2,
            "audit/score_mean": 1.0 if step < fall_from else after,
            "audit/score_std": 0.5,
            "audit/proxy_mean": 0.5 if step < fall_from else proxy_after,
        }
        for step in range(1, 41)
    ]


def test_audit_confirmed_confirms_a_generic_alarm_on_a_sliding_window():
    """The audit falls from 1.0 to 0.7 at step 21; entropy_collapse fires at step 23; window 15. The first step
    with a whole block (1–15) ending by t − 15 is t = 30: steps 16–30 hold 10 responses at 1.0 and 20 at 0.7 —
    mean 0.8, second moment (10 · 1.25 + 20 · 0.74)/30 = 0.91, variance 0.27; against block 1–15 (mean 1.0,
    variance 0.25, n 30) the drop 0.2 is 0.2/√(0.52/30) = 1.52 standard errors: confirmed at step 30 with z 1.0.
    With z 1.6, step 31: 8 at 1.0, 22 at 0.7 — mean 0.78, variance 0.876 − 0.6084 = 0.2676, 0.22/√(0.5176/30) =
    1.67. No generic alarm, or the proxy fallen with the audit: silent."""
    (alarm,) = audit_confirmed(
        confirm_rows(21, 0.7, 0.9), [], MonitorSettings(audit_confirm_window=15, audit_confirm_z=1.0)
    )
    assert alarm.monitor == "audit_confirmed" and alarm.step == 30
    assert alarm.statistics["confirms"] == "entropy_collapse" and alarm.statistics["confirms_step"] == 23
    assert alarm.statistics["standard_errors"] == pytest.approx(0.2 / (0.52 / 30) ** 0.5, rel=1e-9)
    assert alarm.statistics["audit_mean"] == pytest.approx(0.8, rel=1e-12)
    (later,) = audit_confirmed(
        confirm_rows(21, 0.7, 0.9), [], MonitorSettings(audit_confirm_window=15, audit_confirm_z=1.6)
    )
    assert later.step == 31 and later.statistics["standard_errors"] == pytest.approx(
        0.22 / (0.5176 / 30) ** 0.5, rel=1e-9
    )
    assert audit_confirmed(confirm_rows(21, 0.7, 0.9, collapse=False), [], MonitorSettings()) == []
    assert audit_confirmed(confirm_rows(21, 0.7, 0.4), [], MonitorSettings(audit_confirm_z=0.0)) == []


def test_alarm_stops_trusted_stops_only_on_an_alarm_the_audit_confirms(tmp_path):
    """The same records written as a run's metrics.jsonl: entropy_collapse alone stops a run with alarm_stops any,
    not with trusted; the audit's fall to 0.73 over 35 steps, confirmed (window 15, z 1.0) at step 30 (steps 16–30:
    mean 0.82, variance 0.2662, 0.18/√(0.5162/30) = 1.37 ≥ 1.0 standard errors) and too small for audit_divergence
    (blocks 16–30: 1.37, 31–35: 0.27/√(0.25/30 + 0.25/10) = 1.48, both < 1.5), stops a trusted run. The option is refused where nothing
    trusted checks the run."""

    def stops(rows, how):
        out = tmp_path / f"{how}-{len(rows)}-{rows[-1]['audit/score_mean']}"
        out.mkdir()
        (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        settings = MonitorSettings(audit_confirm_window=15, audit_confirm_z=1.0)
        return RunMonitor(out, stop_on_alarm=True, settings=settings, stops=how).check(), out

    calm = confirm_rows(41, 1.0, 0.5)  # no fall: entropy_collapse only
    assert stops(calm, "any")[0] and not stops(calm, "trusted")[0]
    stopped, out = stops(confirm_rows(21, 0.73, 0.9)[:35], "trusted")
    assert stopped
    alarms = [json.loads(x)["monitor"] for x in (out / "alarms.jsonl").read_text().splitlines()]
    assert alarms == ["entropy_collapse", "audit_confirmed"]
    from tether.stages.grpo_config import GRPOConfig

    with pytest.raises(ConfigError, match="alarm_stops=trusted: no trusted check"):
        build_config(GRPOConfig, overrides={"model.path": "m", "train.alarm_stops": "trusted"})
    assert (
        build_config(
            GRPOConfig, overrides={"model.path": "m", "train.alarm_stops": "trusted", "rewards.audit": "a.py:f"}
        ).train.alarm_stops
        == "trusted"
    )


def test_a_grpo_run_logs_its_audit_and_online_dpo_refuses_it(llama_dir, tmp_path):
    from tether.stages.dpo_config import DPOConfig
    from tether.stages.grpo import run_grpo
    from tether.stages.grpo_config import GRPOConfig

    path = tmp_path / "audit.py"
    path.write_text(AUDIT)
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"Say {w}."} for w in ("hi", "cats", "dogs", "rain")])
    overrides = {
        "model.path": str(llama_dir),
        "rollout.prompts": str(prompts),
        "rewards.reward": [f"{path}:weighted"],
        "rewards.audit": f"{path}:gold",
        "rewards.audit_share": 0.5,
        "rollout.prompts_per_step": 4,
        "rollout.group_size": 4,
        "rollout.max_new_tokens": 6,
        "train.max_steps": 4,
        "train.eval_every": 2,
        "train.best_metric": "eval/audit_score_mean",  # no held-out prompts: best/ by the audit
        "train.output": str(tmp_path / "run"),
        "train.report_to": ["none"],
    }
    run_grpo(build_config(GRPOConfig, overrides=overrides))
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(0 < r["audit/n"] < 16 and r["audit/proxy_mean"] == 1.0 for r in rows)  # about half of 16
    # at steps 2 and 4: the audit's mean over the responses of steps 1–2 and 3–4, weighted by each step's count
    for a, b in ((0, 1), (2, 3)):
        pooled = rows[a]["audit/n"] * rows[a]["audit/score_mean"] + rows[b]["audit/n"] * rows[b]["audit/score_mean"]
        assert rows[b]["eval/audit_n"] == rows[a]["audit/n"] + rows[b]["audit/n"]
        assert rows[b]["eval/audit_score_mean"] == pytest.approx(pooled / rows[b]["eval/audit_n"], rel=1e-12)
        assert "eval/audit_score_mean" not in rows[a]
    best = json.loads((tmp_path / "run" / "best" / "best.json").read_text())
    assert best["metric"] == "eval/audit_score_mean" and best["step"] in (2, 4)
    assert best["value"] == max(rows[1]["eval/audit_score_mean"], rows[3]["eval/audit_score_mean"])
    with pytest.raises(ConfigError, match="online DPO labels pairs and is not audited"):
        build_config(DPOConfig, overrides={"model.path": "m", "rewards.audit": "a.py:f"})
    with pytest.raises(ConfigError, match="online.alarm_stops=trusted: online DPO has no trusted check"):
        build_config(DPOConfig, overrides={"model.path": "m", "online.alarm_stops": "trusted"})
    with pytest.raises(ConfigError, match="audit_share=0.0: a share in"):
        build_config(GRPOConfig, overrides={"model.path": "m", "rewards.audit_share": 0.0})


def test_the_audit_pooled_for_best_resumes_exactly(llama_dir, tmp_path, monkeypatch):
    """Evaluations every 4 steps, checkpoints every 2, killed after step 3: the run resumed from checkpoint-2 carries
    steps 1–2's audited responses in its pool, so step 4's eval/audit_score_mean (and every other figure) equals
    the uninterrupted run's."""
    from conftest import killed_after_step, metrics_but_timings

    from tether.stages.grpo import run_grpo
    from tether.stages.grpo_config import GRPOConfig

    path = tmp_path / "audit.py"
    path.write_text(AUDIT)
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"Say {w}."} for w in ("hi", "cats", "dogs", "rain")])

    def cfg(out, **extra):
        overrides = {"model.path": str(llama_dir), "rollout.prompts": str(prompts), "rewards.audit": f"{path}:gold"}
        overrides.update({"rewards.reward": [f"{path}:weighted"], "rewards.audit_share": 0.5, "train.max_steps": 4})
        overrides.update({"rollout.prompts_per_step": 2, "rollout.group_size": 3, "rollout.max_new_tokens": 6})
        overrides.update({"train.eval_every": 4, "train.save_every": 2, "train.best_metric": "eval/audit_score_mean"})
        overrides.update({"train.output": str(out), "train.report_to": ["none"], **extra})
        return build_config(GRPOConfig, overrides=overrides)

    run_grpo(cfg(tmp_path / "whole"))
    whole = metrics_but_timings(tmp_path / "whole")
    assert whole[3]["eval/audit_n"] == sum(r["audit/n"] for r in whole)  # steps 1–4 pooled
    with killed_after_step(monkeypatch, 3), pytest.raises(KeyboardInterrupt):
        run_grpo(cfg(tmp_path / "killed"))
    assert run_grpo(cfg(tmp_path / "killed", **{"train.resume": True}))["resumed_from"] == 2
    assert metrics_but_timings(tmp_path / "killed") == whole
