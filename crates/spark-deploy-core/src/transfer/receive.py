# The receiver on a worker: appends the rest of a served file to its partial and prints the
# sha256 of the whole partial, in one pass (the start of the partial is read once, ahead of the
# stream; then each block that arrives is hashed and written from the same buffer: no pipe, no
# second read).
#
# argv: url, partial, bytes the partial holds, stall limit in seconds (0: none). The token is the
# first line of stdin. Exits non-zero with one line on stderr when the stream fails or ends
# short; what arrived stays in the partial, for the next attempt to resume.
#
# Run by the transfer scripts as `python3 -c`, inside single quotes: no single quote here
# (checked when the core compiles).
import hashlib
import http.client
import os
import sys
import urllib.parse

BLOCK = 1 << 20


def main():
    url, part, have, stall = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    token = sys.stdin.readline().strip()
    digest = hashlib.sha256()
    fd = os.open(part, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
    at = 0
    while at < have:
        block = os.pread(fd, min(BLOCK, have - at), at)
        if not block:
            raise OSError("the partial holds fewer than %d bytes" % have)
        digest.update(block)
        at += len(block)
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=stall or None)
    conn.request("GET", u.path, headers={
        "Authorization": "Bearer " + token, "Range": "bytes=%d-" % have})
    resp = conn.getresponse()
    if resp.status != 206 and not (resp.status == 200 and have == 0):
        raise OSError("the head answered HTTP %d" % resp.status)
    expected = resp.length
    got = 0
    while True:
        block = resp.read1(BLOCK)
        if not block:
            break
        digest.update(block)
        view = memoryview(block)
        while view:
            view = view[os.write(fd, view):]
        got += len(block)
    if expected is not None and got != expected:
        raise OSError("the stream ended after %d of %d bytes" % (got, expected))
    print(digest.hexdigest())


try:
    main()
except (OSError, ValueError, http.client.HTTPException) as e:
    sys.exit("receiving %s: %s" % (sys.argv[1] if len(sys.argv) > 1 else "?", str(e) or type(e).__name__))
