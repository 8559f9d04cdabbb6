//! String literal escapes, and mapping offsets in a decoded string back to
//! the source (so a regex error points into the literal as written).

/// A malformed escape: its byte range inside the raw literal and why.
#[derive(Debug, Clone, PartialEq)]
pub struct EscapeError {
    /// Start of the escape in the raw literal (at the backslash).
    pub start: usize,
    /// End of the escape in the raw literal.
    pub end: usize,
    /// What is wrong.
    pub message: String,
}

/// Decodes a string literal as written (`"…"`, `'…'`, `r"…"`), quotes
/// included. Known escapes (`\n \t \r \0 \\ \" \' \xHH \u{…} \uHHHH`) are
/// resolved; unknown ones (`\d`, `\.`) are kept verbatim, as Python and
/// Jinja do, so regexes read naturally.
pub fn decode(raw: &str) -> Result<String, EscapeError> {
    let mut out = String::new();
    for piece in pieces(raw) {
        match piece.value {
            Ok(s) => out.push_str(&s),
            Err(message) => return Err(EscapeError { start: piece.start, end: piece.end, message }),
        }
    }
    Ok(out)
}

/// Byte offset in the raw literal (quotes included) of byte `value_offset`
/// of the decoded string. Offsets inside an escape map to its backslash; the
/// decoded length maps to the closing quote.
pub fn source_offset(raw: &str, value_offset: usize) -> usize {
    let mut value_pos = 0;
    for piece in pieces(raw) {
        let len = piece.value.as_ref().map(|s| s.len()).unwrap_or(0);
        if value_offset < value_pos + len {
            let inside = value_offset - value_pos;
            // A plain character maps one to one; an escape maps to its start.
            return if piece.end - piece.start == len { piece.start + inside } else { piece.start };
        }
        value_pos += len;
    }
    raw.len().saturating_sub(1)
}

struct Piece {
    start: usize,
    end: usize,
    value: Result<String, String>,
}

/// Splits the body of a literal into plain characters and escapes.
fn pieces(raw: &str) -> Vec<Piece> {
    let is_raw = raw.starts_with('r');
    let open = if is_raw { 2 } else { 1 };
    let close = if raw.len() > open && (raw.ends_with('"') || raw.ends_with('\'')) { raw.len() - 1 } else { raw.len() };
    let body = &raw[open.min(close)..close];
    let mut out = Vec::new();
    let mut chars = body.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        let start = open + i;
        if c != '\\' || is_raw {
            out.push(Piece { start, end: start + c.len_utf8(), value: Ok(c.to_string()) });
            continue;
        }
        let Some(&(_, e)) = chars.peek() else {
            out.push(Piece { start, end: start + 1, value: Ok("\\".into()) });
            continue;
        };
        chars.next();
        let simple = match e {
            'n' => Some('\n'),
            't' => Some('\t'),
            'r' => Some('\r'),
            '0' => Some('\0'),
            '\\' => Some('\\'),
            '"' => Some('"'),
            '\'' => Some('\''),
            _ => None,
        };
        if let Some(ch) = simple {
            out.push(Piece { start, end: start + 2, value: Ok(ch.to_string()) });
            continue;
        }
        match e {
            'x' | 'u' | 'U' => {
                let (digits, braced) = if e == 'u' && chars.peek().map(|p| p.1) == Some('{') {
                    chars.next();
                    let mut d = String::new();
                    let mut closed = false;
                    while let Some(&(_, h)) = chars.peek() {
                        chars.next();
                        if h == '}' {
                            closed = true;
                            break;
                        }
                        d.push(h);
                    }
                    if !closed {
                        let end = open + chars.peek().map(|p| p.0).unwrap_or(body.len());
                        out.push(Piece { start, end, value: Err("`\\u{` escape is not closed with `}`".into()) });
                        continue;
                    }
                    (d, true)
                } else {
                    let n = hex_digits(e).unwrap_or(8);
                    let d = take_hex(&mut chars, n);
                    if d.len() < n {
                        let end = open + chars.peek().map(|p| p.0).unwrap_or(body.len());
                        out.push(Piece { start, end, value: Err(format!("`\\{e}` needs {n} hex digits")) });
                        continue;
                    }
                    (d, false)
                };
                let end = open + chars.peek().map(|p| p.0).unwrap_or(body.len());
                let value = u32::from_str_radix(&digits, 16)
                    .ok()
                    .filter(|_| !digits.is_empty() && (!braced || digits.len() <= 6))
                    .and_then(char::from_u32)
                    .map(|c| c.to_string())
                    .ok_or_else(|| format!("`{digits}` is not a Unicode scalar value"));
                out.push(Piece { start, end, value });
            }
            other => {
                // Unknown escape: kept as written (backslash and character).
                let mut s = String::from('\\');
                s.push(other);
                out.push(Piece { start, end: start + 1 + other.len_utf8(), value: Ok(s) });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_known_and_keeps_unknown_escapes() {
        assert_eq!(decode(r#""a\nb""#).unwrap(), "a\nb");
        assert_eq!(decode(r#""\d+\.\d""#).unwrap(), r"\d+\.\d");
        assert_eq!(decode(r#"'it\'s'"#).unwrap(), "it's");
        assert_eq!(decode(r#""\u{1F600}\u00e9\x41""#).unwrap(), "😀éA");
        assert_eq!(decode(r#"r"\n""#).unwrap(), r"\n");
        assert!(decode(r#""\u{110000}""#).is_err());
        assert!(decode(r#""\x4""#).is_err());
        assert!(decode(r#""\u{12""#).is_err());
    }

    #[test]
    fn maps_value_offsets_back_to_source() {
        let raw = r#""a\nb(""#;
        // value: a, \n, b, ( at offsets 0..4
        assert_eq!(source_offset(raw, 0), 1);
        assert_eq!(source_offset(raw, 1), 2);
        assert_eq!(source_offset(raw, 2), 4);
        assert_eq!(source_offset(raw, 3), 5);
        assert_eq!(source_offset(raw, 4), 6);
    }
}

/// How many hex digits the escape `\x`, `\u` or `\U` takes (2, 4, 8).
pub fn hex_digits(escape: char) -> Option<usize> {
    match escape {
        'x' => Some(2),
        'u' => Some(4),
        'U' => Some(8),
        _ => None,
    }
}

/// Takes up to `n` hex digits from `chars`, stopping at the first other
/// character (left unread).
pub fn take_hex(chars: &mut std::iter::Peekable<std::str::CharIndices<'_>>, n: usize) -> String {
    let mut d = String::new();
    while d.len() < n {
        match chars.peek() {
            Some(&(_, h)) if h.is_ascii_hexdigit() => {
                d.push(h);
                chars.next();
            }
            _ => break,
        }
    }
    d
}
