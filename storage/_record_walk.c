/* storage._record_walk: the compiled record walk of LogValidator, the consumer's
 * compiled record decoder (decode_records, further down) and the producer's record
 * encoder (RecordsWriter, with RecordFutureBase, at the end).
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
#include <string.h>
#include <time.h>
#include <structmember.h>

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

/* ------------------------------------------------------------------------------------------
 * decode_records: the consumer's decoder. Same walk as _decode_records in
 * storage/record_batch.py (the reference), building the consumer's record objects directly.
 *
 * decode_records(cls, buf, start, end, count, base_offset, base_ts, log_append_ts,
 *                topic, partition, ts_type)
 *   -> (records, increasing)   on success: a list of `count` instances of cls (a tuple
 *                              subclass without __dict__, e.g. a NamedTuple) holding
 *                              (topic, partition, offset, timestamp, ts_type, key, value,
 *                              headers); increasing is True when the offsets strictly increase
 *   -> (kind, record, a, b)    on a malformed section: the error kind (DEC_* below, same
 *                              numbering as the walk's kinds), the record index and the
 *                              numbers its message needs; storage/record_decode.py raises the
 *                              same exception, with the same message, as _decode_records.
 *
 * The checks follow _decode_records step by step (it does not check the offset delta
 * against the record index and reads fields up to the end of the section, not of the
 * record), so every malformed input gets the same verdict. Objects are built only for
 * bytes inside the record: a key or value is turned into bytes once the record's fields
 * are known to end exactly at its length, header keys and values as they are read (both
 * are checked against the record end first, as _decode_headers does).
 */
enum { DEC_HEADER_KEY_UTF8 = HEADER_KEY_UTF8,  /* a = key position, b = key length */
       DEC_HEADER_VALUE_OVERRUN = 16 };        /* header value past the record [length, -] */

/* base + delta as a Python int: the sum of two int64 may need 65 bits, as in Python. */
static PyObject *int_sum(int64_t base, int64_t delta) {
    int64_t s;
    if (!__builtin_add_overflow(base, delta, &s)) return PyLong_FromLongLong(s);
    PyObject *a = PyLong_FromLongLong(base), *b = PyLong_FromLongLong(delta), *r = NULL;
    if (a != NULL && b != NULL) r = PyNumber_Add(a, b);
    Py_XDECREF(a);
    Py_XDECREF(b);
    return r;
}

#define DEC_VARINT_FAIL(e) do { r->kind = (e); if ((e) != TRUNCATED) { r->a_pos = err_pos; r->a_is_pos = 1; } } while (0)

/* A record's headers (the count byte is not 0): -1 on a Python error, 1 on a malformed
   header (r filled but r->record), 0 with *out a new tuple of (str, bytes | None) pairs. */
static int decode_headers(const uint8_t *d, uint64_t n, uint64_t *pp, uint64_t rec_end, result_t *r,
                          PyObject **out) {
    uint64_t p = *pp, err_pos = 0;
    int64_t hcount, kl, vl;
    int e = read_varint(d, n, &p, &hcount, &err_pos);
    if (e) { DEC_VARINT_FAIL(e); return 1; }
    /* Python: count < 0 or count * 2 > rec_end - p (which may be negative). Each header
       takes at least 2 bytes, so the list below is at most half the section's size. */
    if (hcount < 0 || p > rec_end || (uint64_t)hcount > (rec_end - p) / 2) {
        r->kind = HEADER_COUNT; r->a = hcount; return 1;
    }
    PyObject *list = PyTuple_New((Py_ssize_t)hcount);  /* NULL items until set: never exposed */
    if (list == NULL) return -1;
    for (int64_t h = 0; h < hcount; h++) {
        e = read_varint(d, n, &p, &kl, &err_pos);
        if (e) { DEC_VARINT_FAIL(e); goto malformed; }
        if (kl < 0 || skip(p, kl) > rec_end) { r->kind = HEADER_KEY_LENGTH; r->a = kl; goto malformed; }
        PyObject *key = PyUnicode_DecodeUTF8((const char *)d + p, (Py_ssize_t)kl, "strict");
        if (key == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) goto error;
            PyErr_Clear();
            r->kind = DEC_HEADER_KEY_UTF8; r->a_pos = p; r->a_is_pos = 1; r->b_pos = (uint64_t)kl;
            goto malformed;
        }
        p += (uint64_t)kl;
        e = read_varint(d, n, &p, &vl, &err_pos);
        PyObject *value;
        if (e) { Py_DECREF(key); DEC_VARINT_FAIL(e); goto malformed; }
        if (vl >= 0) {
            if (skip(p, vl) > rec_end) {
                Py_DECREF(key); r->kind = DEC_HEADER_VALUE_OVERRUN; r->a = vl; goto malformed;
            }
            value = PyBytes_FromStringAndSize((const char *)d + p, (Py_ssize_t)vl);
            if (value == NULL) { Py_DECREF(key); goto error; }
            p += (uint64_t)vl;
        } else if (vl == -1) {
            value = Py_NewRef(Py_None);
        } else {
            Py_DECREF(key); r->kind = HEADER_VALUE_LENGTH; r->a = vl; goto malformed;
        }
        PyObject *pair = PyTuple_New(2);
        if (pair == NULL) { Py_DECREF(key); Py_DECREF(value); goto error; }
        PyTuple_SET_ITEM(pair, 0, key);
        PyTuple_SET_ITEM(pair, 1, value);
        PyTuple_SET_ITEM(list, (Py_ssize_t)h, pair);
    }
    *pp = p;
    *out = list;
    return 0;
malformed:
    Py_DECREF(list);
    return 1;
error:
    Py_DECREF(list);
    return -1;
}

typedef struct {
    PyTypeObject *cls;
    int64_t base_offset, base_ts;
    PyObject *log_append_ts;  /* None: CreateTime, timestamps are base_ts + delta */
    PyObject *topic, *partition, *ts_type;
} decode_args_t;

/* -1 on a Python error; 0 with either *r filled (kind != OK) or the records in `out`. */
static int do_decode(const uint8_t *d, uint64_t n, int64_t count, const decode_args_t *da, result_t *r,
                     PyObject *out, int *increasing) {
    uint64_t p = 0, err_pos = 0;
    int64_t i = 0, prev_od = 0;
    int e;
    PyObject *headers = NULL;
    const int append_time = da->log_append_ts != Py_None;
    const Py_ssize_t prealloc = PyList_GET_SIZE(out);
    *increasing = 1;
#define DREAD(x) do { \
        if (p < n && d[p] < 0x80) { uint8_t z_ = d[p++]; (x) = (int64_t)(z_ >> 1) ^ -(int64_t)(z_ & 1); break; } \
        if (p + 1 < n && d[p + 1] < 0x80) { \
            uint32_t z_ = (uint32_t)(d[p] & 0x7F) | ((uint32_t)d[p + 1] << 7); p += 2; \
            (x) = (int64_t)(z_ >> 1) ^ -(int64_t)(z_ & 1); break; } \
        e = read_varint(d, n, &p, &(x), &err_pos); \
        if (e) { DEC_VARINT_FAIL(e); r->record = i; return 0; } } while (0)
    for (i = 0; i < count; i++) {
        int64_t length, ts_delta, od, kl, vl;
        if (p >= n) { r->kind = COUNT_SHORT; r->record = i; return 0; }
        DREAD(length);
        uint64_t rec_end = skip(p, length < 0 ? 0 : length);
        if (length < 6 || rec_end > n) {
            r->kind = BAD_LENGTH; r->record = i; r->a = length; r->b_pos = n - p; return 0;
        }
        p += 1;  /* record attributes: unused in v2 */
        DREAD(ts_delta);
        DREAD(od);
        DREAD(kl);
        const uint64_t key_pos = p;
        if (kl >= 0) p = skip(p, kl);
        else if (kl != -1) { r->kind = KEY_LENGTH; r->record = i; r->a = kl; return 0; }
        DREAD(vl);
        const uint64_t value_pos = p;
        if (vl >= 0) p = skip(p, vl);
        else if (vl != -1) { r->kind = VALUE_LENGTH; r->record = i; r->a = vl; return 0; }
        if (p >= n) { r->kind = TRUNCATED; r->record = i; return 0; }
        if (d[p] == 0) {
            p += 1;
            headers = PyTuple_New(0);  /* the empty tuple: shared, immutable, not tracked by the GC */
            if (headers == NULL) return -1;
        } else {
            int h = decode_headers(d, n, &p, rec_end, r, &headers);
            if (h < 0) return -1;
            if (h > 0) { r->record = i; return 0; }
        }
        if (p != rec_end) {
            Py_DECREF(headers);
            r->kind = FIELDS_END; r->record = i; r->a_pos = p; r->a_is_pos = 1; r->b_pos = rec_end; return 0;
        }
        /* Positions only moved forward to rec_end <= n: key and value lie inside the record. */
        PyObject *rec = da->cls == &PyTuple_Type ? PyTuple_New(8) : da->cls->tp_alloc(da->cls, 8);
        if (rec == NULL) { Py_DECREF(headers); return -1; }
        PyTuple_SET_ITEM(rec, 7, headers);  /* from here on, rec owns what it holds */
        headers = NULL;
        PyObject *offset = int_sum(da->base_offset, od);
        PyObject *ts = append_time ? Py_NewRef(da->log_append_ts) : int_sum(da->base_ts, ts_delta);
        PyObject *key = kl >= 0 ? PyBytes_FromStringAndSize((const char *)d + key_pos, (Py_ssize_t)kl)
                                : Py_NewRef(Py_None);
        PyObject *value = vl >= 0 ? PyBytes_FromStringAndSize((const char *)d + value_pos, (Py_ssize_t)vl)
                                  : Py_NewRef(Py_None);
        PyTuple_SET_ITEM(rec, 0, Py_NewRef(da->topic));
        PyTuple_SET_ITEM(rec, 1, Py_NewRef(da->partition));
        PyTuple_SET_ITEM(rec, 2, offset);
        PyTuple_SET_ITEM(rec, 3, ts);
        PyTuple_SET_ITEM(rec, 4, Py_NewRef(da->ts_type));
        PyTuple_SET_ITEM(rec, 5, key);
        PyTuple_SET_ITEM(rec, 6, value);
        if (offset == NULL || ts == NULL || key == NULL || value == NULL) { Py_DECREF(rec); return -1; }
        if (PyTuple_GET_SIZE(PyTuple_GET_ITEM(rec, 7)) == 0) {
            /* Only str, int, bytes and None inside: no reference cycle can pass through this
               record, so the cyclic GC need not track it (CPython untracks such tuples itself,
               but only once a collection has examined them: a million records a second
               would otherwise be a million objects for every collection to traverse). */
            PyObject_GC_UnTrack(rec);
        }
        if (i < prealloc) {
            PyList_SET_ITEM(out, (Py_ssize_t)i, rec);
        } else {
            int rc = PyList_Append(out, rec);
            Py_DECREF(rec);
            if (rc < 0) return -1;
        }
        if (i > 0 && od <= prev_od) *increasing = 0;
        prev_od = od;
    }
#undef DREAD
    if (p != n) { r->kind = TRAILING; r->record = count > 0 ? count - 1 : 0; r->a_pos = n - p; r->a_is_pos = 1; return 0; }
    r->kind = OK;
    return 0;
}

static PyObject *decode_records(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t start, end;
    long long count, base_offset, base_ts;
    decode_args_t da;
    PyObject *cls;
    if (!PyArg_ParseTuple(args, "Oy*nnLLLOOOO", &cls, &view, &start, &end, &count, &base_offset, &base_ts,
                          &da.log_append_ts, &da.topic, &da.partition, &da.ts_type)) return NULL;
    const char *bad = NULL;
    if (start < 0 || end < start || end > view.len) bad = "decode_records: start/end outside the buffer";
    else if (!PyType_Check(cls) || !PyType_IsSubtype((PyTypeObject *)cls, &PyTuple_Type)
             || ((PyTypeObject *)cls)->tp_basicsize != PyTuple_Type.tp_basicsize
             || ((PyTypeObject *)cls)->tp_dictoffset != 0)
        bad = "decode_records: cls must be a tuple subclass without instance attributes (e.g. a NamedTuple)";
    else if (da.log_append_ts != Py_None && !PyLong_Check(da.log_append_ts))
        bad = "decode_records: log_append_ts must be an int or None";
    if (bad != NULL) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, bad);
        return NULL;
    }
    da.cls = (PyTypeObject *)cls;
    da.base_offset = base_offset;
    da.base_ts = base_ts;
    const uint8_t *d = (const uint8_t *)view.buf + start;
    uint64_t n = (uint64_t)(end - start);
    /* Every record takes at least 7 bytes: a larger count fails, and is not preallocated. */
    Py_ssize_t prealloc = count >= 0 && (uint64_t)count <= n / 7 ? (Py_ssize_t)count : 0;
    PyObject *out = PyList_New(prealloc);  /* NULL items until set: never exposed unless all are */
    if (out == NULL) { PyBuffer_Release(&view); return NULL; }
    result_t r = {0};
    int increasing = 1;
    int rc = do_decode(d, n, (int64_t)count, &da, &r, out, &increasing);
    PyBuffer_Release(&view);
    if (rc < 0) { Py_DECREF(out); return NULL; }
    if (r.kind == OK) return Py_BuildValue("(NO)", out, increasing ? Py_True : Py_False);
    Py_DECREF(out);
    PyObject *a = r.a_is_pos ? PyLong_FromUnsignedLongLong(r.a_pos) : PyLong_FromLongLong(r.a);
    PyObject *b = PyLong_FromUnsignedLongLong(r.b_pos);
    if (a == NULL || b == NULL) { Py_XDECREF(a); Py_XDECREF(b); return NULL; }
    return Py_BuildValue("(iLNN)", r.kind, (long long)r.record, a, b);
}

/* ---------------------------------------------------------------- the producer's record encoder
 *
 * put_record writes one v2 record: length, attributes (0), timestamp delta, offset delta, key,
 * value (a null one as length -1), then the headers (already encoded, b"\x00" for none). The
 * same bytes as storage/record_batch.py's _PyRecordsWriter, the reference.
 */
static inline int varint_size(uint64_t z) {
    int n = 1;
    while (z >= 0x80) { z >>= 7; n++; }
    return n;
}

static inline uint64_t zigzag(int64_t v) { return ((uint64_t)v << 1) ^ (uint64_t)(v >> 63); }

static inline char *put_varint(char *out, uint64_t z) {
    while (z >= 0x80) { *out++ = (char)((z & 0x7f) | 0x80); z >>= 7; }
    *out++ = (char)z;
    return out;
}

/* Encodes one record onto ``buf``; its size, or -1 with an exception set (memory). */
static Py_ssize_t put_record(PyObject *buf, long long ts_delta, long long offset_delta, PyObject *key,
                             PyObject *value, const char *headers, Py_ssize_t headers_len) {
    Py_ssize_t key_len = key == Py_None ? -1 : PyBytes_GET_SIZE(key);
    Py_ssize_t value_len = value == Py_None ? -1 : PyBytes_GET_SIZE(value);
    uint64_t z_ts = zigzag(ts_delta), z_od = zigzag(offset_delta);
    uint64_t z_key = zigzag(key_len), z_value = zigzag(value_len);
    Py_ssize_t body = 1 + varint_size(z_ts) + varint_size(z_od) + varint_size(z_key) + (key_len > 0 ? key_len : 0)
        + varint_size(z_value) + (value_len > 0 ? value_len : 0) + headers_len;
    uint64_t z_body = zigzag(body);
    Py_ssize_t total = varint_size(z_body) + body;
    Py_ssize_t old = PyByteArray_GET_SIZE(buf);
    if (total > PY_SSIZE_T_MAX - old) { PyErr_NoMemory(); return -1; }
    if (PyByteArray_Resize(buf, old + total) < 0) return -1;
    char *out = PyByteArray_AS_STRING(buf) + old;
    out = put_varint(out, z_body);
    *out++ = 0;  /* attributes */
    out = put_varint(out, z_ts);
    out = put_varint(out, z_od);
    out = put_varint(out, z_key);
    if (key_len > 0) { memcpy(out, PyBytes_AS_STRING(key), (size_t)key_len); out += key_len; }
    out = put_varint(out, z_value);
    if (value_len > 0) { memcpy(out, PyBytes_AS_STRING(value), (size_t)value_len); out += value_len; }
    memcpy(out, headers, (size_t)headers_len);
    return total;
}

/* ---- RecordFutureBase: the fields of the producer's per-record future (client/accumulator.py) ----
 *
 * RecordFuture subclasses it (its methods are Python); RecordsWriter.append_future makes one per
 * record without running any Python code. The fields are read-only to Python.
 */
typedef struct {
    PyObject_HEAD
    PyObject *completion;  /* the batch's BatchCompletion */
    Py_ssize_t delta;      /* offset delta in the batch */
    long long timestamp;
    Py_ssize_t key_size, value_size;  /* -1 for a null key or value */
} FutureBase;

static int FutureBase_traverse(FutureBase *self, visitproc visit, void *arg) {
    Py_VISIT(self->completion);
    return 0;
}

static int FutureBase_clear(FutureBase *self) {
    Py_CLEAR(self->completion);
    return 0;
}

static void FutureBase_dealloc(FutureBase *self) {
    PyObject_GC_UnTrack(self);
    Py_CLEAR(self->completion);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *FutureBase_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"completion", "delta", "timestamp", "key_size", "value_size", NULL};
    PyObject *completion;
    Py_ssize_t delta, key_size, value_size;
    long long timestamp;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OnLnn", kwlist, &completion, &delta, &timestamp, &key_size,
                                     &value_size))
        return NULL;
    FutureBase *self = (FutureBase *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->completion = Py_NewRef(completion);
    self->delta = delta;
    self->timestamp = timestamp;
    self->key_size = key_size;
    self->value_size = value_size;
    return (PyObject *)self;
}

static PyMemberDef FutureBase_members[] = {
    {"_completion", T_OBJECT_EX, offsetof(FutureBase, completion), READONLY, NULL},
    {"_delta", T_PYSSIZET, offsetof(FutureBase, delta), READONLY, NULL},
    {"_timestamp", T_LONGLONG, offsetof(FutureBase, timestamp), READONLY, NULL},
    {"_key_size", T_PYSSIZET, offsetof(FutureBase, key_size), READONLY, NULL},
    {"_value_size", T_PYSSIZET, offsetof(FutureBase, value_size), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject FutureBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "storage._record_walk.RecordFutureBase",
    .tp_basicsize = sizeof(FutureBase),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "RecordFutureBase(completion, delta, timestamp, key_size, value_size): a produced record's future",
    .tp_traverse = (traverseproc)FutureBase_traverse,
    .tp_clear = (inquiry)FutureBase_clear,
    .tp_dealloc = (destructor)FutureBase_dealloc,
    .tp_new = FutureBase_new,
    .tp_members = FutureBase_members,
};

/* ---- RecordsWriter: the records section of a batch being built ----
 *
 * RecordBatchBuilder's state (storage/record_batch.py; _PyRecordsWriter there is the reference):
 * the encoded records, their count, the first and the largest timestamp, and the size of the
 * batch if it were built now. take() hands the records over once; appends after it are refused.
 */
#define MAX_RECORDS 2147483647  /* MAX_RECORDS_PER_BATCH */

typedef struct {
    PyObject_HEAD
    PyObject *buf;  /* bytearray; NULL once taken */
    Py_ssize_t count;
    long long base_ts, max_ts;
    Py_ssize_t size;
} Writer;

static void Writer_dealloc(Writer *self) {
    Py_XDECREF(self->buf);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Writer_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"size", NULL};
    Py_ssize_t size;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "n", kwlist, &size)) return NULL;
    Writer *self = (Writer *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->buf = PyByteArray_FromStringAndSize(NULL, 0);
    if (self->buf == NULL) { Py_DECREF(self); return NULL; }
    self->count = 0;
    self->base_ts = self->max_ts = -1;  /* NO_TIMESTAMP */
    self->size = size;
    return (PyObject *)self;
}

/* The offset delta and the timestamp delta of the next record at ``ts``; 0, or -1 when it cannot be
 * appended (taken, full, or a delta beyond a varlong) with nothing changed and no exception set. */
static int next_deltas(Writer *self, long long ts, long long *offset_delta, long long *ts_delta) {
    if (self->buf == NULL || self->count >= MAX_RECORDS) return -1;
    *offset_delta = self->count;
    *ts_delta = 0;
    if (self->count > 0 && __builtin_sub_overflow(ts, self->base_ts, ts_delta)) return -1;
    return 0;
}

static void appended(Writer *self, long long ts, Py_ssize_t n) {
    if (self->count == 0) self->base_ts = self->max_ts = ts;
    else if (ts > self->max_ts) self->max_ts = ts;
    self->count++;
    self->size += n;
}

/* append(timestamp, key, value, headers) -> offset delta. key and value bytes or None, headers the
 * encoded headers (b"\x00" for none). OverflowError (nothing written) for a timestamp or delta
 * beyond a varlong; ValueError once taken or full. */
static PyObject *Writer_append(Writer *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "append(timestamp, key, value, headers)");
        return NULL;
    }
    PyObject *key = args[1], *value = args[2], *headers = args[3];
    if (!PyBytes_CheckExact(headers) || (key != Py_None && !PyBytes_CheckExact(key))
            || (value != Py_None && !PyBytes_CheckExact(value))) {
        PyErr_SetString(PyExc_TypeError, "append: key and value must be bytes or None, headers bytes");
        return NULL;
    }
    int overflow = 0;
    long long ts = PyLong_AsLongLongAndOverflow(args[0], &overflow);
    if (overflow == 0 && ts == -1 && PyErr_Occurred()) return NULL;
    if (self->buf == NULL || self->count >= MAX_RECORDS) {
        PyErr_SetString(PyExc_ValueError, self->buf == NULL ? "the records were taken" : "the batch is full");
        return NULL;
    }
    long long offset_delta, ts_delta;
    if (overflow || next_deltas(self, ts, &offset_delta, &ts_delta) < 0) {
        PyErr_SetString(PyExc_OverflowError, "append: the timestamp delta does not fit a varlong");
        return NULL;
    }
    Py_ssize_t n = put_record(self->buf, ts_delta, offset_delta, key, value, PyBytes_AS_STRING(headers),
                              PyBytes_GET_SIZE(headers));
    if (n < 0) return NULL;
    appended(self, ts, n);
    return PyLong_FromLongLong(offset_delta);
}

/* append_future(future_type, completion, timestamp, key, value) -> future, or None.
 *
 * The producer's hot path: appends a record without headers and returns
 * future_type(completion, delta, timestamp, key_size, value_size) (a RecordFutureBase subclass),
 * made without running Python code. timestamp None is now (milliseconds since the epoch). None,
 * with nothing changed, where the record needs the builder's own append to get its error or
 * conversion: a key or value other than bytes or None, a timestamp or delta beyond a varlong,
 * records taken or full. */
static PyObject *Writer_append_future(Writer *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "append_future(future_type, completion, timestamp, key, value)");
        return NULL;
    }
    PyObject *type = args[0], *completion = args[1], *timestamp = args[2], *key = args[3], *value = args[4];
    if (!PyType_Check(type) || !PyType_IsSubtype((PyTypeObject *)type, &FutureBaseType)) {
        PyErr_SetString(PyExc_TypeError, "append_future: future_type must subclass RecordFutureBase");
        return NULL;
    }
    if ((key != Py_None && !PyBytes_CheckExact(key)) || (value != Py_None && !PyBytes_CheckExact(value)))
        Py_RETURN_NONE;
    long long ts;
    if (timestamp == Py_None) {
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        ts = (long long)now.tv_sec * 1000 + now.tv_nsec / 1000000;
    } else {
        int overflow = 0;
        ts = PyLong_AsLongLongAndOverflow(timestamp, &overflow);
        if (overflow == 0 && ts == -1 && PyErr_Occurred()) return NULL;
        if (overflow) Py_RETURN_NONE;
    }
    long long offset_delta, ts_delta;
    if (next_deltas(self, ts, &offset_delta, &ts_delta) < 0) Py_RETURN_NONE;
    FutureBase *f = (FutureBase *)((PyTypeObject *)type)->tp_alloc((PyTypeObject *)type, 0);
    if (f == NULL) return NULL;
    Py_ssize_t n = put_record(self->buf, ts_delta, offset_delta, key, value, "\0", 1);
    if (n < 0) { Py_DECREF(f); return NULL; }
    appended(self, ts, n);
    f->completion = Py_NewRef(completion);
    f->delta = (Py_ssize_t)offset_delta;
    f->timestamp = ts;
    f->key_size = key == Py_None ? -1 : PyBytes_GET_SIZE(key);
    f->value_size = value == Py_None ? -1 : PyBytes_GET_SIZE(value);
    return (PyObject *)f;
}

/* take() -> (records, count, base_ts, max_ts): the records, once; appends are refused after. */
static PyObject *Writer_take(Writer *self, PyObject *Py_UNUSED(ignored)) {
    if (self->buf == NULL) {
        PyErr_SetString(PyExc_ValueError, "the records were taken");
        return NULL;
    }
    PyObject *out = Py_BuildValue("(OnLL)", self->buf, self->count, self->base_ts, self->max_ts);
    if (out == NULL) return NULL;
    Py_CLEAR(self->buf);
    return out;
}

static PyMethodDef Writer_methods[] = {
    {"append", (PyCFunction)(void (*)(void))Writer_append, METH_FASTCALL,
     "append(timestamp, key, value, headers) -> offset delta"},
    {"append_future", (PyCFunction)(void (*)(void))Writer_append_future, METH_FASTCALL,
     "append_future(future_type, completion, timestamp, key, value) -> future or None"},
    {"take", (PyCFunction)Writer_take, METH_NOARGS, "take() -> (records, count, base_ts, max_ts)"},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Writer_members[] = {
    {"count", T_PYSSIZET, offsetof(Writer, count), READONLY, "records appended"},
    {"size", T_PYSSIZET, offsetof(Writer, size), READONLY, "the batch's size if built now, uncompressed"},
    {"base_ts", T_LONGLONG, offsetof(Writer, base_ts), READONLY, "the first record's timestamp (-1: none yet)"},
    {"max_ts", T_LONGLONG, offsetof(Writer, max_ts), READONLY, "the largest timestamp (-1: none yet)"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject WriterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "storage._record_walk.RecordsWriter",
    .tp_basicsize = sizeof(Writer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "RecordsWriter(size): the records of a batch being built (size: its header's bytes)",
    .tp_dealloc = (destructor)Writer_dealloc,
    .tp_new = Writer_new,
    .tp_methods = Writer_methods,
    .tp_members = Writer_members,
};

static PyMethodDef methods[] = {
    {"walk", walk, METH_VARARGS,
     "walk(buf, start, end, count, compact) -> (kind, record, a, b, min_ts_delta, max_ts_delta)"},
    {"decode_records", decode_records, METH_VARARGS,
     "decode_records(cls, buf, start, end, count, base_offset, base_ts, log_append_ts, topic, partition, "
     "ts_type) -> (records, increasing) | (kind, record, a, b)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_record_walk", NULL, -1, methods};

PyMODINIT_FUNC PyInit__record_walk(void) {
    if (PyType_Ready(&FutureBaseType) < 0 || PyType_Ready(&WriterType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "RecordFutureBase", (PyObject *)&FutureBaseType) < 0
            || PyModule_AddObjectRef(m, "RecordsWriter", (PyObject *)&WriterType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
