//! The language server's framing on standard input/output: `Content-Length`
//! headers and JSON bodies, read with bounds. A malformed message (a bad or
//! huge header, a body that is not JSON or not UTF-8, JSON that is not a
//! JSON-RPC message) is answered with a JSON-RPC error and the server reads
//! on: one bad message from an editor or a fuzzer never ends the session
//! or allocates what its header claims.

use std::io::{self, BufRead, Read, Write};
use std::thread;

use crossbeam_channel::{bounded, Receiver, Sender};
use lsp_server::{Connection, Message};

/// Largest message body read.
pub const MAX_MESSAGE: usize = 64 << 20;
/// Longest header line read.
const MAX_HEADER_LINE: u64 = 8 << 10;

/// What one read from the stream gave.
#[derive(Debug)]
pub enum Incoming {
    /// A message.
    Message(Message),
    /// Something that is not one; answer it with this JSON-RPC error.
    Malformed {
        /// JSON-RPC error code: -32700 parse error, -32600 invalid request.
        code: i32,
        /// What was wrong.
        message: String,
    },
    /// The stream ended.
    Eof,
}

/// Reads the next framed message from `r`.
pub fn read_message(r: &mut impl BufRead) -> io::Result<Incoming> {
    let mut length: Option<Result<usize, String>> = None;
    let mut saw_header = false;
    loop {
        let mut line = Vec::new();
        let n = r.by_ref().take(MAX_HEADER_LINE).read_until(b'\n', &mut line)?;
        if n == 0 {
            return Ok(if saw_header { malformed(-32700, "the stream ended inside a header") } else { Incoming::Eof });
        }
        if line.last() != Some(&b'\n') {
            // Past the line limit: drop the rest of the line.
            skip_line(r)?;
            length = Some(Err("a header line is too long".into()));
            saw_header = true;
            continue;
        }
        let text = String::from_utf8_lossy(&line);
        let text = text.trim_end_matches(['\r', '\n']);
        if text.is_empty() {
            if saw_header {
                break;
            }
            continue;
        }
        saw_header = true;
        if let Some((name, value)) = text.split_once(':') {
            if name.trim().eq_ignore_ascii_case("Content-Length") {
                length = Some(value.trim().parse::<usize>().map_err(|_| format!("bad Content-Length {:?}", value.trim())));
            }
        }
    }
    let size = match length {
        None => return Ok(malformed(-32700, "a message without a Content-Length header")),
        Some(Err(e)) => return Ok(malformed(-32700, &e)),
        Some(Ok(n)) if n > MAX_MESSAGE => {
            // Read past the body without keeping it, so the next message frames.
            io::copy(&mut r.by_ref().take(n as u64), &mut io::sink())?;
            return Ok(malformed(-32700, &format!("a message of {n} bytes (the limit is {} MiB)", MAX_MESSAGE >> 20)));
        }
        Some(Ok(n)) => n,
    };
    let mut body = Vec::new();
    r.by_ref().take(size as u64).read_to_end(&mut body)?;
    if body.len() < size {
        return Ok(malformed(-32700, "the stream ended inside a message"));
    }
    let value: serde_json::Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return Ok(malformed(-32700, &format!("not JSON: {e}"))),
    };
    // (serde would read an array as a struct's fields in order.)
    if !value.is_object() {
        return Ok(malformed(-32600, "not a JSON-RPC message: not an object"));
    }
    match serde_json::from_value::<Message>(value) {
        Ok(m) => Ok(Incoming::Message(m)),
        Err(e) => Ok(malformed(-32600, &format!("not a JSON-RPC message: {e}"))),
    }
}

fn malformed(code: i32, message: &str) -> Incoming {
    Incoming::Malformed { code, message: message.to_string() }
}

fn skip_line(r: &mut impl BufRead) -> io::Result<()> {
    loop {
        let buf = r.fill_buf()?;
        if buf.is_empty() {
            return Ok(());
        }
        match buf.iter().position(|&b| b == b'\n') {
            Some(i) => {
                r.consume(i + 1);
                return Ok(());
            }
            None => {
                let n = buf.len();
                r.consume(n);
            }
        }
    }
}

/// Writes `body` framed.
fn write_framed(w: &mut impl Write, body: &str) -> io::Result<()> {
    write!(w, "Content-Length: {}\r\n\r\n{body}", body.len())?;
    w.flush()
}

/// The reader and writer threads of [`stdio`].
pub struct IoThreads {
    reader: thread::JoinHandle<io::Result<()>>,
    writer: thread::JoinHandle<io::Result<()>>,
}

impl IoThreads {
    /// Waits for both threads; the first I/O error, if any.
    pub fn join(self) -> io::Result<()> {
        let r = self.reader.join().unwrap_or_else(|_| Err(io::Error::other("the reader thread panicked")));
        let w = self.writer.join().unwrap_or_else(|_| Err(io::Error::other("the writer thread panicked")));
        r.and(w)
    }
}

/// A connection over standard input/output with bounded, forgiving reads.
pub fn stdio() -> (Connection, IoThreads) {
    let (to_client, outgoing) = bounded::<Message>(0);
    let writer = thread::spawn(move || {
        for msg in outgoing {
            let body = serde_json::to_string(&msg).map_err(io::Error::other)?;
            write_framed(&mut io::stdout().lock(), &body)?;
        }
        Ok(())
    });
    let (incoming, from_client): (Sender<Message>, Receiver<Message>) = bounded(0);
    let reader = thread::spawn(move || {
        let stdin = io::stdin();
        let mut stdin = stdin.lock();
        loop {
            match read_message(&mut stdin)? {
                Incoming::Eof => return Ok(()),
                Incoming::Malformed { code, message } => {
                    let err = serde_json::json!({"jsonrpc": "2.0", "id": null, "error": {"code": code, "message": message}});
                    write_framed(&mut io::stdout().lock(), &err.to_string())?;
                }
                Incoming::Message(m) => {
                    let exit = matches!(&m, Message::Notification(n) if n.method == "exit");
                    if incoming.send(m).is_err() || exit {
                        return Ok(());
                    }
                }
            }
        }
    });
    (Connection { sender: to_client, receiver: from_client }, IoThreads { reader, writer })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_all(input: &[u8]) -> Vec<String> {
        let mut r = io::BufReader::new(input);
        let mut out = Vec::new();
        loop {
            match read_message(&mut r).unwrap() {
                Incoming::Eof => return out,
                Incoming::Message(m) => out.push(format!("ok {}", serde_json::to_string(&m).unwrap())),
                Incoming::Malformed { code, message } => out.push(format!("{code} {message}")),
            }
        }
    }

    #[test]
    fn malformed_messages_are_reported_and_reading_goes_on() {
        let ok = r#"{"jsonrpc":"2.0","method":"initialized","params":{}}"#;
        let frame = |b: &[u8]| [format!("Content-Length: {}\r\n\r\n", b.len()).into_bytes(), b.to_vec()].concat();
        let mut input = Vec::new();
        input.extend(b"Content-Length: 18446744073709551615\r\n\r\n");
        input.extend(frame(b"{not json"));
        input.extend(frame(&[0xff, 0xfe]));
        input.extend(frame(b"[1, 2]"));
        input.extend(b"Content-Length: x\r\n\r\n");
        input.extend(frame(ok.as_bytes()));
        let got = read_all(&input);
        assert!(got[0].starts_with("-32700 a message of 18446744073709551615 bytes"), "{got:?}");
        // The huge claim swallowed the rest of the stream, as it must: the
        // framing is only as good as the header.
        assert_eq!(got.len(), 1, "{got:?}");
        let mut input = Vec::new();
        input.extend(frame(b"{not json"));
        input.extend(frame(&[0xff, 0xfe]));
        input.extend(frame(b"[1, 2]"));
        input.extend(b"Content-Length: x\r\n\r\n");
        input.extend(frame(ok.as_bytes()));
        input.extend(vec![b'H'; 20_000]);
        input.extend(b"\r\n\r\n");
        input.extend(frame(ok.as_bytes()));
        input.extend(b"Content-Length: 100\r\n\r\n{");
        let got = read_all(&input);
        let codes: Vec<&str> = got.iter().map(|g| g.split(' ').next().unwrap()).collect();
        assert_eq!(codes, ["-32700", "-32700", "-32600", "-32700", "ok", "-32700", "ok", "-32700"], "{got:?}");
    }
}
