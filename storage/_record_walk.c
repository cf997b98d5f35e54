/* storage._record_walk: the compiled record walk of LogValidator, the consumer's
 * compiled record decoder (decode_records, further down), the producer's record
 * encoder (RecordsWriter, with RecordFutureBase) and its send() fast path (murmur2, Appender,
 * at the end).
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
    VARINT_OVERFLOW = 14, VARINT_TOO_LONG = 15, RECORD_ATTRIBUTES = 16, VARINT32 = 17, HEADER_KEY_NUL = 18
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

/* An int32 zigzag varint at *p: at most 5 bytes, within int32 (Kafka's readVarint); every record
 * field but the timestamp delta is one. 0 on success; TRUNCATED or VARINT32. */
static inline int read_varint32(const uint8_t *d, uint64_t n, uint64_t *p, int64_t *out, uint64_t *err_pos) {
    uint64_t pos = *p;
    uint64_t raw = 0;
    for (int i = 0; i < 5; i++) {
        if (pos + i >= n) return TRUNCATED;
        uint8_t b = d[pos + i];
        raw |= (uint64_t)(b & 0x7F) << (7 * i);
        if (b < 0x80) {
            if (raw >> 32) { *err_pos = pos; return VARINT32; }
            *out = (int64_t)((raw >> 1) ^ (~(raw & 1) + 1));
            *p = pos + i + 1;
            return 0;
        }
    }
    *err_pos = pos;
    return VARINT32;
}

/* Skip `len` (>= 0) bytes: positions stay exact (no clamping), as Python ints would. */
static inline uint64_t skip(uint64_t p, int64_t len) { return p + (uint64_t)len; }

static int walk_headers(const uint8_t *d, uint64_t n, uint64_t *pp, uint64_t rec_end, result_t *r) {
    uint64_t p = *pp, err_pos = 0;
    int64_t hcount;
    int e = read_varint32(d, n, &p, &hcount, &err_pos);
    if (e) { r->kind = e; r->a_pos = err_pos; r->a_is_pos = 1; return 1; }  /* TRUNCATED: a = 0 */
    /* Python: hcount < 0 or hcount * 2 > rec_end - p (rec_end - p may be negative). */
    if (hcount < 0 || p > rec_end || (uint64_t)hcount > (rec_end - p) / 2) {
        r->kind = HEADER_COUNT; r->a = hcount; return 1;
    }
    for (int64_t h = 0; h < hcount; h++) {
        int64_t kl, vl;
        e = read_varint32(d, n, &p, &kl, &err_pos);
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
        /* librdkafka's clients take a header key as a C string: a NUL cuts it there. */
        if (kl > 0 && memchr(d + p, 0, (size_t)kl) != NULL) { r->kind = HEADER_KEY_NUL; return 1; }
        p += (uint64_t)kl;
        e = read_varint32(d, n, &p, &vl, &err_pos);
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
    /* One- and two-byte varints (nearly every length and delta) inline; `reader` otherwise: read_varint for
     * the timestamp delta (a varlong), read_varint32 for every other field (at most 5 bytes, within int32). */
#define READ_WITH(reader, out) do { \
        if (p < n && d[p] < 0x80) { uint8_t z_ = d[p++]; (out) = (int64_t)(z_ >> 1) ^ -(int64_t)(z_ & 1); break; } \
        if (p + 1 < n && d[p + 1] < 0x80) { \
            uint32_t z_ = (uint32_t)(d[p] & 0x7F) | ((uint32_t)d[p + 1] << 7); p += 2; \
            (out) = (int64_t)(z_ >> 1) ^ -(int64_t)(z_ & 1); break; } \
        e = reader(d, n, &p, &(out), &err_pos); \
        if (e) { r->kind = e; r->record = i; if (e != TRUNCATED) { r->a_pos = err_pos; r->a_is_pos = 1; } \
                 return 0; } } while (0)
#define READ(out) READ_WITH(read_varint, out)
#define READ32(out) READ_WITH(read_varint32, out)
    for (i = 0; i < count; i++) {
        int64_t length, ts_delta, kl, vl;
        if (p >= n) { r->kind = COUNT_SHORT; r->record = i; return 0; }
        READ32(length);
        uint64_t rec_end = skip(p, length < 0 ? 0 : length);
        if (length < 6 || rec_end > n) {
            r->kind = BAD_LENGTH; r->record = i; r->a = length; r->b_pos = n - p; return 0;
        }
        /* record attributes: unused in v2, and read differently by clients when not 0 */
        if (d[p]) { r->kind = RECORD_ATTRIBUTES; r->record = i; r->a = d[p]; return 0; }
        p += 1;
        READ(ts_delta);
        if (ts_delta > max_delta) max_delta = ts_delta;
        if (ts_delta < min_delta) min_delta = ts_delta;
        if (p < n && d[p] == (uint64_t)i << 1 && d[p] < 0x80) {
            p += 1;
        } else {
            READ32(v);
            if (v != i) { r->kind = OFFSET_DELTA; r->record = i; r->a = v; return 0; }
        }
        READ32(kl);
        if (kl >= 0) p = skip(p, kl);
        else if (kl != -1) { r->kind = KEY_LENGTH; r->record = i; r->a = kl; return 0; }
        else if (compact) { r->kind = NO_KEY; r->record = i; return 0; }
        READ32(vl);
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
#undef READ32
#undef READ_WITH
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

/* ---- murmur2: Kafka's default partitioner hash (client/partitioner.py murmur2 is the reference) ---- */

static int32_t murmur2_of(const uint8_t *d, Py_ssize_t n) {
    const uint32_t m = 0x5bd1e995u;
    uint32_t h = 0x9747b28cu ^ (uint32_t)n;
    Py_ssize_t blocks = n >> 2;
    for (Py_ssize_t i = 0; i < blocks; i++) {
        const uint8_t *b = d + (i << 2);
        uint32_t k = (uint32_t)b[0] | ((uint32_t)b[1] << 8) | ((uint32_t)b[2] << 16) | ((uint32_t)b[3] << 24);
        k *= m;
        k ^= k >> 24;
        k *= m;
        h *= m;
        h ^= k;
    }
    const uint8_t *tail = d + (blocks << 2);
    switch (n & 3) {
        case 3: h ^= (uint32_t)tail[2] << 16; /* fall through */
        case 2: h ^= (uint32_t)tail[1] << 8;  /* fall through */
        case 1: h ^= (uint32_t)tail[0]; h *= m;
    }
    h ^= h >> 13;
    h *= m;
    h ^= h >> 15;
    return (int32_t)h;
}

/* murmur2(data) -> the signed 32-bit hash Kafka's Utils.murmur2 gives for ``data`` (a bytes-like object). */
static PyObject *murmur2(PyObject *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    int32_t h = murmur2_of((const uint8_t *)view.buf, view.len);
    PyBuffer_Release(&view);
    return PyLong_FromLong((long)h);
}

/* ---- Appender: the producer's send() of an ordinary record in one call ----
 *
 * client/producer.py send() and client/accumulator.py append() are the reference; this is their
 * common case without the interpreter: a key and value that are bytes or None, no headers, the
 * caller's partition or the default partitioner's (KIP-480 sticky for keyless records, murmur2 of
 * the key otherwise), appended to the partition's open batch while it has room. Anything else (no open
 * batch, a batch that would fill, buffer memory short, metadata changed, a record too large, a
 * producer closed or failed) returns None having changed nothing, and send() takes the Python path,
 * which names the error, opens batches, moves the sticky partition and refreshes what this reads.
 *
 * State it reads, kept by the Python side: ``open_batches`` (the accumulator's dict, under its
 * lock), ``sticky`` {topic: partition} (the producer's StickyPartitionCache.current) and ``keyed``
 * {topic: (TopicPartition, ...) in partition order}, derived from the metadata snapshot ``meta``
 * (compared with the cluster client's ``_meta`` on every call). ``used_bytes`` is the accumulator's buffer accounting: the
 * accumulator reads and writes it here, under its lock, so both paths count the same bytes.
 */
typedef struct {
    PyObject_HEAD
    PyObject *lock;  /* the accumulator's lock */
    PyObject *acquire, *release;  /* its bound methods */
    PyObject *open_batches, *future_type;
    PyObject *cluster, *meta, *sticky, *keyed;
    PyObject *fallback;  /* the Python send(), called with produce()'s arguments when this path declines */
    Py_ssize_t batch_size, buffer_memory, max_request_size, record_overhead, used_bytes;
    int enabled;
} Appender;

static PyObject *str_meta, *str_size_bytes, *str_append_future, *str_completion, *str_add_delivery_callback;

static int Appender_traverse(Appender *self, visitproc visit, void *arg) {
    Py_VISIT(self->lock);
    Py_VISIT(self->acquire);
    Py_VISIT(self->release);
    Py_VISIT(self->open_batches);
    Py_VISIT(self->future_type);
    Py_VISIT(self->cluster);
    Py_VISIT(self->meta);
    Py_VISIT(self->sticky);
    Py_VISIT(self->keyed);
    Py_VISIT(self->fallback);
    return 0;
}

static int Appender_clear(Appender *self) {
    Py_CLEAR(self->lock);
    Py_CLEAR(self->acquire);
    Py_CLEAR(self->release);
    Py_CLEAR(self->open_batches);
    Py_CLEAR(self->future_type);
    Py_CLEAR(self->cluster);
    Py_CLEAR(self->meta);
    Py_CLEAR(self->sticky);
    Py_CLEAR(self->keyed);
    Py_CLEAR(self->fallback);
    return 0;
}

static void Appender_dealloc(Appender *self) {
    PyObject_GC_UnTrack(self);
    Appender_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Appender_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"lock", "open_batches", "future_type", "batch_size", "buffer_memory",
                             "record_overhead", NULL};
    PyObject *lock, *open_batches, *future_type;
    Py_ssize_t batch_size, buffer_memory, record_overhead;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO!Onnn", kwlist, &lock, &PyDict_Type, &open_batches,
                                     &future_type, &batch_size, &buffer_memory, &record_overhead))
        return NULL;
    if (!PyType_Check(future_type) || !PyType_IsSubtype((PyTypeObject *)future_type, &FutureBaseType)) {
        PyErr_SetString(PyExc_TypeError, "Appender: future_type must subclass RecordFutureBase");
        return NULL;
    }
    Appender *self = (Appender *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->lock = Py_NewRef(lock);
    self->acquire = PyObject_GetAttrString(lock, "acquire");
    self->release = PyObject_GetAttrString(lock, "release");
    self->sticky = PyDict_New();
    self->keyed = PyDict_New();
    if (self->acquire == NULL || self->release == NULL || self->sticky == NULL || self->keyed == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    self->open_batches = Py_NewRef(open_batches);
    self->future_type = Py_NewRef(future_type);
    self->cluster = Py_NewRef(Py_None);
    self->meta = Py_NewRef(Py_None);
    self->fallback = Py_NewRef(Py_None);
    self->batch_size = batch_size;
    self->buffer_memory = buffer_memory;
    self->max_request_size = PY_SSIZE_T_MAX;
    self->record_overhead = record_overhead;
    self->used_bytes = 0;
    self->enabled = 0;  /* until the producer has connected it */
    return (PyObject *)self;
}

/* The open batch's record, appended with the lock held: the future, None (declined, nothing
 * changed) or NULL (an exception). */
static PyObject *append_locked(Appender *self, PyObject *tp, PyObject *timestamp, PyObject *key, PyObject *value,
                               Py_ssize_t size) {
    PyObject *batch = PyDict_GetItemWithError(self->open_batches, tp);
    if (batch == NULL) {
        if (PyErr_Occurred()) return NULL;
        Py_RETURN_NONE;  /* no open batch: the Python path opens one (or moves the sticky partition) */
    }
    Py_INCREF(batch);
    PyObject *out = NULL, *append_future = NULL, *completion = NULL, *reserved = NULL;
    reserved = PyObject_GetAttr(batch, str_size_bytes);
    if (reserved == NULL) goto done;
    Py_ssize_t batch_bytes = PyLong_AsSsize_t(reserved);
    if (batch_bytes == -1 && PyErr_Occurred()) goto done;
    /* The record that fills the batch, and buffer memory that would have to be waited for, are the
     * Python path's (it closes the batch, wakes the sender, blocks for memory). */
    if (batch_bytes + size >= self->batch_size || self->used_bytes + size > self->buffer_memory) {
        out = Py_NewRef(Py_None);
        goto done;
    }
    /* The batch's compiled writer, as its bound append_future (None once built, or the Python writer's). */
    append_future = PyObject_GetAttr(batch, str_append_future);
    if (append_future == NULL) goto done;
    PyObject *writer = PyCFunction_Check(append_future) ? PyCFunction_GET_SELF(append_future) : NULL;
    if (writer == NULL || !PyObject_TypeCheck(writer, &WriterType)) {
        out = Py_NewRef(Py_None);
        goto done;
    }
    completion = PyObject_GetAttr(batch, str_completion);
    if (completion == NULL) goto done;
    PyObject *call[5] = {self->future_type, completion, timestamp, key, value};
    out = Writer_append_future((Writer *)writer, call, 5);
    if (out == NULL || out == Py_None) goto done;
    PyObject *grown = PyLong_FromSsize_t(batch_bytes + size);
    if (grown == NULL || PyObject_SetAttr(batch, str_size_bytes, grown) < 0) {
        /* The record is in the batch: cannot be taken back. Memory only; fail the producer's call. */
        Py_XDECREF(grown);
        Py_CLEAR(out);
        goto done;
    }
    Py_DECREF(grown);
    self->used_bytes += size;
done:
    Py_XDECREF(reserved);
    Py_XDECREF(append_future);
    Py_XDECREF(completion);
    Py_DECREF(batch);
    return out;
}

/* keyed[topic][partition] when that is the topic's partition ``partition`` (an int), borrowed; NULL
 * otherwise, with an exception set only if the comparison raised. */
static PyObject *partition_at(Appender *self, PyObject *topic, PyObject *partition) {
    PyObject *parts = PyDict_GetItemWithError(self->keyed, topic);
    if (parts == NULL || !PyTuple_CheckExact(parts) || !PyLong_CheckExact(partition)) return NULL;
    Py_ssize_t p = PyLong_AsSsize_t(partition);
    if (p == -1 && PyErr_Occurred()) {
        PyErr_Clear();  /* beyond any partition: the Python path says so */
        return NULL;
    }
    if (p < 0 || p >= PyTuple_GET_SIZE(parts)) return NULL;
    PyObject *candidate = PyTuple_GET_ITEM(parts, p);
    if (!PyTuple_Check(candidate) || PyTuple_GET_SIZE(candidate) != 2) return NULL;
    int eq = PyObject_RichCompareBool(PyTuple_GET_ITEM(candidate, 1), partition, Py_EQ);
    return eq > 0 ? candidate : NULL;
}

/* send(topic, key, value, timestamp[, partition]) -> the record's future, or None for the Python path. */
static PyObject *Appender_send(Appender *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 && nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "send(topic, key, value, timestamp[, partition])");
        return NULL;
    }
    PyObject *topic = args[0], *key = args[1], *value = args[2], *timestamp = args[3];
    PyObject *partition = nargs == 5 ? args[4] : Py_None;
    if (!self->enabled || (key != Py_None && !PyBytes_CheckExact(key))
            || (value != Py_None && !PyBytes_CheckExact(value))
            || (timestamp != Py_None && !PyLong_CheckExact(timestamp)) || !PyUnicode_CheckExact(topic)
            || (partition != Py_None && !PyLong_CheckExact(partition)))
        Py_RETURN_NONE;
    PyObject *meta = PyObject_GetAttr(self->cluster, str_meta);
    if (meta == NULL) return NULL;
    int same = meta == self->meta;
    Py_DECREF(meta);
    if (!same) Py_RETURN_NONE;  /* metadata changed: the Python path refreshes what is derived from it */
    PyObject *tp;  /* borrowed from keyed */
    if (partition != Py_None) {  /* the caller's partition, if the topic has it (else the Python path's error) */
        tp = partition_at(self, topic, partition);
    } else if (key == Py_None) {  /* the sticky partition, as the producer's StickyPartitionCache has it */
        PyObject *sticky = PyDict_Check(self->sticky) ? PyDict_GetItemWithError(self->sticky, topic) : NULL;
        tp = sticky == NULL ? NULL : partition_at(self, topic, sticky);
    } else {
        PyObject *parts = PyDict_GetItemWithError(self->keyed, topic);
        tp = NULL;
        if (parts != NULL && PyTuple_CheckExact(parts) && PyTuple_GET_SIZE(parts) > 0) {
            int32_t h = murmur2_of((const uint8_t *)PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key));
            tp = PyTuple_GET_ITEM(parts, (Py_ssize_t)((uint32_t)h & 0x7fffffffu) % PyTuple_GET_SIZE(parts));
        }
    }
    if (tp == NULL) {
        if (PyErr_Occurred()) return NULL;
        Py_RETURN_NONE;
    }
    Py_ssize_t key_len = key == Py_None ? 0 : PyBytes_GET_SIZE(key);
    Py_ssize_t value_len = value == Py_None ? 0 : PyBytes_GET_SIZE(value);
    Py_ssize_t size = self->record_overhead + key_len + value_len;
    if (size > self->max_request_size || size > self->buffer_memory) Py_RETURN_NONE;  /* the Python path's error */
    Py_INCREF(tp);
    PyObject *got = PyObject_CallNoArgs(self->acquire);
    if (got == NULL) { Py_DECREF(tp); return NULL; }
    Py_DECREF(got);
    PyObject *out = append_locked(self, tp, timestamp, key, value, size);
    Py_DECREF(tp);
    /* Release whatever happened; an exception from the append stays the one raised. */
    PyObject *exc_type, *exc_value, *exc_tb;
    PyErr_Fetch(&exc_type, &exc_value, &exc_tb);
    PyObject *released = PyObject_CallNoArgs(self->release);
    if (released == NULL) {
        Py_XDECREF(out);
        Py_XDECREF(exc_type);
        Py_XDECREF(exc_value);
        Py_XDECREF(exc_tb);
        return NULL;
    }
    Py_DECREF(released);
    PyErr_Restore(exc_type, exc_value, exc_tb);
    return out;
}

static const char *const produce_names[] = {"topic", "value", "key", "headers", "partition", "timestamp",
                                            "on_delivery"};
enum { P_TOPIC, P_VALUE, P_KEY, P_HEADERS, P_PARTITION, P_TIMESTAMP, P_ON_DELIVERY, P_COUNT };

/* produce(topic, value=None, key=None, headers=None, partition=None, timestamp=None, *, on_delivery=None):
 * Producer.send's signature. The record goes by send() above when it can (then on_delivery is added
 * to its future, as the Python send() does); otherwise (headers, anything send() declines,
 * arguments it does not recognise) the call is handed unchanged to ``fallback``, the
 * Python send(), which also raises any argument error. */
static PyObject *Appender_produce(Appender *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *a[P_COUNT] = {NULL, Py_None, Py_None, Py_None, Py_None, Py_None, Py_None};
    int usable = nargs >= 1 && nargs <= P_ON_DELIVERY;
    for (Py_ssize_t i = 0; usable && i < nargs; i++) a[i] = args[i];
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t k = 0; usable && k < nkw; k++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, k);
        int slot = -1;
        for (int j = 0; j < P_COUNT; j++) {
            if (PyUnicode_CompareWithASCIIString(name, produce_names[j]) == 0) { slot = j; break; }
        }
        if (slot < 0 || (slot < nargs && slot != P_ON_DELIVERY)) usable = 0;  /* unknown or given twice */
        else a[slot] = args[nargs + k];
    }
    if (usable && a[P_TOPIC] != NULL && a[P_HEADERS] == Py_None) {
        PyObject *call[5] = {a[P_TOPIC], a[P_KEY], a[P_VALUE], a[P_TIMESTAMP], a[P_PARTITION]};
        PyObject *future = Appender_send(self, call, 5);
        if (future == NULL) return NULL;
        if (future != Py_None) {
            if (a[P_ON_DELIVERY] != Py_None) {  /* as the Python send(): the record is queued, then the callback */
                PyObject *added = PyObject_CallMethodOneArg(future, str_add_delivery_callback, a[P_ON_DELIVERY]);
                if (added == NULL) { Py_DECREF(future); return NULL; }
                Py_DECREF(added);
            }
            return future;
        }
        Py_DECREF(future);
    }
    return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
}

static PyMethodDef Appender_methods[] = {
    {"send", (PyCFunction)(void (*)(void))Appender_send, METH_FASTCALL,
     "send(topic, key, value, timestamp[, partition]) -> the record's future, or None for the Python path"},
    {"produce", (PyCFunction)(void (*)(void))Appender_produce, METH_FASTCALL | METH_KEYWORDS,
     "produce($self, /, topic, value=None, key=None, headers=None, partition=None, timestamp=None, *, "
     "on_delivery=None)\n--\n\n"
     "Producer.send: queue one record, return its future (by send() where it can, else by fallback)."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Appender_members[] = {
    {"used_bytes", T_PYSSIZET, offsetof(Appender, used_bytes), 0, "buffer memory reserved (the accumulator's)"},
    {"enabled", T_INT, offsetof(Appender, enabled), 0, "0: every send takes the Python path"},
    {"max_request_size", T_PYSSIZET, offsetof(Appender, max_request_size), 0, "max.request.size"},
    {"cluster", T_OBJECT_EX, offsetof(Appender, cluster), 0, "the cluster client (its _meta is compared)"},
    {"fallback", T_OBJECT_EX, offsetof(Appender, fallback), 0, "the Python send() produce() hands over to"},
    {"meta", T_OBJECT_EX, offsetof(Appender, meta), 0, "the metadata snapshot sticky and keyed derive from"},
    {"sticky", T_OBJECT_EX, offsetof(Appender, sticky), 0, "{topic: partition} for keyless records"},
    {"keyed", T_OBJECT_EX, offsetof(Appender, keyed), READONLY, "{topic: (TopicPartition, ...)} for keyed records"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject AppenderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "storage._record_walk.Appender",
    .tp_basicsize = sizeof(Appender),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Appender(lock, open_batches, future_type, batch_size, buffer_memory, record_overhead): "
              "the producer's send() of an ordinary record",
    .tp_traverse = (traverseproc)Appender_traverse,
    .tp_clear = (inquiry)Appender_clear,
    .tp_dealloc = (destructor)Appender_dealloc,
    .tp_new = Appender_new,
    .tp_methods = Appender_methods,
    .tp_members = Appender_members,
};

static PyMethodDef methods[] = {
    {"walk", walk, METH_VARARGS,
     "walk(buf, start, end, count, compact) -> (kind, record, a, b, min_ts_delta, max_ts_delta)"},
    {"decode_records", decode_records, METH_VARARGS,
     "decode_records(cls, buf, start, end, count, base_offset, base_ts, log_append_ts, topic, partition, "
     "ts_type) -> (records, increasing) | (kind, record, a, b)"},
    {"murmur2", murmur2, METH_O, "murmur2(data) -> Kafka's signed 32-bit murmur2 hash of data"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_record_walk", NULL, -1, methods};

PyMODINIT_FUNC PyInit__record_walk(void) {
    if (PyType_Ready(&FutureBaseType) < 0 || PyType_Ready(&WriterType) < 0 || PyType_Ready(&AppenderType) < 0)
        return NULL;
    str_meta = PyUnicode_InternFromString("_meta");
    str_size_bytes = PyUnicode_InternFromString("size_bytes");
    str_append_future = PyUnicode_InternFromString("append_future");
    str_completion = PyUnicode_InternFromString("completion");
    str_add_delivery_callback = PyUnicode_InternFromString("add_delivery_callback");
    if (str_meta == NULL || str_size_bytes == NULL || str_append_future == NULL || str_completion == NULL
            || str_add_delivery_callback == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "RecordFutureBase", (PyObject *)&FutureBaseType) < 0
            || PyModule_AddObjectRef(m, "RecordsWriter", (PyObject *)&WriterType) < 0
            || PyModule_AddObjectRef(m, "Appender", (PyObject *)&AppenderType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
