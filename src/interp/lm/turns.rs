//! Chat turns: each turn opened and closed by rendering the conversation
//! through the model's chat template, which must only append.

use super::*;

/// The chat side of a run: the template, the finished turns, and what the
/// template has written so far (contents included).
pub(super) struct Conversation {
    pub(super) template: Option<ChatTemplate>,
    pub(super) transcript: String,
    pub(super) messages: Vec<Message>,
}

impl Conversation {
    /// The conversation so far with `more` messages after it; it must
    /// extend what the template wrote before.
    fn render_with(&self, more: &[Message]) -> LmResult<Rendered> {
        let t = self.template.as_ref().ok_or_else(|| {
            Failure::model(
                "this model has no chat template (none in its GGUF metadata, chat_template.jinja or tokenizer_config.json), \
                 so role blocks cannot be rendered: pass one with --chat-template FILE",
            )
        })?;
        let msgs: Vec<Message> = self.messages.iter().chain(more).cloned().collect();
        let r = t.render(&msgs, false).map_err(Failure::model)?;
        if !r.text.starts_with(&self.transcript) {
            return Err(Failure::new(
                RunErrorKind::Model,
                "the chat template renders earlier turns differently once a new turn is added; lmt needs a template that only appends",
            ));
        }
        Ok(r)
    }

    /// What the template writes after the last turn (Phi-3's EOS), now
    /// part of the transcript; `None` when nothing.
    fn close(&mut self) -> LmResult<Option<String>> {
        let Some(t) = &self.template else { return Ok(None) };
        if self.messages.is_empty() {
            return Ok(None);
        }
        let r = t.render(&self.messages, false).map_err(Failure::model)?;
        match r.text.strip_prefix(&self.transcript).filter(|t| !t.is_empty()) {
            Some(tail) => {
                let tail = tail.to_string();
                self.transcript = r.text;
                Ok(Some(tail))
            }
            None => Ok(None),
        }
    }
}

impl Lm<'_> {
    /// Opens a chat turn: queues the template's text up to the content.
    pub fn role_begin(&mut self, role: &str) -> LmResult<()> {
        let r = self.chat.render_with(&[message(role, "")])?;
        let at = r.content_spans.last().map(|s| s.0).ok_or_else(|| Failure::model("the chat template does not write the message's content"))?;
        self.pending.push(Piece::Marker(r.text[self.chat.transcript.len()..at].to_string()));
        self.chat.transcript = r.text[..at].to_string();
        self.turn_content_at = Some(self.pending.len());
        Ok(())
    }

    /// Closes a chat turn whose content was `content`: queues the
    /// template's text after it, up to where a next turn would begin (text
    /// a template writes only at the very end, such as Phi-3's EOS, is left
    /// for [`Lm::close_conversation`]).
    pub fn role_end(&mut self, role: &str, content: &str) -> LmResult<()> {
        let r = self.chat.render_with(&[message(role, content)])?;
        let end = r.content_spans.last().map(|s| s.1).ok_or_else(|| Failure::model("the chat template does not write the message's content"))?;
        let mut suffix = r.text[end..].to_string();
        // A template may transform content (Llama 3 trims it): while the
        // turn's text is still pending, it is fed as the template wrote it.
        let start = r.content_spans.last().map_or(end, |s| s.0);
        if let Some(i) = self.turn_content_at.take().filter(|&i| i <= self.pending.len()) {
            let written: Option<String> =
                self.pending[i..].iter().map(|p| if let Piece::Text(t, _) = p { Some(t.as_str()) } else { None }).collect();
            if written.as_deref() == Some(content) && r.text[start..end] != *content {
                let origin = match self.pending.get(i) {
                    Some(Piece::Text(_, o)) => *o,
                    _ => Origin::Template,
                };
                self.pending.truncate(i);
                self.push_text(&r.text[start..end], origin);
            }
        }
        let probe = if role == "user" { "assistant" } else { "user" };
        if let Some(next) =
            self.chat.render_with(&[message(role, content), message(probe, "x")]).ok().filter(|n| n.text.starts_with(&r.text[..end]))
        {
            let shared = suffix.chars().zip(next.text[end..].chars()).take_while(|(a, b)| a == b).map(|(a, _)| a.len_utf8()).sum();
            suffix.truncate(shared);
        }
        self.chat.transcript = format!("{}{suffix}", &r.text[..end]);
        self.pending.push(Piece::Marker(suffix));
        self.chat.messages.push(message(role, content));
        Ok(())
    }

    /// Queues what the chat template writes after the last turn of a
    /// conversation (Phi-3 ends it with EOS), so the sequence is the
    /// template's whole rendering.
    pub fn close_conversation(&mut self) -> LmResult<()> {
        if let Some(tail) = self.chat.close()? {
            self.pending.push(Piece::Marker(tail));
        }
        Ok(())
    }
}

fn message(role: &str, content: &str) -> Message {
    Message { role: role.to_string(), content: content.to_string() }
}
