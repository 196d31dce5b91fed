/* Optional native helpers for capture's per-change path (built by setup.py when a C compiler is
 * present; headrace falls back to the pure-Python code, with the same results, when it is not).
 *
 * decode_tuple: a pgoutput TupleData into a tuple of str / None / the UNCHANGED marker
 *               (headrace.source.postgres.pgoutput._tuple).
 * encode_object: a row's values as a JSON object with precomputed keys, escaped exactly as
 *               json.dumps(..., ensure_ascii=False) escapes (headrace.log.codec.RowEncoder.encode).
 * stage_change: a pgoutput INSERT/UPDATE/DELETE message straight to its staged row (the _data and
 *               _old_key JSON) in a StagingBuffer, with no Python value per column
 *               (headrace.source.postgres.pgoutput.UNDECODED, used by headrace.capture.buffer.stage).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* decode_tuple(buf: bytes, pos: int, unchanged: object) -> (tuple, int) | None
 * None means "not for me" (a binary 'b' value or an unknown kind): the caller's Python code then
 * decodes the message and raises the right error. Truncation raises ValueError. */
static PyObject *decode_tuple(PyObject *self, PyObject *args) {
    const char *buf;
    Py_ssize_t len, pos;
    PyObject *unchanged;
    if (!PyArg_ParseTuple(args, "y#nO", &buf, &len, &pos, &unchanged))
        return NULL;
    if (pos < 0 || pos + 2 > len) {
        PyErr_SetString(PyExc_ValueError, "tuple header past the end of the message");
        return NULL;
    }
    const unsigned char *b = (const unsigned char *)buf;
    Py_ssize_t ncols = ((Py_ssize_t)b[pos] << 8) | b[pos + 1];
    pos += 2;
    PyObject *values = PyTuple_New(ncols);
    if (values == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < ncols; i++) {
        if (pos >= len)
            goto truncated;
        unsigned char kind = b[pos];
        PyObject *value;
        if (kind == 't') {
            if (pos + 5 > len)
                goto truncated;
            int32_t n = (int32_t)(((uint32_t)b[pos + 1] << 24) | ((uint32_t)b[pos + 2] << 16) |
                                  ((uint32_t)b[pos + 3] << 8) | (uint32_t)b[pos + 4]);
            pos += 5;
            if (n < 0 || pos + n > len)
                goto truncated;
            value = PyUnicode_DecodeUTF8(buf + pos, n, "strict");
            if (value == NULL) {
                Py_DECREF(values);
                return NULL;
            }
            pos += n;
        } else if (kind == 'n') {
            value = Py_None;
            Py_INCREF(value);
            pos += 1;
        } else if (kind == 'u') {
            value = unchanged;
            Py_INCREF(value);
            pos += 1;
        } else {
            Py_DECREF(values);
            Py_RETURN_NONE;
        }
        PyTuple_SET_ITEM(values, i, value);
    }
    return Py_BuildValue("(Nn)", values, pos);
truncated:
    Py_DECREF(values);
    PyErr_SetString(PyExc_ValueError, "tuple value past the end of the message");
    return NULL;
}

/* A growable UTF-8 byte buffer. */
typedef struct {
    char *data;
    Py_ssize_t len, cap;
} Out;

static int out_reserve(Out *o, Py_ssize_t more) {
    if (o->len + more <= o->cap)
        return 0;
    Py_ssize_t cap = o->cap * 2;
    if (cap < o->len + more)
        cap = o->len + more;
    char *data = PyMem_Realloc(o->data, cap);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    o->data = data;
    o->cap = cap;
    return 0;
}

static int out_put(Out *o, const char *s, Py_ssize_t n) {
    if (out_reserve(o, n) < 0)
        return -1;
    memcpy(o->data + o->len, s, n);
    o->len += n;
    return 0;
}

/* A JSON string literal of the UTF-8 bytes s, as json's encode_basestring writes it: '"' and '\'
 * escaped, \b \f \n \r \t by name, other bytes below 0x20 as \u00xx, everything else as is. */
static int out_json_string(Out *o, const char *s, Py_ssize_t n) {
    static const char hex[] = "0123456789abcdef";
    if (out_reserve(o, n + 2) < 0)
        return -1;
    o->data[o->len++] = '"';
    Py_ssize_t run = 0; /* start of the bytes not copied yet */
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\')
            continue;
        if (out_put(o, s + run, i - run) < 0)
            return -1;
        run = i + 1;
        char esc[6] = {'\\', 0, 0, 0, 0, 0};
        Py_ssize_t k = 2;
        switch (c) {
        case '"': esc[1] = '"'; break;
        case '\\': esc[1] = '\\'; break;
        case '\b': esc[1] = 'b'; break;
        case '\f': esc[1] = 'f'; break;
        case '\n': esc[1] = 'n'; break;
        case '\r': esc[1] = 'r'; break;
        case '\t': esc[1] = 't'; break;
        default:
            esc[1] = 'u'; esc[2] = '0'; esc[3] = '0'; esc[4] = hex[c >> 4]; esc[5] = hex[c & 15];
            k = 6;
        }
        if (out_put(o, esc, k) < 0)
            return -1;
    }
    if (out_put(o, s + run, n - run) < 0 || out_put(o, "\"", 1) < 0)
        return -1;
    return 0;
}

/* encode_object(keys: tuple[str, ...], values: tuple | list) -> str | None
 * keys are the object's keys with their colon, already JSON ('"id":'). None when a value is
 * neither str nor None (the UNCHANGED marker): the caller's Python code takes that row. */
static PyObject *encode_object(PyObject *self, PyObject *args) {
    PyObject *keys, *values;
    if (!PyArg_ParseTuple(args, "O!O", &PyTuple_Type, &keys, &values))
        return NULL;
    PyObject *seq = PySequence_Fast(values, "values must be a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(keys);
    if (PySequence_Fast_GET_SIZE(seq) != n) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "a row of %zd values for %zd columns", PySequence_Fast_GET_SIZE(seq), n);
        return NULL;
    }
    PyObject **items = PySequence_Fast_ITEMS(seq);
    Out o = {PyMem_Malloc(256), 0, 256};
    if (o.data == NULL) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    PyObject *result = NULL;
    if (out_put(&o, "{", 1) < 0)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = items[i];
        Py_ssize_t klen, vlen;
        const char *k = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(keys, i), &klen);
        if (k == NULL || (i > 0 && out_put(&o, ",", 1) < 0) || out_put(&o, k, klen) < 0)
            goto done;
        if (v == Py_None) {
            if (out_put(&o, "null", 4) < 0)
                goto done;
        } else if (PyUnicode_CheckExact(v)) {
            const char *s = PyUnicode_AsUTF8AndSize(v, &vlen);
            if (s == NULL) { /* a lone surrogate: let json decide */
                PyErr_Clear();
                result = Py_None;
                Py_INCREF(result);
                goto done;
            }
            if (out_json_string(&o, s, vlen) < 0)
                goto done;
        } else {
            result = Py_None;
            Py_INCREF(result);
            goto done;
        }
    }
    if (out_put(&o, "}", 1) < 0)
        goto done;
    result = PyUnicode_DecodeUTF8(o.data, o.len, "strict");
done:
    PyMem_Free(o.data);
    Py_DECREF(seq);
    return result;
}

/* One value of a TupleData: its kind ('t', 'n' or 'u') and, for 't', its UTF-8 bytes. */
typedef struct {
    unsigned char kind;
    const char *p;
    Py_ssize_t n;
} Val;

/* The TupleData at pos into vals (ncols of them, or -1 when the tuple has another count); the
 * position after it, or -1 for anything unusual (truncated, a 'b' value, another kind). */
static Py_ssize_t parse_values(const char *buf, Py_ssize_t len, Py_ssize_t pos, Val *vals, Py_ssize_t ncols) {
    const unsigned char *b = (const unsigned char *)buf;
    if (pos < 0 || pos + 2 > len || (((Py_ssize_t)b[pos] << 8) | b[pos + 1]) != ncols)
        return -1;
    pos += 2;
    for (Py_ssize_t i = 0; i < ncols; i++) {
        if (pos >= len)
            return -1;
        unsigned char kind = b[pos];
        vals[i].kind = kind;
        if (kind == 't') {
            if (pos + 5 > len)
                return -1;
            int32_t n = (int32_t)(((uint32_t)b[pos + 1] << 24) | ((uint32_t)b[pos + 2] << 16) |
                                  ((uint32_t)b[pos + 3] << 8) | (uint32_t)b[pos + 4]);
            pos += 5;
            if (n < 0 || pos + n > len)
                return -1;
            vals[i].p = buf + pos;
            vals[i].n = n;
            pos += n;
        } else if (kind == 'n' || kind == 'u') {
            pos += 1;
        } else {
            return -1;
        }
    }
    return pos;
}

static int same_value(const Val *a, const Val *b) {
    if (a->kind != b->kind)
        return 0;
    return a->kind != 't' || (a->n == b->n && memcmp(a->p, b->p, a->n) == 0);
}

/* The JSON object of vals[at[i]] under keys[i] (at NULL: vals[i]), 'u' values left out. A new str,
 * or NULL with the error set; *fallback set (no error) when the bytes are not UTF-8. */
static PyObject *json_object(PyObject *keys, const Val *vals, const Py_ssize_t *at, int *fallback) {
    Py_ssize_t n = PyTuple_GET_SIZE(keys);
    Out o = {PyMem_Malloc(256), 0, 256};
    if (o.data == NULL)
        return PyErr_NoMemory();
    PyObject *result = NULL;
    if (out_put(&o, "{", 1) < 0)
        goto done;
    int first = 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        const Val *v = &vals[at == NULL ? i : at[i]];
        if (v->kind == 'u')
            continue;
        Py_ssize_t klen;
        const char *k = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(keys, i), &klen);
        if (k == NULL || (!first && out_put(&o, ",", 1) < 0) || out_put(&o, k, klen) < 0)
            goto done;
        first = 0;
        if (v->kind == 'n' ? out_put(&o, "null", 4) < 0 : out_json_string(&o, v->p, v->n) < 0)
            goto done;
    }
    if (out_put(&o, "}", 1) < 0)
        goto done;
    result = PyUnicode_DecodeUTF8(o.data, o.len, "strict");
    if (result == NULL && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
        PyErr_Clear(); /* not UTF-8: the Python decoder raises the error that names it */
        *fallback = 1;
    }
done:
    PyMem_Free(o.data);
    return result;
}

/* The comma-joined tokens[i] of the 'u' values (buffer's _unchanged_cols); NULL with the error set. */
static PyObject *unchanged_tokens(PyObject *tokens, const Val *vals, Py_ssize_t n) {
    Out o = {PyMem_Malloc(64), 0, 64};
    if (o.data == NULL)
        return PyErr_NoMemory();
    PyObject *result = NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (vals[i].kind != 'u')
            continue;
        Py_ssize_t tlen;
        const char *t = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(tokens, i), &tlen);
        if (t == NULL || (o.len > 0 && out_put(&o, ",", 1) < 0) || out_put(&o, t, tlen) < 0)
            goto done;
    }
    result = PyUnicode_DecodeUTF8(o.data, o.len, "strict");
done:
    PyMem_Free(o.data);
    return result;
}

/* stage_change(msg: bytes, layout: (row_keys, key_keys, key_at, keyless, tokens), columns: tuple of
 *              8 lists, lsn: int, seq: int, ts_us: int, xid: int) -> int | None
 * A pgoutput INSERT, UPDATE or DELETE message staged straight from its bytes, as
 * headrace.capture.buffer.stage stages the decoded event: one row appended to columns (the
 * StagingBuffer's _op, _lsn, _seq, _ts, _xid, _unchanged_cols, _data, _old_key lists); returns the
 * bytes StagingBuffer.append would count for it. row_keys and key_keys are RowEncoder.keys of the
 * row's and the key's columns, key_at the key's positions in the row, keyless true when the table has
 * no key (every column is the key, and an update's old row is its identity), tokens the row's
 * columns as _unchanged_cols lists them (unchanged_token). An unchanged TOAST value ('u') in the new
 * row is left out of _data and named in _unchanged_cols, unless the old row (REPLICA IDENTITY FULL)
 * gives it. None, with nothing appended, leaves the message to the Python path (decode, then stage):
 * a 'u' in the old row, a column count that is not the relation's, text that is not UTF-8, or
 * anything malformed. An eighth argument, at, is where the relation oid starts: 1 (the default), or
 * 5 inside a block of a streamed transaction (protocol 2+), where the subtransaction's xid comes
 * first. */
static PyObject *stage_change_at(PyObject *const *args, Py_ssize_t oid_at);

static PyObject *stage_change(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7 && nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "stage_change(msg: bytes, layout: tuple of 5, columns: tuple of 8 lists, "
                                         "lsn, seq, ts_us, xid[, at])");
        return NULL;
    }
    Py_ssize_t oid_at = 1;
    if (nargs == 8) {
        oid_at = PyLong_AsSsize_t(args[7]);
        if (oid_at == -1 && PyErr_Occurred())
            return NULL;
        if (oid_at != 1 && oid_at != 5) {
            PyErr_SetString(PyExc_ValueError, "stage_change: at must be 1 or 5");
            return NULL;
        }
    }
    return stage_change_at(args, oid_at);
}

/* stage_streamed_change(msg, layout, columns, lsn, seq, ts_us, xid): stage_change with at 5, for the
 * millions of changes of a streamed transaction (a Python wrapper adding the argument cost a third
 * of the call). */
static PyObject *stage_streamed_change(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "stage_streamed_change(msg: bytes, layout: tuple of 5, columns: tuple of 8 "
                                         "lists, lsn, seq, ts_us, xid)");
        return NULL;
    }
    return stage_change_at(args, 5);
}

static PyObject *stage_change_at(PyObject *const *args, Py_ssize_t oid_at) {
    if (!PyBytes_CheckExact(args[0]) || !PyTuple_CheckExact(args[1]) ||
        PyTuple_GET_SIZE(args[1]) != 5 || !PyTuple_CheckExact(args[2]) || PyTuple_GET_SIZE(args[2]) != 8) {
        PyErr_SetString(PyExc_TypeError, "stage_change(msg: bytes, layout: tuple of 5, columns: tuple of 8 lists, "
                                         "lsn, seq, ts_us, xid[, at])");
        return NULL;
    }
    PyObject *layout = args[1], *columns = args[2];
    for (int i = 0; i < 8; i++) {
        if (!PyList_CheckExact(PyTuple_GET_ITEM(columns, i))) {
            PyErr_SetString(PyExc_TypeError, "stage_change: columns must be 8 lists");
            return NULL;
        }
    }
    const char *buf = PyBytes_AS_STRING(args[0]);
    Py_ssize_t len = PyBytes_GET_SIZE(args[0]);
    PyObject *row_keys = PyTuple_GET_ITEM(layout, 0), *key_keys = PyTuple_GET_ITEM(layout, 1);
    PyObject *key_at_obj = PyTuple_GET_ITEM(layout, 2), *tokens = PyTuple_GET_ITEM(layout, 4);
    if (!PyTuple_CheckExact(row_keys) || !PyTuple_CheckExact(key_keys) || !PyTuple_CheckExact(key_at_obj) ||
        !PyTuple_CheckExact(tokens)) {
        PyErr_SetString(PyExc_TypeError, "stage_change: layout must hold three tuples, a bool and a tuple");
        return NULL;
    }
    Py_ssize_t ncols = PyTuple_GET_SIZE(row_keys), nkey = PyTuple_GET_SIZE(key_keys);
    int keyless = PyObject_IsTrue(PyTuple_GET_ITEM(layout, 3));
    if (keyless < 0)
        return NULL;
    Py_ssize_t tuple_at = oid_at + 5;  /* after the oid and the tuple's marker byte */
    if (PyTuple_GET_SIZE(key_at_obj) != nkey || PyTuple_GET_SIZE(tokens) != ncols || len < tuple_at)
        Py_RETURN_NONE;
    Val small[64];
    Py_ssize_t small_at[16];
    Val *vals = 2 * ncols <= 64 ? small : PyMem_Malloc(2 * ncols * sizeof(Val) + 1);
    Py_ssize_t *at = nkey <= 16 ? small_at : PyMem_Malloc(nkey * sizeof(Py_ssize_t) + 1);
    PyObject *data = NULL, *old_key = NULL, *unchanged = NULL, *result = NULL;
    int fallback = 0, any_unchanged = 0;
    if (vals == NULL || at == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Val *old = vals, *new = vals + ncols;
    for (Py_ssize_t i = 0; i < nkey; i++) {
        at[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(key_at_obj, i));
        if (at[i] == -1 && PyErr_Occurred())
            goto done;
        if (at[i] < 0 || at[i] >= ncols)
            goto fall_back;
    }
    unsigned char op = (unsigned char)buf[0], marker = (unsigned char)buf[tuple_at - 1];
    Py_ssize_t pos;
    int has_old = 0, has_new = 0;
    if (op == 'I' && marker == 'N') {
        has_new = parse_values(buf, len, tuple_at, new, ncols) >= 0;
        if (!has_new)
            goto fall_back;
    } else if (op == 'U' && marker == 'N') {
        has_new = parse_values(buf, len, tuple_at, new, ncols) >= 0;
        if (!has_new)
            goto fall_back;
    } else if (op == 'U' && (marker == 'K' || marker == 'O')) {
        pos = parse_values(buf, len, tuple_at, old, ncols);
        if (pos < 0 || pos >= len || buf[pos] != 'N' || parse_values(buf, len, pos + 1, new, ncols) < 0)
            goto fall_back;
        has_old = has_new = 1;
    } else if (op == 'D' && (marker == 'K' || marker == 'O')) {
        has_old = parse_values(buf, len, tuple_at, old, ncols) >= 0;
        if (!has_old)
            goto fall_back;
    } else {
        goto fall_back;
    }
    if (has_old) {
        for (Py_ssize_t i = 0; i < ncols; i++)
            if (old[i].kind == 'u')
                goto fall_back;
    }
    if (has_new) {
        for (Py_ssize_t i = 0; i < ncols; i++) {
            if (new[i].kind != 'u')
                continue;
            /* REPLICA IDENTITY FULL sends the whole old row, TOAST values inline: the value the
             * update left untouched is known, and staged (buffer.stage does the same). */
            if (marker == 'O')
                new[i] = old[i];
            else
                any_unchanged = 1;
        }
    }
    if (op == 'D') {
        data = json_object(key_keys, old, at, &fallback);
    } else {
        data = json_object(row_keys, new, NULL, &fallback);
        if (data != NULL && has_old) {
            if (keyless) {
                old_key = json_object(row_keys, old, NULL, &fallback);
            } else {
                for (Py_ssize_t i = 0; i < nkey; i++) {
                    if (!same_value(&old[at[i]], &new[at[i]])) {
                        old_key = json_object(key_keys, old, at, &fallback);
                        break;
                    }
                }
            }
            if (old_key == NULL && PyErr_Occurred())
                goto done;
        }
    }
    if (fallback)
        goto fall_back;
    if (data == NULL)
        goto done;
    if (any_unchanged && (unchanged = unchanged_tokens(tokens, new, ncols)) == NULL)
        goto done;
    {
        PyObject *row[8] = {PyUnicode_FromOrdinal(op), args[3], args[4], args[5], args[6],
                            unchanged == NULL ? Py_None : unchanged, data, old_key == NULL ? Py_None : old_key};
        if (row[0] == NULL)
            goto done;
        int failed = 0;
        for (int i = 0; i < 8 && !failed; i++)
            failed = PyList_Append(PyTuple_GET_ITEM(columns, i), row[i]) < 0;
        Py_DECREF(row[0]);
        if (failed)
            goto done;
        Py_ssize_t added = 48 + PyUnicode_GET_LENGTH(data) + (old_key == NULL ? 0 : PyUnicode_GET_LENGTH(old_key));
        result = PyLong_FromSsize_t(added);
    }
    goto done;
fall_back:
    result = Py_None;
    Py_INCREF(result);
done:
    Py_XDECREF(data);
    Py_XDECREF(old_key);
    Py_XDECREF(unchanged);
    if (vals != NULL && vals != small)
        PyMem_Free(vals);
    if (at != NULL && at != small_at)
        PyMem_Free(at);
    return result;
}

static unsigned long long be_u64(const unsigned char *p) {
    unsigned long long v = 0;
    for (int i = 0; i < 8; i++)
        v = (v << 8) | p[i];
    return v;
}

static unsigned long be_u32(const unsigned char *p) {
    return ((unsigned long)p[0] << 24) | ((unsigned long)p[1] << 16) | ((unsigned long)p[2] << 8) | p[3];
}

/* stream_head(msg: bytes) -> tuple | None
 * The fields of pgoutput's messages about streamed in-progress transactions (protocol 2+), as
 * headrace.source.postgres.pgoutput.python_stream_head gives them: ('S', xid, first) for Stream
 * Start, ('E',) for Stream Stop, ('c', xid, flags, commit_lsn, end_lsn, commit_ts) for Stream
 * Commit, ('A', xid, subxid) for Stream Abort, and (kind, xid) for any other message, which inside a
 * block of streamed changes carries its (sub)transaction's xid after the kind byte. None: too short. */
static PyObject *stream_head(PyObject *self, PyObject *arg) {
    if (!PyBytes_CheckExact(arg)) {
        PyErr_SetString(PyExc_TypeError, "stream_head(msg: bytes)");
        return NULL;
    }
    const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(arg);
    Py_ssize_t len = PyBytes_GET_SIZE(arg);
    if (len < 1)
        Py_RETURN_NONE;
    switch (b[0]) {
    case 'E':
        return Py_BuildValue("(C)", 'E');
    case 'S':
        if (len < 6)
            Py_RETURN_NONE;
        return Py_BuildValue("(CkO)", 'S', be_u32(b + 1), b[5] ? Py_True : Py_False);
    case 'c':
        if (len < 30)
            Py_RETURN_NONE;
        return Py_BuildValue("(CkBKKL)", 'c', be_u32(b + 1), b[5], be_u64(b + 6), be_u64(b + 14),
                             (long long)be_u64(b + 22));
    case 'A':
        if (len < 9)
            Py_RETURN_NONE;
        return Py_BuildValue("(Ckk)", 'A', be_u32(b + 1), be_u32(b + 5));
    default:
        if (len < 5)
            Py_RETURN_NONE;
        return Py_BuildValue("(Ck)", b[0], be_u32(b + 1));
    }
}

static PyMethodDef methods[] = {
    {"stream_head", stream_head, METH_O, "The fields of a pgoutput streaming message (S, E, c, A) or a streamed "
     "message's xid: a tuple, or None."},
    {"decode_tuple", decode_tuple, METH_VARARGS, "pgoutput TupleData at pos: (values, position after), or None."},
    {"encode_object", encode_object, METH_VARARGS, "JSON object of precomputed keys and str/None values, or None."},
    {"stage_change", (PyCFunction)(void (*)(void))stage_change, METH_FASTCALL,
     "A pgoutput I/U/D message appended to a StagingBuffer's columns: the bytes it counts, or None."},
    {"stage_streamed_change", (PyCFunction)(void (*)(void))stage_streamed_change, METH_FASTCALL,
     "stage_change of a message inside a streamed transaction's block (its xid first)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "headrace._speedups",
                                    "Optional native helpers of capture's per-change path.", -1, methods};

PyMODINIT_FUNC PyInit__speedups(void) { return PyModule_Create(&module); }
