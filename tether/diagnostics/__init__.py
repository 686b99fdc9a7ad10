"""Reading runs rather than making them: the reward-hacking monitors (pure functions over metrics and samples,
``monitors``; the agent ones in ``agent_monitors``, the judge's in ``judge_monitors``, the audit's in
``audit_monitors``), their registry and the trainers' live hook (``watch``), the
HTML report (``report``) and the machine benchmark (``bench``).

May import: every floor below ``tether.train`` (algorithms, config, models, data, rollout, rewards, agents,
console). The training loop imports the monitors; the monitors never import the loop.
"""
