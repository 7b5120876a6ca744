/* `transfer-mpi-workloads selftest`: the RNG against splitmix64's published
 * first outputs, and the fast fill / check against the spec's byte formula
 * (sizes around the 8-byte head, the 256-byte row and the 4096-byte block),
 * a flipped byte found at its index, a stale iteration refused. Prints the
 * values other engines of the spec can compare with. No MPI needed. */
#include <stdlib.h>
#include <string.h>

#include "common.h"

/* The spec's pattern, byte by byte. */
static void reference(uint8_t *p, size_t n, uint64_t tag, uint64_t it) {
    uint64_t h = sm_mix(tag ^ (it << 48));
    for (size_t i = 0; i < n; i++)
        p[i] = i < 8 ? (uint8_t)(h >> (8 * i)) : (uint8_t)(h + i * 131u + (i >> 12));
}

int selftest(void) {
    /* splitmix64 from state 0: the reference implementation's first outputs. */
    uint64_t s = 0;
    const uint64_t want[3] = {0xE220A8397B1DCDAFULL, 0x6E789E6AA1B965F4ULL,
                              0x06C45D188009454FULL};
    for (int i = 0; i < 3; i++)
        if (sm_next(&s) != want[i]) {
            fprintf(stderr, "selftest: splitmix64 output %d differs\n", i);
            return 1;
        }
    const size_t sizes[] = {1, 7, 8, 9, 255, 256, 257, 4095, 4096, 4097, 9000, 65536, 1 << 20};
    uint8_t *a = malloc(1 << 20), *b = malloc(1 << 20);
    if (a == NULL || b == NULL) return 1;
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        size_t n = sizes[k];
        uint64_t tag = (3ULL << 40) | (5ULL << 20) | n;
        reference(a, n, tag, 9);
        fill_unit(b, n, tag, 9);
        if (memcmp(a, b, n) != 0 || check_unit(a, n, tag, 9) != -1) {
            fprintf(stderr, "selftest: fill/check differ from the formula at %zu bytes\n", n);
            return 1;
        }
        for (size_t j = 0; j < n; j += n / 7 + 1) {
            a[j] ^= 0x10;
            long long at = check_unit(a, n, tag, 9);
            a[j] ^= 0x10;
            if (at != (long long)j) {
                fprintf(stderr, "selftest: byte %zu of %zu flipped, found %lld\n", j, n, at);
                return 1;
            }
        }
        if (check_unit(a, n, tag, 10) == -1) {
            fprintf(stderr, "selftest: a stale iteration passed at %zu bytes\n", n);
            return 1;
        }
    }
    uint64_t perm[8];
    sm_shuffle(perm, 8, 1);
    printf("selftest ok: mix(0)=%016llx shuffle(8,1)=", (unsigned long long)sm_mix(0));
    for (int i = 0; i < 8; i++) printf("%s%llu", i ? "," : "", (unsigned long long)perm[i]);
    fill_unit(b, 16, 1, 0);
    printf(" fill(tag 1, it 0)[0..16]=");
    for (int i = 0; i < 16; i++) printf("%02x", b[i]);
    printf("\n");
    free(a);
    free(b);
    return 0;
}
