"""Sampling properties, each checked against a direct numpy/scipy computation."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import softmax

from pxvm.llm.sampling import (Sampler, SamplingParams, apply_repetition_penalty, draw,
                               next_token_probs, top_p_mask)


def _logits(rng, n=50):
    return rng.normal(0, 3, n).astype(np.float32)


def test_greedy_is_argmax(rng):
    sampler = Sampler(SamplingParams(temperature=0.0))
    for _ in range(20):
        z = _logits(rng, 1000)
        assert sampler(z) == int(np.argmax(z))


@pytest.mark.parametrize("k", [1, 3, 10])
def test_top_k_never_picks_outside_the_top_k(rng, k):
    z = _logits(rng)
    allowed = set(np.argsort(-z)[:k].tolist())
    sampler = Sampler(SamplingParams(temperature=5.0, top_k=k, seed=1))
    picks = {sampler(z) for _ in range(400)}
    assert picks <= allowed
    assert len(picks) == k  # at a high temperature every allowed token shows up


def test_same_seed_same_tokens_other_seed_differs(rng):
    z = _logits(rng)
    params = dict(temperature=1.5, top_k=20, top_p=0.95)
    s1, s2, s3 = (Sampler(SamplingParams(seed=s, **params)) for s in (7, 7, 8))
    seq1 = [s1(z) for _ in range(50)]
    assert seq1 == [s2(z) for _ in range(50)]
    assert seq1 != [s3(z) for _ in range(50)]


def test_temperature_sampling_follows_softmax(rng):
    z = np.array([2.0, 1.0, 0.0, -1.0, 0.5], np.float32)
    t = 0.7
    sampler = Sampler(SamplingParams(temperature=t, seed=3))
    n = 20000
    counts = np.bincount([sampler(z) for _ in range(n)], minlength=z.size)
    expected = softmax(z.astype(np.float64) / t)
    # 5 standard deviations of a binomial count.
    assert np.all(np.abs(counts - n * expected) < 5 * np.sqrt(n * expected * (1 - expected)) + 1)


def test_repetition_penalty_as_specified(rng):
    z = _logits(rng, 30)
    z[3], z[7] = 2.5, -1.5   # one positive and one negative repeated logit
    previous = [3, 7, 3]
    penalty = 1.3
    expected = z.astype(np.float64).copy()
    expected[3] = 2.5 / penalty
    expected[7] = -1.5 * penalty
    np.testing.assert_allclose(apply_repetition_penalty(z, previous, penalty), expected,
                               rtol=1e-6)
    params = SamplingParams(temperature=1.0, repeat_penalty=penalty)
    with_penalty = next_token_probs(z, params, previous)
    without = next_token_probs(z, SamplingParams(temperature=1.0), previous)
    np.testing.assert_allclose(with_penalty, softmax(expected), rtol=1e-6)
    assert with_penalty[3] < without[3] and with_penalty[7] < without[7]


def test_repetition_penalty_only_looks_at_the_last_n(rng):
    z = _logits(rng, 30)
    params = SamplingParams(temperature=1.0, repeat_penalty=2.0, repeat_last_n=2)
    probs = next_token_probs(z, params, previous=[5, 6, 7])
    expected = z.astype(np.float64).copy()
    for i in (6, 7):
        expected[i] = expected[i] / 2 if expected[i] > 0 else expected[i] * 2
    np.testing.assert_allclose(probs, softmax(expected), rtol=1e-6)


@pytest.mark.parametrize("p", [0.05, 0.3, 0.5, 0.9, 0.99])
def test_top_p_keeps_the_smallest_set_reaching_p(rng, p):
    probs = softmax(_logits(rng, 40).astype(np.float64))
    mask = top_p_mask(probs, p)
    kept = probs[mask]
    assert kept.sum() >= p
    # Dropping the least likely kept token falls below p: no smaller set would do.
    assert kept.sum() - kept.min() < p
    # The kept tokens are the most likely ones.
    assert probs[~mask].max(initial=0.0) <= kept.min()


@pytest.mark.parametrize("p", [0.05, 0.5, 0.9, 0.999])
@pytest.mark.parametrize("scale,top_k", [(0.3, 0), (3.0, 0), (3.0, 40)])
def test_top_p_over_a_large_vocabulary_equals_a_full_stable_sort(rng, p, scale, top_k):
    # Beyond TOP_P_CANDIDATES tokens the mask is taken among the likeliest ones first;
    # it must be the set a stable sort of the whole vocabulary gives, ties included
    # (logits rounded to a coarse grid make many tokens equally likely), also when top-k
    # has left most probabilities at 0.
    z = np.round(_logits(rng, 49152) * scale, 1).astype(np.float64)
    if top_k:
        z[np.argsort(-z, kind="stable")[top_k:]] = -np.inf
    probs = softmax(z)
    order = np.argsort(-probs, kind="stable")
    count = int(np.searchsorted(np.cumsum(probs[order]), p, side="left")) + 1
    expected = np.zeros(probs.size, bool)
    expected[order[:count]] = True
    np.testing.assert_array_equal(top_p_mask(probs, p), expected)


def test_top_p_takes_the_lowest_indices_of_a_tie_at_the_candidate_bound(rng):
    # 1,000 likely tokens, then 100 equally likely ones at scattered indices around the
    # TOP_P_CANDIDATES-th place: p ends inside the tie, so which tied tokens are kept
    # (the lowest indices, as a stable sort keeps them) decides the mask.
    probs = np.full(49152, 1e-7)
    likely = rng.choice(49152, 1100, replace=False)
    probs[likely[:1000]] = 1e-3
    probs[likely[1000:]] = 1e-4
    probs /= probs.sum()
    p = probs[likely[:1000]].sum() + 10.5 * probs[likely[1000]]
    mask = top_p_mask(probs, p)
    tied = np.sort(likely[1000:])
    assert mask[likely[:1000]].all() and mask[tied[:11]].all()
    assert mask.sum() == 1011


def test_top_p_distribution_renormalises(rng):
    z = _logits(rng, 40)
    probs = next_token_probs(z, SamplingParams(temperature=1.0, top_p=0.6))
    full = softmax(z.astype(np.float64))
    order = np.argsort(-full)
    count = np.argmax(np.cumsum(full[order]) >= 0.6) + 1
    expected = np.zeros_like(full)
    expected[order[:count]] = full[order[:count]] / full[order[:count]].sum()
    np.testing.assert_allclose(probs, expected, rtol=1e-6, atol=1e-12)  # float32 math


@pytest.mark.parametrize("bad", [dict(temperature=-1), dict(top_k=-2), dict(top_p=0.0),
                                 dict(top_p=1.5), dict(repeat_penalty=0.0), dict(seed=-1)])
def test_invalid_parameters_are_rejected(bad):
    with pytest.raises(ValueError):
        SamplingParams(**bad)


@pytest.mark.parametrize("n", [7, 512, 1500, 128256])
def test_draw_picks_where_the_running_sum_passes_u_never_a_weightless_token(n, rng):
    # integer weights: every running sum exact, so the block-by-block search must give
    # exactly the index a whole cumsum gives (Generator.choice's rule)
    weights = rng.integers(0, 4, n).astype(np.float32)
    weights[: min(n, 600)] = 0  # whole weightless blocks at the start
    weights[-1] = 3
    cdf = np.cumsum(weights, dtype=np.float64)
    for u in np.append(rng.random(300), [0.0, 1 - 1e-16]):
        got = draw(weights, float(u))
        assert got == int(np.searchsorted(cdf, u * cdf[-1], side="right"))
        assert weights[got] > 0
