//! A token trie stored flat in preorder, so a mask is one forward pass that
//! skips whole subtrees the moment the automaton dies (a sparse mask costs
//! a few microseconds instead of a walk over every token).

/// The token trie, flat in preorder and split into parallel arrays: a walk
/// reads only the edge byte, depth and subtree size of each node (6 bytes),
/// and a node's tokens only when it is reached.
#[derive(Debug, Clone, Default)]
pub struct TokenTrie {
    /// The byte on the edge from each node's parent (node 0 is the root).
    pub bytes: Vec<u8>,
    /// Depth of each node, the root at 0 (see [`TokenTrie::max_depth`]).
    pub depth: Vec<u16>,
    /// Nodes in each subtree, the node included: skipping it is `i += subtree`.
    pub subtree: Vec<u32>,
    /// Start of each node's tokens in `tokens`; one extra entry at the end.
    pub tok_start: Vec<u32>,
    /// Token ids grouped by node (duplicates of one byte string share a node).
    pub tokens: Vec<u32>,
    /// The longest token, in bytes.
    pub max_depth: usize,
}

impl TokenTrie {
    /// Builds the trie of `(id, bytes)` pairs; empty byte strings are skipped.
    pub fn build<'a>(items: impl Iterator<Item = (u32, &'a [u8])>) -> TokenTrie {
        let mut items: Vec<(u32, &[u8])> = items.filter(|(_, b)| !b.is_empty()).collect();
        // Sorted by bytes, a preorder walk is a single pass over the list.
        items.sort_by(|a, b| a.1.cmp(b.1).then(a.0.cmp(&b.0)));
        let mut t = TokenTrie::default();
        t.push(0, 0);
        let mut path: Vec<usize> = vec![0];
        let mut path_bytes: Vec<u8> = Vec::new();
        for (id, bytes) in items {
            let common = path_bytes.iter().zip(bytes).take_while(|(a, b)| a == b).count();
            while path_bytes.len() > common {
                let done = path.pop().expect("non-root");
                t.subtree[done] = (t.bytes.len() - done) as u32;
                path_bytes.pop();
            }
            for &b in &bytes[common..] {
                t.push(b, path_bytes.len() as u16 + 1);
                path.push(t.bytes.len() - 1);
                path_bytes.push(b);
            }
            // Tokens of the last node: it is the newest, so its range is open-ended.
            t.tokens.push(id);
            t.max_depth = t.max_depth.max(bytes.len());
        }
        while let Some(done) = path.pop() {
            t.subtree[done] = (t.bytes.len() - done) as u32;
        }
        t.tok_start.push(t.tokens.len() as u32);
        t
    }

    fn push(&mut self, byte: u8, depth: u16) {
        self.bytes.push(byte);
        self.depth.push(depth);
        self.subtree.push(1);
        self.tok_start.push(self.tokens.len() as u32);
    }

    /// Number of nodes, the root included.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// True for a trie with no tokens.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The tokens ending at node `i`.
    pub fn tokens_at(&self, i: usize) -> &[u32] {
        &self.tokens[self.tok_start[i] as usize..self.tok_start[i + 1] as usize]
    }

    /// The node reached by the bytes `prefix` from the root, if any.
    pub fn find(&self, prefix: &[u8]) -> Option<usize> {
        let mut node = 0usize;
        for &b in prefix {
            let end = node + self.subtree[node] as usize;
            let mut child = node + 1;
            loop {
                if child >= end {
                    return None;
                }
                if self.bytes[child] == b {
                    break;
                }
                child += self.subtree[child] as usize;
            }
            node = child;
        }
        Some(node)
    }

    /// Every token at node `i` or below it: the tokens whose bytes start
    /// with the bytes of `i`.
    pub fn subtree_tokens(&self, i: usize) -> impl Iterator<Item = u32> + '_ {
        (i..i + self.subtree[i] as usize).flat_map(|n| self.tokens_at(n).iter().copied())
    }

    /// True when longer tokens continue below node `i`.
    pub fn has_children(&self, i: usize) -> bool {
        self.subtree[i] > 1
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
    pub fn walk_nodes_in<S: Copy>(
        &self,
        stack: &mut Vec<S>,
        start: usize,
        root: S,
        mut step: impl FnMut(S, u8) -> Option<S>,
        mut on_node: impl FnMut(usize, S),
    ) {
        let base = self.depth[start] as usize;
        let end = start + self.subtree[start] as usize;
        stack.clear();
        stack.resize(self.max_depth + 1 - base, root);
        let mut i = start + 1;
        while i < end {
            let d = self.depth[i] as usize - base;
            match step(stack[d - 1], self.bytes[i]) {
                None => i += self.subtree[i] as usize,
                Some(s) => {
                    stack[d] = s;
                    on_node(i, s);
                    i += 1;
                }
            }
        }
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
        assert_eq!(t.subtree[0], 5);
        assert_eq!(t.bytes[1], b'a');
        assert_eq!(t.subtree[1], 3);
        assert!(t.has_children(2) && !t.has_children(3));
        assert_eq!(t.tokens_at(1), &[1, 4]);
        assert_eq!(t.tokens_at(3), &[3]);
        assert_eq!(t.max_depth, 3);
        // Walk that refuses `b` after `a`: reaches a(1,4), ab? no, b(2).
        let mut seen = Vec::new();
        t.walk(0u8, |d, b| if d == 1 && b == b'b' { None } else { Some(d + 1) }, |tok, _| seen.push(tok));
        assert_eq!(seen, vec![1, 4, 2]);
    }
}
