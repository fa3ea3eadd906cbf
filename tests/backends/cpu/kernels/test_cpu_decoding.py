"""The CPU backend's greedy step (pxvm.backends.cpu.kernels.decoding) against greedy_step's numpy
reference: first maximum on ties, a NaN wins, the history slot and the position."""

import numpy as np
import pytest

from pxvm.backends.cpu.kernels import decoding
from pxvm.ops.decoding import greedy_step


@pytest.mark.parametrize("case", ["random", "ties", "nan", "nan first", "-inf", "one"])
@pytest.mark.parametrize("history", [0, 3])
def test_greedy_step_matches_the_reference(case, history, rng):
    logits = rng.standard_normal((1, 1 if case == "one" else 301)).astype(np.float32)
    if case == "ties":
        logits[0, [7, 90, 200]] = 9.0
    elif case == "nan":
        logits[0, [50, 60]] = np.nan
    elif case == "nan first":
        logits[0, 0] = np.nan
    elif case == "-inf":
        logits[:] = -np.inf
    state = np.array([5, 11] + [0] * history, np.int32)
    expected = greedy_step.reference(logits, state.copy())
    decoding.greedy_step(logits, state)
    np.testing.assert_array_equal(state, expected)
