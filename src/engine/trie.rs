//! A token trie stored flat in preorder, so a mask is one forward pass that
//! skips whole subtrees the moment the automaton dies (a sparse mask costs
//! a few microseconds instead of a walk over every token).

/// One trie node: the byte on the edge into it, its depth, the size of its
/// subtree (itself included) and the tokens that end here.
#[derive(Debug, Clone, Copy)]
pub struct Node {
    /// The byte on the edge from the parent.
    pub byte: u8,
    /// Depth (the root is 0).
    pub depth: u16,
    /// Nodes in this subtree, this one included: skipping it means `i += subtree`.
    pub subtree: u32,
    /// Start of this node's tokens in [`TokenTrie::tokens`].
    pub tok_start: u32,
    /// End of this node's tokens.
    pub tok_end: u32,
}

/// The trie of token byte strings.
#[derive(Debug, Clone, Default)]
pub struct TokenTrie {
    /// Nodes in preorder; node 0 is the root.
    pub nodes: Vec<Node>,
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
        let mut trie = TokenTrie::default();
        trie.nodes.push(Node { byte: 0, depth: 0, subtree: 0, tok_start: 0, tok_end: 0 });
        // The path of open nodes: (node index, bytes so far).
        let mut path: Vec<usize> = vec![0];
        let mut path_bytes: Vec<u8> = Vec::new();
        for (id, bytes) in items {
            let common = path_bytes.iter().zip(bytes).take_while(|(a, b)| a == b).count();
            while path_bytes.len() > common {
                let done = path.pop().expect("non-root");
                let size = trie.nodes.len() - done;
                trie.nodes[done].subtree = size as u32;
                path_bytes.pop();
            }
            for &b in &bytes[common..] {
                let depth = path_bytes.len() as u16 + 1;
                let at = trie.tokens.len() as u32;
                trie.nodes.push(Node { byte: b, depth, subtree: 0, tok_start: at, tok_end: at });
                path.push(trie.nodes.len() - 1);
                path_bytes.push(b);
            }
            let last = *path.last().expect("node");
            trie.tokens.push(id);
            trie.nodes[last].tok_end = trie.tokens.len() as u32;
            trie.max_depth = trie.max_depth.max(bytes.len());
        }
        while let Some(done) = path.pop() {
            trie.nodes[done].subtree = (trie.nodes.len() - done) as u32;
        }
        trie
    }

    /// The tokens ending at node `i`.
    pub fn tokens_at(&self, i: usize) -> &[u32] {
        let n = &self.nodes[i];
        &self.tokens[n.tok_start as usize..n.tok_end as usize]
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
    pub fn walk_nodes<S: Copy>(&self, start: usize, root: S, mut step: impl FnMut(S, u8) -> Option<S>, mut on_node: impl FnMut(usize, S)) {
        let base = self.nodes[start].depth as usize;
        let end = start + self.nodes[start].subtree as usize;
        let mut stack: Vec<S> = vec![root; self.max_depth + 1 - base];
        let mut i = start + 1;
        while i < end {
            let n = self.nodes[i];
            let d = n.depth as usize - base;
            match step(stack[d - 1], n.byte) {
                None => i += n.subtree as usize,
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
        assert_eq!(t.nodes.len(), 5);
        assert_eq!(t.nodes[0].subtree, 5);
        assert_eq!(t.nodes[1].byte, b'a');
        assert_eq!(t.nodes[1].subtree, 3);
        assert_eq!(t.tokens_at(1), &[1, 4]);
        assert_eq!(t.tokens_at(3), &[3]);
        assert_eq!(t.max_depth, 3);
        // Walk that refuses `b` after `a`: reaches a(1,4), ab? no, b(2).
        let mut seen = Vec::new();
        t.walk(0u8, |d, b| if d == 1 && b == b'b' { None } else { Some(d + 1) }, |tok, _| seen.push(tok));
        assert_eq!(seen, vec![1, 4, 2]);
    }
}
