/* PostgreSQL's binary COPY format decoded into Arrow buffers (headrace.source.postgres.binary_copy).
 *
 * Optional, like headrace/_speedups.c: built by setup.py when a C compiler is present; without it
 * the initial copy decodes through the ADBC driver instead (the same values, more CPU).
 *
 * decode(buf, pos, kinds, max_rows) -> (columns, rows, next_pos, done)
 *   buf: the whole COPY output (or a prefix holding whole rows); pos 0 reads the header first.
 *   kinds: one byte per column:
 *     'b' boolean, 'i' integer, 'l' bigint, 'f' real, 'd' double precision,
 *     'D' date (days since 2000-01-01 -> since 1970-01-01),
 *     'T' timestamp / timestamptz (microseconds since 2000-01-01 -> since 1970-01-01),
 *     's' text, varchar, bytea and anything sent as bytes (32-bit offsets).
 *   At most max_rows rows are decoded, and fewer when a column's bytes would pass 2^31 - 1.
 *   columns: per column (validity bitmap bytes or None, values bytes, null count), and for 's'
 *   (validity or None, offsets bytes, data bytes, null count): the buffers pyarrow.Array.from_buffers
 *   takes. done: the trailer was read. A malformed stream raises ValueError.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static const char SIGNATURE[11] = {'P', 'G', 'C', 'O', 'P', 'Y', '\n', '\377', '\r', '\n', '\0'};
static const int32_t DATE_SHIFT = 10957;                   /* days from 1970-01-01 to 2000-01-01 */
static const int64_t TIMESTAMP_SHIFT = 946684800000000LL; /* microseconds, the same */

static inline uint16_t be16(const unsigned char *p) { return (uint16_t)((p[0] << 8) | p[1]); }
static inline uint32_t be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}
static inline uint64_t be64(const unsigned char *p) { return ((uint64_t)be32(p) << 32) | be32(p + 4); }

static int width_of(char kind) {
    switch (kind) {
    case 'b': return 1;
    case 'i': case 'f': case 'D': return 4;
    case 'l': case 'd': case 'T': return 8;
    case 's': return -1;
    default: return 0;
    }
}

static PyObject *malformed(const char *what, Py_ssize_t at) {
    PyErr_Format(PyExc_ValueError, "binary COPY stream malformed at byte %zd: %s", at, what);
    return NULL;
}

static PyObject *decode(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t pos, max_rows;
    const char *kinds;
    Py_ssize_t ncols;
    if (!PyArg_ParseTuple(args, "y*ny#n", &view, &pos, &kinds, &ncols, &max_rows))
        return NULL;
    const unsigned char *b = (const unsigned char *)view.buf;
    Py_ssize_t len = view.len;
    PyObject *result = NULL, *columns = NULL;
    PyObject **validity = NULL, **values = NULL, **data = NULL;
    Py_ssize_t *nulls = NULL, *var_bytes = NULL;
    for (Py_ssize_t c = 0; c < ncols; c++)
        if (width_of(kinds[c]) == 0) {
            PyErr_Format(PyExc_ValueError, "unknown column kind %c", kinds[c]);
            goto out;
        }
    if (pos == 0) {
        if (len < 19 || memcmp(b, SIGNATURE, 11) != 0) {
            malformed("no binary COPY signature", 0);
            goto out;
        }
        Py_ssize_t extension = be32(b + 15);
        pos = 19 + extension;
        if (pos > len) {
            malformed("header extension past the end", 15);
            goto out;
        }
    }
    nulls = PyMem_Calloc(ncols ? ncols : 1, sizeof(Py_ssize_t));
    var_bytes = PyMem_Calloc(ncols ? ncols : 1, sizeof(Py_ssize_t));
    validity = PyMem_Calloc(ncols ? ncols : 1, sizeof(PyObject *));
    values = PyMem_Calloc(ncols ? ncols : 1, sizeof(PyObject *));
    data = PyMem_Calloc(ncols ? ncols : 1, sizeof(PyObject *));
    if (!nulls || !var_bytes || !validity || !values || !data) {
        PyErr_NoMemory();
        goto out;
    }

    /* Pass 1: how many rows fit, each column's NULLs and bytes; the layout checked. */
    Py_ssize_t rows = 0, p = pos;
    int done = 0;
    while (rows < max_rows) {
        if (p + 2 > len) {
            malformed("row header past the end", p);
            goto out;
        }
        int16_t fields = (int16_t)be16(b + p);
        if (fields == -1) {
            done = 1;
            break;
        }
        if (fields != ncols) {
            PyErr_Format(PyExc_ValueError, "binary COPY row of %d fields, expected %zd", fields, ncols);
            goto out;
        }
        Py_ssize_t q = p + 2;
        int fits = 1;
        for (Py_ssize_t c = 0; c < ncols; c++) {
            if (q + 4 > len) {
                malformed("field length past the end", q);
                goto out;
            }
            int32_t n = (int32_t)be32(b + q);
            q += 4;
            if (n < 0) {
                if (n != -1) {
                    malformed("negative field length", q - 4);
                    goto out;
                }
                continue;
            }
            if (q + n > len) {
                malformed("field past the end", q);
                goto out;
            }
            int w = width_of(kinds[c]);
            if (w > 0 && n != w) {
                PyErr_Format(PyExc_ValueError, "binary COPY field %zd of %d bytes, expected %d", c, n, w);
                goto out;
            }
            if (w < 0 && var_bytes[c] + n > INT32_MAX)
                fits = 0;
            q += n;
        }
        if (!fits) {
            if (rows == 0) {
                malformed("a row larger than 2 GiB", p);
                goto out;
            }
            break;
        }
        /* Counted only once the row fits. */
        Py_ssize_t r = p + 2;
        for (Py_ssize_t c = 0; c < ncols; c++) {
            int32_t n = (int32_t)be32(b + r);
            r += 4;
            if (n < 0)
                nulls[c]++;
            else {
                if (width_of(kinds[c]) < 0)
                    var_bytes[c] += n;
                r += n;
            }
        }
        p = q;
        rows++;
    }
    Py_ssize_t next = done ? p + 2 : p;

    /* The buffers, sized by pass 1. */
    Py_ssize_t bitmap = (rows + 7) / 8;
    for (Py_ssize_t c = 0; c < ncols; c++) {
        int w = width_of(kinds[c]);
        if (nulls[c]) {
            validity[c] = PyBytes_FromStringAndSize(NULL, bitmap);
            if (!validity[c])
                goto out;
            memset(PyBytes_AS_STRING(validity[c]), 0, bitmap);
        }
        Py_ssize_t size = w == 1 ? bitmap : w > 0 ? rows * w : (rows + 1) * 4;
        values[c] = PyBytes_FromStringAndSize(NULL, size);
        if (!values[c])
            goto out;
        if (w == 1)
            memset(PyBytes_AS_STRING(values[c]), 0, size);
        if (w < 0) {
            data[c] = PyBytes_FromStringAndSize(NULL, var_bytes[c]);
            if (!data[c])
                goto out;
            ((int32_t *)PyBytes_AS_STRING(values[c]))[0] = 0;
            var_bytes[c] = 0; /* the write position in pass 2 */
        }
    }

    /* Pass 2: the values. */
    p = pos;
    for (Py_ssize_t row = 0; row < rows; row++) {
        p += 2;
        for (Py_ssize_t c = 0; c < ncols; c++) {
            int32_t n = (int32_t)be32(b + p);
            p += 4;
            char kind = kinds[c];
            char *out = PyBytes_AS_STRING(values[c]);
            if (n >= 0 && validity[c])
                PyBytes_AS_STRING(validity[c])[row >> 3] |= (char)(1 << (row & 7));
            switch (kind) {
            case 'b':
                if (n > 0 && b[p])
                    out[row >> 3] |= (char)(1 << (row & 7));
                break;
            case 'i': case 'f': {
                uint32_t v = n > 0 ? be32(b + p) : 0;
                memcpy(out + row * 4, &v, 4);
                break;
            }
            case 'D': {
                int32_t v = n > 0 ? (int32_t)be32(b + p) + DATE_SHIFT : 0;
                memcpy(out + row * 4, &v, 4);
                break;
            }
            case 'l': case 'd': {
                uint64_t v = n > 0 ? be64(b + p) : 0;
                memcpy(out + row * 8, &v, 8);
                break;
            }
            case 'T': {
                int64_t v = n > 0 ? (int64_t)be64(b + p) + TIMESTAMP_SHIFT : 0;
                memcpy(out + row * 8, &v, 8);
                break;
            }
            default: { /* 's' */
                if (n > 0) {
                    memcpy(PyBytes_AS_STRING(data[c]) + var_bytes[c], b + p, n);
                    var_bytes[c] += n;
                }
                int32_t end = (int32_t)var_bytes[c];
                memcpy(out + (row + 1) * 4, &end, 4);
            }
            }
            if (n > 0)
                p += n;
        }
    }

    columns = PyList_New(ncols);
    if (!columns)
        goto out;
    for (Py_ssize_t c = 0; c < ncols; c++) {
        PyObject *mask = validity[c] ? validity[c] : Py_None;
        PyObject *item = width_of(kinds[c]) < 0
            ? Py_BuildValue("(OOOn)", mask, values[c], data[c], nulls[c])
            : Py_BuildValue("(OOn)", mask, values[c], nulls[c]);
        if (!item)
            goto out;
        PyList_SET_ITEM(columns, c, item);
    }
    result = Py_BuildValue("(OnnO)", columns, rows, next, done ? Py_True : Py_False);
out:
    Py_XDECREF(columns);
    for (Py_ssize_t c = 0; validity && c < ncols; c++) {
        Py_XDECREF(validity[c]);
        Py_XDECREF(values[c]);
        Py_XDECREF(data[c]);
    }
    PyMem_Free(nulls);
    PyMem_Free(var_bytes);
    PyMem_Free(validity);
    PyMem_Free(values);
    PyMem_Free(data);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"decode", decode, METH_VARARGS, "Rows of a binary COPY stream as Arrow buffers (see the file's comment)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_copy_binary", NULL, -1, methods};

PyMODINIT_FUNC PyInit__copy_binary(void) { return PyModule_Create(&module); }
