/* Element-wise reductions for every dtype x op, and the 16-bit float conversions.
 *
 * Why our own 16-bit conversions: libddl must build with any C11 compiler for x86_64 and
 * ppc64le, where _Float16 support differs; these bit-exact round-to-nearest-even versions
 * are portable and the loops around them vectorise. Integer sum and prod use unsigned
 * arithmetic so overflow wraps as in numpy instead of being undefined behaviour.
 *
 * Every pairwise combine here is commutative bit for bit: f(a, b) and f(b, a) have the
 * same bits for every pair of inputs. That is what keeps replicas identical: recursive
 * doubling computes each result on every rank, with the operands in a different order on
 * the two sides of each exchange (the other algorithms compute a block on one rank and
 * send it, so they agree by construction). IEEE sums and products of numbers are
 * commutative; three things are not, and are fixed here:
 *   - NaN payload and sign: x86 returns the first NaN operand's payload, so nan1 + nan2
 *     depends on the order. Every float result that is NaN is written as the canonical
 *     quiet NaN (positive, payload 0: 0x7fc00000, 0x7ff8000000000000, 0x7e00 in float16,
 *     0x7fc0 in bfloat16), so NaN results are identical whatever payloads went in.
 *   - max/min with a NaN: `b > a ? b : a` returns whichever operand came first. Here any
 *     NaN operand gives NaN, as numpy.maximum/minimum do.
 *   - max/min of -0.0 and +0.0, which compare equal: numpy returns the first argument.
 *     Here max(-0.0, +0.0) = +0.0 and min(-0.0, +0.0) = -0.0 in either order (IEEE
 *     754-2019 maximum/minimum), computed as the AND (max) / OR (min) of the two equal
 *     operands' bits, which leaves every other pair of equal values as it is. */
#include <math.h>
#include <string.h>

#include "ddl_internal.h"

bool ddl_dtype_valid(int dtype) { return dtype >= 0 && dtype < DDL_NUM_DTYPES; }
bool ddl_op_valid(int op) { return op >= 0 && op < DDL_NUM_OPS; }

static bool is_integer(int dtype) { return dtype >= DDL_INT8 && dtype <= DDL_INT64; }

ddl_status_t ddl_check_op(int op, int dtype, const char *fn) {
    if (!ddl_op_valid(op))
        return ddl_fail(DDL_ERR_INVALID_ARG,
                        "%s: unknown op %d; use one of sum, avg, min, max, prod, band, bor, bxor",
                        fn, op);
    if (op >= DDL_BAND && !is_integer(dtype))
        return ddl_fail(DDL_ERR_INVALID_ARG,
                        "%s: the bitwise op %s needs an integer dtype (int8, uint8, int32, "
                        "int64), not %s",
                        fn, ddl_op_name((ddl_op_t)op), ddl_dtype_name((ddl_dtype_t)dtype));
    return DDL_SUCCESS;
}

size_t ddl_dtype_size(ddl_dtype_t dtype) {
    static const size_t sizes[DDL_NUM_DTYPES] = {2, 2, 4, 8, 1, 1, 4, 8};
    return ddl_dtype_valid((int)dtype) ? sizes[dtype] : 0;
}

const char *ddl_dtype_name(ddl_dtype_t dtype) {
    static const char *names[DDL_NUM_DTYPES] = {"float16", "bfloat16", "float32", "float64",
                                                "int8",    "uint8",    "int32",   "int64"};
    return ddl_dtype_valid((int)dtype) ? names[dtype] : "unknown";
}

const char *ddl_op_name(ddl_op_t op) {
    static const char *names[DDL_NUM_OPS] = {"sum", "avg", "min", "max", "prod",
                                             "band", "bor", "bxor"};
    return ddl_op_valid((int)op) ? names[op] : "unknown";
}

static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t em = h & 0x7fffu;
    uint32_t o;
    if (em >= 0x7c00u) {
        o = 0x7f800000u | ((em & 0x3ffu) << 13); /* inf / nan */
    } else if (em >= 0x400u) {
        o = (em << 13) + ((uint32_t)(127 - 15) << 23); /* normal: re-bias the exponent */
    } else {
        float f = (float)em * 5.9604644775390625e-8f; /* subnormal: em * 2^-24, exact */
        memcpy(&o, &f, 4);
    }
    o |= sign;
    float r;
    memcpy(&r, &o, 4);
    return r;
}

static inline uint16_t f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x47800000u) /* >= 65536 (or inf/nan): inf, or the canonical quiet nan */
        return ax > 0x7f800000u ? (uint16_t)0x7e00u : (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) { /* below the smallest normal half: let the FPU round */
        float a;
        memcpy(&a, &ax, 4);
        a += 0.5f; /* aligns the half-subnormal grid with float's last mantissa bits */
        uint32_t b;
        memcpy(&b, &a, 4);
        return (uint16_t)(sign | (b - 0x3f000000u));
    }
    uint32_t odd = (ax >> 13) & 1u;
    ax += 0xc8000fffu + odd; /* re-bias by (15-127)<<23 and round to nearest even */
    return (uint16_t)(sign | (ax >> 13));
}

static inline float bf16_to_f32(uint16_t h) {
    uint32_t o = (uint32_t)h << 16;
    float r;
    memcpy(&r, &o, 4);
    return r;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)0x7fc0u; /* the canonical nan */
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

/* The canonical quiet NaN of each float type, and the order-independent combines. */
#define NAN32 0x7fc00000u
#define NAN64 0x7ff8000000000000ull

static inline float canon32(float r) {
    if (r != r) {
        uint32_t q = NAN32;
        memcpy(&r, &q, 4);
    }
    return r;
}

static inline double canon64(double r) {
    if (r != r) {
        uint64_t q = NAN64;
        memcpy(&r, &q, 8);
    }
    return r;
}

/* max (is_max) or min of two floats: NaN if either is, -0.0 < +0.0, commutative in bits. */
#define MINMAX_BODY(T, UT, NANBITS, a, b, is_max)                                         \
    do {                                                                                  \
        UT ab_, bb_, rb_;                                                                 \
        memcpy(&ab_, &(a), sizeof(T));                                                    \
        memcpy(&bb_, &(b), sizeof(T));                                                    \
        if ((a) != (a) || (b) != (b))                                                     \
            rb_ = (NANBITS);                                                              \
        else if ((a) == (b))                                                              \
            rb_ = (is_max) ? (ab_ & bb_) : (ab_ | bb_);                                   \
        else                                                                              \
            rb_ = ((is_max) ? (b) > (a) : (b) < (a)) ? bb_ : ab_;                         \
        T r_;                                                                             \
        memcpy(&r_, &rb_, sizeof(T));                                                     \
        return r_;                                                                        \
    } while (0)

static inline float max32(float a, float b) { MINMAX_BODY(float, uint32_t, NAN32, a, b, 1); }
static inline float min32(float a, float b) { MINMAX_BODY(float, uint32_t, NAN32, a, b, 0); }
static inline double max64(double a, double b) { MINMAX_BODY(double, uint64_t, NAN64, a, b, 1); }
static inline double min64(double a, double b) { MINMAX_BODY(double, uint64_t, NAN64, a, b, 0); }

#define MINF(a, b) ((b) < (a) ? (b) : (a))
#define MAXF(a, b) ((b) > (a) ? (b) : (a))

/* One loop per (type, op): the switch is outside so each loop vectorises. */
/* dst = a (op) b. dst may be a (in place) but the pointers are not declared restrict
 * then; the out-of-place form lets a reduce-scatter read the user's input directly.
 * FIN canonicalises a sum's or product's NaN (identity for integers); MIN/MAX are the
 * type's commutative min and max. */
#define REDUCE_LOOPS(T, UT, FIN, MIN, MAX, d, a, s, n, op)                                \
    do {                                                                                  \
        T *dd = (T *)(d);                                                                 \
        const T *aa = (const T *)(a);                                                     \
        const T *restrict ss = (const T *)(s);                                            \
        switch (op) {                                                                     \
        case DDL_SUM:                                                                     \
        case DDL_AVG:                                                                     \
            for (size_t i = 0; i < (n); i++) dd[i] = FIN((T)((UT)aa[i] + (UT)ss[i]));     \
            break;                                                                        \
        case DDL_PROD:                                                                    \
            for (size_t i = 0; i < (n); i++) dd[i] = FIN((T)((UT)aa[i] * (UT)ss[i]));     \
            break;                                                                        \
        case DDL_MIN:                                                                     \
            for (size_t i = 0; i < (n); i++) dd[i] = MIN(aa[i], ss[i]);                   \
            break;                                                                        \
        case DDL_MAX:                                                                     \
            for (size_t i = 0; i < (n); i++) dd[i] = MAX(aa[i], ss[i]);                   \
            break;                                                                        \
        default:                                                                          \
            break;                                                                        \
        }                                                                                 \
    } while (0)

/* 16-bit floats are combined in float32 and rounded once; the conversion back writes
 * every NaN as the canonical one. */
#define REDUCE_16(TO32, FROM32, d, a, s, n, op)                                           \
    do {                                                                                  \
        uint16_t *dd = (uint16_t *)(d);                                                   \
        const uint16_t *aa = (const uint16_t *)(a);                                       \
        const uint16_t *restrict ss = (const uint16_t *)(s);                              \
        switch (op) {                                                                     \
        case DDL_SUM:                                                                     \
        case DDL_AVG:                                                                     \
            for (size_t i = 0; i < (n); i++) dd[i] = FROM32(TO32(aa[i]) + TO32(ss[i]));   \
            break;                                                                        \
        case DDL_PROD:                                                                    \
            for (size_t i = 0; i < (n); i++) dd[i] = FROM32(TO32(aa[i]) * TO32(ss[i]));   \
            break;                                                                        \
        case DDL_MIN:                                                                     \
            for (size_t i = 0; i < (n); i++) dd[i] = FROM32(min32(TO32(aa[i]), TO32(ss[i]))); \
            break;                                                                        \
        case DDL_MAX:                                                                     \
            for (size_t i = 0; i < (n); i++) dd[i] = FROM32(max32(TO32(aa[i]), TO32(ss[i]))); \
            break;                                                                        \
        default:                                                                          \
            break;                                                                        \
        }                                                                                 \
    } while (0)

#define KEEP(x) (x)

/* Integers also take the bitwise ops (checked by ddl_check_op: never a float). */
#define REDUCE_INT(T, UT, d, a, s, n, op)                                                 \
    do {                                                                                  \
        T *di = (T *)(d);                                                                 \
        const T *ai = (const T *)(a);                                                     \
        const T *restrict si = (const T *)(s);                                            \
        if ((op) == DDL_BAND)                                                             \
            for (size_t i = 0; i < (n); i++) di[i] = (T)(ai[i] & si[i]);                  \
        else if ((op) == DDL_BOR)                                                         \
            for (size_t i = 0; i < (n); i++) di[i] = (T)(ai[i] | si[i]);                  \
        else if ((op) == DDL_BXOR)                                                        \
            for (size_t i = 0; i < (n); i++) di[i] = (T)(ai[i] ^ si[i]);                  \
        else                                                                              \
            REDUCE_LOOPS(T, UT, KEEP, MINF, MAXF, d, a, s, n, op);                        \
    } while (0)

/* Separate in-place and out-of-place instantiations: with dst == a the compiler can
 * vectorise without runtime alias checks on the hot in-place path. */
#define REDUCE_ALL(d, a, s, n, dtype, op)                                                 \
    switch (dtype) {                                                                      \
    case DDL_FLOAT16: REDUCE_16(f16_to_f32, f32_to_f16, d, a, s, n, op); break;           \
    case DDL_BFLOAT16: REDUCE_16(bf16_to_f32, f32_to_bf16, d, a, s, n, op); break;        \
    case DDL_FLOAT32: REDUCE_LOOPS(float, float, canon32, min32, max32, d, a, s, n, op); break; \
    case DDL_FLOAT64: REDUCE_LOOPS(double, double, canon64, min64, max64, d, a, s, n, op); break; \
    case DDL_INT8: REDUCE_INT(int8_t, uint8_t, d, a, s, n, op); break; \
    case DDL_UINT8: REDUCE_INT(uint8_t, uint8_t, d, a, s, n, op); break; \
    case DDL_INT32: REDUCE_INT(int32_t, uint32_t, d, a, s, n, op); break; \
    case DDL_INT64: REDUCE_INT(int64_t, uint64_t, d, a, s, n, op); break; \
    default: break;                                                                       \
    }

/* The loops are built twice on x86-64, for the baseline (SSE2) and for AVX2, and the
 * loader picks one per machine (GCC's function multiversioning, an ifunc): canonicalising
 * NaN costs a compare and a blend per vector, which SSE2 spells in four instructions and
 * AVX2 in two, on vectors twice as wide. Measured (512 KiB of float32, in cache): an
 * in-place sum took 9.5 us before NaN was canonicalised, 14.1 us with it on SSE2 and
 * 7.2 us with it on AVX2. Elsewhere the one portable build serves. */
#if defined(__x86_64__) && defined(__GNUC__) && defined(__gnu_linux__)
#define MULTIVERSION __attribute__((target_clones("avx2", "default")))
#else
#define MULTIVERSION
#endif

MULTIVERSION
void ddl_reduce(void *dst, const void *src, size_t n, ddl_dtype_t dtype, ddl_op_t op) {
    REDUCE_ALL(dst, dst, src, n, dtype, op)
}

MULTIVERSION
void ddl_reduce3(void *restrict dst, const void *restrict a, const void *restrict src, size_t n,
                 ddl_dtype_t dtype, ddl_op_t op) {
    if (dst == a) {
        ddl_reduce(dst, src, n, dtype, op);
        return;
    }
    REDUCE_ALL(dst, a, src, n, dtype, op)
}

#define AVG_INT(T, b, n, div)                                                             \
    do {                                                                                  \
        T *p = (T *)(b);                                                                  \
        for (size_t i = 0; i < (n); i++) p[i] = (T)((int64_t)p[i] / (int64_t)(div));                     \
    } while (0)

void ddl_finish_avg(void *buf, size_t n, ddl_dtype_t dtype, int divisor) {
    if (divisor <= 1) return;
    switch (dtype) {
    case DDL_FLOAT16: {
        uint16_t *p = buf;
        for (size_t i = 0; i < n; i++) p[i] = f32_to_f16(f16_to_f32(p[i]) / (float)divisor);
        break;
    }
    case DDL_BFLOAT16: {
        uint16_t *p = buf;
        for (size_t i = 0; i < n; i++) p[i] = f32_to_bf16(bf16_to_f32(p[i]) / (float)divisor);
        break;
    }
    case DDL_FLOAT32: {
        float *p = buf;
        for (size_t i = 0; i < n; i++) p[i] = canon32(p[i] / (float)divisor);
        break;
    }
    case DDL_FLOAT64: {
        double *p = buf;
        for (size_t i = 0; i < n; i++) p[i] = canon64(p[i] / (double)divisor);
        break;
    }
    case DDL_INT8: AVG_INT(int8_t, buf, n, divisor); break;
    case DDL_UINT8: AVG_INT(uint8_t, buf, n, divisor); break;
    case DDL_INT32: AVG_INT(int32_t, buf, n, divisor); break;
    case DDL_INT64: AVG_INT(int64_t, buf, n, divisor); break;
    default: break;
    }
}
