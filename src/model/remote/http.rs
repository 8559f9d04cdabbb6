//! JSON over HTTP to an engine: the key, timeouts, retries with backoff on
//! 429, 5xx and refused connections, bounded responses, and errors that say
//! what failed in words.

use std::io::Read;
use std::time::Duration;

use serde_json::Value;

use super::{RemoteError, RemoteOptions};

/// Largest response read (a completion with log-probs is far smaller).
const MAX_RESPONSE: u64 = 64 << 20;
/// The first retry's wait; each later one doubles it.
const BACKOFF: Duration = Duration::from_millis(250);

/// An engine's HTTP endpoint (a clone shares its connection pool).
#[derive(Debug, Clone)]
pub struct Client {
    base: String,
    key: Option<String>,
    retries: u32,
    timeout: Duration,
    agent: ureq::Agent,
}

/// One failed attempt: whether another may succeed, and what happened.
struct Attempt {
    retry: bool,
    error: RemoteError,
}

impl Client {
    /// A client for `opts.url`.
    pub fn new(opts: &RemoteOptions) -> Client {
        // The timeout bounds the whole exchange, so a server that answers a
        // byte at a time cannot hold a run forever.
        let agent = ureq::AgentBuilder::new().timeout_connect(Duration::from_secs(10).min(opts.timeout)).timeout(opts.timeout).build();
        Client { base: opts.url.clone(), key: opts.api_key.clone(), retries: opts.retries, timeout: opts.timeout, agent }
    }

    /// The base URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// `GET path`, as JSON.
    pub fn get_json(&self, path: &str) -> Result<Value, RemoteError> {
        self.with_retries(path, || self.send(self.agent.get(&self.url(path)), None))
    }

    /// `POST path` with a JSON body, as JSON.
    pub fn post_json(&self, path: &str, body: &Value) -> Result<Value, RemoteError> {
        self.with_retries(path, || self.send(self.agent.post(&self.url(path)), Some(body)))
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn with_retries(&self, path: &str, mut attempt: impl FnMut() -> Result<Value, Attempt>) -> Result<Value, RemoteError> {
        let mut wait = BACKOFF;
        let mut tries = 0;
        loop {
            match attempt() {
                Ok(v) => return Ok(v),
                Err(a) if a.retry && tries < self.retries => {
                    tries += 1;
                    std::thread::sleep(wait);
                    wait *= 2;
                }
                Err(a) => {
                    let after = if tries > 0 { format!(" (after {} attempts)", tries + 1) } else { String::new() };
                    return Err(RemoteError(format!("{}{path}: {}{after}", self.base, a.error)));
                }
            }
        }
    }

    fn send(&self, mut req: ureq::Request, body: Option<&Value>) -> Result<Value, Attempt> {
        if let Some(k) = &self.key {
            req = req.set("Authorization", &format!("Bearer {k}"));
        }
        let sent = match body {
            Some(b) => req.send_json(b),
            None => req.call(),
        };
        match sent {
            Ok(resp) => {
                let mut text = Vec::new();
                resp.into_reader().take(MAX_RESPONSE).read_to_end(&mut text).map_err(|e| self.transport_io(&e))?;
                serde_json::from_slice(&text).map_err(|e| Attempt { retry: false, error: RemoteError(format!("the response is not JSON: {e}")) })
            }
            Err(ureq::Error::Status(code, resp)) => {
                let mut text = String::new();
                let _ = resp.into_reader().take(4096).read_to_string(&mut text);
                let detail = serde_json::from_str::<Value>(&text)
                    .ok()
                    .and_then(|v| v["error"]["message"].as_str().or(v["error"].as_str()).or(v["message"].as_str()).map(str::to_string))
                    .unwrap_or_else(|| text.trim().chars().take(300).collect());
                let what = match code {
                    401 | 403 => "the server refused the API key (set LMT_API_KEY to the key the server was started with)".to_string(),
                    _ => format!("HTTP {code}"),
                };
                let error = RemoteError(if detail.is_empty() { what } else { format!("{what}: {detail}") });
                Err(Attempt { retry: code == 429 || code >= 500, error })
            }
            Err(ureq::Error::Transport(t)) => Err(self.transport(&t)),
        }
    }

    fn transport(&self, t: &ureq::Transport) -> Attempt {
        use std::error::Error as _;
        if let Some(io) = t.source().and_then(|s| s.downcast_ref::<std::io::Error>()) {
            return self.transport_io(io);
        }
        match t.kind() {
            ureq::ErrorKind::ConnectionFailed | ureq::ErrorKind::Dns => Attempt {
                retry: true,
                error: RemoteError(format!("cannot connect ({}): is the server running at that address?", t.message().unwrap_or("connection failed"))),
            },
            _ => Attempt { retry: false, error: RemoteError(t.to_string()) },
        }
    }

    fn transport_io(&self, e: &std::io::Error) -> Attempt {
        use std::io::ErrorKind as K;
        match e.kind() {
            K::TimedOut | K::WouldBlock => Attempt {
                retry: false,
                error: RemoteError(format!("no response within {:.0?} (the timeout; give a longer one with --timeout)", self.timeout)),
            },
            K::ConnectionRefused | K::ConnectionReset | K::ConnectionAborted | K::NotConnected => Attempt {
                retry: true,
                error: RemoteError(format!("cannot connect ({e}): is the server running at that address?")),
            },
            _ => Attempt { retry: false, error: RemoteError(e.to_string()) },
        }
    }
}
