//! The fast path for an allowed file: the request head read here, the body sent by the kernel
//! (`sendfile(2)`: from the page cache to the socket, never through this process's memory nor
//! the runtime's blocking-pool reads).
//!
//! A connection whose first bytes are `GET /f/` is answered here, once, and closed
//! (`Connection: close`); every other connection goes to the router, which also serves `/f/` to a
//! connection that asked for something else first. What the pulls send is `Range: bytes=<n>-`
//! (and `bytes=<n>-<m>` is honoured too); any other range is ignored and the whole file served,
//! as HTTP allows.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::sync::watch;

use super::{Shared, count_from, token_matches};

/// The start of a request this path answers.
const FILE_REQUEST: &[u8] = b"GET /f/";
/// The longest request head read (ours are a few hundred bytes).
const MAX_HEAD: usize = 16 << 10;
/// How long a connection may take to send its request head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a connection whose bytes are all queued is held for its client to read them and
/// close (a receiver that moves nothing for 30 s gives up by itself).
const DRAIN_TIMEOUT: Duration = Duration::from_secs(60);
/// Bytes per `sendfile` call: the served-bytes counter ([`super::FileServer::positions`]) moves
/// at this grain.
const CHUNK: usize = 4 << 20;

/// Whether the connection's first bytes are `GET /f/` (without consuming them); `false` also for
/// a connection that closes or stays silent first.
pub(super) async fn is_file_request(stream: &TcpStream) -> bool {
    let look = async {
        let mut first = [0u8; FILE_REQUEST.len()];
        loop {
            let n = stream.peek(&mut first).await?;
            if n == 0 || first[..n] != FILE_REQUEST[..n] {
                return Ok::<_, io::Error>(false);
            }
            if n == FILE_REQUEST.len() {
                return Ok(true);
            }
            // Part of the request line is here: the rest is a segment away.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    matches!(tokio::time::timeout(HEAD_TIMEOUT, look).await, Ok(Ok(true)))
}

/// Answers the `GET /f/<id>` on `stream`, then closes it. Once `stopped` turns `true` (or its
/// sender is gone) the connection is reset at once, bytes still in flight discarded.
pub(super) async fn respond(
    mut stream: TcpStream,
    shared: Arc<Shared>,
    mut stopped: watch::Receiver<bool>,
) {
    let answer = tokio::select! {
        head = tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut stream)) => match head {
            Ok(Ok(head)) => answer(&shared, &head),
            // A head that never ends, is too long, or a connection gone: nothing to answer.
            _ => return,
        },
        _ = stopped.wait_for(|s| *s) => return reset(&stream),
    };
    let Answer::Body {
        head,
        file,
        path,
        start,
        len,
    } = answer
    else {
        if let Answer::Refused(head) = answer {
            let _ = stream.write_all(head.as_bytes()).await;
        }
        return;
    };
    if stream.write_all(head.as_bytes()).await.is_err() {
        return;
    }
    let sent = count_from(&shared, path, start);
    let Ok(sock) = stream.into_std().and_then(|s| {
        s.set_nonblocking(false)?;
        Ok(s)
    }) else {
        return;
    };
    let Ok(guard) = sock.try_clone() else { return };
    let sending = tokio::task::spawn_blocking(move || send(&sock, &file, start, len, &sent));
    tokio::select! {
        _ = sending => {}
        _ = stopped.wait_for(|s| *s) => return reset_std(&guard),
    }
    // Every byte is queued, but may still sit in the socket's buffer (a slow link holds a whole
    // small file there). Closing now would have the kernel deliver it after the run that owns
    // this pull ended; so the connection is held until the client has read everything and closed
    // its end, and a stop meanwhile still resets it, discarding what has not arrived.
    let Ok(conn) = guard
        .set_nonblocking(true)
        .and_then(|()| TcpStream::from_std(guard))
    else {
        return;
    };
    let mut rest = [0u8; 512];
    let drained = async {
        loop {
            if conn.readable().await.is_err() {
                return;
            }
            match conn.try_read(&mut rest) {
                // The client closed its end: it has read everything.
                Ok(0) => return,
                // Anything else it sends is not asked for: ignored.
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(_) => return,
            }
        }
    };
    tokio::select! {
        () = drained => {}
        () = tokio::time::sleep(DRAIN_TIMEOUT) => {}
        _ = stopped.wait_for(|s| *s) => reset(&conn),
    }
}

/// What a request gets.
enum Answer {
    /// A status with no body (the head to write).
    Refused(String),
    /// `len` bytes of `file` from `start`, after `head`.
    Body {
        head: String,
        file: std::fs::File,
        path: PathBuf,
        start: u64,
        len: u64,
    },
}

/// Reads up to the end of the request head.
async fn read_head(stream: &mut TcpStream) -> io::Result<Vec<u8>> {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 2048];
    loop {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        head.extend_from_slice(&buf[..n]);
        if head.windows(4).any(|w| w == b"\r\n\r\n") {
            return Ok(head);
        }
        if head.len() > MAX_HEAD {
            return Err(io::ErrorKind::InvalidData.into());
        }
    }
}

/// A head with no body: `code`, `extra` header lines (each ending in CRLF).
fn status_only(code: &str, extra: &str) -> String {
    format!("HTTP/1.1 {code}\r\ncontent-length: 0\r\n{extra}connection: close\r\n\r\n")
}

/// The answer to the request `head`: refused (400, 401, 404, 416) or the file's bytes.
fn answer(shared: &Shared, head: &[u8]) -> Answer {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut req = httparse::Request::new(&mut headers);
    if !matches!(req.parse(head), Ok(httparse::Status::Complete(_))) {
        return Answer::Refused(status_only("400 Bad Request", ""));
    }
    let header = |name: &str| {
        req.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .and_then(|h| std::str::from_utf8(h.value).ok())
    };
    if !token_matches(shared, header("authorization")) {
        return Answer::Refused(status_only("401 Unauthorized", ""));
    }
    let id = req.path.and_then(|p| p.strip_prefix("/f/")).unwrap_or("");
    let path = shared.files.read().ok().and_then(|t| t.get(id).cloned());
    let Some((path, file, size)) = path.and_then(|p| {
        let file = std::fs::File::open(&p).ok()?;
        let size = file.metadata().ok()?.len();
        Some((p, file, size))
    }) else {
        return Answer::Refused(status_only("404 Not Found", ""));
    };
    let range = header("range").and_then(byte_range);
    let Some((start, last)) = range else {
        return Answer::Body {
            head: format!(
                "HTTP/1.1 200 OK\r\ncontent-length: {size}\r\naccept-ranges: bytes\r\nconnection: close\r\n\r\n"
            ),
            file,
            path,
            start: 0,
            len: size,
        };
    };
    let last = last.map_or(size.saturating_sub(1), |l| l.min(size.saturating_sub(1)));
    if start >= size || last < start {
        return Answer::Refused(status_only(
            "416 Range Not Satisfiable",
            &format!("content-range: bytes */{size}\r\n"),
        ));
    }
    let len = last - start + 1;
    Answer::Body {
        head: format!(
            "HTTP/1.1 206 Partial Content\r\ncontent-length: {len}\r\ncontent-range: bytes {start}-{last}/{size}\r\naccept-ranges: bytes\r\nconnection: close\r\n\r\n"
        ),
        file,
        path,
        start,
        len,
    }
}

/// `bytes=<first>-` or `bytes=<first>-<last>`; `None` for any other form (served whole).
fn byte_range(v: &str) -> Option<(u64, Option<u64>)> {
    let (first, last) = v.trim().strip_prefix("bytes=")?.split_once('-')?;
    let first = first.trim().parse().ok()?;
    let last = match last.trim() {
        "" => None,
        l => Some(l.parse().ok()?),
    };
    Some((first, last))
}

/// Sends `len` bytes of `file` from `start` on the blocking socket `sock`, counting them in
/// `sent`.
fn send(
    sock: &std::net::TcpStream,
    file: &std::fs::File,
    start: u64,
    len: u64,
    sent: &AtomicU64,
) -> io::Result<()> {
    let (mut at, end) = (start, start + len);
    while at < end {
        let want = usize::try_from(end - at).map_or(CHUNK, |n| n.min(CHUNK));
        match rustix::fs::sendfile(sock, file, Some(&mut at), want) {
            Ok(0) => return Err(io::Error::other("the file ended before its size")),
            Ok(n) => {
                sent.fetch_add(n as u64, Ordering::Relaxed);
            }
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Closing `stream` from here on resets it (`SO_LINGER` 0): bytes not yet delivered are dropped.
fn reset(stream: &TcpStream) {
    let _ = stream.set_zero_linger();
}

/// As [`reset`], for a connection a blocked `sendfile` holds: shutting it down wakes that call
/// (which then fails), and the last close sends the reset.
fn reset_std(stream: &std::net::TcpStream) {
    let _ = rustix::net::sockopt::set_socket_linger(stream, Some(Duration::ZERO));
    let _ = stream.shutdown(std::net::Shutdown::Both);
}

#[cfg(test)]
mod tests {
    use super::super::FileServer;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    /// Sends `request` on a new connection; everything the server answered before closing.
    async fn exchange(server: &FileServer, request: &str) -> String {
        let mut conn = tokio::net::TcpStream::connect(server.addr()).await.unwrap();
        conn.write_all(request.as_bytes()).await.unwrap();
        let mut out = Vec::new();
        conn.read_to_end(&mut out).await.unwrap();
        String::from_utf8_lossy(&out).into_owned()
    }

    fn get(server: &FileServer, url: &str, extra: &str) -> String {
        let path = url.split_once(&server.addr().to_string()).unwrap().1;
        format!("GET {path} HTTP/1.1\r\nHost: x\r\n{extra}\r\n")
    }

    /// The kernel-sent path answers as the router did: the token, the allow-list and the range
    /// are checked, each refusal has its status, and a range's bytes are exactly the file's.
    #[tokio::test]
    async fn refusals_and_ranges_are_answered_as_http_says() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("blob.bin");
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let server = FileServer::start("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let url = server.allow(path);
        let auth = format!("Authorization: Bearer {}\r\n", server.token().expose());

        let r = exchange(&server, &get(&server, &url, "")).await;
        assert!(r.starts_with("HTTP/1.1 401 "), "{r}");
        let r = exchange(
            &server,
            &get(&server, &url, "Authorization: Bearer nope\r\n"),
        )
        .await;
        assert!(r.starts_with("HTTP/1.1 401 "), "{r}");
        let other = url.replace("/f/0", "/f/7");
        let r = exchange(&server, &get(&server, &other, &auth)).await;
        assert!(r.starts_with("HTTP/1.1 404 "), "{r}");
        let r = exchange(
            &server,
            &get(&server, &url, &format!("{auth}Range: bytes=100000-\r\n")),
        )
        .await;
        assert!(r.starts_with("HTTP/1.1 416 "), "{r}");
        assert!(r.contains("content-range: bytes */100000\r\n"), "{r}");

        let whole = reqwest::Client::new()
            .get(&url)
            .bearer_auth(server.token().expose())
            .send()
            .await
            .unwrap();
        assert_eq!(whole.status(), 200);
        assert_eq!(whole.bytes().await.unwrap(), data);
        let part = reqwest::Client::new()
            .get(&url)
            .bearer_auth(server.token().expose())
            .header("Range", "bytes=10-19")
            .send()
            .await
            .unwrap();
        assert_eq!(part.status(), 206);
        assert_eq!(
            part.headers()["content-range"].to_str().unwrap(),
            "bytes 10-19/100000"
        );
        assert_eq!(part.bytes().await.unwrap(), data[10..20]);
    }

    /// A connection whose first request is not for a whole file goes to the router, which then
    /// also serves a whole file on it (a kept-alive connection is never refused a file).
    #[tokio::test]
    async fn a_kept_alive_connection_gets_a_file_from_the_router() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("blob.bin");
        std::fs::write(&path, b"0123456789").unwrap();
        let server = FileServer::start("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let url = server.allow(path);
        let auth = format!("Authorization: Bearer {}\r\n", server.token().expose());
        let growing = url.replace("/f/0", "/g/9");
        let first = get(&server, &growing, &auth);
        let second = get(&server, &url, &format!("{auth}Connection: close\r\n"));
        let r = exchange(&server, &format!("{first}{second}")).await;
        assert!(r.starts_with("HTTP/1.1 404 "), "{r}");
        assert!(r.contains("HTTP/1.1 200 OK"), "{r}");
        assert!(r.ends_with("0123456789"), "{r}");
    }
}
