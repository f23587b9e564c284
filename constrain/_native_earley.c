/* An Earley set's closure in C: earley.EarleySet._closure (its reference) over a grammar's
 * productions laid out as int arrays once (EarleyTables).
 *
 * A set is made whenever a lexeme ends, inside the mask fill that first reaches it; in a
 * large grammar (an object of hundreds of members) its closure predicts hundreds of
 * productions, and in Python each item cost a tuple, a set lookup and a few list
 * operations. Here the items are int triples in a hash set; the result is the same
 * ``waiting`` mapping (symbol after the dot -> the items waiting on it, as tuples, in the
 * order the reference appends them) and the same ``accepting`` flag.
 */
#include "_native_common.h"

typedef struct {
    PyObject_HEAD
    int32_t num_nonterminals, start, num_productions, num_symbols;
    int32_t *lhs, *rhs_start, *rhs, *by_lhs_start, *by_lhs;
    uint8_t *nullable;
} EarleyTables;

static void
EarleyTables_dealloc(EarleyTables *self)
{
    PyMem_Free(self->lhs);
    PyMem_Free(self->rhs_start);
    PyMem_Free(self->rhs);
    PyMem_Free(self->by_lhs_start);
    PyMem_Free(self->by_lhs);
    PyMem_Free(self->nullable);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* A copy of an int32 buffer of ``expected`` items (-1: any length), into *out. */
static int
copy_ints(PyObject *obj, Py_ssize_t expected, int32_t **out, Py_ssize_t *len, const char *name)
{
    Py_buffer view;
    if (get_ints(obj, 4, 1, 0, &view, name) < 0)
        return -1;
    if (expected >= 0 && view.shape[0] != expected) {
        PyErr_Format(PyExc_ValueError, "%s: expected %zd entries, got %zd", name, expected,
                     view.shape[0]);
        PyBuffer_Release(&view);
        return -1;
    }
    *len = view.shape[0];
    *out = PyMem_Malloc(((size_t)*len + 1) * sizeof(int32_t));
    if (*out == NULL) {
        PyBuffer_Release(&view);
        PyErr_NoMemory();
        return -1;
    }
    memcpy(*out, view.buf, (size_t)*len * sizeof(int32_t));
    PyBuffer_Release(&view);
    return 0;
}

/* EarleyTables(num_nonterminals, num_symbols, start, lhs, rhs_start, rhs, by_lhs_start,
 *              by_lhs, nullable): int32 arrays (rhs_start and by_lhs_start CSR offsets, one
 *              more than the productions / nonterminals), nullable one byte a nonterminal. */
static int
EarleyTables_init(EarleyTables *self, PyObject *args, PyObject *kwds)
{
    PyObject *arrays[6], *nullable_obj;
    int nt, num_symbols, start;
    if (!PyArg_ParseTuple(args, "iiiOOOOOO:EarleyTables", &nt, &num_symbols, &start, &arrays[0],
                          &arrays[1], &arrays[2], &arrays[3], &arrays[4], &nullable_obj))
        return -1;
    if (self->lhs != NULL) {
        PyErr_SetString(PyExc_TypeError, "EarleyTables is initialised once");
        return -1;
    }
    Py_ssize_t n_lhs, n_starts, n_rhs, n_by_starts, n_by;
    if (copy_ints(arrays[0], -1, &self->lhs, &n_lhs, "lhs") < 0
            || copy_ints(arrays[1], n_lhs + 1, &self->rhs_start, &n_starts, "rhs_start") < 0
            || copy_ints(arrays[2], -1, &self->rhs, &n_rhs, "rhs") < 0
            || copy_ints(arrays[3], (Py_ssize_t)nt + 1, &self->by_lhs_start, &n_by_starts,
                         "by_lhs_start") < 0
            || copy_ints(arrays[4], -1, &self->by_lhs, &n_by, "by_lhs") < 0)
        return -1;
    Py_buffer view;
    if (get_ints(nullable_obj, 1, 1, 0, &view, "nullable") < 0)
        return -1;
    int bad = view.shape[0] != nt;
    self->nullable = bad ? NULL : PyMem_Malloc((size_t)nt + 1);
    if (self->nullable != NULL)
        memcpy(self->nullable, view.buf, (size_t)nt);
    PyBuffer_Release(&view);
    if (bad || self->nullable == NULL) {
        if (bad)
            PyErr_SetString(PyExc_ValueError, "nullable: expected one byte a nonterminal");
        else
            PyErr_NoMemory();
        return -1;
    }
    self->num_nonterminals = nt;
    self->num_symbols = num_symbols;
    self->start = start;
    self->num_productions = (int32_t)n_lhs;
    for (Py_ssize_t p = 0; p < n_lhs; p++)
        if (self->lhs[p] < 0 || self->lhs[p] >= nt || self->rhs_start[p] > self->rhs_start[p + 1]) {
            PyErr_SetString(PyExc_ValueError, "EarleyTables: a production out of range");
            return -1;
        }
    if (self->rhs_start[0] != 0 || self->rhs_start[n_lhs] != n_rhs
            || self->by_lhs_start[0] != 0 || self->by_lhs_start[nt] != n_by) {
        PyErr_SetString(PyExc_ValueError, "EarleyTables: offsets do not cover their arrays");
        return -1;
    }
    for (Py_ssize_t i = 0; i < n_rhs; i++)
        if (self->rhs[i] < 0 || self->rhs[i] >= num_symbols) {
            PyErr_SetString(PyExc_ValueError, "EarleyTables: a symbol out of range");
            return -1;
        }
    for (Py_ssize_t i = 0; i < n_by; i++)
        if (self->by_lhs[i] < 0 || self->by_lhs[i] >= n_lhs) {
            PyErr_SetString(PyExc_ValueError, "EarleyTables: a production index out of range");
            return -1;
        }
    return 0;
}

/* ---- the item set: open addressing over (p, d, o) triples ------------------------------- */

static inline uint64_t
item_hash(int32_t p, int32_t d, int32_t o)
{
    uint64_t h = (uint64_t)(uint32_t)p * 0x9E3779B97F4A7C15ULL;
    h ^= (uint64_t)(uint32_t)d * 0xC2B2AE3D27D4EB4FULL;
    h ^= (uint64_t)(uint32_t)o * 0x165667B19E3779F9ULL;
    return h ^ (h >> 29);
}

typedef struct {
    IntVec *keys;                /* 3 ints a slot, p = -1 when free */
    Py_ssize_t slots, len;
} ItemSet;

static int
itemset_init(ItemSet *s, IntVec *keys, Py_ssize_t expected)
{
    Py_ssize_t slots = 64;
    while (slots < 2 * expected)
        slots *= 2;
    if (vec_reserve(keys, 3 * slots) < 0)
        return -1;
    keys->len = 3 * slots;
    for (Py_ssize_t i = 0; i < slots; i++)
        keys->data[3 * i] = -1;
    *s = (ItemSet){keys, slots, 0};
    return 0;
}

static int itemset_add(ItemSet *s, int32_t p, int32_t d, int32_t o);

static int
itemset_grow(ItemSet *s)
{
    Py_ssize_t old_slots = s->slots;
    int32_t *old = PyMem_Malloc((size_t)old_slots * 3 * sizeof(int32_t));
    if (old == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(old, s->keys->data, (size_t)old_slots * 3 * sizeof(int32_t));
    if (vec_reserve(s->keys, 6 * old_slots) < 0) {
        PyMem_Free(old);
        return -1;
    }
    s->keys->len = 6 * old_slots;
    s->slots = 2 * old_slots;
    s->len = 0;
    for (Py_ssize_t i = 0; i < s->slots; i++)
        s->keys->data[3 * i] = -1;
    for (Py_ssize_t i = 0; i < old_slots; i++)
        if (old[3 * i] >= 0)
            itemset_add(s, old[3 * i], old[3 * i + 1], old[3 * i + 2]);
    PyMem_Free(old);
    return 0;
}

/* 1 if added, 0 if present, -1 on error. */
static int
itemset_add(ItemSet *s, int32_t p, int32_t d, int32_t o)
{
    if (2 * (s->len + 1) > s->slots && itemset_grow(s) < 0)
        return -1;
    Py_ssize_t mask = s->slots - 1, i = (Py_ssize_t)(item_hash(p, d, o) & (uint64_t)mask);
    int32_t *k = s->keys->data;
    for (; k[3 * i] >= 0; i = (i + 1) & mask)
        if (k[3 * i] == p && k[3 * i + 1] == d && k[3 * i + 2] == o)
            return 0;
    k[3 * i] = p;
    k[3 * i + 1] = d;
    k[3 * i + 2] = o;
    s->len++;
    return 1;
}

/* ---- the closure ------------------------------------------------------------------------- */

/* One closure's state, its own (a closure calls Python, where another thread may make a
 * set of the same grammar). */
typedef struct {
    EarleyTables *g;
    ItemSet items;
    IntVec item_keys;            /* the item set's slots */
    IntVec *waiting;             /* symbol -> its waiting items (triples), in append order */
    IntVec symbols;              /* the symbols of ``waiting`` in first-append order */
    IntVec stack;                /* items to expand (triples) */
    PyObject *earlier_set;       /* the new set: .ancestor(origin).waiting for far origins */
    PyObject *sources;           /* origin -> that set's waiting dict (a dict of our own) */
} Closure;

static void
closure_free(Closure *c)
{
    if (c->waiting != NULL)
        for (Py_ssize_t k = 0; k < c->symbols.len; k++)
            vec_free(&c->waiting[c->symbols.data[k]]);
    PyMem_Free(c->waiting);
    vec_free(&c->symbols);
    vec_free(&c->stack);
    vec_free(&c->item_keys);
    Py_XDECREF(c->sources);
}

/* Adds (p, d, o) if new, and pushes it to be expanded. */
static inline int
push_new(Closure *c, int32_t p, int32_t d, int32_t o)
{
    int added = itemset_add(&c->items, p, d, o);
    if (added <= 0)
        return added;
    IntVec *stack = &c->stack;
    if (vec_reserve(stack, stack->len + 3) < 0)
        return -1;
    stack->data[stack->len++] = p;
    stack->data[stack->len++] = d;
    stack->data[stack->len++] = o;
    return 0;
}

/* The waiting dict of the set at ``origin`` (borrowed from c->sources). */
static PyObject *
source_at(Closure *c, int32_t origin)
{
    PyObject *key = PyLong_FromLong(origin);
    if (key == NULL)
        return NULL;
    PyObject *found = PyDict_GetItemWithError(c->sources, key);
    if (found == NULL && !PyErr_Occurred()) {
        PyObject *set = PyObject_CallMethod(c->earlier_set, "ancestor", "i", (int)origin);
        PyObject *waiting = set == NULL ? NULL : PyObject_GetAttrString(set, "waiting");
        Py_XDECREF(set);
        if (waiting != NULL && !PyDict_Check(waiting)) {
            PyErr_SetString(PyExc_TypeError, "an earlier set's waiting is not a dict");
            Py_CLEAR(waiting);
        }
        if (waiting != NULL && PyDict_SetItem(c->sources, key, waiting) == 0)
            found = waiting;
        Py_XDECREF(waiting);
    }
    Py_DECREF(key);
    return found;
}

/* Completes the items waiting on ``lhs`` in the set at ``origin`` (an earlier one). */
static int
complete_from_earlier(Closure *c, int32_t lhs, int32_t origin)
{
    PyObject *source = source_at(c, origin);
    if (source == NULL)
        return -1;
    PyObject *key = PyLong_FromLong(lhs);
    if (key == NULL)
        return -1;
    PyObject *waiting = PyDict_GetItemWithError(source, key);
    Py_DECREF(key);
    if (waiting == NULL)
        return PyErr_Occurred() ? -1 : 0;
    PyObject *items = PySequence_Fast(waiting, "waiting items");
    if (items == NULL)
        return -1;
    int rc = 0;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(items) && rc == 0; i++) {
        PyObject *item = PySequence_Fast_ITEMS(items)[i];
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 3) {
            PyErr_SetString(PyExc_TypeError, "a waiting item is not a (p, d, o) tuple");
            rc = -1;
            break;
        }
        long wp = PyLong_AsLong(PyTuple_GET_ITEM(item, 0));
        long wd = PyLong_AsLong(PyTuple_GET_ITEM(item, 1));
        long wo = PyLong_AsLong(PyTuple_GET_ITEM(item, 2));
        if (PyErr_Occurred())
            rc = -1;
        else if (push_new(c, (int32_t)wp, (int32_t)wd + 1, (int32_t)wo) < 0)
            rc = -1;
    }
    Py_DECREF(items);
    return rc;
}

static int
expand(Closure *c, int32_t p, int32_t dot, int32_t origin, int32_t position)
{
    EarleyTables *g = c->g;
    int32_t len = g->rhs_start[p + 1] - g->rhs_start[p];
    if (dot < len) {
        int32_t symbol = g->rhs[g->rhs_start[p] + dot];
        IntVec *waiting = &c->waiting[symbol];
        if (waiting->len == 0 && vec_push(&c->symbols, symbol) < 0)
            return -1;
        if (vec_reserve(waiting, waiting->len + 3) < 0)
            return -1;
        waiting->data[waiting->len++] = p;
        waiting->data[waiting->len++] = dot;
        waiting->data[waiting->len++] = origin;
        if (symbol < g->num_nonterminals) {
            for (int32_t k = g->by_lhs_start[symbol]; k < g->by_lhs_start[symbol + 1]; k++)
                if (push_new(c, g->by_lhs[k], 0, position) < 0)
                    return -1;
            if (g->nullable[symbol] && push_new(c, p, dot + 1, origin) < 0)
                return -1;
        }
        return 0;
    }
    int32_t lhs = g->lhs[p];
    if (origin != position)
        return complete_from_earlier(c, lhs, origin);
    IntVec *here = &c->waiting[lhs];
    Py_ssize_t n = here->len;           /* the items waiting so far (the reference's list()) */
    for (Py_ssize_t i = 0; i < n; i += 3)
        if (push_new(c, here->data[i], here->data[i + 1] + 1, here->data[i + 2]) < 0)
            return -1;
    return 0;
}

/* The waiting dict, as the reference builds it, or NULL. */
static PyObject *
waiting_dict(Closure *c)
{
    PyObject *out = PyDict_New();
    for (Py_ssize_t k = 0; k < c->symbols.len && out != NULL; k++) {
        int32_t symbol = c->symbols.data[k];
        IntVec *w = &c->waiting[symbol];
        PyObject *items = PyTuple_New(w->len / 3), *key = PyLong_FromLong(symbol);
        for (Py_ssize_t i = 0; items != NULL && i < w->len / 3; i++) {
            PyObject *item = Py_BuildValue("(iii)", w->data[3 * i], w->data[3 * i + 1],
                                           w->data[3 * i + 2]);
            if (item == NULL)
                Py_CLEAR(items);
            else
                PyTuple_SET_ITEM(items, i, item);
        }
        if (items == NULL || key == NULL || PyDict_SetItem(out, key, items) < 0)
            Py_CLEAR(out);
        Py_XDECREF(items);
        Py_XDECREF(key);
    }
    return out;
}

/* closure(kernel, position, new_set) -> (waiting, accepting): see the file's comment;
 * ``kernel`` a list of (p, d, o) tuples in the reference's order (list(kernel_set)),
 * ``new_set`` the set being made (its ancestor() finds the sets of earlier origins). */
static PyObject *
EarleyTables_closure(EarleyTables *self, PyObject *args)
{
    PyObject *kernel, *new_set;
    int position;
    if (!PyArg_ParseTuple(args, "O!iO:closure", &PyList_Type, &kernel, &position, &new_set))
        return NULL;
    if (self->lhs == NULL) {
        PyErr_SetString(PyExc_TypeError, "EarleyTables is not initialised");
        return NULL;
    }
    Closure c = {.g = self, .earlier_set = new_set, .sources = PyDict_New(),
                 .waiting = PyMem_Calloc((size_t)self->num_symbols + 1, sizeof(IntVec))};
    PyObject *result = NULL;
    if (c.waiting == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (c.sources == NULL || itemset_init(&c.items, &c.item_keys, 4 * PyList_GET_SIZE(kernel)) < 0)
        goto done;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(kernel); i++) {
        PyObject *item = PyList_GET_ITEM(kernel, i);
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 3) {
            PyErr_SetString(PyExc_TypeError, "a kernel item is not a (p, d, o) tuple");
            goto done;
        }
        long p = PyLong_AsLong(PyTuple_GET_ITEM(item, 0));
        long d = PyLong_AsLong(PyTuple_GET_ITEM(item, 1));
        long o = PyLong_AsLong(PyTuple_GET_ITEM(item, 2));
        if (PyErr_Occurred())
            goto done;
        if (p < 0 || p >= self->num_productions || d < 0
                || d > self->rhs_start[p + 1] - self->rhs_start[p] || o < 0 || o > position) {
            PyErr_SetString(PyExc_ValueError, "a kernel item out of range");
            goto done;
        }
        if (itemset_add(&c.items, (int32_t)p, (int32_t)d, (int32_t)o) < 0)
            goto done;
    }
    /* the stack holds the kernel in list order, popped from the end as the reference pops */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(kernel); i++) {
        PyObject *item = PyList_GET_ITEM(kernel, i);
        for (int j = 0; j < 3; j++)
            if (vec_push(&c.stack, (int32_t)PyLong_AsLong(PyTuple_GET_ITEM(item, j))) < 0)
                goto done;
    }
    while (c.stack.len > 0) {
        int32_t *top = c.stack.data + c.stack.len - 3;
        int32_t p = top[0], d = top[1], o = top[2];
        c.stack.len -= 3;
        if (expand(&c, p, d, o, position) < 0)
            goto done;
    }
    int accepting = 0;
    const int32_t *k = c.items.keys->data;
    for (Py_ssize_t i = 0; i < c.items.slots && !accepting; i++) {
        int32_t p = k[3 * i];
        accepting = p >= 0 && self->lhs[p] == self->start && k[3 * i + 2] == 0
                    && k[3 * i + 1] == self->rhs_start[p + 1] - self->rhs_start[p];
    }
    PyObject *waiting = waiting_dict(&c);
    if (waiting != NULL) {
        result = Py_BuildValue("(OO)", waiting, accepting ? Py_True : Py_False);
        Py_DECREF(waiting);
    }
done:
    closure_free(&c);
    return result;
}

static PyMethodDef EarleyTables_methods[] = {
    {"closure", (PyCFunction)EarleyTables_closure, METH_VARARGS,
     "closure(kernel, position, new_set) -> (waiting, accepting): EarleySet._closure in C"},
    {NULL, NULL, 0, NULL},
};

PyTypeObject EarleyTablesType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_native.EarleyTables",
    .tp_basicsize = sizeof(EarleyTables),
    .tp_dealloc = (destructor)EarleyTables_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A grammar's productions as int arrays, for Earley closures (see the module doc).",
    .tp_methods = EarleyTables_methods,
    .tp_init = (initproc)EarleyTables_init,
    .tp_new = PyType_GenericNew,
};
