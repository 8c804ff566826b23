/*
 * kvscope.agent.tap._front: the tap's request side for the common case, in C.
 *
 * `render(data, prefix, host, inject, max_body)` looks at one client read. When the read holds
 * exactly one complete, plain request to an accounted path, it returns the request as it must go
 * upstream, so the tap can write it before any Python work on the request:
 *
 *     (wire, trace_id, span_id, injected, keep_alive, head_len)
 *
 * and None in every other case, for the llhttp path in Python (agent/tap/http1.py) to handle as
 * before. "Plain" is deliberately narrow; None whenever any of these holds:
 *   - not `POST <target> HTTP/1.1` with the path (before any '?') /v1/completions or
 *     /v1/chat/completions, or a target byte outside 0x21-0x7e;
 *   - a header line that is not `token ":" OWS value` with a non-empty value and no trailing
 *     whitespace, a control byte in a value, more than MAX_HEADERS headers, or more than
 *     max_header_bytes of names and values (the Python path answers 431);
 *   - Transfer-Encoding, Expect, Upgrade, Proxy-Connection, traceparent, tracestate, a header
 *     named "close", a second Content-Length or Connection, or a Connection other than
 *     keep-alive / close;
 *   - no Content-Length, one over max_body (the Python path answers 413), or a read that does
 *     not end exactly where the body ends (partial or pipelined);
 *   - a body that is not a JSON object this scanner can vouch for: strict RFC 8259 (UTF-8
 *     checked, surrogate escapes paired), nesting under MAX_DEPTH, integers under 100 digits,
 *     fractions and exponents short enough to stay finite, top-level keys without escapes;
 *   - `stream` is true, usage is to be injected and the body has a `stream_options` member
 *     that does not ask for usage (Python re-encodes that body).
 *
 * The wire bytes are what the Python path renders (proxy.py `render_upstream`): request line
 * with the upstream's prefix, `Host`, the client's headers minus hop-by-hop ones and
 * Accept-Encoding, a new `traceparent`, `Content-Length`, and the body, with
 * `,"stream_options":{"include_usage":true}` added before its last '}' when `injected`.
 * tests/unit/test_tap_front.py holds the two paths to the same bytes. Trace and span ids come
 * from a xorshift generator seeded by `seed(n)` (W3C ids need to be random, not secret).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_HEADERS 100
#define MAX_DEPTH 64
#define MAX_TARGET 8192

typedef struct { const unsigned char *p; Py_ssize_t len; } Span;

static uint64_t rng_state = 0x9E3779B97F4A7C15ULL;

static uint64_t next_random(void)
{
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    rng_state = x;
    return x * 0x2545F4914F6CDD1DULL;
}

static void hex_id(char *out, int nbytes)
{
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < nbytes; i += 8) {
        uint64_t r = next_random();
        if (i + 8 >= nbytes)
            r |= 1;                       /* never all zero, as proxy.py's _hex */
        for (int j = 0; j < 8 && i + j < nbytes; j++) {
            unsigned b = (unsigned)(r >> (56 - 8 * j)) & 0xff;
            out[2 * (i + j)] = digits[b >> 4];
            out[2 * (i + j) + 1] = digits[b & 15];
        }
    }
}

/* ------------------------------------------------------------------ JSON */

typedef struct {
    const unsigned char *p, *end;
    int stream_true;         /* the last top-level "stream" is the literal true */
    int has_options;         /* a top-level "stream_options" member exists */
    int asks_usage;          /* the last "stream_options" is an object whose last include_usage is true */
} Json;

static int json_value(Json *j, int depth, int *is_true, int track_usage);

static void json_ws(Json *j)
{
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
        j->p++;
}

static int hex4(const unsigned char *p, unsigned *out)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned c = p[i];
        if (c >= '0' && c <= '9') v = v * 16 + (c - '0');
        else if (c >= 'a' && c <= 'f') v = v * 16 + (c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v = v * 16 + (c - 'A' + 10);
        else return 0;
    }
    *out = v;
    return 1;
}

/* One UTF-8 sequence starting at j->p (a byte >= 0x80); strict: no overlongs, no surrogates. */
static int json_utf8(Json *j)
{
    const unsigned char *p = j->p;
    Py_ssize_t left = j->end - p;
    unsigned c = p[0];
    int n;
    unsigned min, cp;
    if (c >= 0xC2 && c <= 0xDF) { n = 2; min = 0x80; cp = c & 0x1F; }
    else if (c >= 0xE0 && c <= 0xEF) { n = 3; min = 0x800; cp = c & 0x0F; }
    else if (c >= 0xF0 && c <= 0xF4) { n = 4; min = 0x10000; cp = c & 0x07; }
    else return 0;
    if (left < n) return 0;
    for (int i = 1; i < n; i++) {
        if ((p[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (p[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    j->p += n;
    return 1;
}

/* A string; *escaped says whether it held a backslash. The text itself is not kept. */
static int json_string(Json *j, const unsigned char **start, Py_ssize_t *len, int *escaped)
{
    j->p++;                                   /* the opening quote */
    *start = j->p;
    *escaped = 0;
    while (j->p < j->end) {
        unsigned c = *j->p;
        if (c == '"') {
            *len = j->p - *start;
            j->p++;
            return 1;
        }
        if (c < 0x20) return 0;
        if (c == '\\') {
            *escaped = 1;
            if (j->end - j->p < 2) return 0;
            c = j->p[1];
            if (c == 'u') {
                unsigned u, lo;
                if (j->end - j->p < 6 || !hex4(j->p + 2, &u)) return 0;
                j->p += 6;
                if (u >= 0xDC00 && u <= 0xDFFF) return 0;            /* a lone low surrogate */
                if (u >= 0xD800 && u <= 0xDBFF) {                      /* must pair with a low one */
                    if (j->end - j->p < 6 || j->p[0] != '\\' || j->p[1] != 'u' || !hex4(j->p + 2, &lo)
                        || lo < 0xDC00 || lo > 0xDFFF)
                        return 0;
                    j->p += 6;
                }
                continue;
            }
            if (!strchr("\"\\/bfnrt", (int)c) || c == 0) return 0;
            j->p += 2;
            continue;
        }
        if (c >= 0x80) {
            if (!json_utf8(j)) return 0;
            continue;
        }
        j->p++;
    }
    return 0;
}

static int json_number(Json *j)
{
    int digits = 0, real = 0;
    if (j->p < j->end && *j->p == '-') j->p++;
    if (j->p >= j->end) return 0;
    if (*j->p == '0') {
        j->p++;
        digits = 1;
    } else if (*j->p >= '1' && *j->p <= '9') {
        while (j->p < j->end && *j->p >= '0' && *j->p <= '9') { j->p++; digits++; }
    } else {
        return 0;
    }
    if (j->p < j->end && *j->p == '.') {
        real = 1;
        j->p++;
        const unsigned char *f = j->p;
        while (j->p < j->end && *j->p >= '0' && *j->p <= '9') { j->p++; digits++; }
        if (j->p == f) return 0;
    }
    if (j->p < j->end && (*j->p == 'e' || *j->p == 'E')) {
        real = 1;
        j->p++;
        if (j->p < j->end && (*j->p == '+' || *j->p == '-')) j->p++;
        const unsigned char *e = j->p;
        while (j->p < j->end && *j->p >= '0' && *j->p <= '9') j->p++;
        if (j->p == e || j->p - e > 2) return 0;          /* no exponent, or one that may overflow */
    }
    return real ? digits <= 40 : digits < 100;
}

static int json_literal(Json *j, const char *word, Py_ssize_t n)
{
    if (j->end - j->p < n || memcmp(j->p, word, (size_t)n) != 0) return 0;
    j->p += n;
    return 1;
}

static int key_is(const unsigned char *k, Py_ssize_t n, const char *word)
{
    return (Py_ssize_t)strlen(word) == n && memcmp(k, word, (size_t)n) == 0;
}

/* An object. At depth 1 (the body) it notes "stream" and "stream_options"; with track_usage
 * (the stream_options object) it notes "include_usage". */
static int json_object(Json *j, int depth, int track_usage)
{
    int usage = 0;
    j->p++;
    json_ws(j);
    if (j->p < j->end && *j->p == '}') {
        j->p++;
        if (track_usage) j->asks_usage = 0;
        return 1;
    }
    for (;;) {
        const unsigned char *k;
        Py_ssize_t klen;
        int escaped, is_true = 0;
        json_ws(j);
        if (j->p >= j->end || *j->p != '"' || !json_string(j, &k, &klen, &escaped)) return 0;
        if ((depth == 1 || track_usage) && escaped) return 0;   /* "\u0073tream" is "stream" */
        json_ws(j);
        if (j->p >= j->end || *j->p != ':') return 0;
        j->p++;
        json_ws(j);
        int options = depth == 1 && key_is(k, klen, "stream_options");
        if (!json_value(j, depth, &is_true, options)) return 0;
        if (depth == 1 && key_is(k, klen, "stream")) j->stream_true = is_true;
        if (options) j->has_options = 1;
        if (track_usage && key_is(k, klen, "include_usage")) usage = is_true;
        json_ws(j);
        if (j->p >= j->end) return 0;
        if (*j->p == ',') { j->p++; continue; }
        if (*j->p == '}') { j->p++; break; }
        return 0;
    }
    if (track_usage) j->asks_usage = usage;
    return 1;
}

static int json_array(Json *j, int depth)
{
    int dummy;
    j->p++;
    json_ws(j);
    if (j->p < j->end && *j->p == ']') { j->p++; return 1; }
    for (;;) {
        json_ws(j);
        if (!json_value(j, depth, &dummy, 0)) return 0;
        json_ws(j);
        if (j->p >= j->end) return 0;
        if (*j->p == ',') { j->p++; continue; }
        if (*j->p == ']') { j->p++; return 1; }
        return 0;
    }
}

/* A value at nesting `depth` (its container's); *is_true: it was the literal true. A
 * stream_options value that is not an object asks for nothing. */
static int json_value(Json *j, int depth, int *is_true, int track_usage)
{
    const unsigned char *s;
    Py_ssize_t n;
    int escaped;
    *is_true = 0;
    if (j->p >= j->end) return 0;
    if (track_usage && *j->p != '{') j->asks_usage = 0;
    switch (*j->p) {
    case '{':
        return depth + 1 < MAX_DEPTH && json_object(j, depth + 1, track_usage);
    case '[':
        return depth + 1 < MAX_DEPTH && json_array(j, depth + 1);
    case '"':
        return json_string(j, &s, &n, &escaped);
    case 't':
        return (*is_true = json_literal(j, "true", 4));
    case 'f':
        return json_literal(j, "false", 5);
    case 'n':
        return json_literal(j, "null", 4);
    default:
        return json_number(j);
    }
}

/* The body as a JSON object: 1 with the flags set, 0 if this scanner cannot vouch for it. */
static int json_body(Json *j, const unsigned char *p, Py_ssize_t n)
{
    j->p = p;
    j->end = p + n;
    j->stream_true = j->has_options = j->asks_usage = 0;
    json_ws(j);
    if (j->p >= j->end || *j->p != '{' || !json_object(j, 1, 0)) return 0;
    json_ws(j);
    return j->p == j->end;
}

/* ------------------------------------------------------------------ HTTP */

static const char TCHAR[256] = {
    ['!'] = 1, ['#'] = 1, ['$'] = 1, ['%'] = 1, ['&'] = 1, ['\''] = 1, ['*'] = 1, ['+'] = 1,
    ['-'] = 1, ['.'] = 1, ['^'] = 1, ['_'] = 1, ['`'] = 1, ['|'] = 1, ['~'] = 1,
    ['0'] = 1, ['1'] = 1, ['2'] = 1, ['3'] = 1, ['4'] = 1, ['5'] = 1, ['6'] = 1, ['7'] = 1, ['8'] = 1, ['9'] = 1,
    ['A'] = 1, ['B'] = 1, ['C'] = 1, ['D'] = 1, ['E'] = 1, ['F'] = 1, ['G'] = 1, ['H'] = 1, ['I'] = 1,
    ['J'] = 1, ['K'] = 1, ['L'] = 1, ['M'] = 1, ['N'] = 1, ['O'] = 1, ['P'] = 1, ['Q'] = 1, ['R'] = 1,
    ['S'] = 1, ['T'] = 1, ['U'] = 1, ['V'] = 1, ['W'] = 1, ['X'] = 1, ['Y'] = 1, ['Z'] = 1,
    ['a'] = 1, ['b'] = 1, ['c'] = 1, ['d'] = 1, ['e'] = 1, ['f'] = 1, ['g'] = 1, ['h'] = 1, ['i'] = 1,
    ['j'] = 1, ['k'] = 1, ['l'] = 1, ['m'] = 1, ['n'] = 1, ['o'] = 1, ['p'] = 1, ['q'] = 1, ['r'] = 1,
    ['s'] = 1, ['t'] = 1, ['u'] = 1, ['v'] = 1, ['w'] = 1, ['x'] = 1, ['y'] = 1, ['z'] = 1,
};

static int name_is(Span n, const char *lower)
{
    Py_ssize_t len = (Py_ssize_t)strlen(lower);
    if (n.len != len) return 0;
    for (Py_ssize_t i = 0; i < len; i++) {
        unsigned c = n.p[i];
        if (c >= 'A' && c <= 'Z') c += 32;
        if (c != (unsigned char)lower[i]) return 0;
    }
    return 1;
}

enum { H_KEEP, H_DROP, H_LENGTH, H_CONNECTION, H_REFUSE };

static int classify(Span n)
{
    /* llhttp reads Proxy-Connection as Connection: leave both meanings to it */
    static const char *refused[] = {"transfer-encoding", "expect", "upgrade", "traceparent", "tracestate",
                                    "close", "proxy-connection", NULL};
    static const char *dropped[] = {"host", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
                                    "trailers", "accept-encoding", NULL};
    if (name_is(n, "content-length")) return H_LENGTH;
    if (name_is(n, "connection")) return H_CONNECTION;
    for (int i = 0; refused[i]; i++)
        if (name_is(n, refused[i])) return H_REFUSE;
    for (int i = 0; dropped[i]; i++)
        if (name_is(n, dropped[i])) return H_DROP;
    return H_KEEP;
}

typedef struct {
    Span target;
    Span names[MAX_HEADERS], values[MAX_HEADERS];
    int kept;
    Py_ssize_t length;         /* Content-Length, -1 if none */
    int keep_alive;
    Py_ssize_t head_len;       /* bytes up to and with the blank line */
} Head;

static int accounted(Span t)
{
    Py_ssize_t n = 0;
    while (n < t.len && t.p[n] != '?') n++;
    Span path = {t.p, n};
    return (n == 15 && memcmp(path.p, "/v1/completions", 15) == 0)
        || (n == 20 && memcmp(path.p, "/v1/chat/completions", 20) == 0);
}

/* The request line and headers of data into h: 1, or 0 for "not the plain case". */
static int parse_head(const unsigned char *p, Py_ssize_t n, Py_ssize_t max_header, Py_ssize_t max_body, Head *h)
{
    const unsigned char *end = p + n, *s = p;
    Py_ssize_t hsize;
    int have_connection = 0;
    if (n < 5 || memcmp(p, "POST ", 5) != 0) return 0;
    s = p + 5;
    h->target.p = s;
    while (s < end && *s >= 0x21 && *s <= 0x7e) s++;
    h->target.len = s - h->target.p;
    if (h->target.len == 0 || h->target.len > MAX_TARGET || !accounted(h->target)) return 0;
    if (end - s < 11 || memcmp(s, " HTTP/1.1\r\n", 11) != 0) return 0;
    s += 11;
    hsize = h->target.len;
    h->kept = 0;
    h->length = -1;
    h->keep_alive = 1;
    for (;;) {
        Span name, value;
        if (end - s >= 2 && s[0] == '\r' && s[1] == '\n') { s += 2; break; }
        name.p = s;
        while (s < end && TCHAR[*s]) s++;
        name.len = s - name.p;
        if (name.len == 0 || s >= end || *s != ':') return 0;
        s++;
        while (s < end && (*s == ' ' || *s == '\t')) s++;
        value.p = s;
        while (s < end && (*s == '\t' || (*s >= 0x20 && *s != 0x7f))) s++;
        value.len = s - value.p;
        if (end - s < 2 || s[0] != '\r' || s[1] != '\n' || value.len == 0) return 0;
        if (value.p[value.len - 1] == ' ' || value.p[value.len - 1] == '\t') return 0;
        s += 2;
        hsize += name.len + value.len;
        if (hsize > max_header) return 0;
        switch (classify(name)) {
        case H_REFUSE:
            return 0;
        case H_LENGTH: {
            Py_ssize_t v = 0;
            if (h->length >= 0 || value.len > 15) return 0;
            for (Py_ssize_t i = 0; i < value.len; i++) {
                if (value.p[i] < '0' || value.p[i] > '9') return 0;
                v = v * 10 + (value.p[i] - '0');
            }
            h->length = v;
            break;
        }
        case H_CONNECTION:
            if (have_connection) return 0;
            have_connection = 1;
            if (name_is(value, "close")) h->keep_alive = 0;
            else if (!name_is(value, "keep-alive")) return 0;
            break;
        case H_KEEP:
            if (h->kept == MAX_HEADERS) return 0;
            h->names[h->kept] = name;
            h->values[h->kept] = value;
            h->kept++;
            break;
        default:
            break;
        }
    }
    h->head_len = s - p;
    return h->length >= 0 && h->length <= max_body && n - h->head_len == h->length;
}

static char *put(char *o, const void *src, Py_ssize_t n)
{
    memcpy(o, src, (size_t)n);
    return o + n;
}

static const char USAGE_MEMBER[] = ",\"stream_options\":{\"include_usage\":true}}";

/* render(data, prefix, host, inject, max_body, max_header) */
static PyObject *front_render(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Head h;
    Json j;
    char trace[32], span[16], length[24];
    if (nargs != 6 || !PyBytes_CheckExact(args[0]) || !PyBytes_CheckExact(args[1]) || !PyBytes_CheckExact(args[2])) {
        PyErr_SetString(PyExc_TypeError, "render(data: bytes, prefix: bytes, host: bytes, inject: bool, "
                                         "max_body: int, max_header: int)");
        return NULL;
    }
    int inject = PyObject_IsTrue(args[3]);
    Py_ssize_t max_body = PyLong_AsSsize_t(args[4]), max_header = PyLong_AsSsize_t(args[5]);
    if (inject < 0 || ((max_body == -1 || max_header == -1) && PyErr_Occurred())) return NULL;
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    Py_ssize_t n = PyBytes_GET_SIZE(args[0]);
    if (!parse_head(p, n, max_header, max_body, &h)) Py_RETURN_NONE;
    const unsigned char *body = p + h.head_len;
    if (!json_body(&j, body, h.length)) Py_RETURN_NONE;
    int injected = inject && j.stream_true && !j.asks_usage;
    if (injected && j.has_options) Py_RETURN_NONE;       /* Python re-encodes stream_options */
    Py_ssize_t body_len = h.length;
    if (injected) {                                        /* up to, without, the last '}' */
        while (body_len > 0 && body[body_len - 1] != '}') body_len--;
        body_len--;
    }
    Py_ssize_t out_len = body_len + (injected ? (Py_ssize_t)sizeof(USAGE_MEMBER) - 1 : 0);
    int length_len = snprintf(length, sizeof length, "%zd", out_len);
    Py_ssize_t prefix_len = PyBytes_GET_SIZE(args[1]), host_len = PyBytes_GET_SIZE(args[2]);
    Py_ssize_t size = 5 + prefix_len + h.target.len + 11 + 6 + host_len + 2
                      + 13 + 3 + 32 + 1 + 16 + 5
                      + 16 + length_len + 4 + out_len;
    for (int i = 0; i < h.kept; i++) size += h.names[i].len + 2 + h.values[i].len + 2;
    PyObject *wire = PyBytes_FromStringAndSize(NULL, size);
    if (wire == NULL) return NULL;
    char *o = PyBytes_AS_STRING(wire);
    o = put(o, "POST ", 5);
    o = put(o, PyBytes_AS_STRING(args[1]), prefix_len);
    o = put(o, h.target.p, h.target.len);
    o = put(o, " HTTP/1.1\r\nHost: ", 17);
    o = put(o, PyBytes_AS_STRING(args[2]), host_len);
    o = put(o, "\r\n", 2);
    for (int i = 0; i < h.kept; i++) {
        o = put(o, h.names[i].p, h.names[i].len);
        o = put(o, ": ", 2);
        o = put(o, h.values[i].p, h.values[i].len);
        o = put(o, "\r\n", 2);
    }
    hex_id(trace, 16);
    hex_id(span, 8);
    o = put(o, "traceparent: 00-", 16);
    o = put(o, trace, 32);
    o = put(o, "-", 1);
    o = put(o, span, 16);
    o = put(o, "-01\r\n", 5);
    o = put(o, "Content-Length: ", 16);
    o = put(o, length, length_len);
    o = put(o, "\r\n\r\n", 4);
    o = put(o, body, body_len);
    if (injected) o = put(o, USAGE_MEMBER, (Py_ssize_t)sizeof(USAGE_MEMBER) - 1);
    if (o - PyBytes_AS_STRING(wire) != size) {
        Py_DECREF(wire);
        PyErr_SetString(PyExc_SystemError, "_front.render: size mismatch");
        return NULL;
    }
    return Py_BuildValue("(Ns#s#OOn)", wire, trace, (Py_ssize_t)32, span, (Py_ssize_t)16,
                         injected ? Py_True : Py_False, h.keep_alive ? Py_True : Py_False, h.head_len);
}

static PyObject *front_seed(PyObject *self, PyObject *arg)
{
    unsigned long long s = PyLong_AsUnsignedLongLongMask(arg);
    if (s == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    rng_state = s ? s : 0x9E3779B97F4A7C15ULL;
    Py_RETURN_NONE;
}

static PyMethodDef front_methods[] = {
    {"render", (PyCFunction)(void (*)(void))front_render, METH_FASTCALL,
     "render(data, prefix, host, inject, max_body, max_header) -> (wire, trace_id, span_id, injected, "
     "keep_alive, head_len) for one complete plain request to an accounted path, else None"},
    {"seed", front_seed, METH_O, "seed(n): seed the trace/span id generator"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef front_module = {
    PyModuleDef_HEAD_INIT, "kvscope.agent.tap._front",
    "The tap's request side for the common case, in C (see agent/tap/_front.c).", -1, front_methods,
};

PyMODINIT_FUNC PyInit__front(void)
{
    return PyModule_Create(&front_module);
}
