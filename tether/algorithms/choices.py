"""The names of the interchangeable pieces the stages' settings choose between, without their code: a config (and so
`tether --help`) needs the names, not torch. Each module that implements the pieces checks it implements exactly
these (tests/test_algorithms.py)."""

ADVANTAGE_ESTIMATORS = ("group", "group_no_std", "rloo", "reinforce_pp")  # algorithms/advantages.py
RATIOS = ("token", "sequence", "sequence_token")  # algorithms/policy.py
AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")  # algorithms/reductions.py
PREFERENCE_LOSSES = (
    "sigmoid",
    "cdpo",
    "robust",
    "ipo",
    "ipo_norm",
    "hinge",
    "simpo",
    "orpo",
    "beta_dpo",
    "listwise",
    "weighted",
)  # algorithms/preference.py
COMPOSABLE_LOSSES = ("sigmoid", "cdpo", "robust", "ipo", "ipo_norm", "hinge")  # loss weighted's parts
# the losses whose formula has the flip rate ε (algorithms/preference.py; weighted reads it through these parts): the
# config refuses ε with any other, where it would change nothing (tests/test_preference_losses.py checks the formulas)
LABEL_SMOOTHING_LOSSES = ("cdpo", "robust")
UNPAIRED_LOSSES = ("kto",)  # one labelled completion per example: algorithms/preference.py kto_loss
OFF_POLICY_CORRECTIONS = (
    "token_truncate",
    "token_mask",
    "sequence_truncate",
    "sequence_mask",
    "geo_mask",
)  # algorithms/mismatch.py importance_weights; TRL's vllm_importance_sampling_mode names where TRL has the mode
JUDGE_MODES = ("pointwise", "pairwise", "group")  # rewards/judge.py: one answer, two answers, a whole group
JUDGE_READS = ("probs", "text")  # the verdict tokens' probabilities (no generation), or greedy text and a pattern
