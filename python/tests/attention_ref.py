"""A float64 numpy reference of the attention family (forward and backward, every option) with
the counter-based dropout mask of src/core/rng.h (philox_ref.py, independent of the library):
what test_numpy_attention.py and test_torch_attention.py compare the library with."""
import numpy as np

from philox_ref import attn_dropout_uniform  # the mask's definition, shared


def keep_factor(shape, p, seed, offset):
    """The dropout's multiplier on the [B, H, L, L] probabilities: 1/(1 − p) where kept, else 0."""
    if p <= 0:
        return np.ones(shape)
    u = attn_dropout_uniform(seed, offset, np.arange(int(np.prod(shape)), dtype=np.uint64)).reshape(shape)
    return np.where(u >= p, 1.0 / (1.0 - p), 0.0)


def mask(b, h, l, causal, lengths):
    """True where a score is masked, [B, 1, L, L] broadcast over heads."""
    j = np.arange(l)
    m = np.zeros((b, 1, l, l), dtype=bool)
    if causal:
        m |= (j[None, :] > j[:, None])[None, None]
    if lengths is not None:
        m |= (j[None, None, None, :] >= np.asarray(lengths).reshape(b, 1, 1, 1))
    return m


def forward(q, k, v, causal=False, scale=None, lengths=None, scores_in=None, dropout_p=0.0, seed=0, offset=0):
    """(o, lse, scores) in float64: scores −∞ where masked; empty rows o = 0, lse = −∞."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    b, h, l, d = q.shape
    scale = scale if scale is not None else (1 / np.sqrt(d) if d else 1.0)
    s = np.einsum("bhid,bhjd->bhij", q, k) * scale
    if scores_in is not None:
        s = s + np.asarray(scores_in, dtype=np.float64)
    s = np.where(mask(b, h, l, causal, lengths), -np.inf, s)
    m = s.max(-1, keepdims=True)
    empty = m == -np.inf
    e = np.where(empty, 0.0, np.exp(s - np.where(empty, 0.0, m)))
    tot = e.sum(-1, keepdims=True)
    with np.errstate(divide="ignore"):
        lse = np.where(empty, -np.inf, m + np.log(np.where(empty, 1.0, tot)))[..., 0]
    p = np.where(empty, 0.0, e / np.where(empty, 1.0, tot))
    pt = p * keep_factor(p.shape, dropout_p, seed, offset)
    o = np.einsum("bhij,bhjd->bhid", pt, v)
    return o, lse, s


def backward(do, q, k, v, o, lse, causal=False, scale=None, lengths=None, scores_in=None, dscores=None,
             dropout_p=0.0, seed=0, offset=0):
    """(dq, dk, dv, dscores_in) in float64 from the given o and lse (as the library's backward)."""
    q, k, v, o, do = (np.asarray(a, dtype=np.float64) for a in (q, k, v, o, do))
    lse = np.asarray(lse, dtype=np.float64)
    b, h, l, d = q.shape
    scale = scale if scale is not None else (1 / np.sqrt(d) if d else 1.0)
    s = np.einsum("bhid,bhjd->bhij", q, k) * scale
    if scores_in is not None:
        s = s + np.asarray(scores_in, dtype=np.float64)
    masked = mask(b, h, l, causal, lengths) | (lse[..., None] == -np.inf)
    p = np.where(masked, 0.0, np.exp(np.where(masked, 0.0, s - np.where(np.isinf(lse), 0.0, lse)[..., None])))
    kf = keep_factor(p.shape, dropout_p, seed, offset)
    dp = np.einsum("bhid,bhjd->bhij", do, v) * kf
    D = (do * o).sum(-1, keepdims=True)
    ds = p * (dp - D)
    if dscores is not None:
        ds = ds + np.asarray(dscores, dtype=np.float64)
    ds = np.where(masked, 0.0, ds)
    dq = np.einsum("bhij,bhjd->bhid", ds, k) * scale
    dk = np.einsum("bhij,bhid->bhjd", ds, q) * scale
    dv = np.einsum("bhij,bhid->bhjd", p * kf, do)
    return dq, dk, dv, ds
