#!/usr/bin/env python3
"""make_corpus.py - writes tests/fuzz/corpus/: one valid call per op (plan API and one-call
function, a few dtypes), AdamW, fg_convert, the context calls and the helpers, in the byte
format fuzz_api.c decodes (see its reader). The fuzzer mutates these into the bad inputs.
Beside them, valid calls that reach the compute paths behind options, which mutation finds
too rarely (an option flag shifts every byte after it): the log-prob options one by one
(temperature, softcap, ignore_index, smoothing, z-loss, grad scale, small tiles) in every
dtype with its accumulator-typed rows, each activation with the saved pre and the saved
slope through every one-call variant, each elementwise kind, the encoder layer's training
forward and backward in four norm kinds and dtypes, and one valid call of every later op
(normalization, dropout, RevIN, attention, series, the vocabulary shards) in f32 through both
doors and in bf16 / f64 through the one-call function, each with its options."""
import os
import sys

out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
# pool: N=3, K=4, M=5, B=2, 1, 0, 6, 17
POOL = bytes([3, 4, 5, 2, 1, 0, 6, 215])
N, K, M, B, ONE, ZERO, SIX, BIG = range(8)
S = {"0": 0, "1": 1, "-1": 2, "0.5": 3, "2": 4, "1e-3": 8, "0.999": 14, "1e-8": 15, "0.25": 6}


def operand(dims, absent=False, dtype=None):
    if absent:
        return bytes([3, 0, 0, 0])  # mode 3: absent; rank, dtype, stride mode
    # dtype byte 0: the call's dtype (or its integer one for targets); 224 + 2 + t: dtype t
    return bytes([0, len(dims), 0 if dtype is None else 226 + dtype]) + bytes(dims) + bytes([0])


EW = bytes([4, 1, S["0.5"], S["2"], 0, 0])       # full options, kind 0 (byte 1), scalars
EW_AXPBY = bytes([4, 2, S["0.5"], S["2"], 0, 0])  # kind 1 (axpby)
LOGP = bytes([4, 0, 0, 1])                       # full, no flags, ignore 0-1, reduction mean
LOGP_NONE = bytes([4, 0, 0, 3])                  # reduction none
ACT = bytes([4, 3, 1, 1])                        # gelu_tanh (act 2 = byte 3), saved pre, consume 0
NOOPT = bytes([0])

OPS = {
    1: (NOOPT, [[N, K], [M, K], [M], [N, M]]),
    2: (NOOPT, [[N, M], [M, K], [N, K]]),
    3: (NOOPT, [[N, M], [N, K], [M, K]]),
    4: (NOOPT, [[N, M], [M]]),
    5: (NOOPT, [[B, N, K], [B, K, M], [B, N, M]]),
    6: (NOOPT, [[B, N, M], [B, K, M], [B, N, K]]),
    7: (NOOPT, [[B, N, K], [B, N, M], [B, K, M]]),
    8: (NOOPT, [[N], [M], [N, M]]),
    9: (NOOPT, [[N, M], [M], [N]]),
    10: (NOOPT, [[N, M], [N], [M]]),
    11: (EW, [[N, K], [N, K]]),
    12: (EW, [[N, K], [N, K], [N, K]]),
    13: (EW, [[N, K], [N, K], None, [N, K]]),
    14: (EW, [[N, K], [N, K], [N, K], None, [N, K], [N, K], None]),
    15: (LOGP, [[N, K], [M, K], [M], [N], [N], [N], [N]]),
    16: (LOGP, [[N], [N], [N], [N, K], [M, K], [M], [N], [N], [N], [N, K], [M, K], [M]]),
    17: (LOGP, [[N, K], [M, K], [M], [N], [N], [ONE], [N], [N, K], [M, K], [M]]),
    18: (ACT, [[N, K], [M, K], [M], [N, M], [N, M]]),
    19: (ACT, [[N, M], [N, M], [N, K], [M, K], [M], [N, K], [M, K], [M]]),
}


def op_call(kind, op, dtype, opts, dims, variant=0, acc=0, align=0, typed=None):
    """typed: {operand index: dtype} for operands not of the call's dtype"""
    b = bytes([kind, 0, op, dtype, acc, 0, align, variant]) + opts
    for i, d in enumerate(dims):
        b += operand(d or [], absent=d is None, dtype=(typed or {}).get(i))
    return b + bytes([0])  # fill: zeros (valid targets)


F32, F16, BF16, F64 = 0, 1, 2, 3
# the log-prob rows (logp, lse, entropy, upstream gradients, loss, row weights) are f32 (f64 for f64)
LOGP_ROWS = {15: (4, 5, 6), 16: (0, 1, 2, 7, 8), 17: (4, 5, 6)}


def logp_opts(flags, reduction=0, ignore=-1, tiles=3):
    """flags: 1 temperature 0.5, 2 softcap 3, 4 ignore_index, 8 smoothing 0.25, 16 z-loss 1e-3,
    32 grad scale 2, 64 tiles (byte 3: 7 logits; 2: 2)"""
    b = bytes([4, flags])
    if flags & 1:
        b += bytes([S["0.5"]])
    if flags & 2:
        b += bytes([5])  # softcap 3
    b += bytes([ignore + 1, reduction + 1])
    if flags & 8:
        b += bytes([S["0.25"]])
    if flags & 16:
        b += bytes([S["1e-3"]])
    if flags & 32:
        b += bytes([S["2"]])
    if flags & 64:
        b += bytes([tiles])
    return b


def option_seeds(seeds):
    for dt, dn in ((F32, "f32"), (F16, "f16"), (BF16, "bf16"), (F64, "f64")):
        acc = F64 if dt == F64 else F32
        for op in (15, 16, 17):
            dims = OPS[op][1]
            typed = {i: acc for i in LOGP_ROWS[op]}
            for flags in (1, 2, 4, 8, 16, 32, 64, 2 | 64, 127):
                for red in ((0, 1, 2) if op == 17 and flags == 127 else (0,)):
                    opts = logp_opts(flags, reduction=red, ignore=0 if flags & 4 else -1, tiles=2 if flags == 64 else 3)
                    d = dims if not (op == 17 and red == 2) else dims[:5] + [[N]] + dims[6:]
                    seeds[f"op{op:02d}_{dn}_logp{flags:03d}_r{red}"] = op_call(0 if flags & 1 else 2, op, dt, opts, d, typed=typed)
            if op != 17:  # V = 17 in tiles of 8 columns: the online merge across V tiles (one pass: full rows)
                wide = [[BIG if x == M else x for x in dd] if dd else dd for dd in dims]
                seeds[f"op{op:02d}_{dn}_logp_vtiles"] = op_call(2, op, dt, logp_opts(64, tiles=3), wide, typed=typed)
        for act in range(7):  # each activation through two of the one-call variants in turn
            for saved in (0, 1):
                v = act % 3  # forward: _ex, plain, slope
                fdims = OPS[18][1] if v != 1 or act % 2 else OPS[18][1][:4] + [None]
                seeds[f"op18_{dn}_act{act}_s{saved}_v{v}"] = op_call(2, 18, dt, bytes([4, act + 1, saved + 1, 1]),
                                                                    fdims, variant=v)
                for v in (act % 7, (act + 3) % 7):  # backward: _ex, plain, consume, slope, input, weight, bias
                    bdims = OPS[19][1] if v != 1 or act % 2 else [OPS[19][1][0], None] + OPS[19][1][2:]
                    seeds[f"op19_{dn}_act{act}_s{saved}_v{v}"] = op_call(2, 19, dt, bytes([4, act + 1, saved + 1, 1]),
                                                                        bdims, variant=v, acc=v % 2)
            seeds[f"op19_{dn}_act{act}_plan"] = op_call(0, 19, dt, bytes([4, act + 1, 1, 1]), OPS[19][1])
        for kind in range(6):  # unary: scale, pow, leaky_relu, elu, clamp, softcap
            for op in (11, 12):
                opts = bytes([4, kind + 1, S["0.5"], S["2"], S["-1"], S["2"]])
                seeds[f"op{op:02d}_{dn}_unary{kind}"] = op_call(2, op, dt, opts, OPS[op][1], acc=op % 2)
        for kind in range(2):  # binary: lerp, axpby
            for op in (13, 14):
                opts = bytes([4, kind + 1, S["0.25"], S["2"], 0, 0])
                seeds[f"op{op:02d}_{dn}_binary{kind}"] = op_call(2, op, dt, opts, OPS[op][1], variant=2 * kind)


# ops 20-40: (options, operand dims, operands in the accumulator type, operands always f64).
# Shapes from the pool: rows N 3, width K 4, channels C = B 2 where BatchNorm's sums [2C + 1] must
# be M 5, heads [B 2, H 2, L 3, hd 4], series length BIG 17; integer operands take the call's
# integer dtype and the zero fill (targets 0, lengths 0, window starts 0).
NORM = bytes([4, 0, 1, 0, 0])                      # LayerNorm, no dropout
NORM_DROP = bytes([4, 2, 1, S["0.25"], 7, 3])      # LayerNorm, residual dropout 0.25
BN = bytes([4, 0, 1, 0])                           # training
DROP = bytes([4, S["0.25"], 5, 1])
REVIN = bytes([4, 0, 1])
ATTN = bytes([4, 0, 2, 0, 0])                      # causal
PATCH = bytes([4, M, SIX, ZERO])                   # S 5, stride 6, no padding: 17 steps -> 3 patches
LOSS = bytes([4, 3, 3, 1, S["0.5"], S["2"]])        # Huber δ 0.5, mean, grad scale 2
SHARD = bytes([4, 128, 0, 1, 8])                   # vocabulary slice [0, 5) of 9
FAMILY = {
    20: (NORM_DROP, [[N, K], [N, K], [K], [K], [N, K], [N, K], [N], [N]], (6, 7), ()),
    21: (NORM, [[N, K], [N, K], [N, K], [K], [N], [N], [N, K], [N, K], [K], [K]], (4, 5), ()),
    22: (BN, [[N, K], [N, K], [K], [K], [K], [K], [N, K], [N, K], [K], [K]], (8, 9), ()),
    23: (BN, [[N, K], [N, K], [K], [K], [K], [N, K], [N, K], [K], [K]], (3, 4), ()),
    24: (BN, [[N, B], [N, B], [N, B], [M]], (), (3,)),
    25: (BN, [[N, B], [M], [B], [B], [B], [B], [N, B], [B], [B]], (7, 8), (1,)),
    26: (BN, [[N, B], [N, B], [B], [B], [M]], (2, 3), (4,)),
    27: (BN, [[N, B], [N, B], [B], [B], [B], [M], [N, B], [N, B], [B], [B]], (3, 4), (5,)),
    28: (DROP, [[N, K], [N, K]], (), ()),
    29: (DROP, [[N, K], [N, K]], (), ()),
    30: (REVIN, [[B, N, K], [B, K], [B, K]], (1, 2), ()),
    31: (REVIN, [[B, N, K], [K], [K], [B, K], [B, K], [B, N, K]], (3, 4), ()),
    32: (REVIN, [[B, N, K], [B, N, K], [K], [K], [B, K], [B, K], [B, N, K], [K], [K]], (4, 5, 7), ()),
    33: (ATTN, [[B, B, N, K]] * 3 + [[B], [B, B, N, N], [B, B, N, K], [B, B, N], [B, B, N, N]], (6,), ()),
    34: (ATTN, [[B, B, N, K], [B, B, N, N]] + [[B, B, N, K]] * 3 + [[B], [B, B, N, N], [B, B, N, K], [B, B, N]]
         + [[B, B, N, K]] * 3 + [[B, B, N, N]], (8,), ()),
    35: (PATCH, [[B, BIG], [B, N, M]], (), ()),
    36: (PATCH, [[B, N, M], [B, BIG]], (), ()),
    37: (LOSS, [[N, K], [N, K], [ONE], [N, K]], (2,), ()),
    38: (NOOPT, [[BIG, N], [B], [B, SIX, N]], (), ()),
    39: (SHARD, [[N, K], [M, K], [M], [N], [N], [N], [N]], (4, 5, 6), ()),
    40: (SHARD, [[N], [B, N], [B, N], [B, N], [N], [N], [N]], (1, 2, 3, 4, 5, 6), ()),
}


ACCUMULATE = (21, 23, 27, 29, 32, 34, 36, 37)  # the backward ops, which take accumulate = 1


def family_seeds(seeds):
    for op, (opts, dims, acc_ops, f64_ops) in FAMILY.items():
        for dt, dn, kinds in ((F32, "f32", (0, 2)), (BF16, "bf16", (2,)), (F64, "f64", (2,))):
            acc = F64 if dt == F64 else F32
            typed = {i: acc for i in acc_ops}
            typed.update({i: F64 for i in f64_ops})
            for kind in kinds:
                door = "plan" if kind == 0 else "call"
                seeds[f"op{op:02d}_{door}_{dn}"] = op_call(kind, op, dt, opts, dims, acc=int(op in ACCUMULATE),
                                                           typed=typed)
        if op == 32:  # no time steps: the column sums finish with no block (a fuzz finding)
            empty = [[d[0], ZERO, d[2]] if len(d) == 3 else d for d in dims]
            seeds["op32_call_f64_no_steps"] = op_call(2, op, F64, opts, empty, acc=1, typed={i: F64 for i in acc_ops})
        if op in (33, 34):  # without the lengths and score operands (the plain path)
            plain = [None if i in ((3, 4, 7) if op == 33 else (1, 5, 6, 12)) else d for i, d in enumerate(dims)]
            seeds[f"op{op:02d}_call_f32_plain"] = op_call(2, op, F32, opts, plain, typed={i: F32 for i in acc_ops})


# Inputs the fuzzer found, whole (their own pool): batch_norm_stats over [3037000500, 0], which
# walked three billion empty rows for 25 s a call before the empty steps returned at once.
FOUND = {
    "found_bn_stats_no_columns": "00f4050100020306d70200180000000000040001000002000003000002000003000002000003000001e5020000",
}


def encoder_seeds(seeds):
    """The encoder layer (kind byte 248): sizes, a training forward and its backward, d_model 4,
    2 heads, d_ff 6, B 2, L 3, every operand its descriptor's shape (mode byte 0)."""
    packed = 0b11 | 0b1111111100000000        # w_qkv, b_qkv; w_o … norm2_b
    separate = 0b11111100 | 0b1111111100000000  # w_q … b_v; w_o … norm2_b
    stats = 0b1111 << 18
    cases = {  # name: (k: act | norm << 3 | causal << 6 | resid << 7, k3: train 8 | dtype << 4, params, opt, gopt)
        "pre_layer_f32": (0 | 1 << 3 | 1 << 6, 8, packed, 0b0001, 0b0010),
        "patchtst_f32": (0 | 4 << 3 | 1 << 7, 8, separate | stats, 0b11100, 0b0111),
        "post_layer_bf16": (2 | 3 << 3, 8 | 2 << 4, packed, 0b0000, 0b0010 | 0x80),
        "pre_rms_f64": (1 | 2 << 3, 8 | 3 << 4, separate, 0b0011, 0b0010),
    }
    for name, (k, k3, params, opt, gopt) in cases.items():
        b = bytes([248, 0, K, B, SIX, k, 0, k3, 1, 2, B, N])
        b += bytes([params & 255, params >> 8 & 255, params >> 16 & 255, opt]) + bytes(5 + 22) + bytes([0, 1])
        grads = params & ~stats
        b += bytes(4) + bytes([gopt, grads & 255, grads >> 8 & 255, grads >> 16 & 255]) + bytes(22)
        seeds[f"encoder_{name}"] = b


def main():
    os.makedirs(out, exist_ok=True)
    for f in os.listdir(out):
        os.remove(os.path.join(out, f))
    seeds = {}
    for op, (opts, dims) in OPS.items():
        seeds[f"op{op:02d}_plan_f32"] = op_call(0, op, 0, opts, dims)
        seeds[f"op{op:02d}_call_f32"] = op_call(2, op, 0, opts, dims, acc=op % 2)
    for op in (1, 5, 12, 16, 19):
        opts, dims = OPS[op]
        seeds[f"op{op:02d}_plan_bf16"] = op_call(0, op, 2, opts, dims, typed={i: F32 for i in LOGP_ROWS.get(op, ())})
        seeds[f"op{op:02d}_call_f64"] = op_call(2, op, 3, opts, dims, acc=1, typed={i: F64 for i in LOGP_ROWS.get(op, ())})
    seeds["op13_call_axpby"] = op_call(2, 13, 0, EW_AXPBY, OPS[13][1], variant=2)
    seeds["op17_call_none"] = op_call(2, 17, 0, LOGP_NONE, OPS[17][1][:5] + [[N]] + OPS[17][1][6:])
    option_seeds(seeds)
    family_seeds(seeds)
    # adamw: ctx lr b1 b2 eps wd step gs count lb, then operands list by list, fill
    for lb, name in ((0, "f32"), (1 | 4, "f16_master"), (2, "bf16"), (2 | 64, "bf16_moments")):
        nl = 5 if lb & 4 else 4
        b = bytes([4, 0, S["1e-3"], S["0.5"], S["0.999"], S["1e-8"], S["0.25"], 1, 0, 2, lb])
        for _ in range(nl):
            for d in ([N, K], [M]):
                b += operand(d)
        seeds[f"adamw_{name}"] = b + bytes([1])
    encoder_seeds(seeds)
    seeds["convert_f32_bf16"] = bytes([5, 1, 3, 17, 0])
    seeds["convert_f16_f32"] = bytes([5, 2, 1, 9, 0])
    for k in range(6):
        seeds[f"context_{k}"] = bytes([6, k, 1, 1, 0, 1, 1, 0, 0])
    for k in range(6):
        seeds[f"misc_{k}"] = bytes([7, k, 1, 2, 3])
    for name, body in seeds.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(bytes([0]) + POOL + body)
    for name, whole in FOUND.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(bytes.fromhex(whole))
    print(f"{len(seeds)} seeds in {out}", file=sys.stderr)


main()
