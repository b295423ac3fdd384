/* C loops for kvsim.cache.bulk: element-wise updates of a Python list by a batch of indices,
 * and the policy pools' release of a request's blocks. Each does exactly what the Python
 * version beside it in bulk.py / policy_pool.py does (which runs when this module is not
 * built); a target that is not a list is left to it (NotImplemented, before reading the
 * indices), and so is a release that meets a block id or count that is not an int.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* ``index`` (an int, or anything with ``__index__``) as a position in a list of ``n`` items
 * (negative from the end), or -1 with the error a list assignment raises. */
static inline Py_ssize_t position(PyObject *index, Py_ssize_t n) {
    if (!PyIndex_Check(index)) {
        PyErr_Format(PyExc_TypeError, "list indices must be integers or slices, not %.200s",
                     Py_TYPE(index)->tp_name);
        return -1;
    }
    Py_ssize_t i = PyNumber_AsSsize_t(index, PyExc_IndexError);
    if (i == -1 && PyErr_Occurred()) return -1;
    if (i < 0) i += n;
    if (i < 0 || i >= n) {
        PyErr_SetString(PyExc_IndexError, "list assignment index out of range");
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

/* set_all(values, indices, value): values[i] = value for each i (values a list). */
static PyObject *set_all(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (!three(nargs, "set_all(values, indices, value)")) return NULL;
    PyObject *values = args[0];
    if (!PyList_CheckExact(values)) Py_RETURN_NOTIMPLEMENTED;
    PyObject *indices = PySequence_Fast(args[1], "set_all: indices must be iterable");
    if (indices == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(indices);
    PyObject **items = PySequence_Fast_ITEMS(indices);
    for (Py_ssize_t j = 0; j < n; j++) {
        Py_ssize_t i = position(items[j], PyList_GET_SIZE(values));
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
        Py_ssize_t i = position(is[j], PyList_GET_SIZE(values));
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

#define FAST(f) ((PyCFunction)(void (*)(void))(f))

static PyMethodDef bulk_methods[] = {
    {"set_all", FAST(set_all), METH_FASTCALL, "values[i] = value for each i of indices"},
    {"set_each", FAST(set_each), METH_FASTCALL, "values[i] = item for each pair"},
    {"drop_refs", FAST(drop_refs), METH_FASTCALL,
     "one reference fewer on each block; the freed ones: (with a hash, without)"},
    {NULL, NULL, 0, NULL}
};

static struct PyModuleDef bulk_module = {
    PyModuleDef_HEAD_INIT, "_bulk", "C loops for kvsim.cache.bulk (see the C source).", -1,
    bulk_methods,
};

PyMODINIT_FUNC PyInit__bulk(void) { return PyModule_Create(&bulk_module); }
