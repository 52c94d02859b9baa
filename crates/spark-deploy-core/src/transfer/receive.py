# The receiver on a worker: appends the rest of a served file to its partial and prints the
# sha256 of the whole partial, in one pass (the start of the partial is read once, ahead of the
# stream; then each block that arrives is hashed where it landed and written from there: no
# pipe, no second read).
#
# Where the CPU goes on the worker, and why it is taken this way (docs/first-deploy.md):
# - the body is received straight into one page-aligned buffer, reused: a fresh block per
#   read cost 0.4-1.2 s more CPU per GiB;
# - whole 4 MiB blocks are written with O_DIRECT where the file system takes it: the copy
#   into the page cache was the largest cost on the worker after the hash, and the engine, not
#   the copy, should decide what the memory of the worker holds. Where O_DIRECT is refused, and for the
#   last unaligned bytes, the writes go through the page cache.
#
# argv: url, partial, bytes the partial holds, stall limit in seconds (0: none). The token is the
# first line of stdin. Exits non-zero with one line on stderr when the stream fails or ends
# short; what arrived stays in the partial (a block held in memory is written first), for the
# next attempt to resume.
#
# Run by the transfer scripts as `python3 -c`, inside single quotes: no single quote here
# (checked when the core compiles).
import hashlib
import http.client
import mmap
import os
import signal
import sys
import urllib.parse

ALIGN = 4096
BLOCK = 4 << 20


class Unbuffered:
    """Hands http.client an unbuffered reader of the socket: it reads the response head a byte
    at a time (a few hundred bytes), and nothing of the body sits in a buffer of its own."""

    def __init__(self, sock):
        self.sock = sock

    def makefile(self, mode):
        return self.sock.makefile(mode, buffering=0)


class Appender:
    """Holds what arrives in one aligned buffer whose first byte sits at an aligned offset of
    the partial (the last unaligned bytes of the partial are read back into its start), so every
    block written starts and, but for the last, ends on an alignment boundary."""

    def __init__(self, part, have, digest):
        self.fd = os.open(part, os.O_RDWR | os.O_CREAT, 0o644)
        self.buf = mmap.mmap(-1, BLOCK)
        self.view = memoryview(self.buf)
        at = 0
        while at < have:
            n = os.preadv(self.fd, [self.view[:min(BLOCK, have - at)]], at)
            if not n:
                raise OSError("the partial holds fewer than %d bytes" % have)
            digest.update(self.view[:n])
            at += n
        self.base = have - have % ALIGN
        self.fill = have - self.base
        if self.fill and os.preadv(self.fd, [self.view[:self.fill]], self.base) != self.fill:
            raise OSError("the partial changed while it was read")
        try:
            self.direct = os.open(part, os.O_WRONLY | os.O_DIRECT)
        except (OSError, AttributeError):
            self.direct = None

    def space(self):
        return self.view[self.fill:]

    def took(self, n):
        self.fill += n
        if self.fill == BLOCK:
            self.flush()

    def flush(self):
        whole = self.fill - self.fill % ALIGN
        if whole and self.direct is not None:
            try:
                self.write(self.direct, self.view[:whole], self.base)
            except OSError:
                os.close(self.direct)
                self.direct = None
        if whole and self.direct is None:
            self.write(self.fd, self.view[:whole], self.base)
        self.write(self.fd, self.view[whole:self.fill], self.base + whole)
        # One assignment: a signal never finds the buffer moved on but still counted.
        self.base, self.fill = self.base + self.fill, 0

    @staticmethod
    def write(fd, view, at):
        while view:
            n = os.pwrite(fd, view, at)
            view = view[n:]
            at += n


def hang_up(signum, frame):
    sys.exit("receiving %s: stopped by signal %d" % (sys.argv[1], signum))


def main():
    url, part, have, stall = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    token = sys.stdin.readline().strip()
    digest = hashlib.sha256()
    out = Appender(part, have, digest)
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=stall or None)
    conn.response_class = lambda sock, **kw: http.client.HTTPResponse(Unbuffered(sock), **kw)
    conn.request("GET", u.path, headers={
        "Authorization": "Bearer " + token, "Range": "bytes=%d-" % have})
    resp = conn.getresponse()
    if resp.status != 206 and not (resp.status == 200 and have == 0):
        raise OSError("the head answered HTTP %d" % resp.status)
    expected = resp.length
    got = 0
    try:
        while True:
            space = out.space()
            n = resp.readinto(space)
            if not n:
                break
            digest.update(space[:n])
            out.took(n)
            got += n
    finally:
        out.flush()
    if expected is not None and got != expected:
        raise OSError("the stream ended after %d of %d bytes" % (got, expected))
    print(digest.hexdigest())


signal.signal(signal.SIGHUP, hang_up)
signal.signal(signal.SIGTERM, hang_up)
try:
    main()
except (OSError, ValueError, http.client.HTTPException) as e:
    sys.exit("receiving %s: %s" % (sys.argv[1] if len(sys.argv) > 1 else "?", str(e) or type(e).__name__))
