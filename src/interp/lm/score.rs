//! Scoring options: every option's log-probability after the prefix in
//! one pass, and the probability that generation starts none of them.

use super::*;

impl Lm<'_> {
    /// Scores `options` (each followed by `follow`) after the current text:
    /// total log-probabilities, in one batched pass.
    pub fn score(&mut self, options: &[String], follow: &str) -> LmResult<Vec<(f64, usize)>> {
        self.decide()?;
        let remote = self.remote();
        let prefix = self.heal_text()?;
        let continues = self.seq.last().is_some_and(|t| !is_boundary(t, &self.tok().vocab));
        let mut ids = Vec::new();
        for o in options {
            let text = format!("{prefix}{o}{follow}");
            let r = Rendered { content_spans: vec![(0, text.len())], text };
            ids.push(crate::chat::encode_in(self.tok(), &r, continues).map_err(Failure::model)?.into_iter().map(|(id, _)| id).collect());
        }
        let lps = match remote {
            Some(r) => {
                let prefix: Vec<u32> = self.seq.iter().map(|t| t.id).collect();
                let lps = r.remote.score(&prefix, &ids).map_err(|e| Failure::model(format!("{}: {e}", r.remote.kind.name())))?;
                self.kv.stats.passes += 1;
                self.kv.stats.tokens += ids.iter().map(|i| i.len() as u64).sum::<u64>();
                lps
            }
            None => {
                // The logits after the prefix predict each option's first token.
                let first = self.feed()?;
                self.forward()?.score(&mut self.kv, &first, &ids)?
            }
        };
        self.usage.scored_tokens += ids.iter().map(|i| i.len() as u64).sum::<u64>();
        // Healing's token goes back as pending text, to be decided with the choice.
        if !prefix.is_empty() {
            self.pending.insert(0, Piece::Text(prefix, Origin::Template));
        }
        Ok(lps.iter().map(|l| (l.iter().map(|&x| f64::from(x)).sum(), l.len())).collect())
    }

    /// The log-probability of every token of the sequence after the first,
    /// template text included, scored in one pass on a fresh state (the
    /// run's `logprob_all`; the first token has nothing before it).
    pub fn score_sequence(&mut self) -> LmResult<f64> {
        self.decide()?;
        let ids: Vec<u32> = self.seq.iter().map(|t| t.id).collect();
        if ids.len() < 2 {
            return Ok(0.0);
        }
        if let Some(r) = self.remote() {
            let lps = r.remote.score(&ids[..1], &[ids[1..].to_vec()]).map_err(|e| Failure::model(format!("{}: {e}", r.remote.kind.name())))?;
            self.kv.stats.passes += 1;
            self.kv.stats.tokens += ids.len() as u64;
            self.usage.scored_tokens += ids.len() as u64;
            return Ok(lps.iter().flatten().map(|&x| f64::from(x)).sum());
        }
        let mut st = self.new_state()?;
        let first = self.forward()?.append(&mut st, &ids[..1])?;
        let lps = self.forward()?.score(&mut st, &first, &[ids[1..].to_vec()])?;
        // The pass is the run's work, all of it scoring.
        self.kv.stats.passes += st.stats.passes;
        self.kv.stats.tokens += st.stats.tokens;
        self.usage.scored_tokens += st.stats.tokens;
        Ok(lps.iter().flatten().map(|&x| f64::from(x)).sum())
    }

    /// The probability that the next token does not begin any of `literals`
    /// (how likely the model is to leave the literal options of a select).
    pub fn off_literals_logprob(&mut self, literals: &[String]) -> LmResult<f64> {
        self.decide()?;
        let logits = self.feed()?;
        let lp = log_softmax(&logits);
        let c = Constraint::choices(literals, &self.limits)?;
        let mut mask = TokenMask::new(self.free_mask.len());
        c.matcher(&self.limits).mask(&self.tok().vocab, &mut mask)?;
        let on: f64 = mask.ones().filter(|&t| (t as usize) < lp.len()).map(|t| f64::from(lp[t as usize]).exp()).sum();
        Ok((1.0 - on).max(1e-12).ln())
    }

    /// The chosen option's metadata from scores.
    pub fn choices(options: &[String], scores: &[f64]) -> Vec<Choice> {
        let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let total: f64 = scores.iter().map(|s| (s - max).exp()).sum();
        let mut out: Vec<Choice> = options
            .iter()
            .zip(scores)
            .map(|(o, &s)| Choice { text: o.clone(), logprob: s, probability: (s - max).exp() / total })
            .collect();
        out.sort_by(|a, b| b.logprob.total_cmp(&a.logprob));
        out
    }
}
