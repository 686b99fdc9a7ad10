"""Hand-computed cases for the PPO pieces (GAE, whitening, value loss, KL control), reward shaping, KL estimators."""

import math

import pytest
import torch

from tether.algorithms.advantages import action_gae, compact_actions, gae_advantages, masked_whiten, turn_rewards
from tether.algorithms.kl import kl_estimate, kl_k1, kl_k2, kl_k3
from tether.algorithms.masks import last_action_index, last_action_mask
from tether.algorithms.ppo import adaptive_kl_coef, clipped_value_loss, explained_variance
from tether.algorithms.shaping import clip_scores, kl_penalty_rewards, truncation_penalty


def test_kl_estimators_hand_computed():
    logp, ref = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])
    assert kl_k1(logp, ref).item() == pytest.approx(math.log(2))
    assert kl_k2(logp, ref).item() == pytest.approx(0.5 * math.log(2) ** 2)
    assert kl_k3(logp, ref).item() == pytest.approx(0.5 - 1 + math.log(2))  # r = 0.5
    with pytest.raises(ValueError, match="k4"):
        kl_estimate(logp, ref, "k4")


def test_k1_k3_unbiased_and_k2_k3_non_negative_by_monte_carlo():
    p = torch.tensor([0.5, 0.3, 0.2])
    q = torch.tensor([0.2, 0.3, 0.5])
    true_kl = float((p * (p / q).log()).sum())
    gen = torch.Generator().manual_seed(0)
    samples = torch.multinomial(p, 200_000, replacement=True, generator=gen)
    logp, logq = p.log()[samples], q.log()[samples]
    assert kl_k1(logp, logq).mean().item() == pytest.approx(true_kl, abs=0.01)
    assert kl_k3(logp, logq).mean().item() == pytest.approx(true_kl, abs=0.01)
    assert (kl_k2(logp, logq) >= 0).all() and (kl_k3(logp, logq) >= 0).all()
    assert (kl_k1(logp, logq) < 0).any()  # k1 is negative on some tokens


def test_kl_shaping_puts_the_score_on_the_last_valid_token():
    rewards = kl_penalty_rewards(
        torch.tensor([2.0]), torch.tensor([[0.1, 0.2, 0.3, 9.0]]), torch.tensor([[1, 1, 1, 0]]), kl_coef=0.5
    )
    # −0.5·(0.1, 0.2, 0.3) = (−0.05, −0.1, −0.15); the score 2 lands on token 2, the last valid one; padding 0
    torch.testing.assert_close(rewards, torch.tensor([[-0.05, -0.1, 2.0 - 0.15, 0.0]]))
    # a row with no valid token gets nothing, not its score on token 0
    empty = kl_penalty_rewards(torch.tensor([5.0]), torch.ones(1, 2), torch.zeros(1, 2), kl_coef=0.5)
    assert empty.tolist() == [[0.0, 0.0]]


def test_the_last_action_is_the_last_set_entry_holes_or_not():
    mask = torch.tensor([[1, 1, 0, 0, 1, 0], [1, 1, 1, 0, 0, 0], [0, 0, 0, 0, 0, 0], [0, 0, 1, 1, 1, 1]])
    # row 0 is an episode: turn 1 at 0-1, the environment at 2-3, turn 2 at 4; Σm − 1 = 2 would be the environment's
    assert last_action_index(mask).tolist() == [4, 2, -1, 5]  # all-zero row: −1, no index of its own
    assert last_action_mask(mask).long().tolist() == [
        [0, 0, 0, 0, 1, 0],
        [0, 0, 1, 0, 0, 0],
        [0, 0, 0, 0, 0, 0],
        [0, 0, 0, 0, 0, 1],
    ]
    assert last_action_index(mask.bool()).tolist() == [4, 2, -1, 5] and last_action_index(mask.float())[0] == 4
    assert last_action_index(torch.zeros(2, 0)).tolist() == [-1, -1]  # no position at all


def test_an_episodes_outcome_reaches_the_policys_tokens_through_shaping_turns_compact_and_gae():
    """Issue 52 item 1: the outcome was put at index Σm − 1 = 2, an environment token, and compact_actions dropped
    it: the policy's tokens received the turn rewards 1.5 instead of 4.5."""
    mask = torch.tensor([[1, 1, 0, 0, 1, 0]])  # turn 1: tokens 0-1, environment: 2-3, turn 2: token 4
    kl = torch.tensor([[0.2, 0.4, 7.0, 7.0, 0.2, 7.0]])  # the environment's and padding's KL must not enter
    values = torch.tensor([[0.5, 0.25, 9.0, 9.0, 0.5, 0.0]])
    rewards = kl_penalty_rewards(torch.tensor([3.0]), kl, mask, kl_coef=0.5)
    rewards = rewards + turn_rewards([[0.5, 1.0]], [[1, 4]], 6)
    packed, actions = compact_actions(rewards, mask)
    # −0.5·kl on the actions: (−0.1, −0.2, −0.1); turn rewards 0.5 on token 1 and 1.0 on token 4; outcome 3 on 4
    torch.testing.assert_close(packed, torch.tensor([[-0.1, 0.5 - 0.2, 1.0 + 3.0 - 0.1]]))
    torch.testing.assert_close(packed.sum(), torch.tensor(4.5 - 0.4))  # 4.5 reaches the policy, less the KL
    assert actions.tolist() == [[1, 1, 1]]
    adv, ret = action_gae(rewards, values, mask, gamma=1.0, lam=1.0)  # what tether ppo runs on an episode
    # γ = λ = 1: A_t = Σ_{t' ≥ t} r_t' − V_t over the actions: 4.1 − 0.5, 4.2 − 0.25, 3.9 − 0.5
    torch.testing.assert_close(adv, torch.tensor([[3.6, 3.95, 0, 0, 3.4, 0]]))
    torch.testing.assert_close(ret, torch.tensor([[4.1, 4.2, 0, 0, 3.9, 0]]))
    # on a mask without holes it is plain GAE
    full = torch.ones(1, 3)
    for got, want in zip(
        action_gae(packed, values[:, :3], full, 1.0, 0.9), gae_advantages(packed, values[:, :3], full, 1.0, 0.9)
    ):
        assert torch.equal(got, want)


def test_truncation_penalty_and_score_clipping_by_hand():
    scores = torch.tensor([1.0, 2.0, -7.0])
    # response 1 was cut at the length limit: its score becomes the penalty −1
    assert truncation_penalty(scores, torch.tensor([False, True, False]), -1.0).tolist() == [1.0, -1.0, -7.0]
    assert clip_scores(scores, 1.5).tolist() == [1.0, 1.5, -1.5]  # clamp to [−1.5, 1.5]
    assert clip_scores(scores, 0.0).tolist() == [1.0, 2.0, -7.0]  # 0 turns clipping off


def test_gae_hand_computed_and_padding_invariant():
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.6, 0.7]])
    adv, ret = gae_advantages(rewards, values, torch.ones(1, 3), gamma=1.0, lam=0.5)
    # δ2 = 1 − 0.7 = 0.3; δ1 = 0.7 − 0.6 = 0.1, A1 = 0.1 + 0.5·0.3 = 0.25; δ0 = 0.1, A0 = 0.1 + 0.5·0.25 = 0.225
    torch.testing.assert_close(adv, torch.tensor([[0.225, 0.25, 0.3]]))
    torch.testing.assert_close(ret, torch.tensor([[0.725, 0.85, 1.0]]))
    # λ = 1: Monte-Carlo return minus value
    adv1, _ = gae_advantages(rewards, values, torch.ones(1, 3), gamma=1.0, lam=1.0)
    torch.testing.assert_close(adv1, torch.tensor([[0.5, 0.4, 0.3]]))
    # garbage in padded positions changes nothing
    padded_r = torch.tensor([[0.0, 0.0, 1.0, 7.0, -3.0]])
    padded_v = torch.tensor([[0.5, 0.6, 0.7, 5.0, 5.0]])
    adv_p, ret_p = gae_advantages(padded_r, padded_v, torch.tensor([[1, 1, 1, 0, 0]]), gamma=1.0, lam=0.5)
    torch.testing.assert_close(adv_p[:, :3], adv)
    torch.testing.assert_close(ret_p[:, :3], ret)
    assert adv_p[:, 3:].abs().sum() == 0 and ret_p[:, 3:].abs().sum() == 0


def test_masked_whiten():
    out = masked_whiten(torch.tensor([[1.0, 2.0, 3.0, 100.0]]), torch.tensor([[1, 1, 1, 0]]))
    s = math.sqrt(2 / 3)
    torch.testing.assert_close(out, torch.tensor([[-1 / s, 0.0, 1 / s, 0.0]]), atol=1e-5, rtol=1e-5)


def test_clipped_value_loss_hand_computed():
    loss, clipped = clipped_value_loss(
        torch.tensor([[1.0, 0.6]]),
        torch.tensor([[0.5, 0.5]]),
        torch.tensor([[2.0, 2.0]]),
        torch.ones(1, 2),
        clip_range=0.2,
    )
    # V=1.0: clip to 0.7, (0.7−2)² = 1.69 > (1−2)² = 1 -> 0.845; V=0.6 inside the range: ½(0.6−2)² = 0.98
    torch.testing.assert_close(loss, torch.tensor([[0.845, 0.98]]))
    assert clipped.tolist() == [[True, False]]


def test_adaptive_kl_controller_hand_computed():
    # KL twice the target: error clipped to +0.2; β = 0.1 (1 + 0.2 · 256 / 10000)
    assert adaptive_kl_coef(0.1, 12.0, 6.0, 10000, 256) == pytest.approx(0.1 * (1 + 0.2 * 256 / 10000))
    assert adaptive_kl_coef(0.1, 5.4, 6.0, 1000, 100) == pytest.approx(0.1 * (1 - 0.1 * 0.1))
    assert adaptive_kl_coef(0.1, 6.0, 6.0, 1000, 100) == pytest.approx(0.1)


def test_explained_variance():
    g = torch.tensor([[1.0, 2.0, 3.0]])
    assert explained_variance(g, g, torch.ones(1, 3)) == pytest.approx(1.0)
    assert explained_variance(torch.full((1, 3), 2.0), g, torch.ones(1, 3)) == pytest.approx(0.0)
