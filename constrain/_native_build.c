/* The NFA builder's plain kinds in C: automaton._build_python, _build_node_python and
 * _size_python over the regex AST (nested tuples: ("chars", ranges), ("seq", children),
 * ("alt", children), ("rep", child, lo, hi)), written into an nfa.NFA's flat edge arrays.
 *
 * A grammar terminal is built when the lexer first expects it, inside a mask fill, and a
 * fill that first expects an object's members builds tens of them: in Python every AST
 * node cost a few calls (the fragment lookup, its size, the kind's builder, new_state,
 * add_edge). Here a node costs a dictionary lookup or two. Whatever is not one of the
 * plain kinds (products, object members, residues, rule references, non-ASCII character
 * classes), a fragment's record and the paste that minimises it go back to the Python helpers that the
 * context names, so the caches (_FRAGMENTS, _SEEN_ONCE, _SIZES, _PASTES) are read and
 * filled as the Python builder fills them, and the NFA gets the same states and edges in
 * the same order. A recorded fragment is pasted here (nfa.NFA.paste), except on the paste
 * that minimises it. Before each such call the edges gathered here are appended to the NFA's
 * arrays and its state count written; after it the count is read again.
 */
#include "_native_common.h"

/* automaton._native_context(): the order of its items. */
enum {
    CTX_FRAGMENTS, CTX_SEEN_ONCE, CTX_SIZES, CTX_PASTES,
    CTX_SIZE_PY, CTX_PASTE_AGAIN, CTX_RECORD_AND_PASTE, CTX_BUILD_NODE_PY, CTX_BUILD_CHARS_PY,
    CTX_PASTE_COPIES, CTX_CHECK,
    CTX_FRAGMENT_MIN_SIZE, CTX_MAX_MINIMIZED_NFA, CTX_MINIMIZE_AFTER_PASTES,
    CTX_MAX_NFA_STATES,
    CTX_LEN
};

#define CACHE_MAX 100000          /* _SEEN_ONCE and _SIZES are cleared past this many */
#define SIZE_SATURATED ((int64_t)1 << 60)
#define SIZES_PER_CHECK 256       /* deadline.check() every this many sizes computed */
#define PASTES_PER_CHECK 64       /* and every this many fragments pasted */
#define EDGE_STATE_COLUMNS 0x9    /* nfa._EDGE_COLUMNS: (q, lo, hi, t), q and t states */
#define EPS_STATE_COLUMNS 0x3     /* nfa._EPS_COLUMNS: (q, t) */

typedef enum { K_OTHER, K_CHARS, K_SEQ, K_ALT, K_REP, K_RULE, K_PRODUCT } Kind;

typedef struct {
    PyObject *nfa;                /* NULL when only sizes are asked */
    PyObject *const *ctx;
    PyObject *edges_out, *eps_out;  /* nfa._edges, nfa._eps (array('i')) */
    long num_states;              /* nfa.num_states while the builder holds it */
    long max_states;              /* nfa.MAX_NFA_STATES */
    IntVec edges, eps;            /* appended since the last flush */
    int may_dead_end;
    long fragment_min_size, max_minimized, minimize_after;
    long sizes_computed, pastes;
} Builder;

static int
deadline_check(Builder *b)
{
    PyObject *r = PyObject_CallNoArgs(b->ctx[CTX_CHECK]);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

static Kind
kind_of(PyObject *node)
{
    if (!PyTuple_Check(node) || PyTuple_GET_SIZE(node) < 1)
        return K_OTHER;
    PyObject *k = PyTuple_GET_ITEM(node, 0);
    if (!PyUnicode_Check(k))
        return K_OTHER;
    const char *s = PyUnicode_AsUTF8(k);
    if (s == NULL) {
        PyErr_Clear();
        return K_OTHER;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(node);
    if (strcmp(s, "chars") == 0)
        return n >= 2 ? K_CHARS : K_OTHER;
    if (strcmp(s, "seq") == 0)
        return n >= 2 ? K_SEQ : K_OTHER;
    if (strcmp(s, "alt") == 0)
        return n >= 2 ? K_ALT : K_OTHER;
    if (strcmp(s, "rep") == 0)
        return n >= 4 ? K_REP : K_OTHER;
    if (strcmp(s, "rule") == 0)
        return K_RULE;
    if (strcmp(s, "and") == 0 || strcmp(s, "diff") == 0)
        return K_PRODUCT;
    return K_OTHER;
}

/* ---- the NFA, shared with the Python helpers ------------------------------------------ */

static int
append_ints(PyObject *array, IntVec *v)
{
    if (v->len == 0)
        return 0;
    PyObject *r = PyObject_CallMethod(array, "frombytes", "y#", (const char *)v->data,
                                      v->len * (Py_ssize_t)sizeof(int32_t));
    v->len = 0;
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* Hands the NFA back to Python: edges appended, state count and may_dead_end written. */
static int
flush(Builder *b)
{
    if (append_ints(b->edges_out, &b->edges) < 0 || append_ints(b->eps_out, &b->eps) < 0)
        return -1;
    PyObject *n = PyLong_FromLong(b->num_states);
    if (n == NULL)
        return -1;
    int rc = PyObject_SetAttrString(b->nfa, "num_states", n);
    Py_DECREF(n);
    if (rc < 0)
        return -1;
    if (b->may_dead_end) {
        b->may_dead_end = 0;
        if (PyObject_SetAttrString(b->nfa, "may_dead_end", Py_True) < 0)
            return -1;
    }
    return 0;
}

/* Takes the NFA back after Python built into it. */
static int
reload(Builder *b)
{
    PyObject *n = PyObject_GetAttrString(b->nfa, "num_states");
    if (n == NULL)
        return -1;
    b->num_states = PyLong_AsLong(n);
    Py_DECREF(n);
    return (b->num_states == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* Calls ``fn(*args)`` (``args`` a new reference, or NULL with an error set) with the NFA
 * handed over; its int result (a state), or -1 with an error set. */
static long
call_py(Builder *b, PyObject *fn, PyObject *args)
{
    if (args == NULL)
        return -1;
    if (flush(b) < 0) {
        Py_DECREF(args);
        return -1;
    }
    PyObject *r = PyObject_Call(fn, args, NULL);
    Py_DECREF(args);
    if (r == NULL)
        return -1;
    long v = PyLong_AsLong(r);
    Py_DECREF(r);
    if (v == -1 && PyErr_Occurred())
        return -1;
    return reload(b) < 0 ? -1 : v;
}

/* nfa.new_state(): past the state limit, or at every 1,024th state (its deadline check),
 * the Python method itself runs. */
static long
new_state(Builder *b)
{
    long n = b->num_states;
    if (n >= b->max_states || (n & 1023) == 0) {
        PyObject *method = PyObject_GetAttrString(b->nfa, "new_state");
        if (method == NULL)
            return -1;
        long v = call_py(b, method, PyTuple_New(0));
        Py_DECREF(method);
        return v;
    }
    b->num_states = n + 1;
    return n;
}

static int
add_edge(Builder *b, long q, long lo, long hi, long t)
{
    if (vec_reserve(&b->edges, b->edges.len + 4) < 0)
        return -1;
    int32_t *out = b->edges.data + b->edges.len;
    out[0] = (int32_t)q; out[1] = (int32_t)lo; out[2] = (int32_t)hi; out[3] = (int32_t)t;
    b->edges.len += 4;
    return 0;
}

static int
add_eps(Builder *b, long q, long t)
{
    if (vec_reserve(&b->eps, b->eps.len + 2) < 0)
        return -1;
    b->eps.data[b->eps.len++] = (int32_t)q;
    b->eps.data[b->eps.len++] = (int32_t)t;
    return 0;
}

/* ---- sizes (_size_python) ------------------------------------------------------------- */

static int64_t
as_size(PyObject *value)
{
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow > 0 || v > SIZE_SATURATED)
        return SIZE_SATURATED;
    return v;
}

static int64_t size_of(Builder *b, PyObject *node);

static int64_t
size_uncached(Builder *b, PyObject *node, Kind kind)
{
    if (kind == K_CHARS)
        return 1;
    if (kind == K_SEQ || kind == K_ALT) {
        PyObject *children = PySequence_Fast(PyTuple_GET_ITEM(node, 1), "AST children");
        if (children == NULL)
            return -1;
        int64_t total = 1;
        for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(children); i++) {
            int64_t s = size_of(b, PySequence_Fast_ITEMS(children)[i]);
            if (s < 0) {
                Py_DECREF(children);
                return -1;
            }
            total = total + s > SIZE_SATURATED ? SIZE_SATURATED : total + s;
        }
        Py_DECREF(children);
        return total;
    }
    /* K_REP: 1 + size(child) * max(lo, hi or 1, 1), as ra.repeat_factor */
    long lo = PyLong_AsLong(PyTuple_GET_ITEM(node, 2));
    if (lo == -1 && PyErr_Occurred())
        return -1;
    PyObject *hi_obj = PyTuple_GET_ITEM(node, 3);
    long hi = 1;
    if (hi_obj != Py_None) {
        hi = PyLong_AsLong(hi_obj);
        if (hi == -1 && PyErr_Occurred())
            return -1;
    }
    int64_t factor = lo > hi ? lo : hi;
    if (factor < 1)
        factor = 1;
    int64_t child = size_of(b, PyTuple_GET_ITEM(node, 1));
    if (child < 0)
        return -1;
    if (child > (SIZE_SATURATED - 1) / factor)
        return SIZE_SATURATED;
    return 1 + child * factor;
}

/* _size_python(node), through the same cache; kinds other than the plain ones asked of
 * Python. -1 with an error set. */
static int64_t
size_of(Builder *b, PyObject *node)
{
    PyObject *sizes = b->ctx[CTX_SIZES];
    PyObject *key = PyLong_FromVoidPtr(node);
    if (key == NULL)
        return -1;
    PyObject *found = PyDict_GetItemWithError(sizes, key);
    if (found != NULL && PyTuple_Check(found) && PyTuple_GET_SIZE(found) == 2
            && PyTuple_GET_ITEM(found, 0) == node) {
        Py_DECREF(key);
        return as_size(PyTuple_GET_ITEM(found, 1));
    }
    if (found == NULL && PyErr_Occurred()) {
        Py_DECREF(key);
        return -1;
    }
    Kind kind = kind_of(node);
    if (kind != K_CHARS && kind != K_SEQ && kind != K_ALT && kind != K_REP) {
        Py_DECREF(key);
        PyObject *r = PyObject_CallOneArg(b->ctx[CTX_SIZE_PY], node);
        if (r == NULL)
            return -1;
        int64_t v = as_size(r);
        Py_DECREF(r);
        return v;
    }
    if (PyDict_GET_SIZE(sizes) > CACHE_MAX)
        PyDict_Clear(sizes);
    if (++b->sizes_computed % SIZES_PER_CHECK == 0 && deadline_check(b) < 0) {
        Py_DECREF(key);
        return -1;
    }
    int64_t size = -1;
    if (!Py_EnterRecursiveCall(" while sizing an NFA")) {
        size = size_uncached(b, node, kind);
        Py_LeaveRecursiveCall();
    }
    if (size >= 0) {
        PyObject *entry = Py_BuildValue("(OL)", node, (long long)size);
        if (entry != NULL && !PyObject_GC_IsTracked(node))
            PyObject_GC_UnTrack(entry);      /* (node, size): as the collector would */
        if (entry == NULL || PyDict_SetItem(sizes, key, entry) < 0)
            size = -1;
        Py_XDECREF(entry);
    }
    Py_DECREF(key);
    return size;
}

/* ---- building (_build_python and friends) --------------------------------------------- */

static long build(Builder *b, PyObject *node, long start);

/* The rows of one of a fragment's sealed tables (int32 [rows, width]) appended to
 * ``out`` as nfa.NFA.paste appends them (shift_states). */
static int
paste_table(PyObject *local, const char *name, int state_columns, long offset, long start,
            IntVec *out)
{
    Py_buffer table;
    int have = 0;
    if (view_take(PyObject_GetAttrString(local, name), &table, &have, 4, 2, name) < 0)
        return -1;
    Py_ssize_t n = table.shape[0] * table.shape[1], width = table.shape[1];
    int rc = vec_reserve(out, out->len + n);
    if (rc == 0) {
        shift_states(table.buf, n, width, state_columns, offset, start, out->data + out->len);
        out->len += n;
    }
    view_drop(&table, &have);
    return rc;
}

static long paste_fragment_held(Builder *b, PyObject *fragment, long start, PyObject *key);

/* _paste_again(nfa, fragment, start): the fragment's paste counted, then pasted here;
 * the paste that minimises it (the MINIMIZE_AFTER_PASTES-th) is left to Python. The
 * fragment (found in _FRAGMENTS) is held meanwhile: the deadline check runs Python, where
 * another thread's build may clear the cache. */
static long
paste_fragment(Builder *b, PyObject *fragment, long start, PyObject *key)
{
    Py_INCREF(fragment);
    long end = paste_fragment_held(b, fragment, start, key);
    Py_DECREF(fragment);
    return end;
}

static long
paste_fragment_held(Builder *b, PyObject *fragment, long start, PyObject *key)
{
    PyObject *local = PyTuple_GET_ITEM(fragment, 1), *pastes = b->ctx[CTX_PASTES];
    long end = PyLong_AsLong(PyTuple_GET_ITEM(fragment, 2));
    PyObject *n_obj = PyObject_GetAttrString(local, "num_states");
    long size = n_obj == NULL ? -1 : PyLong_AsLong(n_obj);
    Py_XDECREF(n_obj);
    if (end < 0 || size < 1)
        return PyErr_Occurred() ? -1 : call_py(b, b->ctx[CTX_PASTE_AGAIN],
                                             Py_BuildValue("(OOl)", b->nfa, fragment, start));
    PyObject *before = PyDict_GetItemWithError(pastes, key);
    if (before == NULL && PyErr_Occurred())
        return -1;
    long count = (before == NULL ? 0 : PyLong_AsLong(before)) + 1;
    if (count == 0 && PyErr_Occurred())
        return -1;
    if ((count == b->minimize_after && size <= b->max_minimized)
            || b->num_states + size - 1 > b->max_states)     /* nfa.reserve raises */
        return call_py(b, b->ctx[CTX_PASTE_AGAIN], Py_BuildValue("(OOl)", b->nfa, fragment, start));
    PyObject *count_obj = PyLong_FromLong(count);
    if (count_obj == NULL || PyDict_SetItem(pastes, key, count_obj) < 0) {
        Py_XDECREF(count_obj);
        return -1;
    }
    Py_DECREF(count_obj);
    PyObject *dead_end = PyObject_GetAttrString(local, "may_dead_end");
    int truth = dead_end == NULL ? -1 : PyObject_IsTrue(dead_end);
    Py_XDECREF(dead_end);
    if (truth < 0)
        return -1;
    b->may_dead_end |= truth;
    if (++b->pastes % PASTES_PER_CHECK == 0 && deadline_check(b) < 0)
        return -1;
    long offset = b->num_states - 1;           /* nfa.reserve(size - 1) - 1 */
    b->num_states += size - 1;
    if (paste_table(local, "edge_table", EDGE_STATE_COLUMNS, offset, start, &b->edges) < 0
            || paste_table(local, "eps_table", EPS_STATE_COLUMNS, offset, start, &b->eps) < 0)
        return -1;
    return end == 0 ? start : end + offset;
}

/* _build_chars: ASCII classes here; any other class (or none) by the Python helper. */
static long
build_chars(Builder *b, PyObject *ranges, long start)
{
    PyObject *items = PySequence_Fast(ranges, "character ranges");
    if (items == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(items);
    int ascii = n > 0;
    for (Py_ssize_t i = 0; i < n && ascii; i++) {
        PyObject *pair = PySequence_Fast_ITEMS(items)[i];
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            ascii = 0;
            break;
        }
        long hi = PyLong_AsLong(PyTuple_GET_ITEM(pair, 1));
        if (hi == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            ascii = 0;
        }
        ascii = ascii && hi < 0x80;
    }
    if (!ascii) {
        Py_DECREF(items);
        return call_py(b, b->ctx[CTX_BUILD_CHARS_PY], Py_BuildValue("(OOl)", b->nfa, ranges, start));
    }
    long end = new_state(b);
    for (Py_ssize_t i = 0; i < n && end >= 0; i++) {
        PyObject *pair = PySequence_Fast_ITEMS(items)[i];
        long lo = PyLong_AsLong(PyTuple_GET_ITEM(pair, 0));
        long hi = PyLong_AsLong(PyTuple_GET_ITEM(pair, 1));
        if ((lo == -1 && PyErr_Occurred()) || add_edge(b, start, lo, hi, end) < 0)
            end = -1;
    }
    Py_DECREF(items);
    return end;
}

/* _settled_fragment: the node's fragment (borrowed) when further pastes leave it as it is;
 * NULL without an error otherwise. */
static PyObject *
settled_fragment(Builder *b, PyObject *node, PyObject *key)
{
    PyObject *fragment = PyDict_GetItemWithError(b->ctx[CTX_FRAGMENTS], key);
    if (fragment == NULL || !PyTuple_Check(fragment) || PyTuple_GET_SIZE(fragment) < 3
            || PyTuple_GET_ITEM(fragment, 0) != node)
        return NULL;
    PyObject *n = PyObject_GetAttrString(PyTuple_GET_ITEM(fragment, 1), "num_states");
    if (n == NULL)
        return NULL;
    long states = PyLong_AsLong(n);
    Py_DECREF(n);
    if (states == -1 && PyErr_Occurred())
        return NULL;
    if (states > b->max_minimized)
        return fragment;
    PyObject *pastes = PyDict_GetItemWithError(b->ctx[CTX_PASTES], key);
    if (pastes == NULL && PyErr_Occurred())
        return NULL;
    long count = pastes == NULL ? 0 : PyLong_AsLong(pastes);
    if (count == -1 && PyErr_Occurred())
        return NULL;
    return count >= b->minimize_after ? fragment : NULL;
}

/* _build_copies: ``count`` copies of ``child`` in a row (with ``exit`` >= 0, an epsilon
 * edge from each copy's start to it first), the rest pasted once the fragment settles. */
static long
build_copies(Builder *b, PyObject *child, long count, long state, long exit)
{
    PyObject *key = PyLong_FromVoidPtr(child);
    if (key == NULL)
        return -1;
    for (long done = 0; done < count && state >= 0; done++) {
        PyObject *fragment = settled_fragment(b, child, key);
        if (fragment != NULL) {
            PyObject *args = exit >= 0
                ? Py_BuildValue("(OOlll)", b->nfa, fragment, count - done, state, exit)
                : Py_BuildValue("(OOllO)", b->nfa, fragment, count - done, state, Py_None);
            Py_DECREF(key);
            return call_py(b, b->ctx[CTX_PASTE_COPIES], args);
        }
        if (PyErr_Occurred() || (exit >= 0 && add_eps(b, state, exit) < 0)) {
            state = -1;
            break;
        }
        state = build(b, child, state);
    }
    Py_DECREF(key);
    return state;
}

static long
build_rep(Builder *b, PyObject *node, long start)
{
    PyObject *child = PyTuple_GET_ITEM(node, 1), *hi_obj = PyTuple_GET_ITEM(node, 3);
    long lo = PyLong_AsLong(PyTuple_GET_ITEM(node, 2));
    if (lo == -1 && PyErr_Occurred())
        return -1;
    long state = build_copies(b, child, lo, start, -1);
    long end = state < 0 ? -1 : new_state(b);
    if (end < 0)
        return -1;
    if (hi_obj == Py_None) {
        long loop = new_state(b);
        if (loop < 0 || add_eps(b, state, loop) < 0 || add_eps(b, loop, end) < 0)
            return -1;
        long body = build(b, child, loop);
        return (body < 0 || add_eps(b, body, loop) < 0) ? -1 : end;
    }
    long hi = PyLong_AsLong(hi_obj);
    if (hi == -1 && PyErr_Occurred())
        return -1;
    state = build_copies(b, child, hi - lo, state, end);
    return (state < 0 || add_eps(b, state, end) < 0) ? -1 : end;
}

/* _build_node_python: ``node`` built in place (its parts through build). */
static long
build_node(Builder *b, PyObject *node, long start, Kind kind)
{
    if (kind == K_CHARS)
        return build_chars(b, PyTuple_GET_ITEM(node, 1), start);
    if (kind == K_REP)
        return build_rep(b, node, start);
    if (kind != K_SEQ && kind != K_ALT)
        return call_py(b, b->ctx[CTX_BUILD_NODE_PY], Py_BuildValue("(OOl)", b->nfa, node, start));
    PyObject *children = PySequence_Fast(PyTuple_GET_ITEM(node, 1), "AST children");
    if (children == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(children);
    PyObject **items = PySequence_Fast_ITEMS(children);
    long state = start;
    if (kind == K_SEQ) {
        for (Py_ssize_t i = 0; i < n && state >= 0; i++)
            state = build(b, items[i], state);
        Py_DECREF(children);
        return state;
    }
    long end = new_state(b);
    if (n == 0)
        b->may_dead_end = 1;
    for (Py_ssize_t i = 0; i < n && end >= 0; i++) {
        long branch = new_state(b);
        if (branch < 0 || add_eps(b, start, branch) < 0) {
            end = -1;
            break;
        }
        long last = build(b, items[i], branch);
        if (last < 0 || add_eps(b, last, end) < 0)
            end = -1;
    }
    Py_DECREF(children);
    return end;
}

static long
build_inner(Builder *b, PyObject *node, long start, PyObject *key)
{
    PyObject *fragment = PyDict_GetItemWithError(b->ctx[CTX_FRAGMENTS], key);
    if (fragment != NULL && PyTuple_Check(fragment) && PyTuple_GET_SIZE(fragment) >= 3
            && PyTuple_GET_ITEM(fragment, 0) == node)
        return paste_fragment(b, fragment, start, key);
    if (fragment == NULL && PyErr_Occurred())
        return -1;
    Kind kind = kind_of(node);
    if (kind == K_CHARS || kind == K_RULE)
        return build_node(b, node, start, kind);
    int product = kind == K_PRODUCT;
    if (!product) {
        int64_t size = size_of(b, node);
        if (size < 0)
            return -1;
        if (size < b->fragment_min_size)
            return build_node(b, node, start, kind);
        PyObject *seen = b->ctx[CTX_SEEN_ONCE];
        int known = PyDict_Contains(seen, key);
        if (known < 0)
            return -1;
        if (!known) {
            /* record only shared nodes (see _build_python) */
            if (PyDict_SetItem(seen, key, node) < 0)
                return -1;
            if (PyDict_GET_SIZE(seen) > CACHE_MAX)
                PyDict_Clear(seen);
            return build_node(b, node, start, kind);
        }
    }
    return call_py(b, b->ctx[CTX_RECORD_AND_PASTE], Py_BuildValue("(OOl)", b->nfa, node, start));
}

/* _build_python: ``node`` from ``start``; its end state, or -1 with an error set. */
static long
build(Builder *b, PyObject *node, long start)
{
    PyObject *key = PyLong_FromVoidPtr(node);
    if (key == NULL)
        return -1;
    long end = -1;
    if (!Py_EnterRecursiveCall(" while building an NFA")) {
        end = build_inner(b, node, start, key);
        Py_LeaveRecursiveCall();
    }
    Py_DECREF(key);
    return end;
}

/* ---- entry points ------------------------------------------------------------------------ */

static long
ctx_long(PyObject *ctx, int i)
{
    return PyLong_AsLong(PyTuple_GET_ITEM(ctx, i));
}

static int
builder_open(Builder *b, PyObject *nfa, PyObject *ctx)
{
    memset(b, 0, sizeof(*b));
    if (PyTuple_GET_SIZE(ctx) != CTX_LEN) {
        PyErr_Format(PyExc_ValueError, "builder context: expected %d items, got %zd", CTX_LEN,
                     PyTuple_GET_SIZE(ctx));
        return -1;
    }
    for (int i = CTX_FRAGMENTS; i <= CTX_PASTES; i++)
        if (!PyDict_Check(PyTuple_GET_ITEM(ctx, i))) {
            PyErr_Format(PyExc_TypeError, "builder context: item %d is not a dict", i);
            return -1;
        }
    b->ctx = &PyTuple_GET_ITEM(ctx, 0);
    b->fragment_min_size = ctx_long(ctx, CTX_FRAGMENT_MIN_SIZE);
    b->max_minimized = ctx_long(ctx, CTX_MAX_MINIMIZED_NFA);
    b->minimize_after = ctx_long(ctx, CTX_MINIMIZE_AFTER_PASTES);
    b->max_states = ctx_long(ctx, CTX_MAX_NFA_STATES);
    if (PyErr_Occurred())
        return -1;
    if (nfa == NULL)
        return 0;
    b->nfa = nfa;
    b->edges_out = PyObject_GetAttrString(nfa, "_edges");
    b->eps_out = b->edges_out ? PyObject_GetAttrString(nfa, "_eps") : NULL;
    if (b->eps_out == NULL)
        return -1;
    if (b->edges_out == Py_None || b->eps_out == Py_None) {
        PyErr_SetString(PyExc_ValueError, "the NFA is sealed: nothing can be added to it");
        return -1;
    }
    return reload(b);
}

static void
builder_close(Builder *b)
{
    Py_XDECREF(b->edges_out);
    Py_XDECREF(b->eps_out);
    vec_free(&b->edges);
    vec_free(&b->eps);
}

/* Runs build (node_only = 0) or build_node (1) and hands the NFA back. */
static PyObject *
build_entry(PyObject *args, int node_only)
{
    PyObject *nfa, *node, *ctx;
    long start;
    if (!PyArg_ParseTuple(args, "OOlO!", &nfa, &node, &start, &PyTuple_Type, &ctx))
        return NULL;
    Builder b;
    long end = -1;
    if (builder_open(&b, nfa, ctx) == 0) {
        end = node_only ? build_node(&b, node, start, kind_of(node)) : build(&b, node, start);
        if (end >= 0 && flush(&b) < 0)
            end = -1;
    }
    builder_close(&b);
    return end < 0 ? NULL : PyLong_FromLong(end);
}

PyObject *
build_nfa(PyObject *self, PyObject *args)
{
    return build_entry(args, 0);
}

PyObject *
build_nfa_node(PyObject *self, PyObject *args)
{
    return build_entry(args, 1);
}

/* A tuple and the tuples under it no longer tracked by the garbage collector where that is
 * what the collector itself would conclude (_PyTuple_MaybeUntrack: no item that may be
 * tracked), done at once for the whole tree: 1 when ``obj`` is not tracked afterwards. */
static int
untrack_tree(PyObject *obj)
{
    if (!PyObject_GC_IsTracked(obj))
        return 1;
    if (!PyTuple_CheckExact(obj) || Py_EnterRecursiveCall(" while untracking a regex AST")) {
        PyErr_Clear();
        return 0;
    }
    int all = 1;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(obj); i++)
        all &= untrack_tree(PyTuple_GET_ITEM(obj, i));
    Py_LeaveRecursiveCall();
    if (all)
        PyObject_GC_UnTrack(obj);
    return all;
}

PyObject *
untrack_ast(PyObject *self, PyObject *node)
{
    return PyBool_FromLong(untrack_tree(node));
}

PyObject *
nfa_size(PyObject *self, PyObject *args)
{
    PyObject *node, *ctx;
    if (!PyArg_ParseTuple(args, "OO!", &node, &PyTuple_Type, &ctx))
        return NULL;
    Builder b;
    int64_t size = -1;
    if (builder_open(&b, NULL, ctx) == 0)
        size = size_of(&b, node);
    builder_close(&b);
    return size < 0 ? NULL : PyLong_FromLongLong((long long)size);
}
