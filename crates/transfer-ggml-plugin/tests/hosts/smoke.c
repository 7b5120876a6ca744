// A minimal ggml host for the plugin's tests: loads the plugin with
// ggml_backend_load (as GGML_BACKEND_PATH does), computes a small graph
// (MUL_MAT, UNARY silu, GLU swiglu, ADD, a view) on every plugin device and
// compares it with the same arithmetic done here in C.
// Usage: smoke PLUGIN.so            -> "OK <version> <n devices>" or exit != 0
//        smoke PLUGIN.so --refuse   -> expects the plugin to refuse this host
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"

#define K 64
#define M 32
#define N 8

static float silu(float x) { return x / (1.0f + expf(-x)); }

int main(int argc, char ** argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: smoke PLUGIN.so [--refuse]\n");
        return 2;
    }
    int refuse = argc > 2 && strcmp(argv[2], "--refuse") == 0;
    ggml_backend_reg_t reg = ggml_backend_load(argv[1]);
    if (refuse) {
        printf(reg ? "LOADED\n" : "REFUSED\n");
        return reg ? 1 : 0;
    }
    if (!reg) {
        fprintf(stderr, "smoke: the plugin refused ggml %s\n", ggml_version());
        return 3;
    }
    size_t n_dev = ggml_backend_reg_dev_count(reg);
    if (n_dev == 0) {
        fprintf(stderr, "smoke: no devices\n");
        return 4;
    }
    // Loading again (as every ggml_backend_load_all does) gives the same
    // registry and devices: init and score have no side effects.
    size_t n_reg = ggml_backend_reg_count();
    ggml_backend_dev_t first = ggml_backend_reg_dev_get(reg, 0);
    if (ggml_backend_load(argv[1]) != reg || ggml_backend_reg_count() != n_reg ||
        ggml_backend_reg_dev_count(reg) != n_dev || ggml_backend_reg_dev_get(reg, 0) != first) {
        fprintf(stderr, "smoke: a second load gave other pointers\n");
        return 9;
    }
    float a[M * K], b[N * K], ref[N * M];
    for (int i = 0; i < M * K; i++) a[i] = sinf(0.37f * i) * 0.2f;
    for (int i = 0; i < N * K; i++) b[i] = cosf(0.11f * i) * 0.3f;
    for (int j = 0; j < N; j++) {
        for (int i = 0; i < M; i++) {
            float s = 0;
            for (int k = 0; k < K; k++) s += a[i * K + k] * b[j * K + k];
            ref[j * M + i] = s;
        }
    }
    for (size_t d = 0; d < n_dev; d++) {
        ggml_backend_dev_t dev = ggml_backend_reg_dev_get(reg, d);
        ggml_backend_t be = ggml_backend_dev_init(dev, NULL);
        if (!be) {
            fprintf(stderr, "smoke: init of %s failed\n", ggml_backend_dev_name(dev));
            return 5;
        }
        struct ggml_init_params p = {16 * ggml_tensor_overhead() + ggml_graph_overhead(), NULL, true};
        struct ggml_context * ctx = ggml_init(p);
        struct ggml_tensor * ta = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, K, M);
        struct ggml_tensor * tb = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, K, N);
        ggml_set_input(ta);
        ggml_set_input(tb);
        struct ggml_tensor * c = ggml_mul_mat(ctx, ta, tb);                  // [M, N]
        struct ggml_tensor * s = ggml_silu(ctx, c);                          // UNARY
        struct ggml_tensor * half = ggml_view_2d(ctx, c, M / 2, N, c->nb[1], 0);
        struct ggml_tensor * other = ggml_view_2d(ctx, c, M / 2, N, c->nb[1], (M / 2) * sizeof(float));
        struct ggml_tensor * g = ggml_swiglu_split(ctx, half, other);        // GLU
        struct ggml_tensor * out = ggml_add(ctx, s, s);
        ggml_set_output(out);
        ggml_set_output(g);
        struct ggml_cgraph * gf = ggml_new_graph(ctx);
        ggml_build_forward_expand(gf, out);
        ggml_build_forward_expand(gf, g);
        ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, be);
        if (!buf) {
            fprintf(stderr, "smoke: allocation on %s failed\n", ggml_backend_dev_name(dev));
            return 6;
        }
        ggml_backend_tensor_set(ta, a, 0, sizeof(a));
        ggml_backend_tensor_set(tb, b, 0, sizeof(b));
        if (ggml_backend_graph_compute(be, gf) != GGML_STATUS_SUCCESS) {
            fprintf(stderr, "smoke: compute on %s failed\n", ggml_backend_dev_name(dev));
            return 7;
        }
        float got[N * M], got_g[N * M / 2];
        ggml_backend_tensor_get(out, got, 0, sizeof(got));
        ggml_backend_tensor_get(g, got_g, 0, sizeof(got_g));
        float worst = 0;
        for (int j = 0; j < N; j++) {
            for (int i = 0; i < M; i++) {
                float want = 2 * silu(ref[j * M + i]);
                worst = fmaxf(worst, fabsf(want - got[j * M + i]));
            }
            for (int i = 0; i < M / 2; i++) {
                float want = silu(ref[j * M + i]) * ref[j * M + M / 2 + i];
                worst = fmaxf(worst, fabsf(want - got_g[j * (M / 2) + i]));
            }
        }
        printf("device %s: max |diff| %g\n", ggml_backend_dev_name(dev), worst);
        if (!(worst < 1e-4f)) {
            return 8;
        }
        ggml_backend_buffer_free(buf);
        ggml_free(ctx);
        ggml_backend_free(be);
    }
    printf("OK %s %zu\n", ggml_version(), n_dev);
    return 0;
}
