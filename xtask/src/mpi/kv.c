/* kv: disaggregated prefill -> decode (rank 0 prefill, rank 1 decode).
 *
 * The decode pool is one MPI_Win_allocate window; prefill holds a shared
 * passive-target lock on it for the whole run. Per (request, layer):
 * P x MPI_Put of one page each into the shuffled pool slots, MPI_Win_flush
 * (remote completion), then a small notification: an MPI_Send of the
 * (request, layer) index (--notify send) or an 8-byte flag MPI_Put into a
 * flag array after the pool that decode polls (--notify put). */
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

enum { TAG_LAYER = 11, TAG_ACK = 12 };

struct kv {
    uint64_t L, P, B, R, C, seed;
    int notify_put;
    uint64_t pool_pages;
    uint64_t *perm;
    uint8_t **src;    /* prefill: R buffers of L*P*B */
    uint8_t *pool;    /* decode: the window memory */
    uint64_t *flags;  /* decode: R*L flags after the pool */
    uint64_t *flagsrc; /* prefill: the values put into the flags */
    MPI_Win win;
    int rank;
};

static uint64_t page_tag(uint64_t r, uint64_t l, uint64_t p) {
    return (r << 40) | (l << 20) | p;
}

/* One iteration; on prefill returns ttll (s) and the write rate (GB/s). */
static void iteration(struct kv *k, uint64_t it, double compute_us, double *ttll,
                      double *gbps) {
    uint64_t L = k->L, P = k->P, B = k->B, R = k->R;
    if (k->rank == 0)
        for (uint64_t r = 0; r < R; r++)
            for (uint64_t l = 0; l < L; l++)
                for (uint64_t p = 0; p < P; p++)
                    fill_unit(k->src[r] + (l * P + p) * B, B, page_tag(r, l, p), it);
    MPI_Barrier(MPI_COMM_WORLD);
    if (k->rank == 0) {
        double t_first = 0, t_compute_end = 0;
        for (uint64_t i = 0; i < R * L; i++) k->flagsrc[i] = it + 1;
        for (uint64_t l = 0; l < L; l++) {
            busy_wait_us(compute_us);
            if (l == L - 1) t_compute_end = now_s();
            for (uint64_t r = 0; r < R; r++) {
                if (l == 0 && r == 0) t_first = now_s();
                for (uint64_t p = 0; p < P; p++) {
                    uint64_t dst = k->perm[(r * L + l) * P + p];
                    MPI_Put(k->src[r] + (l * P + p) * B, (int)B, MPI_BYTE, 1,
                            (MPI_Aint)(dst * B), (int)B, MPI_BYTE, k->win);
                }
                MPI_Win_flush(1, k->win);
                uint64_t idx = r * L + l;
                if (k->notify_put)
                    MPI_Put(&k->flagsrc[idx], 1, MPI_UINT64_T, 1,
                            (MPI_Aint)(k->pool_pages * B + idx * 8), 1, MPI_UINT64_T,
                            k->win);
                else
                    MPI_Send(&idx, 1, MPI_UINT64_T, 1, TAG_LAYER, MPI_COMM_WORLD);
            }
        }
        if (k->notify_put) MPI_Win_flush(1, k->win);
        int ack = 0;
        MPI_Recv(&ack, 1, MPI_INT, 1, TAG_ACK, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        double t_ack = now_s();
        *ttll = t_ack - t_compute_end;
        *gbps = (double)(R * L * P * B) / (t_ack - t_first) / 1e9;
    } else {
        uint64_t n = R * L, seen = 0;
        char *got = calloc(n, 1);
        if (got == NULL) die_all("out of memory (kv flags)");
        if (k->notify_put) {
            volatile uint64_t *fl = k->flags;
            while (seen < n) {
                MPI_Win_sync(k->win);
                for (uint64_t i = 0; i < n; i++)
                    if (!got[i] && fl[i] == it + 1) {
                        got[i] = 1;
                        seen++;
                    }
                if (seen < n) {
                    /* Drives Open MPI's progress (the emulated paths need the target in MPI). */
                    int flag;
                    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag,
                               MPI_STATUS_IGNORE);
                }
            }
        } else {
            while (seen < n) {
                uint64_t idx = 0;
                MPI_Recv(&idx, 1, MPI_UINT64_T, 0, TAG_LAYER, MPI_COMM_WORLD,
                         MPI_STATUS_IGNORE);
                if (idx >= n || got[idx]) die_all("kv: a layer notified twice or out of range");
                got[idx] = 1;
                seen++;
            }
        }
        free(got);
        int ack = 1;
        MPI_Send(&ack, 1, MPI_INT, 0, TAG_ACK, MPI_COMM_WORLD);
    }
    /* Untimed: decode checks every byte of every page at its shuffled slot. */
    int bad = 0;
    if (k->rank == 1) {
        MPI_Win_sync(k->win);
        for (uint64_t r = 0; r < R && !bad; r++)
            for (uint64_t l = 0; l < L && !bad; l++)
                for (uint64_t p = 0; p < P && !bad; p++) {
                    uint64_t dst = k->perm[(r * L + l) * P + p];
                    long long at = check_unit(k->pool + dst * B, B, page_tag(r, l, p), it);
                    if (at >= 0) {
                        fprintf(stderr,
                                "kv: iteration %llu: page (r %llu, l %llu, p %llu) at pool "
                                "slot %llu differs at byte %lld\n",
                                (unsigned long long)it, (unsigned long long)r,
                                (unsigned long long)l, (unsigned long long)p,
                                (unsigned long long)dst, at);
                        bad = 1;
                    }
                }
    }
    int any = 0;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (any) die_all("kv: verification failed (stale or misplaced page)");
}

int kv_main(struct opts *o, const struct run_cfg *c, char *err, size_t errlen) {
    struct kv k;
    memset(&k, 0, sizeof k);
    if (opt_u64(o, "layers", 32, 1, 4096, &k.L, err, errlen) ||
        opt_u64(o, "pages-per-layer", 64, 1, 65536, &k.P, err, errlen) ||
        opt_u64(o, "page-bytes", 16384, 8, 1 << 26, &k.B, err, errlen) ||
        opt_u64(o, "requests", 4, 1, 64, &k.R, err, errlen) ||
        opt_u64(o, "compute-us", 500, 0, 10000000, &k.C, err, errlen) ||
        opt_u64(o, "seed", 1, 0, UINT64_MAX, &k.seed, err, errlen))
        return 2;
    const char *notify = opt_str(o, "notify", "send");
    if (opts_all_used(o, err, errlen)) return 2;
    if (strcmp(notify, "send") != 0 && strcmp(notify, "put") != 0) {
        snprintf(err, errlen, "--notify takes send or put, got `%s`", notify);
        return 2;
    }
    k.notify_put = strcmp(notify, "put") == 0;
    int size = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_rank(MPI_COMM_WORLD, &k.rank);
    if (size != 2) {
        snprintf(err, errlen, "kv runs on 2 ranks (prefill, decode), got %d (mpirun -np 2)",
                 size);
        return 2;
    }
    k.pool_pages = 2 * k.R * k.L * k.P;
    uint64_t pool_bytes = k.pool_pages * k.B;
    if (pool_bytes > (1ULL << 36)) {
        snprintf(err, errlen, "kv pool of %llu bytes is over 64 GiB",
                 (unsigned long long)pool_bytes);
        return 2;
    }
    k.perm = malloc(k.pool_pages * sizeof *k.perm);
    if (k.perm == NULL) die_all("out of memory (kv permutation)");
    sm_shuffle(k.perm, k.pool_pages, k.seed);
    uint8_t *base = NULL;
    MPI_Aint win_bytes = k.rank == 1 ? (MPI_Aint)(pool_bytes + k.R * k.L * 8) : 0;
    MPI_Win_allocate(win_bytes, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &base, &k.win);
    if (k.rank == 1) {
        k.pool = base;
        k.flags = (uint64_t *)(base + pool_bytes);
        memset(base, 0, (size_t)win_bytes);
        MPI_Win_lock_all(MPI_MODE_NOCHECK, k.win);
    } else {
        k.src = calloc(k.R, sizeof *k.src);
        k.flagsrc = calloc(k.R * k.L, sizeof *k.flagsrc);
        if (k.src == NULL || k.flagsrc == NULL) die_all("out of memory (kv sources)");
        for (uint64_t r = 0; r < k.R; r++) {
            k.src[r] = malloc(k.L * k.P * k.B);
            if (k.src[r] == NULL) die_all("out of memory (kv source buffer)");
        }
        MPI_Win_lock(MPI_LOCK_SHARED, 1, 0, k.win);
    }
    /* With compute, also the C = 0 run: hidden_frac needs the exposed time. */
    uint64_t cs[2] = {k.C, 0};
    int ncs = k.C > 0 ? 2 : 1;
    double med_ttll[2] = {0, 0}, p10s[2][2], p90s[2][2], med_gbps[2] = {0, 0};
    double *ttll = calloc((size_t)c->repeats, sizeof(double));
    double *gbps = calloc((size_t)c->repeats, sizeof(double));
    if (ttll == NULL || gbps == NULL) die_all("out of memory (kv samples)");
    uint64_t it = 0;
    for (int ci = 0; ci < ncs; ci++) {
        double t, g;
        iteration(&k, it++, (double)cs[ci], &t, &g); /* warm-up */
        for (int i = 0; i < c->repeats; i++) iteration(&k, it++, (double)cs[ci], &ttll[i], &gbps[i]);
        if (k.rank == 0) {
            stats(ttll, c->repeats, &med_ttll[ci], &p10s[ci][0], &p90s[ci][0]);
            stats(gbps, c->repeats, &med_gbps[ci], &p10s[ci][1], &p90s[ci][1]);
        }
    }
    if (k.rank == 1)
        MPI_Win_unlock_all(k.win);
    else
        MPI_Win_unlock(1, k.win);
    if (k.rank == 0) {
        char config[1024];
        snprintf(config, sizeof config,
                 "%s; decode pool = one MPI_Win_allocate window, prefill holds a shared "
                 "passive-target lock; per (request, layer) %llu x MPI_Put + MPI_Win_flush, "
                 "then notify by %s; ack MPI_Send; no progress thread",
                 c->mca, (unsigned long long)k.P,
                 k.notify_put ? "an 8-byte flag MPI_Put (decode polls with MPI_Win_sync)"
                              : "MPI_Send (decode MPI_Recv per layer)");
        /* Why the row differs from an engine that posts writes and returns. */
        char note[1024];
        snprintf(note, sizeof note,
                 "%s%sMPI_Win_flush blocks the prefill thread, so a layer's transfer delays "
                 "the next layer's compute (no overlap without a progress thread): ttll_us "
                 "covers the last layer only, the rest shows in kv_gbps",
                 c->note, c->note[0] ? "; " : "");
        FILE *f = open_out(c);
        struct record_ctx rc = {f, "kv", c->transport, config, note, c->repeats};
        for (int ci = 0; ci < ncs; ci++) {
            char params[512];
            snprintf(params, sizeof params,
                     "{\"layers\":%llu,\"pages_per_layer\":%llu,\"page_bytes\":%llu,"
                     "\"requests\":%llu,\"compute_us\":%llu,\"seed\":%llu}",
                     (unsigned long long)k.L, (unsigned long long)k.P,
                     (unsigned long long)k.B, (unsigned long long)k.R,
                     (unsigned long long)cs[ci], (unsigned long long)k.seed);
            double us = med_ttll[ci] * 1e6, p10 = p10s[ci][0] * 1e6, p90 = p90s[ci][0] * 1e6;
            write_record(&rc, params, "ttll_us", us, "us", &p10, &p90);
            write_record(&rc, params, "kv_gbps", med_gbps[ci], "GB/s", &p10s[ci][1],
                         &p90s[ci][1]);
            if (ci == 0 && ncs == 2)
                write_record(&rc, params, "hidden_frac", 1.0 - med_ttll[0] / med_ttll[1],
                             "fraction", NULL, NULL);
        }
        if (fclose(f) != 0) die_all("kv: writing the records failed");
        printf("openmpi kv %s: ttll %.1f us (C=%llu), %.1f us (C=0), %.2f GB/s\n",
               c->transport, med_ttll[0] * 1e6, (unsigned long long)k.C,
               med_ttll[ncs - 1] * 1e6, med_gbps[0]);
    }
    MPI_Win_free(&k.win);
    return 0;
}
