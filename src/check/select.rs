//! `select` checks: one option, repeated options, greedy scoring on branches that generate.

use super::*;

impl<'a> Checker<'a> {
    pub(super) fn select_list(&mut self, list: &Expr, open: Span) {
        let file = self.file();
        let Some(c) = list.to_const() else { return };
        let Const::List(items) = c else {
            self.push(
                Diagnostic::new(Code::OptionType, file, list.span, format!("`select … in` takes a list of strings, not {}", crate::diagnostic::with_article(c.type_name())))
                    .with_help("write `{% select answer in [\"yes\", \"no\"] %}`"),
            );
            return;
        };
        if items.is_empty() {
            self.push(
                Diagnostic::new(Code::EmptyChoices, file, list.span, "this select has no options to choose from")
                    .with_help("list at least two options"),
            );
            return;
        }
        let ExprKind::List(exprs) = &list.kind else { return };
        let mut seen: Vec<(&str, Span)> = Vec::new();
        for (item, e) in items.iter().zip(exprs) {
            match item {
                Const::Str(s) => {
                    if let Some((_, first)) = seen.iter().find(|(t, _)| *t == s.as_str()) {
                        self.push(
                            Diagnostic::new(Code::DuplicateChoice, file, e.span, format!("option {s:?} is listed twice"))
                                .with_secondary(*first, "first listed here"),
                        );
                    }
                    if let Some(s) = e.as_str() {
                        seen.push((s, e.span));
                    }
                }
                other => self.push(
                    Diagnostic::new(Code::OptionType, file, e.span, format!("select options must be strings, not {}", crate::diagnostic::with_article(other.type_name())))
                        .with_help("quote the option, or convert it with `| string`"),
                ),
            }
        }
        if items.len() == 1 {
            self.push(
                Diagnostic::new(Code::SingleOption, file, open, "this select has one option, so it always picks it")
                    .with_help("add options, or write the text directly"),
            );
        }
    }

    pub(super) fn select_branches(&mut self, bs: &[Branch], open: Span, options: &[GenOption]) {
        let file = self.file();
        let greedy = options.iter().find(|o| o.name.name == "score" && matches!(o.value.to_const(), Some(Const::Str(s)) if s == "greedy"));
        if let Some(g) = greedy.filter(|_| !bs.iter().all(|b| b.body.iter().all(|n| matches!(n, Node::Text { .. })))) {
            self.push(
                Diagnostic::new(Code::GreedyBranches, file, g.value.span, "`score=\"greedy\"` needs branches that are plain text; this select is scored `\"full\"`")
                    .with_label("greedy decoding needs literal options")
                    .with_help("make every branch plain text, or write `score=\"full\"` or `score=\"mean\"`"),
            );
        }
        if bs.len() == 1 {
            self.push(
                Diagnostic::new(Code::SingleOption, file, open, "this select has one branch, so it always picks it")
                    .with_help("separate options with `{% or %}`"),
            );
        }
        let literal = |b: &Branch| match b.body.as_slice() {
            [Node::Text { value, .. }] => Some(value.clone()),
            _ => None,
        };
        let mut seen: Vec<(String, Span)> = Vec::new();
        for b in bs {
            if let Some(t) = literal(b) {
                if let Some((_, first)) = seen.iter().find(|(s, _)| *s == t) {
                    self.push(
                        Diagnostic::new(Code::DuplicateChoice, file, b.body[0].span(), format!("option {t:?} is listed twice"))
                            .with_secondary(*first, "first listed here"),
                    );
                } else {
                    seen.push((t, b.body[0].span()));
                }
            }
        }
    }
}
