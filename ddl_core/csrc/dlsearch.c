/* Finding a shared library at run time: the search both the CUDA runtime (cuda_rt.c) and
 * NCCL (nccl.c) use, so libddl builds and runs without either and one build serves
 * CPU-only login nodes and GPU compute nodes.
 *
 * Order (the first that loads wins):
 *   1. the variable `env` (DDL_CUDA_LIB, DDL_NCCL_LIB): a file, or a directory holding one
 *      of the sonames; when it is set nothing else is tried, so a site can pin a library;
 *   2. a copy already loaded in this process (RTLD_NOLOAD), e.g. the one torch loaded:
 *      two copies of one runtime in one process are best avoided;
 *   3. the pip wheels beside libddl: <libddl's dir>/../nvidia/<subdir> (site-packages
 *      when ddl_core is installed with pip, e.g. nvidia-nccl-cu13's nvidia/nccl/lib);
 *   4. libddl's own directory (a conda environment's lib) and $CONDA_PREFIX/lib;
 *   5. the system: the bare soname through the dynamic loader (LD_LIBRARY_PATH, ld.so.cache).
 * Every attempt and its dlerror() is recorded, so "not found" names what was tried. */
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ddl_internal.h"

static void note(char *tried, size_t n, const char *what, const char *err) {
    size_t len = strlen(tried);
    if (len + 8 >= n) return;
    snprintf(tried + len, n - len, "%s%s%s%s", len ? "; " : "", what, err ? ": " : "",
             err ? err : "");
}

static void *try_open(const char *path, int flags, char *tried, size_t n, char *from,
                      size_t fromlen) {
    dlerror();
    void *h = dlopen(path, flags);
    if (h) {
        snprintf(from, fromlen, "%s", path);
        return h;
    }
    const char *e = dlerror();
    note(tried, n, path, e ? e : "not loaded");
    return NULL;
}

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static void *try_dir(const char *dir, const char *const *sonames, char *tried, size_t n,
                     char *from, size_t fromlen) {
    for (const char *const *s = sonames; *s; s++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, *s);
        struct stat st;
        if (stat(path, &st) != 0) {
            note(tried, n, path, "no such file");
            continue;
        }
        void *h = try_open(path, RTLD_NOW | RTLD_GLOBAL, tried, n, from, fromlen);
        if (h) return h;
    }
    return NULL;
}

/* The directory libddl itself was loaded from (found through an object of its own). */
static const char anchor = 0;
static int libddl_dir(char *out, size_t n) {
    Dl_info info;
    if (!dladdr(&anchor, &info) || !info.dli_fname) return 0;
    snprintf(out, n, "%s", info.dli_fname);
    char *slash = strrchr(out, '/');
    if (!slash) return 0;
    *slash = 0;
    return 1;
}

void *ddl_dl_search(const char *env, const char *const *sonames, const char *const *subdirs,
                    char *tried, size_t n, char *from, size_t fromlen) {
    tried[0] = 0;
    from[0] = 0;
    const char *v = getenv(env);
    if (v && *v) {
        char what[1100];
        snprintf(what, sizeof what, "%s=%s", env, v);
        void *h = is_dir(v) ? try_dir(v, sonames, tried, n, from, fromlen)
                            : try_open(v, RTLD_NOW | RTLD_GLOBAL, tried, n, from, fromlen);
        if (!h) {
            char keep[2048];
            snprintf(keep, sizeof keep, "%s", tried);
            tried[0] = 0;
            note(tried, n, what, keep[0] ? keep : "nothing loadable there");
        }
        return h;
    }
    for (const char *const *s = sonames; *s; s++) {
        dlerror();
        void *h = dlopen(*s, RTLD_NOW | RTLD_NOLOAD | RTLD_GLOBAL);
        if (h) {
            /* Report the file it came from when the loader can tell. */
            struct link_map *lm = NULL;
            if (dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name && lm->l_name[0])
                snprintf(from, fromlen, "%s (already loaded)", lm->l_name);
            else
                snprintf(from, fromlen, "%s (already loaded)", *s);
            return h;
        }
    }
    note(tried, n, "already loaded in this process", "no");
    char dir[1024];
    if (libddl_dir(dir, sizeof dir)) {
        for (const char *const *d = subdirs; *d; d++) {
            char wheel[1200];
            snprintf(wheel, sizeof wheel, "%s/../nvidia/%s", dir, *d);
            if (!is_dir(wheel)) {
                note(tried, n, wheel, "no such directory");
                continue;
            }
            void *h = try_dir(wheel, sonames, tried, n, from, fromlen);
            if (h) return h;
        }
        void *h = try_dir(dir, sonames, tried, n, from, fromlen);
        if (h) return h;
    }
    const char *conda = getenv("CONDA_PREFIX");
    if (conda && *conda) {
        char lib[1100];
        snprintf(lib, sizeof lib, "%s/lib", conda);
        void *h = try_dir(lib, sonames, tried, n, from, fromlen);
        if (h) return h;
    }
    for (const char *const *s = sonames; *s; s++) {
        void *h = try_open(*s, RTLD_NOW | RTLD_GLOBAL, tried, n, from, fromlen);
        if (h) return h;
    }
    return NULL;
}
