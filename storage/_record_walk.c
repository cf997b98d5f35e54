/* storage._record_walk: the compiled record walk of LogValidator.
 *
 * walk(buf, start, end, count, compact) -> (kind, record, a, b, min_ts_delta, max_ts_delta)
 *
 * Same contract and same results as storage/record_walk.py walk_py (the reference):
 * see that file for the result kinds. Positions are relative to start. Every read is
 * bounds-checked against the section end; positions are uint64 so that a skip by any
 * int64 length cannot overflow (p <= n + 2^63 - 1 always), matching Python's ints.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

enum {
    OK = 0, COUNT_SHORT = 1, BAD_LENGTH = 2, OFFSET_DELTA = 3, KEY_LENGTH = 4, NO_KEY = 5,
    VALUE_LENGTH = 6, HEADER_COUNT = 7, HEADER_KEY_LENGTH = 8, HEADER_KEY_UTF8 = 9,
    HEADER_VALUE_LENGTH = 10, FIELDS_END = 11, TRUNCATED = 12, TRAILING = 13,
    VARINT_OVERFLOW = 14, VARINT_TOO_LONG = 15
};

typedef struct {
    int kind;
    int64_t record;
    /* a and b are printed as Python ints: a signed value, or an unsigned position. */
    int64_t a;
    uint64_t a_pos;
    int a_is_pos;
    uint64_t b_pos;
    int64_t min_delta, max_delta;
} result_t;

/* Zigzag varint at *p (at most 10 bytes). 0 on success; else the error kind. */
static inline int read_varint(const uint8_t *d, uint64_t n, uint64_t *p, int64_t *out, uint64_t *err_pos) {
    uint64_t pos = *p;
    uint64_t raw = 0;
    for (int i = 0; i < 10; i++) {
        if (pos + i >= n) return TRUNCATED;
        uint8_t b = d[pos + i];
        if (i == 9) {
            if (b >= 0x80) { *err_pos = pos; return VARINT_TOO_LONG; }
            if (b > 1) { *err_pos = pos; return VARINT_OVERFLOW; }
        }
        raw |= (uint64_t)(b & 0x7F) << (7 * i);
        if (b < 0x80) {
            *out = (int64_t)((raw >> 1) ^ (~(raw & 1) + 1));
            *p = pos + i + 1;
            return 0;
        }
    }
    *err_pos = pos;
    return VARINT_TOO_LONG;  /* not reached: i == 9 returns above */
}

/* Skip `len` (>= 0) bytes: positions stay exact (no clamping), as Python ints would. */
static inline uint64_t skip(uint64_t p, int64_t len) { return p + (uint64_t)len; }

static int walk_headers(const uint8_t *d, uint64_t n, uint64_t *pp, uint64_t rec_end, result_t *r) {
    uint64_t p = *pp, err_pos = 0;
    int64_t hcount;
    int e = read_varint(d, n, &p, &hcount, &err_pos);
    if (e) { r->kind = e; r->a_pos = err_pos; r->a_is_pos = 1; return 1; }  /* TRUNCATED: a = 0 */
    /* Python: hcount < 0 or hcount * 2 > rec_end - p (rec_end - p may be negative). */
    if (hcount < 0 || p > rec_end || (uint64_t)hcount > (rec_end - p) / 2) {
        r->kind = HEADER_COUNT; r->a = hcount; return 1;
    }
    for (int64_t h = 0; h < hcount; h++) {
        int64_t kl, vl;
        e = read_varint(d, n, &p, &kl, &err_pos);
        if (e) { r->kind = e; r->a_pos = err_pos; r->a_is_pos = 1; return 1; }
        if (kl < 0 || skip(p, kl) > rec_end) { r->kind = HEADER_KEY_LENGTH; r->a = kl; return 1; }
        /* p + kl <= rec_end <= n: the key lies inside the data. Strict UTF-8, as bytes.decode. */
        PyObject *key = PyUnicode_DecodeUTF8((const char *)d + p, (Py_ssize_t)kl, "strict");
        if (key == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) return -1;
            PyErr_Clear();
            r->kind = HEADER_KEY_UTF8; return 1;
        }
        Py_DECREF(key);
        p += (uint64_t)kl;
        e = read_varint(d, n, &p, &vl, &err_pos);
        if (e) { r->kind = e; r->a_pos = err_pos; r->a_is_pos = 1; return 1; }
        if (vl >= 0) p = skip(p, vl);
        else if (vl != -1) { r->kind = HEADER_VALUE_LENGTH; r->a = vl; return 1; }
    }
    *pp = p;
    return 0;
}

/* Returns -1 on a Python error (exception set), else 0 with *r filled. */
static int do_walk(const uint8_t *d, uint64_t n, int64_t count, int compact, result_t *r) {
    uint64_t p = 0, err_pos = 0;
    int64_t i = 0, v;
    int64_t min_delta = INT64_MAX, max_delta = INT64_MIN;
    int e;
    /* One- and two-byte varints (nearly every length and delta) inline; the general reader otherwise. */
#define READ(out) do { \
        if (p < n && d[p] < 0x80) { uint8_t z_ = d[p++]; (out) = (int64_t)(z_ >> 1) ^ -(int64_t)(z_ & 1); break; } \
        if (p + 1 < n && d[p + 1] < 0x80) { \
            uint32_t z_ = (uint32_t)(d[p] & 0x7F) | ((uint32_t)d[p + 1] << 7); p += 2; \
            (out) = (int64_t)(z_ >> 1) ^ -(int64_t)(z_ & 1); break; } \
        e = read_varint(d, n, &p, &(out), &err_pos); \
        if (e) { r->kind = e; r->record = i; if (e != TRUNCATED) { r->a_pos = err_pos; r->a_is_pos = 1; } \
                 return 0; } } while (0)
    for (i = 0; i < count; i++) {
        int64_t length, ts_delta, kl, vl;
        if (p >= n) { r->kind = COUNT_SHORT; r->record = i; return 0; }
        READ(length);
        uint64_t rec_end = skip(p, length < 0 ? 0 : length);
        if (length < 6 || rec_end > n) {
            r->kind = BAD_LENGTH; r->record = i; r->a = length; r->b_pos = n - p; return 0;
        }
        p += 1;  /* record attributes: unused in v2 */
        READ(ts_delta);
        if (ts_delta > max_delta) max_delta = ts_delta;
        if (ts_delta < min_delta) min_delta = ts_delta;
        if (p < n && d[p] == (uint64_t)i << 1 && d[p] < 0x80) {
            p += 1;
        } else {
            READ(v);
            if (v != i) { r->kind = OFFSET_DELTA; r->record = i; r->a = v; return 0; }
        }
        READ(kl);
        if (kl >= 0) p = skip(p, kl);
        else if (kl != -1) { r->kind = KEY_LENGTH; r->record = i; r->a = kl; return 0; }
        else if (compact) { r->kind = NO_KEY; r->record = i; return 0; }
        READ(vl);
        if (vl >= 0) p = skip(p, vl);
        else if (vl != -1) { r->kind = VALUE_LENGTH; r->record = i; r->a = vl; return 0; }
        if (p >= n) { r->kind = TRUNCATED; r->record = i; return 0; }
        if (d[p] == 0) {
            p += 1;
        } else {
            int h = walk_headers(d, n, &p, rec_end, r);
            if (h < 0) return -1;
            if (h > 0) { r->record = i; return 0; }
        }
        if (p != rec_end) {
            r->kind = FIELDS_END; r->record = i; r->a_pos = p; r->a_is_pos = 1; r->b_pos = rec_end; return 0;
        }
    }
#undef READ
    if (p != n) { r->kind = TRAILING; r->record = count > 0 ? count - 1 : 0; r->a_pos = n - p; r->a_is_pos = 1; return 0; }
    r->kind = OK; r->min_delta = min_delta; r->max_delta = max_delta;
    return 0;
}

static PyObject *walk(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t start, end;
    long long count;
    int compact;
    if (!PyArg_ParseTuple(args, "y*nnLp", &view, &start, &end, &count, &compact)) return NULL;
    if (start < 0 || end < start || end > view.len) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "walk: start/end outside the buffer");
        return NULL;
    }
    result_t r = {0};
    int rc;
    const uint8_t *d = (const uint8_t *)view.buf + start;
    uint64_t n = (uint64_t)(end - start);
    /* The GIL stays held: header keys are decoded with CPython's own strict UTF-8 decoder,
       and a walk costs a few nanoseconds per record. */
    rc = do_walk(d, n, (int64_t)count, compact, &r);
    PyBuffer_Release(&view);
    if (rc < 0) return NULL;
    if (r.kind != OK) { r.min_delta = 0; r.max_delta = 0; }
    PyObject *a = r.a_is_pos ? PyLong_FromUnsignedLongLong(r.a_pos) : PyLong_FromLongLong(r.a);
    PyObject *b = PyLong_FromUnsignedLongLong(r.b_pos);
    if (a == NULL || b == NULL) { Py_XDECREF(a); Py_XDECREF(b); return NULL; }
    return Py_BuildValue("(iLNNLL)", r.kind, (long long)r.record, a, b,
                         (long long)r.min_delta, (long long)r.max_delta);
}

static PyMethodDef methods[] = {
    {"walk", walk, METH_VARARGS,
     "walk(buf, start, end, count, compact) -> (kind, record, a, b, min_ts_delta, max_ts_delta)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_record_walk", NULL, -1, methods};

PyMODINIT_FUNC PyInit__record_walk(void) { return PyModule_Create(&module); }
