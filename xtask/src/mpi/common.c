/* RNG, fill pattern, options, timing and records of the MPI workloads. */
#define _POSIX_C_SOURCE 200809L
#include "common.h"

#include <errno.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

uint64_t sm_next(uint64_t *state) {
    *state += 0x9E3779B97F4A7C15ULL;
    uint64_t z = *state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

uint64_t sm_mix(uint64_t x) {
    uint64_t s = x;
    return sm_next(&s);
}

void sm_shuffle(uint64_t *out, uint64_t n, uint64_t seed) {
    uint64_t s = seed;
    for (uint64_t i = 0; i < n; i++) out[i] = i;
    for (uint64_t i = n; i-- > 1;) {
        uint64_t j = sm_next(&s) % (i + 1);
        uint64_t t = out[i];
        out[i] = out[j];
        out[j] = t;
    }
}

/* Byte i >= 8 of a unit is (h + i*131 + (i >> 12)) mod 256 (wrapping u64).
 * Mod 256 that is (h + (i >> 12)) + (i mod 256) * 131: inside a 4096-byte
 * block the bytes repeat one 256-byte row, so fill copies the row and the
 * check compares against it (byte by byte both ran at ~0.3-0.4 GB/s here,
 * which made the fill and check of 256 MiB units take seconds). */
static void block_row(uint8_t row[256], uint64_t h, uint64_t block) {
    uint8_t base = (uint8_t)(h + block);
    for (unsigned j = 0; j < 256; j++) row[j] = (uint8_t)(base + (uint8_t)(j * 131u));
}

void fill_unit(uint8_t *p, size_t n, uint64_t tag, uint64_t it) {
    uint64_t h = sm_mix(tag ^ (it << 48));
    uint8_t row[256];
    for (size_t b = 0; b < n; b += 4096) {
        block_row(row, h, b >> 12);
        size_t e = n - b < 4096 ? n : b + 4096;
        for (size_t o = b; o < e; o += 256) memcpy(p + o, row, e - o < 256 ? e - o : 256);
    }
    size_t head = n < 8 ? n : 8;
    for (size_t i = 0; i < head; i++) p[i] = (uint8_t)(h >> (8 * i));
}

long long check_unit(const uint8_t *p, size_t n, uint64_t tag, uint64_t it) {
    uint64_t h = sm_mix(tag ^ (it << 48));
    size_t head = n < 8 ? n : 8;
    for (size_t i = 0; i < head; i++)
        if (p[i] != (uint8_t)(h >> (8 * i))) return (long long)i;
    uint8_t row[256];
    for (size_t b = 0; b < n; b += 4096) {
        block_row(row, h, b >> 12);
        size_t e = n - b < 4096 ? n : b + 4096;
        for (size_t o = b < 8 ? 8 : b; o < e;) {
            size_t r = o & 255, len = e - o < 256 - r ? e - o : 256 - r;
            if (memcmp(p + o, row + r, len) != 0)
                for (size_t i = o; i < o + len; i++)
                    if (p[i] != row[i & 255]) return (long long)i;
            o += len;
        }
    }
    return -1;
}

double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void busy_wait_us(double us) {
    double end = now_s() + us * 1e-6;
    while (now_s() < end) {
    }
}

int opts_parse(struct opts *o, int argc, char **argv, char *err, size_t errlen) {
    memset(o, 0, sizeof *o);
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2) != 0 || a[2] == '\0') {
            snprintf(err, errlen, "expected --key value, got `%s`", a);
            return -1;
        }
        if (i + 1 >= argc) {
            snprintf(err, errlen, "%s needs a value", a);
            return -1;
        }
        if (o->n == MAX_OPTS) {
            snprintf(err, errlen, "more than %d options", MAX_OPTS);
            return -1;
        }
        for (int k = 0; k < o->n; k++)
            if (strcmp(o->key[k], a + 2) == 0) {
                snprintf(err, errlen, "%s given twice", a);
                return -1;
            }
        o->key[o->n] = a + 2;
        o->val[o->n] = argv[++i];
        o->n++;
    }
    return 0;
}

static int find(struct opts *o, const char *key) {
    for (int k = 0; k < o->n; k++)
        if (strcmp(o->key[k], key) == 0) {
            o->used[k] = 1;
            return k;
        }
    return -1;
}

int opt_u64(struct opts *o, const char *key, uint64_t dflt, uint64_t min, uint64_t max,
            uint64_t *out, char *err, size_t errlen) {
    int k = find(o, key);
    if (k < 0) {
        *out = dflt;
        return 0;
    }
    const char *v = o->val[k];
    char *end = NULL;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno != 0 || end == v || *end != '\0' || v[0] == '-' || x < min || x > max) {
        snprintf(err, errlen, "--%s takes a whole number in %llu..%llu, got `%s`", key,
                 (unsigned long long)min, (unsigned long long)max, v);
        return -1;
    }
    *out = x;
    return 0;
}

const char *opt_str(struct opts *o, const char *key, const char *dflt) {
    int k = find(o, key);
    return k < 0 ? dflt : o->val[k];
}

int opts_all_used(const struct opts *o, char *err, size_t errlen) {
    for (int k = 0; k < o->n; k++)
        if (!o->used[k]) {
            snprintf(err, errlen, "unknown option --%s", o->key[k]);
            return -1;
        }
    return 0;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void stats(double *v, int n, double *median, double *p10, double *p90) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    *median = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    /* nearest rank on [0, n-1] */
    *p10 = v[(int)(0.1 * (n - 1) + 0.5)];
    *p90 = v[(int)(0.9 * (n - 1) + 0.5)];
}

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

static void json_num(FILE *f, const double *v) {
    if (v == NULL)
        fputs("null", f);
    else
        fprintf(f, "%.9g", *v);
}

void write_record(const struct record_ctx *c, const char *params, const char *metric,
                  double value, const char *unit, const double *p10, const double *p90) {
    fputs("{\"workload\":", c->f);
    json_str(c->f, c->workload);
    fputs(",\"engine\":\"openmpi\",\"transport\":", c->f);
    json_str(c->f, c->transport);
    fputs(",\"config\":", c->f);
    json_str(c->f, c->config);
    fprintf(c->f, ",\"params\":%s,\"metric\":", params);
    json_str(c->f, metric);
    fputs(",\"value\":", c->f);
    json_num(c->f, &value);
    fputs(",\"unit\":", c->f);
    json_str(c->f, unit);
    fputs(",\"p10\":", c->f);
    json_num(c->f, p10);
    fputs(",\"p90\":", c->f);
    json_num(c->f, p90);
    fprintf(c->f, ",\"repeats\":%d,\"verified\":true,\"note\":", c->repeats);
    json_str(c->f, c->note);
    fputs("}\n", c->f);
}

void die_all(const char *what) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    fprintf(stderr, "transfer-mpi-workloads: rank %d: %s\n", rank, what);
    MPI_Abort(MPI_COMM_WORLD, 3);
    exit(3);
}

FILE *open_out(const struct run_cfg *c) {
    FILE *f = fopen(c->out, "w");
    if (f == NULL) {
        char msg[600];
        snprintf(msg, sizeof msg, "cannot write %s: %s", c->out, strerror(errno));
        die_all(msg);
    }
    return f;
}
