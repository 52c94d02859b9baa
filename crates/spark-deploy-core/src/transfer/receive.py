# The receiver on a worker: appends the rest of a served file to its partial and takes the
# sha256 of the whole partial, in one pass (the start of the partial is read once, ahead of the
# stream; then each block that arrives is hashed where it landed and written from there: no
# pipe, no second read).
#
# Where the CPU goes on the worker, and why it is taken this way (docs/first-deploy.md):
# - the body is received straight into two aligned 4 MiB buffers, reused: a fresh block per
#   read cost 0.4-1.2 s more CPU per GiB;
# - whole 4 MiB blocks are written with O_DIRECT where the file system takes it: the copy
#   into the page cache was the largest cost on the worker after the hash, and the engine, not
#   the copy, should decide what the memory of the worker holds. Where O_DIRECT is refused, and
#   for the last unaligned bytes, the writes go through the page cache;
# - a full block is written by a thread while the other buffer fills (the GIL is released in
#   the write, the receive and the hash): a direct write waits for the disk, and with the
#   receiver waiting too the copy took 15-20 % longer;
# - the buffers sit on huge pages where the kernel gives them: a direct write of one is then a
#   few long segments, not a thousand 4 KiB ones;
# - one process serves a whole stream of files (--session): a start of Python, a shell and its
#   tools and an SSH channel per file cost about 70 ms of CPU each.
#
# Two ways to run it:
# - argv: url, partial, bytes the partial holds, stall limit in seconds (0: none); the token is
#   the first line of stdin. Prints the sum. Exits non-zero with one line on stderr when the
#   stream fails or ends short.
# - argv: --session, stall limit. stdin: the token, then one JSON object per line, each a file
#   to pull (url, dest, size, sha256, mode, manifest, claim), taken one at a time; for each, one
#   JSON line on stdout, {"code": 0, "text": <mtime>} when it landed, else the code and why
#   (pull.rs: the codes are the exit codes of the pull script).
# Either way what arrived stays in the partial (a block held in memory is written first), for
# the next attempt to resume.
#
# Run as `python3 -c`, by the transfer scripts inside single quotes: no single quote here
# (checked when the core compiles).
import hashlib
import mmap
import os
import signal
import socket
import sys
import threading
import time

ALIGN = 4096
BLOCK = 4 << 20
HUGE = 2 << 20


def huge_block():
    """A BLOCK-byte buffer, aligned to and on huge pages where the kernel gives them: a direct
    write of it is then a few long segments, not one per 4 KiB page."""
    buf = mmap.mmap(-1, BLOCK + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        buf.madvise(mmap.MADV_HUGEPAGE)
    except (AttributeError, OSError):
        pass
    try:
        import ctypes
        skip = -ctypes.addressof(ctypes.c_char.from_buffer(buf)) % HUGE
    except ImportError:
        skip = 0
    return memoryview(buf)[skip:skip + BLOCK]


class Appender:
    """Holds what arrives in aligned buffers whose first byte sits at an aligned offset of the
    partial (the last unaligned bytes of the partial are read back into its start), so every
    block written starts and, but for the last, ends on an alignment boundary. A full buffer is
    written by a thread while the next one fills: the disk and the receiving overlap."""

    def __init__(self, part, have, digest):
        self.fd = os.open(part, os.O_RDWR | os.O_CREAT, 0o644)
        self.view, self.spare = huge_block(), huge_block()
        self.pending, self.failed = None, None
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

    def close(self):
        self.settle()
        os.close(self.fd)
        if self.direct is not None:
            os.close(self.direct)

    def space(self):
        return self.view[self.fill:]

    def took(self, n):
        self.fill += n
        if self.fill == BLOCK:
            self.settle()
            self.pending = threading.Thread(target=self.write_block, args=(self.view, self.base))
            self.pending.start()
            # One assignment: a signal never finds the buffer moved on but still counted (one
            # that comes before it has the block written twice, the same bytes at the same place).
            self.view, self.spare, self.base, self.fill = (
                self.spare, self.view, self.base + BLOCK, 0)

    def settle(self):
        """Waits for the block being written; raises what its write raised."""
        # A thread a signal caught before its start is dropped: its block is still the one
        # held, and the flush that follows writes it.
        if self.pending is not None and self.pending.ident is not None:
            self.pending.join()
        self.pending = None
        if self.failed is not None:
            failed, self.failed = self.failed, None
            raise failed

    def write_block(self, view, at):
        try:
            self.write_aligned(view, at)
        except OSError as e:
            self.failed = e

    def write_aligned(self, view, at):
        """Writes view (its length a multiple of ALIGN) at at, past the page cache where the file
        system takes it."""
        if self.direct is not None:
            try:
                self.write(self.direct, view, at)
                return
            except OSError:
                os.close(self.direct)
                self.direct = None
        self.write(self.fd, view, at)

    def flush(self):
        self.settle()
        whole = self.fill - self.fill % ALIGN
        if whole:
            self.write_aligned(self.view[:whole], self.base)
        self.write(self.fd, self.view[whole:self.fill], self.base + whole)
        self.base, self.fill = self.base + self.fill, 0

    @staticmethod
    def write(fd, view, at):
        while view:
            n = os.pwrite(fd, view, at)
            view = view[n:]
            at += n


def hang_up(signum, frame):
    what = "a stream of files" if sys.argv[1] == "--session" else sys.argv[1]
    sys.exit("receiving %s: stopped by signal %d" % (what, signum))


def request(url, have, stall, token):
    """Sends the GET for the rest of url past have bytes; returns the socket, its next byte the
    first of the body, and the body length the head announced (None without one). The head is
    read a byte at a time (a few hundred bytes): nothing of the body sits in a buffer.
    http.client would do the same, at twice the start-up time of this whole receiver."""
    scheme, _, rest = url.partition("://")
    hostport, _, path = rest.partition("/")
    host, _, port = hostport.rpartition(":")
    if scheme != "http" or not host or not port.isdigit():
        raise ValueError("not a URL of the head: %s" % url)
    sock = socket.create_connection((host.strip("[]"), int(port)), timeout=stall or None)
    try:
        sock.sendall((
            "GET /%s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n"
            "Range: bytes=%d-\r\nConnection: close\r\n\r\n" % (path, hostport, token, have)
        ).encode())
        head = bytearray()
        while not head.endswith(b"\r\n\r\n"):
            byte = sock.recv(1)
            if not byte:
                raise OSError("the head closed the connection before it answered")
            if len(head) > 65536:
                raise OSError("the head answered with no end to its header")
            head += byte
        lines = head.decode("latin-1").split("\r\n")
        status = lines[0].split(" ")
        if len(status) < 2 or not status[0].startswith("HTTP/") or not status[1].isdigit():
            raise OSError("the head answered %r, not HTTP" % lines[0])
        code = int(status[1])
        if code != 206 and not (code == 200 and have == 0):
            raise OSError("the head answered HTTP %d" % code)
        length = None
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value.strip())
        return sock, length
    except BaseException:
        sock.close()
        raise


def receive(url, part, have, stall, token):
    """Appends the rest of url past the have bytes of part; returns the sha256 of the whole
    partial. Raises OSError or ValueError when the stream fails or ends short."""
    digest = hashlib.sha256()
    out = Appender(part, have, digest)
    sock = None
    try:
        sock, expected = request(url, have, stall, token)
        got = 0
        try:
            while expected is None or got < expected:
                space = out.space()
                if expected is not None:
                    space = space[:expected - got]
                n = sock.recv_into(space)
                if not n:
                    break
                digest.update(space[:n])
                out.took(n)
                got += n
        finally:
            out.flush()
    finally:
        out.close()
        if sock is not None:
            sock.close()
    if expected is not None and got != expected:
        raise OSError("the stream ended after %d of %d bytes" % (got, expected))
    return digest.hexdigest()


def failure(url, e):
    return "receiving %s: %s" % (url, str(e) or type(e).__name__)


def size_of(path):
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


def sum_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            block = f.read(BLOCK)
            if not block:
                return digest.hexdigest()
            digest.update(block)


def pull(job, token, stall):
    """One file of a session, as the pull script does it (pull.rs): resume the partial, up to 4
    attempts while each moves bytes, check size and sum, set the mode, rename, record the file in
    the manifest. Returns (0, mtime) or (exit code, why)."""
    url, dest, size, sha = job["url"], job["dest"], job["size"], job["sha256"]
    manifest, part = job["manifest"], job["dest"] + ".partial"
    for d in (os.path.dirname(dest), os.path.dirname(manifest)):
        try:
            os.makedirs(d or ".", exist_ok=True)
        except OSError as e:
            return 10, "cannot create %s: %s" % (d, e)
    have = size_of(part)
    if have > size:
        os.unlink(part)
        have = 0
    total = None
    claim_size, _, claim_sum = (job.get("claim") or "").partition(":")
    if claim_sum and have == size and claim_size == str(have):
        if claim_sum == sha:
            total = sha
        else:
            os.unlink(part)
            have = 0
    tries = 0
    while have < size:
        tries += 1
        try:
            total = receive(url, part, have, stall, token)
            break
        except (OSError, ValueError) as e:
            why = failure(url, e)
        before, have, total = have, size_of(part), None
        if have <= before or tries >= 4:
            return 11, why
        time.sleep(1)
    if not os.path.exists(part):
        open(part, "ab").close()
    got = size_of(part)
    if got != size:
        return 12, "size %d, expected %d" % (got, size)
    if total is None:
        total = sum_of(part)
    if total != sha:
        os.unlink(part)
        return 13, "sha256 %s, expected %s (partial removed)" % (total, sha)
    try:
        os.chmod(part, int(job["mode"], 8))
        os.replace(part, dest)
        mtime = "%d.%09d" % divmod(os.stat(dest).st_mtime_ns, 10**9)
        with open(manifest, "a") as m:
            m.write("%s\t%d\t%s\t%s\n" % (dest, size, mtime, sha))
    except OSError as e:
        return 14, str(e)
    return 0, mtime


def session(stall):
    import json
    token = sys.stdin.readline().strip()
    for line in sys.stdin:
        job = json.loads(line)
        try:
            code, text = pull(job, token, stall)
        except OSError as e:
            code, text = 15, "%s: %s" % (job.get("dest"), e)
        sys.stdout.write(json.dumps({"code": code, "text": text}) + "\n")
        sys.stdout.flush()


def main():
    if sys.argv[1] == "--session":
        session(int(sys.argv[2]))
        return
    url, part, have, stall = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    token = sys.stdin.readline().strip()
    print(receive(url, part, have, stall, token))


signal.signal(signal.SIGHUP, hang_up)
signal.signal(signal.SIGTERM, hang_up)
try:
    main()
except (OSError, ValueError) as e:
    sys.exit(failure(sys.argv[1] if len(sys.argv) > 1 else "?", e))
