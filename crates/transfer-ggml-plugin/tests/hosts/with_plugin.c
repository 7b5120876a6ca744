// Runs an unmodified llama.cpp example (compiled with -Dmain=example_main)
// after loading the plugin named by TRANSFER_PLUGIN with ggml_backend_load:
// for statically linked hosts, whose llama_backend_init never reads
// GGML_BACKEND_PATH (their registry is not empty).
#include <stdio.h>
#include <stdlib.h>

#include "ggml-backend.h"

int example_main(int argc, char ** argv);

int main(int argc, char ** argv) {
    const char * plugin = getenv("TRANSFER_PLUGIN");
    if (plugin && !ggml_backend_load(plugin)) {
        fprintf(stderr, "with_plugin: %s refused this host\n", plugin);
        return 3;
    }
    return example_main(argc, argv);
}
