//! Roles through the model's own chat template: Hugging Face's Jinja
//! templates rendered with minijinja (Python-compatible string and dict
//! methods, `raise_exception`, `strftime_now`), and the rendered prompt
//! turned into token ids so that message content can never become a role
//! marker.
//!
//! Content is also rendered as sentinels, so the renderer knows exactly
//! where each message's content sits in the prompt. Encoding then takes the
//! tokenizer's ordinary ids for the whole prompt (what the model saw in
//! training, including special tokens' whitespace stripping) unless one of
//! those ids is a special or added token coming from content; then the
//! prompt is encoded piece by piece: template text with its special tokens,
//! content with the safe encoder, which never emits one.

use crate::model::tokenizer::ModelTokenizer;

/// One chat message.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Message {
    /// `system`, `user`, `assistant`, or any role the template knows.
    pub role: String,
    /// The text.
    pub content: String,
}

/// A rendered conversation.
#[derive(Debug, Clone, PartialEq)]
pub struct Rendered {
    /// The prompt text.
    pub text: String,
    /// Byte ranges of message content in `text`.
    pub content_spans: Vec<(usize, usize)>,
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: minijinja::Environment<'static>,
    bos: String,
    eos: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").finish_non_exhaustive()
    }
}

/// Marks the start and end of a message's content while rendering:
/// private-use characters no template adds or transforms.
const OPEN: char = '\u{F8F0}';
const CLOSE: char = '\u{F8F1}';

impl ChatTemplate {
    /// Compiles `source` (a `chat_template` from `tokenizer_config.json`);
    /// `bos` and `eos` are the texts of those tokens, as templates use them.
    pub fn new(source: &str, bos: &str, eos: &str) -> Result<ChatTemplate, String> {
        let mut env = minijinja::Environment::new();
        // As transformers configures jinja2 for chat templates.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> Result<String, minijinja::Error> {
            Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, msg))
        });
        env.add_function("strftime_now", |fmt: String| -> String { strftime_now(&fmt) });
        env.add_template_owned("chat", source.to_string()).map_err(|e| format!("the chat template does not compile: {e}"))?;
        Ok(ChatTemplate { env, bos: bos.to_string(), eos: eos.to_string() })
    }

    /// Renders `messages`, ending with the assistant's header when
    /// `add_generation_prompt`.
    ///
    /// The template runs twice: with a sentinel for each content (which
    /// gives the template's own text around it) and with the real contents.
    /// Each content's rendered form is then read off between the known
    /// template pieces; templates may trim it (Llama 3 does), nothing else.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<Rendered, String> {
        if let Some(m) = messages.iter().find(|m| m.content.contains([OPEN, CLOSE])) {
            return Err(format!("a {} message contains a reserved character (U+F8F0/U+F8F1)", m.role));
        }
        let marked: Vec<Message> = messages
            .iter()
            .enumerate()
            .map(|(i, m)| Message { role: m.role.clone(), content: format!("{OPEN}{i}{CLOSE}") })
            .collect();
        let sentinel = self.render_raw(&marked, add_generation_prompt)?;
        let real = self.render_raw(messages, add_generation_prompt)?;
        // Template pieces and the message each sentinel stands for.
        let mut pieces = Vec::new();
        let mut order = Vec::new();
        let mut rest = sentinel.as_str();
        while let Some(at) = rest.find(OPEN) {
            pieces.push(&rest[..at]);
            let after = &rest[at + OPEN.len_utf8()..];
            let end = after.find(CLOSE).ok_or("the chat template cut a message's content")?;
            let i: usize = after[..end].parse().map_err(|_| "the chat template changed a message's content")?;
            order.push(i);
            rest = &after[end + CLOSE.len_utf8()..];
        }
        pieces.push(rest);
        let lost = || "the chat template transforms message content in a way lmt cannot follow".to_string();
        let mut at = 0;
        let mut content_spans = Vec::new();
        for (k, &i) in order.iter().enumerate() {
            let head = pieces[k];
            if !real[at..].starts_with(head) {
                return Err(lost());
            }
            at += head.len();
            let next = pieces[k + 1];
            let last = k + 1 == order.len();
            let c = messages[i].content.as_str();
            let fits = |x: &str| {
                let tail = &real[at..];
                tail.starts_with(x) && if last { tail[x.len()..] == *next } else { tail[x.len()..].starts_with(next) }
            };
            let x = [c, c.trim(), c.trim_start(), c.trim_end()].into_iter().find(|x| fits(x)).ok_or_else(lost)?;
            content_spans.push((at, at + x.len()));
            at += x.len();
        }
        if order.is_empty() && real != sentinel {
            return Err(lost());
        }
        Ok(Rendered { text: real, content_spans })
    }

    fn render_raw(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String, String> {
        let tmpl = self.env.get_template("chat").map_err(|e| e.to_string())?;
        tmpl.render(minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos,
            eos_token => self.eos,
        })
        .map_err(|e| format!("the chat template failed: {e}"))
    }
}

/// The token ids of a rendered conversation: the tokenizer's own ids when
/// no special or added token comes from content, else template pieces with
/// their special tokens and content encoded safely.
pub fn encode(tok: &ModelTokenizer, r: &Rendered) -> Result<Vec<u32>, String> {
    Ok(encode_in(tok, r, false)?.into_iter().map(|(id, _)| id).collect())
}

/// [`encode`] with where each token starts in `r.text`, for text that may
/// continue a stretch of text already in the sequence (`continues`): then
/// no SentencePiece prefix space is added at its start, as none would be
/// in the middle of a longer text.
pub fn encode_in(tok: &ModelTokenizer, r: &Rendered, continues: bool) -> Result<Vec<(u32, usize)>, String> {
    let whole = tok.encoder.encode_template(&r.text)?;
    let is_special = |id: u32| tok.vocab.is_special_or_added(id);
    let forged = whole.iter().enumerate().any(|(i, &(id, s))| {
        if !is_special(id) {
            return false;
        }
        // The match of a token that strips whitespace around it covers that
        // whitespace too: where its own text sits is what counts.
        let e = whole.get(i + 1).map_or(r.text.len(), |&(_, next)| next.max(s));
        let own = std::str::from_utf8(tok.vocab.bytes(id)).unwrap_or("");
        let start = r.text.get(s..e).and_then(|m| m.find(own)).map_or(s, |i| s + i);
        let end = start + own.len();
        r.content_spans.iter().any(|&(cs, ce)| start < ce && cs < end)
    });
    // The whole-string ids start a stretch: right unless this continues
    // one and the tokenizer would add its prefix space.
    let adds_prefix = || tok.encoder.encode("a").ok() != tok.encoder.encode_split("a").ok();
    if !(forged || continues && adds_prefix()) {
        return Ok(whole);
    }
    let mut ids: Vec<(u32, usize)> = Vec::new();
    let mut at = 0;
    for &(cs, ce) in &r.content_spans {
        ids.extend(template_ids(tok, &r.text[at..cs], at)?);
        let content = &r.text[cs..ce];
        // Content right after a special token starts a new stretch, which
        // SentencePiece tokenizers begin with their prefix space.
        let starts_stretch = match ids.last() {
            None => !continues,
            Some(&(id, _)) => is_special(id),
        };
        let part = if starts_stretch { tok.encoder.encode_split(content)? } else { tok.encoder.encode(content)? };
        // Offsets by the tokens' bytes (a prefix space has none in the text).
        let mut o = cs;
        for id in part {
            ids.push((id, o.min(ce)));
            o += tok.vocab.bytes(id).len();
        }
        at = ce;
    }
    ids.extend(template_ids(tok, &r.text[at..], at)?);
    Ok(ids)
}

/// Template text: special tokens parsed, nothing added around it; offsets from `base`.
fn template_ids(tok: &ModelTokenizer, text: &str, base: usize) -> Result<Vec<(u32, usize)>, String> {
    if text.is_empty() {
        return Ok(Vec::new());
    }
    Ok(tok.encoder.encode_template(text)?.into_iter().map(|(id, o)| (id, base + o)).collect())
}

/// The current UTC time formatted with the `strftime` codes templates use
/// (`%d %b %Y` and friends), for templates that print today's date.
fn strftime_now(fmt: &str) -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let days = (secs / 86_400) as i64;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    const MONTHS: [&str; 12] = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"];
    let name = MONTHS[(month - 1) as usize];
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year % 100)),
            Some('b') => out.push_str(&name[..3]),
            Some('B') => out.push_str(name),
            Some('H') => out.push_str(&format!("{:02}", secs / 3600 % 24)),
            Some('M') => out.push_str(&format!("{:02}", secs / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", secs % 60)),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}
