/* The subset construction's step over one sealed NFA and its DFA's index of NFA sets
 * (NFARows) and reaching (see _native.c for the contracts). */
#include "_native_common.h"

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
    /* The DFA's states: state -> its NFA set (``set_len`` ints at ``set_at`` in ``pool``),
     * numbered as added; ``slots``: open addressing over their hashes (-1: empty). */
    IntVec pool;
    Py_ssize_t *set_at;
    int32_t *set_len;
    uint64_t *set_hash;
    uint8_t *set_accepting;
    Py_ssize_t num_sets, sets_cap;
    int32_t *slots;
    Py_ssize_t num_slots;
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
    vec_free(&self->pool);
    PyMem_Free(self->set_at);
    PyMem_Free(self->set_len);
    PyMem_Free(self->set_hash);
    PyMem_Free(self->set_accepting);
    PyMem_Free(self->slots);
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

/* One step of the subset construction from the NFA set set[0..size): the distinct closed
 * target sets, in the order the reference first meets them, in self->sets (closed[0..
 * *num_closed)), and class_index[c] the index of class c's target set (-1: dead). */
static int
row_step(NFARows *self, const int32_t *set, Py_ssize_t size, SetRef *closed, int *num_closed_out,
         int *class_index)
{
    int nc = self->num_classes;
    /* pass 1: how many targets each class gets, and the order classes are first met
     * (the reference fills a dict in that order) */
    Py_ssize_t count[256] = {0};
    int order[256], num_touched = 0;
    for (Py_ssize_t i = 0; i < size; i++) {
        int32_t q = set[i];
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
        return -1;
    for (Py_ssize_t i = 0; i < size; i++) {
        int32_t q = set[i];
        for (int32_t e = self->edge_start[q]; e < self->edge_start[q + 1]; e++)
            for (int c = self->class_of[self->edge_lo[e]]; c <= self->class_of[self->edge_hi[e]]; c++)
                bucket->data[fill[c]++] = self->edge_to[e];
    }
    /* distinct raw target sets, then their closures: distinct closures in first-met order */
    SetRef raw[256];
    int raw_index[256], raw_to_closed[256];
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
                return -1;
            const int32_t *got = self->found.data;
            Py_ssize_t m = self->found.len;
            uint64_t h = hash_ints(got, m);
            int same = find_set(closed, num_closed, pool->data, got, m, h);
            if (same < 0 && m > 0) {
                if (vec_reserve(pool, pool->len + m) < 0)
                    return -1;
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
    *num_closed_out = num_closed;
    return 0;
}

/* A sequence of NFA states of this NFA as ints, into *out (left empty with an exception). */
static int
read_states(NFARows *self, PyObject *nfa_set, IntVec *out)
{
    PyObject *seq = PySequence_Fast(nfa_set, "expected a sequence of NFA states");
    if (seq == NULL)
        return -1;
    Py_ssize_t size = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    out->len = 0;
    if (vec_reserve(out, size + 1) < 0)
        goto fail;
    for (Py_ssize_t i = 0; i < size; i++) {
        long q = PyLong_AsLong(items[i]);
        if (q == -1 && PyErr_Occurred())
            goto fail;
        if (q < 0 || q >= self->num_states) {
            PyErr_Format(PyExc_ValueError, "NFA state %ld outside 0..%zd", q,
                         self->num_states - 1);
            goto fail;
        }
        out->data[out->len++] = (int32_t)q;
    }
    Py_DECREF(seq);
    return 0;
fail:
    out->len = 0;
    Py_DECREF(seq);
    return -1;
}

/* ---- the DFA's states: NFA sets numbered as added --------------------------------------- */

static inline Py_ssize_t
index_slot(uint64_t hash, Py_ssize_t num_slots)
{
    return (Py_ssize_t)((hash * 0x9E3779B97F4A7C15ULL) >> 32) & (num_slots - 1);
}

static int
index_grow_slots(NFARows *self)
{
    Py_ssize_t num = self->num_slots ? self->num_slots * 2 : 256;
    int32_t *slots = PyMem_Malloc(sizeof(int32_t) * (size_t)num);
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < num; i++)
        slots[i] = -1;
    for (Py_ssize_t id = 0; id < self->num_sets; id++) {
        Py_ssize_t i = index_slot(self->set_hash[id], num);
        while (slots[i] >= 0)
            i = (i + 1) & (num - 1);
        slots[i] = (int32_t)id;
    }
    PyMem_Free(self->slots);
    self->slots = slots;
    self->num_slots = num;
    return 0;
}

static int
index_grow_sets(NFARows *self)
{
    Py_ssize_t cap = self->sets_cap ? self->sets_cap * 2 : 64;
    Py_ssize_t *at = PyMem_Realloc(self->set_at, sizeof(Py_ssize_t) * (size_t)cap);
    if (at != NULL)
        self->set_at = at;
    int32_t *len = PyMem_Realloc(self->set_len, sizeof(int32_t) * (size_t)cap);
    if (len != NULL)
        self->set_len = len;
    uint64_t *hash = PyMem_Realloc(self->set_hash, sizeof(uint64_t) * (size_t)cap);
    if (hash != NULL)
        self->set_hash = hash;
    uint8_t *acc = PyMem_Realloc(self->set_accepting, (size_t)cap);
    if (acc != NULL)
        self->set_accepting = acc;
    if (at == NULL || len == NULL || hash == NULL || acc == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->sets_cap = cap;
    return 0;
}

/* The state named by the set a[0..n) (the order as given: the reference's dict of tuples),
 * added if new; -1 (DEAD) for the empty set, -2 with an exception. ``a`` must not point
 * into self->pool. */
static int32_t
index_add(NFARows *self, const int32_t *a, Py_ssize_t n, uint64_t hash)
{
    if (n == 0)
        return -1;
    if ((self->num_sets + 1) * 2 > self->num_slots && index_grow_slots(self) < 0)
        return -2;
    Py_ssize_t mask = self->num_slots - 1, i = index_slot(hash, self->num_slots);
    for (; self->slots[i] >= 0; i = (i + 1) & mask) {
        int32_t id = self->slots[i];
        if (self->set_hash[id] == hash && self->set_len[id] == n
                && memcmp(self->pool.data + self->set_at[id], a, (size_t)n * sizeof(int32_t)) == 0)
            return id;
    }
    if (self->num_sets >= INT32_MAX - 1) {
        PyErr_SetString(PyExc_OverflowError, "too many DFA states");
        return -2;
    }
    if (self->num_sets == self->sets_cap && index_grow_sets(self) < 0)
        return -2;
    if (vec_reserve(&self->pool, self->pool.len + n) < 0)
        return -2;
    int32_t id = (int32_t)self->num_sets;
    memcpy(self->pool.data + self->pool.len, a, (size_t)n * sizeof(int32_t));
    self->set_at[id] = self->pool.len;
    self->set_len[id] = (int32_t)n;
    self->set_hash[id] = hash;
    uint8_t holds_accept = 0;
    for (Py_ssize_t k = 0; k < n; k++)
        holds_accept |= a[k] == self->accept;
    self->set_accepting[id] = holds_accept;
    self->pool.len += n;
    self->slots[i] = id;
    self->num_sets++;
    return id;
}

static PyObject *
NFARows_state_of(NFARows *self, PyObject *nfa_set)
{
    IntVec input = {0};
    if (read_states(self, nfa_set, &input) < 0) {
        vec_free(&input);
        return NULL;
    }
    int32_t id = index_add(self, input.data, input.len, hash_ints(input.data, input.len));
    vec_free(&input);
    return id == -2 ? NULL : PyLong_FromLong(id);
}

/* state_at(nfa_state) -> the DFA state of the important states reachable from
 * ``nfa_state`` without input (LazyDFA._state_of(LazyDFA._closure((nfa_state,)))), added
 * if new; -1 (DEAD) when none is. */
static PyObject *
NFARows_state_at(NFARows *self, PyObject *arg)
{
    long q = PyLong_AsLong(arg);
    if (q == -1 && PyErr_Occurred())
        return NULL;
    if (q < 0 || q >= self->num_states) {
        PyErr_Format(PyExc_IndexError, "no NFA state %ld", q);
        return NULL;
    }
    int32_t start = (int32_t)q;
    if (closure(self, &start, 1) < 0)
        return NULL;
    int32_t id = index_add(self, self->found.data, self->found.len,
                           hash_ints(self->found.data, self->found.len));
    return id == -2 ? NULL : PyLong_FromLong(id);
}

static int
check_state(NFARows *self, Py_ssize_t state)
{
    if (state < 0 || state >= self->num_sets) {
        PyErr_Format(PyExc_IndexError, "no DFA state %zd (%zd states)", state, self->num_sets);
        return -1;
    }
    return 0;
}

static PyObject *
NFARows_set_of(NFARows *self, PyObject *arg)
{
    Py_ssize_t state = PyNumber_AsSsize_t(arg, PyExc_IndexError);
    if ((state == -1 && PyErr_Occurred()) || check_state(self, state) < 0)
        return NULL;
    return ints_to_tuple(self->pool.data + self->set_at[state], self->set_len[state]);
}

static PyObject *
NFARows_accepting_flags(NFARows *self, PyObject *args)
{
    Py_ssize_t lo, hi;
    if (!PyArg_ParseTuple(args, "nn:accepting_flags", &lo, &hi))
        return NULL;
    if (lo < 0 || hi > self->num_sets || lo > hi) {
        PyErr_Format(PyExc_IndexError, "accepting_flags(%zd, %zd) of %zd states", lo, hi,
                     self->num_sets);
        return NULL;
    }
    return PyBytes_FromStringAndSize((const char *)self->set_accepting + lo, hi - lo);
}

/* NFARows.build's work on buffers already read (see _native_common.h). */
Py_ssize_t
nfarows_build_into(PyObject *rows, Py_ssize_t state, int32_t *trans, Py_ssize_t trans_rows,
                   uint8_t *flags, Py_ssize_t flags_len, PyObject *accepting)
{
    NFARows *self = (NFARows *)rows;
    if (check_state(self, state) < 0)
        return -1;
    if (state >= trans_rows) {
        PyErr_Format(PyExc_ValueError, "trans: no row %zd of 256 entries", state);
        return -1;
    }
    Py_ssize_t known = PyList_GET_SIZE(accepting);
    if (known > self->num_sets) {
        PyErr_SetString(PyExc_ValueError, "accepting: longer than the states");
        return -1;
    }
    SetRef closed[256];
    int class_index[256], num_closed;
    int32_t ids[256];
    if (row_step(self, self->pool.data + self->set_at[state], self->set_len[state], closed,
                 &num_closed, class_index) < 0)
        return -1;
    for (int i = 0; i < num_closed; i++) {     /* self->sets: not the index's pool */
        ids[i] = index_add(self, self->sets.data + closed[i].at, closed[i].len, closed[i].hash);
        if (ids[i] == -2)
            return -1;
    }
    if (self->num_sets > trans_rows || self->num_sets > flags_len)
        return self->num_sets;                 /* no room: the caller grows, then asks again */
    /* the new states made known (flags, then ``accepting``), then the row naming them */
    for (Py_ssize_t id = known; id < self->num_sets; id++) {
        flags[id] = self->set_accepting[id];
        if (PyList_Append(accepting, self->set_accepting[id] ? Py_True : Py_False) < 0)
            return -1;
    }
    int32_t *row = trans + state * 256;
    for (int b = 0; b < 256; b++) {
        int k = class_index[self->class_of[b]];
        row[b] = k < 0 ? -1 : ids[k];
    }
    return self->num_sets;
}

int
nfarows_accepting(PyObject *rows, Py_ssize_t state)
{
    NFARows *self = (NFARows *)rows;
    if (check_state(self, state) < 0)
        return -1;
    return self->set_accepting[state] != 0;
}

/* build(state, trans, flags, accepting) -> the number of states (see _native.c). */
static PyObject *
NFARows_build(NFARows *self, PyObject *args)
{
    Py_ssize_t state;
    PyObject *trans_obj, *flags_obj, *accepting;
    if (!PyArg_ParseTuple(args, "nOOO!:build", &state, &trans_obj, &flags_obj, &PyList_Type,
                          &accepting))
        return NULL;
    Py_buffer trans, flags;
    if (get_ints(trans_obj, 4, 2, 1, &trans, "trans") < 0)
        return NULL;
    if (get_ints(flags_obj, 1, 1, 1, &flags, "flags") < 0) {
        PyBuffer_Release(&trans);
        return NULL;
    }
    Py_ssize_t num_states = -1;
    if (trans.shape[1] != 256)
        PyErr_Format(PyExc_ValueError, "trans: no row %zd of 256 entries", state);
    else
        num_states = nfarows_build_into((PyObject *)self, state, trans.buf, trans.shape[0],
                                        flags.buf, flags.shape[0], accepting);
    PyBuffer_Release(&trans);
    PyBuffer_Release(&flags);
    return num_states < 0 ? NULL : PyLong_FromSsize_t(num_states);
}

static PyObject *
NFARows_num_sets(NFARows *self, void *closure_unused)
{
    return PyLong_FromSsize_t(self->num_sets);
}

static PyGetSetDef NFARows_getset[] = {
    {"num_states", (getter)NFARows_num_sets, NULL, "the DFA states added so far", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef NFARows_methods[] = {
    {"state_of", (PyCFunction)NFARows_state_of, METH_O,
     "state_of(nfa_set) -> the DFA state named nfa_set, added if new (-1 for the empty set)"},
    {"state_at", (PyCFunction)NFARows_state_at, METH_O,
     "state_at(nfa_state) -> the DFA state of nfa_state's closure, added if new (-1 if empty)"},
    {"set_of", (PyCFunction)NFARows_set_of, METH_O,
     "set_of(state) -> the state's NFA set as a tuple"},
    {"accepting_flags", (PyCFunction)NFARows_accepting_flags, METH_VARARGS,
     "accepting_flags(lo, hi) -> one byte per state lo..hi-1: 1 where its set holds accept"},
    {"build", (PyCFunction)NFARows_build, METH_VARARGS,
     "build(state, trans, flags, accepting) -> number of states: writes trans[state], its new "
     "targets added (their flags and accepting entries written first); the row unwritten "
     "when trans or flags has no room for them"},
    {NULL, NULL, 0, NULL},
};

PyTypeObject NFARowsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_native.NFARows",
    .tp_basicsize = sizeof(NFARows),
    .tp_dealloc = (destructor)NFARows_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The subset construction's step over one sealed NFA (see the module doc).",
    .tp_methods = NFARows_methods,
    .tp_getset = NFARows_getset,
    .tp_init = (initproc)NFARows_init,
    .tp_new = PyType_GenericNew,
};

/* ---- reaching: the states of an NFA that can reach its accept state --------------------- */

/* reaching(num_states, sources, targets, accept) -> bytes, one per state (see _native.c). */
PyObject *
reaching(PyObject *module, PyObject *args)
{
    Py_ssize_t num_states;
    int accept;
    PyObject *sources_obj, *targets_obj;
    if (!PyArg_ParseTuple(args, "nOOi:reaching", &num_states, &sources_obj, &targets_obj, &accept))
        return NULL;
    Py_buffer sources, targets;
    int have = 0;
    int32_t *start = NULL, *preds = NULL, *stack = NULL;
    PyObject *result = NULL;
    if (get_ints(sources_obj, 4, 1, 0, &sources, "sources") < 0)
        return NULL;
    have = 1;
    if (get_ints(targets_obj, 4, 1, 0, &targets, "targets") < 0)
        goto done;
    have = 2;
    Py_ssize_t n = sources.shape[0];
    const int32_t *src = sources.buf, *dst = targets.buf;
    if (targets.shape[0] != n || accept < 0 || accept >= num_states) {
        PyErr_SetString(PyExc_ValueError, "reaching(): sources and targets differ in length, "
                                          "or accept is no state");
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (src[i] < 0 || src[i] >= num_states || dst[i] < 0 || dst[i] >= num_states) {
            PyErr_Format(PyExc_ValueError, "reaching(): edge %zd leaves the states", i);
            goto done;
        }
    start = PyMem_Calloc((size_t)num_states + 1, sizeof(int32_t));  /* predecessors, CSR */
    preds = PyMem_Malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    stack = PyMem_Malloc(sizeof(int32_t) * (size_t)num_states);
    result = PyBytes_FromStringAndSize(NULL, num_states);
    if (start == NULL || preds == NULL || stack == NULL || result == NULL) {
        Py_CLEAR(result);
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        start[dst[i] + 1]++;
    for (Py_ssize_t q = 0; q < num_states; q++)
        start[q + 1] += start[q];
    for (Py_ssize_t i = 0; i < n; i++)          /* start[t] runs ahead while filling ... */
        preds[start[dst[i]]++] = src[i];
    for (Py_ssize_t q = num_states; q > 0; q--) /* ... and is moved back after */
        start[q] = start[q - 1];
    start[0] = 0;
    char *alive = PyBytes_AS_STRING(result);
    memset(alive, 0, (size_t)num_states);
    Py_ssize_t top = 0;
    alive[accept] = 1;
    stack[top++] = accept;
    while (top > 0) {
        int32_t q = stack[--top];
        for (int32_t k = start[q]; k < start[q + 1]; k++)
            if (!alive[preds[k]]) {
                alive[preds[k]] = 1;
                stack[top++] = preds[k];
            }
    }
done:
    if (have >= 1)
        PyBuffer_Release(&sources);
    if (have >= 2)
        PyBuffer_Release(&targets);
    PyMem_Free(start);
    PyMem_Free(preds);
    PyMem_Free(stack);
    return result;
}

/* ---- shifted_states: a pasted fragment's edge rows ----------------------------------------- */

/* shifted_states(table, state_columns, offset, start) -> bytes (see _native.c). */
PyObject *
shifted_states(PyObject *module, PyObject *args)
{
    PyObject *table_obj;
    int columns_mask, offset, start;
    if (!PyArg_ParseTuple(args, "Oiii:shifted_states", &table_obj, &columns_mask, &offset, &start))
        return NULL;
    Py_buffer table;
    if (get_ints(table_obj, 4, 2, 0, &table, "table") < 0)
        return NULL;
    Py_ssize_t rows = table.shape[0], width = table.shape[1];
    PyObject *out = NULL;
    if (width < 1 || width > 8) {
        PyErr_SetString(PyExc_ValueError, "shifted_states(): tables of 1 to 8 columns");
        goto done;
    }
    out = PyBytes_FromStringAndSize(NULL, rows * width * (Py_ssize_t)sizeof(int32_t));
    if (out == NULL)
        goto done;
    shift_states(table.buf, rows * width, width, columns_mask, offset, start,
                 (int32_t *)PyBytes_AS_STRING(out));
done:
    PyBuffer_Release(&table);
    return out;
}

/* ---- read_arrays, byte_classes: a sealed NFA's tables as LazyDFA reads them ------------- */

/* Offsets per state (num_states + 1) of rows sorted by their source, and one column of
 * them, from ``table`` (int32 [rows, width], column 0 the source); -1 with an exception for
 * a source out of range or out of order. */
static int
starts_and_columns(const Py_buffer *table, Py_ssize_t num_states, int32_t *starts,
                   int32_t **columns, int num_columns)
{
    const int32_t *t = table->buf;
    Py_ssize_t rows = table->shape[0], width = table->shape[1];
    Py_ssize_t q = 0;
    starts[0] = 0;
    for (Py_ssize_t i = 0; i < rows; i++, t += width) {
        if (t[0] < q || t[0] >= num_states) {
            PyErr_SetString(PyExc_ValueError, "read_arrays(): rows not sorted by a source "
                            "state in 0 .. num_states - 1");
            return -1;
        }
        while (q < t[0])
            starts[++q] = (int32_t)i;
        for (int c = 0; c < num_columns; c++)
            columns[c][i] = t[c + 1];
    }
    while (q < num_states)
        starts[++q] = (int32_t)rows;
    return 0;
}

/* read_arrays(edge_table, eps_table, num_states) -> (edge_start, edge_lo, edge_hi, edge_to,
 * eps_start, eps_to), each int32 bytes (see _native.c). */
PyObject *
read_arrays(PyObject *module, PyObject *args)
{
    PyObject *edges_obj, *eps_obj;
    Py_ssize_t num_states;
    if (!PyArg_ParseTuple(args, "OOn:read_arrays", &edges_obj, &eps_obj, &num_states))
        return NULL;
    Py_buffer edges, eps;
    if (get_ints(edges_obj, 4, 2, 0, &edges, "edge_table") < 0)
        return NULL;
    if (get_ints(eps_obj, 4, 2, 0, &eps, "eps_table") < 0) {
        PyBuffer_Release(&edges);
        return NULL;
    }
    PyObject *out[6] = {NULL}, *result = NULL;
    if (edges.shape[1] != 4 || eps.shape[1] != 2 || num_states < 0 || num_states >= INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "read_arrays(): tables of 4 and 2 columns");
        goto done;
    }
    Py_ssize_t sizes[6] = {num_states + 1, edges.shape[0], edges.shape[0], edges.shape[0],
                           num_states + 1, eps.shape[0]};
    int32_t *data[6];
    for (int k = 0; k < 6; k++) {
        out[k] = PyBytes_FromStringAndSize(NULL, sizes[k] * (Py_ssize_t)sizeof(int32_t));
        if (out[k] == NULL)
            goto done;
        data[k] = (int32_t *)PyBytes_AS_STRING(out[k]);
    }
    if (starts_and_columns(&edges, num_states, data[0], data + 1, 3) < 0
            || starts_and_columns(&eps, num_states, data[4], data + 5, 1) < 0)
        goto done;
    result = PyTuple_New(6);
    if (result == NULL)
        goto done;
    for (int k = 0; k < 6; k++) {
        PyTuple_SET_ITEM(result, k, out[k]);
        out[k] = NULL;
    }
done:
    for (int k = 0; k < 6; k++)
        Py_XDECREF(out[k]);
    PyBuffer_Release(&edges);
    PyBuffer_Release(&eps);
    return result;
}

/* byte_classes(edge_table) -> bytes (256), each byte's class (see _native.c). */
PyObject *
byte_classes(PyObject *module, PyObject *arg)
{
    Py_buffer edges;
    if (get_ints(arg, 4, 2, 0, &edges, "edge_table") < 0)
        return NULL;
    PyObject *result = NULL;
    if (edges.shape[1] != 4) {
        PyErr_SetString(PyExc_ValueError, "byte_classes(): a table of 4 columns");
        goto done;
    }
    uint8_t starts[257] = {1};
    const int32_t *t = edges.buf;
    for (Py_ssize_t i = 0; i < edges.shape[0]; i++, t += 4) {
        if (t[1] < 0 || t[1] > t[2] || t[2] > 255) {
            PyErr_SetString(PyExc_ValueError, "byte_classes(): an edge's bytes outside 0..255");
            goto done;
        }
        starts[t[1]] = starts[t[2] + 1] = 1;
    }
    result = PyBytes_FromStringAndSize(NULL, 256);
    if (result == NULL)
        goto done;
    uint8_t *out = (uint8_t *)PyBytes_AS_STRING(result);
    int c = -1;
    for (int b = 0; b < 256; b++)
        out[b] = (uint8_t)(c += starts[b]);
done:
    PyBuffer_Release(&edges);
    return result;
}

/* sorted_by_source(table, num_states) -> bytes (see _native.c). */
PyObject *
sorted_by_source(PyObject *module, PyObject *args)
{
    PyObject *table_obj;
    Py_ssize_t num_states;
    if (!PyArg_ParseTuple(args, "On:sorted_by_source", &table_obj, &num_states))
        return NULL;
    Py_buffer table;
    if (get_ints(table_obj, 4, 2, 0, &table, "table") < 0)
        return NULL;
    Py_ssize_t rows = table.shape[0], width = table.shape[1];
    PyObject *out = NULL;
    Py_ssize_t *next = NULL;
    if (width < 1 || num_states < 0) {
        PyErr_SetString(PyExc_ValueError, "sorted_by_source(): a table of rows with a source");
        goto done;
    }
    next = PyMem_Calloc((size_t)num_states + 1, sizeof(Py_ssize_t));
    if (next == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    const int32_t *in = table.buf;
    for (Py_ssize_t i = 0; i < rows; i++) {          /* rows per source, then offsets */
        int32_t q = in[i * width];
        if (q < 0 || q >= num_states) {
            PyErr_SetString(PyExc_ValueError, "sorted_by_source(): a source out of range");
            goto done;
        }
        next[q + 1]++;
    }
    for (Py_ssize_t q = 0; q < num_states; q++)
        next[q + 1] += next[q];
    out = PyBytes_FromStringAndSize(NULL, rows * width * (Py_ssize_t)sizeof(int32_t));
    if (out == NULL)
        goto done;
    int32_t *to = (int32_t *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < rows; i++)            /* stable: rows of a source in order */
        memcpy(to + next[in[i * width]]++ * width, in + i * width, sizeof(int32_t) * width);
done:
    PyMem_Free(next);
    PyBuffer_Release(&table);
    return out;
}
