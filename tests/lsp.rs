//! The language server: in-memory protocol tests for each feature, and the
//! real binary spoken to over stdio.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use lsp_server::{Connection, Message, Notification, Request, RequestId};
use serde_json::{json, Value};

/// A client talking to a server thread in memory.
struct Client {
    conn: Connection,
    next: i32,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Notifications received while waiting for something else.
    pending: Vec<Notification>,
}

impl Client {
    fn start() -> Client {
        Client::start_in(None)
    }

    /// A client whose workspace folder is `root`.
    fn start_in(root: Option<&str>) -> Client {
        let (server, conn) = Connection::memory();
        let thread = std::thread::spawn(move || lmt::lsp::serve(&server).unwrap());
        let mut c = Client { conn, next: 1, thread: Some(thread), pending: Vec::new() };
        let caps = c.request("initialize", json!({"capabilities": {}, "rootUri": root}));
        assert_eq!(caps["capabilities"]["hoverProvider"], json!(true));
        assert_eq!(caps["capabilities"]["positionEncoding"], json!("utf-16"));
        c.notify("initialized", json!({}));
        c
    }

    fn notify(&self, method: &str, params: Value) {
        self.conn.sender.send(Message::Notification(Notification::new(method.into(), params))).unwrap();
    }

    fn request(&mut self, method: &str, params: Value) -> Value {
        let id = RequestId::from(self.next);
        self.next += 1;
        self.conn.sender.send(Message::Request(Request::new(id.clone(), method.into(), params))).unwrap();
        loop {
            match self.conn.receiver.recv_timeout(Duration::from_secs(20)).expect("a response") {
                Message::Response(r) if r.id == id => {
                    assert!(r.error.is_none(), "{method}: {:?}", r.error);
                    return r.result.unwrap_or(Value::Null);
                }
                Message::Notification(n) => self.pending.push(n),
                _ => {}
            }
        }
    }

    /// The next diagnostics published for `uri`.
    fn diagnostics(&mut self, uri: &str) -> Vec<Value> {
        if let Some(i) = self.pending.iter().position(|n| n.params["uri"] == uri) {
            let n = self.pending.remove(i);
            return n.params["diagnostics"].as_array().unwrap().clone();
        }
        loop {
            match self.conn.receiver.recv_timeout(Duration::from_secs(20)).expect("diagnostics") {
                Message::Notification(n) if n.method == "textDocument/publishDiagnostics" && n.params["uri"] == uri => {
                    return n.params["diagnostics"].as_array().unwrap().clone();
                }
                Message::Notification(n) => self.pending.push(n),
                _ => {}
            }
        }
    }

    fn open(&mut self, uri: &str, text: &str) -> Vec<Value> {
        self.notify("textDocument/didOpen", json!({"textDocument": {"uri": uri, "languageId": "lmt", "version": 1, "text": text}}));
        self.diagnostics(uri)
    }

    fn change(&mut self, uri: &str, version: i32, text: &str) {
        self.notify("textDocument/didChange", json!({"textDocument": {"uri": uri, "version": version}, "contentChanges": [{"text": text}]}));
    }

    fn at(&mut self, method: &str, uri: &str, line: u32, character: u32) -> Value {
        self.request(method, json!({"textDocument": {"uri": uri}, "position": {"line": line, "character": character}}))
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.request("shutdown", Value::Null);
        self.notify("exit", Value::Null);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

fn range(d: &Value) -> (u64, u64, u64, u64) {
    let r = &d["range"];
    let n = |v: &Value| v.as_u64().unwrap();
    (n(&r["start"]["line"]), n(&r["start"]["character"]), n(&r["end"]["line"]), n(&r["end"]["character"]))
}

const TWO_ERRORS: &str = "Hello.\n{% gen a max_tokns=5 %}\n{{ nope }}\n";

#[test]
fn diagnostics_on_open_and_after_a_change() {
    let mut c = Client::start();
    let uri = "file:///tmp/lmt-lsp-test/two.lmt";
    let diags = c.open(uri, TWO_ERRORS);
    assert_eq!(diags.len(), 2, "{diags:?}");
    // The same codes and spans `lmt check` reports.
    let ws = lmt::workspace::Workspace::load_text("two.lmt", TWO_ERRORS, None, &lmt::workspace::FsLoader::default());
    let codes: Vec<String> = ws.diagnostics.iter().map(|d| d.code.as_str().to_string()).collect();
    assert_eq!(diags.iter().map(|d| d["code"].as_str().unwrap().to_string()).collect::<Vec<_>>(), codes);
    assert_eq!(range(&diags[0]), (1, 9, 1, 18), "max_tokns on line 2");
    assert_eq!(range(&diags[1]), (2, 3, 2, 7), "nope on line 3");
    assert!(diags[0]["message"].as_str().unwrap().contains("help: did you mean `max_tokens`?"));
    assert_eq!(diags[0]["source"], "lmt");
    // Fix the first; one remains, reported after the quiet period.
    c.change(uri, 2, "Hello.\n{% gen a max_tokens=5 %}\n{{ nope }}\n");
    let diags = c.diagnostics(uri);
    assert_eq!(diags.len(), 1, "{diags:?}");
    assert_eq!(range(&diags[0]), (2, 3, 2, 7));
    // Several quick edits are checked once, with the last text.
    c.change(uri, 3, "{{ a }");
    c.change(uri, 4, "{% set a = 1 %}{{ a }}");
    assert!(c.diagnostics(uri).is_empty());
}

#[test]
fn positions_count_utf16_code_units() {
    let mut c = Client::start();
    let uri = "file:///tmp/lmt-lsp-test/utf16.lmt";
    // 😀 is two UTF-16 units (four bytes); 日本 two units (six bytes).
    let text = "😀日本 {{ nope }}\n";
    let diags = c.open(uri, text);
    assert_eq!(diags.len(), 1);
    assert_eq!(range(&diags[0]), (0, 8, 0, 12));
    // And back: a UTF-16 column from the client finds the right byte.
    c.change(uri, 2, "😀日本 {% set nope = 1 %}{{ nope }}\n");
    let h = c.at("textDocument/hover", uri, 0, 27);
    assert!(h["contents"]["value"].as_str().unwrap().contains("variable **nope**"), "{h}");
    assert_eq!(h["range"]["start"]["character"], 26);
}

#[test]
fn errors_in_imported_files_are_published_to_those_files() {
    let dir = std::env::temp_dir().join(format!("lmt-lsp-imports-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let lib = dir.join("lib.lmt");
    std::fs::write(&lib, "{% def greet(name) %}Hi {{ nmae }}{% end %}\n").unwrap();
    let main = dir.join("main.lmt");
    let main_uri = lmt::lsp::path_to_uri(&main).unwrap().as_str().to_string();
    let lib_uri = lmt::lsp::path_to_uri(&std::fs::canonicalize(&lib).unwrap()).unwrap().as_str().to_string();
    let mut c = Client::start();
    let text = "{% import \"lib.lmt\" as lib %}{{ lib.greet(\"Ada\") }}\n";
    assert!(c.open(&main_uri, text).is_empty());
    let lib_diags = c.diagnostics(&lib_uri);
    assert_eq!(lib_diags.len(), 1, "{lib_diags:?}");
    assert_eq!(range(&lib_diags[0]), (0, 27, 0, 31));
    // Opening the imported file with the fix in the editor (unsaved) and
    // re-checking the importer clears it.
    c.open(&lib_uri, "{% def greet(name) %}Hi {{ name }}{% end %}\n");
    c.change(&main_uri, 2, text);
    assert!(c.diagnostics(&main_uri).is_empty());
    assert!(c.diagnostics(&lib_uri).is_empty(), "stale diagnostics of the imported file are cleared");
    // Go to definition on the import path opens the file; on `lib.greet`, the def.
    let d = c.at("textDocument/definition", &main_uri, 0, 13);
    assert_eq!(d["uri"], lib_uri);
    let d = c.at("textDocument/definition", &main_uri, 0, 38);
    assert_eq!(d["uri"], lib_uri);
    assert_eq!(d["range"]["start"]["character"], 7);
}

#[test]
fn imports_may_reach_the_workspace_folder_and_no_further() {
    let dir = std::env::temp_dir().join(format!("lmt-lsp-root-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("app/prompts")).unwrap();
    std::fs::create_dir_all(dir.join("app/lib")).unwrap();
    std::fs::write(dir.join("app/lib/util.lmt"), "{% def hi() %}hi{% end %}\n").unwrap();
    std::fs::write(dir.join("secret.lmt"), "{% def s() %}s{% end %}\n").unwrap();
    let app = std::fs::canonicalize(dir.join("app")).unwrap();
    let root_uri = lmt::lsp::path_to_uri(&app).unwrap().as_str().to_string();
    let main_uri = lmt::lsp::path_to_uri(&app.join("prompts/main.lmt")).unwrap().as_str().to_string();
    let mut c = Client::start_in(Some(&root_uri));
    assert!(c.open(&main_uri, "{% import \"../lib/util.lmt\" as u %}{{ u.hi() }}\n").is_empty(), "inside the workspace folder");
    let d = c.open(&main_uri, "{% import \"../../secret.lmt\" as s %}{{ s.s() }}\n");
    assert!(d.iter().any(|d| d["message"].as_str().unwrap().contains("outside the template's root folder")), "{d:?}");
    drop(c);
    let _ = std::fs::remove_dir_all(&dir);
}

const PROGRAM: &str = r#"{% input topic %}
{% import "std/regex" as re %}
{% grammar move %}root ::= [a-h] [1-8]{% end %}
{% def ask(q) %}Q: {{ q }}{% end %}
{% set n = 3 %}
{% user %}{{ ask(topic) }}{% end %}
{% gen answer max_tokens=20 stop="\n" regex=re.word %}
{% select pick %}yes{% or %}no{% end %}
{{ answer | upper }} {{ n }}
"#;

#[test]
fn hover_explains_keywords_options_filters_and_variables() {
    let mut c = Client::start();
    let uri = "file:///tmp/lmt-lsp-test/hover.lmt";
    c.open(uri, PROGRAM);
    let hover = |c: &mut Client, line, ch| c.at("textDocument/hover", uri, line, ch)["contents"]["value"].as_str().unwrap_or("").to_string();
    assert!(hover(&mut c, 6, 4).contains("generate a value"), "keyword gen");
    let opt = hover(&mut c, 6, 16);
    assert!(opt.contains("**max_tokens**") && opt.contains("integer ≥ 1") && opt.contains("default: 256"), "{opt}");
    assert!(hover(&mut c, 8, 13).contains("upper case"), "filter upper");
    let var = hover(&mut c, 8, 25);
    assert!(var.contains("variable **n**") && var.contains("line 5") && var.contains("{% set n = 3 %}"), "{var}");
    let cap = hover(&mut c, 8, 5);
    assert!(cap.contains("captured value **answer**") && cap.contains("line 7"), "{cap}");
    assert!(hover(&mut c, 5, 14).contains("def **ask**"));
    assert!(hover(&mut c, 5, 18).contains("input **topic**"));
    // A stdlib definition through its import alias.
    let std = hover(&mut c, 6, 48);
    assert!(std.contains("variable **word** from `std/regex`") && std.contains("[A-Za-z]+"), "{std}");
    // Prompt text has no hover.
    assert!(c.at("textDocument/hover", uri, 7, 19).is_null(), "text inside a select branch");
}

fn labels(v: &Value) -> Vec<String> {
    v.as_array().unwrap().iter().map(|i| i["label"].as_str().unwrap().to_string()).collect()
}

#[test]
fn completion_offers_what_fits_the_cursor() {
    let mut c = Client::start();
    let uri = "file:///tmp/lmt-lsp-test/complete.lmt";
    let text = "{% set count = 1 %}{% for x in [1] %}{{ x }}{% end %}\n{% \n{% gen a  %}\n{{ count | }}\n{% import \"\n{{ co }}\n";
    c.open(uri, text);
    let kw = labels(&c.at("textDocument/completion", uri, 1, 3));
    assert!(kw.contains(&"gen".to_string()) && kw.contains(&"select".to_string()) && kw.contains(&"end".to_string()), "{kw:?}");
    let opts = labels(&c.at("textDocument/completion", uri, 2, 9));
    assert!(opts.contains(&"max_tokens".to_string()) && opts.contains(&"regex".to_string()) && !opts.contains(&"score".to_string()), "{opts:?}");
    let filters = labels(&c.at("textDocument/completion", uri, 3, 10));
    assert!(filters.contains(&"upper".to_string()) && filters.contains(&"len".to_string()), "{filters:?}");
    let mods = labels(&c.at("textDocument/completion", uri, 4, 11));
    assert!(mods.contains(&"std/json".to_string()), "{mods:?}");
    let vars = labels(&c.at("textDocument/completion", uri, 5, 5));
    assert!(vars.contains(&"count".to_string()), "{vars:?}");
    assert!(!vars.contains(&"x".to_string()), "loop variables are not in scope outside the loop: {vars:?}");
    // Nothing is offered in prompt text.
    let text_pos = c.at("textDocument/completion", uri, 0, 0);
    assert!(text_pos.as_array().unwrap().is_empty(), "{text_pos}");
}

#[test]
fn definition_and_symbols() {
    let mut c = Client::start();
    let uri = "file:///tmp/lmt-lsp-test/defs.lmt";
    c.open(uri, PROGRAM);
    let d = c.at("textDocument/definition", uri, 8, 25);
    assert_eq!(d["uri"], uri);
    assert_eq!(d["range"]["start"], json!({"line": 4, "character": 7}));
    let d = c.at("textDocument/definition", uri, 5, 14);
    assert_eq!(d["range"]["start"], json!({"line": 3, "character": 7}));
    let d = c.at("textDocument/definition", uri, 5, 18);
    assert_eq!(d["range"]["start"], json!({"line": 0, "character": 9}));
    let syms = c.request("textDocument/documentSymbol", json!({"textDocument": {"uri": uri}}));
    let names: Vec<(String, u64)> = syms.as_array().unwrap().iter().map(|s| (s["name"].as_str().unwrap().to_string(), s["kind"].as_u64().unwrap())).collect();
    for want in ["topic", "re", "move", "ask", "n", "user", "answer", "pick"] {
        assert!(names.iter().any(|(n, _)| n == want), "{want} missing from {names:?}");
    }
    assert!(names.contains(&("ask".to_string(), 12)), "def is a function symbol");
    assert!(!names.iter().any(|(n, _)| n == "q" || n == "root"), "params and rules stay out of the outline");
}

/// The real binary over stdio, with Content-Length framing.
#[test]
fn the_binary_speaks_json_rpc_over_stdio() {
    let mut p = Proc::start();
    p.send(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"capabilities": {}}}));
    assert_eq!(p.recv()["id"], 1);
    p.send(json!({"jsonrpc": "2.0", "method": "initialized", "params": {}}));
    let uri = "file:///tmp/lmt-lsp-bin/a.lmt";
    p.send(json!({"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": {"uri": uri, "languageId": "lmt", "version": 1, "text": TWO_ERRORS}}}));
    let n = p.recv();
    assert_eq!(n["method"], "textDocument/publishDiagnostics");
    let diags = n["params"]["diagnostics"].as_array().unwrap();
    assert_eq!(diags.len(), 2);
    assert_eq!(range(&diags[0]), (1, 9, 1, 18));
    assert_eq!(range(&diags[1]), (2, 3, 2, 7));
    p.send(json!({"jsonrpc": "2.0", "method": "textDocument/didChange", "params": {"textDocument": {"uri": uri, "version": 2}, "contentChanges": [{"text": "Hello.\n{% gen a max_tokens=5 %}\n{{ nope }}\n"}]}}));
    let n = p.recv();
    assert_eq!(n["params"]["diagnostics"].as_array().unwrap().len(), 1);
    p.finish(2);
}

/// `lmt lsp` as a child process, spoken to in frames.
struct Proc {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    out: BufReader<std::process::ChildStdout>,
}

impl Proc {
    fn start() -> Proc {
        let mut child = Command::new(env!("CARGO_BIN_EXE_lmt"))
            .arg("lsp")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        Proc { child, stdin, out }
    }

    fn send_raw(&mut self, bytes: &[u8]) {
        self.stdin.write_all(bytes).unwrap();
        self.stdin.flush().unwrap();
    }

    fn send(&mut self, v: Value) {
        let body = v.to_string();
        self.send_raw(format!("Content-Length: {}\r\n\r\n{body}", body.len()).as_bytes());
    }

    fn recv(&mut self) -> Value {
        let mut len = 0;
        loop {
            let mut line = String::new();
            assert!(self.out.read_line(&mut line).unwrap() > 0, "the server ended");
            if line == "\r\n" {
                break;
            }
            if let Some(n) = line.strip_prefix("Content-Length: ") {
                len = n.trim().parse().unwrap();
            }
        }
        let mut buf = vec![0; len];
        self.out.read_exact(&mut buf).unwrap();
        serde_json::from_slice(&buf).unwrap()
    }

    /// Shuts the server down with request `id` and checks it exits cleanly.
    fn finish(mut self, id: i32) -> String {
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": "shutdown"}));
        assert_eq!(self.recv()["id"], id);
        self.send(json!({"jsonrpc": "2.0", "method": "exit"}));
        drop(self.stdin);
        let status = self.child.wait().unwrap();
        let mut err = String::new();
        self.child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        assert!(status.success(), "exit status {status}: {err}");
        assert!(!err.contains("panicked"), "{err}");
        err
    }
}

#[test]
fn malformed_input_gets_errors_and_the_server_stays_up() {
    let mut p = Proc::start();
    p.send(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"capabilities": {}}}));
    assert_eq!(p.recv()["id"], 1);
    p.send(json!({"jsonrpc": "2.0", "method": "initialized", "params": {}}));
    // Not JSON, not UTF-8, not a message, a bad length: each answered.
    for (raw, code) in [
        (b"Content-Length: 9\r\n\r\n{not json".to_vec(), -32700),
        (b"Content-Length: 2\r\n\r\n\xff\xfe".to_vec(), -32700),
        (b"Content-Length: 6\r\n\r\n[1, 2]".to_vec(), -32600),
        (b"Content-Length: -5\r\n\r\n".to_vec(), -32700),
    ] {
        p.send_raw(&raw);
        let e = p.recv();
        assert_eq!(e["error"]["code"], code, "{e}");
        assert!(e["id"].is_null());
    }
    // A bad URI and bad params: logged, and the session goes on.
    p.send(json!({"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": {"uri": "not a uri", "languageId": "lmt", "version": 1, "text": "x"}}}));
    p.send(json!({"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": 17}));
    // Hover right after an emoji; completion after U+2028 and U+0085 in a tag.
    let uri = "file:///tmp/lmt-lsp-hostile/a.lmt";
    let text = "Smile 😀 please {{ name }}\n{% gen x\u{2028}\u{85}| %}";
    p.send(json!({"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": {"uri": uri, "languageId": "lmt", "version": 1, "text": text}}}));
    assert_eq!(p.recv()["method"], "textDocument/publishDiagnostics");
    let mut id = 2;
    for (method, line, character) in
        [("textDocument/hover", 0, 8), ("textDocument/definition", 0, 8), ("textDocument/hover", 0, 7), ("textDocument/completion", 1, 8), ("textDocument/completion", 1, 9), ("textDocument/completion", 1, 10)]
    {
        p.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": {"textDocument": {"uri": uri}, "position": {"line": line, "character": character}}}));
        let r = p.recv();
        assert_eq!(r["id"], id, "{method} {line}:{character}: {r}");
        assert!(r.get("error").is_none() || r["error"].is_null(), "{r}");
        id += 1;
    }
    let err = p.finish(id);
    assert!(err.contains("ignored `textDocument/didOpen`"), "{err}");
}

#[test]
fn a_huge_content_length_is_refused_without_allocating_it() {
    for claim in ["18446744073709551615", "1000000000000"] {
        let mut p = Proc::start();
        p.send_raw(format!("Content-Length: {claim}\r\n\r\n{{}}").as_bytes());
        drop(std::mem::replace(&mut p.stdin, Command::new("true").stdin(Stdio::piped()).spawn().unwrap().stdin.take().unwrap()));
        let e = p.recv();
        assert_eq!(e["error"]["code"], -32700, "{e}");
        assert!(e["error"]["message"].as_str().unwrap().contains("the limit is 64 MiB"), "{e}");
        // The client left before `initialize`: a plain exit, no abort.
        let status = p.child.wait().unwrap();
        assert!(status.code().is_some_and(|c| c <= 1), "{status}");
    }
}
