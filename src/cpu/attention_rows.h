/*
 * attention_rows.h — the CPU attention kernel's body for one (sequence, head), written once and
 * included twice by src/cpu/attention.c: with REAL = float (f32 / f16 / bf16 problems: f32 math)
 * and with REAL = double (f64 problems). The includer names the two kernels (FWD_UNIT,
 * BWD_UNIT) and the helpers below, gives the types (VEC: 64 bytes of REALs, LANES of them;
 * VMASK: lane masks of MASKINT; VHALF, VQUARTER: 32 and 16 bytes of REALs), the row access
 * (LD_ROW: a strided row of any dtype into REALs; ST_ROW: REALs out, added to what is there when
 * asked), LD and ST of one element, and EXP and LOG of that type. Why this way: the body is the
 * reference the CUDA kernels are tested against, and one text of it for both precisions keeps
 * them the same algorithm. It undefines those parameters at its end.
 *
 * q and k may come in P pieces of hd ([B, H, L, P, hd]): the scores' sums then run over the
 * pieces' hq = P·hd components as over one head dim of hq (v, o, do keep hd).
 *
 * The head's K and V are converted once, transposed and padded to Lp keys (L rounded up to
 * LANES, the padding zero). A query row is then walked in whole vectors of LANES keys: its scores
 * are sums over hd of key rows (s[j] += q[x]·Kᵀ[x][j], the sum of a vector in a register), and
 * every sum over the keys (the softmax's sum, o[x] = Σ_j p[j]·Vᵀ[x][j], dq) runs in LANES partial
 * sums — key j into lane j mod LANES, the keys in order — folded by a fixed halving tree. So no
 * loop is scalar however small hd is (PatchTST's heads: hd = 4, L = 42), there is no per-row
 * call, and every sum has one order, independent of the thread count. Masked keys (causal, past
 * the length, the padding) are selected away: they enter no sum, their scores are −∞ and their
 * gradients 0, as if the loops stopped at the last key. Memory: O(Lp·hd) per call. dK and dV
 * gather the query rows in order.
 */

/* One vector of LANES REALs (64 bytes: one AVX-512 register, two AVX2 ones, four SSE ones, as
 * the clone compiles it), its lane mask, and what the rows do with them. */
static inline __attribute__((always_inline)) VEC VLD(const REAL *p) {
    VEC v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline __attribute__((always_inline)) void VST(REAL *p, VEC v) { memcpy(p, &v, sizeof v); }

/* a where m, else b */
static inline __attribute__((always_inline)) VEC VSEL(VMASK m, VEC a, VEC b) {
    return (VEC)(((VMASK)a & m) | ((VMASK)b & ~m));
}

/* lanes j0 + w < n: the first n − j0 (clamped to [0, LANES]) set, read from a table (a compare
 * of generic vectors would be split into scalars before the clones pick their instructions). */
static inline __attribute__((always_inline)) VMASK VBELOW(int64_t j0, int64_t n) {
#define HI (LANES > 8 ? -1 : 0)
    static const MASKINT ones[2 * LANES] = {-1, -1, -1, -1, -1, -1, -1, -1, HI, HI, HI, HI, HI, HI, HI, HI};
#undef HI
    const int64_t k = n - j0 < 0 ? 0 : n - j0 > LANES ? LANES : n - j0;
    VMASK m;
    memcpy(&m, ones + LANES - k, sizeof m);
    return m;
}

/* Σ of the lanes by halving, a fixed tree. */
static inline __attribute__((always_inline)) REAL VSUM(VEC v) {
    VHALF lo, hi;
    memcpy(&lo, &v, sizeof lo);
    memcpy(&hi, (const char *)&v + sizeof lo, sizeof hi);
    lo += hi;
    VQUARTER a, b;
    memcpy(&a, &lo, sizeof a);
    memcpy(&b, (const char *)&lo + sizeof a, sizeof b);
    a += b;
    REAL r[4];
    memcpy(r, &a, sizeof a);
    return LANES == 16 ? (r[0] + r[2]) + (r[1] + r[3]) : r[0] + r[1];
}

/* Σ_{j<n} x[j]·y[j], key j in lane j mod LANES (both readable up to n rounded up to LANES; the
 * last block's lanes past n selected away, so what lies there, NaN or not, does not enter). */
static inline __attribute__((always_inline)) REAL LANE_DOT(const REAL *x, const REAL *y, int64_t n) {
    VEC a = {0};
    int64_t j = 0;
    for (; j + LANES <= n; j += LANES) a += VLD(x + j) * VLD(y + j);
    if (j < n) a += VSEL(VBELOW(j, n), VLD(x + j) * VLD(y + j), (VEC){0});
    return VSUM(a);
}

/* Σ_{j<n} x[j], n a multiple of LANES. */
static inline __attribute__((always_inline)) REAL LANE_SUM(const REAL *x, int64_t n) {
    VEC a = {0};
    for (int64_t j = 0; j < n; j += LANES) a += VLD(x + j);
    return VSUM(a);
}

/* max_{j<n} x[j] of the non-NaN elements, −∞ when none; n a multiple of LANES. (A plain loop:
 * the clones' vectorizer makes it a max per lane.) */
static inline __attribute__((always_inline)) REAL LANE_MAX(const REAL *restrict x, int64_t n) {
    const REAL ninf = -(REAL)INFINITY;
    REAL a[LANES];
    for (int w = 0; w < LANES; w++) a[w] = ninf;
    for (int64_t j = 0; j < n; j += LANES)
        for (int w = 0; w < LANES; w++) a[w] = x[j + w] > a[w] ? x[j + w] : a[w];
    if (LANES >= 16)
        for (int k = 0; k < 8; k++) a[k] = a[k + 8] > a[k] ? a[k + 8] : a[k];
    for (int k = 0; k < 4; k++) a[k] = a[k + 4] > a[k] ? a[k + 4] : a[k];
    for (int k = 0; k < 2; k++) a[k] = a[k + 2] > a[k] ? a[k + 2] : a[k];
    return a[1] > a[0] ? a[1] : a[0];
}

/* Row i of head (b, h) of a q or k view, its P pieces one after another: P·hd REALs. */
static inline __attribute__((always_inline)) void LOAD_QK(REAL *restrict dst, const fg_attn_view *v, fg_dtype dt,
                                                          int64_t b, int64_t h, int64_t i, int64_t P, int64_t hd) {
    for (int64_t pc = 0; pc < P; pc++)
        LD_ROW(dst + pc * hd, v->data, dt, b * v->sb + h * v->sh + i * v->sl + pc * v->sp, v->sx, hd);
}

/* Row i of head (b, h) of a dq or dk view from P·hd REALs, piece by piece. */
static inline __attribute__((always_inline)) void STORE_QK(const fg_attn_view *v, fg_dtype dt, int64_t b, int64_t h,
                                                           int64_t i, int64_t P, int64_t hd, const REAL *src,
                                                           bool add) {
    for (int64_t pc = 0; pc < P; pc++)
        ST_ROW(v->data, dt, b * v->sb + h * v->sh + i * v->sl + pc * v->sp, v->sx, src + pc * hd, hd, add);
}

/* Kᵀ ([hq][Lp], hq = P·hd) and Vᵀ ([hd][Lp]) of head (b, h): keys [0, len) converted, the rest up
 * to Lp zero. row: hq REALs of scratch. */
static inline __attribute__((always_inline)) void LOAD_KV(const fg_attn_call *c, int64_t b, int64_t h, int64_t len,
                                                          int64_t Lp, REAL *restrict kt, REAL *restrict vt,
                                                          REAL *restrict row) {
    const int64_t hd = c->p.hd, P = c->p.pieces, hq = P * hd;
    const fg_attn_view *kv = &c->k, *vv = &c->v;
    const fg_dtype dt = c->p.dtype;
    for (int64_t e = 0; e < hq * Lp; e++) kt[e] = 0;
    for (int64_t e = 0; e < hd * Lp; e++) vt[e] = 0;
    for (int64_t j = 0; j < len; j++) {
        LOAD_QK(row, kv, dt, b, h, j, P, hd);
        for (int64_t x = 0; x < hq; x++) kt[x * Lp + j] = row[x];
        LD_ROW(row, vv->data, dt, b * vv->sb + h * vv->sh + j * vv->sl, vv->sx, hd);
        for (int64_t x = 0; x < hd; x++) vt[x * Lp + j] = row[x];
    }
}

/* A row of n scores of dtype sdt from view v (row i of head (b, h)) into dst, zero up to Lp. */
static inline __attribute__((always_inline)) void LOAD_SROW(REAL *restrict dst, const fg_attn_view *v, fg_dtype sdt,
                                                            int64_t b, int64_t h, int64_t i, int64_t n, int64_t Lp) {
    LD_ROW(dst, v->data, sdt, b * v->sb + h * v->sh + i * v->sl, v->sx, n);
    for (int64_t j = n; j < Lp; j++) dst[j] = 0;
}

/* Forward of head (b, h), keys [0, len) unmasked by padding.
 * buf: (hq + hd)·Lp + 2·Lp + hq + hd REALs (Kᵀ, Vᵀ, the scores row, the scores-in row, q, o). */
FG_CPU_CLONES
static void FWD_UNIT(const fg_attn_call *c, int64_t b, int64_t h, int64_t len, REAL *buf) {
    const fg_attn_problem *p = &c->p;
    const int64_t L = p->L, hd = p->hd, hq = p->pieces * hd, Lp = (L + LANES - 1) / LANES * LANES;
    REAL *restrict Kt = buf, *restrict Vt = Kt + hq * Lp, *restrict s = Vt + hd * Lp, *restrict sin = s + Lp;
    REAL *restrict q = sin + Lp, *restrict acc = q + hq;
    const fg_attn_view *qv = &c->q, *ov = &c->o, *si = &c->scores_in, *so = &c->scores_out;
    const fg_dtype dt = p->dtype, sdt = p->sdtype;
    LOAD_KV(c, b, h, len, Lp, Kt, Vt, q);
    const REAL scale = (REAL)c->scale, keep_scale = (REAL)c->keep_scale, ninf = -(REAL)INFINITY;
    VEC ninfv;
    for (int w = 0; w < LANES; w++) ninfv[w] = ninf;
    const int64_t lse_row = (b * p->H + h) * L;
    for (int64_t i = 0; i < L; i++) {
        const int64_t jend = p->causal ? (i + 1 < len ? i + 1 : len) : len;
        LOAD_QK(q, qv, dt, b, h, i, p->pieces, hd);
        if (si->data) LOAD_SROW(sin, si, sdt, b, h, i, jend, Lp);
        else for (int64_t j = 0; j < Lp; j++) sin[j] = 0;
        for (int64_t j0 = 0; j0 < Lp; j0 += LANES) { /* LANES keys at a time, their sums in a register */
            VEC a = {0};
            for (int64_t x = 0; x < hq; x++) a += q[x] * VLD(Kt + x * Lp + j0);
            VST(s + j0, VSEL(VBELOW(j0, jend), a * scale + VLD(sin + j0), ninfv));
        }
        REAL m = LANE_MAX(s, Lp);
        if (m == ninf) /* NaN scores make the row NaN, not empty */
            for (int64_t j = 0; j < jend; j++)
                if (s[j] != s[j]) m = s[j];
        if (so->data) ST_ROW(so->data, sdt, b * so->sb + h * so->sh + i * so->sl, so->sx, s, L, false);
        const int64_t obase = b * ov->sb + h * ov->sh + i * ov->sl;
        if (m == ninf) { /* no key: o = 0, lse = −∞ */
            for (int64_t x = 0; x < hd; x++) acc[x] = 0;
            ST_ROW(ov->data, dt, obase, ov->sx, acc, hd, false);
            ST(c->lse, p->acc, lse_row + i, ninf);
            continue;
        }
        for (int64_t j = 0; j < Lp; j++) s[j] = j < jend ? EXP(s[j] - m) : 0;
        const REAL sum = LANE_SUM(s, Lp);
        if (p->dropout) {
            const uint64_t idx0 = (uint64_t)((lse_row + i) * L);
            attn_keep_walk walk = ATTN_KEEP_START;
            for (int64_t j = 0; j < jend; j++) s[j] = attn_keep(&walk, c, idx0 + (uint64_t)j) ? s[j] * keep_scale : 0;
        }
        const REAL inv = 1 / sum;
        for (int64_t x = 0; x < hd; x++) acc[x] = LANE_DOT(s, Vt + x * Lp, jend) * inv;
        ST_ROW(ov->data, dt, obase, ov->sx, acc, hd, false);
        ST(c->lse, p->acc, lse_row + i, m + LOG(sum));
    }
}

/* Backward of head (b, h). buf: 2·(hq + hd)·Lp + 4·Lp + 2·hq + 2·hd REALs (Kᵀ, Vᵀ, dKᵀ, dVᵀ;
 * rows s, dp, scores in / dscores, dscores_in; q, do, o, dq). */
FG_CPU_CLONES
static void BWD_UNIT(const fg_attn_call *c, int64_t b, int64_t h, int64_t len, REAL *buf) {
    const fg_attn_problem *p = &c->p;
    const int64_t L = p->L, hd = p->hd, P = p->pieces, hq = P * hd, Lp = (L + LANES - 1) / LANES * LANES;
    REAL *restrict Kt = buf, *restrict Vt = Kt + hq * Lp, *restrict dKt = Vt + hd * Lp, *restrict dVt = dKt + hq * Lp;
    REAL *restrict s = dVt + hd * Lp, *restrict dp = s + Lp, *restrict row = dp + Lp, *restrict ds = row + Lp;
    REAL *restrict q = ds + Lp, *restrict dO = q + hq, *restrict o = dO + hd, *restrict dq = o + hd;
    const fg_attn_view *qv = &c->q, *ov = &c->o, *si = &c->scores_in;
    const fg_attn_view *dov = &c->d_o, *g = &c->dscores, *dsi = &c->dscores_in;
    const fg_dtype dt = p->dtype, sdt = p->sdtype;
    const bool acc_out = p->accumulate;
    LOAD_KV(c, b, h, len, Lp, Kt, Vt, dq);
    for (int64_t e = 0; e < hq * Lp; e++) dKt[e] = 0;
    for (int64_t e = 0; e < hd * Lp; e++) dVt[e] = 0;
    const REAL scale = (REAL)c->scale, keep_scale = (REAL)c->keep_scale, ninf = -(REAL)INFINITY;
    const int64_t lse_row = (b * p->H + h) * L;
    for (int64_t i = 0; i < L; i++) {
        const int64_t jend = p->causal ? (i + 1 < len ? i + 1 : len) : len;
        const REAL lse = LD(c->lse, p->acc, lse_row + i);
        const bool empty = lse == ninf;
        const int64_t jw = empty ? 0 : jend; /* the keys this row has gradients for */
        for (int64_t x = 0; x < hq; x++) dq[x] = 0;
        if (!empty) {
            LOAD_QK(q, qv, dt, b, h, i, P, hd);
            LD_ROW(dO, dov->data, dt, b * dov->sb + h * dov->sh + i * dov->sl, dov->sx, hd);
            LD_ROW(o, ov->data, dt, b * ov->sb + h * ov->sh + i * ov->sl, ov->sx, hd);
            REAL D = 0;
            for (int64_t x = 0; x < hd; x++) D += dO[x] * o[x];
            if (si->data) LOAD_SROW(row, si, sdt, b, h, i, jend, Lp);
            else for (int64_t j = 0; j < Lp; j++) row[j] = 0;
            for (int64_t j0 = 0; j0 < Lp; j0 += LANES) { /* s and dp for LANES keys in registers */
                VEC a = {0}, e = {0};
                for (int64_t x = 0; x < hq; x++) a += q[x] * VLD(Kt + x * Lp + j0);
                for (int64_t x = 0; x < hd; x++) e += dO[x] * VLD(Vt + x * Lp + j0);
                VST(s + j0, a * scale + VLD(row + j0));
                VST(dp + j0, e);
            }
            for (int64_t j = 0; j < Lp; j++) s[j] = j < jend ? EXP(s[j] - lse) : 0; /* p */
            if (p->dropout) { /* s: p̃ = p·keep/(1 − p); dp: dp̃·keep/(1 − p) */
                const uint64_t idx0 = (uint64_t)((lse_row + i) * L);
                attn_keep_walk walk = ATTN_KEEP_START;
                for (int64_t j = 0; j < jend; j++) {
                    const REAL kd = attn_keep(&walk, c, idx0 + (uint64_t)j) ? keep_scale : 0;
                    ds[j] = s[j] * (dp[j] * kd - D);
                    s[j] *= kd;
                }
                for (int64_t j = jend; j < Lp; j++) ds[j] = 0;
                if (g->data) {
                    LOAD_SROW(row, g, sdt, b, h, i, jend, Lp);
                    for (int64_t j0 = 0; j0 < Lp; j0 += LANES) VST(ds + j0, VLD(ds + j0) + VLD(row + j0));
                }
            } else {
                if (g->data) LOAD_SROW(row, g, sdt, b, h, i, jend, Lp);
                else for (int64_t j = 0; j < Lp; j++) row[j] = 0;
                for (int64_t j0 = 0; j0 < Lp; j0 += LANES)
                    VST(ds + j0, VSEL(VBELOW(j0, jend), VLD(s + j0) * (VLD(dp + j0) - D), (VEC){0}) + VLD(row + j0));
            }
            /* dKᵀ, dVᵀ += this row's terms; dq = Σ_j ds_j·k_j in lanes (LANE_DOT's order). Keys past
               jend get nothing (not 0·q, NaN for q = ∞). */
            for (int64_t x = 0; x < hq; x++) {
                const REAL qx = q[x];
                REAL *dkt = dKt + x * Lp;
                const REAL *kt = Kt + x * Lp;
                VEC dqa = {0};
                for (int64_t j0 = 0; j0 < jend; j0 += LANES) {
                    const VEC dsv = VLD(ds + j0);
                    VEC dk = dsv * qx, dqk = dsv * VLD(kt + j0);
                    if (j0 + LANES > jend) {
                        const VMASK mk = VBELOW(j0, jend);
                        dk = VSEL(mk, dk, (VEC){0});
                        dqk = VSEL(mk, dqk, (VEC){0});
                    }
                    VST(dkt + j0, VLD(dkt + j0) + dk);
                    dqa += dqk;
                }
                dq[x] = VSUM(dqa);
            }
            for (int64_t x = 0; x < hd; x++) {
                const REAL dx = dO[x];
                REAL *dvt = dVt + x * Lp;
                for (int64_t j0 = 0; j0 < jend; j0 += LANES) {
                    VEC dv = VLD(s + j0) * dx;
                    if (j0 + LANES > jend) dv = VSEL(VBELOW(j0, jend), dv, (VEC){0});
                    VST(dvt + j0, VLD(dvt + j0) + dv);
                }
            }
        }
        if (dsi->data) { /* ds, and 0 at the masked positions (nothing to add with accumulate) */
            const int64_t base = b * dsi->sb + h * dsi->sh + i * dsi->sl;
            for (int64_t j = jw; j < L; j++) ds[j] = 0;
            ST_ROW(dsi->data, sdt, base, dsi->sx, ds, acc_out ? jw : L, acc_out);
        }
        if (c->dq.data) {
            for (int64_t x = 0; x < hq; x++) dq[x] *= scale;
            STORE_QK(&c->dq, dt, b, h, i, P, hd, dq, acc_out);
        }
    }
    for (int64_t j = 0; j < L; j++) {
        if (c->dk.data) {
            for (int64_t x = 0; x < hq; x++) q[x] = dKt[x * Lp + j] * scale;
            STORE_QK(&c->dk, dt, b, h, j, P, hd, q, acc_out);
        }
        if (c->dv.data) {
            const fg_attn_view *d = &c->dv;
            for (int64_t x = 0; x < hd; x++) q[x] = dVt[x * Lp + j];
            ST_ROW(d->data, dt, b * d->sb + h * d->sh + j * d->sl, d->sx, q, hd, acc_out);
        }
    }
}

/* the parameters above, undefined for the next instantiation */
#undef REAL
#undef LD
#undef ST
#undef LD_ROW
#undef ST_ROW
#undef EXP
#undef LOG
#undef FWD_UNIT
#undef BWD_UNIT
#undef LANES
#undef VLD
#undef VST
#undef VSEL
#undef VBELOW
#undef VSUM
#undef VEC
#undef VMASK
#undef VHALF
#undef VQUARTER
#undef MASKINT
#undef LANE_SUM
#undef LANE_DOT
#undef LANE_MAX
#undef LOAD_KV
#undef LOAD_QK
#undef STORE_QK
#undef LOAD_SROW
