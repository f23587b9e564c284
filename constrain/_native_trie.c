/* The vocabulary trie laid out depth first and walked through a lazy DFA: Trie.walk (see
 * _native.c for the contract). */
#include "_native_common.h"

/* ---- Trie: the vocabulary trie in depth-first order, walked through a DFA ---------------- */

/* One trie node, in depth-first (pre-)order: its subtree is nodes i .. end - 1, and the
 * tokens spelled by the nodes of that subtree are tokens[tok[i] .. tok[end]), those equal
 * to node i's prefix first (tokens[tok[i] .. tok[i + 1])). */
typedef struct {
    int32_t end, tok;
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
    self->nodes[n] = (TrieNode){(int32_t)n, (int32_t)tok, 0, 0};
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

/* The output of a scan: tokens_out[t] set for each token spelled by a live node. */
static int
Trie_mark(Trie *self, const uint8_t *alive, uint8_t *tokens_out, Py_ssize_t vocab)
{
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
    PyObject *dfa, *tokens_obj, *first_obj;
    int state, want_ends;
    if (!PyArg_ParseTuple(args, "OiOOp:walk", &dfa, &state, &tokens_obj, &first_obj, &want_ends))
        return NULL;
    if (self->nodes == NULL) {
        PyErr_SetString(PyExc_TypeError, "Trie is not initialised");
        return NULL;
    }
    Py_buffer tokens_view, first_view;
    int have_tokens = 0, have_first = 0;
    DFAView d = {.dfa = dfa};
    IntVec end_tok = {0}, end_cut = {0};
    PyObject *result = NULL;
    uint8_t *tokens = NULL, *alive = NULL;
    const uint8_t *first = NULL;
    Py_ssize_t vocab = 0;
    if (get_ints(tokens_obj, 1, 1, 1, &tokens_view, "tokens_out") < 0)
        goto done;
    have_tokens = 1;
    tokens = tokens_view.buf;
    vocab = tokens_view.shape[0];
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
            || Trie_mark(self, alive, tokens, vocab) < 0)
        goto done;
    result = Py_BuildValue("(y#y#)", (const char *)end_tok.data,
                           (Py_ssize_t)(end_tok.len * (Py_ssize_t)sizeof(int32_t)),
                           (const char *)end_cut.data,
                           (Py_ssize_t)(end_cut.len * (Py_ssize_t)sizeof(int32_t)));
done:
    dfa_release(&d);
    view_drop(&tokens_view, &have_tokens);
    view_drop(&first_view, &have_first);
    vec_free(&end_tok);
    vec_free(&end_cut);
    PyMem_Free(alive);
    return result;
}

static PyMethodDef Trie_methods[] = {
    {"walk", (PyCFunction)Trie_walk, METH_VARARGS,
     "walk(dfa, state, tokens_out, first_bytes, want_ends) -> (end tokens, end "
     "cuts) as int32 bytes (see the module doc)"},
    {NULL, NULL, 0, NULL},
};

PyTypeObject TrieType = {
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


/* ---- walk_items: tokens' remaining bytes walked through a DFA --------------------------- */

#define PAD_BYTE 256             /* token_table.PAD: ends each token's bytes in ``flat`` */

/* walk_items(dfa, flat, tok, at, st, want_ends) -> (accepted, end tokens, end positions)
 * (see _native.c): each item walked on its own, byte by byte. */
PyObject *
walk_items(PyObject *module, PyObject *args)
{
    PyObject *dfa_obj, *arrays[4];
    int want_ends;
    if (!PyArg_ParseTuple(args, "OOOOOp:walk_items", &dfa_obj, &arrays[0], &arrays[1],
                          &arrays[2], &arrays[3], &want_ends))
        return NULL;
    static const char *names[4] = {"flat", "tok", "at", "st"};
    Py_buffer views[4];
    int have = 0;
    DFAView d = {.dfa = dfa_obj};
    IntVec accepted = {0}, end_tok = {0}, end_at = {0};
    PyObject *result = NULL;
    for (; have < 4; have++)
        if (get_ints(arrays[have], have == 0 ? 2 : 8, 1, 0, &views[have], names[have]) < 0)
            goto done;
    const int16_t *flat = views[0].buf;
    const int64_t *tok = views[1].buf, *at = views[2].buf, *st = views[3].buf;
    Py_ssize_t n = views[1].shape[0], size = views[0].shape[0];
    if (views[2].shape[0] != n || views[3].shape[0] != n) {
        PyErr_SetString(PyExc_ValueError, "walk_items(): tok, at and st differ in length");
        goto done;
    }
    if (size == 0 || flat[size - 1] != PAD_BYTE) {
        PyErr_SetString(PyExc_ValueError, "walk_items(): flat must end with PAD");
        goto done;
    }
    if (dfa_read(&d) < 0)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t k = at[i];
        int32_t state = (int32_t)st[i];
        if (k < 0 || k >= size) {
            PyErr_SetString(PyExc_IndexError, "walk_items(): a position outside flat");
            goto done;
        }
        for (; flat[k] != PAD_BYTE; k++) {       /* flat ends with PAD: k stays inside */
            int reread = 0;
            const int32_t *row = dfa_row(&d, state, &reread);
            if (row == NULL)
                goto done;
            state = row[flat[k]];
            if (state < 0)
                break;
            if (want_ends && flat[k + 1] != PAD_BYTE) {
                int accepting;
                if (dfa_accepting(&d, state, &accepting) < 0)
                    goto done;
                if (accepting && (vec_push(&end_tok, (int32_t)tok[i]) < 0
                                  || vec_push(&end_at, (int32_t)(k + 1)) < 0))
                    goto done;
            }
        }
        if (state >= 0 && vec_push(&accepted, (int32_t)tok[i]) < 0)
            goto done;
    }
    PyObject *parts[3] = {ints_bytes(&accepted), ints_bytes(&end_tok), ints_bytes(&end_at)};
    if (parts[0] != NULL && parts[1] != NULL && parts[2] != NULL)
        result = PyTuple_Pack(3, parts[0], parts[1], parts[2]);
    for (int p = 0; p < 3; p++)
        Py_XDECREF(parts[p]);
done:
    for (int v = 0; v < have; v++)
        PyBuffer_Release(&views[v]);
    dfa_release(&d);
    vec_free(&accepted);
    vec_free(&end_tok);
    vec_free(&end_at);
    return result;
}
