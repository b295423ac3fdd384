/* IntMap: a dict whose keys are 64-bit integers (block hashes).
 *
 * The cache's hot paths insert, look up and delete block hashes by the hundreds. A Python dict
 * keeps each key as an int object elsewhere in memory, and each value (a block id) as another.
 * Here the keys are an array of their own (open addressing, linear probing, Fibonacci
 * hashing: a probe reads 8 bytes a slot) and the values a parallel one, where an int of 63
 * bits is stored as a number (read back as an equal int) and any other value as an object
 * reference. It behaves as the subset of ``dict`` the
 * cache uses, plus batch methods that loop in C (``add_new``, ``set_many``, ``delete_many``,
 * ``count_up``, ``count_down``, ``prefix``, ``get_many``, ``ints_at``, ``isdisjoint``,
 * ``run_end``). A
 * second type, ``Ghost``, is a bounded FIFO of such keys (ARC's and S3-FIFO's ghost lists).
 *
 * Keys must be ints of 64 bits (TypeError / OverflowError otherwise; ``in`` and ``get`` simply
 * miss). Iteration order is the table's, not insertion order: nothing in the cache iterates a
 * map whose order matters. kvsim.cache.intmap falls back to ``dict`` when this module is not
 * built.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* Keys 0 and 1 mark empty and deleted slots of ``keys``; a real key 0 or 1 lives in one of
 * two extra value cells past the table (``vals[cap]``, ``vals[cap + 1]``, 0 when absent). A
 * value cell holds an int v in [-2^62, 2^62) as ``2v + 1`` and any other value as its object
 * pointer (even, never 0). Probes read ``keys`` alone: 8 bytes a slot. */
#define EMPTY_KEY 0
#define TOMB_KEY 1
#define NATIVE_MIN (-((int64_t)1 << 62))
#define NATIVE_MAX (((int64_t)1 << 62) - 1)

typedef struct {
    PyObject_HEAD
    int64_t *keys;          /* cap slots */
    uint64_t *vals;         /* cap + 2 cells */
    Py_ssize_t mask;        /* cap - 1 (cap a power of two) */
    int shift;              /* 64 - log2(cap) */
    Py_ssize_t size;        /* live entries */
    Py_ssize_t used;        /* live and deleted slots of ``keys`` */
} IntMap;

#define CAP(m) ((m)->mask + 1)

static inline Py_ssize_t home(const IntMap *m, int64_t key) {
    return (Py_ssize_t)(((uint64_t)key * 0x9E3779B97F4A7C15ULL) >> m->shift);
}

/* The cell of ``key``'s value, or -1; ``*spot``: where it would go (the first deleted slot
 * met, else the empty slot that ended the probe; a key 0 or 1 its extra cell). */
static inline Py_ssize_t probe(const IntMap *m, int64_t key, Py_ssize_t *spot) {
    if ((uint64_t)key <= TOMB_KEY) {
        *spot = CAP(m) + key;
        return m->vals[*spot] ? *spot : -1;
    }
    Py_ssize_t i = home(m, key), tomb = -1;
    for (;;) {
        int64_t k = m->keys[i];
        if (k == key) return i;
        if (k == EMPTY_KEY) { *spot = tomb >= 0 ? tomb : i; return -1; }
        if (k == TOMB_KEY && tomb < 0) tomb = i;
        i = (i + 1) & m->mask;
    }
}

static inline Py_ssize_t find(const IntMap *m, int64_t key) {
    Py_ssize_t spot = 0;
    return probe(m, key, &spot);
}

static inline int live(const IntMap *m, Py_ssize_t i) {
    return i < CAP(m) ? m->keys[i] > TOMB_KEY || m->keys[i] < EMPTY_KEY : m->vals[i] != 0;
}

static inline int64_t key_at(const IntMap *m, Py_ssize_t i) {
    return i < CAP(m) ? m->keys[i] : (int64_t)(i - CAP(m));
}

/* ``obj`` as a key: 0 and ``*key`` set; 1 when it cannot be one (not an int, or past 64 bits:
 * no error set); -1 on another error. */
static inline int key_of(PyObject *obj, int64_t *key) {
    int overflow;
    long long k;
    if (!PyLong_Check(obj)) return 1;
    k = PyLong_AsLongLongAndOverflow(obj, &overflow);  /* (PyLong_AsLongLong goes through a
                                                          byte array past one digit) */
    if (overflow) return 1;
    if (k == -1 && PyErr_Occurred()) return -1;
    *key = (int64_t)k;
    return 0;
}

/* ``obj`` as a key, or an error (TypeError / OverflowError). */
static int as_key(PyObject *obj, int64_t *key) {
    int found = key_of(obj, key);
    if (found == 1) {
        if (PyLong_Check(obj)) PyErr_SetString(PyExc_OverflowError, "IntMap keys fit 64 bits");
        else PyErr_Format(PyExc_TypeError, "IntMap keys are ints, not %.100s",
                          Py_TYPE(obj)->tp_name);
        return -1;
    }
    return found;
}

/* The cell of ``keyobj``'s value: >= 0 when present, -1 when not (or not a key at all), -2
 * on an error. */
static inline Py_ssize_t cell_for(const IntMap *m, PyObject *keyobj) {
    int64_t key;
    int bad = key_of(keyobj, &key);
    return bad < 0 ? -2 : bad ? -1 : find(m, key);
}

static inline int is_native(uint64_t cell) { return cell & 1; }

static inline PyObject *value_at(const IntMap *m, Py_ssize_t i) {     /* a new reference */
    uint64_t cell = m->vals[i];
    if (is_native(cell)) return PyLong_FromLongLong((int64_t)cell >> 1);
    return Py_NewRef((PyObject *)(uintptr_t)cell);
}

/* The cell holding ``value`` (a new reference to it, unless it is stored as a number). */
static inline uint64_t cell_of(PyObject *value) {
    if (PyLong_CheckExact(value)) {
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (!overflow && v >= NATIVE_MIN && v <= NATIVE_MAX) return ((uint64_t)v << 1) | 1;
        PyErr_Clear();
    }
    return (uint64_t)(uintptr_t)Py_NewRef(value);
}

static inline void release(uint64_t cell) {
    if (!is_native(cell)) Py_DECREF((PyObject *)(uintptr_t)cell);
}

static int allocate(IntMap *m, Py_ssize_t cap) {
    int64_t *keys = PyMem_Calloc((size_t)cap, sizeof(int64_t));
    uint64_t *vals = PyMem_Calloc((size_t)cap + 2, sizeof(uint64_t));
    if (keys == NULL || vals == NULL) {
        PyMem_Free(keys); PyMem_Free(vals);
        PyErr_NoMemory();
        return -1;
    }
    m->keys = keys; m->vals = vals; m->mask = cap - 1; m->used = 0;
    m->shift = 64;
    while (cap > 1) { cap >>= 1; m->shift--; }
    return 0;
}

/* A fresh table of at least 4 x ``need`` slots holding the live entries. */
static int resize(IntMap *m, Py_ssize_t need) {
    Py_ssize_t cap = 8, old_cap = CAP(m);
    while (cap < 4 * need) cap <<= 1;
    int64_t *old_keys = m->keys;
    uint64_t *old_vals = m->vals;
    if (allocate(m, cap) < 0) { m->keys = old_keys; m->vals = old_vals; return -1; }
    for (Py_ssize_t j = 0; j < old_cap; j++) {
        int64_t k = old_keys[j];
        if (k == EMPTY_KEY || k == TOMB_KEY) continue;
        Py_ssize_t i = home(m, k);
        while (m->keys[i] != EMPTY_KEY) i = (i + 1) & m->mask;
        m->keys[i] = k;
        m->vals[i] = old_vals[j];
        m->used++;
    }
    m->vals[cap] = old_vals[old_cap];
    m->vals[cap + 1] = old_vals[old_cap + 1];
    PyMem_Free(old_keys); PyMem_Free(old_vals);
    return 0;
}

/* Room for ``n`` more entries at most half full (deleted slots count: they lengthen probes). */
static inline int make_room(IntMap *m, Py_ssize_t n) {
    if ((m->used + n) * 2 > CAP(m)) return resize(m, m->size + n);
    return 0;
}

/* Put a new entry at ``spot`` (from a probe that missed). */
static inline void place(IntMap *m, Py_ssize_t spot, int64_t key, PyObject *value) {
    if (spot < CAP(m)) {
        if (m->keys[spot] == EMPTY_KEY) m->used++;
        m->keys[spot] = key;
    }
    m->vals[spot] = cell_of(value);
    m->size++;
}

/* m[key] = value, room made. */
static inline void put(IntMap *m, int64_t key, PyObject *value) {
    Py_ssize_t spot = 0, i = probe(m, key, &spot);
    if (i >= 0) {
        uint64_t old = m->vals[i];
        m->vals[i] = cell_of(value);
        release(old);
        return;
    }
    place(m, spot, key, value);
}

static inline void drop(IntMap *m, Py_ssize_t i) {
    uint64_t cell = m->vals[i];
    if (i < CAP(m)) m->keys[i] = TOMB_KEY;
    else m->vals[i] = 0;
    m->size--;
    release(cell);
}

static PyObject *missing(PyObject *keyobj) {
    PyErr_SetObject(PyExc_KeyError, keyobj);
    return NULL;
}

/* A list or tuple as is, anything iterable as a new list (a new reference). */
static PyObject *as_seq(PyObject *obj) {
    return PySequence_Fast(obj, "IntMap: expected an iterable");
}

/* --- type slots ------------------------------------------------------------------------ */

static PyObject *IntMap_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    if ((args != NULL && PyTuple_GET_SIZE(args)) || (kwds != NULL && PyDict_GET_SIZE(kwds))) {
        PyErr_SetString(PyExc_TypeError, "IntMap() takes no arguments");
        return NULL;
    }
    IntMap *m = (IntMap *)type->tp_alloc(type, 0);
    if (m == NULL) return NULL;
    m->keys = NULL;
    m->vals = NULL;
    m->size = 0;
    if (allocate(m, 8) < 0) { Py_DECREF(m); return NULL; }
    return (PyObject *)m;
}

static void clear_all(IntMap *m) {
    for (Py_ssize_t j = 0; j < CAP(m) + 2; j++) {
        if (live(m, j)) release(m->vals[j]);
        if (j < CAP(m)) m->keys[j] = EMPTY_KEY;
        m->vals[j] = 0;
    }
    m->size = m->used = 0;
}

static void IntMap_dealloc(IntMap *m) {
    if (m->keys) { clear_all(m); PyMem_Free(m->keys); PyMem_Free(m->vals); }
    Py_TYPE(m)->tp_free((PyObject *)m);
}

static Py_ssize_t IntMap_len(IntMap *m) { return m->size; }

static PyObject *IntMap_getitem(IntMap *m, PyObject *keyobj) {
    Py_ssize_t i = cell_for(m, keyobj);
    if (i < 0) return i == -2 ? NULL : missing(keyobj);
    return value_at(m, i);
}

static int IntMap_setitem(IntMap *m, PyObject *keyobj, PyObject *value) {
    int64_t key;
    if (value == NULL) {
        Py_ssize_t i = cell_for(m, keyobj);
        if (i < 0) { if (i == -1) missing(keyobj); return -1; }
        drop(m, i);
        return 0;
    }
    if (as_key(keyobj, &key) < 0 || make_room(m, 1) < 0) return -1;
    put(m, key, value);
    return 0;
}

static int IntMap_contains(IntMap *m, PyObject *keyobj) {
    Py_ssize_t i = cell_for(m, keyobj);
    return i == -2 ? -1 : i >= 0;
}

/* The entries as a new dict. */
static PyObject *as_dict(IntMap *m) {
    PyObject *d = PyDict_New();
    if (d == NULL) return NULL;
    for (Py_ssize_t j = 0; j < CAP(m) + 2; j++) {
        if (!live(m, j)) continue;
        PyObject *k = PyLong_FromLongLong(key_at(m, j)), *v = value_at(m, j);
        if (k == NULL || v == NULL || PyDict_SetItem(d, k, v) < 0) {
            Py_XDECREF(k); Py_XDECREF(v); Py_DECREF(d);
            return NULL;
        }
        Py_DECREF(k); Py_DECREF(v);
    }
    return d;
}

static PyObject *IntMap_repr(IntMap *m) {
    PyObject *d = as_dict(m), *r;
    if (d == NULL) return NULL;
    r = PyUnicode_FromFormat("IntMap(%R)", d);
    Py_DECREF(d);
    return r;
}

static PyTypeObject IntMapType;

/* ``==`` and ``!=`` as a dict's, with a dict or another IntMap. */
static PyObject *IntMap_richcompare(IntMap *m, PyObject *other, int op) {
    if ((op != Py_EQ && op != Py_NE)
            || !(PyDict_Check(other) || PyObject_TypeCheck(other, &IntMapType)))
        Py_RETURN_NOTIMPLEMENTED;
    PyObject *mine = as_dict(m), *theirs = other, *r;
    if (mine == NULL) return NULL;
    if (!PyDict_Check(other)) {
        theirs = as_dict((IntMap *)other);
        if (theirs == NULL) { Py_DECREF(mine); return NULL; }
    } else {
        Py_INCREF(theirs);
    }
    r = PyObject_RichCompare(mine, theirs, op);
    Py_DECREF(mine); Py_DECREF(theirs);
    return r;
}

/* --- methods --------------------------------------------------------------------------- */

/* get(key, default=None), or with ``pop`` pop(key[, default]): a missing key gives the
 * default (pop without one: KeyError). */
static PyObject *get_or_pop(IntMap *m, PyObject *const *args, Py_ssize_t nargs, int pop) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, pop ? "pop(key[, default])" : "get(key, default=None)");
        return NULL;
    }
    Py_ssize_t i = cell_for(m, args[0]);
    if (i == -2) return NULL;
    if (i < 0) {
        if (nargs == 2) return Py_NewRef(args[1]);
        return pop ? missing(args[0]) : Py_NewRef(Py_None);
    }
    PyObject *v = value_at(m, i);
    if (v != NULL && pop) drop(m, i);
    return v;
}

static PyObject *IntMap_get(IntMap *m, PyObject *const *args, Py_ssize_t nargs) {
    return get_or_pop(m, args, nargs, 0);
}

static PyObject *IntMap_pop(IntMap *m, PyObject *const *args, Py_ssize_t nargs) {
    return get_or_pop(m, args, nargs, 1);
}

/* update(other): m[k] = v for each (k, v) pair of an iterable, or each item of a dict. */
static PyObject *IntMap_update(IntMap *m, PyObject *other) {
    int64_t key;
    if (PyDict_Check(other)) {
        PyObject *k, *v;
        Py_ssize_t pos = 0;
        while (PyDict_Next(other, &pos, &k, &v)) {
            if (as_key(k, &key) < 0 || make_room(m, 1) < 0) return NULL;
            put(m, key, v);
        }
        Py_RETURN_NONE;
    }
    PyObject *it = PyObject_GetIter(other), *pair;
    if (it == NULL) return NULL;
    while ((pair = PyIter_Next(it)) != NULL) {
        int failed = !PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2;
        if (failed) PyErr_SetString(PyExc_TypeError, "IntMap.update takes (key, value) pairs");
        else if (as_key(PyTuple_GET_ITEM(pair, 0), &key) < 0 || make_room(m, 1) < 0) failed = 1;
        else put(m, key, PyTuple_GET_ITEM(pair, 1));
        Py_DECREF(pair);
        if (failed) { Py_DECREF(it); return NULL; }
    }
    Py_DECREF(it);
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

/* keys and values as two fast sequences (new references), their common length in ``*n``. */
static int pairwise(PyObject *const *args, Py_ssize_t nargs, const char *name,
                    PyObject **keys, PyObject **values, Py_ssize_t *n) {
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "%s(keys, values)", name);
        return -1;
    }
    *keys = as_seq(args[0]);
    if (*keys == NULL) return -1;
    *values = as_seq(args[1]);
    if (*values == NULL) { Py_DECREF(*keys); return -1; }
    *n = PySequence_Fast_GET_SIZE(*keys);
    if (PySequence_Fast_GET_SIZE(*values) < *n) *n = PySequence_Fast_GET_SIZE(*values);
    return 0;
}

/* set_many(keys, values): m[k] = v pairwise (as ``update(zip(keys, values))``). */
static PyObject *IntMap_set_many(IntMap *m, PyObject *const *args, Py_ssize_t nargs) {
    PyObject *keys, *values;
    Py_ssize_t n;
    if (pairwise(args, nargs, "set_many", &keys, &values, &n) < 0) return NULL;
    PyObject **ks = PySequence_Fast_ITEMS(keys), **vs = PySequence_Fast_ITEMS(values);
    int failed = make_room(m, n) < 0;
    for (Py_ssize_t j = 0; j < n && !failed; j++) {
        int64_t key;
        if (as_key(ks[j], &key) < 0) failed = 1;
        else put(m, key, vs[j]);
    }
    Py_DECREF(keys); Py_DECREF(values);
    if (failed) return NULL;
    Py_RETURN_NONE;
}

/* add_new(keys, values): m[k] = v pairwise when no key is here yet and none comes twice
 * (True); else nothing changes (False). */
static PyObject *IntMap_add_new(IntMap *m, PyObject *const *args, Py_ssize_t nargs) {
    PyObject *keys, *values;
    Py_ssize_t n, j, done = 0;
    if (pairwise(args, nargs, "add_new", &keys, &values, &n) < 0) return NULL;
    PyObject **ks = PySequence_Fast_ITEMS(keys), **vs = PySequence_Fast_ITEMS(values);
    int fresh = 1, failed = make_room(m, n) < 0;
    for (j = 0; j < n && !failed && fresh; j++) {
        int64_t key;
        Py_ssize_t spot = 0;
        if (as_key(ks[j], &key) < 0) { failed = 1; break; }
        if (probe(m, key, &spot) >= 0) { fresh = 0; break; }
        place(m, spot, key, vs[j]);
        done++;
    }
    if (failed || !fresh) {         /* undo: the keys put so far were new */
        PyObject *type, *value, *trace;
        PyErr_Fetch(&type, &value, &trace);
        for (j = 0; j < done; j++) {
            int64_t key = 0;
            key_of(ks[j], &key);
            drop(m, find(m, key));
        }
        PyErr_Restore(type, value, trace);
    }
    Py_DECREF(keys); Py_DECREF(values);
    if (failed) return NULL;
    return Py_NewRef(fresh ? Py_True : Py_False);
}

/* The number in value cell ``i`` (an int stored as a number), or -1 with TypeError set. */
static inline int64_t count_at(const IntMap *m, Py_ssize_t i) {
    if (is_native(m->vals[i])) return (int64_t)m->vals[i] >> 1;
    PyErr_SetString(PyExc_TypeError, "IntMap counts are ints of 62 bits");
    return -1;
}

/* count_up(keys): m[k] = m.get(k, 0) + 1 for each, in order. */
static PyObject *IntMap_count_up(IntMap *m, PyObject *arg) {
    PyObject *keys = as_seq(arg);
    if (keys == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(keys);
    PyObject **ks = PySequence_Fast_ITEMS(keys);
    int failed = make_room(m, n) < 0;
    for (Py_ssize_t j = 0; j < n && !failed; j++) {
        int64_t key, count;
        Py_ssize_t spot = 0, i;
        if (as_key(ks[j], &key) < 0) { failed = 1; break; }
        i = probe(m, key, &spot);
        if (i < 0) {
            if (spot < CAP(m)) {
                if (m->keys[spot] == EMPTY_KEY) m->used++;
                m->keys[spot] = key;
            }
            m->vals[spot] = ((uint64_t)1 << 1) | 1;
            m->size++;
        } else if ((count = count_at(m, i)) < 0 || count >= NATIVE_MAX) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_OverflowError, "count too large");
            failed = 1;
        } else {
            m->vals[i] = ((uint64_t)(count + 1) << 1) | 1;
        }
    }
    Py_DECREF(keys);
    if (failed) return NULL;
    Py_RETURN_NONE;
}

/* count_down(keys): for each, in order, m[k] -= 1, deleted at 0 (KeyError at a missing key,
 * those before it counted down). */
static PyObject *IntMap_count_down(IntMap *m, PyObject *arg) {
    PyObject *keys = as_seq(arg);
    if (keys == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(keys);
    PyObject **ks = PySequence_Fast_ITEMS(keys);
    int failed = 0;
    for (Py_ssize_t j = 0; j < n && !failed; j++) {
        Py_ssize_t i = cell_for(m, ks[j]);
        int64_t count;
        if (i < 0) { if (i == -1) missing(ks[j]); failed = 1; }
        else if ((count = count_at(m, i)) < 0) failed = 1;
        else if (count <= 1) drop(m, i);
        else m->vals[i] = ((uint64_t)(count - 1) << 1) | 1;
    }
    Py_DECREF(keys);
    if (failed) return NULL;
    Py_RETURN_NONE;
}

/* run_end(keys, start, stop): the first index from ``start`` (before ``stop``) whose key is
 * here, or came earlier from ``start`` on; ``stop`` when none (the end of a run of new,
 * distinct keys). The keys seen are kept in a table of this call's own. */
static PyObject *IntMap_run_end(IntMap *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) { PyErr_SetString(PyExc_TypeError, "run_end(keys, start, stop)"); return NULL; }
    Py_ssize_t start = PyLong_AsSsize_t(args[1]), stop = PyLong_AsSsize_t(args[2]), j;
    if ((start == -1 || stop == -1) && PyErr_Occurred()) return NULL;
    PyObject *keys = as_seq(args[0]);
    if (keys == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(keys);
    PyObject **ks = PySequence_Fast_ITEMS(keys);
    if (stop > n) stop = n;
    if (start < 0) start = 0;
    Py_ssize_t cap = 8;
    while (cap < 2 * (stop - start)) cap <<= 1;
    int shift = 64;
    for (Py_ssize_t c = cap; c > 1; c >>= 1) shift--;
    int64_t *seen = PyMem_Malloc((size_t)cap * sizeof(int64_t));
    uint8_t *used = PyMem_Calloc((size_t)cap, 1);
    if (seen == NULL || used == NULL) {
        PyMem_Free(seen); PyMem_Free(used); Py_DECREF(keys);
        return PyErr_NoMemory();
    }
    for (j = start; j < stop; j++) {
        int64_t key;
        if (as_key(ks[j], &key) < 0) break;
        if (find(m, key) >= 0) break;
        Py_ssize_t i = (Py_ssize_t)(((uint64_t)key * 0x9E3779B97F4A7C15ULL) >> shift);
        while (used[i] && seen[i] != key) i = (i + 1) & (cap - 1);
        if (used[i]) break;                 /* seen before in this run */
        used[i] = 1;
        seen[i] = key;
    }
    PyMem_Free(seen); PyMem_Free(used); Py_DECREF(keys);
    if (PyErr_Occurred()) return NULL;
    return PyLong_FromSsize_t(j < stop ? j : stop);
}

/* delete_many(keys): del m[k] for each, in order (KeyError at the first missing one, those
 * before it deleted, as a loop of ``del`` would). */
static PyObject *IntMap_delete_many(IntMap *m, PyObject *arg) {
    PyObject *keys = as_seq(arg);
    if (keys == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(keys);
    PyObject **ks = PySequence_Fast_ITEMS(keys);
    for (Py_ssize_t j = 0; j < n; j++) {
        Py_ssize_t i = cell_for(m, ks[j]);
        if (i < 0) {
            if (i == -1) missing(ks[j]);
            Py_DECREF(keys);
            return NULL;
        }
        drop(m, i);
    }
    Py_DECREF(keys);
    Py_RETURN_NONE;
}

/* prefix(keys): the values of the leading keys present, up to the first missing one. */
static PyObject *IntMap_prefix(IntMap *m, PyObject *arg) {
    PyObject *keys = as_seq(arg);
    if (keys == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(keys), j;
    PyObject **ks = PySequence_Fast_ITEMS(keys);
    PyObject *out = PyList_New(0);
    for (j = 0; j < n && out != NULL; j++) {
        Py_ssize_t i = cell_for(m, ks[j]);
        if (i == -2) Py_CLEAR(out);
        if (i < 0) break;
        PyObject *v = value_at(m, i);
        if (v == NULL || PyList_Append(out, v) < 0) Py_CLEAR(out);
        Py_XDECREF(v);
    }
    Py_DECREF(keys);
    return out;
}

/* get_many(keys, default): [m.get(k, default) for k in keys]. */
static PyObject *IntMap_get_many(IntMap *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) { PyErr_SetString(PyExc_TypeError, "get_many(keys, default)"); return NULL; }
    PyObject *keys = as_seq(args[0]);
    if (keys == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(keys);
    PyObject **ks = PySequence_Fast_ITEMS(keys);
    PyObject *out = PyList_New(n);
    for (Py_ssize_t j = 0; j < n && out != NULL; j++) {
        Py_ssize_t i = cell_for(m, ks[j]);
        PyObject *v = i == -2 ? NULL : i < 0 ? Py_NewRef(args[1]) : value_at(m, i);
        if (v == NULL) Py_CLEAR(out);
        else PyList_SET_ITEM(out, j, v);
    }
    Py_DECREF(keys);
    return out;
}

/* Whether ``holds(m, cell)`` for the cell of every one of ``keys`` (-1: not here). */
static PyObject *every_key(IntMap *m, PyObject *arg, int (*holds)(const IntMap *, Py_ssize_t)) {
    PyObject *keys = as_seq(arg);
    if (keys == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(keys);
    PyObject **ks = PySequence_Fast_ITEMS(keys), *answer = Py_True;
    for (Py_ssize_t j = 0; j < n; j++) {
        Py_ssize_t i = cell_for(m, ks[j]);
        if (i == -2) { Py_DECREF(keys); return NULL; }
        if (!holds(m, i)) { answer = Py_False; break; }
    }
    Py_DECREF(keys);
    return Py_NewRef(answer);
}

static int holds_int(const IntMap *m, Py_ssize_t i) {
    return i >= 0 && (is_native(m->vals[i])
                      || PyLong_CheckExact((PyObject *)(uintptr_t)m->vals[i]));
}

static int is_absent(const IntMap *m, Py_ssize_t i) { return i < 0; }

/* ints_at(keys): whether every one of ``keys`` is here with an int value (exactly an int). */
static PyObject *IntMap_ints_at(IntMap *m, PyObject *arg) { return every_key(m, arg, holds_int); }

/* isdisjoint(keys): whether none of ``keys`` is here. */
static PyObject *IntMap_isdisjoint(IntMap *m, PyObject *arg) {
    return every_key(m, arg, is_absent);
}

static PyObject *IntMap_clear(IntMap *m, PyObject *unused) {
    clear_all(m);
    Py_RETURN_NONE;
}

/* The keys (what 0), values (1) or (key, value) pairs (2), as a list. */
static PyObject *collect(IntMap *m, int what) {
    PyObject *out = PyList_New(m->size);
    if (out == NULL) return NULL;
    Py_ssize_t k = 0;
    for (Py_ssize_t j = 0; j < CAP(m) + 2; j++) {
        if (!live(m, j)) continue;
        PyObject *key = what == 1 ? NULL : PyLong_FromLongLong(key_at(m, j));
        PyObject *value = what == 0 ? NULL : value_at(m, j);
        PyObject *item = what == 0 ? key : what == 1 ? value : NULL;
        if (what == 2 && key != NULL && value != NULL) item = PyTuple_Pack(2, key, value);
        if (what == 2) { Py_XDECREF(key); Py_XDECREF(value); }
        if (item == NULL) { Py_DECREF(out); return NULL; }
        PyList_SET_ITEM(out, k++, item);
    }
    return out;
}

/* keys(): the map itself (iterating it gives the keys, and it has ``isdisjoint``, as a dict's
 * keys view). */
static PyObject *IntMap_keys(IntMap *m, PyObject *unused) { return Py_NewRef((PyObject *)m); }
static PyObject *IntMap_values(IntMap *m, PyObject *unused) { return collect(m, 1); }
static PyObject *IntMap_items(IntMap *m, PyObject *unused) { return collect(m, 2); }

static PyObject *IntMap_iter(IntMap *m) {       /* over a snapshot of the keys */
    PyObject *keys = collect(m, 0);
    if (keys == NULL) return NULL;
    PyObject *it = PyObject_GetIter(keys);
    Py_DECREF(keys);
    return it;
}

#define FAST(f) ((PyCFunction)(void (*)(void))(f))

static PyMethodDef IntMap_methods[] = {
    {"get", FAST(IntMap_get), METH_FASTCALL, "m.get(key, default=None)"},
    {"pop", FAST(IntMap_pop), METH_FASTCALL, "m.pop(key[, default])"},
    {"update", (PyCFunction)IntMap_update, METH_O, "m[k] = v for each (k, v) pair or item"},
    {"set_many", FAST(IntMap_set_many), METH_FASTCALL, "m[k] = v for each pair of keys, values"},
    {"add_new", FAST(IntMap_add_new), METH_FASTCALL,
     "m[k] = v pairwise if no key is here and none comes twice (True); else nothing (False)"},
    {"delete_many", (PyCFunction)IntMap_delete_many, METH_O, "del m[k] for each of keys"},
    {"run_end", FAST(IntMap_run_end), METH_FASTCALL,
     "the first index from start whose key is here or came before from start; stop if none"},
    {"count_up", (PyCFunction)IntMap_count_up, METH_O, "m[k] = m.get(k, 0) + 1 for each of keys"},
    {"count_down", (PyCFunction)IntMap_count_down, METH_O,
     "m[k] -= 1 for each of keys, deleted at 0"},
    {"prefix", (PyCFunction)IntMap_prefix, METH_O,
     "the values of the leading keys present, up to the first missing one"},
    {"get_many", FAST(IntMap_get_many), METH_FASTCALL, "[m.get(k, default) for k in keys]"},
    {"ints_at", (PyCFunction)IntMap_ints_at, METH_O, "every key given is here with an int value"},
    {"isdisjoint", (PyCFunction)IntMap_isdisjoint, METH_O, "none of the keys given is here"},
    {"clear", (PyCFunction)IntMap_clear, METH_NOARGS, "remove every entry"},
    {"keys", (PyCFunction)IntMap_keys, METH_NOARGS, "the map itself, a view of its keys"},
    {"values", (PyCFunction)IntMap_values, METH_NOARGS, "the values, as a list"},
    {"items", (PyCFunction)IntMap_items, METH_NOARGS, "the (key, value) pairs, as a list"},
    {NULL, NULL, 0, NULL}
};

static PyMappingMethods IntMap_mapping = {
    (lenfunc)IntMap_len, (binaryfunc)IntMap_getitem, (objobjargproc)IntMap_setitem,
};

static PySequenceMethods IntMap_sequence = {
    .sq_contains = (objobjproc)IntMap_contains,
};

static PyTypeObject IntMapType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kvsim.cache._intmap.IntMap",
    .tp_doc = "A dict whose keys are 64-bit ints, kept in the table itself.",
    .tp_basicsize = sizeof(IntMap),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = IntMap_new,
    .tp_dealloc = (destructor)IntMap_dealloc,
    .tp_repr = (reprfunc)IntMap_repr,
    .tp_richcompare = (richcmpfunc)IntMap_richcompare,
    .tp_as_mapping = &IntMap_mapping,
    .tp_as_sequence = &IntMap_sequence,
    .tp_iter = (getiterfunc)IntMap_iter,
    .tp_methods = IntMap_methods,
};

/* --- Ghost ------------------------------------------------------------------------------- */

/* A ghost list: a bounded FIFO of hashes with an OrderedDict's order, membership and length
 * (see kvsim.cache.ghost). ``live`` maps each present hash to the position of its entry in
 * ``fifo`` (a number); ``fifo[head:tail]`` lists the hashes in the order they were added, at
 * positions ``base + index``. A hash taken out (``discard``) leaves a stale entry behind: an
 * entry is live exactly while ``live`` maps its hash to its own position. An *anonymous*
 * entry (the object ``anonymous`` given instead of a hash: content no lookup can reach) has
 * no hash: it takes a place and counts until it is the oldest and goes (``anon`` marks it). */
typedef struct {
    PyObject_HEAD
    IntMap *live;
    int64_t *fifo;
    char *anon;
    Py_ssize_t head, tail, room;
    int64_t base;
    Py_ssize_t slack;       /* stale entries kept before ``fifo`` is rebuilt without them */
    Py_ssize_t num_anon;    /* anonymous entries present */
    PyObject *anonymous;
} Ghost;

static inline uint64_t number_cell(int64_t v) { return ((uint64_t)v << 1) | 1; }

static inline int entry_is_live(const Ghost *g, Py_ssize_t j) {
    if (g->anon[j]) return 1;
    Py_ssize_t i = find(g->live, g->fifo[j]);
    return i >= 0 && g->live->vals[i] == number_cell(g->base + j);
}

/* ``fifo`` without its gone and stale entries (each live hash given its new position). */
static void ghost_rebuild(Ghost *g) {
    IntMap *m = g->live;
    Py_ssize_t w = 0;
    int64_t base = g->base + g->tail;       /* fresh positions: none equals an old one */
    for (Py_ssize_t j = g->head; j < g->tail; j++) {
        if (!g->anon[j]) {
            Py_ssize_t i = find(m, g->fifo[j]);
            if (i < 0 || m->vals[i] != number_cell(g->base + j)) continue;
            m->vals[i] = number_cell(base + w);
        }
        g->anon[w] = g->anon[j];
        g->fifo[w++] = g->fifo[j];
    }
    g->base = base;
    g->head = 0;
    g->tail = w;
}

/* Room in ``fifo`` for ``n`` more entries. */
static int ghost_room(Ghost *g, Py_ssize_t n) {
    if (g->tail + n <= g->room) return 0;
    if (g->head) {                          /* the gone entries first */
        memmove(g->fifo, g->fifo + g->head, (size_t)(g->tail - g->head) * sizeof(int64_t));
        memmove(g->anon, g->anon + g->head, (size_t)(g->tail - g->head));
        g->base += g->head;
        g->tail -= g->head;
        g->head = 0;
        if (g->tail + n <= g->room) return 0;
    }
    Py_ssize_t room = g->room * 2 > g->tail + n ? g->room * 2 : g->tail + n;
    int64_t *fifo = PyMem_Realloc(g->fifo, (size_t)room * sizeof(int64_t));
    if (fifo == NULL) { PyErr_NoMemory(); return -1; }
    g->fifo = fifo;
    char *anon = PyMem_Realloc(g->anon, (size_t)room);
    if (anon == NULL) { PyErr_NoMemory(); return -1; }
    g->anon = anon;
    g->room = room;
    return 0;
}

/* Drop the oldest present hash (stale entries before it go too). */
static void ghost_drop_oldest(Ghost *g) {
    while (g->head < g->tail) {
        Py_ssize_t j = g->head++;
        if (g->anon[j]) { g->num_anon--; return; }
        Py_ssize_t i = find(g->live, g->fifo[j]);
        if (i >= 0 && g->live->vals[i] == number_cell(g->base + j)) { drop(g->live, i); return; }
    }
}

static void ghost_tidy(Ghost *g) {
    if (g->tail - g->head > 2 * (g->live->size + g->num_anon) + g->slack) ghost_rebuild(g);
}

static PyObject *Ghost_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *names[] = {"slack", "anonymous", NULL};
    Py_ssize_t slack = 1024;
    PyObject *anonymous = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|nO:Ghost", names, &slack, &anonymous))
        return NULL;
    Ghost *g = (Ghost *)type->tp_alloc(type, 0);
    if (g == NULL) return NULL;
    g->live = (IntMap *)IntMap_new(&IntMapType, NULL, NULL);
    g->fifo = PyMem_Malloc(16 * sizeof(int64_t));
    g->anon = PyMem_Malloc(16);
    Py_INCREF(anonymous);
    g->anonymous = anonymous;
    g->num_anon = 0;
    if (g->live == NULL || g->fifo == NULL || g->anon == NULL) {
        Py_DECREF(g);
        return PyErr_NoMemory();
    }
    g->head = g->tail = 0;
    g->room = 16;
    g->base = 0;
    g->slack = slack < 0 ? 0 : slack;
    return (PyObject *)g;
}

static void Ghost_dealloc(Ghost *g) {
    Py_XDECREF(g->live);
    Py_XDECREF(g->anonymous);
    PyMem_Free(g->fifo);
    PyMem_Free(g->anon);
    Py_TYPE(g)->tp_free((PyObject *)g);
}

static Py_ssize_t Ghost_len(Ghost *g) { return g->live->size + g->num_anon; }

static int Ghost_contains(Ghost *g, PyObject *keyobj) { return IntMap_contains(g->live, keyobj); }

/* add(hashes, capacity): for each hash in turn, ``ghost[h] = None`` (one present keeps its
 * place; the anonymous object: a new anonymous entry), then, with more than ``capacity``
 * present, the oldest goes. */
static PyObject *Ghost_add(Ghost *g, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) { PyErr_SetString(PyExc_TypeError, "add(hashes, capacity)"); return NULL; }
    Py_ssize_t capacity = PyLong_AsSsize_t(args[1]);
    if (capacity == -1 && PyErr_Occurred()) return NULL;
    PyObject *hashes = as_seq(args[0]);
    if (hashes == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(hashes);
    PyObject **hs = PySequence_Fast_ITEMS(hashes);
    IntMap *m = g->live;
    int failed = make_room(m, n) < 0 || ghost_room(g, n) < 0;
    for (Py_ssize_t j = 0; j < n && !failed; j++) {
        int64_t key;
        Py_ssize_t spot = 0;
        if (hs[j] == g->anonymous) {
            g->anon[g->tail] = 1;
            g->fifo[g->tail++] = 0;
            g->num_anon++;
        } else {
            if (as_key(hs[j], &key) < 0) { failed = 1; break; }
            if (probe(m, key, &spot) < 0) {
                if (spot < CAP(m)) {
                    if (m->keys[spot] == EMPTY_KEY) m->used++;
                    m->keys[spot] = key;
                }
                m->vals[spot] = number_cell(g->base + g->tail);
                m->size++;
                g->anon[g->tail] = 0;
                g->fifo[g->tail++] = key;
            }
        }
        if (m->size + g->num_anon > capacity) ghost_drop_oldest(g);
    }
    Py_DECREF(hashes);
    if (failed) return NULL;
    ghost_tidy(g);
    Py_RETURN_NONE;
}

/* discard(hash): take a present hash out (KeyError if it is not). */
static PyObject *Ghost_discard(Ghost *g, PyObject *keyobj) {
    Py_ssize_t i = cell_for(g->live, keyobj);
    if (i < 0) return i == -2 ? NULL : missing(keyobj);
    drop(g->live, i);
    ghost_tidy(g);
    Py_RETURN_NONE;
}

static PyObject *Ghost_isdisjoint(Ghost *g, PyObject *arg) {
    return IntMap_isdisjoint(g->live, arg);
}

/* first_present(hashes, start): the first index from ``start`` whose hash is here, or
 * ``len(hashes)``. */
static PyObject *Ghost_first_present(Ghost *g, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "first_present(hashes, start)");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    if (start == -1 && PyErr_Occurred()) return NULL;
    PyObject *hashes = as_seq(args[0]);
    if (hashes == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(hashes), j;
    PyObject **hs = PySequence_Fast_ITEMS(hashes);
    for (j = start < 0 ? 0 : start; j < n; j++) {
        Py_ssize_t i = cell_for(g->live, hs[j]);
        if (i == -2) { Py_DECREF(hashes); return NULL; }
        if (i >= 0) break;
    }
    Py_DECREF(hashes);
    return PyLong_FromSsize_t(j < n ? j : n);
}

/* take_run(hashes, start, stop): take out the hashes from ``start`` (before ``stop``) while
 * each is present (one given twice is not, the second time); where that stopped. */
static PyObject *Ghost_take_run(Ghost *g, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "take_run(hashes, start, stop)");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[1]), stop = PyLong_AsSsize_t(args[2]), j;
    if ((start == -1 || stop == -1) && PyErr_Occurred()) return NULL;
    PyObject *hashes = as_seq(args[0]);
    if (hashes == NULL) return NULL;
    PyObject **hs = PySequence_Fast_ITEMS(hashes);
    if (stop > PySequence_Fast_GET_SIZE(hashes)) stop = PySequence_Fast_GET_SIZE(hashes);
    for (j = start < 0 ? 0 : start; j < stop; j++) {
        Py_ssize_t i = cell_for(g->live, hs[j]);
        if (i < 0) break;
        drop(g->live, i);
    }
    Py_DECREF(hashes);
    if (PyErr_Occurred()) return NULL;
    ghost_tidy(g);
    return PyLong_FromSsize_t(j);
}

/* The present hashes, oldest first, as a list. */
static PyObject *ghost_order(Ghost *g) {
    PyObject *out = PyList_New(0);
    for (Py_ssize_t j = g->head; j < g->tail && out != NULL; j++) {
        if (!entry_is_live(g, j)) continue;
        PyObject *k = g->anon[j] ? Py_NewRef(g->anonymous) : PyLong_FromLongLong(g->fifo[j]);
        if (k == NULL || PyList_Append(out, k) < 0) Py_CLEAR(out);
        Py_XDECREF(k);
    }
    return out;
}

static PyObject *Ghost_iter(Ghost *g) {
    PyObject *order = ghost_order(g);
    if (order == NULL) return NULL;
    PyObject *it = PyObject_GetIter(order);
    Py_DECREF(order);
    return it;
}

static PyMethodDef Ghost_methods[] = {
    {"add", FAST(Ghost_add), METH_FASTCALL,
     "for each hash: ghost[h] = None, then the oldest goes while more than capacity"},
    {"discard", (PyCFunction)Ghost_discard, METH_O, "take a present hash out"},
    {"isdisjoint", (PyCFunction)Ghost_isdisjoint, METH_O, "none of the hashes given is here"},
    {"take_run", FAST(Ghost_take_run), METH_FASTCALL,
     "take out the hashes from start while each is present; where that stopped"},
    {"first_present", FAST(Ghost_first_present), METH_FASTCALL,
     "the first index from start whose hash is here, or len(hashes)"},
    {NULL, NULL, 0, NULL}
};

static PySequenceMethods Ghost_sequence = {
    .sq_length = (lenfunc)Ghost_len,
    .sq_contains = (objobjproc)Ghost_contains,
};

static PyTypeObject GhostType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kvsim.cache._intmap.Ghost",
    .tp_doc = "A bounded FIFO of 64-bit hashes with an OrderedDict's order and membership.",
    .tp_basicsize = sizeof(Ghost),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = Ghost_new,
    .tp_dealloc = (destructor)Ghost_dealloc,
    .tp_as_sequence = &Ghost_sequence,
    .tp_iter = (getiterfunc)Ghost_iter,
    .tp_methods = Ghost_methods,
};

static struct PyModuleDef intmap_module = {
    PyModuleDef_HEAD_INIT, "_intmap",
    "IntMap, a dict of 64-bit int keys, and Ghost, a bounded FIFO of them (see the C source).",
    -1, NULL,
};

PyMODINIT_FUNC PyInit__intmap(void) {
    if (PyType_Ready(&IntMapType) < 0 || PyType_Ready(&GhostType) < 0) return NULL;
    PyObject *mod = PyModule_Create(&intmap_module);
    if (mod == NULL) return NULL;
    if (PyModule_AddObjectRef(mod, "IntMap", (PyObject *)&IntMapType) < 0
            || PyModule_AddObjectRef(mod, "Ghost", (PyObject *)&GhostType) < 0) {
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
