"""The counter-based dropout mask of src/core/rng.h (Philox4x32-10, Salmon et al., SC'11) written
independently in numpy: the one reference the norm and attention tests check the library's masks
against (test_numpy_norm.py checks it against the published known-answer vectors), and the
attention family's 16-bit form of it."""
import numpy as np

_M32 = np.uint64(0xFFFFFFFF)


def philox4x32_10(c0, c1, c2, c3, k0, k1):
    """Philox4x32-10 on arrays of 32-bit values held in uint64 (products fit: < 2^64)."""
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint64) for c in (c0, c1, c2, c3))
    k0, k1 = np.uint64(k0), np.uint64(k1)
    for r in range(10):
        if r:
            k0 = (k0 + np.uint64(0x9E3779B9)) & _M32
            k1 = (k1 + np.uint64(0xBB67AE85)) & _M32
        p0 = np.uint64(0xD2511F53) * c0
        p1 = np.uint64(0xCD9E8D57) * c2
        hi0, lo0 = p0 >> np.uint64(32), p0 & _M32
        hi1, lo1 = p1 >> np.uint64(32), p1 & _M32
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


def dropout_uniform(seed, offset, idx):
    """u in [0, 1) of each flat element index (rng.h's mask definition)."""
    idx = np.asarray(idx, dtype=np.uint64)
    q = idx >> np.uint64(2)
    seed, offset = int(seed) & (2**64 - 1), int(offset) & (2**64 - 1)
    words = philox4x32_10(q & _M32, q >> np.uint64(32), np.full_like(q, offset & 0xFFFFFFFF),
                          np.full_like(q, offset >> 32), seed & 0xFFFFFFFF, seed >> 32)
    lane = (idx & np.uint64(3)).astype(np.int64)
    r = np.choose(lane, words)
    return (r >> np.uint64(8)).astype(np.float64) * 2.0**-24


def attn_dropout_uniform(seed, offset, idx):
    """u in [0, 1) of each flat [B, H, L, L] index under the attention family's form (rng.h):
    16 bits an element, eight elements a Philox call (word (i / 2) mod 4, its low half for even i)."""
    idx = np.asarray(idx, dtype=np.uint64)
    q = idx >> np.uint64(3)
    seed, offset = int(seed) & (2**64 - 1), int(offset) & (2**64 - 1)
    words = philox4x32_10(q & _M32, q >> np.uint64(32), np.full_like(q, offset & 0xFFFFFFFF),
                          np.full_like(q, offset >> 32), seed & 0xFFFFFFFF, seed >> 32)
    r = np.choose(((idx >> np.uint64(1)) & np.uint64(3)).astype(np.int64), words)
    half = (r >> (np.uint64(16) * (idx & np.uint64(1)))) & np.uint64(0xFFFF)
    return half.astype(np.float64) * 2.0**-16
