/* weights: RL weight update (ranks 0..M-1 trainers, M..M+N-1 inference).
 *
 * Variant "put": every inference rank's S-byte copy is one MPI_Win_allocate
 * window; trainer m holds a lock_all and, per inference rank (rotated by m
 * so trainers start on different ranks), MPI_Puts each tensor it owns at
 * its offset, MPI_Win_flush(rank), then an MPI_Send notification.
 * Variant "bcast": one MPI_Bcast per trainer shard, on a communicator of
 * the trainer and the N inference ranks, with an hindexed datatype of the
 * shard's tensors so the data lands in place (posted as MPI_Ibcast: the
 * inference ranks wait for all M at once). Either way an inference rank
 * acks rank 0 once its M shards are in; rank 0 stops the clock at the last
 * ack. */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"

enum { TAG_NOTIFY = 21, TAG_ACK = 22 };

struct weights {
    uint64_t M, N, S, seed;
    uint64_t nt;          /* tensors */
    uint64_t *off, *len;  /* per tensor */
    int rank;
    uint8_t *buf;         /* this rank's S bytes (window memory on inference ranks) */
    MPI_Win win;
    MPI_Comm *comm;       /* per trainer: {trainer, inference ranks} */
    MPI_Datatype *shard;  /* per trainer: its tensors, hindexed */
};

static int build_tensors(struct weights *w, char *err, size_t errlen) {
    uint64_t s = w->seed, sum = 0, cap = 64;
    w->off = malloc(cap * sizeof *w->off);
    w->len = malloc(cap * sizeof *w->len);
    if (w->off == NULL || w->len == NULL) die_all("out of memory (tensor list)");
    w->nt = 0;
    while (sum < w->S) {
        uint64_t size = 1ULL << (12 + sm_next(&s) % 13);
        if (size > w->S - sum) size = w->S - sum;
        if (w->nt == cap) {
            cap *= 2;
            w->off = realloc(w->off, cap * sizeof *w->off);
            w->len = realloc(w->len, cap * sizeof *w->len);
            if (w->off == NULL || w->len == NULL) die_all("out of memory (tensor list)");
        }
        w->off[w->nt] = sum;
        w->len[w->nt] = size;
        w->nt++;
        sum += size;
    }
    if (w->nt < w->M) {
        snprintf(err, errlen, "%llu tensors for %llu trainers: a trainer would own none",
                 (unsigned long long)w->nt, (unsigned long long)w->M);
        return -1;
    }
    return 0;
}

static int is_trainer(const struct weights *w) { return (uint64_t)w->rank < w->M; }

/* One iteration; rank 0 returns the update time in seconds. */
static double iteration(struct weights *w, int bcast, uint64_t it) {
    uint64_t M = w->M, N = w->N;
    if (is_trainer(w))
        for (uint64_t i = (uint64_t)w->rank; i < w->nt; i += M)
            fill_unit(w->buf + w->off[i], w->len[i], i, it);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = now_s();
    int one = 1;
    if (is_trainer(w)) {
        uint64_t m = (uint64_t)w->rank;
        if (bcast) {
            /* Ibcast: nonblocking collectives never match blocking ones, and
             * the inference ranks post theirs nonblocking. */
            MPI_Request req;
            MPI_Ibcast(w->buf, 1, w->shard[m], 0, w->comm[m], &req);
            MPI_Wait(&req, MPI_STATUS_IGNORE);
        } else {
            for (uint64_t j = 0; j < N; j++) {
                int dst = (int)(M + (m + j) % N);
                for (uint64_t i = m; i < w->nt; i += M)
                    MPI_Put(w->buf + w->off[i], (int)w->len[i], MPI_BYTE, dst,
                            (MPI_Aint)w->off[i], (int)w->len[i], MPI_BYTE, w->win);
                MPI_Win_flush(dst, w->win);
                MPI_Send(&one, 1, MPI_INT, dst, TAG_NOTIFY, MPI_COMM_WORLD);
            }
        }
    } else {
        if (bcast) {
            MPI_Request *req = malloc(M * sizeof *req);
            if (req == NULL) die_all("out of memory (requests)");
            for (uint64_t m = 0; m < M; m++)
                MPI_Ibcast(w->buf, 1, w->shard[m], 0, w->comm[m], &req[m]);
            MPI_Waitall((int)M, req, MPI_STATUSES_IGNORE);
            free(req);
        } else {
            for (uint64_t m = 0; m < M; m++) {
                int x;
                MPI_Recv(&x, 1, MPI_INT, MPI_ANY_SOURCE, TAG_NOTIFY, MPI_COMM_WORLD,
                         MPI_STATUS_IGNORE);
            }
        }
        MPI_Send(&one, 1, MPI_INT, 0, TAG_ACK, MPI_COMM_WORLD);
    }
    double elapsed = 0;
    if (w->rank == 0) {
        for (uint64_t n = 0; n < N; n++) {
            int x;
            MPI_Recv(&x, 1, MPI_INT, MPI_ANY_SOURCE, TAG_ACK, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE);
        }
        elapsed = now_s() - t0;
    }
    /* Untimed: every inference rank checks every byte of every tensor. */
    int bad = 0;
    if (!is_trainer(w)) {
        if (!bcast) MPI_Win_sync(w->win);
        for (uint64_t i = 0; i < w->nt && !bad; i++) {
            long long at = check_unit(w->buf + w->off[i], w->len[i], i, it);
            if (at >= 0) {
                fprintf(stderr,
                        "weights: iteration %llu: tensor %llu (%llu bytes at %llu) differs at "
                        "byte %lld on rank %d\n",
                        (unsigned long long)it, (unsigned long long)i,
                        (unsigned long long)w->len[i], (unsigned long long)w->off[i], at,
                        w->rank);
                bad = 1;
            }
        }
    }
    int any = 0;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (any) die_all("weights: verification failed (stale or misplaced tensor)");
    return elapsed;
}

int weights_main(struct opts *o, const struct run_cfg *c, char *err, size_t errlen) {
    struct weights w;
    memset(&w, 0, sizeof w);
    if (opt_u64(o, "trainers", 2, 1, 256, &w.M, err, errlen) ||
        opt_u64(o, "inference", 4, 1, 256, &w.N, err, errlen) ||
        opt_u64(o, "total-bytes", 256ULL << 20, 4096, 1ULL << 34, &w.S, err, errlen) ||
        opt_u64(o, "seed", 1, 0, UINT64_MAX, &w.seed, err, errlen))
        return 2;
    const char *variants = opt_str(o, "variants", "put,bcast");
    if (opts_all_used(o, err, errlen)) return 2;
    int do_put = 0, do_bcast = 0;
    if (strcmp(variants, "put") == 0)
        do_put = 1;
    else if (strcmp(variants, "bcast") == 0)
        do_bcast = 1;
    else if (strcmp(variants, "put,bcast") == 0 || strcmp(variants, "bcast,put") == 0)
        do_put = do_bcast = 1;
    else {
        snprintf(err, errlen, "--variants takes put, bcast or put,bcast, got `%s`", variants);
        return 2;
    }
    if (w.S % 4096 != 0) {
        snprintf(err, errlen, "--total-bytes must be a multiple of 4096, got %llu",
                 (unsigned long long)w.S);
        return 2;
    }
    int size = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_rank(MPI_COMM_WORLD, &w.rank);
    if ((uint64_t)size != w.M + w.N) {
        snprintf(err, errlen, "weights with %llu trainers and %llu inference ranks needs "
                 "mpirun -np %llu, got %d ranks",
                 (unsigned long long)w.M, (unsigned long long)w.N,
                 (unsigned long long)(w.M + w.N), size);
        return 2;
    }
    if (build_tensors(&w, err, errlen)) return 2;
    uint8_t *base = NULL;
    MPI_Aint win_bytes = is_trainer(&w) ? 0 : (MPI_Aint)w.S;
    MPI_Win_allocate(win_bytes, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &base, &w.win);
    if (is_trainer(&w)) {
        w.buf = malloc(w.S);
        if (w.buf == NULL) die_all("out of memory (trainer buffer)");
        memset(w.buf, 0, w.S);
        MPI_Win_lock_all(MPI_MODE_NOCHECK, w.win);
    } else {
        w.buf = base;
        memset(w.buf, 0, w.S);
        MPI_Win_lock_all(MPI_MODE_NOCHECK, w.win);
    }
    w.comm = calloc(w.M, sizeof *w.comm);
    w.shard = calloc(w.M, sizeof *w.shard);
    if (w.comm == NULL || w.shard == NULL) die_all("out of memory (communicators)");
    if (do_bcast) {
        MPI_Group world;
        MPI_Comm_group(MPI_COMM_WORLD, &world);
        int *ranks = malloc((w.N + 1) * sizeof *ranks);
        int *lens = malloc(w.nt * sizeof *lens);
        MPI_Aint *displs = malloc(w.nt * sizeof *displs);
        if (ranks == NULL || lens == NULL || displs == NULL) die_all("out of memory");
        for (uint64_t m = 0; m < w.M; m++) {
            ranks[0] = (int)m;
            for (uint64_t n = 0; n < w.N; n++) ranks[n + 1] = (int)(w.M + n);
            MPI_Group g;
            MPI_Group_incl(world, (int)w.N + 1, ranks, &g);
            MPI_Comm_create(MPI_COMM_WORLD, g, &w.comm[m]);
            MPI_Group_free(&g);
            int cnt = 0;
            for (uint64_t i = m; i < w.nt; i += w.M) {
                lens[cnt] = (int)w.len[i];
                displs[cnt] = (MPI_Aint)w.off[i];
                cnt++;
            }
            MPI_Type_create_hindexed(cnt, lens, displs, MPI_BYTE, &w.shard[m]);
            MPI_Type_commit(&w.shard[m]);
        }
        MPI_Group_free(&world);
        free(ranks);
        free(lens);
        free(displs);
    }
    /* No bound here: the report divides every engine's update_s by the
     * run's own bound record (memcpy on one host, the shaped link's
     * measured rate on namespace hosts), which this program cannot know. */
    double *t = calloc((size_t)c->repeats, sizeof(double));
    if (t == NULL) die_all("out of memory (samples)");
    double med[2] = {0, 0}, p10[2] = {0, 0}, p90[2] = {0, 0};
    uint64_t it = 0;
    for (int v = 0; v < 2; v++) {
        if ((v == 0 && !do_put) || (v == 1 && !do_bcast)) continue;
        iteration(&w, v, it++);
        for (int i = 0; i < c->repeats; i++) t[i] = iteration(&w, v, it++);
        if (w.rank == 0) stats(t, c->repeats, &med[v], &p10[v], &p90[v]);
    }
    MPI_Win_unlock_all(w.win);
    if (w.rank == 0) {
        char params[256];
        snprintf(params, sizeof params,
                 "{\"trainers\":%llu,\"inference\":%llu,\"total_bytes\":%llu,\"seed\":%llu}",
                 (unsigned long long)w.M, (unsigned long long)w.N, (unsigned long long)w.S,
                 (unsigned long long)w.seed);
        FILE *f = open_out(c);
        for (int v = 0; v < 2; v++) {
            if ((v == 0 && !do_put) || (v == 1 && !do_bcast)) continue;
            char config[1024];
            snprintf(config, sizeof config,
                     v == 0 ? "%s; one-sided: inference copies are MPI_Win_allocate windows, "
                              "trainers lock_all, per inference rank MPI_Put of each owned "
                              "tensor + MPI_Win_flush, then MPI_Send notify; ack MPI_Send"
                            : "%s; MPI_Bcast variant: one broadcast (MPI_Ibcast + wait) per trainer shard (hindexed "
                              "datatype, lands in place) on a {trainer, inference} "
                              "communicator, inference ranks MPI_Ibcast all M; ack MPI_Send",
                     c->mca);
            struct record_ctx rc = {f, "weights", c->transport, config, c->note, c->repeats};
            write_record(&rc, params, "update_s", med[v], "s", &p10[v], &p90[v]);
            printf("openmpi weights %s %s: %.4f s per update\n", c->transport,
                   v == 0 ? "put" : "bcast", med[v]);
        }
        if (fclose(f) != 0) die_all("weights: writing the records failed");
    }
    MPI_Win_free(&w.win);
    return 0;
}
