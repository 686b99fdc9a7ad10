"""Hand-computed cases for the reward-model losses."""

import math

import pytest
import torch

from tether.algorithms.reward import all_pairs_loss, bradley_terry_loss, plackett_luce_loss, reward_centering_penalty


def test_bradley_terry_hand_computed():
    chosen, rejected = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 0.0])
    # −log σ(1) = log(1 + e^−1) = 0.31326; −log σ(0) = log 2
    torch.testing.assert_close(
        bradley_terry_loss(chosen, rejected), torch.tensor([math.log1p(math.exp(-1)), math.log(2)])
    )
    # margin 1 turns the first pair into −log σ(0)
    torch.testing.assert_close(
        bradley_terry_loss(chosen, rejected, torch.tensor([1.0, 0.0]))[0], torch.tensor(math.log(2))
    )


def test_bradley_terry_gradient_pushes_scores_apart():
    chosen = torch.tensor([0.0], requires_grad=True)
    rejected = torch.tensor([0.0], requires_grad=True)
    bradley_terry_loss(chosen, rejected).sum().backward()
    assert chosen.grad.item() == pytest.approx(-0.5) and rejected.grad.item() == pytest.approx(0.5)  # ∓σ(0)


def test_centering_penalty():
    assert reward_centering_penalty(torch.tensor([1.0]), torch.tensor([2.0]), 0.01).item() == pytest.approx(0.09)


def test_plackett_luce_hand_computed_and_reduces_to_bradley_terry_for_two():
    scores = torch.tensor([[2.0, 1.0, 0.0]])
    # k=1: 2 − log(e²+e+1); k=2: 1 − log(e+1); k=3: 0
    expected = -((2 - math.log(math.e**2 + math.e + 1)) + (1 - math.log(math.e + 1)))
    assert plackett_luce_loss(scores).item() == pytest.approx(expected)
    pair = torch.tensor([[0.3, -0.4]])
    assert plackett_luce_loss(pair).item() == pytest.approx(bradley_terry_loss(pair[:, 0], pair[:, 1]).item())


def test_plackett_luce_padding_is_ignored():
    padded = torch.tensor([[2.0, 1.0, 123.0]])
    mask = torch.tensor([[True, True, False]])
    assert plackett_luce_loss(padded, mask).item() == pytest.approx(plackett_luce_loss(padded[:, :2]).item())


def test_all_pairs_hand_computed():
    scores = torch.tensor([[2.0, 1.0, 0.0]])
    sp = lambda d: math.log1p(math.exp(-d))  # −log σ(d)
    assert all_pairs_loss(scores).item() == pytest.approx((sp(1) + sp(2) + sp(1)) / 3)
    mask = torch.tensor([[True, True, False]])
    assert all_pairs_loss(scores, mask).item() == pytest.approx(sp(1))


def test_ordered_pair_accuracy_hand_computed():
    from tether.algorithms.reward import ordered_pair_accuracy

    ranked = torch.tensor([[3.0, 1.0, 2.0], [0.5, 0.0, 9.0]])  # best first
    mask = torch.tensor([[True, True, True], [True, True, False]])
    # list 1: (3>1 ✓, 3>2 ✓, 1>2 ✗) = 2/3; list 2: only (0.5>0 ✓) = 1
    torch.testing.assert_close(ordered_pair_accuracy(ranked, mask), torch.tensor([2 / 3, 1.0]))


# ------------------------------------------------------------------------------------- process reward models


def test_step_bce_hand_computed_with_soft_labels_and_padding():
    from tether.algorithms.reward import step_bce_loss

    logits = torch.tensor([[0.0, 2.0, 5.0]], dtype=torch.float64)
    labels = torch.tensor([[1.0, 0.0, 0.25]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0]])
    # step 1: −log σ(0) = log 2; step 2 (wrong): −log(1 − σ(2)) = log(1 + e²); step 3 padded: 0
    expected = torch.tensor([[math.log(2), math.log1p(math.exp(2)), 0.0]], dtype=torch.float64)
    torch.testing.assert_close(step_bce_loss(logits, labels, mask), expected)
    # a soft label y: −[y log σ(s) + (1−y) log(1−σ(s))]; at s = 5, y = 1/4
    s, y = 5.0, 0.25
    soft = -(y * math.log(1 / (1 + math.exp(-s))) + (1 - y) * math.log(1 - 1 / (1 + math.exp(-s))))
    torch.testing.assert_close(step_bce_loss(logits, labels)[0, 2], torch.tensor(soft, dtype=torch.float64))


def test_auroc_first_wrong_step_and_step_aggregations_hand_computed():
    from tether.algorithms.reward import aggregate_step_scores, binary_auroc, first_wrong_step

    # positives 0.9, 0.5; negatives 0.2, 0.5: 3 pairs ordered right, one tie (1/2) -> 3.5 / 4
    assert binary_auroc(torch.tensor([0.9, 0.2, 0.5, 0.5]), torch.tensor([1, 0, 1, 0])) == 0.875
    assert math.isnan(binary_auroc(torch.tensor([0.1, 0.2]), torch.tensor([1, 1])))
    correct = torch.tensor([[1, 1, 0, 1], [1, 1, 1, 0], [0, 1, 1, 1]]).bool()
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 1]])
    assert first_wrong_step(correct, mask).tolist() == [2, 3, 0]  # the second row's padded step is not a mistake
    scores = torch.tensor([[0.5, 0.2, 0.9], [0.3, 7.0, 7.0]])
    real = torch.tensor([[1, 1, 1], [1, 0, 0]])
    assert aggregate_step_scores(scores, real, "min").tolist() == pytest.approx([0.2, 0.3])
    assert aggregate_step_scores(scores, real, "sum").tolist() == pytest.approx([1.6, 0.3])
    assert aggregate_step_scores(scores, real, "mean").tolist() == pytest.approx([1.6 / 3, 0.3])
    assert aggregate_step_scores(scores, real, "last").tolist() == pytest.approx([0.9, 0.3])
    assert aggregate_step_scores(scores, torch.zeros_like(real), "min").tolist() == [0.0, 0.0]
    assert aggregate_step_scores(torch.zeros(2, 0), torch.zeros(2, 0), "last").tolist() == [0.0, 0.0]  # no steps at all
    holes = torch.tensor([[1, 0, 1], [1, 1, 0]])  # the last real step is the last set entry, not Σm − 1
    assert aggregate_step_scores(scores, holes, "last").tolist() == pytest.approx([0.9, 7.0])


def test_first_wrong_step_of_a_batch_with_no_step_column_is_zero_steps():
    """Issue 52 item 13: a batch whose solutions have no step (S = 0, as aggregate_step_scores takes it) raised
    IndexError; each solution has 0 real steps, so its first wrong step is "none", 0."""
    from tether.algorithms.reward import first_wrong_step

    got = first_wrong_step(torch.zeros(3, 0, dtype=torch.bool), torch.zeros(3, 0, dtype=torch.long))
    assert got.tolist() == [0, 0, 0] and got.dtype == torch.long
    assert first_wrong_step(torch.zeros(0, 0, dtype=torch.bool), torch.zeros(0, 0)).tolist() == []


def pairwise_auroc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """The definition, every positive against every negative in float64: (#(s₊ > s₋) + ½ #(s₊ = s₋)) / (n₊ n₋)."""
    pos, neg = scores.double()[labels.bool()], scores.double()[~labels.bool()]
    greater = (pos[:, None] > neg[None, :]).double().sum()
    ties = (pos[:, None] == neg[None, :]).double().sum()
    return float((greater + 0.5 * ties) / (pos.numel() * neg.numel()))


def test_auroc_is_the_pairwise_definition_by_ranks_in_n_log_n():
    """Issue 52 item 12: the pairwise comparison held n₊ n₋ entries (929 MiB for 24,000 held-out steps). By ranks,
    U = R₊ − n₊(n₊ + 1)/2 is exact in float64, so the value equals the definition's bit for bit, ties included."""
    from tether.algorithms.reward import binary_auroc

    # hand case with a three-way tie: scores 1 1 1 2 3, labels 1 0 0 1 0; ranks 2 2 2 4 5 (the tie shares 1-3)
    # R₊ = 2 + 4 = 6, U = 6 − 3 = 3; pairs: (1 vs 1, 1, 3) = ½ + ½ + 0, (2 vs 1, 1, 3) = 1 + 1 + 0 → 3 / 6
    assert binary_auroc(torch.tensor([1.0, 1.0, 1.0, 2.0, 3.0]), torch.tensor([1, 0, 0, 1, 0])) == 0.5
    g = torch.Generator().manual_seed(0)
    for n, levels in ((7, 3), (50, 5), (400, 40), (2000, 2000)):
        scores = torch.randint(0, levels, (n,), generator=g).float() / levels  # coarse scores: many ties
        labels = torch.rand(n, generator=g) < 0.4
        assert binary_auroc(scores, labels) == pairwise_auroc(scores, labels), (n, levels)
    # 2^21 steps, half of each class: the pairs alone would be 2^40 booleans (1 TiB)
    labels = torch.arange(2**21) % 2 == 0
    scores = torch.where(labels, 0.75, 0.25) + (torch.arange(2**21) % 7 == 0) * 0.5  # ties, and 1/7 swapped
    n_pos = n_neg = 2**20
    # a positive at 0.75 (6/7 of them) beats every negative at 0.25 (6/7) and ties none; at 1.25 beats all;
    # negatives at 0.75 tie positives at 0.75. Count exactly from the class counts:
    p_hi, n_hi = int(((scores == 1.25) & labels).sum()), int(((scores == 0.75) & ~labels).sum())
    p_mid, n_lo = n_pos - p_hi, n_neg - n_hi
    u = p_hi * n_neg + p_mid * n_lo + 0.5 * p_mid * n_hi
    assert binary_auroc(scores, labels) == u / (n_pos * n_neg)
