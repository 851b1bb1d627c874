/* loadgen.c - a redis-benchmark-like load generator for eurekamem's Unix socket.
 *
 * What it measures: answers per second and the round trip (request written -> its answer read)
 * of one request kind, sent by C connections clients that each keep P requests in flight on
 * their own connection and send the next one as soon as an answer comes back (-P 1: one blocking
 * call at a time per client, like a user's Client.call).
 *
 * How: the request is a template, one MessagePack JSON-RPC request body in a file (bench/run.py
 * writes it with msgspec). Its id must be the uint64 0xffffffffffffffff (bytes cf ff ff ff ff ff ff
 * ff ff), which is overwritten with each request's id; every run of 16 '#' bytes in it is
 * overwritten with the request's number, zero-padded (so written keys are distinct in a run, like
 * redis-benchmark -r). Frames use the binary framing of protocol/PROTOCOL.md §2: a 4-byte big-endian
 * length, then the body. One thread, poll(2), non-blocking sockets. Each answer is parsed just
 * enough to read its id (answers may come in any order) and to see whether it is an error; error
 * answers are counted apart. The first -w answers warm up and are not counted; then the clock
 * starts, and the run lasts -n answers or -t seconds. Latencies are kept whole (the first 8M), for
 * exact nearest-rank percentiles.
 *
 *   cc -O2 -o loadgen loadgen.c
 *   ./loadgen SOCKET TEMPLATE [-c CONNS] [-P IN_FLIGHT] (-n REQUESTS | -t SECONDS) [-w WARMUP] [-T IDLE_TIMEOUT]
 *
 * Prints one JSON line: requests (answers counted), ok, errors, first_error, seconds, ops_per_s
 * (answers without error per second), p50/p99/mean/max latency in microseconds, cpu_s (this
 * program's CPU time while measuring). Exit status: 0, or 3 when some answers were errors (the
 * JSON line is printed either way), 1 on a usage, connection or protocol failure, 2 when nothing
 * was answered for IDLE_TIMEOUT seconds (default 60).
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define COUNTER_WIDTH 16
#define MAX_COUNTERS 8
#define MAX_SAMPLES (8u << 20)
#define MAX_FRAME (16u << 20)
#define READ_CHUNK (256 * 1024)
#define MAX_DEPTH 64

typedef struct {
    int fd;
    uint64_t seq;          /* requests sent on this connection */
    uint64_t *slot_id;     /* per in-flight slot: the id sent (0: free) */
    uint64_t *slot_t;      /* per in-flight slot: when it was written, ns */
    int *free_slots;       /* stack of free slot indexes */
    int nfree;
    unsigned char *out;    /* frames built but not yet written */
    size_t out_len, out_off, out_cap;
    unsigned char *in;     /* bytes read, not yet parsed */
    size_t in_len, in_cap;
} Conn;

static unsigned char *tmpl;      /* the frame: length prefix + template body */
static size_t tmpl_len, id_at;
static size_t counter_at[MAX_COUNTERS];
static int ncounters;
static int pipeline = 1;
static uint64_t sent_total, answered_total, warm, target_n, counter;
static uint64_t ok_count, err_count;
static uint32_t *samples;
static size_t nsamples, samples_cap;
static char first_error[256];
static int counting, sending = 1; /* answers are counted (warm-up over, time not up); requests are sent */
static uint64_t t_start, t_end, deadline;
static double seconds, cpu_start, cpu_end;

static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("loadgen: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static double cpu_seconds(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

static void *xrealloc(void *p, size_t n) {
    p = realloc(p, n);
    if (!p) die("out of memory");
    return p;
}

/* --- the template ---------------------------------------------------------------------------- */

static void load_template(const char *path) {
    static const unsigned char id_mark[9] = {0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    FILE *f = fopen(path, "rb");
    if (!f) die("cannot open %s: %s", path, strerror(errno));
    size_t cap = 4096, len = 0;
    unsigned char *body = xrealloc(NULL, cap);
    size_t got;
    while ((got = fread(body + len, 1, cap - len, f)) > 0) {
        len += got;
        if (len == cap) body = xrealloc(body, cap *= 2);
    }
    fclose(f);
    if (len == 0 || len >= MAX_FRAME) die("template %s: %zu bytes (want 1 to 16 MiB)", path, len);
    tmpl_len = 4 + len;
    tmpl = xrealloc(NULL, tmpl_len);
    tmpl[0] = (unsigned char)(len >> 24);
    tmpl[1] = (unsigned char)(len >> 16);
    tmpl[2] = (unsigned char)(len >> 8);
    tmpl[3] = (unsigned char)len;
    memcpy(tmpl + 4, body, len);
    free(body);
    int ids = 0;
    for (size_t i = 4; i + sizeof id_mark <= tmpl_len; i++) {
        if (memcmp(tmpl + i, id_mark, sizeof id_mark) == 0) {
            id_at = i + 1;
            ids++;
            i += sizeof id_mark - 1;
        }
    }
    if (ids != 1) die("template %s: the id 0xffffffffffffffff must occur once (found %d)", path, ids);
    for (size_t i = 4; i + COUNTER_WIDTH <= tmpl_len; i++) {
        size_t k = 0;
        while (k < COUNTER_WIDTH && tmpl[i + k] == '#') k++;
        if (k == COUNTER_WIDTH) {
            if (ncounters == MAX_COUNTERS) die("template %s: more than %d counters", path, MAX_COUNTERS);
            counter_at[ncounters++] = i;
            i += COUNTER_WIDTH - 1;
        }
    }
}

/* Append one request to c's output buffer, in a free slot of its window. */
static void queue_request(Conn *c, uint64_t t) {
    if (c->out_len + tmpl_len > c->out_cap) {
        c->out_cap = (c->out_len + tmpl_len) * 2;
        c->out = xrealloc(c->out, c->out_cap);
    }
    unsigned char *f = c->out + c->out_len;
    memcpy(f, tmpl, tmpl_len);
    int slot = c->free_slots[--c->nfree];
    uint64_t id = ++c->seq * (uint64_t)pipeline + (uint64_t)slot;
    for (int b = 0; b < 8; b++) f[id_at + b] = (unsigned char)(id >> (56 - 8 * b));
    uint64_t n = counter++;
    for (int k = 0; k < ncounters; k++) {
        uint64_t v = n;
        for (int d = COUNTER_WIDTH - 1; d >= 0; d--) {
            f[counter_at[k] + (size_t)d] = (unsigned char)('0' + v % 10);
            v /= 10;
        }
    }
    c->slot_id[slot] = id;
    c->slot_t[slot] = t;
    c->out_len += tmpl_len;
    sent_total++;
}

/* Write what is buffered; 0 when all of it went, 1 when the socket is full, -1 on an error. */
static int flush_out(Conn *c) {
    while (c->out_off < c->out_len) {
        ssize_t w = write(c->fd, c->out + c->out_off, c->out_len - c->out_off);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return 1;
            return -1;
        }
        c->out_off += (size_t)w;
    }
    c->out_off = c->out_len = 0;
    return 0;
}

/* Fill c's window (as far as the request budget allows) and write. */
static int top_up(Conn *c, int sending) {
    if (sending) {
        uint64_t t = now_ns();
        while (c->nfree > 0 && (target_n == 0 || sent_total < warm + target_n)) queue_request(c, t);
    }
    return flush_out(c) < 0 ? -1 : 0;
}

/* --- just enough MessagePack ---------------------------------------------------------------- */

static int need(const unsigned char *p, const unsigned char *end, size_t n) { return (size_t)(end - p) >= n; }

static uint64_t be(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v = v << 8 | p[i];
    return v;
}

/* A string at *pp: its bytes and length, *pp moved past it; 0 if not a string. */
static int read_str(const unsigned char **pp, const unsigned char *end, const unsigned char **s, size_t *n) {
    const unsigned char *p = *pp;
    if (!need(p, end, 1)) return 0;
    unsigned b = *p++;
    int hdr = 0;
    if (b >= 0xa0 && b <= 0xbf) *n = b & 0x1f;
    else if (b == 0xd9) hdr = 1;
    else if (b == 0xda) hdr = 2;
    else if (b == 0xdb) hdr = 4;
    else return 0;
    if (hdr) {
        if (!need(p, end, (size_t)hdr)) return 0;
        *n = (size_t)be(p, hdr);
        p += hdr;
    }
    if (!need(p, end, *n)) return 0;
    *s = p;
    *pp = p + *n;
    return 1;
}

/* Skip one value; NULL when malformed or truncated. */
static const unsigned char *skip(const unsigned char *p, const unsigned char *end, int depth) {
    if (depth > MAX_DEPTH || !need(p, end, 1)) return NULL;
    unsigned b = *p++;
    uint64_t items = 0, bytes = 0; /* what follows: `items` values, or `bytes` bytes */
    int len_bytes = 0;             /* a big-endian length of bytes (or a count of items) comes first */
    int pairs = 0;                 /* maps: the count is of key-value pairs */
    if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) return p; /* fixint, nil, bool */
    if (b <= 0x8f) items = 2 * (b & 0x0f);                                        /* fixmap */
    else if (b <= 0x9f) items = b & 0x0f;                                         /* fixarray */
    else if (b <= 0xbf) bytes = b & 0x1f;                                         /* fixstr */
    else switch (b) {
    case 0xc4: case 0xd9: len_bytes = 1; break;                    /* bin8, str8 */
    case 0xc5: case 0xda: len_bytes = 2; break;                    /* bin16, str16 */
    case 0xc6: case 0xdb: len_bytes = 4; break;                    /* bin32, str32 */
    case 0xc7: case 0xc8: case 0xc9:                               /* ext8/16/32: length, type, data */
        len_bytes = b == 0xc7 ? 1 : b == 0xc8 ? 2 : 4;
        bytes = 1;
        break;
    case 0xcc: case 0xd0: bytes = 1; break;                        /* (u)int8 */
    case 0xcd: case 0xd1: bytes = 2; break;                        /* (u)int16 */
    case 0xca: case 0xce: case 0xd2: bytes = 4; break;             /* float32, (u)int32 */
    case 0xcb: case 0xcf: case 0xd3: bytes = 8; break;             /* float64, (u)int64 */
    case 0xd4: case 0xd5: case 0xd6: case 0xd7: case 0xd8:         /* fixext 1/2/4/8/16: type, data */
        bytes = 1 + (1u << (b - 0xd4));
        break;
    case 0xdc: case 0xde: len_bytes = -2; pairs = b == 0xde; break; /* array16, map16 */
    case 0xdd: case 0xdf: len_bytes = -4; pairs = b == 0xdf; break; /* array32, map32 */
    default: return NULL;                                          /* 0xc1: never used */
    }
    if (len_bytes > 0) {
        if (!need(p, end, (size_t)len_bytes)) return NULL;
        bytes += be(p, len_bytes);
        p += len_bytes;
    } else if (len_bytes < 0) {
        if (!need(p, end, (size_t)-len_bytes)) return NULL;
        items = be(p, -len_bytes) * (pairs ? 2 : 1);
        p += -len_bytes;
    }
    if (bytes) {
        if ((uint64_t)(end - p) < bytes) return NULL;
        return p + bytes;
    }
    while (items--) {
        p = skip(p, end, depth + 1);
        if (!p) return NULL;
    }
    return p;
}

static int read_uint(const unsigned char **pp, const unsigned char *end, uint64_t *v) {
    const unsigned char *p = *pp;
    if (!need(p, end, 1)) return 0;
    unsigned b = *p++;
    int n;
    if (b <= 0x7f) {
        *v = b;
        *pp = p;
        return 1;
    }
    if (b == 0xcc) n = 1;
    else if (b == 0xcd) n = 2;
    else if (b == 0xce) n = 4;
    else if (b == 0xcf) n = 8;
    else return 0;
    if (!need(p, end, (size_t)n)) return 0;
    *v = be(p, n);
    *pp = p + n;
    return 1;
}

static int map_len(const unsigned char **pp, const unsigned char *end, uint64_t *n) {
    const unsigned char *p = *pp;
    if (!need(p, end, 1)) return 0;
    unsigned b = *p++;
    if (b >= 0x80 && b <= 0x8f) *n = b & 0x0f;
    else if (b == 0xde && need(p, end, 2)) *n = be(p, 2), p += 2;
    else if (b == 0xdf && need(p, end, 4)) *n = be(p, 4), p += 4;
    else return 0;
    *pp = p;
    return 1;
}

static int key_is(const unsigned char *s, size_t n, const char *name) {
    return n == strlen(name) && memcmp(s, name, n) == 0;
}

/* The error's "message" (and "code") as text, for the report. */
static void note_error(const unsigned char *p, const unsigned char *end) {
    uint64_t n;
    const unsigned char *s;
    size_t len;
    long long code = 0;
    char msg[200] = "?";
    if (map_len(&p, end, &n)) {
        while (n--) {
            if (!read_str(&p, end, &s, &len)) break;
            if (key_is(s, len, "message")) {
                const unsigned char *m;
                size_t mlen;
                if (!read_str(&p, end, &m, &mlen)) break;
                if (mlen >= sizeof msg) mlen = sizeof msg - 1;
                memcpy(msg, m, mlen);
                msg[mlen] = 0;
            } else if (key_is(s, len, "code") && need(p, end, 1) && (*p >= 0xe0 || *p == 0xd0 || *p == 0xd1 || *p == 0xd2)) {
                unsigned b = *p;
                if (b >= 0xe0) code = (signed char)b;
                else if (b == 0xd0 && need(p, end, 2)) code = (int8_t)p[1];
                else if (b == 0xd1 && need(p, end, 3)) code = (int16_t)be(p + 1, 2);
                else if (b == 0xd2 && need(p, end, 5)) code = (int32_t)be(p + 1, 4);
                if (!(p = skip(p, end, 1))) break;
            } else if (!(p = skip(p, end, 1))) {
                break;
            }
        }
    }
    snprintf(first_error, sizeof first_error, "%lld: %s", code, msg);
}

/* One answer: 0 ok, 1 an error answer, -1 not an answer we can read. *id gets its id. */
static int parse_answer(const unsigned char *p, const unsigned char *end, uint64_t *id, int *is_error) {
    uint64_t n;
    int have_id = 0;
    *is_error = 0;
    if (!map_len(&p, end, &n)) return -1;
    while (n--) {
        const unsigned char *s;
        size_t len;
        if (!read_str(&p, end, &s, &len)) return -1;
        if (key_is(s, len, "id")) {
            if (!read_uint(&p, end, id)) return -1;
            have_id = 1;
            continue;
        }
        if (key_is(s, len, "error") && need(p, end, 1) && *p != 0xc0) {
            *is_error = 1;
            if (!first_error[0]) note_error(p, end);
        }
        if (!(p = skip(p, end, 0))) return -1;
    }
    return have_id ? 0 : -1;
}

/* --- the run ------------------------------------------------------------------------------- */

static void record(uint64_t latency_ns) {
    if (nsamples == samples_cap) {
        if (samples_cap >= MAX_SAMPLES) return;
        samples_cap = samples_cap ? samples_cap * 2 : 65536;
        samples = xrealloc(samples, samples_cap * sizeof *samples);
    }
    samples[nsamples++] = latency_ns > UINT32_MAX ? UINT32_MAX : (uint32_t)latency_ns;
}

/* Parse every whole answer in c's input; returns how many, or -1 on a protocol failure. */
static void start_clock(uint64_t t) {
    counting = 1;
    t_start = t;
    cpu_start = cpu_seconds();
    if (seconds > 0) deadline = t_start + (uint64_t)(seconds * 1e9);
}

static int take_answers(Conn *c, uint64_t t) {
    size_t pos = 0;
    int got = 0;
    while (c->in_len - pos >= 4) {
        size_t size = (size_t)be(c->in + pos, 4);
        if (size >= MAX_FRAME) die("an answer of %zu bytes: not eurekamem's binary framing?", size);
        if (c->in_len - pos - 4 < size) {
            if (4 + size > c->in_cap) c->in = xrealloc(c->in, c->in_cap = 4 + size + READ_CHUNK);
            break;
        }
        const unsigned char *body = c->in + pos + 4;
        uint64_t id = 0;
        int is_error;
        if (parse_answer(body, body + size, &id, &is_error) < 0) die("cannot read an answer (%zu bytes)", size);
        int slot = (int)(id % (uint64_t)pipeline);
        if (c->slot_id[slot] != id) die("an answer with id %llu, which is not in flight", (unsigned long long)id);
        c->slot_id[slot] = 0;
        c->free_slots[c->nfree++] = slot;
        answered_total++;
        if (counting) {
            if (is_error) err_count++;
            else ok_count++;
            record(t - c->slot_t[slot]);
        } else if (sending && answered_total == warm) { /* warm-up over: the clock starts */
            start_clock(t);
        }
        pos += 4 + size;
        got++;
    }
    if (pos) {
        memmove(c->in, c->in + pos, c->in_len - pos);
        c->in_len -= pos;
    }
    return got;
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

static double pct_us(double fraction) {
    if (!nsamples) return 0.0;
    size_t rank = (size_t)(fraction * (double)nsamples + 0.999999999);
    if (rank < 1) rank = 1;
    if (rank > nsamples) rank = nsamples;
    return samples[rank - 1] / 1000.0;
}

static void json_string(const char *s) {
    putchar('"');
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') printf("\\%c", ch);
        else if (ch < 0x20) printf("\\u%04x", ch);
        else putchar(ch);
    }
    putchar('"');
}

static void usage(void) {
    die("usage: loadgen SOCKET TEMPLATE [-c CONNS] [-P IN_FLIGHT] (-n REQUESTS | -t SECONDS) [-w WARMUP] [-T IDLE_TIMEOUT]");
}

int main(int argc, char **argv) {
    int conns = 1;
    double idle_timeout = 60;
    if (argc < 3) usage();
    const char *path = argv[1];
    for (int i = 3; i < argc; i++) {
        if (i + 1 >= argc || argv[i][0] != '-' || strlen(argv[i]) != 2) usage();
        const char *v = argv[++i];
        switch (argv[i - 1][1]) {
        case 'c': conns = atoi(v); break;
        case 'P': pipeline = atoi(v); break;
        case 'n': target_n = strtoull(v, NULL, 10); break;
        case 't': seconds = atof(v); break;
        case 'w': warm = strtoull(v, NULL, 10); break;
        case 'T': idle_timeout = atof(v); break;
        default: usage();
        }
    }
    if (conns < 1 || conns > 4096 || pipeline < 1 || pipeline > 65536 || (target_n == 0) == (seconds <= 0) || idle_timeout <= 0)
        usage();
    load_template(argv[2]);
    signal(SIGPIPE, SIG_IGN);

    Conn *cs = calloc((size_t)conns, sizeof *cs);
    struct pollfd *pfd = calloc((size_t)conns, sizeof *pfd);
    if (!cs || !pfd) die("out of memory");
    struct sockaddr_un addr;
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof addr.sun_path) die("socket path too long: %s", path);
    strcpy(addr.sun_path, path);
    for (int i = 0; i < conns; i++) {
        Conn *c = &cs[i];
        c->fd = socket(AF_UNIX, SOCK_STREAM, 0);
        if (c->fd < 0 || connect(c->fd, (struct sockaddr *)&addr, sizeof addr) < 0)
            die("connect %s (connection %d): %s", path, i, strerror(errno));
        fcntl(c->fd, F_SETFL, fcntl(c->fd, F_GETFL) | O_NONBLOCK);
        c->slot_id = calloc((size_t)pipeline, sizeof *c->slot_id);
        c->slot_t = calloc((size_t)pipeline, sizeof *c->slot_t);
        c->free_slots = calloc((size_t)pipeline, sizeof *c->free_slots);
        c->in = xrealloc(NULL, c->in_cap = READ_CHUNK);
        if (!c->slot_id || !c->slot_t || !c->free_slots) die("out of memory");
        for (int s = 0; s < pipeline; s++) c->free_slots[c->nfree++] = pipeline - 1 - s;
        pfd[i].fd = c->fd;
    }

    uint64_t t_last = now_ns();
    if (warm == 0) start_clock(t_last);
    for (int i = 0; i < conns; i++)
        if (top_up(&cs[i], sending) < 0) die("write: %s", strerror(errno));

    for (;;) {
        uint64_t t = now_ns();
        if (counting && sending && deadline && t >= deadline) { /* -t: time is up; drain what is in flight */
            t_end = t;
            cpu_end = cpu_seconds();
            counting = sending = 0;
        }
        if (answered_total == sent_total && (!sending || (target_n && sent_total >= warm + target_n))) break;
        if ((double)(t - t_last) > idle_timeout * 1e9) {
            fprintf(stderr, "loadgen: no answer for %.0f s (%llu of %llu answered)\n", idle_timeout,
                    (unsigned long long)answered_total, (unsigned long long)sent_total);
            printf("{\"failed\": \"no answer for %.0f s\", \"requests\": %llu, \"errors\": %llu}\n", idle_timeout,
                   (unsigned long long)(ok_count + err_count), (unsigned long long)err_count);
            return 2;
        }
        for (int i = 0; i < conns; i++) pfd[i].events = (short)(POLLIN | (cs[i].out_len > cs[i].out_off ? POLLOUT : 0));
        int wait_ms = 1000;
        if (counting && deadline) {
            uint64_t left = deadline > t ? (deadline - t) / 1000000u + 1 : 0;
            if (left < (uint64_t)wait_ms) wait_ms = (int)left;
        }
        int ready = poll(pfd, (nfds_t)conns, wait_ms);
        if (ready < 0) {
            if (errno == EINTR) continue;
            die("poll: %s", strerror(errno));
        }
        for (int i = 0; i < conns && ready > 0; i++) {
            Conn *c = &cs[i];
            if (!pfd[i].revents) continue;
            ready--;
            if (pfd[i].revents & POLLOUT && flush_out(c) < 0) die("write: %s", strerror(errno));
            if (!(pfd[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            if (c->in_cap - c->in_len < READ_CHUNK / 4) c->in = xrealloc(c->in, c->in_cap *= 2);
            ssize_t r = read(c->fd, c->in + c->in_len, c->in_cap - c->in_len);
            if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
            if (r <= 0) die("connection %d: %s", i, r == 0 ? "closed by the server" : strerror(errno));
            c->in_len += (size_t)r;
            uint64_t t_read = now_ns();
            int got = take_answers(c, t_read);
            if (got > 0) t_last = t_read;
            if (got > 0 && top_up(c, sending) < 0) die("write: %s", strerror(errno));
        }
    }
    if (!t_end) {
        t_end = now_ns();
        cpu_end = cpu_seconds();
    }
    for (int i = 0; i < conns; i++) close(cs[i].fd);

    double elapsed = (double)(t_end - t_start) / 1e9;
    uint64_t requests = ok_count + err_count;
    double sum = 0;
    for (size_t i = 0; i < nsamples; i++) sum += samples[i];
    qsort(samples, nsamples, sizeof *samples, cmp_u32);
    printf("{\"connections\": %d, \"pipeline\": %d, \"requests\": %llu, \"ok\": %llu, \"errors\": %llu, \"first_error\": ",
           conns, pipeline, (unsigned long long)requests, (unsigned long long)ok_count, (unsigned long long)err_count);
    if (first_error[0]) json_string(first_error);
    else fputs("null", stdout);
    printf(", \"seconds\": %.6f, \"ops_per_s\": %.1f, \"p50_us\": %.1f, \"p99_us\": %.1f, \"mean_us\": %.1f, "
           "\"max_us\": %.1f, \"latency_samples\": %zu, \"cpu_s\": %.4f}\n",
           elapsed, elapsed > 0 ? (double)ok_count / elapsed : 0.0, pct_us(0.50), pct_us(0.99),
           nsamples ? sum / (double)nsamples / 1000.0 : 0.0, nsamples ? samples[nsamples - 1] / 1000.0 : 0.0, nsamples,
           cpu_end - cpu_start);
    return err_count ? 3 : 0;
}
