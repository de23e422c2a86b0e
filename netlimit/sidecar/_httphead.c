/* netlimit.sidecar._httphead: the parts of the sidecar's HTTP fast paths that
 * cost most in Python, in C.  Each function does exactly what its Python twin
 * in netlimit/sidecar/httphead.py does (tests/sidecar/test_httphead.py holds each
 * pair to the same answers on generated and mutated input); httphead.py uses
 * the Python ones when this module is not built or NETLIMIT_NO_EXTENSIONS is
 * set.  See httphead.py for what they return.
 *
 *   parse_request(buf: bytes, hs: list | None = None)
 *       -> None | False | (end, method, target, http10, fields)
 *   parse_check(buf: bytes)
 *       -> None | False | (rest, kind, method, target, query, keep, http10, fields)
 *   ok_response(rule, decision, conn) -> bytes | None
 *   http_date() -> str
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define MAX_HEAD 8190

/* RFC 9110 tchar */
static unsigned char tchar[256];

static PyObject *s_get, *s_head, *s_post, *s_empty, *s_zero, *s_one;
static PyObject *k_te, *k_cl, *k_upgrade, *k_connection;
static PyObject *a_policy, *a_sf_name, *a_limit, *a_remaining, *a_reset;

static void init_tables(void)
{
    const char *extra = "!#$%&'*+-.^_`|~";
    for (int c = '0'; c <= '9'; c++) tchar[c] = 1;
    for (int c = 'a'; c <= 'z'; c++) tchar[c] = 1;
    for (int c = 'A'; c <= 'Z'; c++) tchar[c] = 1;
    for (const char *p = extra; *p; p++) tchar[(unsigned char)*p] = 1;
}

static PyObject *latin1(const char *s, Py_ssize_t n)
{
    if (n == 0) {
        Py_INCREF(s_empty);
        return s_empty;
    }
    return PyUnicode_DecodeLatin1(s, n, NULL);
}

static PyObject *method_str(const char *s, Py_ssize_t n)
{
    if (n == 3 && memcmp(s, "GET", 3) == 0) { Py_INCREF(s_get); return s_get; }
    if (n == 4 && memcmp(s, "HEAD", 4) == 0) { Py_INCREF(s_head); return s_head; }
    if (n == 4 && memcmp(s, "POST", 4) == 0) { Py_INCREF(s_post); return s_post; }
    return latin1(s, n);
}

static int is_framing(const char *k, Py_ssize_t n)
{
    return (n == 14 && memcmp(k, "content-length", 14) == 0)
        || (n == 17 && memcmp(k, "transfer-encoding", 17) == 0)
        || (n == 4 && memcmp(k, "host", 4) == 0);
}

/* the first "\r\n\r\n" in b[0:n], or NULL */
static const char *find_blank(const char *b, Py_ssize_t n)
{
    const char *p = b, *end = b + n;
    while (end - p >= 4) {
        const char *cr = memchr(p, '\r', (size_t)(end - p - 3));
        if (cr == NULL)
            return NULL;
        if (cr[1] == '\n' && cr[2] == '\r' && cr[3] == '\n')
            return cr;
        p = cr + 1;
    }
    return NULL;
}

/* the first "\r\n" in [p, e), or NULL */
static const char *find_crlf(const char *p, const char *e)
{
    while (e - p >= 2) {
        const char *cr = memchr(p, '\r', (size_t)(e - p - 1));
        if (cr == NULL)
            return NULL;
        if (cr[1] == '\n')
            return cr;
        p = cr + 1;
    }
    return NULL;
}

/* What parse() found: the head ends at buf[end] (the blank line follows);
 * method, target and fields are new references (target is 1-byte kind, from
 * latin1(); method is one of the interned constants when it is GET, HEAD or
 * POST). */
typedef struct {
    Py_ssize_t end;
    int http10;
    PyObject *method, *target, *fields;
} Head;

enum { P_ERROR = -1, P_INCOMPLETE, P_HANDOFF, P_OK };

static void head_clear(Head *hd)
{
    Py_CLEAR(hd->method);
    Py_CLEAR(hd->target);
    Py_CLEAR(hd->fields);
}

/* One field line [p, q): into h (and hs); P_OK, P_HANDOFF or P_ERROR. */
static int parse_field(const char *p, const char *q, PyObject *h, PyObject *hs)
{
    const char *colon = memchr(p, ':', (size_t)(q - p));
    if (colon == NULL || colon == p)
        return P_HANDOFF;
    Py_ssize_t nlen = colon - p;
    for (Py_ssize_t i = 0; i < nlen; i++)
        if (!tchar[(unsigned char)p[i]])
            return P_HANDOFF;
    const char *vs = colon + 1, *ve = q;
    while (vs < ve && (*vs == ' ' || *vs == '\t')) vs++;
    while (ve > vs && (ve[-1] == ' ' || ve[-1] == '\t')) ve--;

    char low[128], *kbuf = low, *heap = NULL;
    if (nlen > (Py_ssize_t)sizeof low) {
        if ((heap = PyMem_Malloc((size_t)nlen)) == NULL) {
            PyErr_NoMemory();
            return P_ERROR;
        }
        kbuf = heap;
    }
    for (Py_ssize_t i = 0; i < nlen; i++) {
        char c = p[i];
        kbuf[i] = (c >= 'A' && c <= 'Z') ? (char)(c + 32) : c;
    }
    int framing = is_framing(kbuf, nlen);
    PyObject *key = PyUnicode_FromStringAndSize(kbuf, nlen);   /* tchar: ASCII */
    PyMem_Free(heap);
    PyObject *value = key == NULL ? NULL : latin1(vs, ve - vs);
    int rc = P_ERROR;
    if (value == NULL)
        goto out;
    int has = PyDict_Contains(h, key);
    if (has < 0 || (!has && PyDict_SetItem(h, key, value) < 0))
        goto out;
    if (has && framing) {   /* the first occurrence wins, but not for these */
        rc = P_HANDOFF;
        goto out;
    }
    if (hs != NULL) {
        PyObject *name = PyUnicode_FromStringAndSize(p, nlen);
        PyObject *t = name == NULL ? NULL : PyTuple_Pack(3, name, value, key);
        Py_XDECREF(name);
        int failed = t == NULL || PyList_Append(hs, t) < 0;
        Py_XDECREF(t);
        if (failed)
            goto out;
    }
    rc = P_OK;
out:
    Py_XDECREF(key);
    Py_XDECREF(value);
    return rc;
}

/* The head at the start of bufobj (bytes) into *hd; fields also to hs (a list)
 * when not NULL.  P_OK, P_INCOMPLETE, P_HANDOFF (aiohttp must decide) or
 * P_ERROR with an exception set; hd holds references only on P_OK. */
static int parse(PyObject *bufobj, PyObject *hs, Head *hd)
{
    const char *b = PyBytes_AS_STRING(bufobj);
    Py_ssize_t n = PyBytes_GET_SIZE(bufobj);
    hd->method = hd->target = hd->fields = NULL;

    const char *e = find_blank(b, n);
    if (e == NULL)
        return n > MAX_HEAD || memmem(b, (size_t)n, "\n\n", 2) || memmem(b, (size_t)n, "\n\r\n", 3)
            ? P_HANDOFF : P_INCOMPLETE;
    hd->end = e - b;
    if (hd->end > MAX_HEAD)
        return P_HANDOFF;
    /* inside the head, every CR is followed by LF and every LF preceded by CR */
    for (const char *p = b; p < e; ) {
        const char *cr = memchr(p, '\r', (size_t)(e - p));
        const char *lf = memchr(p, '\n', (size_t)(e - p));
        if (cr == NULL && lf == NULL)
            break;
        if (cr == NULL || lf != cr + 1)
            return P_HANDOFF;   /* a bare LF before the next CR, or a CR not followed by LF */
        p = lf + 1;
    }

    /* request line: METHOD SP TARGET SP VERSION, exactly two spaces */
    const char *le = find_crlf(b, e);
    if (le == NULL)
        le = e;
    const char *sp1 = memchr(b, ' ', (size_t)(le - b));
    if (sp1 == NULL)
        return P_HANDOFF;
    const char *sp2 = memchr(sp1 + 1, ' ', (size_t)(le - sp1 - 1));
    if (sp2 == NULL || memchr(sp2 + 1, ' ', (size_t)(le - sp2 - 1)) != NULL)
        return P_HANDOFF;
    Py_ssize_t vlen = le - sp2 - 1;
    if (vlen == 8 && memcmp(sp2 + 1, "HTTP/1.1", 8) == 0)
        hd->http10 = 0;
    else if (vlen == 8 && memcmp(sp2 + 1, "HTTP/1.0", 8) == 0)
        hd->http10 = 1;
    else
        return P_HANDOFF;

    if ((hd->fields = PyDict_New()) == NULL)
        return P_ERROR;
    for (const char *p = (le == e) ? e : le + 2; p < e; ) {
        const char *q = find_crlf(p, e);
        if (q == NULL)
            q = e;
        int rc = parse_field(p, q, hd->fields, hs);
        if (rc != P_OK) {
            head_clear(hd);
            return rc;
        }
        p = (q == e) ? e : q + 2;
    }
    hd->method = method_str(b, sp1 - b);
    hd->target = hd->method == NULL ? NULL : latin1(sp1 + 1, sp2 - sp1 - 1);
    if (hd->target == NULL) {
        head_clear(hd);
        return P_ERROR;
    }
    return P_OK;
}

/* None, False or NULL for what parse() answered when it is not P_OK */
static PyObject *verdict(int rc)
{
    if (rc == P_INCOMPLETE)
        Py_RETURN_NONE;
    if (rc == P_HANDOFF)
        Py_RETURN_FALSE;
    return NULL;
}

static PyObject *parse_request(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "parse_request(buf, hs=None)");
        return NULL;
    }
    if (!PyBytes_Check(args[0])) {
        PyErr_Format(PyExc_TypeError, "parse_request() wants bytes, not %.100s", Py_TYPE(args[0])->tp_name);
        return NULL;
    }
    PyObject *hs = nargs == 2 && args[1] != Py_None ? args[1] : NULL;
    if (hs != NULL && !PyList_Check(hs)) {
        PyErr_SetString(PyExc_TypeError, "parse_request(): hs must be a list or None");
        return NULL;
    }
    Head hd;
    int rc = parse(args[0], hs, &hd);
    if (rc != P_OK)
        return verdict(rc);
    PyObject *end = PyLong_FromSsize_t(hd.end);
    PyObject *out = end == NULL ? NULL
        : PyTuple_Pack(5, end, hd.method, hd.target, hd.http10 ? Py_True : Py_False, hd.fields);
    Py_XDECREF(end);
    head_clear(&hd);
    return out;
}

/* ASCII case-insensitive: does s (1-byte kind) contain the lowercase ASCII word w? */
static int contains_lower(PyObject *s, const char *w)
{
    const unsigned char *d = PyUnicode_1BYTE_DATA(s);
    Py_ssize_t n = PyUnicode_GET_LENGTH(s), m = (Py_ssize_t)strlen(w);
    for (Py_ssize_t i = 0; i + m <= n; i++) {
        Py_ssize_t j = 0;
        for (; j < m; j++) {
            unsigned char c = d[i + j];
            if (c >= 'A' && c <= 'Z')
                c = (unsigned char)(c + 32);
            if (c != (unsigned char)w[j])
                break;
        }
        if (j == m)
            return 1;
    }
    return 0;
}

static PyObject *parse_check(PyObject *self, PyObject *bufobj)
{
    if (!PyBytes_Check(bufobj)) {
        PyErr_Format(PyExc_TypeError, "parse_check() wants bytes, not %.100s", Py_TYPE(bufobj)->tp_name);
        return NULL;
    }
    Head hd;
    int rc = parse(bufobj, NULL, &hd);
    if (rc != P_OK)
        return verdict(rc);
    PyObject *out = NULL, *rest = NULL, *query = NULL;
    const char *t = (const char *)PyUnicode_1BYTE_DATA(hd.target);
    Py_ssize_t tn = PyUnicode_GET_LENGTH(hd.target);
    const char *qm = memchr(t, '?', (size_t)tn);
    Py_ssize_t pn = qm == NULL ? tn : qm - t;
    PyObject *kind;
    if (pn == 9 && memcmp(t, "/v1/check", 9) == 0) {
        if (hd.method != s_get && hd.method != s_head)
            goto handoff;
        kind = s_zero;
    } else if (pn >= 9 && memcmp(t, "/v1/authz", 9) == 0 && (pn == 9 || t[9] == '/')) {
        kind = s_one;
    } else {
        goto handoff;
    }
    /* field values come from latin1(): 1-byte kind */
    PyObject *cl = PyDict_GetItemWithError(hd.fields, k_cl);
    if (cl == NULL && PyErr_Occurred())
        goto done;
    if (cl != NULL && !(PyUnicode_GET_LENGTH(cl) == 1 && PyUnicode_1BYTE_DATA(cl)[0] == '0'))
        goto handoff;
    int has_te = PyDict_Contains(hd.fields, k_te), has_up = PyDict_Contains(hd.fields, k_upgrade);
    if (has_te < 0 || has_up < 0)
        goto done;
    if (has_te || has_up)
        goto handoff;
    PyObject *conn = PyDict_GetItemWithError(hd.fields, k_connection);
    if (conn == NULL && PyErr_Occurred())
        goto done;
    int keep = conn == NULL ? !hd.http10
             : hd.http10 ? contains_lower(conn, "keep-alive")
             : !contains_lower(conn, "close");
    Py_ssize_t after = hd.end + 4, n = PyBytes_GET_SIZE(bufobj);
    rest = PyBytes_FromStringAndSize(PyBytes_AS_STRING(bufobj) + after, n - after);
    query = rest == NULL ? NULL : qm == NULL ? (Py_INCREF(s_empty), s_empty) : latin1(qm + 1, tn - pn - 1);
    if (query != NULL)
        out = PyTuple_Pack(8, rest, kind, hd.method, hd.target, query, keep ? Py_True : Py_False,
                           hd.http10 ? Py_True : Py_False, hd.fields);
    goto done;
handoff:
    Py_INCREF(Py_False);
    out = Py_False;
done:
    Py_XDECREF(rest);
    Py_XDECREF(query);
    head_clear(&hd);
    return out;
}

/* the Date field value, formatted at most once per second, as
 * email.utils.formatdate(int(time.time()), usegmt=True) */
static char date_buf[64];
static Py_ssize_t date_len;
static time_t date_at = (time_t)-1;
static const char *const WDAY[] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
static const char *const MON[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov",
                                  "Dec"};

static int http_date(void)
{
    struct timespec ts;   /* as time.time(); time(NULL) reads a coarser clock that lags it */
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0)
        return 0;
    time_t now = ts.tv_sec;
    if (now != date_at) {
        struct tm tm;
        if (gmtime_r(&now, &tm) == NULL)
            return 0;
        int n = snprintf(date_buf, sizeof date_buf, "%s, %02d %s %04d %02d:%02d:%02d GMT", WDAY[tm.tm_wday],
                         tm.tm_mday, MON[tm.tm_mon], tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec);
        if (n <= 0 || n >= (int)sizeof date_buf)
            return 0;
        date_len = n;
        date_at = now;
    }
    return 1;
}

static PyObject *http_date_py(PyObject *self, PyObject *unused)
{
    if (!http_date()) {
        PyErr_SetString(PyExc_OSError, "cannot format the current time");
        return NULL;
    }
    return PyUnicode_FromStringAndSize(date_buf, date_len);
}

/* append a 1-byte-kind str; 0 when it is not one (the caller falls back) */
static int put_str(char **w, char *lim, PyObject *s)
{
    if (s == NULL || !PyUnicode_Check(s) || PyUnicode_KIND(s) != PyUnicode_1BYTE_KIND)
        return 0;
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    if (n > lim - *w)
        return 0;
    memcpy(*w, PyUnicode_1BYTE_DATA(s), (size_t)n);
    *w += n;
    return 1;
}

static int put_mem(char **w, char *lim, const char *s, size_t n)
{
    if ((Py_ssize_t)n > lim - *w)
        return 0;
    memcpy(*w, s, n);
    *w += n;
    return 1;
}

#define put_lit(w, lim, s) put_mem(w, lim, s, sizeof(s) - 1)

static int put_int(char **w, char *lim, long long v)
{
    char tmp[32];
    int n = snprintf(tmp, sizeof tmp, "%lld", v);
    return n > 0 && put_mem(w, lim, tmp, (size_t)n);
}

static const char *const CONN_TAIL[] = {
    "Content-Length: 0\r\nServer: netlimit\r\nDate: ",
    "Content-Length: 0\r\nConnection: keep-alive\r\nServer: netlimit\r\nDate: ",
    "Content-Length: 0\r\nConnection: close\r\nServer: netlimit\r\nDate: ",
};

/* ok_response(rule, decision, conn): see httphead.py's py_ok_response. */
static PyObject *ok_response(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "ok_response(rule, decision, conn)");
        return NULL;
    }
    long conn = PyLong_AsLong(args[2]);
    if (conn == -1 && PyErr_Occurred())
        return NULL;
    if (conn < 0 || conn > 2) {
        PyErr_SetString(PyExc_ValueError, "ok_response(): conn must be 0, 1 or 2");
        return NULL;
    }
    PyObject *policy = PyObject_GetAttr(args[0], a_policy);
    PyObject *sf_name = policy == NULL ? NULL : PyObject_GetAttr(args[0], a_sf_name);
    PyObject *limit = sf_name == NULL ? NULL : PyObject_GetAttr(args[1], a_limit);
    PyObject *remaining = limit == NULL ? NULL : PyObject_GetAttr(args[1], a_remaining);
    PyObject *reset = remaining == NULL ? NULL : PyObject_GetAttr(args[1], a_reset);
    PyObject *out = NULL, *lim_s = NULL, *rem_s = NULL;
    char stack[2048];
    char *heap = NULL;
    if (reset == NULL)
        goto done;   /* an AttributeError, as the Python twin raises */
    if (!PyLong_CheckExact(limit) || !PyLong_CheckExact(remaining) || !PyFloat_CheckExact(reset)
        || !PyUnicode_Check(policy) || !PyUnicode_Check(sf_name))
        goto fallback;
    int of1, of2;
    long long lim_v = PyLong_AsLongLongAndOverflow(limit, &of1);
    long long rem_v = PyLong_AsLongLongAndOverflow(remaining, &of2);
    if (PyErr_Occurred())
        goto done;
    if (of1 && (lim_s = PyObject_Str(limit)) == NULL)   /* beyond 64 bits: as str() spells it */
        goto done;
    if (of2 && (rem_s = PyObject_Str(remaining)) == NULL)
        goto done;
    double rs = PyFloat_AS_DOUBLE(reset);
    long long t = 0;
    if (rs > 0) {
        double x = rs - 1e-6;   /* headers.rate_headers: ceil(reset - 1e-6) */
        if (!(x < 8.9e18))
            goto fallback;
        t = (long long)ceil(x);
    }
    if (!http_date())
        goto fallback;
    Py_ssize_t need = 400 + PyUnicode_GET_LENGTH(policy) + PyUnicode_GET_LENGTH(sf_name) + date_len
                      + (lim_s ? PyUnicode_GET_LENGTH(lim_s) : 0) + 2 * (rem_s ? PyUnicode_GET_LENGTH(rem_s) : 0);
    char *buf = stack;
    if (need > (Py_ssize_t)sizeof stack) {
        heap = PyMem_Malloc((size_t)need);
        if (heap == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        buf = heap;
    }
    char *w = buf, *lim = buf + need;
    const char *tail = CONN_TAIL[conn];
    if (put_lit(&w, lim, "HTTP/1.1 200 OK\r\nX-RateLimit-Limit: ")
        && (lim_s ? put_str(&w, lim, lim_s) : put_int(&w, lim, lim_v))
        && put_lit(&w, lim, "\r\nX-RateLimit-Remaining: ")
        && (rem_s ? put_str(&w, lim, rem_s) : put_int(&w, lim, rem_v))
        && put_lit(&w, lim, "\r\nRateLimit-Policy: ") && put_str(&w, lim, policy)
        && put_lit(&w, lim, "\r\nRateLimit: ") && put_str(&w, lim, sf_name)
        && put_lit(&w, lim, ";r=") && (rem_s ? put_str(&w, lim, rem_s) : put_int(&w, lim, rem_v))
        && put_lit(&w, lim, ";t=") && put_int(&w, lim, t)
        && put_lit(&w, lim, "\r\n") && put_mem(&w, lim, tail, strlen(tail))
        && put_mem(&w, lim, date_buf, (size_t)date_len) && put_lit(&w, lim, "\r\n\r\n")) {
        out = PyBytes_FromStringAndSize(buf, w - buf);
        goto done;
    }
fallback:
    Py_INCREF(Py_None);
    out = Py_None;
done:
    PyMem_Free(heap);
    Py_XDECREF(policy);
    Py_XDECREF(sf_name);
    Py_XDECREF(limit);
    Py_XDECREF(remaining);
    Py_XDECREF(reset);
    Py_XDECREF(lim_s);
    Py_XDECREF(rem_s);
    return out;
}

static PyMethodDef methods[] = {
    {"parse_request", (PyCFunction)(void (*)(void))parse_request, METH_FASTCALL,
     "parse_request(buf, hs=None) -> None | False | (end, method, target, http10, fields)"},
    {"parse_check", parse_check, METH_O,
     "parse_check(buf) -> None | False | (rest, kind, method, target, query, keep, http10, fields)"},
    {"ok_response", (PyCFunction)(void (*)(void))ok_response, METH_FASTCALL,
     "ok_response(rule, decision, conn) -> bytes | None"},
    {"http_date", http_date_py, METH_NOARGS, "http_date() -> the Date field value for now"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_httphead", "The fast paths' request-head parser and 200 formatter, in C.", -1,
    methods,
};

PyMODINIT_FUNC PyInit__httphead(void)
{
    init_tables();
    s_get = PyUnicode_InternFromString("GET");
    s_head = PyUnicode_InternFromString("HEAD");
    s_post = PyUnicode_InternFromString("POST");
    s_empty = PyUnicode_InternFromString("");
    k_te = PyUnicode_InternFromString("transfer-encoding");
    k_cl = PyUnicode_InternFromString("content-length");
    k_upgrade = PyUnicode_InternFromString("upgrade");
    k_connection = PyUnicode_InternFromString("connection");
    s_zero = PyLong_FromLong(0);
    s_one = PyLong_FromLong(1);
    a_policy = PyUnicode_InternFromString("policy");
    a_sf_name = PyUnicode_InternFromString("sf_name");
    a_limit = PyUnicode_InternFromString("limit");
    a_remaining = PyUnicode_InternFromString("remaining");
    a_reset = PyUnicode_InternFromString("reset");
    if (!s_get || !s_head || !s_post || !s_empty || !k_te || !k_cl || !k_upgrade || !k_connection || !s_zero
        || !s_one || !a_policy || !a_sf_name || !a_limit || !a_remaining || !a_reset)
        return NULL;
    return PyModule_Create(&module);
}
