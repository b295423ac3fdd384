/* C loops of kvsim.cache: element-wise updates of a Python list (or bytearray) by a batch of
 * indices and a batch's pairs without a marker (bulk.py), the policy pools' release of a
 * request's blocks (policy_pool.py), the
 * scored pool's eviction walk (chain_walk.py) and S3-FIFO's queue scans (s3fifo.py). Each
 * does exactly what the Python beside it does (which runs when this module is not built, or
 * with KVSIM_PURE_PYTHON=1). A target of another type is left to it (NotImplemented, before
 * reading the indices), and so is a release that meets a block id or count that is not an
 * int; the walk, whose context the pool builds, raises TypeError instead.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* ``index`` (an int, or anything with ``__index__``) as a position in a list (or bytearray,
 * ``what``) of ``n`` items (negative from the end), or -1 with the error its assignment
 * raises. */
static inline Py_ssize_t position(PyObject *index, Py_ssize_t n, const char *what) {
    if (!PyIndex_Check(index)) {
        PyErr_Format(PyExc_TypeError, "list indices must be integers or slices, not %.200s",
                     Py_TYPE(index)->tp_name);
        return -1;
    }
    Py_ssize_t i = PyNumber_AsSsize_t(index, PyExc_IndexError);
    if (i == -1 && PyErr_Occurred()) return -1;
    if (i < 0) i += n;
    if (i < 0 || i >= n) {
        PyErr_Format(PyExc_IndexError, "%s index out of range", what);
        return -1;
    }
    return i;
}

/* Whether ``nargs`` is 3 (else a TypeError naming ``usage``). */
static int three(Py_ssize_t nargs, const char *usage) {
    if (nargs == 3) return 1;
    PyErr_Format(PyExc_TypeError, "%s takes 3 arguments", usage);
    return 0;
}

/* A list's item ``i`` becomes ``value`` (a new reference taken). */
static inline void assign(PyObject *list, Py_ssize_t i, PyObject *value) {
    PyObject *old = PyList_GET_ITEM(list, i);
    PyList_SET_ITEM(list, i, Py_NewRef(value));
    Py_DECREF(old);
}

/* set_all on a bytearray: each byte at ``indices`` becomes ``byte`` (0-255). */
static PyObject *set_all_bytes(PyObject *values, PyObject *indices_given, char byte) {
    PyObject *indices = PySequence_Fast(indices_given, "set_all: indices must be iterable");
    if (indices == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(indices);
    PyObject **items = PySequence_Fast_ITEMS(indices);
    for (Py_ssize_t j = 0; j < n; j++) {
        Py_ssize_t i = position(items[j], PyByteArray_GET_SIZE(values), "bytearray");
        if (i < 0) { Py_DECREF(indices); return NULL; }
        PyByteArray_AS_STRING(values)[i] = byte;
    }
    Py_DECREF(indices);
    Py_RETURN_NONE;
}

/* set_all(values, indices, value): values[i] = value for each i (values a list, or a
 * bytearray and value an int of 0-255: else NotImplemented, for the loop's own error). */
static PyObject *set_all(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (!three(nargs, "set_all(values, indices, value)")) return NULL;
    PyObject *values = args[0];
    if (PyByteArray_CheckExact(values)) {
        Py_ssize_t byte = PyIndex_Check(args[2]) ? PyNumber_AsSsize_t(args[2], NULL) : -1;
        if (byte == -1 && PyErr_Occurred()) return NULL;
        if (byte < 0 || byte > 255) Py_RETURN_NOTIMPLEMENTED;
        return set_all_bytes(values, args[1], (char)byte);
    }
    if (!PyList_CheckExact(values)) Py_RETURN_NOTIMPLEMENTED;
    PyObject *indices = PySequence_Fast(args[1], "set_all: indices must be iterable");
    if (indices == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(indices);
    PyObject **items = PySequence_Fast_ITEMS(indices);
    for (Py_ssize_t j = 0; j < n; j++) {
        Py_ssize_t i = position(items[j], PyList_GET_SIZE(values), "list assignment");
        if (i < 0) { Py_DECREF(indices); return NULL; }     /* (as the loop: those before
                                                                   it assigned) */
        assign(values, i, args[2]);
    }
    Py_DECREF(indices);
    Py_RETURN_NONE;
}

/* set_each(values, indices, items): values[i] = item pairwise (stops at the shorter). */
static PyObject *set_each(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (!three(nargs, "set_each(values, indices, items)")) return NULL;
    PyObject *values = args[0];
    if (!PyList_CheckExact(values)) Py_RETURN_NOTIMPLEMENTED;
    PyObject *indices = PySequence_Fast(args[1], "set_each: indices must be iterable");
    if (indices == NULL) return NULL;
    PyObject *news = PySequence_Fast(args[2], "set_each: items must be iterable");
    if (news == NULL) { Py_DECREF(indices); return NULL; }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(indices);
    if (PySequence_Fast_GET_SIZE(news) < n) n = PySequence_Fast_GET_SIZE(news);
    PyObject **is = PySequence_Fast_ITEMS(indices), **vs = PySequence_Fast_ITEMS(news);
    for (Py_ssize_t j = 0; j < n; j++) {
        Py_ssize_t i = position(is[j], PyList_GET_SIZE(values), "list assignment");
        if (i < 0) { Py_DECREF(indices); Py_DECREF(news); return NULL; }
        assign(values, i, vs[j]);
    }
    Py_DECREF(indices); Py_DECREF(news);
    Py_RETURN_NONE;
}

/* drop_refs(refs, hashes, block_ids): one reference fewer on each block, in order; the blocks
 * now at 0 as (those with a hash, those without), each in order (refs and hashes lists,
 * ``refs`` holding ints). NotImplemented, with nothing changed, when a block id or its count
 * is not an int (or out of range): give the ids as a list, so that the caller can run its
 * loop on them. */
static PyObject *drop_refs(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (!three(nargs, "drop_refs(refs, hashes, block_ids)")) return NULL;
    PyObject *refs = args[0], *hashes = args[1];
    if (!PyList_CheckExact(refs) || !PyList_CheckExact(hashes)) Py_RETURN_NOTIMPLEMENTED;
    PyObject *ids = PySequence_Fast(args[2], "drop_refs: block ids must be iterable");
    if (ids == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(ids);
    PyObject **items = PySequence_Fast_ITEMS(ids);
    /* checked first, so that nothing changes on a bad id or count */
    for (Py_ssize_t j = 0; j < n; j++) {
        PyObject *b = items[j];
        Py_ssize_t i = PyLong_CheckExact(b) ? PyLong_AsSsize_t(b) : -1;
        if (i < 0 || i >= PyList_GET_SIZE(refs) || i >= PyList_GET_SIZE(hashes)
                || !PyLong_CheckExact(PyList_GET_ITEM(refs, i))) {
            PyErr_Clear();
            Py_DECREF(ids);
            Py_RETURN_NOTIMPLEMENTED;
        }
    }
    PyObject *cached = PyList_New(0), *uncached = PyList_New(0);
    if (cached == NULL || uncached == NULL) goto fail;
    for (Py_ssize_t j = 0; j < n; j++) {
        Py_ssize_t i = PyLong_AsSsize_t(items[j]);
        long left = PyLong_AsLong(PyList_GET_ITEM(refs, i)) - 1;
        if (left == -2 && PyErr_Occurred()) goto fail;
        PyObject *count = PyLong_FromLong(left);
        if (count == NULL) goto fail;
        PyObject *old = PyList_GET_ITEM(refs, i);
        PyList_SET_ITEM(refs, i, count);
        Py_DECREF(old);
        if (left == 0 && PyList_Append(PyList_GET_ITEM(hashes, i) != Py_None ? cached : uncached,
                                       items[j]) < 0)
            goto fail;
    }
    Py_DECREF(ids);
    PyObject *out = PyTuple_Pack(2, cached, uncached);
    Py_DECREF(cached); Py_DECREF(uncached);
    return out;
fail:
    Py_DECREF(ids); Py_XDECREF(cached); Py_XDECREF(uncached);
    return NULL;
}

/* A list's item ``i`` (borrowed), or NULL with an IndexError when ``i`` is past its end
 * (the walk below reads lists a callback might shorten). */
static inline PyObject *item(PyObject *list, Py_ssize_t i) {
    if (i < PyList_GET_SIZE(list)) return PyList_GET_ITEM(list, i);
    PyErr_SetString(PyExc_IndexError, "list index out of range");
    return NULL;
}

/* ``index`` as a block id of the lists (an int in range), or -1 with an error. */
static inline Py_ssize_t block_of(PyObject *index, PyObject *list) {
    Py_ssize_t i = PyLong_CheckExact(index) ? PyLong_AsSsize_t(index) : -1;
    if (i >= 0 && i < PyList_GET_SIZE(list)) return i;
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_IndexError, "block id out of range");
    return -1;
}

enum { HASHES, INDEX, EVICTED, SHARED, REFS, HITS, PRIO, PRIORITY, PARENTS, HOLDERS, COUNTS,
       LIVE, ENTRIES, HEAP, UNREACHABLE, DROP_COPY, CHILD_GONE, PUSH, NUM_CONTEXT };

/* The ints 0 and 1, made at import (what the walk writes into reference and hit counts). */
static PyObject *ZERO, *ONE;

/* Uncache and take block ``b`` (its id object ``block``): the first half of one turn of
 * walk_chain; 0, or -1 with an error. */
static int take_block(PyObject **c, Py_ssize_t b, PyObject *block, PyObject *victims) {
    PyObject *hash = item(c[HASHES], b);
    if (hash == NULL) return -1;
    if (hash != c[UNREACHABLE]) {
        Py_INCREF(hash);
        int failed = 0;
        if (c[EVICTED] != Py_None) {
            PyObject *pair = PyTuple_Pack(2, block, hash);
            failed = pair == NULL || PyList_Append(c[EVICTED], pair) < 0;
            Py_XDECREF(pair);
        }
        PyObject *mark = failed ? NULL : item(c[SHARED], b);
        int shared = mark == NULL ? -1 : PyObject_IsTrue(mark);
        if (shared > 0) {
            PyObject *r = PyObject_CallFunctionObjArgs(c[DROP_COPY], block, hash, NULL);
            failed = r == NULL;
            Py_XDECREF(r);
        } else {
            failed = shared < 0 || PyObject_DelItem(c[INDEX], hash) < 0;
        }
        Py_DECREF(hash);
        if (failed) return -1;
    }
    if (item(c[HASHES], b) == NULL || item(c[REFS], b) == NULL || item(c[HITS], b) == NULL)
        return -1;
    assign(c[HASHES], b, Py_None);
    if (PyList_Append(victims, block) < 0) return -1;
    assign(c[REFS], b, ONE);
    assign(c[HITS], b, ZERO);
    if (c[PRIO] != Py_None) {
        if (item(c[PRIO], b) == NULL) return -1;
        assign(c[PRIO], b, c[PRIORITY]);
    }
    return 0;
}

/* The cached holder of ``parent`` (the hash of block ``b``'s parent): the holder remembered
 * for ``b`` while it still holds that hash alone, else the index's answer (a new reference;
 * Py_None when that is no int: copies, or no block). NULL on an error. */
static PyObject *holder_of(PyObject **c, Py_ssize_t b, PyObject *parent) {
    PyObject *found = item(c[HOLDERS], b);
    if (found == NULL) return NULL;
    if (found != Py_None) {
        Py_ssize_t f = block_of(found, c[HASHES]);
        if (f < 0) return NULL;
        PyObject *mark = item(c[SHARED], f);
        int shared = mark == NULL ? -1 : PyObject_IsTrue(mark);
        if (shared < 0) return NULL;
        if (PyList_GET_ITEM(c[HASHES], f) == parent && !shared) return Py_NewRef(found);
    }
    found = PyObject_CallMethod(c[INDEX], "get", "O", parent);
    if (found != NULL && !PyLong_CheckExact(found)) Py_SETREF(found, Py_NewRef(Py_None));
    return found;
}

/* walk_chain(context, block_id, left, top, victims): the scored pool's eviction walk, as
 * kvsim.cache.chain_walk.walk_chain does it (see there): returns the victims still wanted. */
static PyObject *walk_chain(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError,
                        "walk_chain(context, block_id, left, top, victims) takes 5 arguments");
        return NULL;
    }
    PyObject *context = args[0], *top = args[3], *victims = args[4];
    if (!PyTuple_CheckExact(context) || PyTuple_GET_SIZE(context) != NUM_CONTEXT
            || !PyList_CheckExact(victims)) {
        PyErr_SetString(PyExc_TypeError, "walk_chain: a context tuple and a victims list");
        return NULL;
    }
    PyObject *c[NUM_CONTEXT];
    for (int k = 0; k < NUM_CONTEXT; k++) c[k] = PyTuple_GET_ITEM(context, k);
    int lists[] = {HASHES, SHARED, REFS, HITS, PARENTS, HOLDERS, COUNTS, LIVE, ENTRIES};
    for (size_t k = 0; k < sizeof lists / sizeof *lists; k++)
        if (!PyList_CheckExact(c[lists[k]])) {
            PyErr_SetString(PyExc_TypeError, "walk_chain: the pool's block lists are lists");
            return NULL;
        }
    if (c[PRIO] != Py_None && !PyList_CheckExact(c[PRIO])) {
        PyErr_SetString(PyExc_TypeError, "walk_chain: prio is a list or None");
        return NULL;
    }
    long left = PyLong_AsLong(args[2]);
    if (left == -1 && PyErr_Occurred()) return NULL;
    PyObject *block = Py_NewRef(args[1]), *parent = NULL, *found = NULL, *out = NULL;
    for (;;) {
        Py_ssize_t b = block_of(block, c[HASHES]);
        if (b < 0 || take_block(c, b, block, victims) < 0) goto done;
        left -= 1;
        PyObject *chained = item(c[PARENTS], b);
        if (chained == NULL) goto done;
        if (chained == Py_None) break;
        parent = Py_NewRef(chained);
        found = holder_of(c, b, parent);
        if (found == NULL) goto done;
        if (found == Py_None) {
            PyObject *r = PyObject_CallOneArg(c[CHILD_GONE], parent);
            if (r == NULL) goto done;
            Py_DECREF(r);
            break;
        }
        Py_ssize_t f = block_of(found, c[COUNTS]);
        PyObject *count = f < 0 ? NULL : PyNumber_Subtract(PyList_GET_ITEM(c[COUNTS], f), ONE);
        if (count == NULL) goto done;
        assign(c[COUNTS], f, count);
        int busy = PyObject_IsTrue(count);
        Py_DECREF(count);
        PyObject *ref = busy ? NULL : item(c[REFS], f);
        if (!busy && ref != NULL) busy = PyObject_IsTrue(ref);
        else if (!busy) busy = -1;
        PyObject *live = busy ? NULL : item(c[LIVE], f);
        if (!busy) busy = live == NULL ? -1 : live != Py_None;
        if (busy < 0) goto done;
        if (busy) break;
        PyObject *entry = item(c[ENTRIES], f);
        if (entry == NULL) goto done;
        int first = 0;
        if (left) {
            first = top == Py_None ? 1 : PyObject_RichCompareBool(entry, top, Py_LT);
            if (first < 0) goto done;
        }
        if (first) {                    /* the parent is the next victim: walk on to it */
            Py_SETREF(block, found);
            found = NULL;
            Py_CLEAR(parent);
            continue;
        }
        Py_INCREF(entry);
        assign(c[LIVE], f, entry);
        PyObject *r = PyObject_CallFunctionObjArgs(c[PUSH], c[HEAP], entry, NULL);
        Py_DECREF(entry);
        if (r == NULL) goto done;
        Py_DECREF(r);
        break;
    }
    out = PyLong_FromLong(left);
done:
    Py_XDECREF(block); Py_XDECREF(parent); Py_XDECREF(found);
    return out;
}

/* --- S3-FIFO's scans of a queue (kvsim.cache.s3fifo) ---------------------------------------
 * A queue is a list of block ids; a block is free when its reference count (``refs``, a list
 * of ints) is 0 and evictable when its frequency (``freq``, a bytearray) is 0 too. Each scan
 * returns NotImplemented, having read nothing, when the arguments are not of these types (the
 * Python scan beside it then runs), and an IndexError on a block id out of range. */

/* Whether queue entry ``j`` is free (and, with ``freq``, never hit): 1, 0, or -1 on an error. */
static inline int passes(PyObject *refs, PyObject *freq, PyObject *ids, Py_ssize_t j) {
    PyObject *block = PyList_GET_ITEM(ids, j);
    Py_ssize_t b = PyLong_CheckExact(block) ? PyLong_AsSsize_t(block) : -1;
    if (b < 0 || b >= PyList_GET_SIZE(refs)
            || (freq != NULL && b >= PyByteArray_GET_SIZE(freq))) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_IndexError, "block id out of range");
        return -1;
    }
    int held = PyObject_IsTrue(PyList_GET_ITEM(refs, b));
    if (held != 0) return held < 0 ? -1 : 0;
    return freq == NULL || PyByteArray_AS_STRING(freq)[b] == 0;
}

/* Parse (refs, freq, ids, start[, most]) with ``freq`` optional (None): 1, 0 (not these
 * types: NotImplemented) or -1 (an error). */
static int queue_args(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t want, const char *usage,
                      PyObject **freq, Py_ssize_t *start, Py_ssize_t *most) {
    if (nargs != want) {
        PyErr_Format(PyExc_TypeError, "%s takes %zd arguments", usage, want);
        return -1;
    }
    *freq = args[1] == Py_None ? NULL : args[1];
    if (!PyList_CheckExact(args[0]) || !PyList_CheckExact(args[2])
            || (*freq != NULL && !PyByteArray_CheckExact(*freq)))
        return 0;
    *start = PyNumber_AsSsize_t(args[3], PyExc_OverflowError);
    if (*start == -1 && PyErr_Occurred()) return -1;
    if (*start < 0) *start = 0;
    *most = PY_SSIZE_T_MAX;
    if (want == 5) {
        *most = PyNumber_AsSsize_t(args[4], PyExc_OverflowError);
        if (*most == -1 && PyErr_Occurred()) return -1;
    }
    return 1;
}

/* first_passing(refs, freq, ids, start): the index of the first entry from ``start`` that is
 * free (and never hit, unless ``freq`` is None); len(ids) if none is. */
static PyObject *first_passing(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    PyObject *freq;
    Py_ssize_t start, most;
    int ok = queue_args(args, nargs, 4, "first_passing(refs, freq, ids, start)", &freq, &start,
                        &most);
    if (ok <= 0) return ok < 0 ? NULL : Py_NewRef(Py_NotImplemented);
    PyObject *refs = args[0], *ids = args[2];
    Py_ssize_t j = start;
    for (; j < PyList_GET_SIZE(ids); j++) {
        int found = passes(refs, freq, ids, j);
        if (found < 0) return NULL;
        if (found) break;
    }
    return PyLong_FromSsize_t(j < PyList_GET_SIZE(ids) ? j : PyList_GET_SIZE(ids));
}

/* num_passing(refs, freq, ids, start, most): how many entries from ``start`` on, ``most`` at
 * most, pass in a row (free and never hit). */
static PyObject *num_passing(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    PyObject *freq;
    Py_ssize_t start, most;
    int ok = queue_args(args, nargs, 5, "num_passing(refs, freq, ids, start, most)", &freq,
                        &start, &most);
    if (ok <= 0) return ok < 0 ? NULL : Py_NewRef(Py_NotImplemented);
    PyObject *refs = args[0], *ids = args[2];
    Py_ssize_t n = 0;
    for (Py_ssize_t j = start; n < most && j < PyList_GET_SIZE(ids); j++, n++) {
        int found = passes(refs, freq, ids, j);
        if (found < 0) return NULL;
        if (!found) break;
    }
    return PyLong_FromSsize_t(n);
}

/* marked(marks, ids): the ids whose byte in ``marks`` (a bytearray) is not 0, in order, as a
 * list; NotImplemented when ``marks`` is not a bytearray. */
static PyObject *marked(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "marked(marks, ids) takes 2 arguments");
        return NULL;
    }
    PyObject *marks = args[0];
    if (!PyByteArray_CheckExact(marks)) Py_RETURN_NOTIMPLEMENTED;
    PyObject *ids = PySequence_Fast(args[1], "marked: ids must be iterable");
    if (ids == NULL) return NULL;
    PyObject *out = PyList_New(0);
    Py_ssize_t n = PySequence_Fast_GET_SIZE(ids);
    PyObject **items = PySequence_Fast_ITEMS(ids);
    for (Py_ssize_t j = 0; j < n && out != NULL; j++) {
        Py_ssize_t i = position(items[j], PyByteArray_GET_SIZE(marks), "bytearray");
        if (i < 0 || (PyByteArray_AS_STRING(marks)[i] && PyList_Append(out, items[j]) < 0))
            Py_CLEAR(out);
    }
    Py_DECREF(ids);
    return out;
}

/* without_marked(marker, ids, values): the pairs of ``ids`` and ``values`` whose value is not
 * ``marker`` (by identity), as (ids, values), two lists; None when no value is ``marker``. */
static PyObject *without_marked(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (!three(nargs, "without_marked(marker, ids, values)")) return NULL;
    PyObject *marker = args[0], *kept = NULL, *kept_values = NULL, *out = NULL;
    PyObject *ids = PySequence_Fast(args[1], "without_marked: ids must be iterable");
    if (ids == NULL) return NULL;
    PyObject *values = PySequence_Fast(args[2], "without_marked: values must be iterable");
    if (values == NULL) { Py_DECREF(ids); return NULL; }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(ids), j = 0;
    if (PySequence_Fast_GET_SIZE(values) < n) n = PySequence_Fast_GET_SIZE(values);
    PyObject **is = PySequence_Fast_ITEMS(ids), **vs = PySequence_Fast_ITEMS(values);
    while (j < n && vs[j] != marker) j++;
    if (j == n) { out = Py_NewRef(Py_None); goto done; }
    kept = PyList_New(0);
    kept_values = PyList_New(0);
    if (kept == NULL || kept_values == NULL) goto done;
    for (j = 0; j < n; j++) {
        if (vs[j] == marker) continue;
        if (PyList_Append(kept, is[j]) < 0 || PyList_Append(kept_values, vs[j]) < 0) goto done;
    }
    out = PyTuple_Pack(2, kept, kept_values);
done:
    Py_XDECREF(kept); Py_XDECREF(kept_values);
    Py_DECREF(ids); Py_DECREF(values);
    return out;
}

#define FAST(f) ((PyCFunction)(void (*)(void))(f))

static PyMethodDef bulk_methods[] = {
    {"set_all", FAST(set_all), METH_FASTCALL, "values[i] = value for each i of indices"},
    {"set_each", FAST(set_each), METH_FASTCALL, "values[i] = item for each pair"},
    {"drop_refs", FAST(drop_refs), METH_FASTCALL,
     "one reference fewer on each block; the freed ones: (with a hash, without)"},
    {"first_passing", FAST(first_passing), METH_FASTCALL,
     "index of the first free (never hit) block of a queue from start; len if none"},
    {"num_passing", FAST(num_passing), METH_FASTCALL,
     "how many blocks of a queue from start, most at most, are free (never hit) in a row"},
    {"marked", FAST(marked), METH_FASTCALL, "the ids whose byte in marks is not 0"},
    {"without_marked", FAST(without_marked), METH_FASTCALL,
     "(ids, values) of the pairs whose value is not the marker; None if none is"},
    {"walk_chain", FAST(walk_chain), METH_FASTCALL,
     "the scored pool's eviction walk from a victim up its chain; the victims still wanted"},
    {NULL, NULL, 0, NULL}
};

static struct PyModuleDef bulk_module = {
    PyModuleDef_HEAD_INIT, "_bulk", "C loops for kvsim.cache.bulk (see the C source).", -1,
    bulk_methods,
};

PyMODINIT_FUNC PyInit__bulk(void) {
    ZERO = PyLong_FromLong(0);
    ONE = PyLong_FromLong(1);
    if (ZERO == NULL || ONE == NULL) return NULL;
    return PyModule_Create(&bulk_module);
}
