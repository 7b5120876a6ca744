/* Shared pieces of the Open MPI baseline of the issue-21 workloads
 * (crates/transfer-bench's WORKLOADS spec): the seeded RNG, the fill
 * pattern and its check, command-line options, timing and the JSON Lines
 * records. Built by `cargo xtask bench --mpi` with mpicc -O2. */
#ifndef TRANSFER_MPI_COMMON_H
#define TRANSFER_MPI_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* splitmix64 (wrapping u64 arithmetic). */
uint64_t sm_next(uint64_t *state);
/* The first output of a fresh splitmix64 whose state is x. */
uint64_t sm_mix(uint64_t x);
/* Shuffle(n, seed) of the spec into out[0..n). */
void sm_shuffle(uint64_t *out, uint64_t n, uint64_t seed);

/* The spec's fill pattern of one unit (tag, iteration). */
void fill_unit(uint8_t *p, size_t n, uint64_t tag, uint64_t it);
/* Index of the first byte that differs from the pattern, or -1. */
long long check_unit(const uint8_t *p, size_t n, uint64_t tag, uint64_t it);

/* Monotonic clock in seconds. */
double now_s(void);
/* Spins for us microseconds (the "compute" of a layer). */
void busy_wait_us(double us);

/* --key value options after the workload name. */
#define MAX_OPTS 32
struct opts {
    int n;
    const char *key[MAX_OPTS];
    const char *val[MAX_OPTS];
    int used[MAX_OPTS];
};
/* 0 on success; on error writes a message into err. */
int opts_parse(struct opts *o, int argc, char **argv, char *err, size_t errlen);
/* Unsigned option (or dflt when absent); 0 ok, -1 bad value (message in err). */
int opt_u64(struct opts *o, const char *key, uint64_t dflt, uint64_t min, uint64_t max,
            uint64_t *out, char *err, size_t errlen);
/* String option (or dflt when absent). */
const char *opt_str(struct opts *o, const char *key, const char *dflt);
/* 0 when every option was consumed; else names the first unknown one in err. */
int opts_all_used(const struct opts *o, char *err, size_t errlen);

/* Median / nearest-rank percentiles of v[0..n) (sorts v). */
void stats(double *v, int n, double *median, double *p10, double *p90);

/* A JSON Lines record per the spec; params is a JSON object text. */
struct record_ctx {
    FILE *f;
    const char *workload, *transport, *config, *note;
    int repeats;
};
void write_record(const struct record_ctx *c, const char *params, const char *metric,
                  double value, const char *unit, const double *p10, const double *p90);

/* Reports an error from rank 0 (every rank calls it), aborts the job. */
void die_all(const char *what);

/* What every workload gets from main. */
struct run_cfg {
    int repeats;           /* timed iterations (after one warm-up) */
    const char *transport; /* label of the record (tcp, shm, ...) */
    const char *mca;       /* the MCA configuration in words (from xtask) */
    const char *note;      /* extra note of every record */
    const char *out;       /* JSON Lines file written by rank 0 */
};

/* Each returns 0, or 2 with a message in err for bad options / world size
 * (every rank returns the same). A byte mismatch aborts the job. */
int kv_main(struct opts *o, const struct run_cfg *c, char *err, size_t errlen);
int weights_main(struct opts *o, const struct run_cfg *c, char *err, size_t errlen);
int moe_main(struct opts *o, const struct run_cfg *c, char *err, size_t errlen);

/* `selftest`: 0 when the RNG and fill / check match the spec. */
int selftest(void);

/* Opens c->out for writing (rank 0), or aborts the job. */
FILE *open_out(const struct run_cfg *c);

#endif
