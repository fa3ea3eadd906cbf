"""attention_paged (pxvm.ops.transformer): a batch of sequences' tokens over one pool of
KV blocks through a block table, against the float64 step of attention_cached written out
in test_transformer_attention.py, run per sequence over its blocks gathered into a plain
cache. Kernels of every backend are checked by the conformance matrix's cases."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import NMSE_ELEMENTWISE, assert_close
from test_transformer_attention import expected_step

import pxvm
from pxvm.core.errors import ShapeError
from pxvm.ops.transformer import attention_paged


def _batch(rng, lengths, starts, hq=4, hkv=2, d=8, block_size=4, n_blocks=24,
           cache=np.float32):
    """Sequences b with lengths[b] new tokens from position starts[b], their blocks a
    random scattering over the pool; (qkv, k pool, v pool, token table, block table)."""
    per_seq = -(-max(s + n for s, n in zip(starts, lengths)) // block_size)
    blocks = rng.permutation(n_blocks)[: len(lengths) * per_seq]
    table = blocks.reshape(len(lengths), per_seq).astype(np.int32)
    tokens = np.array([[b, p] for b, (s, n) in enumerate(zip(starts, lengths))
                       for p in range(s, s + n)], np.int32)
    pool = lambda: rng.standard_normal((n_blocks, block_size, hkv, d)).astype(cache)
    qkv = rng.standard_normal((len(tokens), (hq + 2 * hkv) * d)).astype(np.float32)
    return qkv, pool(), pool(), tokens, table


def _run(backend, qkv, kp, vp, tokens, table, **params):
    """The op on `backend` with the pools resident there: (out, k pool, v pool)."""
    be = pxvm.get_backend(backend)
    k_t, v_t = be.from_numpy(kp), be.from_numpy(vp)
    out = attention_paged(qkv, k_t, v_t, tokens, table, backend=backend, **params).numpy()
    return out, k_t.numpy(), v_t.numpy()


def _plain(pool, table_row, block_size):
    """A sequence's rows of the pool as a plain cache (position p in row p)."""
    return np.concatenate([pool[b] for b in table_row])[: len(table_row) * block_size]


@pytest.mark.parametrize("cache", [np.float32, np.float16])
@pytest.mark.parametrize("lengths,starts", [((5, 1, 1), (3, 21, 0)), ((1,), (0,)),
                                            ((9, 2), (0, 14))])
def test_each_sequence_gets_its_own_cached_attention(lengths, starts, cache, rng):
    hq, block_size = 4, 4
    qkv, kp, vp, tokens, table = _batch(rng, lengths, starts, hq=hq, cache=cache)
    out, k_pool, v_pool = _run("numpy", qkv, kp, vp, tokens, table, n_heads=hq)
    for b, (start, n) in enumerate(zip(starts, lengths)):
        mine = tokens[:, 0] == b
        want, k_want, v_want = expected_step(qkv[mine], _plain(kp, table[b], block_size),
                                             _plain(vp, table[b], block_size), start, hq)
        assert_close(out[mine], want, NMSE_ELEMENTWISE if cache == np.float32 else 1e-6)
        rows = slice(start, start + n)
        np.testing.assert_allclose(_plain(k_pool, table[b], block_size)[rows], k_want[rows],
                                   rtol=1e-3 if cache == np.float16 else 1e-6, atol=1e-6)
        np.testing.assert_array_equal(_plain(v_pool, table[b], block_size)[rows],
                                      v_want[rows].astype(cache))
    # blocks no sequence owns are untouched
    free = np.setdiff1d(np.arange(len(kp)), table)
    np.testing.assert_array_equal(k_pool[free], kp[free])
    np.testing.assert_array_equal(v_pool[free], vp[free])


def test_a_shared_prefix_block_serves_two_sequences(rng):
    # sequences 0 and 1 share block table[0, 0] (positions 0..3, a cached prefix) and
    # decode their own next tokens: each equals attention over its own plain cache
    qkv, kp, vp, _, table = _batch(rng, (1, 1), (6, 6))
    table[1, 0] = table[0, 0]
    tokens = np.array([[0, 6], [1, 6]], np.int32)
    out, _, _ = _run("numpy", qkv, kp, vp, tokens, table, n_heads=4)
    for b in range(2):
        want, _, _ = expected_step(qkv[b: b + 1], _plain(kp, table[b], 4),
                                   _plain(vp, table[b], 4), 6, 4)
        assert_close(out[b: b + 1], want, NMSE_ELEMENTWISE)


@pytest.mark.parametrize("change,message", [
    (lambda a: a.__setitem__(3, np.array([[0, 40]], np.int32)), "outside the block table"),
    (lambda a: a[4].__setitem__((0, 0), 99), "outside the pool"),
    (lambda a: a.__setitem__(3, np.zeros((2, 2), np.int32)), "token_table must be int32"),
    (lambda a: a.__setitem__(2, a[2][:, :, :, :6].copy()), "pools must both be"),
    (lambda a: a.__setitem__(4, a[4][0]), "block_table must be int32"),
])
def test_bad_tables_are_refused_clearly(change, message, rng):
    args = list(_batch(rng, (1,), (2,)))
    change(args)
    with pytest.raises(ShapeError, match=message):
        attention_paged(*args, n_heads=4, backend="numpy")
