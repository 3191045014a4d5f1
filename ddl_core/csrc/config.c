/* Configuration: every DDL_* environment variable libddl reads, parsed by one rule.
 *
 * Why one table and one number parser: a setting read with a bare strtod once let
 * DDL_TIMEOUT=nan through its range check (every comparison with nan is false) and so
 * disabled the deadline. Here every number goes through ddl_parse_number: a decimal
 * number (integer settings: digits only), nothing before or after it, finite, in the
 * setting's range; an empty value is an error too (unset the variable for the default).
 * The Python side (ddl_core.settings: ddlrun, the tune file, Python-only variables) calls
 * this same function through the binding, so there is one rule, not two.
 *
 * The table also says which settings must be the same on every rank (`agree`): those
 * that decide which messages a collective sends. ddl_init compares them across ranks
 * before it makes any communicator (agree.c). The others are local: how long this rank
 * waits (DDL_TIMEOUT, DDL_SPIN_US), how much it logs (DDL_LOG), how long its requests
 * gather before a negotiation that takes the minimum anyway (DDL_CYCLE_TIME_MS), and how
 * many pieces it keeps in flight (DDL_WINDOW: flow control, each side posts receives for
 * whatever arrives). */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddl_internal.h"

enum { NUM_INT, NUM_REAL, WORD };

typedef struct {
    const char *name;
    int kind;
    double lo, hi;    /* numbers: the accepted range */
    const char *unit; /* numbers: what the value counts, for the message */
    const char *dflt; /* the default, for the message */
    int agree;        /* must be the same on every rank */
} setting_t;

static const setting_t settings[] = {
    {"DDL_TOPOLOGY", WORD, 0, 0, NULL, "detected", 1},
    {"DDL_ALGO", WORD, 0, 0, NULL, "auto", 1},
    {"DDL_NODE_LEADER", NUM_INT, 0, 1, "0 or 1", "1", 1},
    {"DDL_SEGMENT", NUM_INT, 4096, 1 << 30, "bytes", "2097152", 1},
    {"DDL_PIECE", NUM_INT, 0, 1 << 30, "bytes", "131072", 1},
    {"DDL_FUSION_THRESHOLD", NUM_INT, 0, 1099511627776.0, "bytes", "67108864", 1},
    {"DDL_NCCL", WORD, 0, 0, NULL, "auto", 1},
    {"DDL_NCCL_OUTER", WORD, 0, 0, NULL, "nccl", 1},
    {"DDL_LIVENESS", NUM_INT, 0, 1, "0 or 1", "1", 1},
    {"DDL_ELASTIC", NUM_INT, 0, 1, "0 or 1", "0", 1},
    {"DDL_SHM", NUM_INT, 0, 1, "0 or 1", "1", 1},
    {"DDL_CMA", NUM_INT, 0, 1, "0 or 1", "1", 0},
    {"DDL_TIMEOUT", NUM_REAL, 0.001, 1e9, "seconds", "300", 0},
    {"DDL_SPIN_US", NUM_INT, -1, 1e9, "microseconds (-1: always spin)", "200", 0},
    {"DDL_CYCLE_TIME_MS", NUM_REAL, 0, 1e6, "milliseconds", "1", 0},
    {"DDL_WINDOW", NUM_INT, 1, 64, "pieces", "4", 0},
    {"DDL_LOG", NUM_INT, 0, 5, "a level", "0", 0},
};
#define NSETTINGS (sizeof settings / sizeof settings[0])

static const setting_t *find(const char *name) {
    for (size_t i = 0; i < NSETTINGS; i++)
        if (strcmp(settings[i].name, name) == 0) return &settings[i];
    return NULL;
}

/* The value as a message shows it: at most 40 characters, control characters and
 * non-ASCII bytes as '?', so whatever was in the environment prints safely; quoted where
 * it stands in a sentence. */
static void shown(const char *text, char *out, size_t n, int quote) {
    size_t w = 0, len = strlen(text);
    if (quote) out[w++] = '\'';
    for (size_t i = 0; i < len && i < 40 && w + 6 < n; i++) {
        unsigned char ch = (unsigned char)text[i];
        out[w++] = (ch >= 0x20 && ch < 0x7f) ? (char)ch : '?';
    }
    if (len > 40 && w + 6 < n) out[w++] = '.', out[w++] = '.', out[w++] = '.';
    if (quote) out[w++] = '\'';
    out[w] = 0;
}

/* "%.15g" prints 1073741824 as such and 0.001 as 0.001. */
static ddl_status_t number_fail(const char *name, const char *text, const char *why, double lo,
                                double hi, int integer, const char *unit, const char *dflt) {
    char v[64], tail[160] = "";
    shown(text, v, sizeof v, 0);
    if (dflt) snprintf(tail, sizeof tail, ", or unset it for the default (%s)", dflt);
    const char *what = unit ? unit : integer ? "an integer" : "a number";
    if (!*text)
        return ddl_fail(DDL_ERR_INVALID_ARG, "%s is set but empty: give %s in [%.15g, %.15g]%s",
                        name, what, lo, hi, tail);
    return ddl_fail(DDL_ERR_INVALID_ARG, "%s=%s %s: give %s%s in [%.15g, %.15g]%s", name, v, why,
                    unit && integer ? "a whole number of " : "", what, lo, hi, tail);
}

static ddl_status_t parse_number(const char *name, const char *text, double lo, double hi,
                                 int integer, const char *unit, const char *dflt, double *out) {
    if (!text) text = "";
    size_t len = strlen(text);
    int ok = len > 0;
    /* Characters first: strtod alone would take leading blanks, hex ("0x1p3"), "nan",
     * "inf" and "infinity", which Python's float() partly does not, and which no setting
     * means. */
    for (size_t i = 0; ok && i < len; i++) {
        char ch = text[i];
        int sign = (ch == '-' || ch == '+') && i == 0;
        ok = isdigit((unsigned char)ch) || sign ||
             (!integer && (ch == '.' || ch == 'e' || ch == 'E' || ch == '-' || ch == '+'));
    }
    if (!ok)
        return number_fail(name, text, integer ? "is not an integer" : "is not a decimal number",
                           lo, hi, integer, unit, dflt);
    char *end = NULL;
    errno = 0;
    double d = strtod(text, &end);
    if (end == text || *end)
        return number_fail(name, text, integer ? "is not an integer" : "is not a decimal number",
                           lo, hi, integer, unit, dflt);
    if (errno == ERANGE || !isfinite(d) || d < lo || d > hi)
        return number_fail(name, text, "is out of range", lo, hi, integer, unit, dflt);
    *out = d;
    return DDL_SUCCESS;
}

ddl_status_t ddl_parse_number(const char *name, const char *text, double lo, double hi,
                              int integer, double *value) {
    if (!name || !value || !(lo <= hi))
        return ddl_fail(DDL_ERR_INVALID_ARG, "ddl_parse_number: bad arguments");
    return parse_number(name, text, lo, hi, integer, NULL, NULL, value);
}

/* ---- the words ------------------------------------------------------------------------ */

static ddl_status_t parse_algo(const char *v, ddl_algo_t *out) {
    for (int a = 0; a < DDL_NUM_ALGOS; a++)
        if (strcmp(v, ddl_algo_name((ddl_algo_t)a)) == 0) {
            *out = (ddl_algo_t)a;
            return DDL_SUCCESS;
        }
    if (strcmp(v, "rhd") == 0 || strcmp(v, "halving") == 0) {
        *out = DDL_ALGO_RABENSEIFNER;
        return DDL_SUCCESS;
    }
    char s[64];
    shown(v, s, sizeof s, 0);
    return ddl_fail(DDL_ERR_INVALID_ARG,
                    "DDL_ALGO=%s is not an algorithm: use auto, ring, rabenseifner, recdoubling "
                    "or mpi, or unset it for auto",
                    s);
}

static ddl_status_t parse_nccl(const char *v, int *out) {
    static const char *const off[] = {"0", "off", "no", "false"};
    static const char *const on[] = {"1", "on", "yes", "true", "require"};
    for (size_t i = 0; i < sizeof off / sizeof *off; i++)
        if (!strcmp(v, off[i])) return *out = DDL_NCCL_OFF, DDL_SUCCESS;
    for (size_t i = 0; i < sizeof on / sizeof *on; i++)
        if (!strcmp(v, on[i])) return *out = DDL_NCCL_REQUIRE, DDL_SUCCESS;
    if (!strcmp(v, "auto")) return *out = DDL_NCCL_AUTO, DDL_SUCCESS;
    char s[64];
    shown(v, s, sizeof s, 0);
    return ddl_fail(DDL_ERR_INVALID_ARG,
                    "DDL_NCCL=%s: use auto (NCCL where it can serve, else staging through host "
                    "memory), 0 (always stage) or 1 (NCCL or fail)",
                    s);
}

static ddl_status_t parse_outer(const char *v, int *out) {
    if (!strcmp(v, "mpi")) return *out = 1, DDL_SUCCESS;
    if (!strcmp(v, "nccl")) return *out = 0, DDL_SUCCESS;
    char s[64];
    shown(v, s, sizeof s, 0);
    return ddl_fail(DDL_ERR_INVALID_ARG,
                    "DDL_NCCL_OUTER=%s: use nccl or mpi (the outermost topology level on NCCL, "
                    "or on MPI through host memory)",
                    s);
}

/* ---- one setting, by name -------------------------------------------------------------- */

/* Parse `text` as setting `s` into cfg (and its numeric value into *value). */
static ddl_status_t parse_one(const setting_t *s, const char *text, ddl_config_t *cfg,
                              double *value) {
    double d = 0;
    if (s->kind != WORD) {
        DDL_CHECK(parse_number(s->name, text, s->lo, s->hi, s->kind == NUM_INT, s->unit, s->dflt,
                               &d));
        *value = d;
    } else if (!*text) {
        return DDL_SUCCESS; /* a word set empty means its default, as it always did */
    }
    const char *n = s->name;
    if (!strcmp(n, "DDL_TOPOLOGY")) {
        DDL_CHECK(ddl_parse_topology(text, cfg->dims, &cfg->nlevels));
        double ranks = 1;
        for (int i = 0; i < cfg->nlevels; i++) ranks *= cfg->dims[i];
        *value = ranks;
    } else if (!strcmp(n, "DDL_ALGO")) {
        DDL_CHECK(parse_algo(text, &cfg->algo));
        *value = cfg->algo;
    } else if (!strcmp(n, "DDL_NCCL")) {
        DDL_CHECK(parse_nccl(text, &cfg->nccl));
        *value = cfg->nccl;
    } else if (!strcmp(n, "DDL_NCCL_OUTER")) {
        DDL_CHECK(parse_outer(text, &cfg->nccl_outer_mpi));
        *value = cfg->nccl_outer_mpi;
    } else if (!strcmp(n, "DDL_NODE_LEADER")) {
        cfg->node_leader = (int)d;
    } else if (!strcmp(n, "DDL_SEGMENT")) {
        cfg->segment_bytes = (size_t)d;
    } else if (!strcmp(n, "DDL_PIECE")) {
        cfg->piece = (size_t)d;
    } else if (!strcmp(n, "DDL_FUSION_THRESHOLD")) {
        cfg->fusion_threshold = (size_t)d;
    } else if (!strcmp(n, "DDL_TIMEOUT")) {
        cfg->timeout_s = d;
    } else if (!strcmp(n, "DDL_SPIN_US")) {
        cfg->spin_s = d * 1e-6;
    } else if (!strcmp(n, "DDL_CYCLE_TIME_MS")) {
        cfg->cycle_time_s = d / 1000.0;
    } else if (!strcmp(n, "DDL_WINDOW")) {
        cfg->window = (int)d;
    } else if (!strcmp(n, "DDL_LOG")) {
        cfg->log_level = (int)d;
    } else if (!strcmp(n, "DDL_LIVENESS")) {
        cfg->liveness = (int)d;
    } else if (!strcmp(n, "DDL_ELASTIC")) {
        cfg->elastic = (int)d;
    } else if (!strcmp(n, "DDL_SHM")) {
        cfg->shm = (int)d;
    } else if (!strcmp(n, "DDL_CMA")) {
        cfg->cma = (int)d;
    }
    return DDL_SUCCESS;
}

ddl_status_t ddl_check_setting(const char *name, const char *text, int *known, double *value) {
    double v = 0;
    const setting_t *s = name ? find(name) : NULL;
    if (known) *known = s != NULL;
    if (!s) return DDL_SUCCESS;
    ddl_config_t scratch;
    ddl_config_defaults(&scratch);
    DDL_CHECK(parse_one(s, text ? text : "", &scratch, &v));
    if (value) *value = v;
    return DDL_SUCCESS;
}

/* ---- the whole configuration ----------------------------------------------------------- */

void ddl_config_defaults(ddl_config_t *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->log_level = 0;
    cfg->timeout_s = 300.0;
    cfg->spin_s = 200e-6;
    cfg->piece = 128 * 1024;
    cfg->window = 4;
    cfg->fusion_threshold = (size_t)64 * 1024 * 1024;
    cfg->cycle_time_s = 1e-3;
    cfg->node_leader = 1;
    cfg->segment_bytes = (size_t)2 * 1024 * 1024;
    cfg->algo = DDL_ALGO_AUTO;
    cfg->nlevels = 0;
    cfg->nccl = DDL_NCCL_AUTO;
    cfg->nccl_outer_mpi = 0;
    cfg->liveness = 1;
    cfg->shm = 1;
    cfg->cma = 1;
}

ddl_status_t ddl_config_read(ddl_config_t *cfg) {
    ddl_config_defaults(cfg);
    /* DDL_TIMEOUT first, so a rank whose other settings are bad still waits for its peers
     * as long as it was told to while they all learn about it (agree.c). */
    const setting_t *t = find("DDL_TIMEOUT");
    const char *tv = getenv(t->name);
    double v;
    ddl_status_t first = tv ? parse_one(t, tv, cfg, &v) : DDL_SUCCESS;
    char msg[1024] = "";
    if (first != DDL_SUCCESS) snprintf(msg, sizeof msg, "%s", ddl_last_error());
    for (size_t i = 0; i < NSETTINGS; i++) {
        const char *text = getenv(settings[i].name);
        if (!text || &settings[i] == t) continue;
        ddl_status_t rc = parse_one(&settings[i], text, cfg, &v);
        if (rc != DDL_SUCCESS && first == DDL_SUCCESS) {
            first = rc;
            snprintf(msg, sizeof msg, "%s", ddl_last_error());
        }
    }
    if (first != DDL_SUCCESS) return ddl_fail_verbatim(first, msg);
    return DDL_SUCCESS;
}

/* Lines "NAME\tcanonical\tshown\n" for the settings that must agree: `canonical` is the
 * value in effect (so an unset variable and one set to its default agree), `shown` what
 * the environment said, for the message. */
size_t ddl_config_agreed(const ddl_config_t *cfg, char *out, size_t n) {
    size_t w = 0;
    out[0] = 0;
    for (size_t i = 0; i < NSETTINGS; i++) {
        const setting_t *s = &settings[i];
        if (!s->agree) continue;
        char canon[128] = "";
        const char *nm = s->name;
        if (!strcmp(nm, "DDL_TOPOLOGY")) {
            if (cfg->nlevels == 0) snprintf(canon, sizeof canon, "detect");
            for (int l = 0; l < cfg->nlevels; l++)
                snprintf(canon + strlen(canon), sizeof canon - strlen(canon), "%s%d",
                         l ? "x" : "", cfg->dims[l]);
        } else if (!strcmp(nm, "DDL_ALGO")) {
            snprintf(canon, sizeof canon, "%s", ddl_algo_name(cfg->algo));
        } else if (!strcmp(nm, "DDL_NODE_LEADER")) {
            snprintf(canon, sizeof canon, "%d", cfg->node_leader);
        } else if (!strcmp(nm, "DDL_SEGMENT")) {
            snprintf(canon, sizeof canon, "%zu", cfg->segment_bytes);
        } else if (!strcmp(nm, "DDL_PIECE")) {
            snprintf(canon, sizeof canon, "%zu", cfg->piece);
        } else if (!strcmp(nm, "DDL_FUSION_THRESHOLD")) {
            snprintf(canon, sizeof canon, "%zu", cfg->fusion_threshold);
        } else if (!strcmp(nm, "DDL_NCCL")) {
            snprintf(canon, sizeof canon, "%d", cfg->nccl);
        } else if (!strcmp(nm, "DDL_NCCL_OUTER")) {
            snprintf(canon, sizeof canon, "%d", cfg->nccl_outer_mpi);
        } else if (!strcmp(nm, "DDL_LIVENESS")) {
            snprintf(canon, sizeof canon, "%d", cfg->liveness);
        } else if (!strcmp(nm, "DDL_ELASTIC")) {
            snprintf(canon, sizeof canon, "%d", cfg->elastic);
        } else if (!strcmp(nm, "DDL_SHM")) {
            snprintf(canon, sizeof canon, "%d", cfg->shm);
        }
        const char *env = getenv(nm);
        char show[64];
        if (env)
            shown(env, show, sizeof show, 1);
        else
            snprintf(show, sizeof show, "unset");
        int k = snprintf(out + w, n - w, "%s\t%s\t%s\n", nm, canon, show);
        if (k < 0 || (size_t)k >= n - w) break;
        w += (size_t)k;
    }
    return w;
}

void ddl_config_apply(const ddl_config_t *cfg) {
    ddl_log_level = cfg->log_level;
    ddl_timeout_s = cfg->timeout_s;
    ddl_spin_s = cfg->spin_s;
    ddl_stream_piece = cfg->piece;
    ddl_stream_window = cfg->window;
    ddl_g.fusion_threshold = cfg->fusion_threshold;
    ddl_g.cycle_time_s = cfg->cycle_time_s;
    ddl_g.node_leader = cfg->node_leader;
    ddl_g.segment_bytes = cfg->segment_bytes;
    ddl_g.forced_algo = cfg->algo;
    ddl_g.liveness = cfg->liveness;
    ddl_elastic = cfg->elastic;
    ddl_g.shm = cfg->shm;
    ddl_g.cma = cfg->cma;
    ddl_gpu_configure(cfg->nccl, cfg->nccl_outer_mpi);
    ddl_settings_changed();
}
