/* The C API's in-place gather and scatter at the root (DDL_IN_PLACE, as MPI_IN_PLACE):
 * gather's root block already sits in recvbuf, scatter's stays in sendbuf; the other
 * blocks still move, and DDL_IN_PLACE off the root is an error. Counts: argv[1..]. */
#include <ddl.h>
#include <stdio.h>
#include <stdlib.h>

static int fails;

static void expect(int ok, const char *what, size_t count, int root) {
    if (!ok) {
        fprintf(stderr, "FAILED %s (count %zu, root %d)\n", what, count, root);
        fails++;
    }
}

static double value(int rank, size_t i) { return (double)rank * 1000003.0 + (double)i; }

int main(int argc, char **argv) {
    if (ddl_init() != DDL_SUCCESS) {
        fprintf(stderr, "ddl_init: %s\n", ddl_last_error());
        return 1;
    }
    int me = 0, n = 0;
    ddl_comm_t world;
    ddl_rank(&me);
    ddl_size(&n);
    ddl_comm_world(&world);
    for (int a = 1; a < argc; a++) {
        size_t count = strtoull(argv[a], NULL, 10);
        double *all = malloc(sizeof(double) * count * (size_t)n);
        double *mine = malloc(sizeof(double) * count);
        for (int root = 0; root < n; root++) {
            /* gather: the root's block is put in place beforehand */
            for (size_t i = 0; i < count; i++) mine[i] = value(me, i);
            for (size_t i = 0; i < count * (size_t)n; i++) all[i] = -1.0;
            if (me == root)
                for (size_t i = 0; i < count; i++) all[(size_t)root * count + i] = value(root, i);
            ddl_status_t st = ddl_comm_gather(world, me == root ? DDL_IN_PLACE : mine,
                                              me == root ? all : NULL, count, DDL_FLOAT64, root);
            expect(st == DDL_SUCCESS, ddl_last_error(), count, root);
            int ok = 1;
            for (int q = 0; me == root && q < n; q++)
                for (size_t i = 0; i < count; i++) ok &= all[(size_t)q * count + i] == value(q, i);
            expect(ok, "gather in place", count, root);
            /* scatter: the root keeps its block in sendbuf */
            for (size_t i = 0; i < count * (size_t)n; i++) all[i] = value((int)(i / count), i % count);
            for (size_t i = 0; i < count; i++) mine[i] = -1.0;
            st = ddl_comm_scatter(world, me == root ? all : NULL,
                                  me == root ? (void *)DDL_IN_PLACE : mine, count, DDL_FLOAT64,
                                  root);
            expect(st == DDL_SUCCESS, ddl_last_error(), count, root);
            ok = 1;
            for (size_t i = 0; i < count; i++)
                ok &= me == root ? all[(size_t)root * count + i] == value(root, i)
                                 : mine[i] == value(me, i);
            expect(ok, "scatter in place", count, root);
        }
        free(all);
        free(mine);
    }
    /* off the root: a local error before anything moves (so rank 1 alone may call it) */
    if (n > 1 && me == 1)
        expect(ddl_comm_gather(world, DDL_IN_PLACE, NULL, 1, DDL_FLOAT64, 0) ==
                   DDL_ERR_INVALID_ARG,
               "DDL_IN_PLACE off the root accepted", 1, 0);
    ddl_finalize();
    if (!fails) printf("OK rooted-in-place\n");
    return fails != 0;
}
