//! The template mutator the property tests and the fuzz run share: pieces
//! that make random text look like templates, and three edits (delete,
//! insert a piece, duplicate a stretch) applied on character boundaries.

/// Pieces of template syntax, names, options and awkward characters.
pub const PIECES: &[&str] = &[
    "{{", "}}", "{%", "%}", "{#", "#}", "-", " ", "\n", "\"", "'", "\\", "(", ")", "[", "]", "{", "}", ",", ":", "=", "|", ".",
    "gen", "select", "or", "end", "if", "elif", "else", "for", "in", "def", "set", "role", "user", "capture", "hidden", "raw",
    "endraw", "grammar", "import", "input", "::=", "x", "y", "1", "-2", "3.5", "max_tokens=", "regex=", "json=", "stop=",
    "grammar=", "not", "and", "is", "defined", "default", "é", "😀", "日本", "\u{0}", "\r\n", "/", "*", "?", "+",
];

/// One edit of a text.
#[derive(Debug, Clone)]
pub enum Mutation {
    /// Delete up to `n` bytes at a position.
    Delete(usize, usize),
    /// Insert a string at a position.
    Insert(usize, String),
    /// Duplicate up to `n` bytes at a position.
    Duplicate(usize, usize),
}

/// Applies `m` to `text` (positions taken modulo its length, moved back to
/// character boundaries).
pub fn apply(text: &mut String, m: &Mutation) {
    let at = |x: usize, t: &String| lmt::span::floor_char_boundary(t, if t.is_empty() { 0 } else { x % (t.len() + 1) });
    match m {
        Mutation::Delete(a, n) => {
            let s = at(*a, text);
            let e = lmt::span::floor_char_boundary(text, s + n);
            text.replace_range(s..e, "");
        }
        Mutation::Insert(a, piece) => {
            let s = at(*a, text);
            text.insert_str(s, piece);
        }
        Mutation::Duplicate(a, n) => {
            let s = at(*a, text);
            let e = lmt::span::floor_char_boundary(text, s + n);
            let copy = text[s..e].to_string();
            text.insert_str(e, &copy);
        }
    }
}

/// A small seeded generator (xorshift64*), so a failing case is named by its seed.
pub struct Rng(pub u64);

impl Rng {
    /// The next number.
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number below `n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// A random edit, like the property tests' strategy.
    pub fn mutation(&mut self) -> Mutation {
        let at = self.next() as usize;
        match self.below(3) {
            0 => Mutation::Delete(at, self.below(20)),
            1 if self.below(4) == 0 => Mutation::Insert(at, char::from_u32(self.below(0x11_0000) as u32).unwrap_or('?').to_string()),
            1 => Mutation::Insert(at, PIECES[self.below(PIECES.len())].to_string()),
            _ => Mutation::Duplicate(at, self.below(40)),
        }
    }
}
