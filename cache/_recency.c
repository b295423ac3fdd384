/* RecencyList: the host tier's LRU order of block ids as a doubly linked list in two int32
 * arrays (kvsim.cache.recency.CompiledRecency wraps it; RecencyOrder beside it is the Python
 * that runs when this module is not built, or with KVSIM_PURE_PYTHON=1).
 *
 * vLLM's CPU offloading manager adds a store's blocks as the most recent, evicts the least
 * recent blocks not in use, and makes a finished request's blocks the most recent: on a long
 * trace millions of blocks go through each step. Here each is a few array writes, and the
 * search for victims walks from the head, reading vLLM's ref_cnt (an int32 array) and, when a
 * store offers blocks already held, a mark of those (a bool array), through their buffers.
 * Block ids come in as int64 buffers and go out as bytes of int64 (numpy reads both without
 * copying).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

typedef struct {
    PyObject_HEAD
    Py_ssize_t num_blocks;
    int32_t *prev, *next;   /* num_blocks + 1 links: the last is the ring's sentinel */
    uint8_t *queued;
    Py_ssize_t len;
} RecencyList;

#define SENTINEL(r) ((int32_t)(r)->num_blocks)

static inline void unlink_block(RecencyList *r, int32_t b) {
    r->next[r->prev[b]] = r->next[b];
    r->prev[r->next[b]] = r->prev[b];
}

static inline void link_last(RecencyList *r, int32_t b) {
    int32_t s = SENTINEL(r), last = r->prev[s];
    r->next[last] = b;
    r->prev[b] = last;
    r->next[b] = s;
    r->prev[s] = b;
}

/* A buffer of ``itemsize``-byte items (C-contiguous), ``what`` naming it in errors. */
static int get_items(PyObject *obj, Py_buffer *view, Py_ssize_t itemsize, const char *what) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS) < 0) return -1;
    if (view->itemsize != itemsize) {
        PyErr_Format(PyExc_TypeError, "RecencyList: %s must hold %zd-byte items", what,
                     itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* The int64 block ids of ``obj``, each checked to be a block and ``queued`` (1) or not (0)
 * as ``want`` (before any change: only a block given twice is found once some changed). */
static int get_ids(RecencyList *r, PyObject *obj, Py_buffer *view, int want, const char *err) {
    if (get_items(obj, view, 8, "block ids") < 0) return -1;
    const int64_t *ids = view->buf;
    Py_ssize_t n = view->len / 8;
    for (Py_ssize_t j = 0; j < n; j++) {
        if (ids[j] < 0 || ids[j] >= r->num_blocks) {
            PyErr_SetString(PyExc_IndexError, "RecencyList: block id out of range");
            PyBuffer_Release(view);
            return -1;
        }
        if (r->queued[ids[j]] != want) {
            PyErr_SetString(PyExc_ValueError, err);
            PyBuffer_Release(view);
            return -1;
        }
    }
    return 0;
}

static PyObject *RecencyList_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "n:RecencyList", &n)) return NULL;
    if (n < 0 || n >= INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "RecencyList: num_blocks out of range");
        return NULL;
    }
    RecencyList *r = (RecencyList *)type->tp_alloc(type, 0);
    if (r == NULL) return NULL;
    r->num_blocks = n;
    r->prev = PyMem_Malloc((size_t)(n + 1) * sizeof(int32_t));
    r->next = PyMem_Malloc((size_t)(n + 1) * sizeof(int32_t));
    r->queued = PyMem_Calloc((size_t)n + 1, 1);
    if (r->prev == NULL || r->next == NULL || r->queued == NULL) {
        Py_DECREF(r);
        return PyErr_NoMemory();
    }
    r->prev[n] = r->next[n] = (int32_t)n;
    r->len = 0;
    return (PyObject *)r;
}

static void RecencyList_dealloc(RecencyList *r) {
    PyMem_Free(r->prev);
    PyMem_Free(r->next);
    PyMem_Free(r->queued);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

static Py_ssize_t RecencyList_len(RecencyList *r) { return r->len; }

static int RecencyList_contains(RecencyList *r, PyObject *obj) {
    Py_ssize_t b = PyNumber_AsSsize_t(obj, PyExc_IndexError);
    if (b == -1 && PyErr_Occurred()) return -1;
    return b >= 0 && b < r->num_blocks && r->queued[b];
}

/* The blocks of ``arg`` join the tail in this order (``queue`` 1: extend, none queued) or
 * leave the list (0: remove, each queued). */
static PyObject *queue_or_drop(RecencyList *r, PyObject *arg, int queue) {
    Py_buffer view;
    const char *refused = queue ? "a block to add is queued already"
                                : "a block to remove is not queued";
    if (get_ids(r, arg, &view, !queue, refused) < 0) return NULL;
    const int64_t *ids = view.buf;
    Py_ssize_t n = view.len / 8, j;
    for (j = 0; j < n && r->queued[ids[j]] != queue; j++) {
        r->queued[ids[j]] = (uint8_t)queue;
        if (queue) link_last(r, (int32_t)ids[j]);
        else unlink_block(r, (int32_t)ids[j]);
    }
    r->len += queue ? j : -j;
    PyBuffer_Release(&view);
    if (j < n) {
        PyErr_SetString(PyExc_ValueError, "a block comes twice");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* extend(ids): blocks not queued become the most recent, the last of them most of all. */
static PyObject *RecencyList_extend(RecencyList *r, PyObject *arg) {
    return queue_or_drop(r, arg, 1);
}

/* remove(ids): drop queued blocks (distinct). */
static PyObject *RecencyList_remove(RecencyList *r, PyObject *arg) {
    return queue_or_drop(r, arg, 0);
}

/* move_many_to_end(ids): queued blocks become the most recent, in this order. */
static PyObject *RecencyList_move_many_to_end(RecencyList *r, PyObject *arg) {
    Py_buffer view;
    if (get_ids(r, arg, &view, 1, "a block to move is not queued") < 0) return NULL;
    const int64_t *ids = view.buf;
    for (Py_ssize_t j = 0; j < view.len / 8; j++) {
        unlink_block(r, (int32_t)ids[j]);
        link_last(r, (int32_t)ids[j]);
    }
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

/* The ids from the head, up to ``n`` of them passing the test (ref_cnt 0, not marked
 * ``offered``), as bytes of int64; None when fewer pass, unless ``partial``. */
static PyObject *collect(RecencyList *r, Py_ssize_t n, const int32_t *ref,
                         const uint8_t *offered, int partial) {
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * 8);
    if (out == NULL) return NULL;
    int64_t *found = (int64_t *)PyBytes_AS_STRING(out);
    Py_ssize_t k = 0;
    int32_t s = SENTINEL(r);
    for (int32_t b = r->next[s]; b != s && k < n; b = r->next[b]) {
        if ((ref == NULL || ref[b] == 0) && (offered == NULL || !offered[b])) found[k++] = b;
    }
    if (k < n && !partial) { Py_DECREF(out); Py_RETURN_NONE; }
    if (k < n && _PyBytes_Resize(&out, k * 8) < 0) return NULL;
    return out;
}

/* first(n, ref, offered=None, partial=False): the ``n`` least recent queued blocks whose
 * ``ref[b]`` (int32) is 0 and, with ``offered`` (bool), ``offered[b]`` false. */
static PyObject *RecencyList_first(RecencyList *r, PyObject *args, PyObject *kwds) {
    static char *names[] = {"n", "ref", "offered", "partial", NULL};
    Py_ssize_t n;
    PyObject *ref_obj, *offered_obj = Py_None;
    int partial = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "nO|Op:first", names, &n, &ref_obj,
                                     &offered_obj, &partial)) return NULL;
    if (n <= 0) return PyBytes_FromStringAndSize(NULL, 0);
    Py_buffer ref, offered;
    if (get_items(ref_obj, &ref, 4, "ref") < 0) return NULL;
    int marked = offered_obj != Py_None;
    if (marked && get_items(offered_obj, &offered, 1, "offered") < 0) {
        PyBuffer_Release(&ref);
        return NULL;
    }
    PyObject *out = NULL;
    if (ref.len / 4 < r->num_blocks || (marked && offered.len < r->num_blocks))
        PyErr_SetString(PyExc_ValueError, "RecencyList: ref and offered cover every block");
    else
        out = collect(r, n, ref.buf, marked ? offered.buf : NULL, partial);
    PyBuffer_Release(&ref);
    if (marked) PyBuffer_Release(&offered);
    return out;
}

/* ids(): every queued block, least recent first, as bytes of int64. */
static PyObject *RecencyList_ids(RecencyList *r, PyObject *unused) {
    return collect(r, r->len, NULL, NULL, 1);
}

static PyMethodDef RecencyList_methods[] = {
    {"extend", (PyCFunction)RecencyList_extend, METH_O,
     "blocks not queued become the most recent, in this order"},
    {"remove", (PyCFunction)RecencyList_remove, METH_O, "drop queued blocks"},
    {"move_many_to_end", (PyCFunction)RecencyList_move_many_to_end, METH_O,
     "queued blocks become the most recent, in this order"},
    {"first", (PyCFunction)(void (*)(void))RecencyList_first, METH_VARARGS | METH_KEYWORDS,
     "the n least recent blocks with ref 0 and not offered, as bytes of int64"},
    {"ids", (PyCFunction)RecencyList_ids, METH_NOARGS, "the queued blocks, least recent first"},
    {NULL, NULL, 0, NULL}
};

static PySequenceMethods RecencyList_sequence = {
    .sq_length = (lenfunc)RecencyList_len,
    .sq_contains = (objobjproc)RecencyList_contains,
};

static PyTypeObject RecencyListType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kvsim.cache._recency.RecencyList",
    .tp_doc = "Block ids, least recently used first, as a doubly linked list in arrays.",
    .tp_basicsize = sizeof(RecencyList),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = RecencyList_new,
    .tp_dealloc = (destructor)RecencyList_dealloc,
    .tp_as_sequence = &RecencyList_sequence,
    .tp_methods = RecencyList_methods,
};

static struct PyModuleDef recency_module = {
    PyModuleDef_HEAD_INIT, "_recency", "RecencyList: an LRU order of block ids (see the source).",
    -1, NULL,
};

PyMODINIT_FUNC PyInit__recency(void) {
    if (PyType_Ready(&RecencyListType) < 0) return NULL;
    PyObject *mod = PyModule_Create(&recency_module);
    if (mod == NULL) return NULL;
    if (PyModule_AddObjectRef(mod, "RecencyList", (PyObject *)&RecencyListType) < 0) {
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
