/*
 * metafs: a read-only FUSE passthrough that emulates a shared filesystem's metadata server.
 *
 * The physical property emulated: on a parallel or network filesystem (Lustre, GPFS, NFS)
 * every file lookup (including the misses of a search along sys.path), attribute fetch,
 * open, directory read and symlink read is a round trip to one metadata server, and a
 * loaded server answers them one after another. A Python job's start-up is made of such
 * requests (every rank looks up every module along every search path), so it costs
 * requests x latency summed over all ranks of all nodes, because they queue at the one
 * server. Here those requests (lookup, getattr, open, opendir, readdir, readlink) are
 * served by ONE server (a mutex held for the whole request) after a fixed latency (default
 * 500 us, a loaded metadata server), and counted. What a client may cache: the names of
 * directories and their attributes (the kernel keeps them --dir-timeout-s seconds, default
 * 60, as NFS and Lustre clients keep the directories along a path), never the answer for
 * a file or a missing name, nor a file's attributes: each stat, open or failed lookup of
 * a file by any process is a request (about one per metadata system call, which is how
 * `import torch` was measured: ~15,000 per rank). File data
 * (read) passes through concurrently without added latency, and the kernel may cache it:
 * bandwidth is not what is emulated.
 *
 *   metafs [--latency-us N] [--dir-timeout-s T] SOURCE MOUNTPOINT [FUSE options, e.g. -f]
 *
 * SOURCE is exposed read-only at MOUNTPOINT. The counts are in the file
 * MOUNTPOINT/.metafs-stats (served without latency, not counted, not listed): one
 * "name value" per line, for lookup, getattr, open, opendir, readdir, readlink, read,
 * metadata (the sum of the metadata ones) and latency_us. Counts only grow: take
 * differences. Unmount with fusermount3 -u MOUNTPOINT (or umount as root).
 */
#define FUSE_USE_VERSION 31
#define _GNU_SOURCE

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#define STATS_NAME ".metafs-stats"
#define NBUCKETS 65536u

enum { C_LOOKUP, C_GETATTR, C_OPEN, C_OPENDIR, C_READDIR, C_READLINK, C_READ, C_N };
static const char *const count_names[C_N] = {"lookup",  "getattr",  "open", "opendir",
                                             "readdir", "readlink", "read"};

/* A file of SOURCE the kernel knows: an O_PATH descriptor, found again by (dev, ino). */
struct node {
    int fd;
    dev_t dev;
    ino_t ino;
    uint64_t nlookup;
    int is_stats;
    struct node *next;
};

struct dir {
    DIR *dp;
    off_t offset;
    struct dirent *entry;
};

static struct {
    long latency_us;
    double dir_timeout_s;
    pthread_mutex_t server; /* the one metadata server: held for each whole request */
    pthread_mutex_t table;  /* the node table */
    struct node root, stats;
    struct node *buckets[NBUCKETS];
    atomic_uint_fast64_t counts[C_N];
} g = {.latency_us = 500,
       .dir_timeout_s = 60.0,
       .server = PTHREAD_MUTEX_INITIALIZER,
       .table = PTHREAD_MUTEX_INITIALIZER};

static void lock(pthread_mutex_t *m) {
    if (pthread_mutex_lock(m) != 0) abort(); /* only fails on a broken mutex */
}

static void unlock(pthread_mutex_t *m) {
    if (pthread_mutex_unlock(m) != 0) abort();
}

/* Serve one metadata request: wait for the server, then its latency (unlock after). */
static void serve_begin(int kind) {
    lock(&g.server);
    atomic_fetch_add(&g.counts[kind], 1);
    struct timespec ts = {.tv_sec = g.latency_us / 1000000,
                          .tv_nsec = (g.latency_us % 1000000) * 1000};
    while (g.latency_us > 0 && nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static struct node *node_of(fuse_ino_t ino) {
    return ino == FUSE_ROOT_ID ? &g.root : (struct node *)(uintptr_t)ino;
}

static int stats_text(char *buf, size_t size) {
    size_t used = 0;
    uint64_t meta = 0;
    for (int i = 0; i < C_N; i++) {
        uint64_t v = atomic_load(&g.counts[i]);
        if (i != C_READ) meta += v;
        int n = snprintf(buf + used, size - used, "%s %" PRIu64 "\n", count_names[i], v);
        if (n < 0 || (size_t)n >= size - used) return -EOVERFLOW;
        used += (size_t)n;
    }
    int n = snprintf(buf + used, size - used, "metadata %" PRIu64 "\nlatency_us %ld\n", meta,
                     g.latency_us);
    if (n < 0 || (size_t)n >= size - used) return -EOVERFLOW;
    return (int)(used + (size_t)n);
}

static void stats_attr(struct stat *st) {
    char text[1024];
    int n = stats_text(text, sizeof text);
    memset(st, 0, sizeof *st);
    st->st_ino = 1u << 30;
    st->st_mode = S_IFREG | 0444;
    st->st_nlink = 1;
    st->st_size = n > 0 ? n : 0;
}

/* The node for (st_dev, st_ino), made from fd if new (fd is then kept, else closed). */
static struct node *remember(int fd, const struct stat *st) {
    size_t b = (size_t)((st->st_ino ^ (st->st_dev << 7)) % NBUCKETS);
    lock(&g.table);
    struct node *n = g.buckets[b];
    while (n && !(n->dev == st->st_dev && n->ino == st->st_ino)) n = n->next;
    if (n) {
        n->nlookup++;
        unlock(&g.table);
        if (close(fd) != 0) { /* an O_PATH descriptor: nothing to flush */
        }
        return n;
    }
    n = calloc(1, sizeof *n);
    if (n) {
        *n = (struct node){.fd = fd, .dev = st->st_dev, .ino = st->st_ino, .nlookup = 1,
                           .next = g.buckets[b]};
        g.buckets[b] = n;
    }
    unlock(&g.table);
    return n;
}

static void forget_one(fuse_ino_t ino, uint64_t nlookup) {
    struct node *n = node_of(ino);
    if (n == &g.root || n == &g.stats) return;
    size_t b = (size_t)((n->ino ^ (n->dev << 7)) % NBUCKETS);
    lock(&g.table);
    n->nlookup = n->nlookup > nlookup ? n->nlookup - nlookup : 0;
    if (n->nlookup == 0) {
        struct node **p = &g.buckets[b];
        while (*p && *p != n) p = &(*p)->next;
        if (*p) *p = n->next;
        if (close(n->fd) != 0) {
        }
        free(n);
    }
    unlock(&g.table);
}

static void mfs_lookup(fuse_req_t req, fuse_ino_t parent, const char *name) {
    struct fuse_entry_param e;
    memset(&e, 0, sizeof e);
    if (parent == FUSE_ROOT_ID && strcmp(name, STATS_NAME) == 0) {
        e.ino = (fuse_ino_t)(uintptr_t)&g.stats;
        stats_attr(&e.attr);
        if (fuse_reply_entry(req, &e) != 0) {
        }
        return;
    }
    struct node *p = node_of(parent);
    serve_begin(C_LOOKUP);
    int err = 0;
    int fd = openat(p->fd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        err = errno;
    } else if (fstatat(fd, "", &e.attr, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) != 0) {
        err = errno;
        if (close(fd) != 0) {
        }
    }
    unlock(&g.server);
    if (err == ENOENT) { /* a miss: told, never cached (entry timeout 0) */
        if (fuse_reply_entry(req, &e) != 0) {
        }
        return;
    }
    if (err) {
        if (fuse_reply_err(req, err) != 0) {
        }
        return;
    }
    struct node *n = remember(fd, &e.attr);
    if (!n) {
        if (fuse_reply_err(req, ENOMEM) != 0) {
        }
        return;
    }
    e.ino = (fuse_ino_t)(uintptr_t)n;
    e.entry_timeout = S_ISDIR(e.attr.st_mode) ? g.dir_timeout_s : 0.0;
    e.attr_timeout = e.entry_timeout;
    if (fuse_reply_entry(req, &e) != 0) forget_one(e.ino, 1);
}

static void mfs_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup) {
    forget_one(ino, nlookup);
    fuse_reply_none(req);
}

static void mfs_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *f) {
    for (size_t i = 0; i < count; i++) forget_one(f[i].ino, f[i].nlookup);
    fuse_reply_none(req);
}

static void mfs_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    (void)fi;
    struct node *n = node_of(ino);
    struct stat st;
    if (n == &g.stats) {
        stats_attr(&st);
        if (fuse_reply_attr(req, &st, 0.0) != 0) {
        }
        return;
    }
    serve_begin(C_GETATTR);
    int rc = fstatat(n->fd, "", &st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW);
    int err = rc == 0 ? 0 : errno;
    unlock(&g.server);
    double keep = !err && S_ISDIR(st.st_mode) ? g.dir_timeout_s : 0.0;
    if ((err ? fuse_reply_err(req, err) : fuse_reply_attr(req, &st, keep)) != 0) {
    }
}

static void mfs_readlink(fuse_req_t req, fuse_ino_t ino) {
    char buf[PATH_MAX + 1];
    serve_begin(C_READLINK);
    ssize_t n = readlinkat(node_of(ino)->fd, "", buf, sizeof buf - 1);
    int err = n < 0 ? errno : 0;
    unlock(&g.server);
    if (n >= 0) buf[n] = '\0';
    if ((err ? fuse_reply_err(req, err) : fuse_reply_readlink(req, buf)) != 0) {
    }
}

/* A path through /proc/self/fd that reopens an O_PATH descriptor for reading. */
static int reopen(int fd, int flags) {
    char path[64];
    int n = snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    if (n < 0 || (size_t)n >= sizeof path) {
        errno = ENAMETOOLONG;
        return -1;
    }
    return open(path, flags | O_CLOEXEC);
}

static void mfs_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    struct node *n = node_of(ino);
    if ((fi->flags & O_ACCMODE) != O_RDONLY) {
        if (fuse_reply_err(req, EROFS) != 0) {
        }
        return;
    }
    if (n == &g.stats) {
        fi->fh = UINT64_MAX;
        fi->direct_io = 1;
        if (fuse_reply_open(req, fi) != 0) {
        }
        return;
    }
    serve_begin(C_OPEN);
    int fd = reopen(n->fd, O_RDONLY);
    int err = fd < 0 ? errno : 0;
    unlock(&g.server);
    if (err) {
        if (fuse_reply_err(req, err) != 0) {
        }
        return;
    }
    fi->fh = (uint64_t)fd;
    fi->keep_cache = 1; /* file data may stay cached: only metadata is emulated */
    if (fuse_reply_open(req, fi) != 0 && close(fd) != 0) {
    }
}

static void mfs_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                     struct fuse_file_info *fi) {
    (void)ino;
    char *buf = malloc(size ? size : 1);
    if (!buf) {
        if (fuse_reply_err(req, ENOMEM) != 0) {
        }
        return;
    }
    ssize_t got;
    if (fi->fh == UINT64_MAX) {
        char text[1024];
        int n = stats_text(text, sizeof text);
        got = n < 0 || off >= n ? 0 : ((size_t)(n - off) < size ? n - off : (ssize_t)size);
        if (got > 0) memcpy(buf, text + off, (size_t)got);
    } else {
        atomic_fetch_add(&g.counts[C_READ], 1);
        got = pread((int)fi->fh, buf, size, off);
    }
    int rc = got < 0 ? fuse_reply_err(req, errno) : fuse_reply_buf(req, buf, (size_t)got);
    if (rc != 0) {
    }
    free(buf);
}

static void mfs_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    (void)ino;
    int err = fi->fh != UINT64_MAX && close((int)fi->fh) != 0 ? errno : 0;
    if (fuse_reply_err(req, err) != 0) {
    }
}

static void mfs_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    struct dir *d = calloc(1, sizeof *d);
    if (!d) {
        if (fuse_reply_err(req, ENOMEM) != 0) {
        }
        return;
    }
    serve_begin(C_OPENDIR);
    int fd = openat(node_of(ino)->fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int err = fd < 0 ? errno : 0;
    if (fd >= 0) {
        d->dp = fdopendir(fd);
        if (!d->dp) {
            err = errno;
            if (close(fd) != 0) {
            }
        }
    }
    unlock(&g.server);
    if (err) {
        free(d);
        if (fuse_reply_err(req, err) != 0) {
        }
        return;
    }
    fi->fh = (uint64_t)(uintptr_t)d;
    if (fuse_reply_open(req, fi) != 0) {
        if (closedir(d->dp) != 0) {
        }
        free(d);
    }
}

static void mfs_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                        struct fuse_file_info *fi) {
    (void)ino;
    struct dir *d = (struct dir *)(uintptr_t)fi->fh;
    char *buf = calloc(1, size ? size : 1);
    if (!buf) {
        if (fuse_reply_err(req, ENOMEM) != 0) {
        }
        return;
    }
    size_t used = 0;
    int err = 0;
    serve_begin(C_READDIR);
    if (off != d->offset) {
        seekdir(d->dp, off);
        d->entry = NULL;
        d->offset = off;
    }
    for (;;) {
        if (!d->entry) {
            errno = 0;
            d->entry = readdir(d->dp);
            if (!d->entry) {
                err = errno;
                break;
            }
        }
        struct stat st;
        memset(&st, 0, sizeof st);
        st.st_ino = d->entry->d_ino;
        st.st_mode = (mode_t)DTTOIF(d->entry->d_type);
        off_t next = telldir(d->dp);
        size_t want = fuse_add_direntry(req, buf + used, size - used, d->entry->d_name, &st,
                                        next);
        if (want > size - used) break; /* the reply is full: this entry goes next time */
        used += want;
        d->entry = NULL;
        d->offset = next;
    }
    unlock(&g.server);
    int rc = err && used == 0 ? fuse_reply_err(req, err) : fuse_reply_buf(req, buf, used);
    if (rc != 0) {
    }
    free(buf);
}

static void mfs_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    (void)ino;
    struct dir *d = (struct dir *)(uintptr_t)fi->fh;
    int err = closedir(d->dp) != 0 ? errno : 0;
    free(d);
    if (fuse_reply_err(req, err) != 0) {
    }
}

static void mfs_statfs(fuse_req_t req, fuse_ino_t ino) {
    (void)ino;
    struct statvfs sv;
    int rc = fstatvfs(g.root.fd, &sv) == 0 ? fuse_reply_statfs(req, &sv)
                                          : fuse_reply_err(req, errno);
    if (rc != 0) {
    }
}

/* A read is data, not a metadata request: without this the kernel revalidates a file's
 * attributes (a GETATTR to the server) before every read(2) of it, because they are never
 * cached here; a parallel filesystem's client reads from the data servers instead. */
static void mfs_init(void *userdata, struct fuse_conn_info *conn) {
    (void)userdata;
    conn->want &= ~(unsigned)FUSE_CAP_AUTO_INVAL_DATA;
}

static const struct fuse_lowlevel_ops ops = {
    .init = mfs_init,
    .lookup = mfs_lookup,
    .forget = mfs_forget,
    .forget_multi = mfs_forget_multi,
    .getattr = mfs_getattr,
    .readlink = mfs_readlink,
    .open = mfs_open,
    .read = mfs_read,
    .release = mfs_release,
    .opendir = mfs_opendir,
    .readdir = mfs_readdir,
    .releasedir = mfs_releasedir,
    .statfs = mfs_statfs,
};

static int usage(const char *why) {
    fprintf(stderr,
            "metafs: %s\nusage: metafs [--latency-us N] [--dir-timeout-s T] SOURCE "
            "MOUNTPOINT [FUSE options, e.g. -f]\n",
            why);
    return 2;
}

int main(int argc, char **argv) {
    int i = 1;
    for (; i + 1 < argc && strncmp(argv[i], "--", 2) == 0 && argv[i][2] != '\0'; i += 2) {
        char *end = NULL;
        errno = 0;
        if (strcmp(argv[i], "--latency-us") == 0) {
            long v = strtol(argv[i + 1], &end, 10);
            if (errno || *end || v < 0 || v > 10000000) return usage("bad --latency-us");
            g.latency_us = v;
        } else if (strcmp(argv[i], "--dir-timeout-s") == 0) {
            double v = strtod(argv[i + 1], &end);
            if (errno || *end || v < 0 || v > 86400) return usage("bad --dir-timeout-s");
            g.dir_timeout_s = v;
        } else {
            return usage("unknown option");
        }
    }
    if (argc - i < 2) return usage("SOURCE and MOUNTPOINT are needed");
    g.root.fd = open(argv[i], O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (g.root.fd < 0) {
        fprintf(stderr, "metafs: %s: %s\n", argv[i], strerror(errno));
        return 1;
    }
    g.root.nlookup = 2;
    g.stats.is_stats = 1;
    g.stats.fd = -1;

    /* FUSE's own command line: program, mountpoint, options; read-only, and as root open
     * to every uid (default_permissions keeps the source's modes in force) */
    char **fargv = calloc((size_t)(argc - i) + 4, sizeof *fargv);
    if (!fargv) return 1;
    int fargc = 0;
    fargv[fargc++] = argv[0];
    fargv[fargc++] = argv[i + 1];
    for (int k = i + 2; k < argc; k++) fargv[fargc++] = argv[k];
    fargv[fargc++] = geteuid() == 0
                         ? "-oro,default_permissions,allow_other,fsname=metafs,subtype=metafs"
                         : "-oro,default_permissions,fsname=metafs,subtype=metafs";
    struct fuse_args args = FUSE_ARGS_INIT(fargc, fargv);
    struct fuse_cmdline_opts opts;
    int rc = 1;
    if (fuse_parse_cmdline(&args, &opts) != 0) goto out_args;
    if (!opts.mountpoint) {
        rc = usage("no MOUNTPOINT");
        goto out_args;
    }
    struct fuse_session *se = fuse_session_new(&args, &ops, sizeof ops, NULL);
    if (!se) goto out_opts;
    if (fuse_set_signal_handlers(se) != 0) goto out_session;
    if (fuse_session_mount(se, opts.mountpoint) != 0) goto out_signals;
    if (fuse_daemonize(opts.foreground) != 0) goto out_unmount;
    rc = fuse_session_loop_mt(se, 0) == 0 ? 0 : 1;
out_unmount:
    fuse_session_unmount(se);
out_signals:
    fuse_remove_signal_handlers(se);
out_session:
    fuse_session_destroy(se);
out_opts:
    free(opts.mountpoint);
out_args:
    fuse_opt_free_args(&args);
    free(fargv);
    if (close(g.root.fd) != 0) rc = rc ? rc : 1;
    return rc;
}
