/* The compiled hot loop of the packet line (netem/packetline.py): batched reads of the port
 * sockets, per-frame parse and route, the release queue, precise waits, lateness and read-lag
 * histograms. Python keeps the rules: it opens the sockets, owns every LinkLine with random
 * draws (loss, jitter, reordering, Gilbert-Elliott), cuts GSO frames that lose segments, and
 * answers the control pipe. A link whose impairment is a plain fixed delay is decided here
 * with LinkLine's own arithmetic (see queue_plain); every other frame is handed to Python.
 *
 * Frames are read with recvmmsg(2) (up to BATCH frames per call), each with its virtio header
 * (PACKET_VNET_HDR) and the kernel's receive stamp (SCM_TIMESTAMPNS, CLOCK_REALTIME);
 * releases are one binary min-heap ordered by (release time, arrival order) -- what Python's
 * heapq of (release_s, seq, ...) does; waits are epoll_pwait2(2) with a nanosecond timeout
 * (an hrtimer; the process's timer slack is 1 us, see die_with_parent). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define VNET_LEN 10
#define ETH_LEN 14
#define IPV4_MIN_LEN 20
#define GSO_NONE 0
#define GSO_TCPV4 1
#define GSO_ECN 0x80
#define BATCH 64
#define SEND_BATCH 64
#define RECV_BUF 65664          /* a 64 KiB GSO frame, its Ethernet and virtio headers */
#define FINE_BINS 10000         /* the bins of packetline.Histogram: 1 us up to 10 ms, */
#define COARSE_BINS 10000       /* 100 us up to 1 s, the rest counted over */
#define MAX_EVENTS 64
#define ERRNO_SLOTS 160

enum { C_RECEIVED, C_FORWARDED, C_FLOODED, C_MALFORMED, C_TRUNCATED, C_RECV_ERRORS,
       C_UNROUTABLE, C_HAIRPIN, C_NO_TIMESTAMP, C_SEND_ERRORS, C_GSO_FRAMES, C_GSO_UNSPLIT,
       C_N };
static const char *COUNTER_NAMES[C_N] = {
    "received", "forwarded_frames", "flooded", "malformed", "truncated", "recv_errors",
    "unroutable", "hairpin", "no_timestamp", "send_errors", "gso_frames", "gso_unsplit"};

typedef struct {
    uint64_t fine[FINE_BINS], coarse[COARSE_BINS], over, count;
    double max_s;
} Hist;

static void hist_add(Hist *h, double v) {
    if (!(v > 0)) v = 0.0;
    h->count++;
    if (v > h->max_s) h->max_s = v;
    double fi = v / 1e-6;
    if (fi < FINE_BINS) { h->fine[(int)fi]++; return; }
    double ci = v / 1e-4;
    if (ci < COARSE_BINS) h->coarse[(int)ci]++; else h->over++;
}

typedef struct {
    int exists, plain;                      /* plain: decided here; else by Python */
    double delay_s, last_release_s;
    int64_t limit_pkts, limit_bytes;
    int64_t held_pkts, held_bytes;
    int64_t admitted_pkts, admitted_bytes, forwarded_pkts, forwarded_bytes;
    int64_t queue_pkts, queue_bytes;        /* dropped by the queue limits or the budget */
    int64_t py_released_pkts, py_released_bytes;   /* for Python's LinkLine.released */
} Link;

typedef struct { char *data; uint32_t len; } Seg;

typedef struct {
    double release_s;
    uint64_t seq;
    uint32_t link;                          /* src index * nports + dst index */
    uint32_t nseg;
    int64_t held_bytes, held_pkts;
    Seg one;                                /* nseg == 1 */
    Seg *segs;                              /* nseg > 1 */
} Entry;

typedef struct { uint32_t src, dst; char *data; uint32_t len; double arrival_s; } PyFrame;

typedef struct {
    PyObject_HEAD
    int nports, ep;
    int *fds;
    uint32_t *addrs;                        /* network order, per port index */
    Link *links;                            /* nports * nports */
    Entry *heap;
    size_t nheap, capheap;
    uint64_t seq;
    int64_t budget_limit, budget_cost, budget_held, budget_refused;
    uint64_t counts[C_N];
    uint64_t errnos[2][ERRNO_SLOTS];
    Hist *late, *lag;
    struct mmsghdr *msgs;
    struct iovec *iovs;
    char *bufs, *ctrl;
    PyFrame *pyf;
    size_t npyf, cappyf;
} Core;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void count_errno(Core *c, int send, int err) {
    c->counts[send ? C_SEND_ERRORS : C_RECV_ERRORS]++;
    c->errnos[send][err >= 0 && err < ERRNO_SLOTS ? err : 0]++;
}

/* ------------------------------------------------------------------ the heap */

static int entry_less(const Entry *a, const Entry *b) {
    return a->release_s < b->release_s || (a->release_s == b->release_s && a->seq < b->seq);
}

static int heap_push(Core *c, Entry *e) {
    if (c->nheap == c->capheap) {
        size_t cap = c->capheap ? c->capheap * 2 : 4096;
        Entry *h = realloc(c->heap, cap * sizeof(Entry));
        if (!h) return -1;
        c->heap = h;
        c->capheap = cap;
    }
    e->seq = ++c->seq;
    size_t i = c->nheap++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!entry_less(e, &c->heap[p])) break;
        c->heap[i] = c->heap[p];
        i = p;
    }
    c->heap[i] = *e;
    return 0;
}

static Entry heap_pop(Core *c) {
    Entry top = c->heap[0];
    Entry last = c->heap[--c->nheap];
    size_t i = 0, n = c->nheap;
    for (;;) {
        size_t l = 2 * i + 1, m = i;
        const Entry *best = &last;
        if (l < n && entry_less(&c->heap[l], best)) { m = l; best = &c->heap[l]; }
        if (l + 1 < n && entry_less(&c->heap[l + 1], best)) { m = l + 1; }
        if (m == i) break;
        c->heap[i] = c->heap[m];
        i = m;
    }
    if (n) c->heap[i] = last;
    return top;
}

static void entry_free(Entry *e) {
    if (e->nseg == 1) { free(e->one.data); return; }
    for (uint32_t i = 0; i < e->nseg; i++) free(e->segs[i].data);
    free(e->segs);
}

/* ------------------------------------------------------------------ sending */

static void send_frame(Core *c, int port, const char *data, size_t len) {
    if (send(c->fds[port], data, len, MSG_DONTWAIT) < 0) count_errno(c, 1, errno);
    else c->counts[C_FORWARDED]++;
}

/* LinkLine.released, for plain links; for Python's links the amounts wait for Python (the
 * budget is given back here for both: the bytes have left). */
static void released(Core *c, Entry *e) {
    Link *l = &c->links[e->link];
    if (l->plain) {
        l->held_pkts = l->held_pkts - e->held_pkts > 0 ? l->held_pkts - e->held_pkts : 0;
        l->held_bytes = l->held_bytes - e->held_bytes > 0 ? l->held_bytes - e->held_bytes : 0;
        l->forwarded_pkts += e->held_pkts;
        l->forwarded_bytes += e->held_bytes;
    } else {
        l->py_released_pkts += e->held_pkts;
        l->py_released_bytes += e->held_bytes;
    }
    /* ByteBudget.give(size_bytes) with frames = 1, as LinkLine.released calls it */
    int64_t held = c->budget_held - (e->held_bytes + c->budget_cost);
    c->budget_held = held > 0 ? held : 0;
}

/* Send every due release. Up to SEND_BATCH due frames are taken in release order and sent
 * with one sendmmsg(2) per port: the order within a port, so within every link, is kept;
 * frames to different ports go to different receivers, which cannot see their relative
 * order. */
static void flush_msgs(Core *c, int port, struct mmsghdr *mm, int m) {
    int done = 0;
    while (done < m) {
        int r = sendmmsg(c->fds[port], mm + done, (unsigned)(m - done), MSG_DONTWAIT);
        if (r < 0) {                            /* the first of the rest failed: skip it */
            count_errno(c, 1, errno);
            done++;
            continue;
        }
        c->counts[C_FORWARDED] += (uint64_t)r;
        done += r;
    }
}

static void send_port_batch(Core *c, int port, Entry **es, int n) {
    struct mmsghdr mm[SEND_BATCH];
    struct iovec iov[SEND_BATCH];
    int m = 0;
    for (int i = 0; i < n; i++) {
        Entry *e = es[i];
        Seg *segs = e->nseg == 1 ? &e->one : e->segs;
        for (uint32_t k = 0; k < e->nseg; k++) {
            if (m == SEND_BATCH) { flush_msgs(c, port, mm, m); m = 0; }
            iov[m].iov_base = segs[k].data;
            iov[m].iov_len = segs[k].len;
            memset(&mm[m].msg_hdr, 0, sizeof(struct msghdr));
            mm[m].msg_hdr.msg_iov = &iov[m];
            mm[m].msg_hdr.msg_iovlen = 1;
            m++;
        }
    }
    if (m) flush_msgs(c, port, mm, m);
}

static void release_due(Core *c) {
    Entry due[SEND_BATCH];
    Entry *mine[SEND_BATCH];
    for (;;) {
        double t = now_s();
        int n = 0, segs = 0;
        while (n < SEND_BATCH && c->nheap && c->heap[0].release_s <= t) {
            if (n && segs + (int)c->heap[0].nseg > SEND_BATCH) break;
            due[n] = heap_pop(c);
            segs += (int)due[n].nseg;
            n++;
        }
        if (!n) return;
        char done[SEND_BATCH] = {0};
        for (int i = 0; i < n; i++) {
            if (done[i]) continue;
            int port = (int)(due[i].link % (uint32_t)c->nports), k = 0;
            for (int j = i; j < n; j++)
                if (!done[j] && (int)(due[j].link % (uint32_t)c->nports) == port) {
                    mine[k++] = &due[j];
                    done[j] = 1;
                }
            send_port_batch(c, port, mine, k);
            double sent = now_s();
            for (int j = 0; j < k; j++) {
                hist_add(c->late, sent - mine[j]->release_s);
                released(c, mine[j]);
                entry_free(mine[j]);
            }
        }
    }
}

/* ------------------------------------------------------------------ one frame */

/* LinkLine._queue then _schedule for an impairment without loss, jitter or reordering
 * (netem/impair.py): tail drop when held + this exceeds limit_pkts or limit_bytes, else the
 * global ByteBudget.take(size_bytes) (one frame's cost), then
 *     release = max(arrival + max(0, delay_ms) / 1e3, the link's previous release)
 * with delay_s = max(0, delay_ms) / 1e3 computed by Python, so the doubles are the same.
 * Returns 1 when queued, with *release set. */
static int queue_plain(Core *c, Link *l, int64_t size, int64_t pkts, double arrival,
                       double *release) {
    if (l->held_pkts + pkts > l->limit_pkts || l->held_bytes + size > l->limit_bytes) {
        l->queue_pkts += pkts;
        l->queue_bytes += size;
        return 0;
    }
    int64_t cost = size + c->budget_cost;
    if (c->budget_held + cost > c->budget_limit) {
        c->budget_refused++;
        l->queue_pkts += pkts;
        l->queue_bytes += size;
        return 0;
    }
    c->budget_held += cost;
    l->held_pkts += pkts;
    l->held_bytes += size;
    double r = arrival + l->delay_s;
    if (r < l->last_release_s) r = l->last_release_s;
    l->last_release_s = r;
    *release = r;
    return 1;
}

static int admit_plain(Core *c, uint32_t link, const char *f, size_t n, int64_t pkts,
                       double arrival) {
    Link *l = &c->links[link];
    int64_t size = (int64_t)n - VNET_LEN;
    l->admitted_pkts += pkts;
    l->admitted_bytes += size;
    Entry e;
    if (!queue_plain(c, l, size, pkts, arrival, &e.release_s)) return 0;
    e.link = link;
    e.nseg = 1;
    e.held_bytes = size;
    e.held_pkts = pkts;
    e.segs = NULL;
    e.one.len = (uint32_t)n;
    e.one.data = malloc(n);
    if (!e.one.data || heap_push(c, &e) < 0) {
        free(e.one.data);
        return -1;
    }
    memcpy(e.one.data, f, n);
    return 0;
}

static int route(Core *c, uint32_t addr) {
    for (int i = 0; i < c->nports; i++) if (c->addrs[i] == addr) return i;
    return -1;
}

static int hand_to_python(Core *c, int src, int dst, const char *f, size_t n, double arrival) {
    if (c->npyf == c->cappyf) {
        size_t cap = c->cappyf ? c->cappyf * 2 : 256;
        PyFrame *p = realloc(c->pyf, cap * sizeof(PyFrame));
        if (!p) return -1;
        c->pyf = p;
        c->cappyf = cap;
    }
    PyFrame *p = &c->pyf[c->npyf];
    p->data = malloc(n ? n : 1);
    if (!p->data) return -1;
    memcpy(p->data, f, n);
    p->len = (uint32_t)n;
    p->src = (uint32_t)src;
    p->dst = (uint32_t)dst;
    p->arrival_s = arrival;
    c->npyf++;
    return 0;
}

/* PacketLine.on_frame for a plain link (the Python engine's order of checks and counts);
 * -1 only when memory ran out. */
static int on_frame(Core *c, int src, const unsigned char *f, size_t n, double arrival,
                    int force_c) {
    if (n < VNET_LEN + ETH_LEN) { c->counts[C_MALFORMED]++; return 0; }
    if ((f[VNET_LEN] & 1) || f[VNET_LEN + 12] != 0x08 || f[VNET_LEN + 13] != 0x00) {
        c->counts[C_FLOODED]++;
        for (int p = 0; p < c->nports; p++) if (p != src) send_frame(c, p, (const char *)f, n);
        return 0;
    }
    size_t ip = VNET_LEN + ETH_LEN;
    if (n < ip + IPV4_MIN_LEN) { c->counts[C_MALFORMED]++; return 0; }
    unsigned vihl = f[ip], ihl = (vihl & 0x0F) * 4;
    if ((vihl >> 4) != 4 || ihl < IPV4_MIN_LEN || n < ip + ihl) {
        c->counts[C_MALFORMED]++;
        return 0;
    }
    uint32_t daddr;
    memcpy(&daddr, f + ip + 16, 4);
    int dst = route(c, daddr);
    if (dst < 0) { c->counts[C_UNROUTABLE]++; return 0; }
    if (dst == src) { c->counts[C_HAIRPIN]++; return 0; }
    uint32_t link = (uint32_t)src * (uint32_t)c->nports + (uint32_t)dst;
    Link *l = &c->links[link];
    if (!force_c && !(l->exists && l->plain))
        return hand_to_python(c, src, dst, (const char *)f, n, arrival);
    unsigned gso_type = f[1];
    if (gso_type == GSO_NONE) return admit_plain(c, link, (const char *)f, n, 1, arrival);
    /* gso_segments */
    unsigned gso_size = f[4] | (f[5] << 8);   /* struct virtio_net_hdr, little-endian */
    size_t l4 = ip + ihl, hdr_end = l4;
    unsigned proto = f[ip + 9];
    int tcp4 = (gso_type & ~GSO_ECN) == GSO_TCPV4;
    if (gso_size == 0) { c->counts[C_MALFORMED]++; return 0; }
    if (tcp4) {
        if (proto != 6 || n < l4 + 20) { c->counts[C_MALFORMED]++; return 0; }
        hdr_end += (size_t)(f[l4 + 12] >> 4) * 4;
    } else if (proto == 17) {
        hdr_end += 8;
    }
    if (hdr_end > n || (tcp4 && hdr_end < l4 + 20)) { c->counts[C_MALFORMED]++; return 0; }
    size_t payload = n - hdr_end;
    int64_t segments = (int64_t)((payload + gso_size - 1) / gso_size);
    if (segments < 1) segments = 1;
    c->counts[C_GSO_FRAMES]++;
    if (!tcp4) {
        c->counts[C_GSO_UNSPLIT]++;
        return admit_plain(c, link, (const char *)f, n, 1, arrival);
    }
    /* admit_gso without loss: every segment kept, queued together */
    return admit_plain(c, link, (const char *)f, n, segments, arrival);
}

/* Up to BATCH frames from one port; -1 when memory ran out. */
static int drain(Core *c, int port) {
    for (int i = 0; i < BATCH; i++) {
        c->iovs[i].iov_base = c->bufs + (size_t)i * RECV_BUF;
        c->iovs[i].iov_len = RECV_BUF;
        memset(&c->msgs[i].msg_hdr, 0, sizeof(struct msghdr));
        c->msgs[i].msg_hdr.msg_iov = &c->iovs[i];
        c->msgs[i].msg_hdr.msg_iovlen = 1;
        c->msgs[i].msg_hdr.msg_control = c->ctrl + (size_t)i * 64;
        c->msgs[i].msg_hdr.msg_controllen = 64;
    }
    int got = recvmmsg(c->fds[port], c->msgs, BATCH, MSG_DONTWAIT, NULL);
    if (got < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) count_errno(c, 0, errno);
        return 0;
    }
    double t = now_s();
    for (int i = 0; i < got; i++) {
        struct msghdr *h = &c->msgs[i].msg_hdr;
        c->counts[C_RECEIVED]++;
        if (h->msg_flags & MSG_TRUNC) { c->counts[C_TRUNCATED]++; continue; }
        double arrival = t;
        int stamped = 0;
        for (struct cmsghdr *cm = CMSG_FIRSTHDR(h); cm; cm = CMSG_NXTHDR(h, cm)) {
            if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_TIMESTAMPNS &&
                cm->cmsg_len >= CMSG_LEN(sizeof(struct timespec))) {
                struct timespec ts;
                memcpy(&ts, CMSG_DATA(cm), sizeof ts);
                arrival = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
                stamped = 1;
                break;
            }
        }
        if (!stamped) c->counts[C_NO_TIMESTAMP]++;
        hist_add(c->lag, t - arrival);
        if (on_frame(c, port, (const unsigned char *)c->iovs[i].iov_base, c->msgs[i].msg_len,
                     arrival, 0) < 0)
            return -1;
        /* a due release does not wait for the rest of the batch (as the Python loop) */
        if (c->nheap && c->heap[0].release_s <= now_s()) release_due(c);
    }
    return 0;
}

/* ------------------------------------------------------------------ Python interface */

static void Core_dealloc(Core *c) {
    for (size_t i = 0; i < c->nheap; i++) entry_free(&c->heap[i]);
    for (size_t i = 0; i < c->npyf; i++) free(c->pyf[i].data);
    free(c->heap); free(c->pyf); free(c->fds); free(c->addrs); free(c->links);
    free(c->late); free(c->lag); free(c->msgs); free(c->iovs); free(c->bufs); free(c->ctrl);
    if (c->ep > 0) close(c->ep);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

/* Core(fds, addrs, budget_limit_bytes, per_frame_cost_bytes): fds and 4-byte addresses by
 * port index; the sockets stay Python's (it closes them). */
static int Core_init(Core *c, PyObject *args, PyObject *kw) {
    PyObject *fds, *addrs;
    long long limit, cost;
    if (!PyArg_ParseTuple(args, "OOLL", &fds, &addrs, &limit, &cost)) return -1;
    Py_ssize_t n = PySequence_Length(fds);
    if (n < 1 || n > 4096 || PySequence_Length(addrs) != n) {
        PyErr_Format(PyExc_ValueError, "ports = %zd is out of range; expected 1 to 4096 fds "
                     "and as many addresses", n);
        return -1;
    }
    c->ep = -1;
    c->nports = (int)n;
    c->fds = calloc(n, sizeof(int));
    c->addrs = calloc(n, sizeof(uint32_t));
    c->links = calloc((size_t)n * n, sizeof(Link));
    c->late = calloc(1, sizeof(Hist));
    c->lag = calloc(1, sizeof(Hist));
    c->msgs = calloc(BATCH, sizeof(struct mmsghdr));
    c->iovs = calloc(BATCH, sizeof(struct iovec));
    c->bufs = malloc((size_t)BATCH * RECV_BUF);
    c->ctrl = malloc((size_t)BATCH * 64);
    if (!c->fds || !c->addrs || !c->links || !c->late || !c->lag || !c->msgs || !c->iovs ||
        !c->bufs || !c->ctrl) {
        PyErr_NoMemory();
        return -1;
    }
    c->budget_limit = limit;
    c->budget_cost = cost;
    c->ep = epoll_create1(EPOLL_CLOEXEC);
    if (c->ep < 0) { PyErr_SetFromErrno(PyExc_OSError); return -1; }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *fo = PySequence_GetItem(fds, i), *ao = PySequence_GetItem(addrs, i);
        long fd = fo ? PyLong_AsLong(fo) : -1;
        char *buf = NULL;
        Py_ssize_t len = 0;
        int bad = !ao || PyBytes_AsStringAndSize(ao, &buf, &len) < 0 || len != 4;
        Py_XDECREF(fo);
        if (!bad) memcpy(&c->addrs[i], buf, 4);
        Py_XDECREF(ao);
        if (PyErr_Occurred()) return -1;
        if (bad || fd < 0) {
            PyErr_Format(PyExc_ValueError, "port %zd: expected an fd and a 4-byte address", i);
            return -1;
        }
        c->fds[i] = (int)fd;
        struct epoll_event ev = {.events = EPOLLIN, .data.u64 = (uint64_t)i};
        if (epoll_ctl(c->ep, EPOLL_CTL_ADD, (int)fd, &ev) < 0) {
            PyErr_SetFromErrno(PyExc_OSError);
            return -1;
        }
    }
    return 0;
}

static int link_index(Core *c, int si, int di) {
    if (si < 0 || di < 0 || si >= c->nports || di >= c->nports || si == di) {
        PyErr_Format(PyExc_ValueError, "link (%d, %d) is not a pair of distinct port indices "
                     "in [0, %d)", si, di, c->nports);
        return -1;
    }
    return si * c->nports + di;
}

/* set_link(src, dst, plain, delay_s, limit_pkts, limit_bytes) */
static PyObject *Core_set_link(Core *c, PyObject *args) {
    int si, di, plain;
    double delay_s;
    long long lp, lb;
    if (!PyArg_ParseTuple(args, "iipdLL", &si, &di, &plain, &delay_s, &lp, &lb)) return NULL;
    int k = link_index(c, si, di);
    if (k < 0) return NULL;
    Link *l = &c->links[k];
    if (!l->exists) { l->exists = 1; l->last_release_s = -INFINITY; }
    l->plain = plain;
    l->delay_s = delay_s;
    l->limit_pkts = lp;
    l->limit_bytes = lb;
    Py_RETURN_NONE;
}

/* link_state(src, dst): the counters and queue of a link, as LinkLine keeps them */
static PyObject *Core_link_state(Core *c, PyObject *args) {
    int si, di;
    if (!PyArg_ParseTuple(args, "ii", &si, &di)) return NULL;
    int k = link_index(c, si, di);
    if (k < 0) return NULL;
    Link *l = &c->links[k];
    return Py_BuildValue("{s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:d}",
                         "admitted_pkts", (long long)l->admitted_pkts,
                         "admitted_bytes", (long long)l->admitted_bytes,
                         "forwarded_pkts", (long long)l->forwarded_pkts,
                         "forwarded_bytes", (long long)l->forwarded_bytes,
                         "queue_pkts", (long long)l->queue_pkts,
                         "queue_bytes", (long long)l->queue_bytes,
                         "held_pkts", (long long)l->held_pkts,
                         "held_bytes", (long long)l->held_bytes,
                         "last_release_s", l->last_release_s);
}

/* take_released(): [(src, dst, bytes, pkts)] released for Python's links since last asked */
static PyObject *Core_take_released(Core *c, PyObject *unused) {
    PyObject *out = PyList_New(0);
    if (!out) return NULL;
    for (int k = 0; k < c->nports * c->nports; k++) {
        Link *l = &c->links[k];
        if (!l->py_released_pkts && !l->py_released_bytes) continue;
        PyObject *t = Py_BuildValue("(iiLL)", k / c->nports, k % c->nports,
                                    (long long)l->py_released_bytes,
                                    (long long)l->py_released_pkts);
        if (!t || PyList_Append(out, t) < 0) { Py_XDECREF(t); Py_DECREF(out); return NULL; }
        Py_DECREF(t);
        l->py_released_pkts = l->py_released_bytes = 0;
    }
    return out;
}

/* push(release_s, src, dst, payload, held_bytes, held_pkts): a frame Python admitted;
 * payload is bytes or a tuple of bytes (the surviving segments of a cut GSO frame) */
static PyObject *Core_push(Core *c, PyObject *args) {
    double release_s;
    int si, di;
    PyObject *payload;
    long long hb, hp;
    if (!PyArg_ParseTuple(args, "diiOLL", &release_s, &si, &di, &payload, &hb, &hp))
        return NULL;
    int k = link_index(c, si, di);
    if (k < 0) return NULL;
    Entry e = {.release_s = release_s, .link = (uint32_t)k, .held_bytes = hb, .held_pkts = hp};
    if (PyBytes_Check(payload)) {
        e.nseg = 1;
        e.one.len = (uint32_t)PyBytes_GET_SIZE(payload);
        e.one.data = malloc(e.one.len ? e.one.len : 1);
        if (!e.one.data) return PyErr_NoMemory();
        memcpy(e.one.data, PyBytes_AS_STRING(payload), e.one.len);
    } else if (PyTuple_Check(payload) && PyTuple_GET_SIZE(payload) > 0) {
        Py_ssize_t n = PyTuple_GET_SIZE(payload);
        for (Py_ssize_t i = 0; i < n; i++)
            if (!PyBytes_Check(PyTuple_GET_ITEM(payload, i))) {
                PyErr_SetString(PyExc_TypeError, "payload: a tuple of bytes");
                return NULL;
            }
        e.nseg = (uint32_t)n;
        e.segs = calloc(n, sizeof(Seg));
        if (!e.segs) return PyErr_NoMemory();
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *b = PyTuple_GET_ITEM(payload, i);
            e.segs[i].len = (uint32_t)PyBytes_GET_SIZE(b);
            e.segs[i].data = malloc(e.segs[i].len ? e.segs[i].len : 1);
            if (!e.segs[i].data) { entry_free(&e); return PyErr_NoMemory(); }
            memcpy(e.segs[i].data, PyBytes_AS_STRING(b), e.segs[i].len);
        }
    } else {
        PyErr_SetString(PyExc_TypeError, "payload: bytes or a non-empty tuple of bytes");
        return NULL;
    }
    if (heap_push(c, &e) < 0) { entry_free(&e); return PyErr_NoMemory(); }
    Py_RETURN_NONE;
}

/* frame(src, frame, arrival_s): decide a frame here as if read from port src (plain links);
 * for frames Python was handed on a link it has since made plain, and for tests */
static PyObject *Core_frame(Core *c, PyObject *args) {
    int si;
    Py_buffer b;
    double arrival;
    if (!PyArg_ParseTuple(args, "iy*d", &si, &b, &arrival)) return NULL;
    if (si < 0 || si >= c->nports) {
        PyBuffer_Release(&b);
        PyErr_Format(PyExc_ValueError, "port %d is out of range [0, %d)", si, c->nports);
        return NULL;
    }
    int r = on_frame(c, si, b.buf, (size_t)b.len, arrival, 1);
    PyBuffer_Release(&b);
    if (r < 0) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* pop_due(now_s): [(release_s, dst, nbytes, held_bytes, held_pkts)] of held frames due by
 * now_s, in release order, without sending them (the tests' view of the queue) */
static PyObject *Core_pop_due(Core *c, PyObject *args) {
    double t;
    if (!PyArg_ParseTuple(args, "d", &t)) return NULL;
    PyObject *out = PyList_New(0);
    if (!out) return NULL;
    while (c->nheap && c->heap[0].release_s <= t) {
        Entry e = heap_pop(c);
        PyObject *x = Py_BuildValue("(dinLL)", e.release_s, (int)(e.link % c->nports),
                                    (Py_ssize_t)(e.nseg == 1 ? e.one.len : 0),
                                    (long long)e.held_bytes, (long long)e.held_pkts);
        released(c, &e);
        entry_free(&e);
        if (!x || PyList_Append(out, x) < 0) { Py_XDECREF(x); Py_DECREF(out); return NULL; }
        Py_DECREF(x);
    }
    return out;
}

static PyObject *Core_watch(Core *c, PyObject *args) {
    int fd;
    unsigned events;
    if (!PyArg_ParseTuple(args, "iI", &fd, &events)) return NULL;
    struct epoll_event ev = {.events = events, .data.u64 = (1ULL << 32) | (uint32_t)fd};
    if (epoll_ctl(c->ep, EPOLL_CTL_ADD, fd, &ev) < 0 &&
        (errno != EEXIST || epoll_ctl(c->ep, EPOLL_CTL_MOD, fd, &ev) < 0))
        return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

static PyObject *Core_unwatch(Core *c, PyObject *args) {
    int fd;
    if (!PyArg_ParseTuple(args, "i", &fd)) return NULL;
    epoll_ctl(c->ep, EPOLL_CTL_DEL, fd, NULL);
    Py_RETURN_NONE;
}

/* run(max_wait_s): forward until a watched fd is ready, frames wait for Python, a signal
 * arrived or max_wait_s passed; ([ready fds], [(src, dst, frame, arrival_s)]) */
static PyObject *Core_run(Core *c, PyObject *args) {
    double max_wait;
    if (!PyArg_ParseTuple(args, "d", &max_wait)) return NULL;
    PyObject *ready = PyList_New(0);
    if (!ready) return NULL;
    double until = now_s() + max_wait;
    int stop = 0, nomem = 0;
    struct epoll_event evs[MAX_EVENTS];
    while (!stop && !nomem) {
        release_due(c);
        if (c->npyf) break;
        double t = now_s(), wait = until - t;
        if (c->nheap && c->heap[0].release_s - t < wait) wait = c->heap[0].release_s - t;
        if (wait < 0) wait = 0;
        if (t >= until) stop = 1;
        struct timespec ts = {.tv_sec = (time_t)wait,
                              .tv_nsec = (long)((wait - (double)(time_t)wait) * 1e9)};
        int n;
        Py_BEGIN_ALLOW_THREADS
        n = epoll_pwait2(c->ep, evs, MAX_EVENTS, &ts, NULL);
        Py_END_ALLOW_THREADS
        if (n < 0) {
            if (errno == EINTR) break;                  /* a signal: Python's handler runs */
            Py_DECREF(ready);
            return PyErr_SetFromErrno(PyExc_OSError);
        }
        for (int i = 0; i < n && !nomem; i++) {
            uint64_t d = evs[i].data.u64;
            if (d >> 32) {
                PyObject *fd = PyLong_FromLong((long)(uint32_t)d);
                if (!fd || PyList_Append(ready, fd) < 0) { Py_XDECREF(fd); Py_DECREF(ready); return NULL; }
                Py_DECREF(fd);
                stop = 1;
            } else if (drain(c, (int)d) < 0) {
                nomem = 1;
            }
        }
    }
    release_due(c);
    if (nomem) { Py_DECREF(ready); return PyErr_NoMemory(); }
    PyObject *frames = PyList_New((Py_ssize_t)c->npyf);
    if (!frames) { Py_DECREF(ready); return NULL; }
    for (size_t i = 0; i < c->npyf; i++) {
        PyFrame *p = &c->pyf[i];
        PyObject *t = Py_BuildValue("(iiy#d)", (int)p->src, (int)p->dst, p->data,
                                    (Py_ssize_t)p->len, p->arrival_s);
        free(p->data);
        if (!t) {
            for (size_t j = i + 1; j < c->npyf; j++) free(c->pyf[j].data);
            c->npyf = 0;
            Py_DECREF(frames); Py_DECREF(ready);
            return NULL;
        }
        PyList_SET_ITEM(frames, (Py_ssize_t)i, t);
    }
    c->npyf = 0;
    PyObject *out = PyTuple_Pack(2, ready, frames);
    Py_DECREF(ready);
    Py_DECREF(frames);
    return out;
}

static PyObject *Core_counters(Core *c, PyObject *unused) {
    PyObject *d = PyDict_New();
    if (!d) return NULL;
    for (int i = 0; i < C_N; i++) {
        PyObject *v = PyLong_FromUnsignedLongLong(c->counts[i]);
        if (!v || PyDict_SetItemString(d, COUNTER_NAMES[i], v) < 0) { Py_XDECREF(v); Py_DECREF(d); return NULL; }
        Py_DECREF(v);
    }
    return d;
}

/* errnos(): [(is_send, errno, count)] */
static PyObject *Core_errnos(Core *c, PyObject *unused) {
    PyObject *out = PyList_New(0);
    if (!out) return NULL;
    for (int s = 0; s < 2; s++)
        for (int e = 0; e < ERRNO_SLOTS; e++) {
            if (!c->errnos[s][e]) continue;
            PyObject *t = Py_BuildValue("(iiK)", s, e, (unsigned long long)c->errnos[s][e]);
            if (!t || PyList_Append(out, t) < 0) { Py_XDECREF(t); Py_DECREF(out); return NULL; }
            Py_DECREF(t);
        }
    return out;
}

static PyObject *hist_tuple(Hist *h) {
    PyObject *fine = PyList_New(FINE_BINS), *coarse = PyList_New(COARSE_BINS);
    if (!fine || !coarse) { Py_XDECREF(fine); Py_XDECREF(coarse); return NULL; }
    for (int i = 0; i < FINE_BINS; i++)
        PyList_SET_ITEM(fine, i, PyLong_FromUnsignedLongLong(h->fine[i]));
    for (int i = 0; i < COARSE_BINS; i++)
        PyList_SET_ITEM(coarse, i, PyLong_FromUnsignedLongLong(h->coarse[i]));
    return Py_BuildValue("(NNKKd)", fine, coarse, (unsigned long long)h->over,
                         (unsigned long long)h->count, h->max_s);
}

/* histogram("late" | "lag"): (fine bins, coarse bins, over, count, max_s) */
static PyObject *Core_histogram(Core *c, PyObject *args) {
    const char *which;
    if (!PyArg_ParseTuple(args, "s", &which)) return NULL;
    if (!strcmp(which, "late")) return hist_tuple(c->late);
    if (!strcmp(which, "lag")) return hist_tuple(c->lag);
    PyErr_Format(PyExc_ValueError, "histogram %R is unknown; expected 'late' or 'lag'",
                 PyTuple_GET_ITEM(args, 0));
    return NULL;
}

static PyObject *Core_budget_take(Core *c, PyObject *args) {
    long long size;
    if (!PyArg_ParseTuple(args, "L", &size)) return NULL;
    int64_t cost = size + c->budget_cost;
    if (c->budget_held + cost > c->budget_limit) { c->budget_refused++; Py_RETURN_FALSE; }
    c->budget_held += cost;
    Py_RETURN_TRUE;
}

static PyObject *Core_budget(Core *c, PyObject *unused) {
    return Py_BuildValue("(LL)", (long long)c->budget_held, (long long)c->budget_refused);
}

static PyObject *Core_held(Core *c, PyObject *unused) {
    return PyLong_FromSize_t(c->nheap);
}

static PyMethodDef Core_methods[] = {
    {"set_link", (PyCFunction)Core_set_link, METH_VARARGS, NULL},
    {"link_state", (PyCFunction)Core_link_state, METH_VARARGS, NULL},
    {"take_released", (PyCFunction)Core_take_released, METH_NOARGS, NULL},
    {"push", (PyCFunction)Core_push, METH_VARARGS, NULL},
    {"frame", (PyCFunction)Core_frame, METH_VARARGS, NULL},
    {"pop_due", (PyCFunction)Core_pop_due, METH_VARARGS, NULL},
    {"watch", (PyCFunction)Core_watch, METH_VARARGS, NULL},
    {"unwatch", (PyCFunction)Core_unwatch, METH_VARARGS, NULL},
    {"run", (PyCFunction)Core_run, METH_VARARGS, NULL},
    {"counters", (PyCFunction)Core_counters, METH_NOARGS, NULL},
    {"errnos", (PyCFunction)Core_errnos, METH_NOARGS, NULL},
    {"histogram", (PyCFunction)Core_histogram, METH_VARARGS, NULL},
    {"budget_take", (PyCFunction)Core_budget_take, METH_VARARGS, NULL},
    {"budget", (PyCFunction)Core_budget, METH_NOARGS, NULL},
    {"held", (PyCFunction)Core_held, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL}};

static PyTypeObject CoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "netem._linecore.Core",
    .tp_basicsize = sizeof(Core),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The packet line's compiled forwarding loop (see netem/packetline.py).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Core_init,
    .tp_dealloc = (destructor)Core_dealloc,
    .tp_methods = Core_methods,
};

static struct PyModuleDef linecore_module = {
    PyModuleDef_HEAD_INIT, "netem._linecore",
    "The packet line's compiled hot loop (netem/packetline.py).", -1, NULL};

PyMODINIT_FUNC PyInit__linecore(void) {
    if (PyType_Ready(&CoreType) < 0) return NULL;
    PyObject *m = PyModule_Create(&linecore_module);
    if (!m) return NULL;
    Py_INCREF(&CoreType);
    if (PyModule_AddObject(m, "Core", (PyObject *)&CoreType) < 0) {
        Py_DECREF(&CoreType);
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "BATCH", BATCH);
    return m;
}
