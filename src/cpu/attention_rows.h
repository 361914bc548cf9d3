/*
 * attention_rows.h — the CPU attention kernel's body for one (sequence, head), written once and
 * included twice by src/cpu/attention.c: with REAL = float (f32 / f16 / bf16 problems: f32 math)
 * and with REAL = double (f64 problems), the includer naming the two functions (FWD_UNIT,
 * BWD_UNIT), the row access (LD_ROW: a strided row of any dtype into REALs; ST_ROW: REALs out,
 * added to what is there when asked), LD and ST of one element, EXP and LOG of that type. Why
 * this way: the body is the reference the CUDA kernels are tested against, and one text of it
 * for both precisions keeps them the same algorithm.
 *
 * The head's K and V are converted once, row-major and transposed: a query row's scores are
 * then sums over hd of whole key rows (s[j] += q[x]·Kᵀ[x][j], one loop the compiler vectorizes
 * along j), and its output a sum over keys of whole value rows. Memory: O(L·hd) per call. Every
 * sum runs in a fixed order: dK and dV gather the query rows in order.
 */

/* Forward of head (b, h), keys [0, len) unmasked by padding.
 * buf: 3·L·hd + 2·L + 2·hd REALs (K, Kᵀ, V, the scores row, the scores-in row, q, the sum). */
FG_CPU_CLONES
static void FWD_UNIT(const fg_attn_call *c, int64_t b, int64_t h, int64_t len, REAL *buf) {
    const fg_attn_problem *p = &c->p;
    const int64_t L = p->L, hd = p->hd;
    REAL *K = buf, *Kt = K + L * hd, *V = Kt + L * hd, *s = V + L * hd, *sin = s + L, *q = sin + L, *acc = q + hd;
    const fg_attn_view *kv = &c->k, *vv = &c->v, *qv = &c->q, *ov = &c->o, *si = &c->scores_in, *so = &c->scores_out;
    const fg_dtype dt = p->dtype, sdt = p->sdtype;
    for (int64_t j = 0; j < len; j++) {
        LD_ROW(K + j * hd, kv->data, dt, b * kv->sb + h * kv->sh + j * kv->sl, kv->sx, hd);
        LD_ROW(V + j * hd, vv->data, dt, b * vv->sb + h * vv->sh + j * vv->sl, vv->sx, hd);
        for (int64_t x = 0; x < hd; x++) Kt[x * L + j] = K[j * hd + x];
    }
    const REAL scale = (REAL)c->scale, keep_scale = (REAL)c->keep_scale, ninf = -(REAL)INFINITY;
    const int64_t lse_row = (b * p->H + h) * L;
    for (int64_t i = 0; i < L; i++) {
        const int64_t jend = p->causal ? (i + 1 < len ? i + 1 : len) : len;
        LD_ROW(q, qv->data, dt, b * qv->sb + h * qv->sh + i * qv->sl, qv->sx, hd);
        for (int64_t j = 0; j < jend; j++) s[j] = 0;
        for (int64_t x = 0; x < hd; x++) {
            const REAL qx = q[x], *kt = Kt + x * L;
            for (int64_t j = 0; j < jend; j++) s[j] += qx * kt[j];
        }
        if (si->data) {
            LD_ROW(sin, si->data, sdt, b * si->sb + h * si->sh + i * si->sl, si->sx, jend);
            for (int64_t j = 0; j < jend; j++) s[j] = s[j] * scale + sin[j];
        } else {
            for (int64_t j = 0; j < jend; j++) s[j] *= scale;
        }
        REAL m = ninf;
        for (int64_t j = 0; j < jend; j++)
            if (s[j] > m || s[j] != s[j]) m = s[j];
        if (so->data) {
            for (int64_t j = jend; j < L; j++) s[j] = ninf;
            ST_ROW(so->data, sdt, b * so->sb + h * so->sh + i * so->sl, so->sx, s, L, false);
        }
        const int64_t obase = b * ov->sb + h * ov->sh + i * ov->sl;
        if (m == ninf) { /* no key: o = 0, lse = −∞ */
            for (int64_t x = 0; x < hd; x++) acc[x] = 0;
            ST_ROW(ov->data, dt, obase, ov->sx, acc, hd, false);
            ST(c->lse, p->acc, lse_row + i, ninf);
            continue;
        }
        for (int64_t j = 0; j < jend; j++) s[j] = EXP(s[j] - m);
        REAL sum = 0;
        for (int64_t j = 0; j < jend; j++) sum += s[j];
        if (p->dropout) {
            const uint64_t idx0 = (uint64_t)((lse_row + i) * L);
            for (int64_t j = 0; j < jend; j++)
                s[j] = fg_dropout_uniform(c->seed, c->offset, idx0 + (uint64_t)j) >= c->keep_threshold ? s[j] * keep_scale
                                                                                                      : 0;
        }
        for (int64_t x = 0; x < hd; x++) acc[x] = 0;
        for (int64_t j = 0; j < jend; j++) {
            const REAL e = s[j], *vj = V + j * hd;
            for (int64_t x = 0; x < hd; x++) acc[x] += e * vj[x];
        }
        const REAL inv = 1 / sum;
        for (int64_t x = 0; x < hd; x++) acc[x] *= inv;
        ST_ROW(ov->data, dt, obase, ov->sx, acc, hd, false);
        ST(c->lse, p->acc, lse_row + i, m + LOG(sum));
    }
}

/* Backward of head (b, h). buf: 5·L·hd + 4·L + 4·hd REALs (K, Kᵀ, Vᵀ, dKᵀ, dVᵀ; rows s, dp,
 * scores in / dscores, dscores_in; q, do, o, dq). */
FG_CPU_CLONES
static void BWD_UNIT(const fg_attn_call *c, int64_t b, int64_t h, int64_t len, REAL *buf) {
    const fg_attn_problem *p = &c->p;
    const int64_t L = p->L, hd = p->hd;
    REAL *K = buf, *Kt = K + L * hd, *Vt = Kt + L * hd, *dKt = Vt + L * hd, *dVt = dKt + L * hd;
    REAL *s = dVt + L * hd, *dp = s + L, *row = dp + L, *ds = row + L;
    REAL *q = ds + L, *dO = q + hd, *o = dO + hd, *dq = o + hd;
    const fg_attn_view *kv = &c->k, *vv = &c->v, *qv = &c->q, *ov = &c->o, *si = &c->scores_in;
    const fg_attn_view *dov = &c->d_o, *g = &c->dscores, *dsi = &c->dscores_in;
    const fg_dtype dt = p->dtype, sdt = p->sdtype;
    const bool acc_out = p->accumulate;
    for (int64_t j = 0; j < len; j++) {
        LD_ROW(K + j * hd, kv->data, dt, b * kv->sb + h * kv->sh + j * kv->sl, kv->sx, hd);
        LD_ROW(q, vv->data, dt, b * vv->sb + h * vv->sh + j * vv->sl, vv->sx, hd);
        for (int64_t x = 0; x < hd; x++) Kt[x * L + j] = K[j * hd + x], Vt[x * L + j] = q[x];
    }
    for (int64_t e = 0; e < L * hd; e++) dKt[e] = dVt[e] = 0;
    const REAL scale = (REAL)c->scale, keep_scale = (REAL)c->keep_scale, ninf = -(REAL)INFINITY;
    const int64_t lse_row = (b * p->H + h) * L;
    for (int64_t i = 0; i < L; i++) {
        const int64_t jend = p->causal ? (i + 1 < len ? i + 1 : len) : len;
        const REAL lse = LD(c->lse, p->acc, lse_row + i);
        const bool empty = lse == ninf;
        const int64_t jw = empty ? 0 : jend; /* the keys this row has gradients for */
        for (int64_t x = 0; x < hd; x++) dq[x] = 0;
        if (!empty) {
            LD_ROW(q, qv->data, dt, b * qv->sb + h * qv->sh + i * qv->sl, qv->sx, hd);
            LD_ROW(dO, dov->data, dt, b * dov->sb + h * dov->sh + i * dov->sl, dov->sx, hd);
            LD_ROW(o, ov->data, dt, b * ov->sb + h * ov->sh + i * ov->sl, ov->sx, hd);
            REAL D = 0;
            for (int64_t x = 0; x < hd; x++) D += dO[x] * o[x];
            for (int64_t j = 0; j < jend; j++) s[j] = dp[j] = 0;
            for (int64_t x = 0; x < hd; x++) {
                const REAL qx = q[x], dx = dO[x], *kt = Kt + x * L, *vt = Vt + x * L;
                for (int64_t j = 0; j < jend; j++) {
                    s[j] += qx * kt[j];
                    dp[j] += dx * vt[j];
                }
            }
            if (si->data) {
                LD_ROW(row, si->data, sdt, b * si->sb + h * si->sh + i * si->sl, si->sx, jend);
                for (int64_t j = 0; j < jend; j++) s[j] = s[j] * scale + row[j];
            } else {
                for (int64_t j = 0; j < jend; j++) s[j] *= scale;
            }
            for (int64_t j = 0; j < jend; j++) s[j] = EXP(s[j] - lse); /* p */
            if (p->dropout) { /* s: p̃ = p·keep/(1 − p); dp: dp̃·keep/(1 − p) */
                const uint64_t idx0 = (uint64_t)((lse_row + i) * L);
                for (int64_t j = 0; j < jend; j++) {
                    const REAL kd =
                        fg_dropout_uniform(c->seed, c->offset, idx0 + (uint64_t)j) >= c->keep_threshold ? keep_scale : 0;
                    ds[j] = s[j] * (dp[j] * kd - D);
                    s[j] *= kd;
                }
            } else {
                for (int64_t j = 0; j < jend; j++) ds[j] = s[j] * (dp[j] - D);
            }
            if (g->data) {
                LD_ROW(row, g->data, sdt, b * g->sb + h * g->sh + i * g->sl, g->sx, jend);
                for (int64_t j = 0; j < jend; j++) ds[j] += row[j];
            }
            for (int64_t x = 0; x < hd; x++) {
                const REAL qx = q[x], dx = dO[x];
                REAL *dkt = dKt + x * L, *dvt = dVt + x * L;
                for (int64_t j = 0; j < jend; j++) {
                    dkt[j] += ds[j] * qx;
                    dvt[j] += s[j] * dx;
                }
            }
            for (int64_t j = 0; j < jend; j++) {
                const REAL d = ds[j], *kj = K + j * hd;
                for (int64_t x = 0; x < hd; x++) dq[x] += d * kj[x];
            }
        }
        if (dsi->data) { /* ds, and 0 at the masked positions (nothing to add with accumulate) */
            const int64_t base = b * dsi->sb + h * dsi->sh + i * dsi->sl;
            for (int64_t j = jw; j < L; j++) ds[j] = 0;
            ST_ROW(dsi->data, sdt, base, dsi->sx, ds, acc_out ? jw : L, acc_out);
        }
        if (c->dq.data) {
            const fg_attn_view *d = &c->dq;
            for (int64_t x = 0; x < hd; x++) dq[x] *= scale;
            ST_ROW(d->data, dt, b * d->sb + h * d->sh + i * d->sl, d->sx, dq, hd, acc_out);
        }
    }
    for (int64_t j = 0; j < L; j++) {
        if (c->dk.data) {
            const fg_attn_view *d = &c->dk;
            for (int64_t x = 0; x < hd; x++) q[x] = dKt[x * L + j] * scale;
            ST_ROW(d->data, dt, b * d->sb + h * d->sh + j * d->sl, d->sx, q, hd, acc_out);
        }
        if (c->dv.data) {
            const fg_attn_view *d = &c->dv;
            for (int64_t x = 0; x < hd; x++) q[x] = dVt[x * L + j];
            ST_ROW(d->data, dt, b * d->sb + h * d->sh + j * d->sl, d->sx, q, hd, acc_out);
        }
    }
}
