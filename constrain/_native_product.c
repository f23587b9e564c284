/* product_runs: the reachable pairs of two lazy DFAs, or of a DFA and a count of units
 * (see _native.c for the contract). */
#include "_native_common.h"

#define DEAD (-1)
#define EMPTY_KEY (-1)           /* (DEAD, DEAD): never a pair, the left side is live */

/* Pairs (left state, right state) packed into an int64 -> their ids, open addressing. */
typedef struct {
    int64_t *keys;
    int32_t *ids;
    Py_ssize_t cap, len;
} PairMap;

static inline int64_t
pair_key(int32_t l, int32_t r)
{
    return (int64_t)(((uint64_t)(uint32_t)l << 32) | (uint32_t)r);
}

static inline Py_ssize_t
pair_slot(const PairMap *m, int64_t key)
{
    Py_ssize_t i = (Py_ssize_t)(((uint64_t)key * 0x9E3779B97F4A7C15ULL) >> 20) & (m->cap - 1);
    while (m->keys[i] != EMPTY_KEY && m->keys[i] != key)
        i = (i + 1) & (m->cap - 1);
    return i;
}

static int
pairmap_init(PairMap *m, Py_ssize_t cap)
{
    m->keys = PyMem_Malloc(sizeof(int64_t) * (size_t)cap);
    m->ids = PyMem_Malloc(sizeof(int32_t) * (size_t)cap);
    if (m->keys == NULL || m->ids == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < cap; i++)
        m->keys[i] = EMPTY_KEY;
    m->cap = cap;
    m->len = 0;
    return 0;
}

static void
pairmap_free(PairMap *m)
{
    PyMem_Free(m->keys);
    PyMem_Free(m->ids);
}

static int
pairmap_grow(PairMap *m)
{
    PairMap bigger;
    if (pairmap_init(&bigger, m->cap * 2) < 0) {
        pairmap_free(&bigger);
        return -1;
    }
    for (Py_ssize_t i = 0; i < m->cap; i++)
        if (m->keys[i] != EMPTY_KEY) {
            Py_ssize_t j = pair_slot(&bigger, m->keys[i]);
            bigger.keys[j] = m->keys[i];
            bigger.ids[j] = m->ids[i];
        }
    bigger.len = m->len;
    pairmap_free(m);
    *m = bigger;
    return 0;
}

typedef struct {
    PairMap map;
    IntVec pairs, stack;         /* pairs: l, r per id; stack: ids still to expand */
    int max_states;
    PyObject *check;
    int over;                    /* set when a pair past max_states was asked for */
} PairWalk;

/* The id of pair (l, r), added (and queued) if new; -1 with an exception, or with
 * ``over`` set past max_states. As product._ProductBuilder._pair_id: the deadline is
 * checked before every 1,024th new pair. */
static int32_t
pair_id(PairWalk *w, int32_t l, int32_t r)
{
    int64_t key = pair_key(l, r);
    Py_ssize_t slot = pair_slot(&w->map, key);
    if (w->map.keys[slot] == key)
        return w->map.ids[slot];
    int32_t id = (int32_t)w->map.len;
    if (id >= w->max_states) {
        w->over = 1;
        return -1;
    }
    if ((id & 1023) == 0) {
        PyObject *done = PyObject_CallNoArgs(w->check);
        if (done == NULL)
            return -1;
        Py_DECREF(done);
    }
    w->map.keys[slot] = key;
    w->map.ids[slot] = id;
    w->map.len++;
    if (vec_push(&w->pairs, l) < 0 || vec_push(&w->pairs, r) < 0 || vec_push(&w->stack, id) < 0)
        return -1;
    if (w->map.len * 2 > w->map.cap && pairmap_grow(&w->map) < 0)
        return -1;
    return id;
}

/* ---- a count of units as the right side (product._UnitCounter) --------------------------- */

/* rep(unit, lo, hi) as a count of units read beside the unit's own automaton: state
 * n * units + u is n units read, then unit state u (0: between units). ``rows``: int32
 * [units, alphabet], each entry DEAD, a unit state, or ``units`` (the unit ends). The
 * count stops at ``cap`` (hi, or lo when there is no hi): a unit ending there is DEAD
 * past hi, or stays at cap (``saturate``: no hi), and with a hi no unit starts there. */
typedef struct {
    Py_buffer rows;
    int have_rows, units, lo, cap, saturate;
} UnitCount;

/* Reads product_runs's ``counter`` argument (None, or (rows, lo, cap, saturate)); 0 and
 * have_rows unset for None. */
static int
unit_count_read(PyObject *arg, int alphabet, UnitCount *c)
{
    if (arg == Py_None)
        return 0;
    PyObject *rows;
    if (!PyArg_ParseTuple(arg, "Oiip:product_runs counter", &rows, &c->lo, &c->cap, &c->saturate))
        return -1;
    if (get_ints(rows, 4, 2, 0, &c->rows, "counter rows") < 0)
        return -1;
    c->have_rows = 1;
    Py_ssize_t units = c->rows.shape[0];
    if (c->rows.shape[1] != alphabet || units < 1 || c->lo < 0 || c->cap < 0
            || ((int64_t)c->cap + 1) * units > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "product_runs(): counter rows of the alphabet's "
                        "width and (cap + 1) * units within int32");
        return -1;
    }
    c->units = (int)units;
    const int32_t *t = c->rows.buf;
    for (Py_ssize_t i = 0; i < units * alphabet; i++)
        if (t[i] < DEAD || t[i] > c->units) {
            PyErr_SetString(PyExc_ValueError, "product_runs(): counter rows hold DEAD, a unit "
                            "state or the unit count");
            return -1;
        }
    return 0;
}

/* The row of counter state ``r`` (0 <= r <= (cap + 1) * units - 1) into ``out``. */
static void
unit_count_row(const UnitCount *c, int alphabet, int32_t r, int32_t *out)
{
    int32_t n = r / c->units, at = n * c->units;
    const int32_t *t = (const int32_t *)c->rows.buf + (Py_ssize_t)(r % c->units) * alphabet;
    int full = n == c->cap && !c->saturate;          /* no unit may start or end */
    int32_t ended = n < c->cap ? at + c->units : at;
    for (int s = 0; s < alphabet; s++) {
        int32_t x = t[s];
        out[s] = x == DEAD || full ? DEAD : x == c->units ? ended : at + x;
    }
}

/* product_runs(left, right, left_start, right_start, alphabet, diff, max_states, check,
 *              counter=None) -> (pairs, accepting, runs) or None past max_states (see
 * _native.c). */
PyObject *
product_runs(PyObject *module, PyObject *args)
{
    PyObject *left_obj, *right_obj, *check, *counter_arg = Py_None;
    int l0, r0, alphabet, diff, max_states;
    if (!PyArg_ParseTuple(args, "OOiiipiO|O:product_runs", &left_obj, &right_obj, &l0, &r0,
                          &alphabet, &diff, &max_states, &check, &counter_arg))
        return NULL;
    if (alphabet < 1 || alphabet > 256 || l0 < 0) {
        PyErr_SetString(PyExc_ValueError, "product_runs(): alphabet 1..256 and a live left start");
        return NULL;
    }
    int32_t dead_row[256];       /* the right side's row when it is DEAD */
    int32_t count_row[256];      /* a counter's row, computed */
    for (int b = 0; b < 256; b++)
        dead_row[b] = DEAD;
    /* the operands are private to the product: their rows are built in place, unless both
     * sides are one DFA (then read through dfa.row(), so that neither sees a stale table) */
    DFAView left = {0}, right = {0};
    int mode = left_obj != right_obj ? DFA_IN_PLACE : DFA_READ;
    UnitCount count = {0};
    PairWalk w = {.max_states = max_states, .check = check};
    IntVec accepting = {0}, runs = {0};
    PyObject *result = NULL;
    if (unit_count_read(counter_arg, alphabet, &count) < 0)
        goto done;
    if (count.have_rows && (r0 < 0 || r0 >= (count.cap + 1) * count.units)) {
        PyErr_SetString(PyExc_ValueError, "product_runs(): a counter's start out of range");
        goto done;
    }
    if (pairmap_init(&w.map, 1024) < 0 || dfa_open(&left, left_obj, mode) < 0
            || (!count.have_rows && dfa_open(&right, right_obj, mode) < 0))
        goto done;
    if (pair_id(&w, l0, r0) < 0)
        goto stop;
    while (w.stack.len > 0) {
        int32_t here = w.stack.data[--w.stack.len];
        int32_t l = w.pairs.data[2 * here], r = w.pairs.data[2 * here + 1];
        int accept_l, accept_r = 0, reread = 0;
        if (dfa_accepting(&left, l, &accept_l) < 0)
            goto done;
        if (count.have_rows)
            accept_r = r != DEAD && r % count.units == 0 && r / count.units >= count.lo;
        else if (r != DEAD && dfa_accepting(&right, r, &accept_r) < 0)
            goto done;
        if (vec_reserve(&accepting, w.map.len) < 0)
            goto done;
        accepting.len = w.map.len;
        accepting.data[here] = accept_l && (accept_r != diff);
        /* the left row first, as the reference builds them; read again after the right
         * one is built, in case both sides are one DFA */
        if (dfa_row(&left, l, &reread) == NULL)
            goto done;
        const int32_t *row_r = dead_row;
        if (r != DEAD && count.have_rows) {
            unit_count_row(&count, alphabet, r, count_row);
            row_r = count_row;
        } else if (r != DEAD) {
            row_r = dfa_row(&right, r, &reread);
        }
        const int32_t *row_l = row_r == NULL ? NULL : dfa_row(&left, l, &reread);
        if (row_l == NULL)
            goto done;
        for (int lo = 0; lo < alphabet;) {
            int32_t tl = row_l[lo], tr = row_r[lo];
            int hi = lo;
            while (hi + 1 < alphabet && row_l[hi + 1] == tl && row_r[hi + 1] == tr)
                hi++;
            if (tl >= 0 && (tr >= 0 || diff)) {
                int32_t target = pair_id(&w, tl, tr);
                if (target < 0)
                    goto stop;
                if (vec_push(&runs, here) < 0 || vec_push(&runs, lo) < 0
                        || vec_push(&runs, hi) < 0 || vec_push(&runs, target) < 0)
                    goto done;
            }
            lo = hi + 1;
        }
    }
    if (vec_reserve(&accepting, w.map.len) < 0)
        goto done;
    {
        PyObject *flags = PyBytes_FromStringAndSize(NULL, w.map.len);
        if (flags == NULL)
            goto done;
        char *out = PyBytes_AS_STRING(flags);
        for (Py_ssize_t i = 0; i < w.map.len; i++)
            out[i] = (char)accepting.data[i];
        PyObject *pairs = ints_bytes(&w.pairs), *runs_out = ints_bytes(&runs);
        if (pairs != NULL && runs_out != NULL)
            result = PyTuple_Pack(3, pairs, flags, runs_out);
        Py_DECREF(flags);
        Py_XDECREF(pairs);
        Py_XDECREF(runs_out);
    }
    goto done;
stop:
    if (w.over && !PyErr_Occurred())
        result = Py_NewRef(Py_None);
done:
    dfa_release(&left);
    dfa_release(&right);
    view_drop(&count.rows, &count.have_rows);
    pairmap_free(&w.map);
    vec_free(&w.pairs);
    vec_free(&w.stack);
    vec_free(&accepting);
    vec_free(&runs);
    return result;
}
