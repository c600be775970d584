/* Compiled fast paths for the CLI's hot loop: decode and check a coded stream, and replay
 * HiSparse's batched LRU over it.
 *
 * Nothing here defines semantics. Each function reproduces a numba function of the package
 * (the reference), and tests/test_native.py checks them bit for bit:
 *   decode      <- simulator/trace/codec_jit.py  decode
 *   check_rows  <- simulator/trace/codec_jit.py  check_rows
 *   lru_batched <- simulator/replay/step.py      run (policy lru, batched)
 * They exist because numba's import and first load cost ~0.5 s, longer than the whole replay of
 * a 41 M-access stream, and because batched LRU can be computed in O(changes) per step (below)
 * instead of the reference's walk of the recency list.
 *
 * Arrays come in through the buffer protocol (numpy arrays, C-contiguous); the Python wrapper in
 * simulator/native/__init__.py checks dtypes and shapes. Loops run without the GIL.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>

/* ------------------------------------------------------------------------------------------ */
/* Problem codes: simulator/trace/problems.py is the table (RowProblem, DecodeProblem); the same  */
/* numbers under the same names, exported by the module (tests/test_trace_validation.py).        */

#define PROBLEM_CODES(X) \
    X(ROW_NEGATIVE, 1) X(ROW_OUT_OF_RANGE, 2) X(ROW_REPEATED, 3) X(ROW_TOO_MANY, 4) X(ROW_CTX_DOWN, 5) \
    X(ROW_CTX_NOT_POSITIVE, 6) X(ROW_PAD_BEFORE_ENTRY, 7) \
    X(DECODE_ENDS_EARLY, 1) X(DECODE_INCONSISTENT, 2) X(DECODE_TRAILING_BYTES, 3) X(DECODE_BREAKS_RULE, 4)
#define AS_ENUM(name, value) name = value,
enum { PROBLEM_CODES(AS_ENUM) };

/* ------------------------------------------------------------------------------------------ */
/* Stream codec: LEB128 varints, each step coded against the previous one (see codec.py).     */

static inline int get_varint(const uint8_t *buf, Py_ssize_t n, Py_ssize_t *pos, int64_t *value)
{
    Py_ssize_t q = *pos;
    if (q + 2 <= n) { /* the common one- and two-byte values, no loop */
        uint8_t b0 = buf[q];
        if (b0 < 0x80) { *pos = q + 1; *value = b0; return 1; }
        uint8_t b1 = buf[q + 1];
        if (b1 < 0x80) { *pos = q + 2; *value = (int64_t)(b0 & 0x7F) | ((int64_t)b1 << 7); return 1; }
    }
    uint64_t v = 0;
    int shift = 0;
    Py_ssize_t p = *pos;
    for (;;) {
        if (p >= n || shift > 56)
            return 0;
        uint8_t b = buf[p++];
        v |= (uint64_t)(b & 0x7F) << shift;
        if (b < 0x80) {
            *pos = p;
            *value = (int64_t)v;
            return 1;
        }
        shift += 7;
    }
}

/* Decoder of one coded stream, one step at a time. After dec_step, cur[0..cnt) is the step's
 * row sorted ascending, and the step's changes against the previous row of the same payload are
 * rem[0..n_rem) (ranks in prev, ascending) and add[0..n_add) (positions, ascending). */
typedef struct {
    const uint8_t *buf;
    Py_ssize_t n, pos;
    int64_t width, prev_n, cnt, n_rem, n_add, ctx;
    int64_t *prev, *cur, *rem, *add, *kept, *work;
    int32_t *gone, stamp; /* [width] gone[rank] == stamp: a leaver of this step (for compacting) */
} decoder;

static int dec_init(decoder *d, const uint8_t *buf, Py_ssize_t n, int64_t width)
{
    d->buf = buf; d->n = n; d->pos = 0; d->width = width;
    d->prev_n = d->cnt = d->n_rem = d->n_add = d->ctx = 0;
    int64_t w = (width > 0 ? width : 1) + 4; /* + 4: the merge's sentinels, two at each end */
    d->work = (int64_t *)malloc(sizeof(int64_t) * 5 * (size_t)w);
    if (!d->work) return 0;
    d->prev = d->work; d->cur = d->work + w; d->rem = d->work + 2 * w; d->add = d->work + 3 * w + 2;
    d->kept = d->work + 4 * w + 2;
    d->stamp = 0;
    d->gone = (int32_t *)calloc((size_t)(width > 0 ? width : 1), sizeof(int32_t));
    if (!d->gone) { free(d->work); return 0; }
    return 1;
}

/* 0, DECODE_ENDS_EARLY or DECODE_INCONSISTENT. */
static int dec_step(decoder *d)
{
    int64_t z, g, *swap = d->prev;
    d->prev = d->cur; d->cur = swap; d->prev_n = d->cnt;
    if (!get_varint(d->buf, d->n, &d->pos, &z)) return DECODE_ENDS_EARLY;
    d->ctx += (z >> 1) ^ -(z & 1);
    if (!get_varint(d->buf, d->n, &d->pos, &d->n_rem) || !get_varint(d->buf, d->n, &d->pos, &d->n_add)) return DECODE_ENDS_EARLY;
    int64_t prev_n = d->prev_n, n_rem = d->n_rem, n_add = d->n_add, *prev = d->prev, *cur = d->cur;
    if (n_rem > prev_n || n_add > d->width) return DECODE_INCONSISTENT;
    /* Locals for the hot loops: d->pos (a Py_ssize_t) could alias the int64_t stores. */
    const uint8_t *buf = d->buf;
    Py_ssize_t n = d->n, q = d->pos;
    int64_t *rem = d->rem, *add = d->add;
    int32_t *gone = d->gone, stamp = d->stamp == INT32_MAX ? 1 : d->stamp + 1;
    if (stamp == 1) memset(gone, 0, sizeof(int32_t) * (size_t)(d->width > 0 ? d->width : 1));
    d->stamp = stamp;
    int64_t last = -1;
    for (int64_t r = 0; r < n_rem; r++) {
        if (!get_varint(buf, n, &q, &g)) { d->pos = q; return DECODE_ENDS_EARLY; }
        last += g + 1;
        if (last >= prev_n) { d->pos = q; return DECODE_INCONSISTENT; }
        rem[r] = last;
        gone[last] = stamp;
    }
    last = -1;
    for (int64_t a = 0; a < n_add; a++) {
        if (!get_varint(buf, n, &q, &g)) { d->pos = q; return DECODE_ENDS_EARLY; }
        last += g + 1;
        add[a] = last;
    }
    d->pos = q;
    int64_t cnt = prev_n - n_rem + n_add;
    if (cnt > d->width) return DECODE_INCONSISTENT;
    if (8 * (n_add + n_rem) > prev_n) { /* many changes: compact, then a branch-free merge */
        int64_t nk = 0, *kept = d->kept;
        for (int64_t i = 0; i < prev_n; i++) { kept[nk] = prev[i]; nk += gone[i] != stamp; }
        /* Merged from both ends at once: two independent dependency chains, the smallest half
         * from the front and the largest from the back. Two sentinels beyond each end of each
         * input: no bounds to test, and the next values load before the comparison that picks
         * between them is known. A value in both inputs is seen as both heads (or both tails)
         * by one of the two chains. */
        int64_t *kp = kept, *ad = d->add;
        kp[nk] = kp[nk + 1] = ad[n_add] = ad[n_add + 1] = INT64_MAX;
        kp[-1] = kp[-2] = ad[-1] = ad[-2] = INT64_MIN;
        int64_t a = 0, j = 0, dup = 0, x = kp[0], y = ad[0];
        int64_t ab = n_add - 1, jb = nk - 1, xb = kp[jb], yb = ad[ab];
        int64_t half = cnt >> 1;
        for (int64_t m = 0; m < half; m++) {
            int64_t xn = kp[j + 1], yn = ad[a + 1], xbn = kp[jb - 1], ybn = ad[ab - 1];
            int take = y < x, takeb = yb > xb;
            dup |= (x == y) | (xb == yb);
            cur[m] = take ? y : x;
            cur[cnt - 1 - m] = takeb ? yb : xb;
            x = take ? x : xn;
            y = take ? yn : y;
            xb = takeb ? xb : xbn;
            yb = takeb ? ybn : yb;
            a += take;
            j += !take;
            ab -= takeb;
            jb -= !takeb;
        }
        if (cnt & 1) { /* the middle one */
            dup |= x == y;
            cur[half] = y < x ? y : x;
        }
        if (dup) return DECODE_INCONSISTENT;
        d->cnt = cnt;
        return 0;
    }
    /* cur = merge(prev without the leavers, arrivals), ascending, no duplicates: runs of prev up
     * to the next leaver or arrival are copied whole. */
    int64_t i = 0, r = 0, m = 0;
    for (int64_t a = 0; a <= n_add; a++) {
        int64_t v = a < n_add ? d->add[a] : INT64_MAX;
        for (;;) {
            int64_t lim = r < n_rem ? d->rem[r] : prev_n, j = i;
            if (j < lim && prev[lim - 1] < v) j = lim; /* the whole run precedes v */
            else { /* first j in [i, lim) with prev[j] >= v: gallop, then bisect */
                int64_t step = 1, hi;
                while (j + step < lim && prev[j + step] < v) { j += step; step <<= 1; }
                hi = j + step < lim ? j + step : lim;
                while (j < hi) { int64_t mid = (j + hi) >> 1; if (prev[mid] < v) j = mid + 1; else hi = mid; }
            }
            memcpy(cur + m, prev + i, sizeof(int64_t) * (size_t)(j - i));
            m += j - i;
            i = j;
            if (i < lim || i == prev_n) break;
            r++; /* i is a leaver: skip it */
            i++;
        }
        if (a == n_add) break;
        if (i < prev_n && prev[i] == v) return DECODE_INCONSISTENT;
        cur[m++] = v;
    }
    d->cnt = cnt;
    return 0;
}

/* The stored order of an ordered step: row[j] = cur[rank_j]. 0 or an error as dec_step; with
 * ``seen`` (width stamps, ``stamp`` new for the step) also DECODE_BREAKS_RULE when a rank repeats. */
static int dec_ranks(decoder *d, int32_t *row, int32_t *seen, int32_t stamp)
{
    int64_t rk;
    for (int64_t j = 0; j < d->cnt; j++) {
        if (!get_varint(d->buf, d->n, &d->pos, &rk)) return DECODE_ENDS_EARLY;
        if (rk >= d->cnt) return DECODE_INCONSISTENT;
        if (seen) {
            if (seen[rk] == stamp) return DECODE_BREAKS_RULE;
            seen[rk] = stamp;
        }
        row[j] = (int32_t)d->cur[rk];
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Coding 3 (format version 3; codec_jit.decode3 is the reference). The decoder keeps the set in
 * a slot array of its own order; a step names its leavers by their places in it (a bitmap or
 * gaps), its arrivals by position gaps, ascending. Arrivals take the leavers' places (ascending),
 * extra ones go at the end, places left over below the new count take the entries at or past
 * it (codec_jit.slots_apply, the rule the writer shares). A membership bitset over positions
 * (grown with the largest arrival) refuses an arrival already held. No sorted row is needed to
 * replay the changes: coding 2's leaver ranks index one, kept by a merge a step. */

#define POS_LIMIT INT32_MAX /* positions are int32: an arrival must lie below it */

typedef struct {
    const uint8_t *buf;
    Py_ssize_t n, pos;
    int64_t width, n_prev, cnt, n_rem, n_add, ctx;
    int32_t *slots;  /* [w] the set, in the coding's order */
    int32_t *leave;  /* [w] this step's leavers' places, ascending */
    int32_t *lpos;   /* [w] their positions */
    int32_t *add;    /* [w] arrivals, ascending (add_base + 1: a sentinel word on each side) */
    int32_t *add_base, *kept_base;
    uint64_t *mem;   /* membership of positions, [mem_words] */
    int64_t mem_words;
    int32_t *srt, *srt_next; /* [w] the set sorted (dec3_sorted keeps it, for sorted rows) */
    int32_t *kept;           /* [w] dec3_sorted's scratch (kept_base + 1) */
    int64_t srt_n;
} dec3;

static void dec3_free(dec3 *d)
{
    free(d->slots); free(d->leave); free(d->lpos); free(d->add_base); free(d->mem); free(d->srt); free(d->srt_next);
    free(d->kept_base);
}

static int dec3_init(dec3 *d, const uint8_t *buf, Py_ssize_t n, int64_t width)
{
    memset(d, 0, sizeof(*d));
    d->buf = buf; d->n = n; d->width = width;
    size_t w = (size_t)(width > 0 ? width : 1);
    d->slots = (int32_t *)malloc(sizeof(int32_t) * w);
    d->leave = (int32_t *)malloc(sizeof(int32_t) * w);
    d->lpos = (int32_t *)malloc(sizeof(int32_t) * w);
    d->add_base = (int32_t *)malloc(sizeof(int32_t) * (w + 2)); /* + 2: dec3_sorted's sentinels */
    d->add = d->add_base ? d->add_base + 1 : NULL;
    d->srt = (int32_t *)malloc(sizeof(int32_t) * w);
    d->srt_next = (int32_t *)malloc(sizeof(int32_t) * w);
    d->kept_base = (int32_t *)malloc(sizeof(int32_t) * (w + 2));
    d->kept = d->kept_base ? d->kept_base + 1 : NULL;
    d->mem_words = 64;
    d->mem = (uint64_t *)calloc((size_t)d->mem_words, sizeof(uint64_t));
    if (!d->slots || !d->leave || !d->lpos || !d->add || !d->srt || !d->srt_next || !d->kept || !d->mem) {
        dec3_free(d);
        return 0;
    }
    return 1;
}

static inline int mem_has(const dec3 *d, int64_t p)
{
    return p >= 0 && (p >> 6) < d->mem_words && ((d->mem[p >> 6] >> (p & 63)) & 1);
}

/* Room for position p (below POS_LIMIT): 0 when memory runs out. */
static int mem_grow(dec3 *d, int64_t p)
{
    int64_t need = (p >> 6) + 1, words = 2 * d->mem_words > need ? 2 * d->mem_words : need;
    uint64_t *m = (uint64_t *)calloc((size_t)words, sizeof(uint64_t));
    if (!m) return 0;
    memcpy(m, d->mem, sizeof(uint64_t) * (size_t)d->mem_words);
    free(d->mem);
    d->mem = m;
    d->mem_words = words;
    return 1;
}

/* One step: 0, DECODE_ENDS_EARLY, DECODE_INCONSISTENT, DECODE_BREAKS_RULE (an arrival at or past
 * the step's ctx_len or POS_LIMIT), or -1 (memory). After it: slots[0..cnt) the set, add[0..n_add)
 * the arrivals, lpos[0..n_rem) the leavers' positions (in place order). */
static int dec3_step(dec3 *d)
{
    int64_t z, h, g;
    if (!get_varint(d->buf, d->n, &d->pos, &z)) return DECODE_ENDS_EARLY;
    d->ctx = (int64_t)((uint64_t)d->ctx + (uint64_t)((z >> 1) ^ -(z & 1)));
    if (!get_varint(d->buf, d->n, &d->pos, &h) || !get_varint(d->buf, d->n, &d->pos, &d->n_add)) return DECODE_ENDS_EARLY;
    const int64_t n_prev = d->n_prev, n_add = d->n_add, n_rem = h >> 1, ctx = d->ctx;
    if (n_rem > n_prev || n_add > d->width || n_prev - n_rem + n_add > d->width) return DECODE_INCONSISTENT;
    d->n_rem = n_rem;
    const uint8_t *buf = d->buf;
    Py_ssize_t n = d->n, q = d->pos;
    int32_t *leave = d->leave, *slots = d->slots, *lpos = d->lpos, *add = d->add;
    if (h & 1) { /* a bitmap over the places */
        int64_t nbytes = (n_prev + 7) >> 3, got = 0;
        if (q + nbytes > n) return DECODE_ENDS_EARLY;
        for (int64_t b = 0; b < nbytes; b++) {
            unsigned byte = buf[q + b];
            while (byte) {
                int64_t i = 8 * b + __builtin_ctz(byte);
                if (i >= n_prev || got >= n_rem) return DECODE_INCONSISTENT;
                leave[got++] = (int32_t)i;
                byte &= byte - 1;
            }
        }
        if (got != n_rem) return DECODE_INCONSISTENT;
        q += nbytes;
    } else {
        int64_t last = -1;
        for (int64_t r = 0; r < n_rem; r++) {
            if (!get_varint(buf, n, &q, &g)) { d->pos = q; return DECODE_ENDS_EARLY; }
            if (g >= n_prev) { d->pos = q; return DECODE_INCONSISTENT; }
            last += g + 1;
            if (last >= n_prev) { d->pos = q; return DECODE_INCONSISTENT; }
            leave[r] = (int32_t)last;
        }
    }
    /* Arrivals: gaps of one or two bytes (nearly all of them) decoded without a branch on their
     * length, which a churning step mixes at random; longer ones, and the last bytes of the
     * buffer, take get_varint. The membership table in locals (it grows only here). */
    int64_t last = -1, lim = ctx < POS_LIMIT ? ctx : POS_LIMIT, words = d->mem_words;
    uint64_t *mem = d->mem;
    for (int64_t a = 0; a < n_add; a++) {
        if (q + 2 <= n && !(buf[q] & buf[q + 1] & 0x80)) {
            uint64_t b0 = buf[q], b1 = buf[q + 1], c0 = b0 >> 7;
            g = (int64_t)((b0 & 0x7F) | (((b1 & 0x7F) << 7) & (0 - c0)));
            q += 1 + (Py_ssize_t)c0;
        } else if (!get_varint(buf, n, &q, &g)) { d->pos = q; return DECODE_ENDS_EARLY; }
        if (g >= POS_LIMIT) { d->pos = q; return DECODE_BREAKS_RULE; }
        last += g + 1;
        if (last >= lim) { d->pos = q; return DECODE_BREAKS_RULE; }
        if ((last >> 6) >= words) {
            if (!mem_grow(d, last)) { d->pos = q; return -1; }
            mem = d->mem;
            words = d->mem_words;
        }
        uint64_t bit = (uint64_t)1 << (last & 63), word = mem[last >> 6];
        if (word & bit) { d->pos = q; return DECODE_INCONSISTENT; } /* held already (a leaver too) */
        mem[last >> 6] = word | bit;
        add[a] = (int32_t)last;
    }
    d->pos = q;
    /* codec_jit.slots_apply */
    for (int64_t i = 0; i < n_rem; i++) {
        int32_t p = slots[leave[i]];
        lpos[i] = p;
        mem[p >> 6] &= ~((uint64_t)1 << (p & 63));
    }
    int64_t m = n_rem < n_add ? n_rem : n_add, cnt = n_prev - n_rem + n_add;
    for (int64_t i = 0; i < m; i++) slots[leave[i]] = add[i];
    if (n_add > n_rem) {
        memcpy(slots + n_prev, add + n_rem, sizeof(int32_t) * (size_t)(n_add - n_rem));
    } else if (n_rem > n_add) {
        int64_t qq = n_add;
        while (qq < n_rem && leave[qq] < cnt) qq++;
        int64_t j = cnt, r = qq; /* leave[r..] lie at or past cnt: skipped */
        for (int64_t i = n_add; i < qq; i++) {
            while (r < n_rem && leave[r] == j) { r++; j++; }
            slots[leave[i]] = slots[j++];
        }
    }
    d->n_prev = d->cnt = cnt;
    return 0;
}

/* The set sorted ascending (after dec3_step): the previous sorted set without the leavers (no
 * longer members: a branch-free pass over it) merged with the arrivals (branch-free, with a
 * sentinel after each input). Call it after every step, or never. */
static void dec3_sorted(dec3 *d)
{
    const int32_t *prev = d->srt;
    int32_t *kept = d->kept, *add = d->add, *out = d->srt_next;
    const uint64_t *mem = d->mem;
    int64_t nk = 0, np = d->srt_n, na = d->n_add;
    for (int64_t i = 0; i < np; i++) { /* every earlier entry lies below the bitset's size */
        int32_t p = prev[i];
        kept[nk] = p;
        nk += (mem[p >> 6] >> (p & 63)) & 1;
    }
    /* Merged from both ends at once (two independent dependency chains, the smallest half from
     * the front, the largest from the back), a sentinel beyond each end of each input: kept and
     * add have a word before them and one after (dec3_init); they hold no value in common. */
    kept[-1] = add[-1] = INT32_MIN;
    kept[nk] = add[na] = INT32_MAX;
    const int32_t *x = kept, *y = add, *xb = kept + nk - 1, *yb = add + na - 1;
    int64_t total = nk + na, half = total >> 1;
    for (int64_t m = 0; m < half; m++) {
        int32_t a = *x, b = *y, ab = *xb, bb = *yb;
        int take = b < a, takeb = bb > ab;
        out[m] = take ? b : a;
        out[total - 1 - m] = takeb ? bb : ab;
        x += !take;
        y += take;
        xb -= !takeb;
        yb -= takeb;
    }
    if (total & 1) out[half] = *y < *x ? *y : *x; /* the middle one */
    d->srt_next = d->srt;
    d->srt = out;
    d->srt_n = total;
}

/* Both codings behind one interface, for the callers that want rows or changes. */
typedef struct {
    int coding;
    decoder v2;
    dec3 v3;
} any_dec;

static int any_init(any_dec *d, int coding, const uint8_t *buf, Py_ssize_t n, int64_t width)
{
    d->coding = coding;
    return coding == 3 ? dec3_init(&d->v3, buf, n, width) : dec_init(&d->v2, buf, n, width);
}

static void any_free(any_dec *d)
{
    if (d->coding == 3) dec3_free(&d->v3);
    else { free(d->v2.work); free(d->v2.gone); }
}

static inline Py_ssize_t any_pos(const any_dec *d) { return d->coding == 3 ? d->v3.pos : d->v2.pos; }
static inline int64_t any_ctx(const any_dec *d) { return d->coding == 3 ? d->v3.ctx : d->v2.ctx; }
static inline int64_t any_cnt(const any_dec *d) { return d->coding == 3 ? d->v3.cnt : d->v2.cnt; }

/* A step's row: ordered, the stored order (ranks read here; a repeated rank is
 * DECODE_BREAKS_RULE when ``seen`` is given, with a new ``stamp``); else sorted ascending. The
 * largest entry in *top. Coding 3 keeps its sorted set only when ``sorted`` asks. */
static int any_row(any_dec *d, int ordered, int32_t *row, int32_t *seen, int32_t stamp, int64_t *top)
{
    if (d->coding != 3) {
        decoder *v = &d->v2;
        *top = !v->cnt ? -1 : v->cur[0] < 0 ? INT64_MAX : v->cur[v->cnt - 1]; /* a negative entry: past any ctx */
        if (ordered) return dec_ranks(v, row, seen, stamp);
        for (int64_t j = 0; j < v->cnt; j++) row[j] = (int32_t)v->cur[j];
        return 0;
    }
    dec3 *v = &d->v3;
    if (ordered) {
        int64_t rk, hi = -1;
        for (int64_t j = 0; j < v->cnt; j++) {
            if (!get_varint(v->buf, v->n, &v->pos, &rk)) return DECODE_ENDS_EARLY;
            if (rk >= v->cnt) return DECODE_INCONSISTENT;
            if (seen) {
                if (seen[rk] == stamp) return DECODE_BREAKS_RULE;
                seen[rk] = stamp;
            }
            row[j] = v->slots[rk];
            hi = row[j] > hi ? row[j] : hi;
        }
        *top = hi;
        return 0;
    }
    dec3_sorted(v);
    memcpy(row, v->srt, sizeof(int32_t) * (size_t)v->srt_n);
    *top = v->srt_n ? v->srt[v->srt_n - 1] : -1;
    return 0;
}

static inline int any_step(any_dec *d) { return d->coding == 3 ? dec3_step(&d->v3) : dec_step(&d->v2); }

/* Returns 0, or a DECODE_* code (ends early, inconsistent, trailing bytes; coding 3 also breaks
 * a rule) with *err_step, or -1 (memory). */
static int decode_steps(const uint8_t *buf, Py_ssize_t n, int64_t steps, int64_t width, int ordered, int coding,
                        int32_t *out, int64_t out_width, int64_t *ctx_out, int64_t *err_step)
{
    any_dec d;
    if (!any_init(&d, coding, buf, n, width))
        return -1;
    int code = 0;
    int64_t t, top;
    for (t = 0; t < steps; t++) {
        int32_t *row = out + t * out_width;
        code = any_step(&d);
        if (!code) code = any_row(&d, ordered, row, NULL, 0, &top);
        if (code) break;
        ctx_out[t] = any_ctx(&d);
        for (int64_t j = any_cnt(&d); j < out_width; j++) row[j] = -1;
    }
    if (!code && any_pos(&d) != n) { code = DECODE_TRAILING_BYTES; t = steps; }
    any_free(&d);
    *err_step = code ? t : 0;
    return code;
}

/* decode_steps with the rules of the trace model checked as the coded replays check them
 * (decode_changes): ctx_len positive, never going down and below INT32_MAX, at most k entries,
 * every entry below its ctx_len, an ordered step's ranks a permutation. A decoded step is free
 * of repeats by construction, so these O(1)-a-step checks are what check_rows would find.
 * Returns 0, a DECODE_* code (DECODE_BREAKS_RULE for a broken rule) with *err_step, or -1
 * (memory); *accesses counts the entries. */
static int decode_rows_checked(const uint8_t *buf, Py_ssize_t n, int64_t steps, int64_t width, int ordered, int coding,
                               int64_t k, int64_t prev_ctx, int32_t *out, int64_t out_width, int64_t *ctx_out,
                               int64_t *accesses, int64_t *err_step)
{
    any_dec d;
    if (!any_init(&d, coding, buf, n, width)) return -1;
    int32_t *seen = ordered ? (int32_t *)calloc((size_t)(width > 0 ? width : 1), sizeof(int32_t)) : NULL;
    int code = 0;
    int64_t t, acc = 0, top;
    if (ordered && !seen) { any_free(&d); return -1; }
    for (t = 0; t < steps; t++) {
        int32_t *row = out + t * out_width;
        code = any_step(&d);
        if (code) break;
        int64_t c = any_ctx(&d), cnt = any_cnt(&d);
        if (c < 1 || c < prev_ctx || c >= INT32_MAX || cnt > k || cnt > out_width) { code = DECODE_BREAKS_RULE; break; }
        if ((code = any_row(&d, ordered, row, seen, (int32_t)(t + 1), &top))) break;
        if (top >= c) { code = DECODE_BREAKS_RULE; break; }
        for (int64_t j = cnt; j < out_width; j++) row[j] = -1;
        ctx_out[t] = c;
        prev_ctx = c;
        acc += cnt;
    }
    if (!code && any_pos(&d) != n) { code = DECODE_TRAILING_BYTES; t = steps; }
    any_free(&d);
    free(seen);
    *accesses = acc;
    *err_step = code ? t : 0;
    return code;
}

/* First problem of a stream as (code, step, value, extra); code 0 when none (ROW_* codes). */
static int check_rows(const int32_t *idx, int64_t steps, int64_t width, const int64_t *ctx, int64_t k,
                      int64_t res[4])
{
    /* seen[] is indexed only by positions that passed v < ctx: sized by the largest position,
     * not by ctx (a 3-step stream at ctx 5e9 asked for a 40 GB table), as codec_jit.check_rows */
    int64_t cmax = 1, vmax = 0;
    for (int64_t t = 0; t < steps; t++)
        if (ctx[t] > cmax) cmax = ctx[t];
    for (int64_t i = 0; i < steps * width; i++)
        if ((int64_t)idx[i] + 1 > vmax) vmax = (int64_t)idx[i] + 1;
    int64_t size = vmax > 0 ? (vmax < cmax ? vmax : cmax) : 1;
    int64_t *seen = (int64_t *)calloc((size_t)size, sizeof(int64_t));
    if (!seen)
        return -1;
    res[0] = res[1] = res[2] = res[3] = 0;
    for (int64_t t = 0; t < steps; t++) {
        int64_t c = ctx[t];
        if (c < 1) { res[0] = ROW_CTX_NOT_POSITIVE; res[1] = t; res[2] = c; goto done; }
        if (t > 0 && c < ctx[t - 1]) { res[0] = ROW_CTX_DOWN; res[1] = t; res[2] = c; res[3] = ctx[t - 1]; goto done; }
        int64_t cnt = 0;
        int padded = 0;
        const int32_t *row = idx + t * width;
        for (int64_t j = 0; j < width; j++) {
            int64_t v = row[j];
            if (v == -1) { padded = 1; continue; }
            if (v < 0) { res[0] = ROW_NEGATIVE; res[1] = t; res[2] = v; goto done; }
            if (padded) { res[0] = ROW_PAD_BEFORE_ENTRY; res[1] = t; res[2] = v; goto done; }
            if (v >= c) { res[0] = ROW_OUT_OF_RANGE; res[1] = t; res[2] = v; res[3] = c; goto done; }
            if (seen[v] == t + 1) { res[0] = ROW_REPEATED; res[1] = t; res[2] = v; goto done; }
            seen[v] = t + 1;
            cnt++;
        }
        if (cnt > k) { res[0] = ROW_TOO_MANY; res[1] = t; res[2] = cnt; res[3] = k; goto done; }
    }
done:
    free(seen);
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Batched LRU in O(changes) per step.
 *
 * The reference keeps the recency list and, each step, walks it to move the hits (old order)
 * behind the misses. After a step the list is [stale][misses][hits]: its newest part, the
 * "block", is exactly the step's selected set X (the newest token excluded when reserved). So
 * at the next step, with A = newly selected entries and D = entries of X no longer selected:
 *   - entries of X that stay selected ("kept") are hits, with no work at all;
 *   - an entry of A is a hit iff it is resident, and then it is stale ("stale hit");
 *   - victims are the oldest stale entries not hit, then D in block order (D sits between the
 *     stale part and the kept entries);
 *   - the new block is misses (stored order), stale hits (stale order), kept (block order).
 * Stale entries live in a FIFO queue: a ring of slots in push order with lazy deletion (the
 * entry at push count q is live while its slot is STALE with skey == q; a stale hit only turns
 * its slot BLOCK, and the head sweeps past dead entries when victims are taken, branch-free; a
 * full ring compacts its live entries). Stale hits are put in stale order by a bitmap over
 * their keys' span, which the ring bounds. The block is an array of slots in block order
 * (oldest first); one branch-free pass over it splits D (in block order, to the queue) from the
 * kept entries (to the new block's newest end). A step costs O(|A| + |X| + span / 64) once A
 * and D are known: from the coded stream's own changes (decode_changes, lru_apply_changes),
 * or from a pass over the row and the block (lru_rows). */

enum { FREE = 0, STALE = 1, BLOCK = 2, DROPPED = 3 }; /* DROPPED: in the block, leaving it this step */
enum { STEP_OK = 0, STEP_FULL = -2, STEP_NOMEM = -1, STEP_RANGE = -3 };

typedef struct {
    int64_t B, cap, Q;
    int reserve, prefix, fast, started;
    int32_t *pos;       /* [cap] slot holding each position, -1 (a position is in X iff its slot is BLOCK) */
    int32_t *prow;      /* [cap] stamp of the last row listing the position (lru_row) */
    int32_t *slot_pos;  /* [B] position held by a slot, -1 */
    uint8_t *region;    /* [B] FREE, STALE or BLOCK */
    int64_t *skey;      /* [B] push count of a stale slot: ascending = queue order */
    int32_t *ring;      /* [qmask + 1] the stale queue's slots by push count (mod its size), oldest first */
    int64_t qmask, qhead, qseq; /* pushes in [qhead, qseq) are in the ring, live or dead */
    int32_t *victims;   /* [B + 2] scratch */
    int32_t *blk, *blk_next, nb; /* [B + 2] X, the last step's selected set, as slots in block order */
    int32_t *A;         /* [B + 2] scratch: a step's arrivals */
    int64_t *miss;      /* [B + 2] scratch */
    int32_t *hit_s;     /* [B + 2] */
    int64_t *hkey;      /* [B + 2] scratch: the stale hits' keys */
    uint64_t *bits;     /* [ring size / 64]: ordering the stale hits (their keys span less than the ring) */
    int64_t free_next, last_ctx;
    int32_t stamp;
} lru_state;

static void lru_free(lru_state *s)
{
    if (!s) return;
    free(s->pos); free(s->prow); free(s->slot_pos); free(s->region); free(s->skey); free(s->ring); free(s->victims);
    free(s->blk); free(s->blk_next); free(s->A); free(s->miss); free(s->hit_s); free(s->hkey); free(s->bits);
    free(s);
}

static lru_state *lru_new(int64_t B, int reserve, int prefix)
{
    lru_state *s = (lru_state *)calloc(1, sizeof(lru_state));
    if (!s) return NULL;
    size_t n = (size_t)B + 2;
    s->B = B; s->reserve = reserve; s->prefix = prefix;
    s->slot_pos = (int32_t *)malloc(sizeof(int32_t) * n);
    s->region = (uint8_t *)calloc(n, 1);
    s->skey = (int64_t *)calloc(n, sizeof(int64_t));
    s->qmask = 1;
    while (s->qmask < 4 * (int64_t)n) s->qmask <<= 1; /* room for B live entries and >= 3 B dead ones */
    s->ring = (int32_t *)malloc(sizeof(int32_t) * (size_t)s->qmask);
    s->qmask -= 1;
    s->victims = (int32_t *)malloc(sizeof(int32_t) * n);
    s->blk = (int32_t *)malloc(sizeof(int32_t) * n);
    s->blk_next = (int32_t *)malloc(sizeof(int32_t) * n);
    s->A = (int32_t *)malloc(sizeof(int32_t) * n);
    s->miss = (int64_t *)malloc(sizeof(int64_t) * n);
    s->hit_s = (int32_t *)malloc(sizeof(int32_t) * n);
    s->hkey = (int64_t *)malloc(sizeof(int64_t) * n);
    s->bits = (uint64_t *)malloc(sizeof(uint64_t) * (size_t)((s->qmask + 64) / 64));
    if (!s->hkey || !s->bits || !s->slot_pos || !s->region || !s->skey || !s->ring || !s->victims || !s->blk || !s->blk_next || !s->A ||
        !s->miss || !s->hit_s) {
        lru_free(s);
        return NULL;
    }
    for (int64_t x = 0; x < B; x++) s->slot_pos[x] = -1;
    return s;
}

/* Back to the state lru_new gives, keeping the position tables' memory (and the stamps, which
 * only grow): the next stream starts without allocating and touching fresh pages. */
static void lru_reset(lru_state *s)
{
    for (int64_t x = 0; x < s->B; x++) {
        if (s->slot_pos[x] >= 0) s->pos[s->slot_pos[x]] = -1;
        s->slot_pos[x] = -1;
        s->region[x] = FREE;
    }
    s->started = s->fast = 0;
    s->nb = 0;
    s->qhead = s->qseq = 0;
    s->free_next = s->last_ctx = 0;
}

/* Room for positions [0, c). */
static int lru_reserve(lru_state *s, int64_t c)
{
    if (c <= s->cap) return 1;
    int64_t cap = c > 2 * s->cap ? c : 2 * s->cap;
    int32_t *p = (int32_t *)realloc(s->pos, sizeof(int32_t) * (size_t)cap);
    if (!p) return 0;
    s->pos = p;
    int32_t *q = (int32_t *)realloc(s->prow, sizeof(int32_t) * (size_t)cap);
    if (!q) return 0;
    s->prow = q;
    for (int64_t i = s->cap; i < cap; i++) { p[i] = -1; q[i] = 0; }
    s->cap = cap;
    return 1;
}

/* The ring's live entries moved together at its head, in order, with new push counts (the
 * relative order of every live key is kept): room for B more pushes. */
static void queue_compact(lru_state *s)
{
    int64_t w = s->qhead, mask = s->qmask;
    for (int64_t q = s->qhead; q < s->qseq; q++) {
        int32_t x = s->ring[q & mask];
        if (s->region[x] == STALE && s->skey[x] == q) { s->ring[w & mask] = x; s->skey[x] = w++; }
    }
    s->qseq = w;
}

static inline void queue_push(lru_state *s, int32_t slot)
{
    if (s->qseq - s->qhead > s->qmask) queue_compact(s);
    s->region[slot] = STALE;
    s->ring[s->qseq & s->qmask] = slot;
    s->skey[slot] = s->qseq++;
}

enum { BEGIN_FAST = 0, BEGIN_FRESH = 1, BEGIN_NEXT = 2 };

/* The engine's step preamble: the fast path while ctx <= B; a fresh buffer (empty, or positions
 * [0, B) oldest first) on the first step past it. */
static int lru_begin(lru_state *s, int64_t c)
{
    if (c <= s->B) { s->fast = 1; return BEGIN_FAST; }
    if (s->started && !s->fast) return BEGIN_NEXT;
    for (int64_t x = 0; x < s->B; x++) {
        if (s->slot_pos[x] >= 0) s->pos[s->slot_pos[x]] = -1;
        s->slot_pos[x] = -1;
        s->region[x] = FREE;
    }
    s->nb = 0;
    s->qhead = s->qseq = 0; /* every slot FREE: every entry dead */
    s->free_next = 0;
    if (s->prefix || s->fast) {
        for (int64_t p = 0; p < s->B; p++) {
            s->slot_pos[p] = (int32_t)p;
            s->pos[p] = (int32_t)p;
            queue_push(s, (int32_t)p);
        }
        s->free_next = s->B;
    }
    s->started = 1;
    s->fast = 0;
    return BEGIN_FRESH;
}

/* One step from its changes: A (nA positions, stored order) and D (nD block slots already marked
 * DROPPED); returns the misses. */
static int64_t lru_apply(lru_state *s, const int32_t *A, int64_t nA, int64_t nD)
{
    /* Everything in locals: the int stores below could alias the state's int fields. */
    const int32_t B = (int32_t)s->B;
    int32_t *pos = s->pos, *slot_pos = s->slot_pos, *ring = s->ring, *hit_s = s->hit_s;
    uint8_t *region = s->region;
    int64_t *skey = s->skey, *miss = s->miss, qseq = s->qseq, free_next = s->free_next, nb = s->nb;
    int64_t nhs = 0, nm = 0;
    for (int64_t i = 0; i < nA; i++) { /* hit or miss is a coin toss here: no branch */
        int64_t p = A[i];
        int32_t x = pos[p];
        int hit = x >= 0;
        hit_s[nhs] = x;
        miss[nm] = p;
        nhs += hit;
        nm += !hit;
    }
    /* Stale hits leave the queue (their entries die) and take their places in the new block in
     * stale order (ascending skey; push counts are distinct), ordered now, while the ring still
     * holds them: a bitmap over the keys' span, read in order (live keys lie in [qhead, qseq),
     * which the ring's size bounds). */
    int64_t *hkey = s->hkey, lo = INT64_MAX, hi = INT64_MIN;
    for (int64_t i = 0; i < nhs; i++) {
        int32_t x = hit_s[i];
        int64_t key = skey[x];
        region[x] = BLOCK;
        hkey[i] = key;
        lo = key < lo ? key : lo;
        hi = key > hi ? key : hi;
    }
    if (nhs > 1) {
        int32_t *out = s->blk_next + nm;
        int64_t words = ((hi - lo) >> 6) + 1, mask = s->qmask;
        uint64_t *bits = s->bits;
        memset(bits, 0, sizeof(uint64_t) * (size_t)words);
        for (int64_t i = 0; i < nhs; i++) {
            int64_t off = hkey[i] - lo;
            bits[off >> 6] |= (uint64_t)1 << (off & 63);
        }
        for (int64_t w = 0; w < words; w++)
            for (uint64_t b = bits[w]; b; b &= b - 1) *out++ = ring[(lo + (w << 6) + __builtin_ctzll(b)) & mask];
    } else if (nhs == 1) {
        s->blk_next[nm] = hit_s[0];
    }
    /* The new block: misses (stored order), stale hits (stale order), kept (block order). One
     * pass over the old block puts the kept entries in place and the dropped ones, in block
     * order, at the young end of the queue. */
    int32_t *blk = s->blk, *next = s->blk_next, *kept = next + nm + nhs, *drop = hit_s + nhs;
    if (nD) {
        int64_t nk = 0, nd = 0;
        for (int64_t i = 0; i < nb; i++) {
            int32_t x = blk[i];
            int gone = region[x] == DROPPED;
            kept[nk] = x;
            drop[nd] = x;
            nk += !gone;
            nd += gone;
        }
        if (qseq + nd - s->qhead > s->qmask + 1) { s->qseq = qseq; queue_compact(s); qseq = s->qseq; }
        const int64_t mask = s->qmask;
        for (int64_t i = 0; i < nd; i++) { /* queue_push */
            int32_t x = drop[i];
            region[x] = STALE;
            ring[qseq & mask] = x;
            skey[x] = qseq++;
        }
    } else {
        memcpy(kept, blk, sizeof(int32_t) * (size_t)nb);
    }
    /* Victims: free slots first (slot order), then the oldest live stale entries, taken by one
     * branch-free sweep of the ring's head (the queue holds B - |X| >= 1 live entries here). */
    int64_t nfree = B - free_next < nm ? B - free_next : nm, need = nm - nfree;
    int32_t *victims = s->victims;
    if (need > 0) {
        const int64_t mask = s->qmask;
        int64_t q = s->qhead, nv = 0, end = qseq;
        while (nv < need && q < end) {
            int32_t x = ring[q & mask];
            victims[nv] = x;
            nv += (region[x] == STALE) & (skey[x] == q);
            q++;
        }
        if (nv < need) return STEP_FULL; /* cannot happen: |X| <= B leaves B - |X| >= need live */
        s->qhead = q;
    }
    for (int64_t i = 0; i < nm; i++) {
        int64_t p = miss[i];
        int32_t x;
        if (i < nfree) x = (int32_t)free_next++;
        else {
            x = victims[i - nfree];
            pos[slot_pos[x]] = -1;
        }
        slot_pos[x] = (int32_t)p;
        pos[p] = x;
        region[x] = BLOCK;
        next[i] = x;
    }
    s->qseq = qseq;
    s->free_next = free_next;
    s->blk_next = blk;
    s->blk = next;
    s->nb = nb - nD + nA;
    return nm;
}

/* One step of a row in stored order (-1 pads): A and D from a pass over the row and the block. */
static int64_t lru_row(lru_state *s, const int32_t *row, int64_t width, int64_t c)
{
    int32_t cur = ++s->stamp;
    int64_t n = 0, nA = 0, nD = 0;
    for (int64_t j = 0; j < width; j++) {
        int64_t p = row[j];
        if (p < 0) break;
        if (s->reserve && p == c - 1) continue;
        if (p >= s->cap) return STEP_RANGE;
        if (n++ >= s->B) return STEP_FULL;
        s->prow[p] = cur;
        int32_t x = s->pos[p];
        if (x < 0 || s->region[x] != BLOCK) s->A[nA++] = (int32_t)p;
    }
    for (int64_t i = 0; i < s->nb; i++) {
        int32_t x = s->blk[i];
        if (s->prow[s->slot_pos[x]] != cur) { s->region[x] = DROPPED; nD++; }
    }
    return lru_apply(s, s->A, nA, nD);
}

static inline int sorted_has(const int64_t *a, int64_t n, int64_t v)
{
    int64_t lo = 0, hi = n;
    while (lo < hi) { int64_t mid = (lo + hi) / 2; if (a[mid] < v) lo = mid + 1; else hi = mid; }
    return lo < n && a[lo] == v;
}

static inline int sorted_has32(const int32_t *a, int64_t n, int32_t v)
{
    int64_t lo = 0, hi = n;
    while (lo < hi) { int64_t mid = (lo + hi) / 2; if (a[mid] < v) lo = mid + 1; else hi = mid; }
    return lo < n && a[lo] == v;
}

/* Final slot -> position and recency order (oldest first); returns the order's length. */
static int64_t lru_result(lru_state *s, int64_t *slot_pos, int64_t *order)
{
    for (int64_t x = 0; x < s->B; x++) slot_pos[x] = s->slot_pos[x];
    if (!s->started) return 0;
    int64_t n = 0;
    for (int64_t q = s->qhead; q < s->qseq; q++) {
        int32_t x = s->ring[q & s->qmask];
        if (s->region[x] == STALE && s->skey[x] == q) order[n++] = x;
    }
    for (int64_t i = 0; i < s->nb; i++) order[n++] = s->blk[i];
    return n;
}

/* Rows [steps, width] through one state. 0, or STEP_FULL / STEP_NOMEM with *bad_step. */
static int lru_rows(lru_state *s, const int32_t *idx, int64_t steps, int64_t width, const int64_t *ctx,
                    int64_t *misses, int record, int32_t *slots, int64_t *bad_step)
{
    for (int64_t t = 0; t < steps; t++) {
        const int32_t *row = idx + t * width;
        int64_t c = ctx[t], m = 0;
        *bad_step = t;
        if (!lru_reserve(s, c)) return STEP_NOMEM;
        if (lru_begin(s, c) != BEGIN_FAST) {
            m = lru_row(s, row, width, c);
            if (m < 0) return (int)m;
        }
        misses[t] = m;
        s->last_ctx = c;
        if (record)
            for (int64_t j = 0; j < width; j++) {
                int64_t p = row[j];
                slots[t * width + j] = p < 0 ? -1 : (s->reserve && p == c - 1 ? (int32_t)s->B
                                                     : (c <= s->B ? (int32_t)p : s->pos[p]));
            }
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* A coded stream replayed in two halves that can run on two threads: decode_changes turns a
 * coded chunk into each step's changes as positions, checked as TraceReader.read checks the
 * rows (the rules of the trace model), into a changes buffer; lru_apply_changes replays a buffer
 * through the states. Decoding chunk i + 1 while chunk i replays gives the misses of replaying
 * the rows, bit for bit (tests/test_native.py); with one CPU the halves run in turn.
 *
 * A buffer is int32 words, per step: flags, cnt (entries in the step), n_add, n_rem, then n_add
 * positions and n_rem positions. CH_FULL: the positions are the whole row (sorted, or in stored
 * order for an ordered chunk, whose every step is full: its misses follow the stored order), for
 * a step that some state replays from its row (a chunk's first step, where the decoder has no
 * previous row; the step where a buffer's ctx first exceeds its B). Otherwise arrivals ascending,
 * leavers in any order but the previous step's newest position, if it left, last. CH_OLD_BOTH:
 * the previous step's newest position stays selected past it; CH_NW_IN: the newest position is
 * selected (for reserved buffers: X = the row without the newest). */

enum { CH_FULL = 1, CH_OLD_BOTH = 2, CH_NW_IN = 4 };
enum { CH_HEAD = 4 };
enum { STEP_NOROW = -4 };

typedef struct {
    int32_t *w;
    int64_t cap, steps; /* steps: of the last clean decode, 0 after a failed one */
} changes_t;

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static int decode_changes(changes_t *ch, const uint8_t *buf, Py_ssize_t n, int64_t steps, int64_t width, int ordered,
                          int coding, int64_t k, int64_t prev_ctx, const int64_t *Bs, int64_t nbs, int64_t *ctx_out,
                          int64_t *accesses, int64_t *bad_step)
{
    int64_t w = width > 0 ? width : 1, most = CH_HEAD + 2 * w; /* the most words one step takes */
    ch->steps = 0;
    *accesses = 0;
    *bad_step = 0;
    any_dec d;
    if (!any_init(&d, coding, buf, n, width)) return STEP_NOMEM;
    int32_t *seen = ordered ? (int32_t *)calloc((size_t)w, sizeof(int32_t)) : NULL;
    if (ordered && !seen) { any_free(&d); return STEP_NOMEM; }
    int32_t *out = ch->w;
    int code = 0;
    int64_t t, acc = 0, top;
    for (t = 0; t < steps; t++) {
        int64_t used = out - ch->w;
        if (used + most > ch->cap) { /* grown as the steps need it: a step rarely changes all of k */
            int64_t cap = 2 * ch->cap > used + most ? 2 * ch->cap : used + most + steps * CH_HEAD;
            int32_t *p = (int32_t *)realloc(ch->w, sizeof(int32_t) * (size_t)cap);
            if (!p) { code = STEP_NOMEM; break; }
            ch->w = p;
            ch->cap = cap;
            out = p + used;
        }
        code = any_step(&d);
        if (code) { code = code < 0 ? STEP_NOMEM : code; break; }
        int64_t c = any_ctx(&d), cnt = any_cnt(&d);
        if (c < 1 || c < prev_ctx || c >= INT32_MAX || cnt > k) { code = DECODE_BREAKS_RULE; break; }
        int full = t == 0 || ordered; /* or the first step past some buffer's B (lru_begin: BEGIN_FRESH) */
        for (int64_t i = 0; i < nbs && !full; i++) full = prev_ctx <= Bs[i] && Bs[i] < c;
        int64_t old = prev_ctx - 1, nw = c - 1;
        int32_t *head = out;
        out += CH_HEAD;
        if (full) {
            if (ordered || coding != 3) { /* the row as any_row gives it */
                if ((code = any_row(&d, ordered, out, seen, (int32_t)(t + 1), &top))) break;
            } else { /* coding 3 keeps no sorted set: sorted here, on a chunk's first step (its
                      * arrivals, already ascending) or once a buffer passes its size */
                memcpy(out, d.v3.slots, sizeof(int32_t) * (size_t)cnt);
                if (t > 0) qsort(out, (size_t)cnt, sizeof(int32_t), cmp_i32);
                top = cnt ? out[cnt - 1] : -1;
            }
            if (top >= c) { code = DECODE_BREAKS_RULE; break; }
            out += cnt;
            head[0] = CH_FULL; head[1] = (int32_t)cnt; head[2] = (int32_t)cnt; head[3] = 0;
        } else if (coding != 3) {
            decoder *v = &d.v2;
            if (cnt && (v->cur[0] < 0 || v->cur[cnt - 1] >= c)) { code = DECODE_BREAKS_RULE; break; }
            int32_t flags = 0;
            if (nw != old && sorted_has(v->prev, v->prev_n, old) && sorted_has(v->cur, v->cnt, old)) flags |= CH_OLD_BOTH;
            if (sorted_has(v->cur, v->cnt, nw)) flags |= CH_NW_IN;
            const int64_t *add = v->add, *rem = v->rem, *prev = v->prev;
            int64_t na = v->n_add, nr = v->n_rem;
            for (int64_t a = 0; a < na; a++) out[a] = (int32_t)add[a];
            out += na;
            for (int64_t r = 0; r < nr; r++) out[r] = (int32_t)prev[rem[r]]; /* ascending: old, if there, last */
            out += nr;
            head[0] = flags; head[1] = (int32_t)cnt; head[2] = (int32_t)na; head[3] = (int32_t)nr;
        } else {
            dec3 *v = &d.v3;
            int64_t na = v->n_add, nr = v->n_rem;
            memcpy(out, v->add, sizeof(int32_t) * (size_t)na); /* every arrival lies below c */
            int old_arrived = na > 0 && v->add[na - 1] >= old && sorted_has32(v->add, na, (int32_t)old);
            out += na;
            int64_t m = 0, old_left = 0;
            for (int64_t r = 0; r < nr; r++) { /* old, if it left, goes last */
                int32_t p = v->lpos[r];
                out[m] = p;
                int is_old = p == old;
                m += !is_old;
                old_left |= is_old;
            }
            if (old_left) out[m++] = (int32_t)old;
            out += nr;
            int32_t flags = 0;
            if (nw != old && mem_has(v, old) && !old_arrived) flags |= CH_OLD_BOTH;
            if (mem_has(v, nw)) flags |= CH_NW_IN;
            head[0] = flags; head[1] = (int32_t)cnt; head[2] = (int32_t)na; head[3] = (int32_t)nr;
        }
        ctx_out[t] = c;
        acc += cnt;
        prev_ctx = c;
    }
    if (!code && any_pos(&d) != n) code = DECODE_TRAILING_BYTES;
    any_free(&d);
    free(seen);
    ch->steps = code ? 0 : steps;
    *accesses = acc;
    *bad_step = t;
    return code;
}

/* One step from a changes buffer, when X is the previous row (the newest excluded when
 * reserved: X' = R' - {nw}, X = R - {old}; the old newest joins A if it stays selected past it).
 * Arrivals ascend below c, so the newest position, if it arrived, is the last arrival; the old
 * newest, if it left, is the last leaver (decode_changes puts it there): both are cut from the
 * ends, and the arrivals replay in place unless the old newest joins them. */
static int64_t lru_delta_changes(lru_state *s, int32_t flags, int64_t cnt, const int32_t *add, int64_t na,
                                 const int32_t *rem, int64_t nr, int64_t c)
{
    int64_t nw = c - 1, old = s->last_ctx - 1;
    int32_t *pos = s->pos;
    uint8_t *region = s->region;
    if (s->reserve) {
        if (cnt - ((flags & CH_NW_IN) ? 1 : 0) > s->B) return STEP_FULL;
        na -= na > 0 && add[na - 1] == nw;
        nr -= nr > 0 && rem[nr - 1] == old;
        if (flags & CH_OLD_BOTH) { /* old among the arrivals, in order (it is none of them) */
            int64_t lo = 0, hi = na;
            while (lo < hi) { int64_t md = (lo + hi) >> 1; if (add[md] < old) lo = md + 1; else hi = md; }
            int32_t *A = s->A;
            memcpy(A, add, sizeof(int32_t) * (size_t)lo);
            A[lo] = (int32_t)old;
            memcpy(A + lo + 1, add + lo, sizeof(int32_t) * (size_t)(na - lo));
            add = A;
            na++;
        }
    } else if (cnt > s->B) return STEP_FULL;
    for (int64_t r = 0; r < nr; r++) region[pos[rem[r]]] = DROPPED;
    return lru_apply(s, add, na, nr);
}

/* A changes buffer through several states. 0, or STEP_FULL /
 * STEP_NOMEM / STEP_NOROW (a buffer decoded for other buffers' B) with *bad_step. */
static int lru_apply_changes(lru_state **st, int64_t ns, const changes_t *ch, int64_t steps, const int64_t *ctx,
                             int64_t **misses, int64_t *bad_step)
{
    const int32_t *r = ch->w;
    for (int64_t t = 0; t < steps; t++) {
        int32_t flags = r[0];
        int64_t cnt = r[1], na = r[2], nr = r[3], c = ctx[t];
        const int32_t *add = r + CH_HEAD, *rem = add + na;
        *bad_step = t;
        for (int64_t i = 0; i < ns; i++) {
            lru_state *s = st[i];
            int64_t m = 0;
            if (!lru_reserve(s, c)) return STEP_NOMEM;
            int how = lru_begin(s, c);
            if (how == BEGIN_FAST) m = 0;
            else if (flags & CH_FULL) m = lru_row(s, add, cnt, c);
            else if (how == BEGIN_NEXT) m = lru_delta_changes(s, flags, cnt, add, na, rem, nr, c);
            else return STEP_NOROW;
            if (m < 0) return (int)m;
            misses[i][t] = m;
            s->last_ctx = c;
        }
        r = rem + nr;
    }
    return 0;
}


/* ------------------------------------------------------------------------------------------ */
/* Sequential LRU over rows: step.run's sequential branch with policies/lru.py, bit for bit    */
/* (tests/test_native.py): one access at a time in stored order; a hit moves its slot to the   */
/* most recent end, a miss takes a free slot (slot order) while any is left, else the least     */
/* recent one. The same step preamble as the batched engine (fast path while ctx <= B, then a   */
/* fresh buffer: empty, or positions [0, B) oldest first), the newest token reserved or not.    */

static int lru_seq_rows(const int32_t *idx, int64_t steps, int64_t width, const int64_t *ctx, int64_t B, int reserve,
                        int prefix, int64_t *misses, int record, int32_t *slots, int64_t *slot_pos_out,
                        int64_t *order_out, int64_t *n_order, int64_t *bad)
{
    int64_t cmax = 1;
    for (int64_t t = 0; t < steps; t++) cmax = ctx[t] > cmax ? ctx[t] : cmax;
    int32_t *pos = (int32_t *)malloc(sizeof(int32_t) * (size_t)cmax);
    int32_t *sp = (int32_t *)malloc(sizeof(int32_t) * (size_t)B);
    int32_t *prv = (int32_t *)malloc(sizeof(int32_t) * (size_t)(B + 1));
    int32_t *nxt = (int32_t *)malloc(sizeof(int32_t) * (size_t)(B + 1));
    if (!pos || !sp || !prv || !nxt) { free(pos); free(sp); free(prv); free(nxt); return STEP_NOMEM; }
    const int32_t H = (int32_t)B; /* the list head: nxt[H] is the least recent slot */
    for (int64_t p = 0; p < cmax; p++) pos[p] = -1;
    for (int64_t x = 0; x < B; x++) sp[x] = -1;
    prv[H] = nxt[H] = H;
    int64_t free_next = 0;
    int fast = 0, started = 0;
    for (int64_t t = 0; t < steps; t++) {
        const int64_t c = ctx[t];
        const int32_t *row = idx + t * width;
        if (c <= B) {
            misses[t] = 0;
            fast = 1;
            if (record)
                for (int64_t j = 0; j < width; j++) {
                    int32_t p = row[j];
                    slots[t * width + j] = p < 0 ? -1 : (reserve && p == c - 1 ? (int32_t)B : p);
                }
            continue;
        }
        if (!started || fast) {
            for (int64_t x = 0; x < B; x++) { if (sp[x] >= 0) pos[sp[x]] = -1; sp[x] = -1; }
            prv[H] = nxt[H] = H;
            free_next = 0;
            if (prefix || fast) {
                for (int32_t x = 0; x < H; x++) {
                    sp[x] = x; pos[x] = x;
                    int32_t last = prv[H]; nxt[last] = x; prv[x] = last; nxt[x] = H; prv[H] = x;
                }
                free_next = B;
            }
            started = 1;
            fast = 0;
        }
        const int32_t newest = (int32_t)(c - 1);
        int64_t m = 0;
        for (int64_t j = 0; j < width; j++) {
            int32_t p = row[j];
            if (p < 0) break;
            if (p >= c) { free(pos); free(sp); free(prv); free(nxt); *bad = t; return STEP_RANGE; }
            if (reserve && p == newest) continue;
            int32_t x = pos[p];
            if (x >= 0) { /* hit: to the most recent end */
                if (prv[H] == x) continue;
                int32_t a = prv[x], b = nxt[x];
                nxt[a] = b; prv[b] = a;
            } else {
                if (free_next < B) {
                    x = (int32_t)free_next++;
                } else {
                    x = nxt[H];
                    int32_t b = nxt[x];
                    nxt[H] = b; prv[b] = H;
                    pos[sp[x]] = -1;
                }
                sp[x] = p;
                pos[p] = x;
                m++;
            }
            int32_t last = prv[H]; nxt[last] = x; prv[x] = last; nxt[x] = H; prv[H] = x;
        }
        misses[t] = m;
        if (record)
            for (int64_t j = 0; j < width; j++) {
                int32_t p = row[j];
                slots[t * width + j] = p < 0 ? -1 : (reserve && p == newest ? (int32_t)B : pos[p]);
            }
    }
    for (int64_t x = 0; x < B; x++) slot_pos_out[x] = sp[x];
    int64_t n = 0;
    if (started)
        for (int32_t x = nxt[H]; x != H; x = nxt[x]) order_out[n++] = x;
    *n_order = n;
    free(pos); free(sp); free(prv); free(nxt);
    return STEP_OK;
}


/* ------------------------------------------------------------------------------------------ */
/* Sequential OPT (Belady) over rows: step.run's sequential branch with policies/opt.py, bit    */
/* for bit (tests/test_native.py). Next uses are access numbers over every non-negative entry   */
/* (the reserved newest token's too), INF when none; the victim is the slot whose entry is used */
/* farthest ahead, the smallest slot among equals (opt.py's heap order), found at the root of a */
/* tournament tree over the slots that each access updates along one leaf's path.              */

#define OPT_INF ((int64_t)1 << 61)
#define OPT_NONE INT32_MAX /* an int32 next use: none */

static inline int opt_better(const int64_t *key, int32_t a, int32_t b)
{
    return key[a] > key[b] || (key[a] == key[b] && a < b);
}

static inline void opt_set(int32_t *tree, int64_t *key, int64_t size, int32_t slot, int64_t nu)
{
    key[slot] = nu;
    int64_t i = (size + slot) >> 1;
    while (i >= 1) {
        int32_t l = tree[2 * i], r = tree[2 * i + 1];
        tree[i] = opt_better(key, l, r) ? l : r;
        i >>= 1;
    }
}

/* ``slot`` became better (a larger key, or the first key of an empty slot): it climbs while it
 * beats the winner of the other side. Where it loses, it lost before too (the order is total),
 * so that node and every one above keep their winners: a hit's next use is usually near, and
 * the climb stops within a level or two instead of walking all log2(B) levels. */
static inline void opt_raise(int32_t *tree, int64_t *key, int64_t size, int32_t slot, int64_t nu)
{
    key[slot] = nu;
    for (int64_t j = size + slot; j > 1; j >>= 1) {
        if (!opt_better(key, slot, tree[j ^ 1])) return;
        tree[j >> 1] = slot;
    }
}

static int opt_seq_rows(const int32_t *idx, int64_t steps, int64_t width, const int64_t *ctx, int64_t B, int reserve,
                        int prefix, int64_t *misses, int64_t *slot_pos_out, int64_t *bad)
{
    int64_t cmax = 1, n = 0;
    for (int64_t t = 0; t < steps; t++) {
        cmax = ctx[t] > cmax ? ctx[t] : cmax;
        for (int64_t j = 0; j < width; j++) n += idx[t * width + j] >= 0;
    }
    if (n >= OPT_NONE) return STEP_NOMEM; /* access numbers are int32 (below): 8 GB of rows already */
    int64_t size = 1;
    while (size < B) size <<= 1;
    /* Next uses as int32 access numbers (OPT_NONE: never again): half the memory of int64, and
     * it is the one table as large as the stream. */
    int32_t *nu = (int32_t *)malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
    int32_t *last = (int32_t *)malloc(sizeof(int32_t) * (size_t)cmax);
    int32_t *pos = (int32_t *)malloc(sizeof(int32_t) * (size_t)cmax);
    int32_t *sp = (int32_t *)malloc(sizeof(int32_t) * (size_t)B);
    int64_t *key = (int64_t *)malloc(sizeof(int64_t) * (size_t)(size + 1));
    int32_t *tree = (int32_t *)malloc(sizeof(int32_t) * (size_t)(2 * size));
    int64_t *start = (int64_t *)malloc(sizeof(int64_t) * (size_t)(steps + 1)); /* access number of each step's first entry */
    int code = STEP_OK;
    if (!nu || !last || !pos || !sp || !key || !tree || !start) { code = STEP_NOMEM; goto done; }
    for (int64_t p = 0; p < cmax; p++) last[p] = OPT_NONE;
    start[0] = 0;
    for (int64_t t = 0; t < steps; t++) {
        int64_t c = 0;
        for (int64_t j = 0; j < width; j++) c += idx[t * width + j] >= 0;
        start[t + 1] = start[t] + c;
    }
    for (int64_t t = steps - 1; t >= 0; t--) { /* rows are padded at the end: entries are a prefix */
        const int32_t *row = idx + t * width;
        int64_t c = start[t + 1] - start[t];
        for (int64_t j = c - 1; j >= 0; j--) {
            int32_t p = row[j];
            if (p >= cmax) { *bad = t; code = STEP_RANGE; goto done; }
            nu[start[t] + j] = last[p];
            last[p] = (int32_t)(start[t] + j);
        }
    }
    /* last[p] is now the first access of p; a later step's first accesses are rebuilt when needed */
    for (int64_t p = 0; p < cmax; p++) pos[p] = -1;
    for (int64_t x = 0; x < B; x++) sp[x] = -1;
    key[size] = -1; /* the leaves past B: never a victim */
    for (int64_t x = 0; x < size; x++) tree[size + x] = (int32_t)(x < B ? x : size);
    int64_t free_next = 0;
    int fast = 0, started = 0;
    for (int64_t t = 0; t < steps; t++) {
        const int64_t c = ctx[t];
        const int32_t *row = idx + t * width;
        if (c <= B) { misses[t] = 0; fast = 1; continue; }
        if (!started || fast) {
            for (int64_t x = 0; x < B; x++) { if (sp[x] >= 0) pos[sp[x]] = -1; sp[x] = -1; key[x] = -1; }
            free_next = 0;
            if (prefix || fast) {
                /* first access at or after step t of each position < B (last[] is free now) */
                for (int64_t p = 0; p < B && p < cmax; p++) last[p] = OPT_NONE;
                for (int64_t u = steps - 1; u >= t; u--) {
                    const int32_t *r = idx + u * width;
                    for (int64_t j = start[u + 1] - start[u] - 1; j >= 0; j--)
                        if (r[j] < B) last[r[j]] = (int32_t)(start[u] + j);
                }
                for (int64_t p = 0; p < B; p++) {
                    sp[p] = (int32_t)p; pos[p] = (int32_t)p;
                    key[p] = p < cmax && last[p] != OPT_NONE ? last[p] : OPT_INF;
                }
                free_next = B;
            }
            for (int64_t i = size - 1; i >= 1; i--) {
                int32_t l = tree[2 * i], r = tree[2 * i + 1];
                tree[i] = opt_better(key, l, r) ? l : r;
            }
            started = 1;
            fast = 0;
        }
        const int32_t newest = (int32_t)(c - 1);
        int64_t m = 0;
        for (int64_t j = 0; j < width; j++) {
            int32_t p = row[j];
            if (p < 0) break;
            if (p >= c) { *bad = t; code = STEP_RANGE; goto done; }
            if (reserve && p == newest) continue;
            int32_t u = nu[start[t] + j];
            int64_t next = u == OPT_NONE ? OPT_INF : u;
            int32_t x = pos[p];
            if (x >= 0) { /* a hit: its key was this access (or an earlier, skipped one): it grows */
                opt_raise(tree, key, size, x, next);
                continue;
            }
            m++;
            if (free_next < B) { /* an empty slot (key -1): it grows too */
                x = (int32_t)free_next++;
                sp[x] = p;
                pos[p] = x;
                opt_raise(tree, key, size, x, next);
                continue;
            }
            x = tree[1]; /* the victim won every node on its path: all of them are recomputed */
            pos[sp[x]] = -1;
            sp[x] = p;
            pos[p] = x;
            opt_set(tree, key, size, x, next);
        }
        misses[t] = m;
    }
    for (int64_t x = 0; x < B; x++) slot_pos_out[x] = sp[x];
done:
    free(nu); free(last); free(pos); free(sp); free(key); free(tree); free(start);
    return code;
}


/* ------------------------------------------------------------------------------------------ */
/* Sequential LFU over rows: step.run's sequential branch with policies/lfu.py, bit for bit     */
/* (tests/test_native.py). The engine keys a slot by count * 2**40 + tick (the tick counts every */
/* load and hit since the buffer was last made fresh) and evicts the smallest key: the least    */
/* used slot, the least recently touched among equals. Here that is O(1) an access: one list    */
/* per count, slots in touch order (a touch appends at the tail, so ticks ascend along a list), */
/* the victim at the head of the smallest non-empty count's list.                               */

typedef struct {
    int32_t *cnt, *prv, *nxt; /* [B] a slot's count and its neighbours in its count's list (-1: none) */
    int32_t *head, *tail;     /* [counts] */
    int64_t minf, maxf;
} lfu_lists;

static inline void lfu_unlink(lfu_lists *L, int32_t x)
{
    int32_t a = L->prv[x], b = L->nxt[x], f = L->cnt[x];
    if (a >= 0) L->nxt[a] = b; else L->head[f] = b;
    if (b >= 0) L->prv[b] = a; else L->tail[f] = a;
}

static inline void lfu_append(lfu_lists *L, int32_t x, int32_t f)
{
    int32_t z = L->tail[f];
    L->cnt[x] = f;
    L->prv[x] = z;
    L->nxt[x] = -1;
    if (z >= 0) L->nxt[z] = x; else L->head[f] = x;
    L->tail[f] = x;
    if (f > L->maxf) L->maxf = f;
}

/* The state both LFU replays keep: a position's slot, a slot's position and the count lists, made  */
/* fresh (empty, or the prefix: count 1, ticks in slot order) where the engine starts a buffer.     */
typedef struct {
    int32_t *pos, *sp; /* [cmax] a position's slot (-1: none), [B] a slot's position (-1: free) */
    lfu_lists L;
    int64_t cmax, counts, B;
} lfu_state;

static void lfu_state_free(lfu_state *S)
{
    free(S->pos); free(S->sp); free(S->L.cnt); free(S->L.prv); free(S->L.nxt); free(S->L.head); free(S->L.tail);
}

static int lfu_state_open(lfu_state *S, const int64_t *ctx, int64_t steps, int64_t B)
{
    S->cmax = 1;
    for (int64_t t = 0; t < steps; t++) S->cmax = ctx[t] > S->cmax ? ctx[t] : S->cmax;
    S->counts = steps + 2; /* a position is accessed at most once a step: counts stay below steps + 2 */
    S->B = B;
    S->pos = (int32_t *)malloc(sizeof(int32_t) * (size_t)S->cmax);
    S->sp = (int32_t *)malloc(sizeof(int32_t) * (size_t)B);
    S->L.cnt = (int32_t *)malloc(sizeof(int32_t) * (size_t)B);
    S->L.prv = (int32_t *)malloc(sizeof(int32_t) * (size_t)B);
    S->L.nxt = (int32_t *)malloc(sizeof(int32_t) * (size_t)B);
    S->L.head = (int32_t *)malloc(sizeof(int32_t) * (size_t)S->counts);
    S->L.tail = (int32_t *)malloc(sizeof(int32_t) * (size_t)S->counts);
    S->L.minf = 1; S->L.maxf = 0;
    if (!S->pos || !S->sp || !S->L.cnt || !S->L.prv || !S->L.nxt || !S->L.head || !S->L.tail) return STEP_NOMEM;
    for (int64_t p = 0; p < S->cmax; p++) S->pos[p] = -1;
    for (int64_t x = 0; x < B; x++) S->sp[x] = -1;
    for (int64_t f = 0; f < S->counts; f++) S->L.head[f] = S->L.tail[f] = -1;
    return STEP_OK;
}

static int64_t lfu_fresh(lfu_state *S, int fill) /* the next free slot: B when filled, else 0 */
{
    int32_t *pos = S->pos, *sp = S->sp;
    for (int64_t x = 0; x < S->B; x++) { if (sp[x] >= 0) pos[sp[x]] = -1; sp[x] = -1; }
    for (int64_t f = 0; f <= S->L.maxf; f++) S->L.head[f] = S->L.tail[f] = -1;
    S->L.minf = 1; S->L.maxf = 0;
    if (!fill) return 0;
    for (int64_t p = 0; p < S->B; p++) { sp[p] = (int32_t)p; pos[p] = (int32_t)p; lfu_append(&S->L, (int32_t)p, 1); }
    return S->B; /* count 1, ticks in slot order */
}

static int lfu_seq_rows(const int32_t *idx, int64_t steps, int64_t width, const int64_t *ctx, int64_t B, int reserve,
                        int prefix, int64_t *misses, int64_t *slot_pos_out, int64_t *bad)
{
    lfu_state S;
    int code = lfu_state_open(&S, ctx, steps, B);
    if (code != STEP_OK) goto done;
    int32_t *pos = S.pos, *sp = S.sp;
    lfu_lists *L = &S.L;
    int64_t free_next = 0;
    int fast = 0, started = 0;
    for (int64_t t = 0; t < steps; t++) {
        const int64_t c = ctx[t];
        const int32_t *row = idx + t * width;
        if (c <= B) { misses[t] = 0; fast = 1; continue; }
        if (!started || fast) {
            free_next = lfu_fresh(&S, prefix || fast);
            started = 1;
            fast = 0;
        }
        const int32_t newest = (int32_t)(c - 1);
        int64_t m = 0;
        for (int64_t j = 0; j < width; j++) {
            int32_t p = row[j];
            if (p < 0) break;
            if (p >= c) { *bad = t; code = STEP_RANGE; goto done; }
            if (reserve && p == newest) continue;
            int32_t x = pos[p];
            if (x >= 0) { /* a hit: one count up, the newest tick */
                int32_t f = L->cnt[x];
                lfu_unlink(L, x);
                if (f == L->minf && L->head[f] < 0) L->minf = f + 1;
                lfu_append(L, x, f + 1);
                continue;
            }
            m++;
            if (free_next < B) x = (int32_t)free_next++; /* empty slots first, in slot order */
            else {
                x = L->head[L->minf]; /* the smallest key: the least count, its oldest tick */
                lfu_unlink(L, x);
                pos[sp[x]] = -1;
            }
            sp[x] = p;
            pos[p] = x;
            lfu_append(L, x, 1);
            L->minf = 1;
        }
        misses[t] = m;
    }
    for (int64_t x = 0; x < B; x++) slot_pos_out[x] = sp[x];
done:
    lfu_state_free(&S);
    return code;
}

/* ------------------------------------------------------------------------------------------ */
/* Batched OPT and LFU over rows: step.run's batched branch with policies/opt.py and lfu.py, bit */
/* for bit (tests/test_native.py). The engine keys a slot (OPT: minus its entry's next use, INF  */
/* when none; LFU: count * 2**40 + tick) and takes victims by a lazy heap in (key, slot) order,  */
/* passing over the step's protected slots (its hits and the slots it has loaded).               */
/* OPT: a min tournament tree over the slots in that order, with lazy keys: a slot whose entry */
/* the last step touched (a hit or a load) sits at KEY_PROT, and gets its key (minus the next    */
/* use that touch recorded) only when a step leaves it out; a stale slot a step hits is keyed    */
/* out for the step. Victims are the root: exactly the engine's unprotected slot with the least  */
/* (key, slot). A row's kept entries, most of a step, cost no tree work at all. A slot whose key */
/* grows walks up only while it won; one whose key falls climbs only while it wins.              */

#define KEY_PROT INT64_MAX
#define ENGINE_INF ((int64_t)1 << 61) /* step.INF */

static inline int key_better(const int64_t *key, int32_t a, int32_t b)
{
    return key[a] < key[b] || (key[a] == key[b] && a < b);
}

static inline void key_fix(int32_t *tree, const int64_t *key, int64_t size, int32_t slot)
{
    for (int64_t i = (size + slot) >> 1; i >= 1; i >>= 1) {
        int32_t l = tree[2 * i], r = tree[2 * i + 1];
        tree[i] = key_better(key, l, r) ? l : r;
    }
}

static inline void key_worse(int32_t *tree, int64_t *key, int64_t size, int32_t slot, int64_t k)
{
    key[slot] = k;
    for (int64_t i = (size + slot) >> 1; i >= 1 && tree[i] == slot; i >>= 1) {
        int32_t l = tree[2 * i], r = tree[2 * i + 1];
        tree[i] = key_better(key, l, r) ? l : r;
    }
}

static inline void key_better_set(int32_t *tree, int64_t *key, int64_t size, int32_t slot, int64_t k)
{
    key[slot] = k;
    for (int64_t j = size + slot; j > 1; j >>= 1) {
        if (!key_better(key, slot, tree[j ^ 1])) return;
        tree[j >> 1] = slot;
    }
}

static inline int64_t opt_key(const int32_t *nu, int64_t a) /* the engine's key of access a: -next use */
{
    return -(nu[a] == OPT_NONE ? ENGINE_INF : (int64_t)nu[a]);
}

static int opt_batched_rows(const int32_t *idx, int64_t steps, int64_t width, const int64_t *ctx, int64_t B, int reserve,
                            int prefix, int64_t *misses, int64_t *slot_pos_out, int64_t *bad)
{
    int64_t cmax = 1, n = 0;
    for (int64_t t = 0; t < steps; t++) {
        cmax = ctx[t] > cmax ? ctx[t] : cmax;
        for (int64_t j = 0; j < width; j++) n += idx[t * width + j] >= 0;
    }
    if (n >= OPT_NONE) return STEP_NOMEM; /* int32 access numbers (opt_seq_rows) */
    int64_t size = 1;
    while (size < B) size <<= 1;
    int64_t w = width > 0 ? width : 1;
    int32_t *nu = (int32_t *)malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
    int32_t *last = (int32_t *)malloc(sizeof(int32_t) * (size_t)cmax);
    int64_t *start = (int64_t *)malloc(sizeof(int64_t) * (size_t)(steps + 1));
    int32_t *pos = (int32_t *)malloc(sizeof(int32_t) * (size_t)cmax);
    int32_t *sp = (int32_t *)malloc(sizeof(int32_t) * (size_t)B);
    int64_t *key = (int64_t *)malloc(sizeof(int64_t) * (size_t)(size + 1)); /* the tree's (KEY_PROT: lazy or protected) */
    int64_t *real = (int64_t *)malloc(sizeof(int64_t) * (size_t)B);          /* the engine's key */
    int64_t *touch = (int64_t *)calloc((size_t)B, sizeof(int64_t));           /* step + 1 of the last touch */
    int32_t *tree = (int32_t *)malloc(sizeof(int32_t) * (size_t)(2 * size));
    int32_t *prev = (int32_t *)malloc(sizeof(int32_t) * (size_t)w), *cur = (int32_t *)malloc(sizeof(int32_t) * (size_t)w);
    int code = STEP_OK;
    if (!nu || !last || !start || !pos || !sp || !key || !real || !touch || !tree || !prev || !cur) {
        code = STEP_NOMEM;
        goto done;
    }
    start[0] = 0;
    for (int64_t t = 0; t < steps; t++) {
        int64_t c = 0;
        for (int64_t j = 0; j < width; j++) c += idx[t * width + j] >= 0;
        start[t + 1] = start[t] + c;
    }
    for (int64_t p = 0; p < cmax; p++) last[p] = OPT_NONE;
    for (int64_t t = steps - 1; t >= 0; t--) {
        const int32_t *row = idx + t * width;
        for (int64_t j = start[t + 1] - start[t] - 1; j >= 0; j--) {
            int32_t p = row[j];
            if (p >= cmax) { *bad = t; code = STEP_RANGE; goto done; }
            nu[start[t] + j] = last[p];
            last[p] = (int32_t)(start[t] + j);
        }
    }
    for (int64_t p = 0; p < cmax; p++) pos[p] = -1;
    for (int64_t x = 0; x < B; x++) sp[x] = -1;
    key[size] = KEY_PROT; /* the leaves past B */
    for (int64_t x = 0; x < size; x++) tree[size + x] = (int32_t)(x < B ? x : size);
    int64_t free_next = 0, n_prev = 0;
    int fast = 0, started = 0;
    for (int64_t t = 0; t < steps; t++) {
        const int64_t c = ctx[t];
        const int32_t *row = idx + t * width;
        if (c <= B) { misses[t] = 0; fast = 1; continue; }
        if (!started || fast) {
            for (int64_t x = 0; x < B; x++) {
                if (sp[x] >= 0) pos[sp[x]] = -1;
                sp[x] = -1; key[x] = KEY_PROT; touch[x] = 0;
            }
            free_next = 0;
            n_prev = 0;
            if (prefix || fast) { /* first access at or after step t of each position < B (last[] is free now) */
                for (int64_t p = 0; p < B && p < cmax; p++) last[p] = OPT_NONE;
                for (int64_t u = steps - 1; u >= t; u--) {
                    const int32_t *r = idx + u * width;
                    for (int64_t j = start[u + 1] - start[u] - 1; j >= 0; j--)
                        if (r[j] < B) last[r[j]] = (int32_t)(start[u] + j);
                }
                for (int64_t p = 0; p < B; p++) {
                    sp[p] = (int32_t)p; pos[p] = (int32_t)p;
                    key[p] = real[p] = -(p < cmax && last[p] != OPT_NONE ? (int64_t)last[p] : ENGINE_INF);
                }
                free_next = B;
            }
            for (int64_t i = size - 1; i >= 1; i--) {
                int32_t l = tree[2 * i], r = tree[2 * i + 1];
                tree[i] = key_better(key, l, r) ? l : r;
            }
            started = 1;
            fast = 0;
        }
        const int32_t newest = (int32_t)(c - 1);
        const int64_t cnt = start[t + 1] - start[t], now = t + 1;
        int64_t n_cur = 0, m = 0;
        for (int64_t j = 0; j < cnt; j++) { /* the hits: touched now, keyed out if they were not last step */
            int32_t p = row[j];
            if (p >= c) { *bad = t; code = STEP_RANGE; goto done; }
            if (reserve && p == newest) continue;
            int32_t x = pos[p];
            if (x < 0) continue;
            if (key[x] != KEY_PROT) key_worse(tree, key, size, x, KEY_PROT); /* a stale slot hit: out of reach */
            touch[x] = now;
            real[x] = opt_key(nu, start[t] + j);
            cur[n_cur++] = x;
        }
        for (int64_t i = 0; i < n_prev; i++) { /* last step's entries left out now: their keys, at last */
            int32_t x = prev[i];
            if (touch[x] != now) key_better_set(tree, key, size, x, real[x]);
        }
        for (int64_t j = 0; j < cnt; j++) { /* the misses, in stored order */
            int32_t p = row[j];
            if ((reserve && p == newest) || pos[p] >= 0) continue;
            int32_t x;
            if (free_next < B) x = (int32_t)free_next++; /* its key is KEY_PROT already */
            else { /* the root: the farthest next use among the slots no one touched now */
                x = tree[1];
                if (touch[x] == now || key[x] == KEY_PROT) { *bad = t; code = STEP_FULL; goto done; }
                pos[sp[x]] = -1;
                key[x] = KEY_PROT; /* it won every node on its path */
                key_fix(tree, key, size, x);
            }
            sp[x] = p;
            pos[p] = x;
            touch[x] = now;
            real[x] = opt_key(nu, start[t] + j);
            cur[n_cur++] = x;
            m++;
        }
        int32_t *swap = prev; prev = cur; cur = swap;
        n_prev = n_cur;
        misses[t] = m;
    }
    for (int64_t x = 0; x < B; x++) slot_pos_out[x] = sp[x];
done:
    free(nu); free(last); free(start); free(pos); free(sp); free(key); free(real); free(touch); free(tree);
    free(prev); free(cur);
    return code;
}

/* LFU: in O(1) an access, lfu_seq_rows' count lists (ticks ascend along each), a step's
 * hits unlinked for the step (protected: no victim can reach them) and its loaded slots linked
 * only at its end, first the loaded (count 1, ticks in load order), then the hits (one count up,
 * ticks in stored order), as the engine's insert and hits hooks number them. */
static int lfu_batched_rows(const int32_t *idx, int64_t steps, int64_t width, const int64_t *ctx, int64_t B, int reserve,
                            int prefix, int64_t *misses, int64_t *slot_pos_out, int64_t *bad)
{
    int64_t w = width > 0 ? width : 1;
    int32_t *hit_s = (int32_t *)malloc(sizeof(int32_t) * (size_t)w), *load_s = (int32_t *)malloc(sizeof(int32_t) * (size_t)w);
    lfu_state S;
    int code = lfu_state_open(&S, ctx, steps, B);
    if (code == STEP_OK && (!hit_s || !load_s)) code = STEP_NOMEM;
    if (code != STEP_OK) goto done;
    int32_t *pos = S.pos, *sp = S.sp;
    lfu_lists *L = &S.L;
    int64_t free_next = 0;
    int fast = 0, started = 0;
    for (int64_t t = 0; t < steps; t++) {
        const int64_t c = ctx[t];
        const int32_t *row = idx + t * width;
        if (c <= B) { misses[t] = 0; fast = 1; continue; }
        if (!started || fast) {
            free_next = lfu_fresh(&S, prefix || fast);
            started = 1;
            fast = 0;
        }
        const int32_t newest = (int32_t)(c - 1);
        int64_t nh = 0, nl = 0;
        for (int64_t j = 0; j < width; j++) { /* the hits leave their lists for the step */
            int32_t p = row[j];
            if (p < 0) break;
            if (p >= c) { *bad = t; code = STEP_RANGE; goto done; }
            if (reserve && p == newest) continue;
            int32_t x = pos[p];
            if (x < 0) continue;
            hit_s[nh++] = x;
            lfu_unlink(L, x);
        }
        for (int64_t j = 0; j < width; j++) { /* the misses, in stored order */
            int32_t p = row[j];
            if (p < 0) break;
            if ((reserve && p == newest) || pos[p] >= 0) continue;
            int32_t x;
            if (free_next < B) x = (int32_t)free_next++;
            else {
                while (L->head[L->minf] < 0) L->minf++; /* an unprotected slot is left: B >= the step's entries */
                x = L->head[L->minf];
                lfu_unlink(L, x);
                pos[sp[x]] = -1;
            }
            sp[x] = p;
            pos[p] = x;
            load_s[nl++] = x;
        }
        for (int64_t i = 0; i < nl; i++) lfu_append(L, load_s[i], 1);
        for (int64_t i = 0; i < nh; i++) lfu_append(L, hit_s[i], L->cnt[hit_s[i]] + 1);
        L->minf = 1; /* the next victim search starts low again */
        misses[t] = nl;
    }
    for (int64_t x = 0; x < B; x++) slot_pos_out[x] = sp[x];
done:
    lfu_state_free(&S); free(hit_s); free(load_s);
    return code;
}

/* ------------------------------------------------------------------------------------------ */
/* LRU stack distances over rows (replay/mrc.py's _stack_distance_histogram, bit for bit): hist[d] */
/* counts the accesses at distance d (1..max_size), hist[0] the cold ones and those farther. A    */
/* Fenwick tree over access times marks each position's latest access; the distinct positions  */
/* touched since an access's previous one are the marks between them.                          */

static int lru_stack_hist(const int32_t *idx, int64_t steps, int64_t width, const int64_t *ctx, int reserve,
                          int64_t max_size, int64_t *hist, int64_t *bad)
{
    int64_t cmax = 1, n = 0;
    for (int64_t t = 0; t < steps; t++) {
        cmax = ctx[t] > cmax ? ctx[t] : cmax;
        for (int64_t j = 0; j < width; j++) n += idx[t * width + j] >= 0;
    }
    int32_t *tree = (int32_t *)calloc((size_t)(n + 1), sizeof(int32_t)); /* marks per access time, 1-based */
    int64_t *last = (int64_t *)calloc((size_t)cmax, sizeof(int64_t));   /* a position's latest time, 0: none */
    if (!tree || !last) { free(tree); free(last); return STEP_NOMEM; }
    int64_t now = 0;
    for (int64_t t = 0; t < steps; t++) {
        const int32_t *row = idx + t * width;
        const int64_t newest = ctx[t] - 1;
        for (int64_t j = 0; j < width; j++) {
            int64_t p = row[j];
            if (p < 0) break;
            if (p >= cmax) { *bad = t; free(tree); free(last); return STEP_RANGE; }
            if (reserve && p == newest) continue;
            now++;
            int64_t prev = last[p];
            if (!prev) hist[0]++;
            else {
                int64_t sum = 0; /* marks in (prev, now) */
                for (int64_t i = now - 1; i > 0; i -= i & -i) sum += tree[i];
                for (int64_t i = prev; i > 0; i -= i & -i) sum -= tree[i];
                hist[sum + 1 > max_size ? 0 : sum + 1]++;
                for (int64_t i = prev; i <= n; i += i & -i) tree[i]--;
            }
            for (int64_t i = now; i <= n; i += i & -i) tree[i]++;
            last[p] = now;
        }
    }
    free(tree); free(last);
    return STEP_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* OPT stack depths over rows (replay/opt_stack.py's opt_stack_histogram, bit for bit): hist[d] */
/* counts the accesses at depth d (1..max_size) of the one stack whose top C entries are the    */
/* OPT buffer of C slots, for every C at once; hist[0] those deeper or not in it. Sequential is */
/* a step of one access. A step's accesses A go to depths 1..|A|; the entries there that are    */
/* not in A join D (a heap, nearest next use on top); below, an entry moves only where it is in */
/* A (D's best takes its depth) or used later than D's best (the two swap): a max tree over the */
/* depths' keys finds the next such depth, so a step costs O(|A| + moves) x log(max_size).     */
/* Only sizes >= min_size are asked for, so depths 1..min_size are one unordered set (below);  */
/* hist[min_size] counts the accesses found there.                                           */

#define OS_FREE (INT64_MAX - 1) /* a free slot below the stack's end: evicted before any entry */
#define OS_MOVE INT64_MAX       /* an entry of the current step, below depth |A|: it leaves   */

typedef struct { int64_t key; int32_t pos; } os_item;

static inline int os_less(os_item a, os_item b) { return a.key < b.key || (a.key == b.key && a.pos < b.pos); }

static void os_push(os_item *h, int64_t *n, os_item x)
{
    int64_t i = (*n)++;
    while (i > 0) {
        int64_t up = (i - 1) >> 1;
        if (!os_less(x, h[up])) break;
        h[i] = h[up];
        i = up;
    }
    h[i] = x;
}

static void os_sift(os_item *h, int64_t n, os_item x) /* x replaces the top */
{
    int64_t i = 0;
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && os_less(h[c + 1], h[c])) c++;
        if (!os_less(h[c], x)) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = x;
}

static inline os_item os_pop(os_item *h, int64_t *n)
{
    os_item top = h[0];
    if (--*n > 0) os_sift(h, *n, h[*n]);
    return top;
}

static inline void os_tree_set(int64_t *tree, int64_t size, int64_t d, int64_t key) /* depth d, 1-based */
{
    int64_t i = size + d - 1;
    tree[i] = key;
    for (i >>= 1; i >= 1; i >>= 1) {
        int64_t l = tree[2 * i], r = tree[2 * i + 1];
        tree[i] = l > r ? l : r;
    }
}

static int64_t os_first_above(const int64_t *tree, int64_t size, int64_t d, int64_t thr) /* first depth >= d with key > thr, or 0 */
{
    if (d > size) return 0;
    int64_t i = size + d - 1;
    if (tree[i] <= thr) {
        for (;;) {
            while (i & 1) { i >>= 1; if (i == 0) return 0; }
            i++;
            if (tree[i] > thr) break;
        }
        while (i < size) { i = 2 * i; if (tree[i] <= thr) i++; }
    }
    return i - size + 1;
}

/* The top L depths (L: the smallest size asked for) as one set: no size >= L sees their order.  */
/* It is a max-heap on (key, position), the worst on top, so a hit there is one sift (its key  */
/* only grows: the next use moves past this access) and a step's misses evict its worst.       */

typedef struct {
    int64_t *key;
    int32_t *pos, *at; /* at[position]: its index in the heap */
    int64_t n;
} os_core;

static inline int os_worse(int64_t ka, int32_t pa, int64_t kb, int32_t pb) { return ka > kb || (ka == kb && pa > pb); }

static void os_core_put(os_core *c, int64_t i, int64_t key, int32_t pos)
{
    c->key[i] = key; c->pos[i] = pos; c->at[pos] = (int32_t)i;
}

static void os_core_up(os_core *c, int64_t i)
{
    int64_t key = c->key[i];
    int32_t pos = c->pos[i];
    while (i > 0) {
        int64_t up = (i - 1) >> 1;
        if (!os_worse(key, pos, c->key[up], c->pos[up])) break;
        os_core_put(c, i, c->key[up], c->pos[up]);
        i = up;
    }
    os_core_put(c, i, key, pos);
}

static void os_core_down(os_core *c, int64_t i)
{
    int64_t key = c->key[i];
    int32_t pos = c->pos[i];
    for (;;) {
        int64_t ch = 2 * i + 1;
        if (ch >= c->n) break;
        if (ch + 1 < c->n && os_worse(c->key[ch + 1], c->pos[ch + 1], c->key[ch], c->pos[ch])) ch++;
        if (!os_worse(c->key[ch], c->pos[ch], key, pos)) break;
        os_core_put(c, i, c->key[ch], c->pos[ch]);
        i = ch;
    }
    os_core_put(c, i, key, pos);
}

/* After a walk: the leaves it rewrote (ascending slots, their leaves already written) pull their
 * ancestors' maxima up, each ancestor once. A walk only reads nodes whose range lies past its
 * current slot, so the ancestors of the slots behind it may wait until here. */
static void os_tree_fix(int64_t *tree, int64_t size, int64_t *nodes, int64_t n)
{
    if (size == 1) return; /* the one leaf is the root */
    for (int64_t i = 0; i < n; i++) nodes[i] = (size + nodes[i] - 1) >> 1;
    while (n > 0) {
        int64_t m = 0;
        for (int64_t i = 0; i < n; i++) {
            int64_t x = nodes[i];
            if (m && nodes[m - 1] == x) continue;
            int64_t l = tree[2 * x], r = tree[2 * x + 1];
            tree[x] = l > r ? l : r;
            nodes[m++] = x;
        }
        if (nodes[0] == 1) break;
        n = 0;
        for (int64_t i = 0; i < m; i++) {
            int64_t up = nodes[i] >> 1;
            if (!n || nodes[n - 1] != up) nodes[n++] = up;
        }
    }
}

static int opt_stack_hist(const int32_t *idx, int64_t steps, int64_t width, const int64_t *ctx, int reserve,
                          int prefix, int batched, int64_t L, int64_t H, int64_t *hist, int64_t *bad)
{
    int64_t cmax = 1, n = 0;
    for (int64_t t = 0; t < steps; t++) {
        cmax = ctx[t] > cmax ? ctx[t] : cmax;
        for (int64_t j = 0; j < width; j++) n += idx[t * width + j] >= 0;
    }
    if (n >= OPT_NONE) return STEP_NOMEM;
    if (prefix && cmax < H) cmax = H;
    const int64_t T = H - L; /* tail depths L+1..H are tail slots 1..T */
    int64_t size = 1;
    while (size < T) size <<= 1;
    int64_t cap = width > 0 ? width : 1;
    int32_t *nu = (int32_t *)malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
    int32_t *last = (int32_t *)malloc(sizeof(int32_t) * (size_t)cmax);
    int32_t *depth = (int32_t *)calloc((size_t)cmax, sizeof(int32_t)); /* 0: out; L: the core; L+i: tail slot i */
    int64_t *mark = (int64_t *)calloc((size_t)cmax, sizeof(int64_t));  /* group stamp of A's entries */
    int32_t *spos = (int32_t *)malloc(sizeof(int32_t) * (size_t)(T + 1)); /* tail slot -> position, -1 free */
    int64_t *skey = (int64_t *)malloc(sizeof(int64_t) * (size_t)(T + 1));
    int64_t *tree = (int64_t *)malloc(sizeof(int64_t) * (size_t)(2 * size));
    os_item *D = (os_item *)malloc(sizeof(os_item) * (size_t)cap);
    os_item *A = (os_item *)malloc(sizeof(os_item) * (size_t)cap);
    int64_t *dirty = (int64_t *)malloc(sizeof(int64_t) * (size_t)(T + 1)); /* slots a walk rewrote */
    os_core core = {(int64_t *)malloc(sizeof(int64_t) * (size_t)L), (int32_t *)malloc(sizeof(int32_t) * (size_t)L),
                    (int32_t *)malloc(sizeof(int32_t) * (size_t)cmax), 0};
    int code = STEP_OK;
    if (!nu || !last || !depth || !mark || !spos || !skey || !tree || !D || !A || !dirty || !core.key || !core.pos ||
        !core.at) {
        code = STEP_NOMEM;
        goto done;
    }
    /* next uses (access numbers over every entry, as the engine's); last[] ends as first uses */
    for (int64_t p = 0; p < cmax; p++) last[p] = OPT_NONE;
    int64_t vt = n;
    for (int64_t t = steps - 1; t >= 0; t--) {
        const int32_t *row = idx + t * width;
        int64_t c = 0;
        while (c < width && row[c] >= 0) c++;
        for (int64_t j = c - 1; j >= 0; j--) {
            int32_t p = row[j];
            vt--;
            if (p >= ctx[t]) { *bad = t; code = STEP_RANGE; goto done; }
            nu[vt] = last[p];
            last[p] = (int32_t)vt;
        }
    }
    /* the initial stack: positions 0, 1, ... keyed by their first use (prefix), else free slots */
    for (int64_t d = 1; d <= H; d++) {
        int32_t p = (int32_t)(d - 1);
        int64_t key = prefix ? (last[p] == OPT_NONE ? OPT_INF : last[p]) : OS_FREE;
        if (d <= L) {
            if (prefix) { os_core_put(&core, core.n++, key, p); os_core_up(&core, core.n - 1); depth[p] = (int32_t)L; }
        } else {
            spos[d - L] = prefix ? p : -1;
            skey[d - L] = key;
            if (prefix) depth[p] = (int32_t)d;
        }
    }
    for (int64_t x = 0; x < 2 * size; x++) tree[x] = INT64_MIN; /* slots past T: never found */
    for (int64_t i = 1; i <= T; i++) tree[size + i - 1] = skey[i];
    for (int64_t i = size - 1; i >= 1; i--) tree[i] = tree[2 * i] > tree[2 * i + 1] ? tree[2 * i] : tree[2 * i + 1];
    int64_t stamp = 0, a_no = 0;
    for (int64_t t = 0; t < steps; t++) {
        const int32_t *row = idx + t * width;
        const int32_t newest = (int32_t)(ctx[t] - 1);
        int64_t j = 0;
        while (j < width && row[j] >= 0) {
            /* the next group: the whole step (batched) or one access (sequential) */
            int64_t na = 0, m = 0;
            stamp++;
            for (; j < width && row[j] >= 0; j++) {
                int32_t p = row[j];
                int64_t a = a_no++;
                if (reserve && p == newest) continue;
                if (mark[p] == stamp) { *bad = t; code = STEP_RANGE; goto done; } /* twice in a step */
                mark[p] = stamp;
                A[na].pos = p;
                A[na].key = nu[a] == OPT_NONE ? OPT_INF : nu[a];
                na++;
                int32_t d = depth[p];
                hist[d]++;
                if (d != L) {
                    m++;
                    if (d > L) os_tree_set(tree, size, d - L, OS_MOVE); /* leaves its slot to D's best */
                }
                if (!batched) { j++; break; }
            }
            if (!na) continue;
            if (na > L) { *bad = t; code = STEP_FULL; goto done; }
            /* the core keeps A and its best L - |A| others: the m - (free slots) worst others go to D */
            int64_t nd = 0, evict = core.n + m - L, kept = 0;
            while (evict > 0) {
                int32_t p = core.pos[0];
                os_item worst = {core.key[0], p};
                core.n--;
                if (core.n > 0) { os_core_put(&core, 0, core.key[core.n], core.pos[core.n]); os_core_down(&core, 0); }
                if (mark[p] == stamp) { D[cap - 1 - kept++] = worst; continue; } /* in A: kept (at D's far end) */
                os_push(D, &nd, worst);
                depth[p] = 0;
                evict--;
            }
            while (kept > 0) { /* A's entries popped on the way: back in */
                os_item it = D[cap - kept--];
                os_core_put(&core, core.n++, it.key, it.pos);
                os_core_up(&core, core.n - 1);
            }
            int64_t s = 0, nw = 0; /* the tail: A's slots take D's best; an entry used later than D's best swaps with it */
            while (nd > 0) {
                s = os_first_above(tree, size, s + 1, D[0].key);
                if (!s) break;
                os_item best = D[0];
                if (tree[size + s - 1] == OS_MOVE) {
                    os_pop(D, &nd);
                } else {
                    os_item worse = {skey[s], spos[s]};
                    if (worse.pos >= 0) depth[worse.pos] = 0;
                    os_sift(D, nd, worse);
                }
                spos[s] = best.pos;
                skey[s] = best.key;
                depth[best.pos] = (int32_t)(L + s);
                tree[size + s - 1] = best.key;
                dirty[nw++] = s;
            }
            os_tree_fix(tree, size, dirty, nw);
            /* what D still holds fell below H (its depths are 0 already); A's new keys in the core */
            for (int64_t i = 0; i < na; i++) {
                int32_t p = A[i].pos;
                if (depth[p] == L) {
                    int64_t h = core.at[p];
                    core.key[h] = A[i].key; /* a later next use: it only sinks toward the top */
                    os_core_up(&core, h);
                } else {
                    depth[p] = (int32_t)L;
                    os_core_put(&core, core.n++, A[i].key, p);
                    os_core_up(&core, core.n - 1);
                }
            }
        }
    }
done:
    free(nu); free(last); free(depth); free(mark); free(spos); free(skey); free(tree); free(D); free(A); free(dirty);
    free(core.key); free(core.pos); free(core.at);
    return code;
}

/* ------------------------------------------------------------------------------------------ */
/* Python bindings                                                                            */

static int need_len(Py_buffer *b, Py_ssize_t bytes, const char *name)
{
    if (b->len < bytes) {
        PyErr_Format(PyExc_ValueError, "%s: buffer of %zd bytes, need %zd", name, b->len, bytes);
        return 0;
    }
    return 1;
}

static PyObject *py_decode(PyObject *self, PyObject *args)
{
    Py_buffer raw, out, ctx;
    long long steps, width, out_width;
    int ordered, coding = 2;
    if (!PyArg_ParseTuple(args, "y*LLpw*Lw*|i", &raw, &steps, &width, &ordered, &out, &out_width, &ctx, &coding))
        return NULL;
    PyObject *res = NULL;
    if (need_len(&out, (Py_ssize_t)(steps * out_width * 4), "out") && need_len(&ctx, (Py_ssize_t)(steps * 8), "ctx_out")) {
        int64_t err_step = 0;
        int code;
        Py_BEGIN_ALLOW_THREADS
        code = decode_steps((const uint8_t *)raw.buf, raw.len, steps, width, ordered, coding, (int32_t *)out.buf,
                            out_width, (int64_t *)ctx.buf, &err_step);
        Py_END_ALLOW_THREADS
        if (code < 0) PyErr_NoMemory();
        else res = Py_BuildValue("(iL)", code, (long long)err_step);
    }
    PyBuffer_Release(&raw);
    PyBuffer_Release(&out);
    PyBuffer_Release(&ctx);
    return res;
}

static PyObject *py_decode_rows_checked(PyObject *self, PyObject *args)
{
    Py_buffer raw, out, ctx;
    long long steps, width, out_width, k, prev_ctx;
    int ordered, coding;
    if (!PyArg_ParseTuple(args, "y*LLpiLLw*Lw*", &raw, &steps, &width, &ordered, &coding, &k, &prev_ctx, &out,
                          &out_width, &ctx))
        return NULL;
    PyObject *res = NULL;
    if (steps < 0 || width < 0 || out_width < 0) PyErr_SetString(PyExc_ValueError, "decode_rows_checked: negative size");
    else if (need_len(&out, (Py_ssize_t)(steps * out_width * 4), "out") && need_len(&ctx, (Py_ssize_t)(steps * 8), "ctx_out")) {
        int64_t err_step = 0, acc = 0;
        int code;
        Py_BEGIN_ALLOW_THREADS
        code = decode_rows_checked((const uint8_t *)raw.buf, raw.len, steps, width, ordered, coding, k, prev_ctx,
                                   (int32_t *)out.buf, out_width, (int64_t *)ctx.buf, &acc, &err_step);
        Py_END_ALLOW_THREADS
        if (code < 0) PyErr_NoMemory();
        else res = Py_BuildValue("(iLL)", code, (long long)err_step, (long long)acc);
    }
    PyBuffer_Release(&raw);
    PyBuffer_Release(&out);
    PyBuffer_Release(&ctx);
    return res;
}

static PyObject *py_count_entries(PyObject *self, PyObject *args)
{
    Py_buffer idx;
    long long steps, width;
    if (!PyArg_ParseTuple(args, "y*LL", &idx, &steps, &width)) return NULL;
    PyObject *res = NULL;
    if (steps < 0 || width < 0) PyErr_SetString(PyExc_ValueError, "count_entries: negative size");
    else if (need_len(&idx, (Py_ssize_t)(steps * width * 4), "indices")) {
        const int32_t *v = (const int32_t *)idx.buf;
        int64_t n = 0, total = steps * width;
        Py_BEGIN_ALLOW_THREADS
        for (int64_t i = 0; i < total; i++) n += v[i] >= 0;
        Py_END_ALLOW_THREADS
        res = PyLong_FromLongLong((long long)n);
    }
    PyBuffer_Release(&idx);
    return res;
}

static PyObject *py_lru_stack_hist(PyObject *self, PyObject *args)
{
    Py_buffer idx, ctx, hist;
    long long steps, width, max_size;
    int reserve;
    if (!PyArg_ParseTuple(args, "y*LLy*pLw*", &idx, &steps, &width, &ctx, &reserve, &max_size, &hist)) return NULL;
    PyObject *res = NULL;
    if (steps < 0 || width < 0 || max_size < 1) PyErr_SetString(PyExc_ValueError, "lru_stack_hist: bad size");
    else if (need_len(&idx, (Py_ssize_t)(steps * width * 4), "indices") && need_len(&ctx, (Py_ssize_t)(steps * 8), "ctx_len") &&
             need_len(&hist, (Py_ssize_t)((max_size + 1) * 8), "hist")) {
        int64_t bad = 0;
        int code;
        Py_BEGIN_ALLOW_THREADS
        code = lru_stack_hist((const int32_t *)idx.buf, steps, width, (const int64_t *)ctx.buf, reserve, max_size,
                              (int64_t *)hist.buf, &bad);
        Py_END_ALLOW_THREADS
        if (code == STEP_NOMEM) PyErr_NoMemory();
        else if (code == STEP_RANGE)
            PyErr_Format(PyExc_ValueError, "step %lld selects a position at or past its ctx_len", (long long)bad);
        else res = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&idx);
    PyBuffer_Release(&ctx);
    PyBuffer_Release(&hist);
    return res;
}

static PyObject *py_opt_stack_hist(PyObject *self, PyObject *args)
{
    Py_buffer idx, ctx, hist;
    long long steps, width, min_size, max_size;
    int reserve, prefix, batched;
    if (!PyArg_ParseTuple(args, "y*LLy*pppLLw*", &idx, &steps, &width, &ctx, &reserve, &prefix, &batched, &min_size,
                          &max_size, &hist)) return NULL;
    PyObject *res = NULL;
    if (steps < 0 || width < 0 || min_size < 1 || max_size < min_size || max_size >= INT32_MAX)
        PyErr_SetString(PyExc_ValueError, "opt_stack_hist: bad size");
    else if (need_len(&idx, (Py_ssize_t)(steps * width * 4), "indices") && need_len(&ctx, (Py_ssize_t)(steps * 8), "ctx_len") &&
             need_len(&hist, (Py_ssize_t)((max_size + 1) * 8), "hist")) {
        int64_t bad = 0;
        int code;
        Py_BEGIN_ALLOW_THREADS
        code = opt_stack_hist((const int32_t *)idx.buf, steps, width, (const int64_t *)ctx.buf, reserve, prefix, batched,
                              min_size, max_size, (int64_t *)hist.buf, &bad);
        Py_END_ALLOW_THREADS
        if (code == STEP_NOMEM) PyErr_NoMemory();
        else if (code == STEP_RANGE)
            PyErr_Format(PyExc_ValueError, "step %lld selects a position at or past its ctx_len, or one twice", (long long)bad);
        else if (code == STEP_FULL)
            PyErr_Format(PyExc_ValueError, "step %lld has more entries than the smallest size", (long long)bad);
        else res = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&idx);
    PyBuffer_Release(&ctx);
    PyBuffer_Release(&hist);
    return res;
}

static PyObject *py_check_rows(PyObject *self, PyObject *args)
{
    Py_buffer idx, ctx;
    long long steps, width, k;
    if (!PyArg_ParseTuple(args, "y*LLy*L", &idx, &steps, &width, &ctx, &k))
        return NULL;
    PyObject *res = NULL;
    if (need_len(&idx, (Py_ssize_t)(steps * width * 4), "indices") && need_len(&ctx, (Py_ssize_t)(steps * 8), "ctx_len")) {
        int64_t r[4];
        int code;
        Py_BEGIN_ALLOW_THREADS
        code = check_rows((const int32_t *)idx.buf, steps, width, (const int64_t *)ctx.buf, k, r);
        Py_END_ALLOW_THREADS
        if (code < 0) PyErr_NoMemory();
        else res = Py_BuildValue("(LLLL)", (long long)r[0], (long long)r[1], (long long)r[2], (long long)r[3]);
    }
    PyBuffer_Release(&idx);
    PyBuffer_Release(&ctx);
    return res;
}

static const char *CAPSULE = "hisparse.lru_state";

static void capsule_free(PyObject *cap) { lru_free((lru_state *)PyCapsule_GetPointer(cap, CAPSULE)); }

static PyObject *py_lru_new(PyObject *self, PyObject *args)
{
    long long B;
    int reserve, prefix;
    if (!PyArg_ParseTuple(args, "Lpp", &B, &reserve, &prefix)) return NULL;
    if (B < 1 || B >= INT32_MAX) { PyErr_Format(PyExc_ValueError, "buffer %lld out of range", B); return NULL; }
    lru_state *s = lru_new(B, reserve, prefix);
    if (!s) return PyErr_NoMemory();
    PyObject *cap = PyCapsule_New(s, CAPSULE, capsule_free);
    if (!cap) lru_free(s);
    return cap;
}

static PyObject *py_lru_reset(PyObject *self, PyObject *args)
{
    PyObject *cap;
    if (!PyArg_ParseTuple(args, "O", &cap)) return NULL;
    lru_state *s = (lru_state *)PyCapsule_GetPointer(cap, CAPSULE);
    if (!s) return NULL;
    lru_reset(s);
    Py_RETURN_NONE;
}

static PyObject *step_error(int code, int64_t step, lru_state *s)
{
    if (code == STEP_NOMEM) return PyErr_NoMemory();
    if (code == STEP_RANGE) {
        PyErr_Format(PyExc_ValueError, "step %lld selects a position at or past its ctx_len", (long long)step);
        return NULL;
    }
    PyErr_Format(PyExc_ValueError, "step %lld selects more entries than the buffer's %lld slots", (long long)step,
                 (long long)s->B);
    return NULL;
}

static PyObject *py_lru_rows(PyObject *self, PyObject *args)
{
    PyObject *cap;
    Py_buffer idx, ctx, misses, slots;
    long long steps, width;
    int record;
    if (!PyArg_ParseTuple(args, "Oy*LLy*w*pw*", &cap, &idx, &steps, &width, &ctx, &misses, &record, &slots))
        return NULL;
    PyObject *res = NULL;
    lru_state *s = (lru_state *)PyCapsule_GetPointer(cap, CAPSULE);
    if (s && need_len(&idx, (Py_ssize_t)(steps * width * 4), "indices") && need_len(&ctx, (Py_ssize_t)(steps * 8), "ctx_len") &&
        need_len(&misses, (Py_ssize_t)(steps * 8), "misses") &&
        (!record || need_len(&slots, (Py_ssize_t)(steps * width * 4), "slots"))) {
        int64_t bad = 0;
        int code;
        Py_BEGIN_ALLOW_THREADS
        code = lru_rows(s, (const int32_t *)idx.buf, steps, width, (const int64_t *)ctx.buf, (int64_t *)misses.buf,
                        record, (int32_t *)slots.buf, &bad);
        Py_END_ALLOW_THREADS
        if (code) step_error(code, bad, s);
        else res = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&idx);
    PyBuffer_Release(&ctx);
    PyBuffer_Release(&misses);
    PyBuffer_Release(&slots);
    return res;
}

static PyObject *py_lru_result(PyObject *self, PyObject *args)
{
    PyObject *cap;
    Py_buffer slot_pos, order;
    if (!PyArg_ParseTuple(args, "Ow*w*", &cap, &slot_pos, &order)) return NULL;
    PyObject *res = NULL;
    lru_state *s = (lru_state *)PyCapsule_GetPointer(cap, CAPSULE);
    if (s && need_len(&slot_pos, (Py_ssize_t)(s->B * 8), "slot_pos") && need_len(&order, (Py_ssize_t)(s->B * 8), "order")) {
        int64_t n = lru_result(s, (int64_t *)slot_pos.buf, (int64_t *)order.buf);
        res = n < 0 ? PyErr_NoMemory() : PyLong_FromLongLong(n);
    }
    PyBuffer_Release(&slot_pos);
    PyBuffer_Release(&order);
    return res;
}

#define MAX_STATES 64

/* The LRU states of `caps` and their writable int64 misses arrays of `outs` (one per state,
 * `steps` long each); *got counts the buffers taken, which the caller releases even on failure. */
static int take_states(PyObject *caps, PyObject *outs, Py_ssize_t ns, long long steps, lru_state **st,
                       int64_t **mis, Py_buffer *bufs, Py_ssize_t *got)
{
    for (; *got < ns; (*got)++) {
        Py_ssize_t i = *got;
        st[i] = (lru_state *)PyCapsule_GetPointer(PyTuple_GET_ITEM(caps, i), CAPSULE);
        if (!st[i]) return 0;
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(outs, i), &bufs[i], PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) return 0;
        if (!need_len(&bufs[i], (Py_ssize_t)(steps * 8), "misses")) { (*got)++; return 0; }
        mis[i] = (int64_t *)bufs[i].buf;
    }
    return 1;
}

static const char *CHANGES_CAPSULE = "hisparse.changes";

static void changes_capsule_free(PyObject *cap)
{
    changes_t *c = (changes_t *)PyCapsule_GetPointer(cap, CHANGES_CAPSULE);
    if (c) { free(c->w); free(c); }
}

static PyObject *py_changes_new(PyObject *self, PyObject *args)
{
    changes_t *c = (changes_t *)calloc(1, sizeof(changes_t));
    if (!c) return PyErr_NoMemory();
    PyObject *cap = PyCapsule_New(c, CHANGES_CAPSULE, changes_capsule_free);
    if (!cap) free(c);
    return cap;
}

static PyObject *py_decode_changes(PyObject *self, PyObject *args)
{
    PyObject *cap, *bufs;
    Py_buffer raw, ctx;
    long long steps, width, k, prev_ctx;
    int ordered, coding;
    if (!PyArg_ParseTuple(args, "Oy*LLpiLLO!w*", &cap, &raw, &steps, &width, &ordered, &coding, &k, &prev_ctx,
                          &PyTuple_Type, &bufs, &ctx))
        return NULL;
    PyObject *res = NULL;
    int64_t Bs[MAX_STATES];
    Py_ssize_t nbs = PyTuple_GET_SIZE(bufs);
    changes_t *ch = (changes_t *)PyCapsule_GetPointer(cap, CHANGES_CAPSULE);
    if (!ch || !need_len(&ctx, (Py_ssize_t)(steps * 8), "ctx_out")) goto out;
    if (nbs > MAX_STATES) { PyErr_SetString(PyExc_ValueError, "decode_changes: at most 64 buffers"); goto out; }
    for (Py_ssize_t i = 0; i < nbs; i++) {
        Bs[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(bufs, i));
        if (Bs[i] == -1 && PyErr_Occurred()) goto out;
    }
    {
        int64_t acc = 0, bad = 0;
        int code;
        Py_BEGIN_ALLOW_THREADS
        code = decode_changes(ch, (const uint8_t *)raw.buf, raw.len, steps, width, ordered, coding, k, prev_ctx, Bs, nbs,
                              (int64_t *)ctx.buf, &acc, &bad);
        Py_END_ALLOW_THREADS
        if (code == STEP_NOMEM) PyErr_NoMemory();
        else res = Py_BuildValue("(iLL)", code, (long long)bad, (long long)acc);
    }
out:
    PyBuffer_Release(&raw);
    PyBuffer_Release(&ctx);
    return res;
}

static PyObject *py_lru_apply_changes(PyObject *self, PyObject *args)
{
    PyObject *caps, *outs, *cap;
    Py_buffer ctx;
    long long steps;
    if (!PyArg_ParseTuple(args, "O!O!OLy*", &PyTuple_Type, &caps, &PyTuple_Type, &outs, &cap, &steps, &ctx))
        return NULL;
    PyObject *res = NULL;
    Py_ssize_t ns = PyTuple_GET_SIZE(caps);
    lru_state *st[MAX_STATES];
    int64_t *mis[MAX_STATES];
    Py_buffer bufs[MAX_STATES];
    Py_ssize_t got = 0;
    changes_t *ch = (changes_t *)PyCapsule_GetPointer(cap, CHANGES_CAPSULE);
    if (!ch) goto out;
    if (ns > MAX_STATES || PyTuple_GET_SIZE(outs) != ns) {
        PyErr_SetString(PyExc_ValueError, "lru_apply_changes: one misses array per state, at most 64");
        goto out;
    }
    if (ch->steps != steps || steps < 0) {
        PyErr_Format(PyExc_ValueError, "lru_apply_changes: the buffer holds %lld clean steps, not %lld",
                     (long long)ch->steps, steps);
        goto out;
    }
    if (!need_len(&ctx, (Py_ssize_t)(steps * 8), "ctx")) goto out;
    if (!take_states(caps, outs, ns, steps, st, mis, bufs, &got)) goto out;
    {
        int64_t bad = 0;
        int code;
        Py_BEGIN_ALLOW_THREADS
        code = lru_apply_changes(st, ns, ch, steps, (const int64_t *)ctx.buf, mis, &bad);
        Py_END_ALLOW_THREADS
        if (code == STEP_NOROW)
            PyErr_Format(PyExc_ValueError, "lru_apply_changes: step %lld needs its row, decoded for other buffers",
                         (long long)bad);
        else if (code) step_error(code, bad, st[0]);
        else res = Py_NewRef(Py_None);
    }
out:
    for (Py_ssize_t i = 0; i < got; i++) PyBuffer_Release(&bufs[i]);
    PyBuffer_Release(&ctx);
    return res;
}

/* A zlib stream made of stored (uncompressed) deflate blocks only, as zlib level 0 writes it
 * (`--compression stored`): the size of its data, copied to out when out is not NULL; -1 when
 * some block is compressed (the caller inflates it with zlib), -2 when the framing is broken
 * (block lengths, a final block, exactly the 4-byte adler32 after it). The adler32 itself is not
 * recomputed: the reader has checked the payload's crc32 (format.py CodedChunk.coded). */
static int64_t unstore(const uint8_t *p, Py_ssize_t n, uint8_t *out)
{
    Py_ssize_t pos = 2; /* past the zlib header, which the caller has checked */
    int64_t size = 0;
    for (;;) {
        if (pos + 5 > n) return -2;
        uint8_t head = p[pos];
        if (head & 0x06) return -1; /* BTYPE != 00 */
        unsigned len = p[pos + 1] | (unsigned)p[pos + 2] << 8, nlen = p[pos + 3] | (unsigned)p[pos + 4] << 8;
        if ((len ^ 0xFFFFu) != nlen || pos + 5 + (Py_ssize_t)len > n) return -2;
        if (out) memcpy(out + size, p + pos + 5, len);
        size += len;
        pos += 5 + len;
        if (head & 1) return pos + 4 == n ? size : -2;
    }
}

static PyObject *py_unstore(PyObject *self, PyObject *args)
{
    Py_buffer raw, out;
    int have_out = 0;
    PyObject *target = Py_None;
    if (!PyArg_ParseTuple(args, "y*|O", &raw, &target)) return NULL;
    PyObject *res = NULL;
    if (raw.len < 6) { res = PyLong_FromLongLong(-2); goto done; }
    if (target != Py_None) {
        if (PyObject_GetBuffer(target, &out, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) goto done;
        have_out = 1;
    }
    int64_t size = unstore((const uint8_t *)raw.buf, raw.len, NULL);
    if (size >= 0 && have_out) {
        if (out.len < size) {
            PyErr_Format(PyExc_ValueError, "unstore: out has %zd bytes, the data %lld", out.len, (long long)size);
            goto done;
        }
        Py_BEGIN_ALLOW_THREADS
        unstore((const uint8_t *)raw.buf, raw.len, (uint8_t *)out.buf);
        Py_END_ALLOW_THREADS
    }
    res = PyLong_FromLongLong(size);
done:
    if (have_out) PyBuffer_Release(&out);
    PyBuffer_Release(&raw);
    return res;
}


static PyObject *py_lru_seq_rows(PyObject *self, PyObject *args)
{
    Py_buffer idx, ctx, misses, slots, slot_pos, order;
    long long steps, width, B;
    int reserve, prefix, record;
    if (!PyArg_ParseTuple(args, "y*LLy*Lppw*pw*w*w*", &idx, &steps, &width, &ctx, &B, &reserve, &prefix, &misses,
                          &record, &slots, &slot_pos, &order))
        return NULL;
    PyObject *res = NULL;
    if (B < 1 || B >= INT32_MAX) PyErr_Format(PyExc_ValueError, "buffer %lld out of range", B);
    else if (need_len(&idx, (Py_ssize_t)(steps * width * 4), "indices") && need_len(&ctx, (Py_ssize_t)(steps * 8), "ctx_len") &&
             need_len(&misses, (Py_ssize_t)(steps * 8), "misses") &&
             (!record || need_len(&slots, (Py_ssize_t)(steps * width * 4), "slots")) &&
             need_len(&slot_pos, (Py_ssize_t)(B * 8), "slot_pos") && need_len(&order, (Py_ssize_t)(B * 8), "order")) {
        int64_t bad = 0, n = 0;
        int code;
        Py_BEGIN_ALLOW_THREADS
        code = lru_seq_rows((const int32_t *)idx.buf, steps, width, (const int64_t *)ctx.buf, B, reserve, prefix,
                            (int64_t *)misses.buf, record, (int32_t *)slots.buf, (int64_t *)slot_pos.buf,
                            (int64_t *)order.buf, &n, &bad);
        Py_END_ALLOW_THREADS
        if (code == STEP_NOMEM) PyErr_NoMemory();
        else if (code == STEP_RANGE)
            PyErr_Format(PyExc_ValueError, "step %lld selects a position at or past its ctx_len", (long long)bad);
        else res = PyLong_FromLongLong(n);
    }
    PyBuffer_Release(&idx);
    PyBuffer_Release(&ctx);
    PyBuffer_Release(&misses);
    PyBuffer_Release(&slots);
    PyBuffer_Release(&slot_pos);
    PyBuffer_Release(&order);
    return res;
}


typedef int (*seq_rows_fn)(const int32_t *, int64_t, int64_t, const int64_t *, int64_t, int, int, int64_t *, int64_t *,
                           int64_t *);

static PyObject *seq_rows_call(PyObject *args, seq_rows_fn fn);

static PyObject *py_opt_seq_rows(PyObject *self, PyObject *args) { return seq_rows_call(args, opt_seq_rows); }

static PyObject *py_lfu_seq_rows(PyObject *self, PyObject *args) { return seq_rows_call(args, lfu_seq_rows); }

static PyObject *py_opt_batched_rows(PyObject *self, PyObject *args) { return seq_rows_call(args, opt_batched_rows); }

static PyObject *py_lfu_batched_rows(PyObject *self, PyObject *args) { return seq_rows_call(args, lfu_batched_rows); }

static PyObject *seq_rows_call(PyObject *args, seq_rows_fn fn)
{
    Py_buffer idx, ctx, misses, slot_pos;
    long long steps, width, B;
    int reserve, prefix;
    if (!PyArg_ParseTuple(args, "y*LLy*Lppw*w*", &idx, &steps, &width, &ctx, &B, &reserve, &prefix, &misses, &slot_pos))
        return NULL;
    PyObject *res = NULL;
    if (B < 1 || B >= INT32_MAX / 2) PyErr_Format(PyExc_ValueError, "buffer %lld out of range", B);
    else if (need_len(&idx, (Py_ssize_t)(steps * width * 4), "indices") && need_len(&ctx, (Py_ssize_t)(steps * 8), "ctx_len") &&
             need_len(&misses, (Py_ssize_t)(steps * 8), "misses") && need_len(&slot_pos, (Py_ssize_t)(B * 8), "slot_pos")) {
        int64_t bad = 0;
        int code;
        Py_BEGIN_ALLOW_THREADS
        code = fn((const int32_t *)idx.buf, steps, width, (const int64_t *)ctx.buf, B, reserve, prefix,
                  (int64_t *)misses.buf, (int64_t *)slot_pos.buf, &bad);
        Py_END_ALLOW_THREADS
        if (code == STEP_NOMEM) PyErr_NoMemory();
        else if (code == STEP_RANGE)
            PyErr_Format(PyExc_ValueError, "step %lld selects a position at or past its ctx_len", (long long)bad);
        else if (code == STEP_FULL) /* opt_batched_rows' guard: a protected slot at the root */
            PyErr_Format(PyExc_RuntimeError, "step %lld: no unprotected slot to evict (ctx_len going down?)",
                         (long long)bad);
        else res = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&idx);
    PyBuffer_Release(&ctx);
    PyBuffer_Release(&misses);
    PyBuffer_Release(&slot_pos);
    return res;
}

static PyMethodDef methods[] = {
    {"decode", py_decode, METH_VARARGS,
     "decode(raw, steps, width, ordered, out, out_width, ctx_out, coding=2) -> (code, step)"},
    {"check_rows", py_check_rows, METH_VARARGS, "check_rows(indices, steps, width, ctx_len, k) -> (code, step, value, extra)"},
    {"lru_new", py_lru_new, METH_VARARGS, "lru_new(buffer, reserve, prefix) -> state"},
    {"lru_reset", py_lru_reset, METH_VARARGS, "lru_reset(state): as lru_new left it, its memory kept"},
    {"lru_rows", py_lru_rows, METH_VARARGS, "lru_rows(state, indices, steps, width, ctx_len, misses, record, slots)"},
    {"lru_seq_rows", py_lru_seq_rows, METH_VARARGS,
     "lru_seq_rows(indices, steps, width, ctx_len, buffer, reserve, prefix, misses, record, slots, slot_pos, order) "
     "-> length of order"},
    {"decode_rows_checked", py_decode_rows_checked, METH_VARARGS,
     "decode_rows_checked(raw, steps, width, ordered, coding, k, prev_ctx, out, out_width, ctx_out) -> (code, step, accesses)"},
    {"count_entries", py_count_entries, METH_VARARGS, "count_entries(indices, steps, width) -> entries >= 0"},
    {"lru_stack_hist", py_lru_stack_hist, METH_VARARGS,
     "lru_stack_hist(indices, steps, width, ctx_len, reserve, max_size, hist): adds LRU stack distances to hist"},
    {"opt_stack_hist", py_opt_stack_hist, METH_VARARGS,
     "opt_stack_hist(indices, steps, width, ctx_len, reserve, prefix, batched, min_size, max_size, hist): adds OPT "
     "stack depths to hist (those <= min_size at min_size)"},
    {"opt_seq_rows", py_opt_seq_rows, METH_VARARGS,
     "opt_seq_rows(indices, steps, width, ctx_len, buffer, reserve, prefix, misses, slot_pos)"},
    {"lfu_seq_rows", py_lfu_seq_rows, METH_VARARGS,
     "lfu_seq_rows(indices, steps, width, ctx_len, buffer, reserve, prefix, misses, slot_pos)"},
    {"opt_batched_rows", py_opt_batched_rows, METH_VARARGS,
     "opt_batched_rows(indices, steps, width, ctx_len, buffer, reserve, prefix, misses, slot_pos)"},
    {"lfu_batched_rows", py_lfu_batched_rows, METH_VARARGS,
     "lfu_batched_rows(indices, steps, width, ctx_len, buffer, reserve, prefix, misses, slot_pos)"},
    {"lru_result", py_lru_result, METH_VARARGS, "lru_result(state, slot_pos, order) -> length of order"},
    {"unstore", py_unstore, METH_VARARGS,
     "unstore(zlib_payload, out=None) -> size of its stored blocks' data (copied into out); -1 compressed, -2 broken"},
    {"changes_new", py_changes_new, METH_NOARGS, "changes_new() -> a changes buffer"},
    {"decode_changes", py_decode_changes, METH_VARARGS,
     "decode_changes(changes, raw, steps, width, ordered, coding, k, prev_ctx, buffers, ctx_out) -> (code, step, accesses)"},
    {"lru_apply_changes", py_lru_apply_changes, METH_VARARGS, "lru_apply_changes(states, misses, changes, steps, ctx)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", "Compiled fast paths (see _native.c).", -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__native(void)
{
    PyObject *m = PyModule_Create(&module);
#define AS_CONSTANT(name, value) \
    if (m && PyModule_AddIntConstant(m, #name, name) < 0) { Py_DECREF(m); m = NULL; }
    PROBLEM_CODES(AS_CONSTANT)
#undef AS_CONSTANT
    return m;
}
