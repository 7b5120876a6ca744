/* moe: dispatch + combine over E ranks with MPI_Alltoallv.
 *
 * Routing is computed from the seed on every rank in advance (no counts
 * exchanged in the timed part). Dispatch packs each token's fp8 row once
 * per destination rank into the send buffer (timed: an MPI user permutes
 * tokens before the all-to-all), then one MPI_Alltoallv; rows land in the
 * receive region of their source rank at slot k. Combine: one
 * MPI_Alltoallv of the bf16 rows back (same slots), then the f32 weighted
 * sum of each token's rows (timed). */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

struct moe {
    uint64_t E, T, H, X, K, seed;
    int me;
    uint8_t *cnt;   /* [(r*T+t)*E+d]: experts of (r,t) on rank d */
    uint32_t *slot; /* [(r*T+t)*E+d]: slot k of (r,t) in d's region of source r */
    uint64_t *n;    /* [r*E+d]: tokens of r that go to d */
};

static void route(struct moe *m) {
    uint64_t E = m->E, T = m->T, per = m->X / E;
    uint64_t *chosen = malloc(m->K * sizeof *chosen);
    if (chosen == NULL) die_all("out of memory (routing)");
    memset(m->n, 0, E * E * sizeof *m->n);
    for (uint64_t r = 0; r < E; r++)
        for (uint64_t t = 0; t < T; t++) {
            uint64_t s = m->seed ^ (r << 32) ^ t, got = 0;
            uint8_t *c = &m->cnt[(r * T + t) * E];
            memset(c, 0, E);
            while (got < m->K) {
                uint64_t e = sm_next(&s) % m->X;
                int dup = 0;
                for (uint64_t i = 0; i < got; i++) dup |= chosen[i] == e;
                if (dup) continue;
                chosen[got++] = e;
                c[e / per]++;
            }
            for (uint64_t d = 0; d < E; d++)
                if (c[d]) m->slot[(r * T + t) * E + d] = (uint32_t)m->n[r * E + d]++;
        }
    free(chosen);
}

static float bf16(const uint8_t *p) {
    uint32_t u = ((uint32_t)p[0] | ((uint32_t)p[1] << 8)) << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static int run_point(struct moe *m, const struct run_cfg *c, struct record_ctx *rc,
                     uint64_t *it) {
    uint64_t E = m->E, T = m->T, H = m->H, me = (uint64_t)m->me;
    m->cnt = malloc(E * T * E);
    m->slot = malloc(E * T * E * sizeof *m->slot);
    m->n = malloc(E * E * sizeof *m->n);
    int *sc = malloc(E * sizeof(int)), *sd = malloc(E * sizeof(int));
    int *rcn = malloc(E * sizeof(int)), *rd = malloc(E * sizeof(int));
    int *csc = malloc(E * sizeof(int)), *csd = malloc(E * sizeof(int));
    int *crc = malloc(E * sizeof(int)), *crd = malloc(E * sizeof(int));
    if (!m->cnt || !m->slot || !m->n || !sc || !sd || !rcn || !rd || !csc || !csd || !crc ||
        !crd)
        die_all("out of memory (moe layout)");
    route(m);
    uint64_t sent = 0, recv = 0;
    for (uint64_t d = 0; d < E; d++) {
        sent += m->n[me * E + d];
        recv += m->n[d * E + me];
    }
    /* Every count and displacement is an int in MPI_Alltoallv. */
    if ((sent > recv ? sent : recv) * 2 * H > INT_MAX) die_all("moe: a buffer over 2 GiB");
    int so = 0, ro = 0, cso = 0, cro = 0;
    for (uint64_t d = 0; d < E; d++) {
        sc[d] = (int)(m->n[me * E + d] * H);
        sd[d] = so;
        so += sc[d];
        rcn[d] = (int)(m->n[d * E + me] * H);
        rd[d] = ro;
        ro += rcn[d];
        /* combine: back to source d of what came from d; from d what went to d */
        csc[d] = (int)(m->n[d * E + me] * 2 * H);
        csd[d] = cso;
        cso += csc[d];
        crc[d] = (int)(m->n[me * E + d] * 2 * H);
        crd[d] = cro;
        cro += crc[d];
    }
    uint8_t *tok = malloc(T * H), *sbuf = malloc(sent * H + 1), *rbuf = malloc(recv * H + 1);
    uint8_t *csbuf = malloc(recv * 2 * H + 1), *crbuf = malloc(sent * 2 * H + 1);
    float *out = malloc(T * H * sizeof *out);
    /* token of (source s, slot k) that came to me: combine rows and checks */
    uint32_t *from_tok = malloc((recv + 1) * sizeof *from_tok);
    uint32_t *from_src = malloc((recv + 1) * sizeof *from_src);
    if (!tok || !sbuf || !rbuf || !csbuf || !crbuf || !out || !from_tok || !from_src)
        die_all("out of memory (moe buffers)");
    for (uint64_t s = 0, i = 0; s < E; s++)
        for (uint64_t t = 0; t < T; t++)
            if (m->cnt[(s * T + t) * E + me]) {
                from_tok[i] = (uint32_t)t;
                from_src[i] = (uint32_t)s;
                i++;
            }
    int reps = c->repeats;
    double *dsp = calloc((size_t)reps, sizeof(double)), *cmb = calloc((size_t)reps, sizeof(double));
    if (!dsp || !cmb) die_all("out of memory (samples)");
    volatile float sink = 0;
    for (int i = -1; i < reps; i++) {
        uint64_t iter = (*it)++;
        for (uint64_t t = 0; t < T; t++) fill_unit(tok + t * H, H, (me << 32) | t, iter);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = now_s();
        for (uint64_t t = 0; t < T; t++)
            for (uint64_t d = 0; d < E; d++)
                if (m->cnt[(me * T + t) * E + d])
                    memcpy(sbuf + sd[d] + (uint64_t)m->slot[(me * T + t) * E + d] * H,
                           tok + t * H, H);
        MPI_Alltoallv(sbuf, sc, sd, MPI_BYTE, rbuf, rcn, rd, MPI_BYTE, MPI_COMM_WORLD);
        double td = now_s() - t0;
        /* The experts' output rows, in place in the combine send buffer (untimed). */
        for (uint64_t i2 = 0; i2 < recv; i2++) {
            uint64_t s = from_src[i2], t = from_tok[i2];
            fill_unit(csbuf + i2 * 2 * H, 2 * H, (1ULL << 63) | (me << 40) | (s << 32) | t,
                      iter);
        }
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = now_s();
        MPI_Alltoallv(csbuf, csc, csd, MPI_BYTE, crbuf, crc, crd, MPI_BYTE, MPI_COMM_WORLD);
        for (uint64_t t = 0; t < T; t++) {
            float *o = out + t * H;
            memset(o, 0, H * sizeof *o);
            for (uint64_t d = 0; d < E; d++) {
                uint8_t k = m->cnt[(me * T + t) * E + d];
                if (!k) continue;
                float wgt = (float)k / (float)m->K;
                const uint8_t *row =
                    crbuf + crd[d] + (uint64_t)m->slot[(me * T + t) * E + d] * 2 * H;
                for (uint64_t h = 0; h < H; h++) o[h] += wgt * bf16(row + 2 * h);
            }
        }
        double tc = now_s() - t0;
        sink += out[(T - 1) * H + H / 2];
        double mx[2], mine[2] = {td, tc};
        MPI_Reduce(mine, mx, 2, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        if (i >= 0 && m->me == 0) {
            dsp[i] = mx[0] * 1e6;
            cmb[i] = mx[1] * 1e6;
        }
        /* Untimed: every received dispatch and combine row, every byte. */
        int bad = 0;
        for (uint64_t i2 = 0; i2 < recv && !bad; i2++) {
            uint64_t s = from_src[i2], t = from_tok[i2];
            long long at = check_unit(rbuf + i2 * H, H, (s << 32) | t, iter);
            if (at >= 0) {
                fprintf(stderr, "moe: dispatch row of (rank %llu, token %llu) differs at byte %lld\n",
                        (unsigned long long)s, (unsigned long long)t, at);
                bad = 1;
            }
        }
        for (uint64_t t = 0; t < T && !bad; t++)
            for (uint64_t d = 0; d < E && !bad; d++) {
                if (!m->cnt[(me * T + t) * E + d]) continue;
                const uint8_t *row =
                    crbuf + crd[d] + (uint64_t)m->slot[(me * T + t) * E + d] * 2 * H;
                long long at = check_unit(row, 2 * H,
                                          (1ULL << 63) | (d << 40) | (me << 32) | t, iter);
                if (at >= 0) {
                    fprintf(stderr, "moe: combine row of token %llu from rank %llu differs at byte %lld\n",
                            (unsigned long long)t, (unsigned long long)d, at);
                    bad = 1;
                }
            }
        int any = 0;
        MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        if (any) die_all("moe: verification failed (stale or misplaced row)");
    }
    if (m->me == 0) {
        char params[256];
        snprintf(params, sizeof params,
                 "{\"ranks\":%llu,\"tokens\":%llu,\"hidden\":%llu,\"experts\":%llu,"
                 "\"topk\":%llu,\"seed\":%llu}",
                 (unsigned long long)E, (unsigned long long)T, (unsigned long long)H,
                 (unsigned long long)m->X, (unsigned long long)m->K,
                 (unsigned long long)m->seed);
        double md, pd10, pd90, mc, pc10, pc90;
        stats(dsp, reps, &md, &pd10, &pd90);
        stats(cmb, reps, &mc, &pc10, &pc90);
        write_record(rc, params, "dispatch_us", md, "us", &pd10, &pd90);
        write_record(rc, params, "combine_us", mc, "us", &pc10, &pc90);
        printf("openmpi moe %s T=%llu: dispatch %.1f us, combine %.1f us\n", c->transport,
               (unsigned long long)T, md, mc);
    }
    free(m->cnt); free(m->slot); free(m->n);
    free(sc); free(sd); free(rcn); free(rd); free(csc); free(csd); free(crc); free(crd);
    free(tok); free(sbuf); free(rbuf); free(csbuf); free(crbuf); free(out);
    free(from_tok); free(from_src); free(dsp); free(cmb);
    return 0;
}

int moe_main(struct opts *o, const struct run_cfg *c, char *err, size_t errlen) {
    struct moe m;
    memset(&m, 0, sizeof m);
    int size = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_rank(MPI_COMM_WORLD, &m.me);
    if (opt_u64(o, "ranks", (uint64_t)size, 1, 4096, &m.E, err, errlen) ||
        opt_u64(o, "hidden", 7168, 8, 1 << 20, &m.H, err, errlen) ||
        opt_u64(o, "experts", 256, 1, 1 << 16, &m.X, err, errlen) ||
        opt_u64(o, "topk", 8, 1, 255, &m.K, err, errlen) ||
        opt_u64(o, "seed", 1, 0, UINT64_MAX, &m.seed, err, errlen))
        return 2;
    const char *tokens = opt_str(o, "tokens", "1,8,32,128");
    if (opts_all_used(o, err, errlen)) return 2;
    if (m.E != (uint64_t)size) {
        snprintf(err, errlen, "--ranks %llu but mpirun started %d ranks",
                 (unsigned long long)m.E, size);
        return 2;
    }
    if (m.X % m.E != 0 || m.K > m.X) {
        snprintf(err, errlen, "--experts %llu must be a multiple of the ranks (%llu) and >= "
                 "--topk %llu", (unsigned long long)m.X, (unsigned long long)m.E,
                 (unsigned long long)m.K);
        return 2;
    }
    uint64_t list[64];
    int nl = 0;
    for (const char *p = tokens; *p;) {
        char *end = NULL;
        unsigned long long v = strtoull(p, &end, 10);
        if (end == p || v < 1 || v > (1u << 20) || nl == 64 || (*end != ',' && *end != '\0')) {
            snprintf(err, errlen, "--tokens takes a comma list of 1..1048576, got `%s`", tokens);
            return 2;
        }
        list[nl++] = v;
        p = *end == ',' ? end + 1 : end;
    }
    if (nl == 0) {
        snprintf(err, errlen, "--tokens is empty");
        return 2;
    }
    /* Records are kept in memory until every point passed its checks: a
     * failed run leaves no file behind. */
    char *text = NULL;
    size_t text_len = 0;
    FILE *f = m.me == 0 ? open_memstream(&text, &text_len) : NULL;
    if (m.me == 0 && f == NULL) die_all("moe: open_memstream failed");
    char config[1024];
    snprintf(config, sizeof config,
             "%s; MPI_Alltoallv of MPI_BYTE for dispatch and for combine, routing "
             "precomputed; dispatch_us includes packing each token row per destination "
             "(memcpy), combine_us includes the f32 weighted sum; max over ranks",
             c->mca);
    struct record_ctx rc = {f, "moe", c->transport, config, c->note, c->repeats};
    uint64_t it = 0;
    for (int i = 0; i < nl; i++) {
        m.T = list[i];
        run_point(&m, c, &rc, &it);
    }
    if (f != NULL) {
        if (fclose(f) != 0) die_all("moe: keeping the records failed");
        FILE *out = open_out(c);
        if (fwrite(text, 1, text_len, out) != text_len || fclose(out) != 0)
            die_all("moe: writing the records failed");
        free(text);
    }
    return 0;
}
