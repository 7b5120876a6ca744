/*
 * A fake libgdrapi.so.2 to go with fake_cuda.c (dry runs only): "device"
 * memory is host memory there, so pinning records the range and mapping
 * returns the same address. Exercises transfer-cuda's GDRCopy path
 * (symbol loading, alignment, pin/map/copy/unmap/unpin) without gdrdrv.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct { unsigned long h; } gdr_mh_t;
struct gdr { int pinned; };

void *gdr_open(void) { return calloc(1, sizeof(struct gdr)); }
int gdr_close(void *g) { free(g); return 0; }
int gdr_pin_buffer(void *g, unsigned long addr, size_t size, uint64_t token, uint32_t va_space,
                   gdr_mh_t *handle) {
    (void)token; (void)va_space;
    if (!g || addr % 65536 || size % 65536 || !size) return 22; /* EINVAL */
    ((struct gdr *)g)->pinned++;
    handle->h = addr;
    return 0;
}
int gdr_unpin_buffer(void *g, gdr_mh_t handle) {
    if (!g || !handle.h) return 22;
    ((struct gdr *)g)->pinned--;
    return 0;
}
int gdr_map(void *g, gdr_mh_t handle, void **va, size_t size) {
    if (!g || !handle.h || size % 65536) return 22;
    *va = (void *)handle.h;
    return 0;
}
int gdr_unmap(void *g, gdr_mh_t handle, void *va, size_t size) {
    (void)size;
    return (!g || (void *)handle.h != va) ? 22 : 0;
}
int gdr_copy_to_mapping(gdr_mh_t handle, void *map_d_ptr, const void *h_ptr, size_t size) {
    (void)handle;
    if (size == 8) __atomic_store_n((uint64_t *)map_d_ptr, *(const uint64_t *)h_ptr, __ATOMIC_SEQ_CST);
    else memcpy(map_d_ptr, h_ptr, size);
    return 0;
}
int gdr_copy_from_mapping(gdr_mh_t handle, void *h_ptr, const void *map_d_ptr, size_t size) {
    (void)handle;
    memcpy(h_ptr, map_d_ptr, size);
    return 0;
}
