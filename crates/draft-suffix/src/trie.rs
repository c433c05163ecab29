//! A depth-bounded suffix trie over several token sequences, with
//! occurrence counts, and the greedy path proposal over it.
//!
//! Every suffix of every sequence is inserted, cut to its first
//! `max_depth` tokens, so the node reached by an n-gram (`n <= max_depth`)
//! counts the n-gram's occurrences. A node's children partition its
//! occurrences that are followed by another token within the depth bound:
//! `count(child) / count(node)` is the empirical probability of the child's
//! token after the node's n-gram. The trie is uncompressed (one node per
//! token of depth), which keeps insertion, removal and the walk simple;
//! its node count is bounded by `max_depth` times the tokens inserted.
//!
//! **Sibling order.** Each non-root node keeps its children in order of
//! decreasing count, and the walk takes the first: among equal counts the
//! order is ArcticInference 0.3.0's, so proposals equal its `SuffixTree`'s
//! token for token. A new child goes last; a child whose count is about to
//! reach (or pass) its predecessor's moves before the first sibling of the
//! predecessor's count; a child whose count is about to fall below its
//! successor's moves after the last sibling of its old count. The root's order is
//! never consulted (a proposal always continues a match of at least one
//! token), so the root keeps its children sorted by token instead.

/// Index of a node in the trie's arena.
type NodeId = u32;

const ROOT: NodeId = 0;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Node {
    /// Occurrences of the path's n-gram (the root: tokens inserted).
    count: u32,
    /// `(token, child)`: at the root sorted by token (it may have a whole
    /// vocabulary of children), elsewhere in sibling order (a handful).
    children: Vec<(u32, NodeId)>,
}

/// The trie: an arena of nodes with a free list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SuffixTrie {
    max_depth: usize,
    nodes: Vec<Node>,
    free: Vec<NodeId>,
}

/// A sequence being appended to a trie one token at a time: the nodes its
/// still-growing suffixes end at (shallower than `max_depth`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cursor {
    active: Vec<NodeId>,
}

/// A proposal: the greedy path after the best match.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PathDraft {
    /// Proposed tokens.
    pub tokens: Vec<u32>,
    /// Each token's estimated probability (the product of the frequency
    /// ratios along the path up to it).
    pub probs: Vec<f32>,
    /// The sum of `probs`: the expected number of accepted tokens.
    pub score: f32,
    /// Length of the context suffix the proposal continues.
    pub match_len: usize,
}

/// How a proposal is sized and cut.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpecLimits {
    /// Most tokens to propose.
    pub max_tokens: usize,
    /// Tokens allowed per matched token.
    pub max_spec_factor: f32,
    /// Tokens allowed on top of `max_spec_factor * match_len`.
    pub max_spec_offset: f32,
    /// A token whose path probability falls below this ends the proposal.
    pub min_token_prob: f32,
}

impl SuffixTrie {
    /// An empty trie whose suffixes are cut to `max_depth` (at least 1).
    pub fn new(max_depth: usize) -> Self {
        Self {
            max_depth: max_depth.max(1),
            nodes: vec![Node::default()],
            free: Vec::new(),
        }
    }

    /// Tokens inserted (and not removed).
    pub fn tokens(&self) -> usize {
        self.nodes[ROOT as usize].count as usize
    }

    /// Live nodes, the root included.
    pub fn nodes(&self) -> usize {
        self.nodes.len() - self.free.len()
    }

    fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id as usize]
    }

    fn count(&self, id: NodeId) -> u32 {
        self.nodes[id as usize].count
    }

    /// Where `token`'s child is in `parent`'s list: `Ok(index)`, or
    /// `Err(index)` where a new one goes.
    fn locate(&self, parent: NodeId, token: u32) -> Result<usize, usize> {
        let children = &self.nodes[parent as usize].children;
        if parent == ROOT {
            children.binary_search_by_key(&token, |&(t, _)| t)
        } else {
            children
                .iter()
                .position(|&(t, _)| t == token)
                .ok_or(children.len())
        }
    }

    fn child(&self, parent: NodeId, token: u32) -> Option<NodeId> {
        self.locate(parent, token)
            .ok()
            .map(|i| self.nodes[parent as usize].children[i].1)
    }

    /// Counts one more occurrence of `parent`'s child for `token`: a new
    /// child goes last with count 1; an existing one moves before the
    /// first sibling of its predecessor's count when it reaches or passes
    /// that count.
    fn increment(&mut self, parent: NodeId, token: u32) -> NodeId {
        let (i, child) = match self.locate(parent, token) {
            Ok(i) => (i, self.nodes[parent as usize].children[i].1),
            Err(i) => {
                let id = match self.free.pop() {
                    Some(id) => id,
                    None => {
                        self.nodes.push(Node::default());
                        (self.nodes.len() - 1) as NodeId
                    }
                };
                self.nodes[id as usize] = Node {
                    count: 1,
                    ..Node::default()
                };
                self.nodes[parent as usize].children.insert(i, (token, id));
                return id;
            }
        };
        if parent != ROOT {
            let mut order = std::mem::take(&mut self.nodes[parent as usize].children);
            let c = self.count(child);
            if i > 0 && self.count(order[i - 1].1) <= c + 1 {
                let run = self.count(order[i - 1].1);
                let mut j = i - 1;
                while j > 0 && self.count(order[j - 1].1) == run {
                    j -= 1;
                }
                let moved = order.remove(i);
                order.insert(j, moved);
            }
            self.nodes[parent as usize].children = order;
        }
        self.nodes[child as usize].count += 1;
        child
    }

    /// Counts one occurrence less of `child` under `parent`: it moves after
    /// the last sibling of its old count when one follows it, and is
    /// unlinked and freed (with its subtree) at 0. Returns whether it is
    /// still there.
    fn decrement(&mut self, parent: NodeId, token: u32, child: NodeId) -> bool {
        let c = self.count(child);
        let Ok(i) = self.locate(parent, token) else {
            return false;
        };
        if c <= 1 {
            self.nodes[parent as usize].children.remove(i);
            self.free_subtree(child);
            return false;
        }
        if parent != ROOT {
            let mut order = std::mem::take(&mut self.nodes[parent as usize].children);
            if i + 1 < order.len() && self.count(order[i + 1].1) == c {
                let mut k = i + 1;
                while k + 1 < order.len() && self.count(order[k + 1].1) == c {
                    k += 1;
                }
                let moved = order.remove(i);
                order.insert(k, moved);
            }
            self.nodes[parent as usize].children = order;
        }
        self.nodes[child as usize].count -= 1;
        true
    }

    /// Appends `token` to the sequence `cursor` follows: every suffix of it
    /// shallower than `max_depth` grows by the token, and a new suffix
    /// starts with it.
    pub fn append(&mut self, cursor: &mut Cursor, token: u32) {
        cursor.active.push(ROOT);
        let max_depth = self.max_depth;
        let mut kept = Vec::with_capacity(cursor.active.len());
        // `active[i]` is at depth `active.len() - 1 - i` (oldest deepest).
        let depth_of_first = cursor.active.len() - 1;
        for (i, &node) in cursor.active.iter().enumerate() {
            let child = self.increment(node, token);
            if depth_of_first - i + 1 < max_depth {
                kept.push(child);
            }
        }
        self.nodes[ROOT as usize].count += 1;
        cursor.active = kept;
    }

    /// Inserts a whole sequence.
    pub fn insert(&mut self, tokens: &[u32]) {
        let mut cursor = Cursor::default();
        for &t in tokens {
            self.append(&mut cursor, t);
        }
    }

    /// Removes a sequence inserted before (with `insert` or token by token
    /// through one cursor): every count it added is taken back and nodes
    /// left with no occurrence are freed.
    pub fn remove(&mut self, tokens: &[u32]) {
        for start in 0..tokens.len() {
            let root = &mut self.nodes[ROOT as usize];
            root.count = root.count.saturating_sub(1);
            let mut node = ROOT;
            for &token in tokens[start..].iter().take(self.max_depth) {
                let Some(child) = self.child(node, token) else {
                    break;
                };
                if !self.decrement(node, token, child) {
                    break;
                }
                node = child;
            }
        }
    }

    fn free_subtree(&mut self, id: NodeId) {
        let mut stack = vec![id];
        while let Some(n) = stack.pop() {
            let node = std::mem::take(&mut self.nodes[n as usize]);
            stack.extend(node.children.into_iter().map(|(_, c)| c));
            self.free.push(n);
        }
    }

    /// The node `pattern` leads to from the root, if every token matches.
    fn find(&self, pattern: &[u32]) -> Option<NodeId> {
        pattern
            .iter()
            .try_fold(ROOT, |node, &t| self.child(node, t))
    }

    /// The greedy path below `node`: the first child in sibling order (the
    /// most frequent) at each step, while the path probability stays at or
    /// above `min_token_prob`, at most `max_tokens` tokens.
    fn path(&self, mut node: NodeId, max_tokens: usize, min_token_prob: f32) -> PathDraft {
        let mut draft = PathDraft::default();
        let mut prob = 1.0f32;
        while draft.tokens.len() < max_tokens {
            let parent = self.node(node);
            let Some(&(token, child)) = parent.children.first() else {
                break;
            };
            prob *= self.count(child) as f32 / parent.count as f32;
            if prob < min_token_prob {
                break;
            }
            draft.tokens.push(token);
            draft.probs.push(prob);
            draft.score += prob;
            node = child;
        }
        draft
    }

    /// The best proposal continuing `context`: for every match length `m`
    /// from 1 while the last `m` tokens of `context` (short of the whole
    /// context) are in the trie, the greedy path of at most
    /// `min(max_tokens, floor(m * factor + offset))` tokens; the highest
    /// score wins, the longer match among equal scores.
    pub fn speculate(&self, context: &[u32], limits: SpecLimits) -> PathDraft {
        let mut best = PathDraft::default();
        for match_len in 1..context.len() {
            let Some(node) = self.find(&context[context.len() - match_len..]) else {
                break;
            };
            let allowed = (match_len as f32 * limits.max_spec_factor
                + limits.max_spec_offset
                + 1e-6)
                .max(0.0) as usize;
            let draft = self.path(node, limits.max_tokens.min(allowed), limits.min_token_prob);
            if draft.score >= best.score {
                best = PathDraft { match_len, ..draft };
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// Words to ids, in order of first appearance (`⏎` is a newline token).
    pub(crate) fn tokenize(vocab: &mut BTreeMap<String, u32>, text: &str) -> Vec<u32> {
        text.split_whitespace()
            .map(|word| {
                let next = vocab.len() as u32;
                *vocab.entry(word.to_owned()).or_insert(next)
            })
            .collect()
    }

    fn limits(max_tokens: usize, min_token_prob: f32) -> SpecLimits {
        SpecLimits {
            max_tokens,
            max_spec_factor: 100.0,
            max_spec_offset: 0.0,
            min_token_prob,
        }
    }

    /// Every n-gram in the trie with its count, independent of the arena.
    fn canonical(trie: &SuffixTrie) -> BTreeMap<Vec<u32>, u32> {
        let mut out = BTreeMap::new();
        let mut stack = vec![(ROOT, Vec::new())];
        while let Some((id, path)) = stack.pop() {
            let node = trie.node(id);
            out.insert(path.clone(), node.count);
            for &(t, c) in &node.children {
                let mut p = path.clone();
                p.push(t);
                stack.push((c, p));
            }
        }
        out
    }

    /// The specification by brute force: n-gram counts over the sequences'
    /// suffixes cut to `max_depth`, then the same greedy walk.
    /// Among equal counts the trie's sibling order decides (checked against
    /// the reference by `xtask/python/suffix_oracle.py` and by
    /// `siblings_keep_the_reference_order`): `rank` is a token's place in
    /// the order of the children of `gram`'s node.
    fn brute_speculate(
        trie: &SuffixTrie,
        seqs: &[Vec<u32>],
        max_depth: usize,
        context: &[u32],
        limits: SpecLimits,
    ) -> PathDraft {
        let count = |gram: &[u32]| -> u32 {
            if gram.len() > max_depth {
                return 0;
            }
            seqs.iter()
                .map(|s| (0..s.len()).filter(|&i| s[i..].starts_with(gram)).count() as u32)
                .sum()
        };
        let mut best = PathDraft::default();
        for m in 1..context.len() {
            let mut gram = context[context.len() - m..].to_vec();
            if count(&gram) == 0 {
                break;
            }
            let allowed = (m as f32 * limits.max_spec_factor + limits.max_spec_offset + 1e-6)
                .max(0.0) as usize;
            let mut draft = PathDraft::default();
            let mut prob = 1.0f32;
            while draft.tokens.len() < limits.max_tokens.min(allowed) {
                let here = count(&gram);
                let mut options: Vec<u32> = seqs.iter().flatten().copied().collect();
                options.sort_unstable();
                options.dedup();
                let next = options
                    .iter()
                    .map(|&t| {
                        let mut g = gram.clone();
                        g.push(t);
                        (count(&g), std::cmp::Reverse(rank(trie, &gram, t)), t)
                    })
                    .filter(|&(c, _, _)| c > 0)
                    .max();
                let Some((c, _, t)) = next else {
                    break;
                };
                prob *= c as f32 / here as f32;
                if prob < limits.min_token_prob {
                    break;
                }
                draft.tokens.push(t);
                draft.probs.push(prob);
                draft.score += prob;
                gram.push(t);
            }
            if draft.score >= best.score {
                best = PathDraft {
                    match_len: m,
                    ..draft
                };
            }
        }
        best
    }

    fn rank(trie: &SuffixTrie, gram: &[u32], token: u32) -> usize {
        trie.find(gram)
            .and_then(|n| trie.node(n).children.iter().position(|&(t, _)| t == token))
            .unwrap_or(usize::MAX)
    }

    #[test]
    fn counts_follow_the_occurrences_and_the_greedy_path_the_frequencies() {
        let mut vocab = BTreeMap::new();
        let text = "SELECT name FROM users WHERE id = 1 ; \
                    SELECT name FROM users WHERE id = 2 ; \
                    SELECT email FROM users WHERE id = 3 ; \
                    SELECT name FROM orders WHERE id = 4 ;";
        let seq = tokenize(&mut vocab, text);
        let context = tokenize(&mut vocab, "id = 9 ; SELECT");
        let mut trie = SuffixTrie::new(8);
        trie.insert(&seq);
        let grams = canonical(&trie);
        let id = |w: &str| vocab[w];
        assert_eq!(grams[&vec![]], seq.len() as u32);
        assert_eq!(grams[&vec![id("SELECT")]], 4);
        assert_eq!(grams[&vec![id("SELECT"), id("name")]], 3);
        assert_eq!(grams[&vec![id("FROM"), id("users"), id("WHERE")]], 3);

        // After `; SELECT`: `name` 3 of 4 (0.75), then `FROM` (0.75),
        // `users` 2 of 3 (0.5), `WHERE` (0.5), `id` (0.5), `=` (0.5), then
        // `1` or `2` at 1 of 2: 0.25 < 0.3 ends the path.
        let draft = trie.speculate(&context, limits(16, 0.3));
        let words: Vec<u32> = ["name", "FROM", "users", "WHERE", "id", "="]
            .iter()
            .map(|w| id(w))
            .collect();
        assert_eq!(draft.tokens, words);
        assert_eq!(draft.probs, [0.75, 0.75, 0.5, 0.5, 0.5, 0.5]);
        // The longer match `; SELECT` is rarer and less certain (`name` 2 of
        // 3, then `users` 1 of 2): its path scores lower, so the one-token
        // match wins.
        assert_eq!(draft.match_len, 1);
        // A lower cut-off continues with the first seen of the tied tokens.
        let longer = trie.speculate(&context, limits(16, 0.2));
        assert_eq!(longer.tokens[6], id("1"));
        assert_eq!(longer.probs[6], 0.25);
    }

    /// Ties go to the child that reached the count last; a child losing a
    /// count goes behind its old equals. Expected values worked out from
    /// ArcticInference 0.3.0's sibling lists (and equal to its proposals).
    #[test]
    fn siblings_keep_the_reference_order() {
        let next = |trie: &SuffixTrie| trie.speculate(&[9, 0], limits(1, 0.0)).tokens;
        let mut trie = SuffixTrie::new(4);
        // After 0: 2 (new), 1 (new), 1 reaches 2 first, then 2 does.
        trie.insert(&[0, 2, 0, 1, 0, 1, 0, 2]);
        assert_eq!(next(&trie), [2], "the last to reach the top count");
        trie.insert(&[0, 1]);
        assert_eq!(next(&trie), [1]);
        // Back to 2 each, but 1 stays ahead of its new equal.
        trie.remove(&[0, 1]);
        assert_eq!(next(&trie), [1]);
        let mut fresh = SuffixTrie::new(4);
        fresh.insert(&[0, 2, 0, 1, 0, 1, 0, 2]);
        assert_eq!(
            canonical(&trie),
            canonical(&fresh),
            "same counts, other order"
        );
    }

    #[test]
    fn the_match_length_caps_the_proposal() {
        let seq: Vec<u32> = (0..20).chain(0..20).collect();
        let mut trie = SuffixTrie::new(32);
        trie.insert(&seq);
        let capped = |factor: f32, offset: f32, max_tokens: usize| {
            let l = SpecLimits {
                max_tokens,
                max_spec_factor: factor,
                max_spec_offset: offset,
                min_token_prob: 0.1,
            };
            let draft = trie.speculate(&[7, 8, 9], l);
            (draft.tokens.len(), draft.match_len)
        };
        // The context `7 8 9` matches up to 2 tokens (never the whole).
        assert_eq!(capped(1.0, 0.0, 16), (2, 2));
        assert_eq!(capped(2.0, 0.0, 16), (4, 2));
        assert_eq!(capped(1.0, 3.0, 16), (5, 2));
        assert_eq!(capped(2.0, 0.0, 3), (3, 2));
        assert_eq!(capped(0.0, 0.0, 16), (0, 2));
        // The depth bounds the continuation: match plus proposal <= depth.
        let mut shallow = SuffixTrie::new(4);
        shallow.insert(&seq);
        // The 2-token match leaves room for 2 tokens, the 1-token match for
        // 3: the higher score wins, from the shorter match.
        let draft = shallow.speculate(&[7, 8, 9], limits(16, 0.0));
        assert_eq!((draft.tokens, draft.match_len), (vec![10, 11, 12], 1));
    }

    #[test]
    fn append_and_insert_build_the_same_trie_and_remove_undoes_them() {
        let a: Vec<u32> = vec![1, 2, 3, 1, 2, 4, 1, 2, 3];
        let b: Vec<u32> = vec![2, 3, 1, 2, 3, 5];
        let c: Vec<u32> = vec![5, 5, 5, 5, 1, 2];
        let mut only_ac = SuffixTrie::new(3);
        only_ac.insert(&a);
        only_ac.insert(&c);
        let mut all = SuffixTrie::new(3);
        all.insert(&a);
        let mut cursor = Cursor::default();
        for &t in &b {
            all.append(&mut cursor, t);
        }
        all.insert(&c);
        assert_eq!(all.tokens(), a.len() + b.len() + c.len());
        all.remove(&b);
        assert_eq!(canonical(&all), canonical(&only_ac));
        assert_eq!(all.nodes(), only_ac.nodes(), "removed nodes are freed");
        all.remove(&a);
        all.remove(&c);
        assert_eq!(canonical(&all), canonical(&SuffixTrie::new(3)));
        assert_eq!(all.nodes(), 1);
    }

    /// A small fixed-seed generator (splitmix64).
    pub(crate) struct Rng(pub(crate) u64);

    impl Rng {
        pub(crate) fn below(&mut self, n: usize) -> usize {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            ((z ^ (z >> 31)) % n as u64) as usize
        }
    }

    #[test]
    fn speculate_equals_the_brute_force_specification() {
        let mut proposals = 0;
        for seed in 0..40u64 {
            let mut rng = Rng(seed);
            let vocab = 2 + rng.below(4);
            let depth = 2 + rng.below(6);
            let seqs: Vec<Vec<u32>> = (0..1 + rng.below(3))
                .map(|_| {
                    (0..rng.below(30))
                        .map(|_| rng.below(vocab) as u32)
                        .collect()
                })
                .collect();
            let mut trie = SuffixTrie::new(depth);
            for s in &seqs {
                trie.insert(s);
            }
            for _ in 0..10 {
                let context: Vec<u32> = (0..rng.below(depth + 2))
                    .map(|_| rng.below(vocab) as u32)
                    .collect();
                let l = SpecLimits {
                    max_tokens: 1 + rng.below(8),
                    max_spec_factor: [0.5, 1.0, 2.0][rng.below(3)],
                    max_spec_offset: [0.0, 1.0, -1.0][rng.below(3)],
                    min_token_prob: [0.0, 0.1, 0.4][rng.below(3)],
                };
                let got = trie.speculate(&context, l);
                let want = brute_speculate(&trie, &seqs, depth, &context, l);
                assert_eq!(
                    got, want,
                    "seed {seed}, seqs {seqs:?}, context {context:?}, {l:?}"
                );
                proposals += usize::from(!got.tokens.is_empty());
            }
        }
        assert!(proposals >= 100, "only {proposals} non-empty proposals");
    }
}
