//! A token trie stored flat in preorder, so a mask is one forward pass that
//! skips whole subtrees the moment the automaton dies (a sparse mask costs
//! a few microseconds instead of a walk over every token).

use super::TokenMask;

/// The token trie, flat in preorder. A walk reads one packed word per node
/// (edge byte, depth, subtree size) and the node's first token, and sets
/// that token's bit without a branch: half the nodes of a BPE trie end a
/// token and half do not, and the branch on it was mispredicted so often
/// that it cost more than the automaton step (a full 128k walk went from
/// 2.0 to 0.8 ms).
#[derive(Debug, Clone, Default)]
pub struct TokenTrie {
    /// Per node: edge byte (bits 0–7), depth (8–23), subtree size, the node
    /// included (24–55), and [`MORE`] when the node holds several tokens.
    nodes: Vec<u64>,
    /// Per node: its first token, or `none` when it holds none.
    first: Vec<u32>,
    /// Start of each node's tokens in `tokens`; one extra entry at the end.
    tok_start: Vec<u32>,
    /// Token ids grouped by node (duplicates of one byte string share a node).
    tokens: Vec<u32>,
    /// One past the largest token id: the id `first` holds for "no token".
    none: u32,
    /// The longest token, in bytes.
    max_depth: usize,
}

/// Node flag: the node holds more than one token (duplicate byte strings).
const MORE: u64 = 1 << 63;

impl TokenTrie {
    /// Builds the trie of `(id, bytes)` pairs; empty byte strings are skipped.
    pub fn build<'a>(items: impl Iterator<Item = (u32, &'a [u8])>) -> TokenTrie {
        let mut items: Vec<(u32, &[u8])> = items.filter(|(_, b)| !b.is_empty()).collect();
        // Sorted by bytes, a preorder walk is a single pass over the list.
        items.sort_by(|a, b| a.1.cmp(b.1).then(a.0.cmp(&b.0)));
        let none = items.iter().map(|&(id, _)| id + 1).max().unwrap_or(0);
        let mut t = TokenTrie { none, ..TokenTrie::default() };
        t.push(0, 0);
        let mut subtree: Vec<u32> = vec![1];
        let mut path: Vec<usize> = vec![0];
        let mut path_bytes: Vec<u8> = Vec::new();
        for (id, bytes) in items {
            let common = path_bytes.iter().zip(bytes).take_while(|(a, b)| a == b).count();
            while path_bytes.len() > common {
                let done = path.pop().expect("non-root");
                subtree[done] = (t.nodes.len() - done) as u32;
                path_bytes.pop();
            }
            for &b in &bytes[common..] {
                t.push(b, path_bytes.len() as u16 + 1);
                subtree.push(1);
                path.push(t.nodes.len() - 1);
                path_bytes.push(b);
            }
            // Tokens of the last node: it is the newest, so its range is open-ended.
            let last = t.nodes.len() - 1;
            if t.first[last] == none {
                t.first[last] = id;
            } else {
                t.nodes[last] |= MORE;
            }
            t.tokens.push(id);
            t.max_depth = t.max_depth.max(bytes.len());
        }
        while let Some(done) = path.pop() {
            subtree[done] = (t.nodes.len() - done) as u32;
        }
        for (n, &size) in t.nodes.iter_mut().zip(&subtree) {
            *n |= (size as u64) << 24;
        }
        t.tok_start.push(t.tokens.len() as u32);
        t
    }

    fn push(&mut self, byte: u8, depth: u16) {
        self.nodes.push(byte as u64 | (depth as u64) << 8);
        self.first.push(self.none);
        self.tok_start.push(self.tokens.len() as u32);
    }

    /// Number of nodes, the root included.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// True for a trie with no tokens.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The byte on the edge from node `i`'s parent (0 for the root).
    pub fn byte(&self, i: usize) -> u8 {
        self.nodes[i] as u8
    }

    /// Depth of node `i`, the root at 0: the length of its byte string.
    pub fn depth(&self, i: usize) -> usize {
        (self.nodes[i] >> 8) as u16 as usize
    }

    /// Nodes in the subtree of `i`, `i` included: skipping it is `i += subtree`.
    pub fn subtree(&self, i: usize) -> usize {
        (self.nodes[i] >> 24) as u32 as usize
    }

    /// The longest token, in bytes.
    pub fn max_depth(&self) -> usize {
        self.max_depth
    }

    /// Every token id in the trie, grouped by node.
    pub fn token_ids(&self) -> &[u32] {
        &self.tokens
    }

    /// The tokens ending at node `i`.
    pub fn tokens_at(&self, i: usize) -> &[u32] {
        &self.tokens[self.tok_start[i] as usize..self.tok_start[i + 1] as usize]
    }

    /// The node reached by the bytes `prefix` from the root, if any.
    pub fn find(&self, prefix: &[u8]) -> Option<usize> {
        let mut node = 0usize;
        for &b in prefix {
            let end = node + self.subtree(node);
            let mut child = node + 1;
            loop {
                if child >= end {
                    return None;
                }
                if self.byte(child) == b {
                    break;
                }
                child += self.subtree(child);
            }
            node = child;
        }
        Some(node)
    }

    /// Every token at node `i` or below it: the tokens whose bytes start
    /// with the bytes of `i`.
    pub fn subtree_tokens(&self, i: usize) -> impl Iterator<Item = u32> + '_ {
        (i..i + self.subtree(i)).flat_map(|n| self.tokens_at(n).iter().copied())
    }

    /// True when longer tokens continue below node `i`.
    pub fn has_children(&self, i: usize) -> bool {
        self.subtree(i) > 1
    }

    /// Walks every node, feeding each edge byte to `step` with the parent's
    /// state. `step` returns the child's state, or `None` to skip the whole
    /// subtree; `visit` sees every token of every node reached.
    pub fn walk<S: Copy>(&self, root: S, step: impl FnMut(S, u8) -> Option<S>, mut visit: impl FnMut(u32, S)) {
        self.walk_nodes(0, root, step, |i, s| {
            for &t in self.tokens_at(i) {
                visit(t, s);
            }
        });
    }

    /// Like [`TokenTrie::walk`], over the descendants of node `start` only
    /// (`root` is the state at `start`); `on_node` sees each node reached.
    pub fn walk_nodes<S: Copy>(&self, start: usize, root: S, step: impl FnMut(S, u8) -> Option<S>, on_node: impl FnMut(usize, S)) {
        self.walk_nodes_in(&mut Vec::new(), start, root, step, on_node)
    }

    /// [`TokenTrie::walk_nodes`] with a caller's scratch stack, for callers
    /// that walk many small subtrees (no allocation per walk).
    #[inline(always)]
    pub fn walk_nodes_in<S: Copy>(
        &self,
        stack: &mut Vec<S>,
        start: usize,
        root: S,
        mut step: impl FnMut(S, u8) -> Option<S>,
        mut on_node: impl FnMut(usize, S),
    ) {
        let base = self.depth(start);
        let end = start + self.subtree(start);
        stack.clear();
        stack.resize(self.max_depth + 1 - base, root);
        let nodes = &self.nodes[..end];
        let mut i = start + 1;
        while i < end {
            let n = nodes[i];
            let d = (n >> 8) as u16 as usize - base;
            match step(stack[d - 1], n as u8) {
                None => i += (n >> 24) as u32 as usize,
                Some(s) => {
                    stack[d] = s;
                    on_node(i, s);
                    i += 1;
                }
            }
        }
    }

    /// [`TokenTrie::walk_nodes_in`] that also allows in `out` every token of
    /// every node reached, without a branch per node (see the type's note);
    /// `on_node` gets the node, its state and whether it has children.
    #[inline(always)]
    pub fn walk_tokens_in<S: Copy>(
        &self,
        stack: &mut Vec<S>,
        start: usize,
        root: S,
        step: impl FnMut(S, u8) -> Option<S>,
        out: &mut TokenMask,
        mut on_node: impl FnMut(usize, S, bool),
    ) {
        // Room for the bit of `none`, which marks "no token": set freely,
        // cleared at the end, like the bits of ids past the mask's length.
        let (words, none) = (out.words.len(), self.none as usize);
        out.words.resize(words.max(none / 64 + 1), 0);
        let was = out.words[none / 64];
        let (nodes, first, bits) = (&self.nodes[..], &self.first[..], &mut out.words[..]);
        self.walk_nodes_in(stack, start, root, step, |i, s| {
            let (n, t) = (nodes[i], first[i] as usize);
            bits[t / 64] |= 1 << (t % 64);
            if n & MORE != 0 {
                self.tokens_at(i).iter().for_each(|&t| bits[t as usize / 64] |= 1 << (t % 64));
            }
            on_node(i, s, n >> 24 & 0xffff_fffe != 0);
        });
        out.words[none / 64] = out.words[none / 64] & !(1 << (none % 64)) | was & 1 << (none % 64);
        out.words.truncate(words);
        out.trim();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preorder_with_subtree_sizes_and_duplicates() {
        let toks: Vec<(u32, &[u8])> = vec![(0, b"ab"), (1, b"a"), (2, b"b"), (3, b"abc"), (4, b"a"), (5, b"")];
        let t = TokenTrie::build(toks.into_iter());
        // root, a, ab, abc, b
        assert_eq!(t.len(), 5);
        assert_eq!(t.subtree(0), 5);
        assert_eq!(t.byte(1), b'a');
        assert_eq!((t.subtree(1), t.depth(3)), (3, 3));
        assert!(t.has_children(2) && !t.has_children(3));
        assert_eq!(t.tokens_at(1), &[1, 4]);
        assert_eq!(t.tokens_at(3), &[3]);
        assert_eq!(t.max_depth(), 3);
        // Walk that refuses `b` after `a`: reaches a(1,4), ab? no, b(2).
        let mut seen = Vec::new();
        t.walk(0u8, |d, b| if d == 1 && b == b'b' { None } else { Some(d + 1) }, |tok, _| seen.push(tok));
        assert_eq!(seen, vec![1, 4, 2]);
    }

    #[test]
    fn token_walk_sets_duplicates_and_nothing_else() {
        // Ids 0..6 with 6 the first id past them: the "no token" bit falls
        // inside a longer mask and must keep its previous value.
        let toks: Vec<(u32, &[u8])> = vec![(0, b"ab"), (1, b"a"), (2, b"b"), (3, b"abc"), (4, b"a"), (5, b"ac")];
        let t = TokenTrie::build(toks.into_iter());
        for six in [false, true] {
            let mut m = TokenMask::new(70);
            if six {
                m.set(6);
            }
            let mut nodes = Vec::new();
            // Refuses `c` after `ab`: a(1,4), ab(0), ac(5), b(2).
            t.walk_tokens_in(&mut Vec::new(), 0, 0u8, |d, b| (!(d == 2 && b == b'c')).then_some(d + 1), &mut m, |i, d, kids| nodes.push((i, d, kids)));
            let mut want = vec![0, 1, 2, 4, 5];
            if six {
                want.push(6);
            }
            assert_eq!(m.ones().collect::<Vec<_>>(), want);
            assert_eq!(nodes.iter().filter(|n| n.2).count(), 2, "{nodes:?}");
        }
        // A mask shorter than the ids drops those past its end.
        let mut m = TokenMask::new(3);
        t.walk_tokens_in(&mut Vec::new(), 0, (), |_, _| Some(()), &mut m, |_, _, _| {});
        assert_eq!(m.ones().collect::<Vec<_>>(), vec![0, 1, 2]);
        assert_eq!(m.count(), 3);
    }
}
