/* Shared by the compiled core's files (see _native.c): growable int arrays, sorting,
 * reading integer arrays through the buffer protocol, and a lazy DFA read from Python. */
#ifndef TAMIS_NATIVE_COMMON_H
#define TAMIS_NATIVE_COMMON_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define UNCOMPUTED (-2)        /* automaton.UNCOMPUTED: a DFA row not built yet */

/* ---- growable int arrays ---------------------------------------------------------------- */

typedef struct {
    int32_t *data;
    Py_ssize_t len, cap;
} IntVec;

static inline int
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

static inline void
vec_free(IntVec *v)
{
    PyMem_Free(v->data);
    v->data = NULL;
    v->len = v->cap = 0;
}

/* The ints as bytes (empty bytes for an empty vector). */
static inline PyObject *
ints_bytes(const IntVec *v)
{
    return PyBytes_FromStringAndSize((const char *)v->data, v->len * (Py_ssize_t)sizeof(int32_t));
}

static inline int
cmp_int32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static inline void
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
static inline Py_ssize_t
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

static inline uint64_t
hash_ints(const int32_t *a, Py_ssize_t n)
{
    uint64_t h = 1469598103934665603ULL ^ (uint64_t)n;
    for (Py_ssize_t i = 0; i < n; i++) {
        h ^= (uint32_t)a[i];
        h *= 1099511628211ULL;
    }
    return h;
}

/* A sealed NFA fragment's table rows (int32, ``n`` values, ``width`` a row) as pasted
 * (nfa.NFA.paste): in the columns whose bit is set in ``state_columns`` (the states),
 * state 0 becomes ``start`` and any other s becomes s + offset; the rest copied. */
static inline void
shift_states(const int32_t *in, Py_ssize_t n, Py_ssize_t width, int state_columns,
             long offset, long start, int32_t *out)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t x = in[i];
        out[i] = !(state_columns >> (i % width) & 1) ? x
                 : x == 0 ? (int32_t)start : (int32_t)(x + offset);
    }
}

/* ---- buffers ------------------------------------------------------------------------------ */

/* A C-contiguous buffer of integers (or bools) of ``itemsize`` bytes and ``ndim`` dims. */
static inline int
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


extern PyTypeObject NFARowsType, TrieType, EarleyTablesType;

/* NFARows.build over buffers already read: the row of DFA ``state`` into ``trans`` (int32
 * [trans_rows, 256]), its new states' flags into ``flags`` and appended to ``accepting``
 * (a list), when all of them have room; returns the number of states either way (more
 * than the room: nothing written, grow and ask again), -1 with an exception. */
Py_ssize_t nfarows_build_into(PyObject *rows, Py_ssize_t state, int32_t *trans,
                              Py_ssize_t trans_rows, uint8_t *flags, Py_ssize_t flags_len,
                              PyObject *accepting);
/* Whether the indexed DFA ``state`` of NFARows ``rows`` holds the accept state; -1 with an
 * exception for a state not indexed. */
int nfarows_accepting(PyObject *rows, Py_ssize_t state);
/* ---- a lazy DFA read from Python (Trie.walk, walk_items, product_runs) ------------------- */

/* How a walk opens a LazyDFA (dfa_open). DFA_READ: its rows are built through dfa.row()
 * (a Python call each) and its accepting flags read from dfa.accepting_array().
 * DFA_IN_PLACE: with the compiled set index (dfa._native_rows), a missing row is built
 * here, as LazyDFA._build_row builds it (the new states' flags, then ``accepting``, then
 * the row), and accepting flags are read from the index; dfa.row() is called only when the
 * table must grow. For a DFA private to the caller (a product's operands).
 * DFA_IN_PLACE_LOCKED: the same, holding dfa._lock from open to release, as dfa.row()
 * holds it around a build (the prefetch worker builds rows of the same DFAs). The lock is
 * taken through its Python method, which waits with the GIL released. A DFA without the
 * index (made while the compiled core was off, or not a LazyDFA) is read as DFA_READ. */
enum { DFA_READ, DFA_IN_PLACE, DFA_IN_PLACE_LOCKED };

typedef struct {
    PyObject *dfa;
    Py_buffer trans, accepting;
    int have_trans, have_accepting;
    PyObject *rows;              /* dfa._native_rows when rows are built in place */
    PyObject *accepting_list;    /* dfa.accepting (a list), in place */
    Py_buffer flags;             /* dfa._accepting_flags (writable), in place */
    int have_flags;
    PyObject *lock;              /* dfa._lock while held */
} DFAView;

/* Releases ``view`` if it is held. */
static inline void
view_drop(Py_buffer *view, int *have)
{
    if (*have)
        PyBuffer_Release(view);
    *have = 0;
}

/* Takes ``obj`` (a new reference, or NULL with an error set) as ``view`` of ints
 * (get_ints), dropping the reference: 0, or -1 with an error set. */
static inline int
view_take_as(PyObject *obj, Py_buffer *view, int *have, int itemsize, int ndim, int writable,
             const char *name)
{
    if (obj == NULL)
        return -1;
    int rc = get_ints(obj, itemsize, ndim, writable, view, name);
    Py_DECREF(obj);
    if (rc < 0)
        return -1;
    *have = 1;
    return 0;
}

static inline int
view_take(PyObject *obj, Py_buffer *view, int *have, int itemsize, int ndim, const char *name)
{
    return view_take_as(obj, view, have, itemsize, ndim, 0, name);
}

/* Releases what the view holds, the lock last (an error already set is kept). */
static inline void
dfa_release(DFAView *d)
{
    view_drop(&d->trans, &d->have_trans);
    view_drop(&d->accepting, &d->have_accepting);
    view_drop(&d->flags, &d->have_flags);
    Py_CLEAR(d->rows);
    Py_CLEAR(d->accepting_list);
    if (d->lock != NULL) {
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);
        PyObject *r = PyObject_CallMethod(d->lock, "release", NULL);
        if (r == NULL)
            PyErr_WriteUnraisable(d->lock);
        Py_XDECREF(r);
        PyErr_Restore(type, value, traceback);
        Py_CLEAR(d->lock);
    }
}

/* (Re)reads dfa.trans, and in place dfa._accepting_flags, both writable: after dfa.row()
 * may have grown them. */
static inline int
dfa_read(DFAView *d)
{
    int in_place = d->rows != NULL;
    view_drop(&d->trans, &d->have_trans);
    view_drop(&d->flags, &d->have_flags);
    if (view_take_as(PyObject_GetAttrString(d->dfa, "trans"), &d->trans, &d->have_trans, 4, 2,
                     in_place, "dfa.trans") < 0)
        return -1;
    if (d->trans.shape[1] != 256) {
        PyErr_SetString(PyExc_ValueError, "dfa.trans: expected rows of 256 entries");
        return -1;
    }
    if (in_place && view_take_as(PyObject_GetAttrString(d->dfa, "_accepting_flags"), &d->flags,
                                 &d->have_flags, 1, 1, 1, "dfa._accepting_flags") < 0)
        return -1;
    return 0;
}

/* Opens ``dfa`` (``mode``: DFA_READ, DFA_IN_PLACE or DFA_IN_PLACE_LOCKED) and reads its
 * table; on failure the caller still calls dfa_release. */
static inline int
dfa_open(DFAView *d, PyObject *dfa, int mode)
{
    d->dfa = dfa;
    if (mode != DFA_READ) {
        PyObject *rows = PyObject_GetAttrString(dfa, "_native_rows");
        if (rows == NULL && !PyErr_ExceptionMatches(PyExc_AttributeError))
            return -1;
        PyErr_Clear();
        if (rows == NULL || !PyObject_TypeCheck(rows, &NFARowsType)) {   /* read through Python */
            Py_XDECREF(rows);
            return dfa_read(d);
        }
        d->rows = rows;
        d->accepting_list = PyObject_GetAttrString(dfa, "accepting");
        if (d->accepting_list == NULL)
            return -1;
        if (!PyList_Check(d->accepting_list)) {
            PyErr_SetString(PyExc_TypeError, "dfa.accepting: expected a list");
            return -1;
        }
    }
    if (mode == DFA_IN_PLACE_LOCKED) {
        PyObject *lock = PyObject_GetAttrString(dfa, "_lock");
        if (lock == NULL)
            return -1;
        PyObject *r = PyObject_CallMethod(lock, "acquire", NULL);
        if (r == NULL) {
            Py_DECREF(lock);
            return -1;
        }
        Py_DECREF(r);
        d->lock = lock;
    }
    return dfa_read(d);
}

/* (Re)reads dfa.accepting_array(): only when a state past the flags read is asked about. */
static inline int
dfa_read_accepting(DFAView *d)
{
    view_drop(&d->accepting, &d->have_accepting);
    return view_take(PyObject_CallMethod(d->dfa, "accepting_array", NULL), &d->accepting,
                     &d->have_accepting, 1, 1, "dfa.accepting_array()");
}

/* The row of ``state``, built first if need be (in place, or through dfa.row(state));
 * *reread is set when the table was read again (row pointers taken before are stale
 * then). */
static inline const int32_t *
dfa_row(DFAView *d, int32_t state, int *reread)
{
    for (int attempt = 0; attempt < 3; attempt++) {
        if (state >= 0 && state < d->trans.shape[0]) {
            int32_t *row = (int32_t *)d->trans.buf + (Py_ssize_t)state * 256;
            if (row[0] != UNCOMPUTED)
                return row;
            if (d->rows != NULL) {
                Py_ssize_t num_states = nfarows_build_into(
                    d->rows, state, d->trans.buf, d->trans.shape[0], d->flags.buf,
                    d->flags.shape[0], d->accepting_list);
                if (num_states < 0)
                    return NULL;
                if (row[0] != UNCOMPUTED)
                    return row;
            }
            PyObject *built = PyObject_CallMethod(d->dfa, "row", "i", (int)state);  /* grows */
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
    if (d->rows != NULL) {
        int flag = nfarows_accepting(d->rows, state);
        if (flag < 0)
            return -1;
        *out = flag;
        return 0;
    }
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

PyObject *product_runs(PyObject *module, PyObject *args);
PyObject *walk_items(PyObject *module, PyObject *args);
PyObject *reaching(PyObject *module, PyObject *args);
PyObject *shifted_states(PyObject *module, PyObject *args);
PyObject *read_arrays(PyObject *module, PyObject *args);
PyObject *byte_classes(PyObject *module, PyObject *arg);
PyObject *sorted_by_source(PyObject *module, PyObject *args);
PyObject *build_nfa(PyObject *module, PyObject *args);
PyObject *build_nfa_node(PyObject *module, PyObject *args);
PyObject *nfa_size(PyObject *module, PyObject *args);
PyObject *untrack_ast(PyObject *module, PyObject *node);

#endif
