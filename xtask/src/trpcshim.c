/*
 * libggml-trpcshim.so: puts one ggml RPC device, for the server named by
 * TRANSFER_RPC_ENDPOINT (host:port), into the registry of an unmodified
 * llama.cpp program that calls ggml_backend_load_all() (test-backend-ops
 * has no --rpc option; it tests every registered device against the CPU).
 *
 * Loaded with GGML_BACKEND_PATH=<this file> (a DL build: GGML_BACKEND_DL=ON).
 * ggml's loader (ggml-backend-reg.cpp, load_backend) calls
 * ggml_backend_score(), skips the library when it returns 0, then calls
 * ggml_backend_init() and checks the returned reg's api_version against its
 * own GGML_BACKEND_API_VERSION. The reg returned here is made by the stock
 * libggml-rpc.so of the same build (ggml_backend_rpc_add_server), so its
 * api_version is that build's: nothing of ggml's ABI is restated here.
 *
 * The stock libggml-rpc.so is found next to the running program (where
 * ggml_backend_load_all() has already loaded it, so dlopen returns that same
 * instance), or at TRANSFER_RPC_GGML_RPC_LIB. It is never closed: the reg
 * and its devices live in it.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef void * (*add_server_fn)(const char * endpoint);

int ggml_backend_score(void) {
    const char * endpoint = getenv("TRANSFER_RPC_ENDPOINT");
    return endpoint != NULL && endpoint[0] != '\0' ? 1 : 0;
}

/* The stock library's path into `out`; 0 on success. */
static int rpc_lib_path(char * out, size_t cap) {
    const char * given = getenv("TRANSFER_RPC_GGML_RPC_LIB");
    if (given != NULL && given[0] != '\0') {
        int n = snprintf(out, cap, "%s", given);
        return n < 0 || (size_t) n >= cap ? -1 : 0;
    }
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (len <= 0) {
        return -1;
    }
    exe[len] = '\0';
    char * slash = strrchr(exe, '/');
    if (slash == NULL) {
        return -1;
    }
    *slash = '\0';
    int n = snprintf(out, cap, "%s/libggml-rpc.so", exe);
    return n < 0 || (size_t) n >= cap ? -1 : 0;
}

void * ggml_backend_init(void) {
    const char * endpoint = getenv("TRANSFER_RPC_ENDPOINT");
    if (endpoint == NULL || endpoint[0] == '\0') {
        fprintf(stderr, "trpcshim: TRANSFER_RPC_ENDPOINT is not set\n");
        return NULL;
    }
    char lib[PATH_MAX];
    if (rpc_lib_path(lib, sizeof(lib)) != 0) {
        fprintf(stderr, "trpcshim: cannot tell where libggml-rpc.so is (set TRANSFER_RPC_GGML_RPC_LIB)\n");
        return NULL;
    }
    void * handle = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (handle == NULL) {
        fprintf(stderr, "trpcshim: dlopen %s: %s\n", lib, dlerror());
        return NULL;
    }
    add_server_fn add_server = (add_server_fn) dlsym(handle, "ggml_backend_rpc_add_server");
    if (add_server == NULL) {
        fprintf(stderr, "trpcshim: %s has no ggml_backend_rpc_add_server\n", lib);
        return NULL;
    }
    void * reg = add_server(endpoint);
    if (reg == NULL) {
        fprintf(stderr, "trpcshim: ggml_backend_rpc_add_server(%s) returned no devices\n", endpoint);
    }
    return reg;
}
