/*
 * kvscope.agent.tap._relay: the tap's per-read work for a streamed answer, in C.
 *
 * A `Relay` takes over an upstream response once its head has been read: every upstream
 * read goes to `feed(data)`, which
 *   1. undoes the upstream's chunked transfer coding (a strict decoder: hex size, optional
 *      extensions, CRLF, data, CRLF; the zero chunk, trailers, CRLF ends the message),
 *   2. cuts the body into server-sent events at their blank-line terminators (the earliest of
 *      "\n\n" and "\r\n\r\n", as agent/tap/sse.py's SseSplitter does), keeping a partial event
 *      for the next read,
 *   3. counts each compact token event (one `data:` line, `"choices":[{`, no `"usage"`) at
 *      this read's time and hands every other event to the Python callback `special(event)`,
 *      which answers 0 (pass it on), 1 (pass it on, it was a token) or 2 (drop it: the usage
 *      chunk the tap asked for and the client did not),
 *   4. writes what passes to the client in one chunk of the client's framing, through the
 *      client transport's `write` (the response head first, with the first body bytes).
 * When the zero chunk arrives, nothing is written: `on_end(head, body)` gets the head if it is
 * still unsent and the rest of the body (the last events plus any bytes after the last
 * terminator), so the caller can end the client's response in one write (`trailing` says
 * whether bytes followed the message: the connection must not be reused). A framing error calls
 * `on_error(message)` once; the relay then ignores further input, as it does after `close()`.
 *
 * Times are CLOCK_MONOTONIC seconds, the clock of time.perf_counter() on Linux. The gaps
 * between token reads are kept as C doubles and returned as a list by `gaps()`. No text is kept
 * beyond the partial event that waits for its end (bounded by max_event_bytes: beyond it the
 * bytes are passed on unparsed, as sse.py does).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <string.h>
#include <time.h>

enum {
    S_SIZE, S_EXT, S_SIZE_LF, S_DATA, S_DATA_CR, S_DATA_LF,
    S_TRAILER, S_TRAILER_LINE, S_END_LF, S_DONE, S_FAILED
};

#define MAX_CHUNK_SIZE ((Py_ssize_t)1 << 40)

typedef struct {
    PyObject_HEAD
    PyObject *write;            /* client transport.write */
    PyObject *special;          /* callable(event: bytes) -> int */
    PyObject *on_end;           /* callable(head: bytes | None, body: bytes) */
    PyObject *on_error;         /* callable(message: str) */
    PyObject *head;             /* the client's response head, until it is written */
    int state;
    int digits;
    Py_ssize_t remaining;       /* chunk size being read, then bytes left in the chunk */
    char *buf;                  /* decoded body bytes not yet passed on (a partial event) */
    Py_ssize_t len, cap;
    char *out;                  /* scratch: the passed events when one was dropped */
    Py_ssize_t out_cap;
    Py_ssize_t max_event_bytes;
    double first_token, last_token;
    int have_token;
    double *gaps;
    Py_ssize_t ngaps, gaps_cap;
    Py_ssize_t tokens, reads;
    int trailing;               /* bytes came after the end of the message */
} Relay;

static double now_monotonic(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int reserve(char **p, Py_ssize_t *cap, Py_ssize_t need)
{
    if (need <= *cap)
        return 0;
    Py_ssize_t n = *cap ? *cap : 4096;
    while (n < need)
        n *= 2;
    char *q = PyMem_Realloc(*p, (size_t)n);
    if (q == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    *p = q;
    *cap = n;
    return 0;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Decode the chunked framing of data into self->buf. Returns the number of input bytes
 * consumed (all of them unless the message ended), or -1 on a framing error (self->state is
 * S_FAILED) or out of memory (an exception is set). */
static Py_ssize_t decode_chunked(Relay *self, const char *p, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    while (i < n && self->state != S_DONE) {
        char c = p[i];
        switch (self->state) {
        case S_SIZE: {
            int v = hexval(c);
            if (v >= 0) {
                self->remaining = self->remaining * 16 + v;
                if (++self->digits > 10 || self->remaining > MAX_CHUNK_SIZE)
                    goto bad;
            } else if (self->digits && (c == ';' || c == ' ' || c == '\t')) {
                self->state = S_EXT;
            } else if (self->digits && c == '\r') {
                self->state = S_SIZE_LF;
            } else {
                goto bad;
            }
            i++;
            break;
        }
        case S_EXT:
            if (c == '\r')
                self->state = S_SIZE_LF;
            else if (c == '\n')
                goto bad;
            i++;
            break;
        case S_SIZE_LF:
            if (c != '\n')
                goto bad;
            self->state = self->remaining ? S_DATA : S_TRAILER;
            i++;
            break;
        case S_DATA: {
            Py_ssize_t take = n - i < self->remaining ? n - i : self->remaining;
            if (reserve(&self->buf, &self->cap, self->len + take) < 0)
                return -1;
            memcpy(self->buf + self->len, p + i, (size_t)take);
            self->len += take;
            self->remaining -= take;
            i += take;
            if (!self->remaining)
                self->state = S_DATA_CR;
            break;
        }
        case S_DATA_CR:
            if (c != '\r')
                goto bad;
            self->state = S_DATA_LF;
            i++;
            break;
        case S_DATA_LF:
            if (c != '\n')
                goto bad;
            self->state = S_SIZE;
            self->digits = 0;
            self->remaining = 0;
            i++;
            break;
        case S_TRAILER:           /* at the start of a trailer line, or of the final CRLF */
            self->state = c == '\r' ? S_END_LF : S_TRAILER_LINE;
            i++;
            break;
        case S_TRAILER_LINE:
            if (c == '\n')
                self->state = S_TRAILER;
            i++;
            break;
        case S_END_LF:
            if (c != '\n')
                goto bad;
            self->state = S_DONE;
            i++;
            break;
        default:
            goto bad;
        }
    }
    return i;
bad:
    self->state = S_FAILED;
    return -1;
}

/* The end of the first event terminator at or after `from` (searching from `from`, a
 * terminator may start one byte earlier), or -1. */
static Py_ssize_t find_event_end(const char *b, Py_ssize_t from, Py_ssize_t len)
{
    Py_ssize_t k = from;
    while (k < len) {
        const char *nl = memchr(b + k, '\n', (size_t)(len - k));
        if (nl == NULL)
            return -1;
        k = nl - b;
        if (k + 1 < len && b[k + 1] == '\n')
            return k + 2;
        if (k >= 1 && b[k - 1] == '\r' && k + 2 < len && b[k + 1] == '\r' && b[k + 2] == '\n')
            return k + 3;
        k++;
    }
    return -1;
}

static int contains(const char *b, Py_ssize_t n, const char *needle, size_t m)
{
    return memmem(b, (size_t)n, needle, m) != NULL;
}

/* A compact token chunk: starts with `data:`, no other `data:`, `"choices":[{`, no `"usage"`. */
static int is_token_event(const char *e, Py_ssize_t n)
{
    if (n < 5 || memcmp(e, "data:", 5) != 0)
        return 0;
    if (contains(e + 5, n - 5, "data:", 5))
        return 0;
    if (!contains(e, n, "\"choices\":[{", 12))
        return 0;
    return !contains(e, n, "\"usage\"", 7);
}

static int add_token(Relay *self, double now)
{
    if (!self->have_token) {
        self->have_token = 1;
        self->first_token = now;
    } else {
        if (self->ngaps == self->gaps_cap) {
            Py_ssize_t n = self->gaps_cap ? self->gaps_cap * 2 : 64;
            double *g = PyMem_Realloc(self->gaps, (size_t)n * sizeof(double));
            if (g == NULL) {
                PyErr_NoMemory();
                return -1;
            }
            self->gaps = g;
            self->gaps_cap = n;
        }
        self->gaps[self->ngaps++] = now - self->last_token;
    }
    self->last_token = now;
    self->tokens++;
    return 0;
}

/* 0 pass, 1 pass (token), 2 drop; -1 with an exception set. */
static int ask_special(Relay *self, const char *e, Py_ssize_t n)
{
    if (self->special == NULL)      /* closed from a callback */
        return 0;
    PyObject *ev = PyBytes_FromStringAndSize(e, n);
    if (ev == NULL)
        return -1;
    PyObject *r = PyObject_CallOneArg(self->special, ev);
    Py_DECREF(ev);
    if (r == NULL)
        return -1;
    long v = PyLong_AsLong(r);
    Py_DECREF(r);
    if (v == -1 && PyErr_Occurred())
        return -1;
    return (int)v;
}

/* Split the complete events in buf[0:len) (the first terminator search starts at `from`),
 * count and classify them. On return *end is where the complete events stop, and the bytes
 * to pass on are buf[0:*end) when *dropped is 0, else out[0:*out_len). */
static int scan_events(Relay *self, Py_ssize_t from, double now, Py_ssize_t *end, int *dropped,
                       Py_ssize_t *out_len)
{
    Py_ssize_t pos = 0, e;
    *dropped = 0;
    *out_len = 0;
    while ((e = find_event_end(self->buf, from > pos ? from : pos, self->len)) >= 0) {
        const char *ev = self->buf + pos;
        Py_ssize_t n = e - pos;
        int kind = is_token_event(ev, n) ? 1 : ask_special(self, ev, n);
        if (kind < 0)
            return -1;
        if (kind == 1 && add_token(self, now) < 0)
            return -1;
        if (kind == 2 && !*dropped) {          /* from here on, collect what passes */
            *dropped = 1;
            if (reserve(&self->out, &self->out_cap, pos) < 0)
                return -1;
            memcpy(self->out, self->buf, (size_t)pos);
            *out_len = pos;
        } else if (kind != 2 && *dropped) {
            if (reserve(&self->out, &self->out_cap, *out_len + n) < 0)
                return -1;
            memcpy(self->out + *out_len, ev, (size_t)n);
            *out_len += n;
        }
        pos = e;
    }
    *end = pos;
    return 0;
}

/* bytes: [head] + hex(n) CRLF payload CRLF */
static PyObject *frame(Relay *self, const char *payload, Py_ssize_t n)
{
    char hex[24];
    int h = 0;
    for (int shift = 60; shift >= 0; shift -= 4) {      /* lower-case hex, no leading zeros */
        int d = (int)(((size_t)n >> shift) & 0xf);
        if (d || h || shift == 0)
            hex[h++] = "0123456789abcdef"[d];
    }
    hex[h++] = '\r';
    hex[h++] = '\n';
    Py_ssize_t hl = self->head ? PyBytes_GET_SIZE(self->head) : 0;
    PyObject *b = PyBytes_FromStringAndSize(NULL, hl + h + n + 2);
    if (b == NULL)
        return NULL;
    char *d = PyBytes_AS_STRING(b);
    if (hl) {
        memcpy(d, PyBytes_AS_STRING(self->head), (size_t)hl);
        d += hl;
    }
    memcpy(d, hex, (size_t)h);
    memcpy(d + h, payload, (size_t)n);
    memcpy(d + h + n, "\r\n", 2);
    Py_CLEAR(self->head);
    return b;
}

static void consume(Relay *self, Py_ssize_t end)
{
    if (end >= self->len) {
        self->len = 0;
    } else if (end > 0) {
        memmove(self->buf, self->buf + end, (size_t)(self->len - end));
        self->len -= end;
    }
}

static PyObject *finish(Relay *self, const char *payload, Py_ssize_t n, Py_ssize_t end)
{
    /* body = payload + buf[end:len) (the bytes after the last terminator, passed as they are) */
    Py_ssize_t rest = self->len - end;
    PyObject *body = PyBytes_FromStringAndSize(NULL, n + rest);
    if (body == NULL)
        return NULL;
    memcpy(PyBytes_AS_STRING(body), payload, (size_t)n);
    memcpy(PyBytes_AS_STRING(body) + n, self->buf + end, (size_t)rest);
    self->len = 0;
    if (self->on_end == NULL) {
        Py_DECREF(body);
        Py_RETURN_NONE;
    }
    PyObject *head = self->head ? self->head : Py_None;
    Py_INCREF(head);
    Py_CLEAR(self->head);
    PyObject *r = PyObject_CallFunctionObjArgs(self->on_end, head, body, NULL);
    Py_DECREF(head);
    Py_DECREF(body);
    return r;
}

static PyObject *fail(Relay *self, const char *message)
{
    self->state = S_FAILED;
    self->len = 0;
    if (self->on_error == NULL)
        Py_RETURN_NONE;
    return PyObject_CallFunction(self->on_error, "s", message);
}

static PyObject *Relay_feed(Relay *self, PyObject *data)
{
    Py_buffer view;
    if (self->state == S_DONE || self->state == S_FAILED || self->write == NULL)
        Py_RETURN_NONE;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    self->reads++;
    double now = now_monotonic();
    Py_ssize_t from = self->len >= 3 ? self->len - 3 : 0;
    Py_ssize_t used = decode_chunked(self, view.buf, view.len);
    int done = self->state == S_DONE;
    if (done && used < view.len)
        self->trailing = 1;       /* the connection cannot be reused; the answer itself is whole */
    PyBuffer_Release(&view);
    if (used < 0) {
        if (PyErr_Occurred())
            return NULL;
        return fail(self, "malformed chunked encoding from the upstream");
    }
    Py_ssize_t end;
    int dropped;
    Py_ssize_t out_len;
    if (scan_events(self, from, now, &end, &dropped, &out_len) < 0)
        return NULL;
    const char *payload = dropped ? self->out : self->buf;
    Py_ssize_t n = dropped ? out_len : end;
    if (done)
        return finish(self, payload, n, end);
    if (self->len - end > self->max_event_bytes) {    /* not SSE after all: stop holding it back */
        if (!dropped) {
            n = self->len;
        } else {
            if (reserve(&self->out, &self->out_cap, n + self->len - end) < 0)
                return NULL;
            memcpy(self->out + n, self->buf + end, (size_t)(self->len - end));
            n += self->len - end;
        }
        end = self->len;
    }
    if (n == 0) {
        consume(self, end);
        Py_RETURN_NONE;
    }
    PyObject *b = frame(self, payload, n);
    consume(self, end);
    if (b == NULL)
        return NULL;
    if (self->write == NULL) {            /* closed from a callback */
        Py_DECREF(b);
        Py_RETURN_NONE;
    }
    PyObject *r = PyObject_CallOneArg(self->write, b);
    Py_DECREF(b);
    if (r == NULL)
        return NULL;
    Py_DECREF(r);
    Py_RETURN_NONE;
}

static PyObject *Relay_gaps(Relay *self, PyObject *Py_UNUSED(ignored))
{
    PyObject *l = PyList_New(self->ngaps);
    if (l == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < self->ngaps; i++) {
        PyObject *f = PyFloat_FromDouble(self->gaps[i]);
        if (f == NULL) {
            Py_DECREF(l);
            return NULL;
        }
        PyList_SET_ITEM(l, i, f);
    }
    return l;
}

static PyObject *Relay_close(Relay *self, PyObject *Py_UNUSED(ignored))
{
    if (self->state != S_DONE)
        self->state = S_FAILED;
    Py_CLEAR(self->write);
    Py_CLEAR(self->special);
    Py_CLEAR(self->on_end);
    Py_CLEAR(self->on_error);
    Py_CLEAR(self->head);
    Py_RETURN_NONE;
}

static PyObject *Relay_get_first(Relay *self, void *c)
{
    (void)c;
    if (!self->have_token)
        Py_RETURN_NONE;
    return PyFloat_FromDouble(self->first_token);
}

static PyObject *Relay_get_last(Relay *self, void *c)
{
    (void)c;
    if (!self->have_token)
        Py_RETURN_NONE;
    return PyFloat_FromDouble(self->last_token);
}

static PyObject *Relay_get_done(Relay *self, void *c)
{
    (void)c;
    return PyBool_FromLong(self->state == S_DONE);
}

static PyObject *Relay_get_trailing(Relay *self, void *c)
{
    (void)c;
    return PyBool_FromLong(self->trailing);
}

static int Relay_init(Relay *self, PyObject *args, PyObject *kwds)
{
    static char *kw[] = {"write", "special", "on_end", "on_error", "head", "max_event_bytes", NULL};
    PyObject *write, *special, *on_end, *on_error, *head = Py_None;
    Py_ssize_t max_event = 4 << 20;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOO|On:Relay", kw, &write, &special, &on_end,
                                     &on_error, &head, &max_event))
        return -1;
    if (head != Py_None && !PyBytes_Check(head)) {
        PyErr_SetString(PyExc_TypeError, "head must be bytes or None");
        return -1;
    }
    if (max_event < 1) {
        PyErr_SetString(PyExc_ValueError, "max_event_bytes must be positive");
        return -1;
    }
    Py_INCREF(write);
    Py_XSETREF(self->write, write);
    Py_INCREF(special);
    Py_XSETREF(self->special, special);
    Py_INCREF(on_end);
    Py_XSETREF(self->on_end, on_end);
    Py_INCREF(on_error);
    Py_XSETREF(self->on_error, on_error);
    Py_XSETREF(self->head, head == Py_None || PyBytes_GET_SIZE(head) == 0 ? NULL : Py_NewRef(head));
    self->max_event_bytes = max_event;
    self->state = S_SIZE;
    self->digits = 0;
    self->remaining = 0;
    self->len = 0;
    self->have_token = 0;
    self->ngaps = 0;
    self->tokens = 0;
    self->reads = 0;
    self->trailing = 0;
    return 0;
}

static int Relay_traverse(Relay *self, visitproc visit, void *arg)
{
    Py_VISIT(self->write);
    Py_VISIT(self->special);
    Py_VISIT(self->on_end);
    Py_VISIT(self->on_error);
    return 0;
}

static int Relay_clear(Relay *self)
{
    Py_CLEAR(self->write);
    Py_CLEAR(self->special);
    Py_CLEAR(self->on_end);
    Py_CLEAR(self->on_error);
    Py_CLEAR(self->head);
    return 0;
}

static void Relay_dealloc(Relay *self)
{
    PyObject_GC_UnTrack(self);
    Relay_clear(self);
    PyMem_Free(self->buf);
    PyMem_Free(self->out);
    PyMem_Free(self->gaps);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Relay_methods[] = {
    {"feed", (PyCFunction)Relay_feed, METH_O,
     "feed(data): one upstream read of the response body (chunked coding); writes what passes."},
    {"gaps", (PyCFunction)Relay_gaps, METH_NOARGS,
     "gaps() -> list[float]: seconds between token reads (0.0 for tokens that came in one read)."},
    {"close", (PyCFunction)Relay_close, METH_NOARGS,
     "close(): drop the callbacks; further input is ignored."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Relay_members[] = {
    {"tokens", T_PYSSIZET, offsetof(Relay, tokens), READONLY, "token events seen"},
    {"reads", T_PYSSIZET, offsetof(Relay, reads), READONLY, "feed() calls"},
    {"pending", T_PYSSIZET, offsetof(Relay, len), READONLY, "bytes of a partial event held back"},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef Relay_getset[] = {
    {"first_token", (getter)Relay_get_first, NULL, "perf_counter time of the first token read, or None", NULL},
    {"last_token", (getter)Relay_get_last, NULL, "perf_counter time of the last token read, or None", NULL},
    {"done", (getter)Relay_get_done, NULL, "the upstream's message ended", NULL},
    {"trailing", (getter)Relay_get_trailing, NULL, "bytes followed the end of the message (do not reuse the connection)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject RelayType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kvscope.agent.tap._relay.Relay",
    .tp_basicsize = sizeof(Relay),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The per-read work of one streamed (chunked, SSE) upstream answer: decode, scan, write.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Relay_init,
    .tp_dealloc = (destructor)Relay_dealloc,
    .tp_traverse = (traverseproc)Relay_traverse,
    .tp_clear = (inquiry)Relay_clear,
    .tp_methods = Relay_methods,
    .tp_members = Relay_members,
    .tp_getset = Relay_getset,
};

static struct PyModuleDef relay_module = {
    PyModuleDef_HEAD_INIT, "_relay",
    "The tap's native forwarding loop for streamed answers (see agent/tap/native.py).", -1, NULL,
};

PyMODINIT_FUNC PyInit__relay(void)
{
    if (PyType_Ready(&RelayType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&relay_module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&RelayType);
    if (PyModule_AddObject(m, "Relay", (PyObject *)&RelayType) < 0) {
        Py_DECREF(&RelayType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
