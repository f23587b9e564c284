/* The compiled core of the constraint layer: lazy-DFA rows and vocabulary-trie walks.
 *
 * Two hot loops of a first visit, each with a numpy/Python reference beside it (used when
 * this module is not built, or with TAMIS_NATIVE_CONSTRAIN=0):
 *
 *   NFARows(edge_start, edge_lo, edge_hi, edge_to, eps_start, eps_to, class_of, accept)
 *       .targets(nfa_set) -> (target sets, per-byte index, accepting flags)
 *     One step of the subset construction (automaton.LazyDFA._build_row): for each byte
 *     class, the union of the edge targets of ``nfa_set``'s states, closed over epsilon
 *     edges and kept to the important states (those with a byte edge, and ``accept``),
 *     as sorted tuples; the distinct ones in the order the reference first meets them (so
 *     both number new DFA states alike), int16[256] of the index of each byte's target
 *     set (-1 = dead), and whether each set holds ``accept``. The arrays are a sealed nfa.NFA's CSR arrays (int32), ``class_of``
 *     its 256 byte classes as bytes. put_row(trans, state, by_byte, ids) then writes the
 *     row: trans[state, b] = ids[by_byte[b]] (the last id, DEAD, where it is -1).
 *
 *   Trie(child_start, byte, under_lo, ending_here, by_bytes)
 *       .walk(dfa, state, live_out, tokens_out, first_bytes, want_ends) -> (end tokens, cuts)
 *     token_trie.walk_trie over the trie laid out depth first (built once per vocabulary
 *     from token_trie.VocabTrie's arrays): a dead node's subtree is skipped in one step.
 *     Marks live_out[n] (when given) for every trie node whose prefix stays live from
 *     ``state`` (its first byte in ``first_bytes`` when given), tokens_out[t] (when given)
 *     for the tokens those nodes spell, and with ``want_ends`` returns the (token, k) pairs
 *     whose first k bytes (k shorter than the token) reach an accepting state, as int32
 *     bytes. It reads ``dfa.trans`` (int32 [states, 256]); a row not built yet (entry 0
 *     UNCOMPUTED) is built by calling ``dfa.row(state)``, after which ``dfa.trans`` and
 *     ``dfa.accepting_array()`` are read again (both may have been replaced). It builds
 *     the rows the reference builds: those of the states of live nodes with children.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Bumped when a signature or result changes: the loader refuses a stale build. */
#define NATIVE_VERSION 1
#define UNCOMPUTED (-2)

/* ---- growable int arrays ---------------------------------------------------------------- */

typedef struct {
    int32_t *data;
    Py_ssize_t len, cap;
} IntVec;

static int
vec_reserve(IntVec *v, Py_ssize_t need)
{
    if (need <= v->cap)
        return 0;
    Py_ssize_t cap = v->cap ? v->cap : 64;
    while (cap < need)
        cap *= 2;
    int32_t *data = PyMem_Realloc(v->data, (size_t)cap * sizeof(int32_t));
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    v->data = data;
    v->cap = cap;
    return 0;
}

static inline int
vec_push(IntVec *v, int32_t x)
{
    if (v->len == v->cap && vec_reserve(v, v->len + 1) < 0)
        return -1;
    v->data[v->len++] = x;
    return 0;
}

static void
vec_free(IntVec *v)
{
    PyMem_Free(v->data);
    v->data = NULL;
    v->len = v->cap = 0;
}

static int
cmp_int32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static void
sort_ints(int32_t *a, Py_ssize_t n)
{
    if (n > 24) {
        qsort(a, (size_t)n, sizeof(int32_t), cmp_int32);
        return;
    }
    for (Py_ssize_t i = 1; i < n; i++) {         /* short lists: insertion sort */
        int32_t x = a[i];
        Py_ssize_t j = i;
        for (; j > 0 && a[j - 1] > x; j--)
            a[j] = a[j - 1];
        a[j] = x;
    }
}

/* Sorts and drops repeats; returns the new length. */
static Py_ssize_t
sort_unique(int32_t *a, Py_ssize_t n)
{
    if (n < 2)
        return n;
    sort_ints(a, n);
    Py_ssize_t out = 1;
    for (Py_ssize_t i = 1; i < n; i++)
        if (a[i] != a[out - 1])
            a[out++] = a[i];
    return out;
}

static uint64_t
hash_ints(const int32_t *a, Py_ssize_t n)
{
    uint64_t h = 1469598103934665603ULL ^ (uint64_t)n;
    for (Py_ssize_t i = 0; i < n; i++) {
        h ^= (uint32_t)a[i];
        h *= 1099511628211ULL;
    }
    return h;
}

/* ---- buffers ------------------------------------------------------------------------------ */

/* A C-contiguous buffer of integers (or bools) of ``itemsize`` bytes and ``ndim`` dims. */
static int
get_ints(PyObject *obj, Py_ssize_t itemsize, int ndim, int writable, Py_buffer *view,
         const char *name)
{
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0)
        return -1;
    const char *fmt = view->format ? view->format : "B";
    if (*fmt == '<' || *fmt == '=' || *fmt == '@')
        fmt++;
    int integral = fmt[0] != '\0' && fmt[1] == '\0' && strchr("bBhHiIlLqQ?", fmt[0]) != NULL;
    if (!integral || view->itemsize != itemsize || view->ndim != ndim) {
        PyErr_Format(PyExc_TypeError,
                     "%s: expected a contiguous %d-d array of %zd-byte integers, got format "
                     "'%s', item size %zd, %d dimensions",
                     name, ndim, itemsize, view->format ? view->format : "B",
                     view->itemsize, view->ndim);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* ---- NFARows: one DFA row's target sets ------------------------------------------------- */

enum { EDGE_START, EDGE_LO, EDGE_HI, EDGE_TO, EPS_START, EPS_TO, NUM_ARRAYS };

typedef struct {
    PyObject_HEAD
    Py_buffer views[NUM_ARRAYS];
    int num_views;
    const int32_t *edge_start, *edge_lo, *edge_hi, *edge_to, *eps_start, *eps_to;
    Py_ssize_t num_states, num_edges, num_eps;
    uint8_t class_of[256];
    int num_classes;
    int32_t accept;
    uint32_t *stamp;             /* per NFA state: the closure that last reached it */
    uint32_t stamp_now;
    IntVec stack, found, bucket, sets;
} NFARows;

static void
NFARows_dealloc(NFARows *self)
{
    for (int i = 0; i < self->num_views; i++)
        PyBuffer_Release(&self->views[i]);
    PyMem_Free(self->stamp);
    vec_free(&self->stack);
    vec_free(&self->found);
    vec_free(&self->bucket);
    vec_free(&self->sets);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int
check_starts(const int32_t *start, Py_ssize_t num_states, Py_ssize_t rows, const char *name)
{
    if (start[0] != 0 || start[num_states] != rows) {
        PyErr_Format(PyExc_ValueError, "%s does not span its %zd rows", name, rows);
        return -1;
    }
    for (Py_ssize_t q = 0; q < num_states; q++)
        if (start[q] > start[q + 1]) {
            PyErr_Format(PyExc_ValueError, "%s is not sorted at state %zd", name, q);
            return -1;
        }
    return 0;
}

static int
check_states(const int32_t *to, Py_ssize_t rows, Py_ssize_t num_states, const char *name)
{
    for (Py_ssize_t i = 0; i < rows; i++)
        if (to[i] < 0 || to[i] >= num_states) {
            PyErr_Format(PyExc_ValueError, "%s holds state %d, outside 0..%zd", name,
                         (int)to[i], num_states - 1);
            return -1;
        }
    return 0;
}

static int
NFARows_init(NFARows *self, PyObject *args, PyObject *kwds)
{
    static const char *names[NUM_ARRAYS] = {"edge_start", "edge_lo", "edge_hi", "edge_to",
                                            "eps_start", "eps_to"};
    PyObject *arrays[NUM_ARRAYS];
    Py_buffer class_view;
    int accept;
    if (self->num_views) {
        PyErr_SetString(PyExc_TypeError, "NFARows is initialised once");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "OOOOOOy*i:NFARows", &arrays[0], &arrays[1], &arrays[2],
                          &arrays[3], &arrays[4], &arrays[5], &class_view, &accept))
        return -1;
    if (class_view.len != 256) {
        PyBuffer_Release(&class_view);
        PyErr_SetString(PyExc_ValueError, "class_of: expected 256 bytes");
        return -1;
    }
    memcpy(self->class_of, class_view.buf, 256);
    PyBuffer_Release(&class_view);
    for (int i = 0; i < NUM_ARRAYS; i++) {
        if (get_ints(arrays[i], 4, 1, 0, &self->views[i], names[i]) < 0)
            return -1;
        self->num_views++;
    }
    const int32_t *p[NUM_ARRAYS];
    for (int i = 0; i < NUM_ARRAYS; i++)
        p[i] = self->views[i].buf;
    self->edge_start = p[EDGE_START], self->edge_lo = p[EDGE_LO], self->edge_hi = p[EDGE_HI];
    self->edge_to = p[EDGE_TO], self->eps_start = p[EPS_START], self->eps_to = p[EPS_TO];
    self->num_states = self->views[EDGE_START].shape[0] - 1;
    self->num_edges = self->views[EDGE_LO].shape[0];
    self->num_eps = self->views[EPS_TO].shape[0];
    if (self->num_states < 0 || self->views[EPS_START].shape[0] != self->num_states + 1
            || self->views[EDGE_HI].shape[0] != self->num_edges
            || self->views[EDGE_TO].shape[0] != self->num_edges) {
        PyErr_SetString(PyExc_ValueError, "NFA arrays of inconsistent lengths");
        return -1;
    }
    if (check_starts(self->edge_start, self->num_states, self->num_edges, "edge_start") < 0
            || check_starts(self->eps_start, self->num_states, self->num_eps, "eps_start") < 0
            || check_states(self->edge_to, self->num_edges, self->num_states, "edge_to") < 0
            || check_states(self->eps_to, self->num_eps, self->num_states, "eps_to") < 0)
        return -1;
    for (Py_ssize_t i = 0; i < self->num_edges; i++)
        if (self->edge_lo[i] < 0 || self->edge_hi[i] > 255 || self->edge_lo[i] > self->edge_hi[i]) {
            PyErr_Format(PyExc_ValueError, "edge %zd has byte range %d..%d", i,
                         (int)self->edge_lo[i], (int)self->edge_hi[i]);
            return -1;
        }
    int classes = 0;
    for (int b = 0; b < 256; b++)
        if (self->class_of[b] + 1 > classes)
            classes = self->class_of[b] + 1;
    self->num_classes = classes;
    self->accept = accept;
    return 0;
}

/* The important states reachable from targets[0..n) without input, sorted, into
 * self->found. */
static int
closure(NFARows *self, const int32_t *targets, Py_ssize_t n)
{
    if (self->stamp == NULL) {
        self->stamp = PyMem_Calloc((size_t)self->num_states + 1, sizeof(uint32_t));
        if (self->stamp == NULL) {
            PyErr_NoMemory();
            return -1;
        }
    }
    if (++self->stamp_now == 0) {              /* wrapped: forget every older stamp */
        memset(self->stamp, 0, ((size_t)self->num_states + 1) * sizeof(uint32_t));
        self->stamp_now = 1;
    }
    uint32_t now = self->stamp_now;
    uint32_t *stamp = self->stamp;
    IntVec *stack = &self->stack, *found = &self->found;
    stack->len = found->len = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (stamp[targets[i]] != now) {
            stamp[targets[i]] = now;
            if (vec_push(stack, targets[i]) < 0)
                return -1;
        }
    while (stack->len) {
        int32_t p = stack->data[--stack->len];
        if (self->edge_start[p + 1] > self->edge_start[p] || p == self->accept)
            if (vec_push(found, p) < 0)
                return -1;
        for (int32_t e = self->eps_start[p]; e < self->eps_start[p + 1]; e++) {
            int32_t t = self->eps_to[e];
            if (stamp[t] != now) {
                stamp[t] = now;
                if (vec_push(stack, t) < 0)
                    return -1;
            }
        }
    }
    sort_ints(found->data, found->len);
    return 0;
}

static PyObject *
ints_to_tuple(const int32_t *a, Py_ssize_t n)
{
    PyObject *tuple = PyTuple_New(n);
    if (tuple == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x = PyLong_FromLong(a[i]);
        if (x == NULL) {
            Py_DECREF(tuple);
            return NULL;
        }
        PyTuple_SET_ITEM(tuple, i, x);
    }
    return tuple;
}

/* A distinct set: ``len`` ints at ``at`` in a shared IntVec. */
typedef struct {
    Py_ssize_t at, len;
    uint64_t hash;
} SetRef;

static int
find_set(const SetRef *refs, int count, const int32_t *pool, const int32_t *a, Py_ssize_t n,
         uint64_t hash)
{
    for (int i = 0; i < count; i++)
        if (refs[i].hash == hash && refs[i].len == n
                && memcmp(pool + refs[i].at, a, (size_t)n * sizeof(int32_t)) == 0)
            return i;
    return -1;
}

static PyObject *
NFARows_targets(NFARows *self, PyObject *nfa_set)
{
    PyObject *seq = PySequence_Fast(nfa_set, "targets() takes a sequence of NFA states");
    if (seq == NULL)
        return NULL;
    Py_ssize_t size = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    int nc = self->num_classes;
    /* pass 1: how many targets each class gets, and the order classes are first met
     * (the reference fills a dict in that order) */
    Py_ssize_t count[256] = {0};
    int order[256], num_touched = 0;
    for (Py_ssize_t i = 0; i < size; i++) {
        long q = PyLong_AsLong(items[i]);
        if (q == -1 && PyErr_Occurred())
            goto fail;
        if (q < 0 || q >= self->num_states) {
            PyErr_Format(PyExc_ValueError, "NFA state %ld outside 0..%zd", q,
                         self->num_states - 1);
            goto fail;
        }
        for (int32_t e = self->edge_start[q]; e < self->edge_start[q + 1]; e++)
            for (int c = self->class_of[self->edge_lo[e]]; c <= self->class_of[self->edge_hi[e]]; c++)
                if (count[c]++ == 0)
                    order[num_touched++] = c;
    }
    /* pass 2: the targets of each class, one run per class */
    Py_ssize_t start[257], fill[256];
    start[0] = 0;
    for (int c = 0; c < nc; c++)
        start[c + 1] = start[c] + count[c];
    memcpy(fill, start, sizeof(Py_ssize_t) * (size_t)nc);
    IntVec *bucket = &self->bucket;
    if (vec_reserve(bucket, start[nc] + 1) < 0)
        goto fail;
    for (Py_ssize_t i = 0; i < size; i++) {
        long q = PyLong_AsLong(items[i]);
        for (int32_t e = self->edge_start[q]; e < self->edge_start[q + 1]; e++)
            for (int c = self->class_of[self->edge_lo[e]]; c <= self->class_of[self->edge_hi[e]]; c++)
                bucket->data[fill[c]++] = self->edge_to[e];
    }
    /* distinct raw target sets, then their closures: distinct closures in first-met order */
    SetRef raw[256], closed[256];
    int raw_index[256], raw_to_closed[256], class_index[256];
    int num_raw = 0, num_closed = 0;
    IntVec *pool = &self->sets;
    pool->len = 0;
    for (int i = 0; i < num_touched; i++) {
        int c = order[i];
        int32_t *a = bucket->data + start[c];
        Py_ssize_t n = sort_unique(a, count[c]);
        uint64_t hash = hash_ints(a, n);
        int found = find_set(raw, num_raw, bucket->data, a, n, hash);
        if (found < 0) {
            raw[num_raw] = (SetRef){start[c], n, hash};
            if (closure(self, a, n) < 0)
                goto fail;
            const int32_t *got = self->found.data;
            Py_ssize_t m = self->found.len;
            uint64_t h = hash_ints(got, m);
            int same = find_set(closed, num_closed, pool->data, got, m, h);
            if (same < 0 && m > 0) {
                if (vec_reserve(pool, pool->len + m) < 0)
                    goto fail;
                memcpy(pool->data + pool->len, got, (size_t)m * sizeof(int32_t));
                closed[num_closed] = (SetRef){pool->len, m, h};
                pool->len += m;
                same = num_closed++;
            }
            raw_to_closed[num_raw] = m > 0 ? same : -1;
            found = num_raw++;
        }
        raw_index[i] = found;
    }
    for (int c = 0; c < nc; c++)
        class_index[c] = -1;
    for (int i = 0; i < num_touched; i++)
        class_index[order[i]] = raw_to_closed[raw_index[i]];
    Py_DECREF(seq);
    seq = NULL;

    PyObject *sets = PyTuple_New(num_closed), *accepting = PyTuple_New(num_closed);
    if (sets == NULL || accepting == NULL) {
        Py_XDECREF(sets);
        Py_XDECREF(accepting);
        return NULL;
    }
    for (int i = 0; i < num_closed; i++) {
        const int32_t *set = pool->data + closed[i].at;
        PyObject *t = ints_to_tuple(set, closed[i].len);
        if (t == NULL) {
            Py_DECREF(sets);
            Py_DECREF(accepting);
            return NULL;
        }
        PyTuple_SET_ITEM(sets, i, t);
        int holds_accept = bsearch(&self->accept, set, (size_t)closed[i].len, sizeof(int32_t),
                                   cmp_int32) != NULL;
        PyTuple_SET_ITEM(accepting, i, Py_NewRef(holds_accept ? Py_True : Py_False));
    }
    int16_t by_byte[256];
    for (int b = 0; b < 256; b++)
        by_byte[b] = (int16_t)class_index[self->class_of[b]];
    PyObject *index = PyBytes_FromStringAndSize((const char *)by_byte, sizeof(by_byte));
    if (index == NULL) {
        Py_DECREF(sets);
        Py_DECREF(accepting);
        return NULL;
    }
    return Py_BuildValue("(NNN)", sets, index, accepting);
fail:
    Py_XDECREF(seq);
    return NULL;
}

static PyMethodDef NFARows_methods[] = {
    {"targets", (PyCFunction)NFARows_targets, METH_O,
     "targets(nfa_set) -> (distinct target sets as sorted tuples, int16[256] bytes: the "
     "index of each byte's target set, -1 = dead; whether each set holds the accept state)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject NFARowsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_native.NFARows",
    .tp_basicsize = sizeof(NFARows),
    .tp_dealloc = (destructor)NFARows_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The subset construction's step over one sealed NFA (see the module doc).",
    .tp_methods = NFARows_methods,
    .tp_init = (initproc)NFARows_init,
    .tp_new = PyType_GenericNew,
};

/* put_row(trans, state, by_byte, ids): trans[state, b] = ids[by_byte[b]] (-1: the last id). */
static PyObject *
put_row(PyObject *module, PyObject *args)
{
    PyObject *trans_obj, *ids_obj;
    Py_buffer index;
    int state;
    if (!PyArg_ParseTuple(args, "Oiy*O:put_row", &trans_obj, &state, &index, &ids_obj))
        return NULL;
    Py_buffer trans;
    PyObject *ids = NULL, *result = NULL;
    int have_trans = 0;
    if (index.len != 256 * (Py_ssize_t)sizeof(int16_t)) {
        PyErr_SetString(PyExc_ValueError, "by_byte: expected int16[256]");
        goto done;
    }
    if (get_ints(trans_obj, 4, 2, 1, &trans, "trans") < 0)
        goto done;
    have_trans = 1;
    if (trans.shape[1] != 256 || state < 0 || state >= trans.shape[0]) {
        PyErr_Format(PyExc_ValueError, "trans: no row %d of 256 entries", state);
        goto done;
    }
    ids = PySequence_Fast(ids_obj, "put_row() takes a sequence of state ids");
    if (ids == NULL)
        goto done;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(ids);
    int32_t values[257];
    if (n < 1 || n > 257) {
        PyErr_SetString(PyExc_ValueError, "put_row(): 1 to 257 ids");
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        long v = PyLong_AsLong(PySequence_Fast_GET_ITEM(ids, i));
        if (v == -1 && PyErr_Occurred())
            goto done;
        values[i] = (int32_t)v;
    }
    const int16_t *by_byte = index.buf;
    int32_t row[256];
    for (int b = 0; b < 256; b++) {
        Py_ssize_t k = by_byte[b] < 0 ? n - 1 : by_byte[b];
        if (k >= n) {
            PyErr_Format(PyExc_ValueError, "by_byte[%d] = %d: no such id", b, (int)by_byte[b]);
            goto done;
        }
        row[b] = values[k];
    }
    memcpy((int32_t *)trans.buf + (Py_ssize_t)state * 256, row, sizeof(row));
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&index);
    if (have_trans)
        PyBuffer_Release(&trans);
    Py_XDECREF(ids);
    return result;
}

/* ---- Trie: the vocabulary trie in depth-first order, walked through a DFA ---------------- */

/* A DFA read from Python: dfa.trans (int32 [states, 256]), read again after dfa.row()
 * built a row, and, for ends, dfa.accepting_array() (bool [states]), read again when a
 * state past it is met. */
typedef struct {
    PyObject *dfa;
    Py_buffer trans, accepting;
    int have_trans, have_accepting;
} DFAView;

static void
dfa_release(DFAView *d)
{
    if (d->have_trans)
        PyBuffer_Release(&d->trans);
    if (d->have_accepting)
        PyBuffer_Release(&d->accepting);
    d->have_trans = d->have_accepting = 0;
}

static int
dfa_read(DFAView *d)
{
    if (d->have_trans)
        PyBuffer_Release(&d->trans);
    d->have_trans = 0;
    PyObject *trans = PyObject_GetAttrString(d->dfa, "trans");
    if (trans == NULL)
        return -1;
    int rc = get_ints(trans, 4, 2, 0, &d->trans, "dfa.trans");
    Py_DECREF(trans);
    if (rc < 0)
        return -1;
    d->have_trans = 1;
    if (d->trans.shape[1] != 256) {
        PyErr_SetString(PyExc_ValueError, "dfa.trans: expected rows of 256 entries");
        return -1;
    }
    return 0;
}

/* (Re)reads dfa.accepting_array(): only when a state past the flags read is asked about. */
static int
dfa_read_accepting(DFAView *d)
{
    if (d->have_accepting)
        PyBuffer_Release(&d->accepting);
    d->have_accepting = 0;
    PyObject *acc = PyObject_CallMethod(d->dfa, "accepting_array", NULL);
    if (acc == NULL)
        return -1;
    int rc = get_ints(acc, 1, 1, 0, &d->accepting, "dfa.accepting_array()");
    Py_DECREF(acc);
    if (rc < 0)
        return -1;
    d->have_accepting = 1;
    return 0;
}

/* The row of ``state``, built through dfa.row(state) first if need be; *reread is set when
 * the table was read again (row pointers taken before are stale then). */
static const int32_t *
dfa_row(DFAView *d, int32_t state, int *reread)
{
    for (int attempt = 0; attempt < 3; attempt++) {
        if (state >= 0 && state < d->trans.shape[0]) {
            const int32_t *row = (const int32_t *)d->trans.buf + (Py_ssize_t)state * 256;
            if (row[0] != UNCOMPUTED)
                return row;
            PyObject *built = PyObject_CallMethod(d->dfa, "row", "i", (int)state);
            if (built == NULL)
                return NULL;
            Py_DECREF(built);
        }
        if (dfa_read(d) < 0)            /* the table may have been regrown meanwhile */
            return NULL;
        *reread = 1;
    }
    PyErr_Format(PyExc_RuntimeError, "dfa.row(%d) left its row unbuilt", (int)state);
    return NULL;
}

static inline int
dfa_accepting(DFAView *d, int32_t state, int *out)
{
    if (d->have_accepting && state < d->accepting.shape[0]) {
        *out = ((const uint8_t *)d->accepting.buf)[state] != 0;
        return 0;
    }
    if (dfa_read_accepting(d) < 0)    /* not read yet, or states added since */
        return -1;
    if (state >= d->accepting.shape[0]) {
        PyErr_Format(PyExc_RuntimeError, "state %d has no accepting flag", (int)state);
        return -1;
    }
    *out = ((const uint8_t *)d->accepting.buf)[state] != 0;
    return 0;
}

/* One trie node, in depth-first (pre-)order: its subtree is nodes i .. end - 1, and the
 * tokens spelled by the nodes of that subtree are tokens[tok[i] .. tok[end]), those equal
 * to node i's prefix first (tokens[tok[i] .. tok[i + 1])). */
typedef struct {
    int32_t end, tok, node;     /* node: the trie's own number of this node */
    uint16_t depth;
    uint8_t byte;
} TrieNode;

typedef struct {
    PyObject_HEAD
    TrieNode *nodes;            /* num_nodes + 1: a sentinel holds the last tok */
    int32_t *tokens;
    int32_t *tok_node;          /* tokens[k] is spelled by nodes[tok_node[k]] */
    Py_ssize_t num_nodes, num_tokens;
    int max_depth;
} Trie;

static void
Trie_dealloc(Trie *self)
{
    PyMem_Free(self->nodes);
    PyMem_Free(self->tokens);
    PyMem_Free(self->tok_node);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

enum { T_CHILD_START, T_BYTE, T_UNDER_LO, T_ENDING_HERE, T_BY_BYTES, T_NUM };

/* Lays the trie out depth first from token_trie.VocabTrie's arrays (nodes numbered level
 * by level, children of n = child_start[n] .. child_start[n + 1]). */
static int
Trie_layout(Trie *self, const int64_t *child_start, const int64_t *byte,
            const int64_t *under_lo, const int64_t *ending_here, const int64_t *by_bytes)
{
    Py_ssize_t n = self->num_nodes;
    int64_t *stack = PyMem_Malloc(sizeof(int64_t) * (size_t)n);
    int32_t *depth_of = PyMem_Malloc(sizeof(int32_t) * (size_t)n);
    int32_t *order = PyMem_Malloc(sizeof(int32_t) * (size_t)n);
    int rc = -1;
    if (stack == NULL || depth_of == NULL || order == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t top = 0, count = 0, tok = 0;
    stack[top++] = 0;
    depth_of[0] = 0;
    while (top) {
        int64_t v = stack[--top];
        if (count >= n || child_start[v] < v + 1 || child_start[v + 1] > n
                || child_start[v] > child_start[v + 1]) {
            PyErr_SetString(PyExc_ValueError, "the trie's child ranges are malformed");
            goto done;
        }
        order[count] = (int32_t)v;
        TrieNode *node = &self->nodes[count++];
        node->node = (int32_t)v;
        node->depth = (uint16_t)depth_of[v];
        node->byte = (uint8_t)byte[v];
        node->tok = (int32_t)tok;
        if (depth_of[v] > self->max_depth)
            self->max_depth = depth_of[v];
        if (v > 0) {
            for (int64_t i = under_lo[v]; i < under_lo[v] + ending_here[v]; i++) {
                if (i < 0 || i >= self->num_tokens || tok >= self->num_tokens) {
                    PyErr_SetString(PyExc_ValueError, "the trie's token ranges are malformed");
                    goto done;
                }
                self->tok_node[tok] = (int32_t)(count - 1);
                self->tokens[tok++] = (int32_t)by_bytes[i];
            }
        }
        if (depth_of[v] >= 65535) {
            PyErr_SetString(PyExc_ValueError, "a token longer than 65,534 bytes");
            goto done;
        }
        for (int64_t c = child_start[v + 1] - 1; c >= child_start[v]; c--) {  /* first child on top */
            if (byte[c] < 0 || byte[c] > 255) {
                PyErr_SetString(PyExc_ValueError, "a trie byte outside 0..255");
                goto done;
            }
            depth_of[c] = depth_of[v] + 1;
            stack[top++] = c;
        }
    }
    if (count != n) {
        PyErr_SetString(PyExc_ValueError, "the trie does not reach every node");
        goto done;
    }
    /* subtree ends, children before parents: a node's subtree ends where its last child's does */
    for (Py_ssize_t i = n - 1; i >= 0; i--) {
        int32_t end = (int32_t)(i + 1);
        int64_t v = order[i];
        if (child_start[v + 1] > child_start[v]) {
            /* the last child is the last of v's children met in depth-first order */
            Py_ssize_t j = i + 1;
            while (j < n && self->nodes[j].depth > self->nodes[i].depth)
                j = self->nodes[j].end;
            end = (int32_t)j;
        }
        self->nodes[i].end = end;
    }
    self->nodes[n] = (TrieNode){(int32_t)n, (int32_t)tok, -1, 0, 0};
    self->num_tokens = tok;
    rc = 0;
done:
    PyMem_Free(stack);
    PyMem_Free(depth_of);
    PyMem_Free(order);
    return rc;
}

static int
Trie_init(Trie *self, PyObject *args, PyObject *kwds)
{
    static const char *names[T_NUM] = {"child_start", "byte", "under_lo", "ending_here",
                                       "by_bytes"};
    PyObject *arrays[T_NUM];
    Py_buffer views[T_NUM];
    int num_views = 0, rc = -1;
    if (self->nodes != NULL) {
        PyErr_SetString(PyExc_TypeError, "Trie is initialised once");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "OOOOO:Trie", &arrays[0], &arrays[1], &arrays[2], &arrays[3],
                          &arrays[4]))
        return -1;
    for (; num_views < T_NUM; num_views++)
        if (get_ints(arrays[num_views], 8, 1, 0, &views[num_views], names[num_views]) < 0)
            goto done;
    Py_ssize_t n = views[T_BYTE].shape[0];
    if (n < 1 || n >= INT32_MAX || views[T_CHILD_START].shape[0] != n + 1
            || views[T_UNDER_LO].shape[0] != n || views[T_ENDING_HERE].shape[0] != n
            || views[T_BY_BYTES].shape[0] >= INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "trie arrays of inconsistent lengths");
        goto done;
    }
    self->num_nodes = n;
    self->num_tokens = views[T_BY_BYTES].shape[0];
    self->nodes = PyMem_Calloc((size_t)n + 1, sizeof(TrieNode));
    self->tokens = PyMem_Malloc(sizeof(int32_t) * ((size_t)self->num_tokens + 1));
    self->tok_node = PyMem_Malloc(sizeof(int32_t) * ((size_t)self->num_tokens + 1));
    if (self->nodes == NULL || self->tokens == NULL || self->tok_node == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    rc = Trie_layout(self, views[T_CHILD_START].buf, views[T_BYTE].buf, views[T_UNDER_LO].buf,
                     views[T_ENDING_HERE].buf, views[T_BY_BYTES].buf);
done:
    for (int i = 0; i < num_views; i++)
        PyBuffer_Release(&views[i]);
    return rc;
}

/* Appends the tokens[lo .. hi) with cut ``k`` to the ends. */
static int
add_ends(IntVec *end_tok, IntVec *end_cut, const int32_t *tokens, int32_t lo, int32_t hi, int k)
{
    Py_ssize_t n = hi - lo;
    if (vec_reserve(end_tok, end_tok->len + n) < 0 || vec_reserve(end_cut, end_cut->len + n) < 0)
        return -1;
    memcpy(end_tok->data + end_tok->len, tokens + lo, sizeof(int32_t) * (size_t)n);
    for (Py_ssize_t i = 0; i < n; i++)
        end_cut->data[end_cut->len + i] = k;
    end_tok->len += n;
    end_cut->len += n;
    return 0;
}

/* The row of ``state`` in the table now read, or NULL when that table has no such row (a
 * view older than the state: the caller reads the table again). */
static inline const int32_t *
row_in_view(const DFAView *d, int32_t state)
{
    if (state >= d->trans.shape[0])
        return NULL;
    return (const int32_t *)d->trans.buf + (Py_ssize_t)state * 256;
}

/* Builds the row of the path's last state (depth ``depth``) and points the path's rows at
 * the table as read again. */
static int
build_path_row(DFAView *d, int32_t *states, const int32_t **rows, int depth)
{
    int reread = 0;
    if (dfa_row(d, states[depth], &reread) == NULL)
        return -1;
    for (int k = 0; k <= depth; k++)
        if ((rows[k] = row_in_view(d, states[k])) == NULL) {
            PyErr_Format(PyExc_RuntimeError, "state %d has no row", (int)states[k]);
            return -1;
        }
    return 0;
}

/* The walk proper: nodes in depth-first order, a dead node's subtree skipped in one step;
 * rows[d] is the row of the state reached after the d bytes of the current path, built
 * when a child of that node is first read (so, as in the reference, only the rows of
 * states of live nodes with children are built). Live nodes are marked in ``alive`` (by
 * depth-first position, zeroed by the caller): marking their tokens inside the loop cost
 * more than the walk itself (a branch on each node's token count). */
static int
Trie_scan(Trie *self, DFAView *d, int32_t state, uint8_t *alive, const uint8_t *first,
          IntVec *end_tok, IntVec *end_cut)
{
    int32_t *states = PyMem_Malloc(sizeof(int32_t) * ((size_t)self->max_depth + 1));
    const int32_t **rows = PyMem_Malloc(sizeof(int32_t *) * ((size_t)self->max_depth + 1));
    int rc = -1;
    if (states == NULL || rows == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    const TrieNode *nodes = self->nodes;
    Py_ssize_t n = self->num_nodes;
    states[0] = state;
    if (n > 1 && build_path_row(d, states, rows, 0) < 0)
        goto done;
    Py_ssize_t i = 1;
    while (i < n) {
        const TrieNode *node = &nodes[i];
        int depth = node->depth;
        const int32_t *row = rows[depth - 1];
        if (row[0] == UNCOMPUTED) {
            if (build_path_row(d, states, rows, depth - 1) < 0)
                goto done;
            row = rows[depth - 1];
        }
        int32_t next = row[node->byte];
        if (next < 0 || (first != NULL && depth == 1 && !first[node->byte])) {
            i = node->end;
            continue;
        }
        states[depth] = next;
        rows[depth] = row_in_view(d, next);
        if (rows[depth] == NULL) {          /* a state newer than the table read: read it again */
            if (dfa_read(d) < 0 || build_path_row(d, states, rows, depth - 1) < 0)
                goto done;
            rows[depth] = row_in_view(d, next);
            if (rows[depth] == NULL) {
                PyErr_Format(PyExc_RuntimeError, "state %d has no row", (int)next);
                goto done;
            }
        }
        alive[i] = 1;
        if (end_tok != NULL && node->end > i + 1) {       /* tokens longer than this node */
            int accepting;
            if (dfa_accepting(d, next, &accepting) < 0)
                goto done;
            if (accepting && add_ends(end_tok, end_cut, self->tokens, nodes[i + 1].tok,
                                      nodes[node->end].tok, depth) < 0)
                goto done;
        }
        i++;
    }
    rc = 0;
done:
    PyMem_Free(states);
    PyMem_Free(rows);
    return rc;
}

/* The outputs of a scan: live_out by the trie's own node numbers, tokens_out by token id. */
static int
Trie_mark(Trie *self, const uint8_t *alive, uint8_t *live, uint8_t *tokens_out,
          Py_ssize_t vocab)
{
    if (live != NULL)
        for (Py_ssize_t i = 0; i < self->num_nodes; i++)
            live[self->nodes[i].node] = alive[i];
    if (tokens_out == NULL)
        return 0;
    for (Py_ssize_t k = 0; k < self->num_tokens; k++) {
        int32_t t = self->tokens[k];
        if (t < 0 || t >= vocab) {
            PyErr_Format(PyExc_ValueError, "token %d outside tokens_out", (int)t);
            return -1;
        }
        tokens_out[t] |= alive[self->tok_node[k]];
    }
    return 0;
}

static PyObject *
Trie_walk(Trie *self, PyObject *args)
{
    PyObject *dfa, *live_obj, *tokens_obj, *first_obj;
    int state, want_ends;
    if (!PyArg_ParseTuple(args, "OiOOOp:walk", &dfa, &state, &live_obj, &tokens_obj, &first_obj,
                          &want_ends))
        return NULL;
    if (self->nodes == NULL) {
        PyErr_SetString(PyExc_TypeError, "Trie is not initialised");
        return NULL;
    }
    Py_buffer live_view, tokens_view, first_view;
    int have_live = 0, have_tokens = 0, have_first = 0;
    DFAView d = {.dfa = dfa};
    IntVec end_tok = {0}, end_cut = {0};
    PyObject *result = NULL;
    uint8_t *live = NULL, *tokens = NULL, *alive = NULL;
    const uint8_t *first = NULL;
    Py_ssize_t vocab = 0;
    if (live_obj != Py_None) {
        if (get_ints(live_obj, 1, 1, 1, &live_view, "live_out") < 0)
            goto done;
        have_live = 1;
        if (live_view.shape[0] != self->num_nodes) {
            PyErr_SetString(PyExc_ValueError, "live_out: expected one entry per trie node");
            goto done;
        }
        live = live_view.buf;
    }
    if (tokens_obj != Py_None) {
        if (get_ints(tokens_obj, 1, 1, 1, &tokens_view, "tokens_out") < 0)
            goto done;
        have_tokens = 1;
        tokens = tokens_view.buf;
        vocab = tokens_view.shape[0];
    }
    if (first_obj != Py_None) {
        if (get_ints(first_obj, 1, 1, 0, &first_view, "first_bytes") < 0)
            goto done;
        have_first = 1;
        if (first_view.shape[0] != 256) {
            PyErr_SetString(PyExc_ValueError, "first_bytes: expected 256 entries");
            goto done;
        }
        first = first_view.buf;
    }
    if ((alive = PyMem_Calloc((size_t)self->num_nodes, 1)) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (dfa_read(&d) < 0
            || Trie_scan(self, &d, state, alive, first, want_ends ? &end_tok : NULL, &end_cut) < 0
            || Trie_mark(self, alive, live, tokens, vocab) < 0)
        goto done;
    result = Py_BuildValue("(y#y#)", (const char *)end_tok.data,
                           (Py_ssize_t)(end_tok.len * (Py_ssize_t)sizeof(int32_t)),
                           (const char *)end_cut.data,
                           (Py_ssize_t)(end_cut.len * (Py_ssize_t)sizeof(int32_t)));
done:
    dfa_release(&d);
    if (have_live)
        PyBuffer_Release(&live_view);
    if (have_tokens)
        PyBuffer_Release(&tokens_view);
    if (have_first)
        PyBuffer_Release(&first_view);
    vec_free(&end_tok);
    vec_free(&end_cut);
    PyMem_Free(alive);
    return result;
}

static PyMethodDef Trie_methods[] = {
    {"walk", (PyCFunction)Trie_walk, METH_VARARGS,
     "walk(dfa, state, live_out, tokens_out, first_bytes, want_ends) -> (end tokens, end "
     "cuts) as int32 bytes (see the module doc)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject TrieType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_native.Trie",
    .tp_basicsize = sizeof(Trie),
    .tp_dealloc = (destructor)Trie_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A vocabulary trie laid out depth first, walked through a lazy DFA.",
    .tp_methods = Trie_methods,
    .tp_init = (initproc)Trie_init,
    .tp_new = PyType_GenericNew,
};

static PyMethodDef module_methods[] = {
    {"put_row", put_row, METH_VARARGS,
     "put_row(trans, state, by_byte, ids): trans[state, b] = ids[by_byte[b]], the last id "
     "where by_byte[b] is -1"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_native",
    "The compiled core of the constraint layer (see constrain/native.py).", -1, module_methods,
};

static int
add_type(PyObject *m, PyTypeObject *type, const char *name)
{
    if (PyType_Ready(type) < 0)
        return -1;
    Py_INCREF(type);
    if (PyModule_AddObject(m, name, (PyObject *)type) < 0) {
        Py_DECREF(type);
        return -1;
    }
    return 0;
}

PyMODINIT_FUNC
PyInit__native(void)
{
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL)
        return NULL;
    if (add_type(m, &NFARowsType, "NFARows") < 0 || add_type(m, &TrieType, "Trie") < 0
            || PyModule_AddIntConstant(m, "VERSION", NATIVE_VERSION) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
