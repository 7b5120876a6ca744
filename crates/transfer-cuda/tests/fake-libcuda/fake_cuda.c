/*
 * A fake libcuda.so.1 for dry runs of transfer-cuda's GPU checks on a
 * machine without a GPU (crates/transfer-cuda/gpu-check.sh fake).
 *
 * A test double, not an emulator of CUDA: one "device" whose memory is host
 * memory (device pointer == host pointer), and the six kernels of
 * src/kernels.ptx re-implemented in C, run on the CPU (the polling ones on
 * a thread). It checks the Rust side: symbol resolution, error handling,
 * argument marshalling of cuLaunchKernel, lifetimes and test logic. It says
 * nothing about real GPU behaviour or latency.
 *
 * Set FAKE_CUDA_NO_DEVICE=1 to make cuInit fail with CUDA_ERROR_NO_DEVICE.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

enum { K_ADD = 1, K_SET, K_BUMP_EACH, K_PINGPONG, K_FLAG_WAIT, K_FILL };
static const char *NAMES[] = {
    "", "transfer_slot_add", "transfer_slot_set", "transfer_slots_bump_each",
    "transfer_slot_pingpong", "transfer_flag_wait", "transfer_fill_u32",
};
static int running;

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

CUresult cuInit(unsigned flags) {
    (void)flags;
    return getenv("FAKE_CUDA_NO_DEVICE") ? 100 : 0;
}
CUresult cuDriverGetVersion(int *v) { *v = 12080; return 0; }
CUresult cuGetErrorName(CUresult e, const char **s) {
    switch (e) {
    case 0: *s = "CUDA_SUCCESS"; return 0;
    case 1: *s = "CUDA_ERROR_INVALID_VALUE"; return 0;
    case 100: *s = "CUDA_ERROR_NO_DEVICE"; return 0;
    case 101: *s = "CUDA_ERROR_INVALID_DEVICE"; return 0;
    case 500: *s = "CUDA_ERROR_NOT_FOUND"; return 0;
    default: *s = 0; return 1;
    }
}
CUresult cuDeviceGetCount(int *n) { *n = 1; return 0; }
CUresult cuDeviceGet(int *d, int ordinal) {
    if (ordinal != 0) return 101;
    *d = 0;
    return 0;
}
CUresult cuDeviceGetAttribute(int *v, int attr, int dev) {
    (void)dev;
    switch (attr) {
    case 19: case 41: case 93: case 116: case 124: *v = 1; break;
    case 75: *v = 9; break;
    default: *v = 0;
    }
    return 0;
}
CUresult cuDeviceGetName(char *name, int len, int dev) {
    (void)dev;
    snprintf(name, (size_t)len, "fake CUDA device (host emulation, not a GPU)");
    return 0;
}
CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev) { (void)dev; *ctx = (void *)0x1; return 0; }
CUresult cuDevicePrimaryCtxRelease_v2(int dev) { (void)dev; return 0; }
CUresult cuCtxSetCurrent(void *ctx) { return ctx ? 0 : 1; }
CUresult cuCtxSynchronize(void) {
    while (__atomic_load_n(&running, __ATOMIC_ACQUIRE)) usleep(100);
    return 0;
}
CUresult cuMemHostAlloc(void **p, size_t n, unsigned flags) {
    (void)flags;
    return posix_memalign(p, 4096, n) ? 2 : 0;
}
CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *d, void *p, unsigned flags) {
    if (flags) return 1;
    *d = (CUdeviceptr)(uintptr_t)p;
    return 0;
}
CUresult cuMemFreeHost(void *p) { free(p); return 0; }
CUresult cuMemAlloc_v2(CUdeviceptr *d, size_t n) {
    void *p;
    if (posix_memalign(&p, 1 << 21, n)) return 2;
    *d = (CUdeviceptr)(uintptr_t)p;
    return 0;
}
CUresult cuMemFree_v2(CUdeviceptr d) { free((void *)(uintptr_t)d); return 0; }
CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) {
    memset((void *)(uintptr_t)d, v, n);
    return 0;
}
CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *s, size_t n) {
    memcpy((void *)(uintptr_t)d, s, n);
    return 0;
}
CUresult cuMemcpyDtoH_v2(void *d, CUdeviceptr s, size_t n) {
    memcpy(d, (const void *)(uintptr_t)s, n);
    return 0;
}
CUresult cuPointerSetAttribute(const void *v, int attr, CUdeviceptr p) {
    (void)v; (void)attr; (void)p;
    return 0;
}
CUresult cuModuleLoadData(void **m, const void *image) {
    for (int k = 1; k <= K_FILL; k++) {
        char entry[128];
        snprintf(entry, sizeof entry, ".visible .entry %s(", NAMES[k]);
        if (!strstr((const char *)image, entry)) return 218; /* INVALID_PTX */
    }
    *m = (void *)0x2;
    return 0;
}
CUresult cuModuleGetFunction(void **f, void *m, const char *name) {
    (void)m;
    for (intptr_t k = 1; k <= K_FILL; k++)
        if (!strcmp(name, NAMES[k])) { *f = (void *)k; return 0; }
    return 500;
}
CUresult cuModuleUnload(void *m) { (void)m; return 0; }

struct poll_args { uint64_t a, b, c, d; int kind; };

static void *poller(void *p) {
    struct poll_args *x = p;
    volatile uint64_t *go = (uint64_t *)(uintptr_t)x->a;
    if (x->kind == K_PINGPONG) {
        uint64_t *slot = (uint64_t *)(uintptr_t)x->b;
        for (uint64_t i = 1; i <= x->c; i++) {
            uint64_t t0 = now_ns();
            while (__atomic_load_n(go, __ATOMIC_ACQUIRE) < i) {
                if (now_ns() - t0 > x->d) {
                    __atomic_store_n(slot, UINT64_MAX, __ATOMIC_RELEASE);
                    goto out;
                }
            }
            __atomic_store_n(slot, i, __ATOMIC_RELEASE);
        }
    } else {
        uint64_t *outp = (uint64_t *)(uintptr_t)x->c;
        uint64_t t0 = now_ns(), r = 2;
        while (now_ns() - t0 <= x->d)
            if (__atomic_load_n(go, __ATOMIC_ACQUIRE) == x->b) { r = 1; break; }
        __atomic_store_n(outp, r, __ATOMIC_RELEASE);
    }
out:
    free(x);
    __atomic_fetch_sub(&running, 1, __ATOMIC_ACQ_REL);
    return 0;
}

#define P64(i) (*(uint64_t *)params[i])
#define P32(i) (*(uint32_t *)params[i])

CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned shm, void *stream,
                        void **params, void **extra) {
    (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shm; (void)stream;
    if (extra || !params) return 1;
    switch ((intptr_t)f) {
    case K_ADD:
        __atomic_fetch_add((uint64_t *)(uintptr_t)P64(0), P64(1), __ATOMIC_SEQ_CST);
        return 0;
    case K_SET:
        __atomic_store_n((uint64_t *)(uintptr_t)P64(0), P64(1), __ATOMIC_SEQ_CST);
        return 0;
    case K_BUMP_EACH: {
        uint64_t *base = (uint64_t *)(uintptr_t)P64(0);
        uint32_t count = P32(1), rounds = P32(2);
        for (uint32_t r = 0; r < rounds; r++)
            for (uint32_t i = 0; i < count; i++)
                __atomic_fetch_add(&base[i], 1, __ATOMIC_SEQ_CST);
        return 0;
    }
    case K_FILL: {
        uint32_t *w = (uint32_t *)(uintptr_t)P64(0);
        uint32_t count = P32(1), value = P32(2);
        for (uint32_t i = 0; i < count; i++) w[i] = value + i;
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        return 0;
    }
    case K_PINGPONG:
    case K_FLAG_WAIT: {
        struct poll_args *x = malloc(sizeof *x);
        pthread_t t;
        if (!x) return 2;
        *x = (struct poll_args){P64(0), P64(1), P64(2), P64(3), (int)(intptr_t)f};
        __atomic_fetch_add(&running, 1, __ATOMIC_ACQ_REL);
        if (pthread_create(&t, 0, poller, x)) { free(x); return 2; }
        pthread_detach(t);
        return 0;
    }
    default:
        return 400; /* INVALID_HANDLE */
    }
}
CUresult cuStreamCreate(void **s, unsigned flags) {
    (void)flags;
    *s = malloc(1);
    return *s ? 0 : 2;
}
CUresult cuStreamDestroy_v2(void *s) { free(s); return 0; }
CUresult cuStreamSynchronize(void *s) { (void)s; return cuCtxSynchronize(); }
CUresult cuMemGetHandleForAddressRange(void *h, CUdeviceptr d, size_t n, int type,
                                       unsigned long long flags) {
    (void)d; (void)n;
    if (type != 1 || flags) return 1;
    int fd = memfd_create("fake-dmabuf", 0);
    if (fd < 0) return 1;
    *(int *)h = fd;
    return 0;
}
CUresult cuStreamWriteValue64_v2(void *s, CUdeviceptr addr, uint64_t v, unsigned flags) {
    (void)s; (void)flags;
    __atomic_store_n((uint64_t *)(uintptr_t)addr, v, __ATOMIC_SEQ_CST);
    return 0;
}
