//! `inbound-web --probe URL`: one plain HTTP/1.1 `GET`, exit 0 on a 200 answer.
//!
//! The container image holds the binary and nothing else (no shell, no curl), so its health
//! check runs the binary itself: `inbound-web --probe http://127.0.0.1:8080/healthz`. Blocking
//! std I/O with a timeout on every step: no runtime, nothing to configure.

use std::io::{Read as _, Write as _};
use std::net::{TcpStream, ToSocketAddrs as _};
use std::time::Duration;

/// The longest wait for each of connect, write and read.
const TIMEOUT: Duration = Duration::from_secs(2);

/// Why a probe failed, for the one line it prints.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("--probe takes http://HOST:PORT/PATH, got {0:?}")]
    Url(String),
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    #[error("{url} answered {status:?}")]
    Status { url: String, status: String },
}

/// `(host:port, path)` of an `http://` URL.
fn split(url: &str) -> Result<(&str, &str), ProbeError> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| ProbeError::Url(url.to_owned()))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, "/"),
    };
    if authority.is_empty() || !authority.contains(':') || path.contains(char::is_whitespace) {
        return Err(ProbeError::Url(url.to_owned()));
    }
    Ok((authority, path))
}

/// GETs `url`; `Ok` when the status is 200.
///
/// # Errors
/// [`ProbeError`] naming the URL and what went wrong.
pub fn probe(url: &str) -> Result<(), ProbeError> {
    let (authority, path) = split(url)?;
    let io = |e| ProbeError::Io(url.to_owned(), e);
    let addr = authority
        .to_socket_addrs()
        .map_err(io)?
        .next()
        .ok_or_else(|| ProbeError::Url(url.to_owned()))?;
    let mut stream = TcpStream::connect_timeout(&addr, TIMEOUT).map_err(io)?;
    stream.set_read_timeout(Some(TIMEOUT)).map_err(io)?;
    stream.set_write_timeout(Some(TIMEOUT)).map_err(io)?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).map_err(io)?;
    // The status line is all that is needed; 64 bytes hold it.
    let mut head = [0u8; 64];
    let mut len = 0;
    while len < head.len() {
        let n = stream.read(&mut head[len..]).map_err(io)?;
        if n == 0 || head[..len + n].contains(&b'\n') {
            len += n;
            break;
        }
        len += n;
    }
    let line = String::from_utf8_lossy(&head[..len]);
    let status = line.lines().next().unwrap_or_default().trim().to_owned();
    if status.starts_with("HTTP/1.1 200 ") || status.starts_with("HTTP/1.0 200 ") {
        Ok(())
    } else {
        Err(ProbeError::Status {
            url: url.to_owned(),
            status,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read as _, Write as _};
    use std::net::TcpListener;

    use super::{ProbeError, probe, split};

    /// A one-shot server answering `status_line`; returns its URL.
    fn serve(status_line: &'static str) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a port");
        let addr = listener.local_addr().expect("an address");
        std::thread::spawn(move || {
            let (mut s, _) = listener.accept().expect("a client");
            let mut buf = [0u8; 512];
            let _ = s.read(&mut buf);
            let _ = s.write_all(format!("{status_line}\r\ncontent-length: 0\r\n\r\n").as_bytes());
        });
        format!("http://{addr}/healthz")
    }

    #[test]
    fn a_200_passes_anything_else_fails_with_the_status() {
        assert!(probe(&serve("HTTP/1.1 200 OK")).is_ok());
        match probe(&serve("HTTP/1.1 503 Service Unavailable")) {
            Err(ProbeError::Status { status, .. }) => {
                assert_eq!(status, "HTTP/1.1 503 Service Unavailable");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_closed_port_and_a_bad_url_fail_by_name() {
        let closed = TcpListener::bind("127.0.0.1:0").expect("a port");
        let url = format!("http://{}/healthz", closed.local_addr().expect("addr"));
        drop(closed);
        assert!(matches!(probe(&url), Err(ProbeError::Io(u, _)) if u == url));
        for bad in ["https://x:1/", "http:///p", "http://host/p", "ftp://h:1/"] {
            assert!(matches!(split(bad), Err(ProbeError::Url(_))), "{bad}");
        }
        assert_eq!(split("http://h:1").ok(), Some(("h:1", "/")));
    }
}
