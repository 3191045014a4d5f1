/* 1-rank smoke test of libddl: init, allreduce (sum of ones = size), finalize.
 * Run natively, or for a cross build under qemu-user with the target sysroot. */
#include <stdio.h>
#include <ddl.h>

int main(void) {
    float x[8], y[8];
    int size = 0;
    for (int i = 0; i < 8; i++) x[i] = 1.0f;
    if (ddl_init() != DDL_SUCCESS) { fprintf(stderr, "ddl_init failed\n"); return 1; }
    if (ddl_size(&size) != DDL_SUCCESS) return 2;
    if (ddl_allreduce(x, y, 8, DDL_FLOAT32, DDL_SUM) != DDL_SUCCESS) return 3;
    for (int i = 0; i < 8; i++) {
        if (y[i] != (float)size) { fprintf(stderr, "y[%d]=%g, expected %d\n", i, y[i], size); return 4; }
    }
    ddl_finalize();
    printf("libddl allreduce ok (size %d)\n", size);
    return 0;
}
