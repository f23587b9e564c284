/* The vocabulary trie laid out depth first and walked through a lazy DFA: Trie.walk (see
 * _native.c for the contract). */
#include "_native_common.h"

/* ---- Trie: the vocabulary trie in depth-first order, walked through a DFA ---------------- */

/* One trie node, in depth-first (pre-)order: its subtree is nodes i .. end - 1, and the
 * tokens spelled by the nodes of that subtree are tokens[tok[i] .. tok[end]), those equal
 * to node i's prefix first (tokens[tok[i] .. tok[i + 1])). ``below`` indexes the set of
 * the bytes read under node i (its descendants' bytes) in Trie.sets; ``height``: the most
 * bytes read under it (0 for a leaf). */
typedef struct {
    int32_t end, tok, below;
    uint16_t depth, height;
    uint8_t byte;
} TrieNode;

/* A set of bytes, one bit each. */
typedef struct {
    uint64_t w[4];
} ByteSet;

typedef struct {
    PyObject_HEAD
    TrieNode *nodes;            /* num_nodes + 1: a sentinel holds the last tok */
    int32_t *tokens;
    Py_ssize_t num_nodes, num_tokens;
    ByteSet *sets;              /* the distinct ``below`` sets (SmolLM2: 10,893 of 100,298 nodes) */
    int32_t max_token;
    int max_depth;
} Trie;

static void
Trie_dealloc(Trie *self)
{
    PyMem_Free(self->nodes);
    PyMem_Free(self->tokens);
    PyMem_Free(self->sets);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

enum { T_CHILD_START, T_BYTE, T_UNDER_LO, T_ENDING_HERE, T_BY_BYTES, T_NUM };

static inline uint64_t
byteset_hash(const ByteSet *s)
{
    uint64_t h = s->w[0] * 0x9E3779B97F4A7C15ULL;
    for (int k = 1; k < 4; k++)
        h = (h ^ (h >> 29) ^ s->w[k]) * 0x9E3779B97F4A7C15ULL;
    return h ^ (h >> 32);
}

/* Every node's ``below`` set (the bytes of its descendants) and height, children before
 * parents, the distinct sets kept once in ``sets`` (found through an open-addressing table). */
static int
Trie_below(Trie *self)
{
    Py_ssize_t n = self->num_nodes, num_sets = 0, slots = 64;
    while (slots < 2 * n)
        slots *= 2;
    TrieNode *nodes = self->nodes;
    ByteSet *below = PyMem_Calloc((size_t)n, sizeof(ByteSet));
    int32_t *table = PyMem_Malloc(sizeof(int32_t) * (size_t)slots);
    self->sets = PyMem_Malloc(sizeof(ByteSet) * (size_t)n);
    int rc = -1;
    if (below == NULL || table == NULL || self->sets == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    memset(table, 0xff, sizeof(int32_t) * (size_t)slots);
    for (Py_ssize_t i = n - 1; i >= 0; i--) {
        for (Py_ssize_t j = i + 1; j < nodes[i].end; j = nodes[j].end) {   /* i's children */
            for (int k = 0; k < 4; k++)
                below[i].w[k] |= below[j].w[k];
            below[i].w[nodes[j].byte >> 6] |= 1ULL << (nodes[j].byte & 63);
            if (nodes[j].height >= nodes[i].height)
                nodes[i].height = (uint16_t)(nodes[j].height + 1);
        }
        Py_ssize_t slot = (Py_ssize_t)(byteset_hash(&below[i]) & (uint64_t)(slots - 1));
        while (table[slot] >= 0 && memcmp(&self->sets[table[slot]], &below[i], sizeof(ByteSet)))
            slot = (slot + 1) & (slots - 1);
        if (table[slot] < 0) {
            self->sets[num_sets] = below[i];
            table[slot] = (int32_t)num_sets++;
        }
        nodes[i].below = table[slot];
    }
    ByteSet *kept = PyMem_Realloc(self->sets, sizeof(ByteSet) * (size_t)(num_sets ? num_sets : 1));
    if (kept != NULL)
        self->sets = kept;
    rc = 0;
done:
    PyMem_Free(below);
    PyMem_Free(table);
    return rc;
}

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
                if (by_bytes[i] > self->max_token)
                    self->max_token = (int32_t)by_bytes[i];
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
    self->nodes[n] = (TrieNode){(int32_t)n, (int32_t)tok, 0, 0, 0, 0};
    self->num_tokens = tok;
    rc = Trie_below(self);
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
    if (self->nodes == NULL || self->tokens == NULL) {
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

/* Points the path's rows (depths 0 .. depth) at the table as read now. */
static int
repoint_path(DFAView *d, const int32_t *states, const int32_t **rows, int depth)
{
    for (int k = 0; k <= depth; k++)
        if ((rows[k] = row_in_view(d, states[k])) == NULL) {
            PyErr_Format(PyExc_RuntimeError, "state %d has no row", (int)states[k]);
            return -1;
        }
    return 0;
}

/* Builds the row of the path's last state (depth ``depth``) and points the path's rows at
 * the table as read again. */
static int
build_path_row(DFAView *d, int32_t *states, const int32_t **rows, int depth)
{
    int reread = 0;
    if (dfa_row(d, states[depth], &reread) == NULL)
        return -1;
    return repoint_path(d, states, rows, depth);
}

/* ---- chains: states whose live bytes mostly lead to one state -------------------------- */

#define DEAD_STATE (-1)
#define ENDLESS 0xffff          /* a chain that loops: longer than any token */

/* The chain of a state s = s_0: s_1 = ``target``, the state most of s's live bytes lead to
 * (a majority vote), ``cls`` the bytes that lead there; then s_2, s_3, ..., each the
 * target of the one before, for as long as that one's class holds ``cls`` (a JSON
 * string's content, looping, or counted by a maxLength). ``len``: the steps known to stay
 * in the chain (exact when ``final``; ENDLESS when it loops), ``tail`` = s_len;
 * ``accepts``: the first j in 1 .. len with s_j accepting, 0 if none. */
typedef struct {
    int32_t target, tail;
    uint16_t len, accepts;
    uint8_t final;
    ByteSet cls;
} Chain;

/* The chains of a walk's states, each found once a walk and lengthened as needed:
 * ``at[state]`` is 1 + its index in ``chains`` (0: not found yet), for states below
 * ``num_states`` (grown as the walk meets newer states). */
typedef struct {
    int32_t *at;
    Chain *chains;
    Py_ssize_t num_states, len, cap;
} Chains;

static void
chains_free(Chains *c)
{
    PyMem_Free(c->at);
    PyMem_Free(c->chains);
}

static inline int
byteset_within(const ByteSet *a, const ByteSet *b)
{
    return !((a->w[0] & ~b->w[0]) | (a->w[1] & ~b->w[1]) | (a->w[2] & ~b->w[2])
             | (a->w[3] & ~b->w[3]));
}

/* The row of ``state``, built if need be; the path's rows (depths 0 .. depth) are pointed
 * at the table again when it was read again. NULL with an error set. */
static const int32_t *
row_on_path(DFAView *d, int32_t state, int32_t *states, const int32_t **rows, int depth)
{
    int reread = 0;
    const int32_t *row = dfa_row(d, state, &reread);
    if (row != NULL && reread && repoint_path(d, states, rows, depth) < 0)
        return NULL;
    return row;
}

/* A new chain of ``state`` (its row ``row``) of no length yet, or a loop. */
static int
chain_start(Chain *ch, DFAView *d, int32_t state, const int32_t *row)
{
    int32_t target = DEAD_STATE;
    int votes = 0;
    for (int b = 0; b < 256; b++) {
        if (row[b] < 0)
            continue;
        if (votes == 0)
            target = row[b];
        votes += row[b] == target ? 1 : -1;
    }
    *ch = (Chain){.target = target, .tail = state, .final = target < 0};
    if (target < 0)
        return 0;
    for (int b = 0; b < 256; b++)
        ch->cls.w[b >> 6] |= (uint64_t)(row[b] == target) << (b & 63);
    if (target == state) {
        int accepting;
        if (dfa_accepting(d, state, &accepting) < 0)
            return -1;
        ch->len = ENDLESS;
        ch->final = 1;
        ch->accepts = (uint16_t)accepting;
    }
    return 0;
}

/* The index of ``state``'s chain in c->chains (found now if new), or -1 with an error. */
static Py_ssize_t
chain_index(Chains *c, DFAView *d, int32_t state, int32_t *states, const int32_t **rows,
            int depth)
{
    if (state >= c->num_states) {
        Py_ssize_t size = 2 * (Py_ssize_t)state + 64;
        int32_t *at = PyMem_Realloc(c->at, sizeof(int32_t) * (size_t)size);
        if (at == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        memset(at + c->num_states, 0, sizeof(int32_t) * (size_t)(size - c->num_states));
        c->at = at;
        c->num_states = size;
    }
    if (c->at[state])
        return c->at[state] - 1;
    const int32_t *row = row_on_path(d, state, states, rows, depth);
    if (row == NULL)
        return -1;
    if (c->len == c->cap) {
        Py_ssize_t cap = c->cap ? 2 * c->cap : 16;
        Chain *grown = PyMem_Realloc(c->chains, sizeof(Chain) * (size_t)cap);
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        c->chains = grown;
        c->cap = cap;
    }
    if (chain_start(&c->chains[c->len], d, state, row) < 0)
        return -1;
    c->at[state] = (int32_t)(c->len + 1);
    return c->len++;
}

/* Lengthens chain ``k`` to ``height`` steps, or until it ends: 0, or -1 with an error. */
static int
chain_lengthen(Chains *c, Py_ssize_t k, int height, DFAView *d, int32_t *states,
               const int32_t **rows, int depth)
{
    while (!c->chains[k].final && c->chains[k].len < height) {
        int32_t tail = c->chains[k].tail;
        Py_ssize_t t = chain_index(c, d, tail, states, rows, depth);
        if (t < 0)
            return -1;
        Chain *ch = &c->chains[k];
        const Chain *next = &c->chains[t];
        if (next->target < 0 || !byteset_within(&ch->cls, &next->cls)) {
            ch->final = 1;
        } else if (next->target == tail) {          /* it loops from here */
            ch->len = ENDLESS;
            ch->final = 1;
        } else {
            int accepting;
            if (dfa_accepting(d, next->target, &accepting) < 0)
                return -1;
            ch->tail = next->target;
            ch->len++;
            if (accepting && !ch->accepts)
                ch->accepts = ch->len;
        }
    }
    return 0;
}

/* 1 when every node under ``node`` (the path's node at ``depth``, in states[depth]) is
 * live and records no end: every byte read under it is in its state's chain class and
 * the chain lasts the node's height, with (when ``want_ends``) no accepting state before
 * the last (a node of the subtree there could record an end). 0 when not; -1 with an
 * error set. Only the rows of chain states the subtree reaches are built (each the
 * state of a live node with children on the subtree's deepest path: the reference
 * builds them too). */
static int
subtree_settled(Trie *self, DFAView *d, Chains *c, int32_t *states, const int32_t **rows,
                int depth, const TrieNode *node, int want_ends)
{
    Py_ssize_t k = chain_index(c, d, states[depth], states, rows, depth);
    if (k < 0)
        return -1;
    if (!byteset_within(&self->sets[node->below], &c->chains[k].cls))
        return 0;
    if (chain_lengthen(c, k, node->height, d, states, rows, depth) < 0)
        return -1;
    const Chain *ch = &c->chains[k];
    if (ch->len < node->height)
        return 0;
    return !(want_ends && ch->accepts && ch->accepts < node->height);
}

/* Trie.walk's ``ends``: none, (token, cut) pairs, or the nodes where the lexeme may end. */
enum { ENDS_NONE, ENDS_PAIRS, ENDS_NODES };

/* A subtree this small is walked, not tested for a chain: the test costs more. */
#define SETTLE_MIN_NODES 8

/* Marks the tokens[lo .. hi) (those spelled by a run of nodes). */
static inline void
mark_tokens(const int32_t *tokens, int32_t lo, int32_t hi, uint8_t *tokens_out)
{
    for (int32_t k = lo; k < hi; k++)
        tokens_out[tokens[k]] = 1;
}

/* The walk proper: nodes in depth-first order, a dead node's subtree skipped in one step;
 * rows[d] is the row of the state reached after the d bytes of the current path, built
 * when a child of that node is first read (so, as in the reference, only the rows of
 * states of live nodes with children are built). A live node whose subtree is settled by
 * the chain of its state (``subtree_settled``: a JSON string's content, looping or
 * counted by a maxLength, under a node whose tokens are all letters) has the tokens of
 * its subtree marked in one step. */
/* The path arrays and chains of a scan (Trie_scan), kept across the scans of one call. */
typedef struct {
    int32_t *states;
    const int32_t **rows;
    Chains chains;
} ScanBuffers;

static int
scan_buffers_init(Trie *self, DFAView *d, ScanBuffers *b)
{
    b->states = PyMem_Malloc(sizeof(int32_t) * ((size_t)self->max_depth + 1));
    b->rows = PyMem_Malloc(sizeof(int32_t *) * ((size_t)self->max_depth + 1));
    b->chains = (Chains){.num_states = d->trans.shape[0]};
    b->chains.at = PyMem_Calloc((size_t)b->chains.num_states + 1, sizeof(int32_t));
    if (b->states == NULL || b->rows == NULL || b->chains.at == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static void
scan_buffers_free(ScanBuffers *b)
{
    PyMem_Free(b->states);
    PyMem_Free(b->rows);
    chains_free(&b->chains);
}

/* Where a scan records the ends (the live nodes with children whose state accepts): as
 * (token, cut) pairs, every token longer than the node with its depth (``tok``, ``cut``),
 * or as the nodes (``nodes``); none when all are NULL. */
typedef struct {
    IntVec *tok, *cut, *nodes;
} EndsOut;

static int
record_end(Trie *self, const EndsOut *ends, Py_ssize_t i)
{
    const TrieNode *nodes = self->nodes;
    if (ends->nodes != NULL)
        return vec_push(ends->nodes, (int32_t)i);
    return add_ends(ends->tok, ends->cut, self->tokens, nodes[i + 1].tok, nodes[nodes[i].end].tok,
                    nodes[i].depth);
}

/* The walk proper, over the subtree of node ``root`` (0: the whole trie) read from
 * ``state``: nodes in depth-first order, a dead node's subtree skipped in one step;
 * rows[d] is the row of the state reached after the d bytes of the current path, built
 * when a child of that node is first read (so, as in the reference, only the rows of
 * states of live nodes with children are built). A live node whose subtree is settled by
 * the chain of its state (``subtree_settled``: a JSON string's content, looping or
 * counted by a maxLength, under a node whose tokens are all letters) has the tokens of
 * its subtree marked in one step. */
static int
Trie_scan(Trie *self, DFAView *d, ScanBuffers *b, Py_ssize_t root, int32_t state,
          uint8_t *tokens_out, const uint8_t *first, const EndsOut *ends)
{
    const TrieNode *nodes = self->nodes;
    const int32_t *tokens = self->tokens;
    int32_t *states = b->states;
    const int32_t **rows = b->rows;
    int want_ends = ends->tok != NULL || ends->nodes != NULL;
    Py_ssize_t n = nodes[root].end, i = root + 1;
    Py_ssize_t run_lo = i, run_hi = i;         /* live nodes run_lo .. run_hi - 1: unmarked */
    for (int k = 0; k <= nodes[root].depth; k++)   /* the path above root: never read */
        states[k] = state;
    if (i < n && build_path_row(d, states, rows, nodes[root].depth) < 0)
        return -1;
    while (i < n) {
        const TrieNode *node = &nodes[i];
        int depth = node->depth;
        const int32_t *row = rows[depth - 1];
        if (row[0] == UNCOMPUTED) {
            if (build_path_row(d, states, rows, depth - 1) < 0)
                return -1;
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
                return -1;
            rows[depth] = row_in_view(d, next);
            if (rows[depth] == NULL) {
                PyErr_Format(PyExc_RuntimeError, "state %d has no row", (int)next);
                return -1;
            }
        }
        Py_ssize_t live_end = i + 1;    /* i, or its whole subtree when settled */
        if (node->end > i + 1) {
            int accepting = 0;          /* tokens longer than this node */
            if (want_ends) {
                if (dfa_accepting(d, next, &accepting) < 0)
                    return -1;
                if (accepting && record_end(self, ends, i) < 0)
                    return -1;
            }
            if (!accepting && node->end - i >= SETTLE_MIN_NODES) {
                int settled = subtree_settled(self, d, &b->chains, states, rows, depth, node,
                                              want_ends);
                if (settled < 0)
                    return -1;
                if (settled)
                    live_end = node->end;
            }
        }
        if (i != run_hi) {
            mark_tokens(tokens, nodes[run_lo].tok, nodes[run_hi].tok, tokens_out);
            run_lo = i;
        }
        run_hi = live_end;
        i = live_end;
    }
    mark_tokens(tokens, nodes[run_lo].tok, nodes[run_hi].tok, tokens_out);
    return 0;
}

/* tokens_out as a writable bool array covering every token: 0, or -1 with an error. */
static int
tokens_view(Trie *self, PyObject *obj, Py_buffer *view)
{
    if (get_ints(obj, 1, 1, 1, view, "tokens_out") < 0)
        return -1;
    if (self->max_token >= view->shape[0]) {
        PyErr_Format(PyExc_ValueError, "token %d outside tokens_out", (int)self->max_token);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static PyObject *
Trie_walk(Trie *self, PyObject *args)
{
    PyObject *dfa, *tokens_obj, *first_obj;
    int state, want_ends;
    if (!PyArg_ParseTuple(args, "OiOOi:walk", &dfa, &state, &tokens_obj, &first_obj, &want_ends))
        return NULL;
    if (self->nodes == NULL) {
        PyErr_SetString(PyExc_TypeError, "Trie is not initialised");
        return NULL;
    }
    Py_buffer tokens, first_view;
    int have_tokens = 0, have_first = 0;
    DFAView d = {0};
    ScanBuffers b = {0};
    IntVec end_tok = {0}, end_cut = {0};
    EndsOut ends = {NULL, NULL, NULL};
    if (want_ends == ENDS_PAIRS)
        ends = (EndsOut){&end_tok, &end_cut, NULL};
    else if (want_ends == ENDS_NODES)
        ends = (EndsOut){NULL, NULL, &end_tok};
    PyObject *result = NULL;
    const uint8_t *first = NULL;
    if (tokens_view(self, tokens_obj, &tokens) < 0)
        goto done;
    have_tokens = 1;
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
    if (dfa_open(&d, dfa, DFA_IN_PLACE_LOCKED) < 0 || scan_buffers_init(self, &d, &b) < 0
            || Trie_scan(self, &d, &b, 0, state, tokens.buf, first, &ends) < 0)
        goto done;
    result = Py_BuildValue("(y#y#)", (const char *)end_tok.data,
                           (Py_ssize_t)(end_tok.len * (Py_ssize_t)sizeof(int32_t)),
                           (const char *)end_cut.data,
                           (Py_ssize_t)(end_cut.len * (Py_ssize_t)sizeof(int32_t)));
done:
    scan_buffers_free(&b);
    dfa_release(&d);
    view_drop(&tokens, &have_tokens);
    view_drop(&first_view, &have_first);
    vec_free(&end_tok);
    vec_free(&end_cut);
    return result;
}

/* The node positions of an int32 array, each checked to be a node. */
static int
nodes_view(Trie *self, PyObject *obj, Py_buffer *view)
{
    if (get_ints(obj, 4, 1, 0, view, "nodes") < 0)
        return -1;
    const int32_t *at = view->buf;
    for (Py_ssize_t k = 0; k < view->shape[0]; k++)
        if (at[k] < 0 || at[k] >= self->num_nodes) {
            PyErr_Format(PyExc_IndexError, "no trie node %d", (int)at[k]);
            PyBuffer_Release(view);
            return -1;
        }
    return 0;
}

static PyObject *
Trie_walk_below(Trie *self, PyObject *args)
{
    PyObject *dfa, *nodes_obj, *tokens_obj;
    int state;
    if (!PyArg_ParseTuple(args, "OiOO:walk_below", &dfa, &state, &nodes_obj, &tokens_obj))
        return NULL;
    Py_buffer nodes, tokens;
    int have_nodes = 0, have_tokens = 0;
    DFAView d = {0};
    ScanBuffers b = {0};
    EndsOut no_ends = {NULL, NULL, NULL};
    PyObject *result = NULL;
    if (nodes_view(self, nodes_obj, &nodes) < 0)
        goto done;
    have_nodes = 1;
    if (tokens_view(self, tokens_obj, &tokens) < 0)
        goto done;
    have_tokens = 1;
    if (dfa_open(&d, dfa, DFA_IN_PLACE_LOCKED) < 0 || scan_buffers_init(self, &d, &b) < 0)
        goto done;
    const int32_t *at = nodes.buf;
    for (Py_ssize_t k = 0; k < nodes.shape[0]; k++) {
        /* the node's own tokens end where the state is taken: only those below it count */
        if (Trie_scan(self, &d, &b, at[k], state, tokens.buf, NULL, &no_ends) < 0)
            goto done;
    }
    result = Py_NewRef(Py_None);
done:
    scan_buffers_free(&b);
    dfa_release(&d);
    view_drop(&nodes, &have_nodes);
    view_drop(&tokens, &have_tokens);
    return result;
}

static PyObject *
Trie_next_bytes(Trie *self, PyObject *args)
{
    PyObject *nodes_obj;
    if (!PyArg_ParseTuple(args, "O:next_bytes", &nodes_obj))
        return NULL;
    Py_buffer nodes;
    if (nodes_view(self, nodes_obj, &nodes) < 0)
        return NULL;
    uint8_t seen[256] = {0};
    const int32_t *at = nodes.buf;
    for (Py_ssize_t k = 0; k < nodes.shape[0]; k++)
        for (Py_ssize_t j = at[k] + 1; j < self->nodes[at[k]].end; j = self->nodes[j].end)
            seen[self->nodes[j].byte] = 1;
    PyBuffer_Release(&nodes);
    return PyBytes_FromStringAndSize((const char *)seen, 256);
}

static PyObject *
Trie_end_pairs(Trie *self, PyObject *args)
{
    PyObject *nodes_obj;
    if (!PyArg_ParseTuple(args, "O:end_pairs", &nodes_obj))
        return NULL;
    Py_buffer nodes;
    if (nodes_view(self, nodes_obj, &nodes) < 0)
        return NULL;
    IntVec tok = {0}, cut = {0};
    PyObject *result = NULL;
    const int32_t *at = nodes.buf;
    EndsOut pairs = {&tok, &cut, NULL};
    for (Py_ssize_t k = 0; k < nodes.shape[0]; k++)
        if (self->nodes[at[k]].end > at[k] + 1 && record_end(self, &pairs, at[k]) < 0)
            goto done;
    result = Py_BuildValue("(y#y#)", (const char *)tok.data,
                           (Py_ssize_t)(tok.len * (Py_ssize_t)sizeof(int32_t)),
                           (const char *)cut.data,
                           (Py_ssize_t)(cut.len * (Py_ssize_t)sizeof(int32_t)));
done:
    PyBuffer_Release(&nodes);
    vec_free(&tok);
    vec_free(&cut);
    return result;
}

static PyMethodDef Trie_methods[] = {
    {"walk", (PyCFunction)Trie_walk, METH_VARARGS,
     "walk(dfa, state, tokens_out, first_bytes, ends) -> (end tokens, end cuts) or (end "
     "nodes, b'') as int32 bytes (see the module doc)"},
    {"walk_below", (PyCFunction)Trie_walk_below, METH_VARARGS,
     "walk_below(dfa, state, nodes, tokens_out): marks the tokens under the nodes whose "
     "bytes past the node stay live from state"},
    {"next_bytes", (PyCFunction)Trie_next_bytes, METH_VARARGS,
     "next_bytes(nodes) -> 256 bytes, 1 for each byte of a child of a node"},
    {"end_pairs", (PyCFunction)Trie_end_pairs, METH_VARARGS,
     "end_pairs(nodes) -> (tokens, cuts) as int32 bytes: every token longer than a node, "
     "with the node's depth"},
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
    DFAView d = {0};
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
    if (dfa_open(&d, dfa_obj, DFA_IN_PLACE_LOCKED) < 0)
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
