/* The alpha-beta cost model that picks an allreduce algorithm per level and size.
 *
 * Per level l with p ranks, alpha_l seconds per message, beta_l seconds per byte on that
 * level's link and gamma seconds per byte reduced, for n bytes at that level:
 *
 *   ring reduce-scatter      (p-1) a  + (p-1)/p n (b + g)
 *   ring allgather           (p-1) a  + (p-1)/p n b
 *   halving reduce-scatter   log2(p) a + (p-1)/p n (b + g)      (p a power of two)
 *   doubling allgather       log2(p) a + (p-1)/p n b            (p a power of two)
 *   recursive doubling       ceil(log2 p) (a + n b + n g) + [p not a power of two] 2 (a + n b)
 *
 * Levels run innermost first: a reduce-scatter at level l leaves n/p_l bytes for level
 * l+1, a whole allreduce at level l (recursive doubling, or Rabenseifner when p_l is not
 * a power of two) leaves n. The ranks of the inner levels all use an outer level's link
 * at the same time, so from level 1 up beta counts prod(p_0..p_{l-1}) concurrent flows:
 *   b_eff(l) = b_l * prod_{k<l} p_k.
 * The whole allreduce costs the sum over levels of the reduce-scatter (or whole
 * allreduce) and allgather of each level. Before any hierarchical plan runs, a header-only
 * recursive doubling over all P ranks checks that every rank called the same collective:
 *   check = ceil(log2 P) a_top.
 * The alternative is one recursive doubling over all ranks with the header fused into the
 * data: ceil(log2 P) (a_top + n b_top + n g). The cheaper of the two runs.
 *
 * The node-leader pipeline (DDL_NODE_LEADER=1, the default, on grids of two or more levels
 * with more than one rank per node; collectives.c) replaces this walk: the buffer is cut
 * into K segments of S = n/K bytes (about DDL_SEGMENT each, ddl_pipeline_segments); a
 * chain of the node's ranks reduces each segment to the node's first rank, which runs the
 * outer levels on the whole segment (one flow per node link, so level l >= 1 sees
 * b_eff = b_l * prod_{1<=k<l} p_k, and the same bytes cross it), and the chain passes the
 * result back, while later segments are reduced and earlier ones passed back. With
 * hop = a_0 + S b_0 (one segment between two ranks of a node):
 *   fill  = (p_0-1) hop + (p_0-2) S g        the first segment down the chain
 *   drain = (p_0-1) hop                      the last one back up
 *   step  = max(S g + outer(S),  2 hop + [p_0 > 2] S g)
 *   total = check + fill + drain + K step
 * where outer(S) is the level-by-level sum above over levels 1.. for S bytes; the slower
 * of the leader (its own addition and the outer levels) and a chain rank sets the pace.
 *
 * alpha and beta per level are measured by `python -m ddl_core.bench tune` and read from
 * DDL_TUNE_FILE; without one the defaults below (shared memory inside a node, a 10 Gb/s
 * class network between nodes) apply. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ddl_internal.h"

void ddl_model_defaults(ddl_model_t *m, int nlevels) {
    for (int l = 0; l < DDL_MAX_LEVELS; l++) {
        m->alpha[l] = l == 0 && nlevels > 1 ? 1.5e-6 : (nlevels > 1 ? 20e-6 : 1.5e-6);
        m->beta[l] = l == 0 && nlevels > 1 ? 1.0 / 6e9 : (nlevels > 1 ? 1.0 / 1.2e9 : 1.0 / 6e9);
    }
    m->gamma = 1.0 / 8e9;
    m->leader = 0;
    m->segment = 2.0 * 1024 * 1024;
}

size_t ddl_pipeline_segments(size_t bytes, size_t es, int p0, double segment) {
    size_t seg = segment >= 1.0 ? (size_t)segment : 1;
    size_t k = (bytes + seg - 1) / seg;
    if (k < (size_t)(p0 - 1)) k = (size_t)(p0 - 1);
    if (es > 0 && k > bytes / es) k = bytes / es;
    return k ? k : 1;
}

/* A tune file (python -m ddl_core.bench tune writes it; ddl_core.model reads it the same way):
 * '#' comments, blank lines, and lines of whitespace-separated words
 *     topology GRID          the grid it was measured on
 *     gamma SECONDS_PER_BYTE
 *     level INDEX ALPHA_SECONDS BETA_SECONDS_PER_BYTE
 * Other first words are skipped (later versions may add some). Every number follows
 * ddl_parse_number: finite, figures in [0, 1e6], INDEX an integer in [0, 7]; a known
 * line with a bad or missing number is an error naming the file and line, rather than a
 * cost model built on nan. */
ddl_status_t ddl_model_load(ddl_model_t *m, const char *path, const int *dims, int nlevels) {
    FILE *f = fopen(path, "r");
    if (!f)
        return ddl_fail(DDL_ERR_INVALID_ARG,
                        "cannot read the tuning file %s (DDL_TUNE_FILE): run `ddlrun ... python "
                        "-m ddl_core.bench tune` to make one, or unset DDL_TUNE_FILE",
                        path);
    char line[512], topo[128] = "", want[128] = "";
    for (int i = 0; i < nlevels; i++)
        snprintf(want + strlen(want), sizeof want - strlen(want), "%s%d", i ? "x" : "", dims[i]);
    ddl_model_t tmp = *m;
    int seen = 0, lineno = 0;
    ddl_status_t rc = DDL_SUCCESS;
    while (rc == DDL_SUCCESS && fgets(line, sizeof line, f)) {
        lineno++;
        char *hash = strchr(line, '#'), *save = NULL, *w[5];
        if (hash) *hash = 0;
        int n = 0;
        for (char *t = strtok_r(line, " \t\r\n", &save); t; t = strtok_r(NULL, " \t\r\n", &save))
            if (n < 5) w[n++] = t;
            else n++;
        if (n == 0) continue;
        char what[640];
        int want_n = !strcmp(w[0], "topology") || !strcmp(w[0], "gamma") ? 2
                     : !strcmp(w[0], "level")                           ? 4
                                                                        : 0;
        if (!want_n) continue;
        if (n != want_n) {
            rc = ddl_fail(DDL_ERR_INVALID_ARG,
                          "tuning file %s line %d: '%s' takes %d value(s), not %d: rewrite it "
                          "with python -m ddl_core.bench tune",
                          path, lineno, w[0], want_n - 1, n - 1);
            break;
        }
        double a, b, g, l;
        if (!strcmp(w[0], "topology")) {
            snprintf(topo, sizeof topo, "%s", w[1]);
        } else if (!strcmp(w[0], "gamma")) {
            snprintf(what, sizeof what, "tuning file %s line %d: gamma", path, lineno);
            rc = ddl_parse_number(what, w[1], 0, 1e6, 0, &g);
            if (rc == DDL_SUCCESS) tmp.gamma = g;
        } else {
            snprintf(what, sizeof what, "tuning file %s line %d: level", path, lineno);
            rc = ddl_parse_number(what, w[1], 0, DDL_MAX_LEVELS - 1, 1, &l);
            snprintf(what, sizeof what, "tuning file %s line %d: alpha", path, lineno);
            if (rc == DDL_SUCCESS) rc = ddl_parse_number(what, w[2], 0, 1e6, 0, &a);
            snprintf(what, sizeof what, "tuning file %s line %d: beta", path, lineno);
            if (rc == DDL_SUCCESS) rc = ddl_parse_number(what, w[3], 0, 1e6, 0, &b);
            if (rc == DDL_SUCCESS) {
                tmp.alpha[(int)l] = a;
                tmp.beta[(int)l] = b;
                seen++;
            }
        }
    }
    fclose(f);
    if (rc != DDL_SUCCESS) return rc;
    if (strcmp(topo, want) != 0) {
        ddl_log(0, "tuning file %s is for topology %s, this job is %s: using defaults", path,
                topo[0] ? topo : "?", want);
        return DDL_SUCCESS;
    }
    if (seen < nlevels) {
        ddl_log(0, "tuning file %s has %d of %d levels: using defaults", path, seen, nlevels);
        return DDL_SUCCESS;
    }
    *m = tmp;
    return DDL_SUCCESS;
}

static int ceil_log2(int p) {
    int k = 0;
    while ((1 << k) < p) k++;
    return k;
}
static int is_pow2(int p) { return p > 0 && (p & (p - 1)) == 0; }

static double rd_cost(int p, double a, double b, double g, double n) {
    if (p <= 1) return 0.0;
    double t = ceil_log2(p) * (a + n * b + n * g);
    if (!is_pow2(p)) t += 2.0 * (a + n * b);
    return t;
}

/* Cost of level l's part for n bytes with algorithm `algo`; *whole says it reduced the
 * whole segment (no reduce-scatter, so nothing to gather later). */
static double level_cost(ddl_algo_t algo, int p, double a, double b, double g, double n,
                         int *whole) {
    double f = (double)(p - 1) / p;
    *whole = 0;
    switch (algo) {
    case DDL_ALGO_RING:
        return 2.0 * (p - 1) * a + f * n * (2.0 * b + g);
    case DDL_ALGO_RABENSEIFNER:
        if (is_pow2(p)) return 2.0 * ceil_log2(p) * a + f * n * (2.0 * b + g);
        *whole = 1; /* folds into the nearest power of two: two more full exchanges */
        return 2.0 * ceil_log2(p) * a + f * n * (2.0 * b + g) + 2.0 * (a + n * b);
    case DDL_ALGO_RECDOUBLING:
    case DDL_ALGO_MPI:
        *whole = 1;
        return rd_cost(p, a, b, g, n);
    default:
        return 1e30;
    }
}

double ddl_model_plan(const ddl_model_t *m, const int *dims, int nlevels, size_t bytes,
                      ddl_algo_t forced, ddl_algo_t out[DDL_MAX_LEVELS], int *flat) {
    *flat = 0;
    int P = 1;
    for (int l = 0; l < nlevels; l++) P *= dims[l];
    int top = nlevels - 1;
    int leader = m->leader && nlevels > 1 && dims[0] > 1;
    double K = leader ? (double)ddl_pipeline_segments(bytes, 1, dims[0], m->segment) : 1.0;
    double n = (double)bytes / K, total = 0.0, conc = 1.0;
    if (leader) out[0] = DDL_ALGO_RING; /* reported for level 0: the chain is an open ring */
    for (int l = leader ? 1 : 0; l < nlevels; l++) {
        double b = m->beta[l] * (l > 0 ? conc : 1.0);
        ddl_algo_t best = DDL_ALGO_RING;
        double best_t = 1e30;
        int best_whole = 0;
        static const ddl_algo_t cand[] = {DDL_ALGO_RING, DDL_ALGO_RABENSEIFNER,
                                          DDL_ALGO_RECDOUBLING};
        /* Forced ring or Rabenseifner run at every level; auto weighs all three. */
        for (size_t i = 0; i < sizeof cand / sizeof cand[0]; i++) {
            if (forced != DDL_ALGO_AUTO && forced != DDL_ALGO_RECDOUBLING &&
                forced != DDL_ALGO_MPI && cand[i] != forced)
                continue;
            int whole;
            double t = level_cost(cand[i], dims[l], m->alpha[l], b, m->gamma, n, &whole);
            if (t < best_t) best = cand[i], best_t = t, best_whole = whole;
        }
        out[l] = best;
        total += best_t;
        if (!best_whole) n /= dims[l];
        conc *= dims[l];
    }
    if (leader) {
        double S = (double)bytes / K, hop = m->alpha[0] + S * m->beta[0];
        double chain = 2.0 * hop + (dims[0] > 2 ? S * m->gamma : 0.0);
        double step = S * m->gamma + total > chain ? S * m->gamma + total : chain;
        total = (dims[0] - 1) * hop + (dims[0] - 2) * S * m->gamma + (dims[0] - 1) * hop +
                K * step;
    }
    total += ceil_log2(P) * m->alpha[top];
    /* The alternatives over all ranks at once: one fused recursive doubling (the latency
     * path), or MPI's own allreduce (only when forced; costed like recursive doubling). */
    if (forced == DDL_ALGO_AUTO || forced == DDL_ALGO_RECDOUBLING || forced == DDL_ALGO_MPI) {
        double t = rd_cost(P, m->alpha[top], m->beta[top], m->gamma, (double)bytes);
        if (forced != DDL_ALGO_AUTO || t <= total) {
            ddl_algo_t a = forced == DDL_ALGO_MPI ? DDL_ALGO_MPI : DDL_ALGO_RECDOUBLING;
            for (int l = 0; l < nlevels; l++) out[l] = a;
            *flat = 1;
            return forced == DDL_ALGO_MPI ? t + ceil_log2(P) * m->alpha[top] : t;
        }
    }
    return total;
}
