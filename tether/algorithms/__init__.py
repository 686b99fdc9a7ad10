"""The maths of post-training as small pure functions over tensors.

Everything in this package imports torch only: no models, tokenizers, configs
or logging. Trainers compose these pieces; tests check each one against a
hand-computed case. Formulas and sources: docs/algorithms.md.

  logprobs    token log-probabilities and entropies from logits
  masks       index rules over masks: the last action of a row (holes and all)
  reductions  masked_sum and ``aggregate``, the one way token terms become a scalar
  sft         the SFT loss
  reward      reward-model losses;  agreement: inter-annotator agreement
  kl          per-token KL estimators k1, k2, k3
  advantages  GAE, whitening, the group / RLOO / REINFORCE++ / process estimators
  policy      importance ratios, the clipped surrogate, clip fraction
  shaping     KL-in-the-reward, overlong and truncation penalties, score clipping
  ppo         PPO's value loss, adaptive KL coefficient, explained variance
  objectives  the full loss of each online stage (PPO, the group family)
  mismatch    a sampler that is not the trainer (vLLM): its log-prob gap and truncated importance weights
  preference  the DPO family, one table behind one signature
  judge       a language model as the judge: scores from verdict-token probabilities, both orders, calibration
  comparisons whether a logged difference reaches a threshold (float rounding allowed), a rate difference's error
  detection   scoring an alarm against gold: which runs were hacked, detection, false alarms, AUROC, delay
  choices     the names of the pieces above that settings choose between (no torch: `--help` reads them)
"""
