//! SentencePiece BPE as llama.cpp runs it on a GGUF vocabulary
//! (`tokenizer.ggml.model = "llama"`): pieces with scores, no merge list.
//! Adjacent symbols merge when their concatenation is a piece, the highest
//! score first and the leftmost among equal scores; what is left that is no
//! piece becomes `<0xNN>` byte tokens. Hugging Face's BPE cannot express the
//! leftmost-on-ties rule (its merges have distinct ranks), and converters
//! that lack real scores write one score for every piece, so the rule
//! decides most merges there: this is its own implementation.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

/// A SentencePiece vocabulary with scores.
#[derive(Debug, Clone)]
pub struct Spm {
    pieces: HashMap<String, (u32, f32)>,
    bytes: [Option<u32>; 256],
    unk: Option<u32>,
}

/// One symbol of the text being merged: a byte range and its neighbours.
#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A candidate merge of two neighbouring symbols.
struct Bigram {
    left: usize,
    right: usize,
    score: f32,
    len: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Bigram {}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Bigram {
    /// The higher score first; on equal scores the leftmost.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score.total_cmp(&other.score).then_with(|| other.left.cmp(&self.left))
    }
}

impl Spm {
    /// A vocabulary from its pieces (`▁` for space, `<0xNN>` for bytes) and
    /// their scores; `unk` stands for a byte with no byte piece.
    pub fn new(pieces: &[String], scores: &[f32], unk: Option<u32>) -> Spm {
        let mut map = HashMap::with_capacity(pieces.len());
        for (id, (p, &s)) in pieces.iter().zip(scores).enumerate() {
            // As llama.cpp's map: a later duplicate wins.
            map.insert(p.clone(), (id as u32, s));
        }
        let mut bytes = [None; 256];
        for (b, slot) in bytes.iter_mut().enumerate() {
            *slot = map.get(&format!("<0x{b:02X}>")).map(|&(id, _)| id);
            if slot.is_none() {
                // llama.cpp falls back to the byte itself as a piece.
                if let Some(c) = char::from_u32(b as u32).filter(|_| b < 0x80) {
                    *slot = map.get(c.to_string().as_str()).map(|&(id, _)| id);
                }
            }
        }
        Spm { pieces: map, bytes, unk }
    }

    /// The ids of `text`, which must already have its spaces written as
    /// `▁` (and the prefix space, where one is wanted).
    pub fn tokenize(&self, text: &str, out: &mut Vec<u32>) {
        if text.is_empty() {
            return;
        }
        let mut symbols: Vec<Symbol> = Vec::new();
        for (i, (start, c)) in text.char_indices().enumerate() {
            symbols.push(Symbol { start, len: c.len_utf8(), prev: i.checked_sub(1), next: None });
            if i > 0 {
                symbols[i - 1].next = Some(i);
            }
        }
        let mut queue = BinaryHeap::new();
        for right in 1..symbols.len() {
            self.push_bigram(text, &symbols, right - 1, right, &mut queue);
        }
        while let Some(b) = queue.pop() {
            let (l, r) = (symbols[b.left], symbols[b.right]);
            // Stale: one side has been merged into something else since.
            if l.len == 0 || r.len == 0 || l.len + r.len != b.len {
                continue;
            }
            symbols[b.left].len += r.len;
            symbols[b.right].len = 0;
            symbols[b.left].next = r.next;
            if let Some(n) = r.next {
                symbols[n].prev = Some(b.left);
            }
            if let Some(p) = l.prev {
                self.push_bigram(text, &symbols, p, b.left, &mut queue);
            }
            if let Some(n) = symbols[b.left].next {
                self.push_bigram(text, &symbols, b.left, n, &mut queue);
            }
        }
        let mut at = Some(0);
        while let Some(i) = at {
            let s = symbols[i];
            let piece = &text[s.start..s.start + s.len];
            match self.pieces.get(piece) {
                Some(&(id, _)) => out.push(id),
                None => out.extend(piece.bytes().filter_map(|b| self.bytes[b as usize].or(self.unk))),
            }
            at = s.next;
        }
    }

    fn push_bigram(&self, text: &str, symbols: &[Symbol], left: usize, right: usize, queue: &mut BinaryHeap<Bigram>) {
        let (l, r) = (symbols[left], symbols[right]);
        let joined = &text[l.start..r.start + r.len];
        if let Some(&(_, score)) = self.pieces.get(joined) {
            queue.push(Bigram { left, right, score, len: joined.len() });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Spm;

    fn spm(pieces: &[(&str, f32)]) -> Spm {
        let names: Vec<String> = pieces.iter().map(|p| p.0.to_string()).collect();
        let scores: Vec<f32> = pieces.iter().map(|p| p.1).collect();
        Spm::new(&names, &scores, Some(0))
    }

    #[test]
    fn merges_by_score_then_leftmost() {
        // "abc": "ab" and "bc" are both pieces; the higher score wins.
        let v = spm(&[("<unk>", 0.0), ("a", 0.0), ("b", 0.0), ("c", 0.0), ("ab", -2.0), ("bc", -1.0)]);
        let mut out = Vec::new();
        v.tokenize("abc", &mut out);
        assert_eq!(out, [1, 5]);
        // Equal scores: the leftmost pair merges first.
        let v = spm(&[("<unk>", 0.0), ("a", 0.0), ("b", 0.0), ("c", 0.0), ("ab", -1.0), ("bc", -1.0)]);
        out.clear();
        v.tokenize("abc", &mut out);
        assert_eq!(out, [4, 3]);
    }

    #[test]
    fn unknown_text_falls_back_to_bytes() {
        let v = spm(&[("<unk>", 0.0), ("<0xC3>", 0.0), ("<0xA9>", 0.0), ("▁", 0.0), ("x", 0.0)]);
        let mut out = Vec::new();
        v.tokenize("▁é", &mut out);
        assert_eq!(out, [3, 1, 2]);
        // A byte with no byte piece is the unknown token.
        out.clear();
        v.tokenize("y", &mut out);
        assert_eq!(out, [0]);
    }

    #[test]
    fn merges_chain_into_longer_pieces() {
        let v = spm(&[("<unk>", 0.0), ("▁", 0.0), ("h", 0.0), ("i", 0.0), ("hi", -1.0), ("▁hi", -0.5)]);
        let mut out = Vec::new();
        v.tokenize("▁hi▁hi", &mut out);
        assert_eq!(out, [5, 5]);
    }
}
