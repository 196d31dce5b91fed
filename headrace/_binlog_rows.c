/* Optional native decoder of MySQL/MariaDB binlog row events (built by setup.py when a C compiler is
 * present; headrace.source.mysql.rows_native falls back to mysql-replication's Python decoder, with
 * the same results, when it is not, and for tables with a column type it does not handle).
 *
 * decode_event(packet, plans, checksum): a whole replication packet of a row event (see there).
 * decode_rows(body, images, specs) -> list[tuple[str | None, ...]] | None
 *   body:   the event's rows (after its header and columns-present bitmaps), up to its end;
 *   images: 1 (WRITE, DELETE) or 2 (UPDATE: before and after image per row);
 *   specs:  per column (kind, a, b), see K_* below.
 * Each value comes out as the text headrace.source.mysql.types.to_text gives for what
 * mysql-replication decodes (zero dates as "-infinity"), None for SQL NULL. None (the whole result)
 * means "not for me" (a value this decoder does not spell the way Python does, e.g. an invalid date):
 * the caller decodes the event in Python. Truncation raises ValueError.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

enum {
    K_INT = 1,       /* a: bytes (1, 2, 3, 4, 8), b: unsigned */
    K_FLOAT = 2,     /* 4-byte float: the shortest text that reads back as the same float32 */
    K_DOUBLE = 3,    /* repr() */
    K_DECIMAL = 4,   /* NEWDECIMAL, a: precision, b: scale */
    K_TEXT = 5,      /* utf8 string, a: length bytes (1..4) */
    K_BINARY = 6,    /* bytes as \x + hex, a: length bytes (1..4) */
    K_DATE = 7,
    K_DATETIME2 = 8, /* a: fsp */
    K_TIMESTAMP2 = 9,/* a: fsp */
    K_YEAR = 10,
};

typedef struct { int kind, a, b; } Spec;

static const char ZERO_DATE[] = "-infinity";
static const int DIG2BYTES[10] = {0, 1, 1, 2, 2, 3, 3, 4, 4, 4};

static uint64_t be(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v = (v << 8) | p[i];
    return v;
}

static uint64_t le(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static int days_in_month(int y, int m) {
    static const int d[13] = {0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (m == 2 && ((y % 4 == 0 && y % 100 != 0) || y % 400 == 0)) return 29;
    return d[m];
}

/* Fractional seconds of fsp digits in (fsp + 1) / 2 big-endian bytes, as microseconds. */
static long fraction(const unsigned char *p, int fsp) {
    int n = (fsp + 1) / 2;
    if (!n) return 0;
    long v = (long)be(p, n);
    return v * (n == 1 ? 10000 : n == 2 ? 100 : 1);
}

/* A str of the n ASCII bytes at text (digits, signs, separators): no UTF-8 decoding, no format
 * parsing, unlike PyUnicode_FromFormat. */
static PyObject *ascii(const char *text, Py_ssize_t n) {
    PyObject *out = PyUnicode_New(n, 127);
    if (out != NULL) memcpy(PyUnicode_1BYTE_DATA(out), text, (size_t)n);
    return out;
}

/* The decimal digits of magnitude, after a '-' when negative. */
static PyObject *int_text(uint64_t magnitude, int negative) {
    char buf[24];
    char *end = buf + sizeof buf, *q = end;
    do {
        *--q = (char)('0' + magnitude % 10);
        magnitude /= 10;
    } while (magnitude);
    if (negative) *--q = '-';
    return ascii(q, end - q);
}

/* v in exactly width digits at o (zero-padded, as %0<width>d for 0 <= v < 10^width); the end. */
static char *digits(char *o, long v, int width) {
    for (int i = width - 1; i >= 0; i--) {
        o[i] = (char)('0' + v % 10);
        v /= 10;
    }
    return o + width;
}

static char *date_digits(char *o, int y, int mo, int d) {
    o = digits(o, y, 4);
    *o++ = '-';
    o = digits(o, mo, 2);
    *o++ = '-';
    return digits(o, d, 2);
}

static PyObject *datetime_text(int y, int mo, int d, int h, int mi, int s, long us, const char *suffix) {
    char out[48];
    char *o = date_digits(out, y, mo, d);
    *o++ = ' ';
    o = digits(o, h, 2);
    *o++ = ':';
    o = digits(o, mi, 2);
    *o++ = ':';
    o = digits(o, s, 2);
    if (us) {
        *o++ = '.';
        o = digits(o, us, 6);
    }
    size_t n = strlen(suffix);
    memcpy(o, suffix, n);
    return ascii(out, (o - out) + (Py_ssize_t)n);
}

/* Civil date of days since 1970-01-01 (Howard Hinnant's algorithm). */
static void civil(int64_t z, int *y, int *m, int *d) {
    z += 719468;
    int64_t era = (z >= 0 ? z : z - 146096) / 146097;
    int64_t doe = z - era * 146097;
    int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    int64_t mp = (5 * doy + 2) / 153;
    *d = (int)(doy - (153 * mp + 2) / 5 + 1);
    *m = (int)(mp < 10 ? mp + 3 : mp - 9);
    *y = (int)(yoe + era * 400 + (*m <= 2));
}

static PyObject *float32_text(float value) {
    /* types._float32_text: the first of 6..9 significant digits that reads back as the same float. */
    for (int digits = 6; digits < 10; digits++) {
        char *text = PyOS_double_to_string((double)value, 'g', digits, 0, NULL);
        if (text == NULL) return NULL;
        double back = PyOS_string_to_double(text, NULL, NULL);
        PyMem_Free(text);
        if (back == -1.0 && PyErr_Occurred()) return NULL;
        if ((float)back == value) {
            char *r = PyOS_double_to_string(back, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
            if (r == NULL) return NULL;
            PyObject *out = PyUnicode_FromString(r);
            PyMem_Free(r);
            return out;
        }
    }
    char *r = PyOS_double_to_string((double)value, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (r == NULL) return NULL;
    PyObject *out = PyUnicode_FromString(r);
    PyMem_Free(r);
    return out;
}

/* NEWDECIMAL(precision, scale): groups of 9 digits in 4 bytes, leftovers in DIG2BYTES; the sign in
 * the first bit (set: non-negative), a negative value's bytes inverted. Text: [-]int.frac, the integer
 * part without leading zeros ("0" at least), exactly scale fractional digits. */
static PyObject *decimal_text(const unsigned char *p, int precision, int scale, Py_ssize_t *size) {
    int intg = precision - scale;
    int intg0 = intg / 9, frac0 = scale / 9, intg0x = intg % 9, frac0x = scale % 9;
    Py_ssize_t n = intg0 * 4 + DIG2BYTES[intg0x] + frac0 * 4 + DIG2BYTES[frac0x];
    *size = n;
    unsigned char buf[64];
    if (n > (Py_ssize_t)sizeof buf) return NULL;
    memcpy(buf, p, (size_t)n);
    int negative = !(buf[0] & 0x80);
    buf[0] ^= 0x80;
    if (negative)
        for (Py_ssize_t i = 0; i < n; i++) buf[i] ^= 0xFF;
    char digits[160];
    int len = 0, pos = 0;
    if (intg0x) {
        int k = DIG2BYTES[intg0x];
        len += snprintf(digits + len, sizeof digits - len, "%0*lu", intg0x, (unsigned long)be(buf + pos, k));
        pos += k;
    }
    for (int i = 0; i < intg0; i++, pos += 4)
        len += snprintf(digits + len, sizeof digits - len, "%09lu", (unsigned long)be(buf + pos, 4));
    char frac[80];
    int flen = 0;
    for (int i = 0; i < frac0; i++, pos += 4)
        flen += snprintf(frac + flen, sizeof frac - flen, "%09lu", (unsigned long)be(buf + pos, 4));
    if (frac0x) {
        int k = DIG2BYTES[frac0x];
        flen += snprintf(frac + flen, sizeof frac - flen, "%0*lu", frac0x, (unsigned long)be(buf + pos, k));
    }
    int lead = 0;
    while (lead < len - 1 && digits[lead] == '0') lead++;
    if (len == 0) { digits[0] = '0'; len = 1; lead = 0; }
    char out[200];
    int o = 0;
    if (negative) out[o++] = '-';
    memcpy(out + o, digits + lead, (size_t)(len - lead));
    o += len - lead;
    if (scale) {
        out[o++] = '.';
        memcpy(out + o, frac, (size_t)flen);
        o += flen;
    }
    return PyUnicode_FromStringAndSize(out, o);
}

/* One value at p (at most end); *used: its bytes. NULL with no error set: not for this decoder. */
static PyObject *value(const Spec *s, const unsigned char *p, const unsigned char *end, Py_ssize_t *used) {
    Py_ssize_t left = end - p;
    switch (s->kind) {
    case K_INT: {
        if (left < s->a) goto truncated;
        *used = s->a;
        uint64_t v = le(p, s->a);
        if (s->b) return int_text(v, 0);
        int bits = s->a * 8;
        int64_t sv = bits == 64 ? (int64_t)v : (int64_t)(v << (64 - bits)) >> (64 - bits);
        return sv < 0 ? int_text((uint64_t)(-(sv + 1)) + 1, 1) : int_text((uint64_t)sv, 0);
    }
    case K_FLOAT: {
        if (left < 4) goto truncated;
        *used = 4;
        float f;
        memcpy(&f, p, 4);
        return float32_text(f);
    }
    case K_DOUBLE: {
        if (left < 8) goto truncated;
        *used = 8;
        double d;
        memcpy(&d, p, 8);
        char *r = PyOS_double_to_string(d, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
        if (r == NULL) return NULL;
        PyObject *out = PyUnicode_FromString(r);
        PyMem_Free(r);
        return out;
    }
    case K_DECIMAL: {
        Py_ssize_t n = 0;
        int intg = s->a - s->b;
        n = (intg / 9) * 4 + DIG2BYTES[intg % 9] + (s->b / 9) * 4 + DIG2BYTES[s->b % 9];
        if (left < n) goto truncated;
        return decimal_text(p, s->a, s->b, used);
    }
    case K_TEXT:
    case K_BINARY: {
        if (left < s->a) goto truncated;
        Py_ssize_t n = (Py_ssize_t)le(p, s->a);
        if (left - s->a < n) goto truncated;
        *used = s->a + n;
        if (s->kind == K_TEXT)
            return PyUnicode_DecodeUTF8((const char *)p + s->a, n, "strict");
        PyObject *out = PyUnicode_New(2 + 2 * n, 127);
        if (out == NULL) return NULL;
        Py_UCS1 *o = PyUnicode_1BYTE_DATA(out);
        static const char hex[] = "0123456789abcdef";
        o[0] = '\\';
        o[1] = 'x';
        for (Py_ssize_t i = 0; i < n; i++) {
            o[2 + 2 * i] = hex[p[s->a + i] >> 4];
            o[3 + 2 * i] = hex[p[s->a + i] & 15];
        }
        return out;
    }
    case K_DATE: {
        if (left < 3) goto truncated;
        *used = 3;
        uint32_t v = (uint32_t)le(p, 3);
        int y = (v >> 9) & 0x7FFF, m = (v >> 5) & 15, d = v & 31;
        if (!y || !m || !d) return PyUnicode_FromString(ZERO_DATE);
        if (m > 12 || d > days_in_month(y, m)) return NULL;  /* no Python date: let Python say */
        char out[10];
        return ascii(out, date_digits(out, y, m, d) - out);
    }
    case K_DATETIME2: {
        int n = 5 + (s->a + 1) / 2;
        if (left < n) goto truncated;
        *used = n;
        int64_t packed = (int64_t)be(p, 5) - 0x8000000000LL;
        int64_t ymd = packed >> 17, ym = ymd >> 5, hms = packed % (1 << 17);
        int y = (int)(ym / 13), m = (int)(ym % 13), d = (int)(ymd % (1 << 5));
        int h = (int)(hms >> 12), mi = (int)((hms >> 6) % (1 << 6)), sec = (int)(hms % (1 << 6));
        long us = fraction(p + 5, s->a);
        if (!y || !m || !d) return PyUnicode_FromString(ZERO_DATE);
        if (packed < 0 || m > 12 || d > days_in_month(y, m) || h > 23 || mi > 59 || sec > 59) return NULL;
        return datetime_text(y, m, d, h, mi, sec, us, "");
    }
    case K_TIMESTAMP2: {
        int n = 4 + (s->a + 1) / 2;
        if (left < n) goto truncated;
        *used = n;
        int64_t secs = (int64_t)be(p, 4);
        long us = fraction(p + 4, s->a);
        if (!secs && !us) return PyUnicode_FromString(ZERO_DATE);
        int y, m, d;
        civil(secs / 86400, &y, &m, &d);
        int64_t t = secs % 86400;
        return datetime_text(y, m, d, (int)(t / 3600), (int)(t / 60 % 60), (int)(t % 60), us, "+00");
    }
    case K_YEAR: {
        if (left < 1) goto truncated;
        *used = 1;
        return p[0] ? int_text((uint64_t)p[0] + 1900, 0) : ascii("0", 1);
    }
    }
    return NULL;
truncated:
    PyErr_SetString(PyExc_ValueError, "binlog row event: a value runs past the end of the event");
    return NULL;
}

/* The rows from p to end of images image(s) each (UPDATE: 2, before and after) as text tuples;
 * Py_None (a new reference) when a value is not for this decoder; NULL with an error set. */
static PyObject *rows_of(const unsigned char *p, const unsigned char *end, int images, const Spec *specs,
                         Py_ssize_t ncols) {
    PyObject *rows = PyList_New(0);
    if (rows == NULL) return NULL;
    Py_ssize_t nullbytes = (ncols + 7) / 8;
    while (p < end) {
        for (int image = 0; image < images; image++) {
            if (end - p < nullbytes) {
                PyErr_SetString(PyExc_ValueError, "binlog row event: a null bitmap runs past the end of the event");
                goto fail;
            }
            const unsigned char *nulls = p;
            p += nullbytes;
            PyObject *row = PyTuple_New(ncols);
            if (row == NULL) goto fail;
            for (Py_ssize_t i = 0; i < ncols; i++) {
                PyObject *v;
                if (nulls[i / 8] & (1 << (i % 8))) {
                    v = Py_None;
                    Py_INCREF(v);
                } else {
                    Py_ssize_t used = 0;
                    v = value(&specs[i], p, end, &used);
                    if (v == NULL) {
                        Py_DECREF(row);
                        if (PyErr_Occurred()) goto fail;
                        Py_DECREF(rows);
                        Py_RETURN_NONE;
                    }
                    p += used;
                }
                PyTuple_SET_ITEM(row, i, v);
            }
            /* Text and None only: never part of a cycle. The collector would untrack it at its first
             * look; untracked now, the rows of a large read cost no collection time (about a third of
             * the stream's time when they were tracked, bench/mysql.py). */
            PyObject_GC_UnTrack(row);
            int rc = PyList_Append(rows, row);
            Py_DECREF(row);
            if (rc < 0) goto fail;
        }
    }
    return rows;
fail:
    Py_DECREF(rows);
    return NULL;
}

static PyObject *decode_rows(PyObject *self, PyObject *args) {
    const char *buf;
    Py_ssize_t len;
    int images;
    PyObject *spec_seq;
    if (!PyArg_ParseTuple(args, "y#iO", &buf, &len, &images, &spec_seq)) return NULL;
    PyObject *fast = PySequence_Fast(spec_seq, "specs must be a sequence");
    if (fast == NULL) return NULL;
    Py_ssize_t ncols = PySequence_Fast_GET_SIZE(fast);
    Spec *specs = PyMem_Calloc((size_t)(ncols ? ncols : 1), sizeof(Spec));
    PyObject *rows = NULL;
    if (specs == NULL) { Py_DECREF(fast); return PyErr_NoMemory(); }
    for (Py_ssize_t i = 0; i < ncols; i++) {
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, i), "iii", &specs[i].kind, &specs[i].a, &specs[i].b))
            goto done;
    }
    rows = rows_of((const unsigned char *)buf, (const unsigned char *)buf + len, images, specs, ncols);
done:
    PyMem_Free(specs);
    Py_DECREF(fast);
    return rows;
}

/* A growable byte buffer for one staged message. */
typedef struct {
    unsigned char *data;
    Py_ssize_t len, cap;
} Buf;

static int buf_put(Buf *b, const void *bytes, Py_ssize_t n) {
    if (b->len + n > b->cap) {
        Py_ssize_t cap = b->cap * 2 > b->len + n ? b->cap * 2 : b->len + n + 256;
        unsigned char *data = PyMem_Realloc(b->data, (size_t)cap);
        if (data == NULL) { PyErr_NoMemory(); return -1; }
        b->data = data;
        b->cap = cap;
    }
    memcpy(b->data + b->len, bytes, (size_t)n);
    b->len += n;
    return 0;
}

static int buf_be(Buf *b, uint64_t v, int n) {
    unsigned char out[8];
    for (int i = n - 1; i >= 0; i--, v >>= 8) out[i] = (unsigned char)(v & 0xFF);
    return buf_put(b, out, n);
}

/* One row image at *pp as pgoutput TupleData (column count, then 'n' or 't' + length + UTF-8 text
 * per column); 1 done, 0 a value not for this decoder, -1 an error. */
static int put_image(Buf *b, const unsigned char **pp, const unsigned char *end, const Spec *specs,
                     Py_ssize_t ncols) {
    const unsigned char *p = *pp;
    Py_ssize_t nullbytes = (ncols + 7) / 8;
    if (end - p < nullbytes) {
        PyErr_SetString(PyExc_ValueError, "binlog row event: a null bitmap runs past the end of the event");
        return -1;
    }
    const unsigned char *nulls = p;
    p += nullbytes;
    if (buf_be(b, (uint64_t)ncols, 2) < 0) return -1;
    for (Py_ssize_t i = 0; i < ncols; i++) {
        if (nulls[i / 8] & (1 << (i % 8))) {
            if (buf_put(b, "n", 1) < 0) return -1;
            continue;
        }
        Py_ssize_t used = 0, n = 0;
        PyObject *v = value(&specs[i], p, end, &used);
        if (v == NULL) return PyErr_Occurred() ? -1 : 0;
        p += used;
        const char *text = PyUnicode_AsUTF8AndSize(v, &n);
        int failed = text == NULL || buf_put(b, "t", 1) < 0 || buf_be(b, (uint64_t)n, 4) < 0 || buf_put(b, text, n) < 0;
        Py_DECREF(v);
        if (failed) return -1;
    }
    *pp = p;
    return 1;
}

/* The rows from p to end as staged messages, one bytes per change, in the shape of pgoutput's
 * INSERT/UPDATE/DELETE (what headrace._speedups.stage_change stages, called with at=5): the
 * operation byte, the table's 8-byte id (big-endian), then as pgoutput: 'N' + the new row (insert),
 * 'K'/'O' + the old row + 'N' + the new row (update; 'O': a table without a key), 'K'/'O' + the
 * old row (delete). Old rows are whole: stage_change picks the key's columns. Py_None (new
 * reference) when a value is not for this decoder; NULL with an error set. */
static PyObject *messages_of(const unsigned char *p, const unsigned char *end, int kind, const Spec *specs,
                             Py_ssize_t ncols, uint64_t oid, int keyed) {
    static const char ops[3] = {'I', 'U', 'D'};
    PyObject *messages = PyList_New(0);
    Buf b = {NULL, 0, 0};
    if (messages == NULL) return NULL;
    const char old_marker = keyed ? 'K' : 'O';
    while (p < end) {
        b.len = 0;
        int rc = buf_put(&b, &ops[kind], 1) < 0 || buf_be(&b, oid, 8) < 0 ? -1 : 1;
        if (rc > 0) rc = buf_put(&b, kind == 0 ? "N" : &old_marker, 1) < 0 ? -1 : 1;
        if (rc > 0) rc = put_image(&b, &p, end, specs, ncols);
        if (rc > 0 && kind == 1) {
            rc = buf_put(&b, "N", 1) < 0 ? -1 : 1;
            if (rc > 0) rc = put_image(&b, &p, end, specs, ncols);
        }
        if (rc <= 0) {
            PyMem_Free(b.data);
            Py_DECREF(messages);
            if (rc < 0) return NULL;
            Py_RETURN_NONE;
        }
        PyObject *message = PyBytes_FromStringAndSize((const char *)b.data, b.len);
        if (message == NULL || PyList_Append(messages, message) < 0) {
            Py_XDECREF(message);
            PyMem_Free(b.data);
            Py_DECREF(messages);
            return NULL;
        }
        Py_DECREF(message);
    }
    PyMem_Free(b.data);
    return messages;
}

/* Binlog event types of row events: v1 (MariaDB, MySQL 5.5) and v2 (MySQL 5.6+). */
enum { WRITE_V1 = 23, UPDATE_V1 = 24, DELETE_V1 = 25, WRITE_V2 = 30, UPDATE_V2 = 31, DELETE_V2 = 32 };
enum { HEADER = 20 };  /* the OK byte, then the 19-byte event header */

/* decode_event(packet, plans, checksum, staged) -> (kind, table_id, log_pos, event_size, rows) | None
 *   packet:   a replication packet as the server sends it (0x00, the event header, the event);
 *   plans:    {binlog table id: (packed Spec triples (int32 kind, a, b per column), the table's id,
 *             whether it has a key)} of the tables this decoder reads;
 *   checksum: bytes of the checksum after each event (4 with binlog_checksum=CRC32, else 0);
 *   staged:   true: rows are messages_of's bytes, one per change; false: text tuples.
 * kind: 0 write, 1 update (rows as tuples: before, after, ...), 2 delete. None: not a row event of a planned
 * table, or something this decoder leaves to mysql-replication (not every column in the image, a
 * value it does not spell): the caller hands the packet on unread. */
static PyObject *decode_event(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyBytes_Check(args[0]) || !PyDict_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "decode_event(packet: bytes, plans: dict, checksum: int, staged: bool)");
        return NULL;
    }
    int staged = PyObject_IsTrue(args[3]);
    if (staged < 0) return NULL;
    const unsigned char *data = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    Py_ssize_t len = PyBytes_GET_SIZE(args[0]);
    long checksum = PyLong_AsLong(args[2]);
    if (checksum == -1 && PyErr_Occurred()) return NULL;
    if (len < HEADER + 8 || data[0] != 0) Py_RETURN_NONE;
    int type = data[5], kind, v2 = type >= WRITE_V2;
    switch (type) {
    case WRITE_V1: case WRITE_V2: kind = 0; break;
    case UPDATE_V1: case UPDATE_V2: kind = 1; break;
    case DELETE_V1: case DELETE_V2: kind = 2; break;
    default: Py_RETURN_NONE;
    }
    uint64_t event_size = le(data + 10, 4), log_pos = le(data + 14, 4);
    if ((uint64_t)(len - 1) != event_size || len < HEADER + 8 + checksum) Py_RETURN_NONE;
    uint64_t table_id = le(data + HEADER, 6);
    PyObject *key = PyLong_FromUnsignedLongLong(table_id);
    if (key == NULL) return NULL;
    PyObject *plan = PyDict_GetItemWithError(args[1], key);  /* borrowed */
    Py_DECREF(key);
    if (plan == NULL) {
        if (PyErr_Occurred()) return NULL;
        Py_RETURN_NONE;
    }
    PyObject *packed = PyTuple_Check(plan) && PyTuple_GET_SIZE(plan) == 3 ? PyTuple_GET_ITEM(plan, 0) : NULL;
    if (packed == NULL || !PyBytes_Check(packed) || PyBytes_GET_SIZE(packed) % sizeof(Spec)) {
        PyErr_SetString(PyExc_TypeError, "decode_event: a plan is (packed (kind, a, b) int32 triples, id, keyed)");
        return NULL;
    }
    const Spec *specs = (const Spec *)PyBytes_AS_STRING(packed);
    Py_ssize_t ncols = PyBytes_GET_SIZE(packed) / (Py_ssize_t)sizeof(Spec);
    const unsigned char *p = data + HEADER + 8, *end = data + len - checksum;
    if (v2) {  /* extra data, its length counting its own two bytes */
        if (end - p < 2) Py_RETURN_NONE;
        uint64_t extra = le(p, 2);
        if (extra < 2 || (uint64_t)(end - p) < extra) Py_RETURN_NONE;
        p += extra;
    }
    if (p >= end || *p >= 251) Py_RETURN_NONE;  /* the column count: one byte up to 250 columns */
    if (*p++ != ncols) Py_RETURN_NONE;
    Py_ssize_t bitmap = (ncols + 7) / 8;
    int images = kind == 1 ? 2 : 1;
    if (end - p < bitmap * images) Py_RETURN_NONE;
    for (int image = 0; image < images; image++, p += bitmap)  /* every column present (row image FULL) */
        for (Py_ssize_t i = 0; i < ncols; i++)
            if (!(p[i / 8] & (1 << (i % 8)))) Py_RETURN_NONE;
    PyObject *rows;
    if (staged) {
        uint64_t oid = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(plan, 1));
        int keyed = PyObject_IsTrue(PyTuple_GET_ITEM(plan, 2));
        if ((oid == (uint64_t)-1 && PyErr_Occurred()) || keyed < 0) return NULL;
        rows = messages_of(p, end, kind, specs, ncols, oid, keyed);
    } else {
        rows = rows_of(p, end, images, specs, ncols);
    }
    if (rows == NULL || rows == Py_None) return rows;
    return Py_BuildValue("(iKKKN)", kind, (unsigned long long)table_id, (unsigned long long)log_pos,
                         (unsigned long long)event_size, rows);
}

static PyMethodDef methods[] = {
    {"decode_rows", decode_rows, METH_VARARGS, "Rows of a binlog row event as tuples of text (see the file's comment)."},
    {"decode_event", (PyCFunction)(void (*)(void))decode_event, METH_FASTCALL,
     "A whole binlog row event of a planned table: (kind, table_id, log_pos, event_size, rows), or None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_binlog_rows", NULL, -1, methods};

PyMODINIT_FUNC PyInit__binlog_rows(void) { return PyModule_Create(&module); }
