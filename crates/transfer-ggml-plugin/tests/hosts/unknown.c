// A host whose ggml the plugin does not know: it exports a ggml_version()
// of a release with no mirrored layout (and nothing else of ggml), or, with
// a second argument, a known version but none of the ggml-base functions
// the plugin confirms the layout with. The plugin must answer score 0 and
// NULL from init, without crashing.
// Built with -rdynamic so the plugin's dlsym(RTLD_DEFAULT) finds it.
#include <dlfcn.h>
#include <stdio.h>

static const char * version = "0.99.0";
const char * ggml_version(void) { return version; }

int main(int argc, char ** argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: unknown PLUGIN.so [VERSION]\n");
        return 2;
    }
    if (argc > 2) {
        version = argv[2];
    }
    void * h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 2;
    }
    int (*score)(void) = (int (*)(void))dlsym(h, "ggml_backend_score");
    void * (*init)(void) = (void * (*)(void))dlsym(h, "ggml_backend_init");
    if (!score || !init) {
        fprintf(stderr, "entry points missing\n");
        return 2;
    }
    int s = score();
    void * r1 = init();
    void * r2 = init();
    printf("score %d init %p %p\n", s, r1, r2);
    return (s == 0 && r1 == NULL && r2 == NULL) ? 0 : 1;
}
