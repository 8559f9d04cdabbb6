//! The engine's grammar IR: what [`Cfg`](super::Cfg) compiles. GBNF (the
//! front end's [`gbnf::Grammar`], with spans) lowers into it one to one;
//! the JSON Schema compiler writes it directly, with the two kinds GBNF has
//! no syntax for ([`Expr::Permutation`], [`Expr::Except`]).

use crate::syntax::gbnf::{self, GKind};

/// A grammar: its rules in the order written.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Grammar {
    /// The rules.
    pub rules: Vec<Rule>,
}

/// `name ::= body`.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// The rule's name.
    pub name: String,
    /// The right-hand side.
    pub body: Expr,
}

/// A grammar expression.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    /// `a | b`.
    Alt(Vec<Expr>),
    /// `a b` (empty: matches the empty string).
    Seq(Vec<Expr>),
    /// A literal string.
    Literal(String),
    /// `[a-z_]` or `[^"]`: inclusive character ranges.
    Class {
        /// True for `[^…]`.
        negated: bool,
        /// Inclusive ranges.
        ranges: Vec<(char, char)>,
    },
    /// A rule name.
    Ref(String),
    /// A regex, in the syntax of `regex-syntax`.
    Regex(String),
    /// Any one character.
    Any,
    /// `x*`, `x+`, `x?`, `x{m,n}`.
    Repeat {
        /// What is repeated.
        inner: Box<Expr>,
        /// Fewest repetitions.
        min: u32,
        /// Most repetitions; `None` for unbounded.
        max: Option<u32>,
    },
    /// Members in any order, each at most once (required ones exactly
    /// once), `sep` between two items, any number of `extra` items among
    /// them. The JSON Schema compiler makes it for objects, since listing
    /// the orders would take exponential space.
    Permutation {
        /// Each member, and whether it is required.
        members: Vec<(Expr, bool)>,
        /// What may also appear, any number of times.
        extra: Option<Box<Expr>>,
        /// What comes between two items; it must not match the empty string.
        sep: Box<Expr>,
        /// At least one item (a member or an extra) must appear.
        nonempty: bool,
        /// Members that bring others: when member `i` appears, so must these.
        requires: Vec<(usize, Vec<usize>)>,
    },
    /// The strings of `base` that are not strings of `except`; both
    /// regular. The JSON Schema compiler makes it for keys that are none of
    /// an object's names and patterns.
    Except {
        /// What is taken.
        base: Box<Expr>,
        /// What of it is left out.
        except: Box<Expr>,
    },
}

impl Expr {
    /// Calls `f` on each expression directly inside this one.
    pub fn for_each_child<'a>(&'a self, mut f: impl FnMut(&'a Expr)) {
        match self {
            Expr::Alt(v) | Expr::Seq(v) => v.iter().for_each(f),
            Expr::Repeat { inner, .. } => f(inner),
            Expr::Permutation { members, extra, sep, .. } => {
                members.iter().for_each(|(m, _)| f(m));
                extra.iter().for_each(|x| f(x));
                f(sep);
            }
            Expr::Except { base, except } => {
                f(base);
                f(except);
            }
            Expr::Literal(_) | Expr::Class { .. } | Expr::Ref(_) | Expr::Regex(_) | Expr::Any => {}
        }
    }
}

impl Grammar {
    /// The grammar of one regex, as rule `root`.
    pub fn regex(pattern: &str) -> Grammar {
        Grammar { rules: vec![Rule { name: "root".into(), body: Expr::Regex(pattern.into()) }] }
    }
}

impl From<&gbnf::Grammar> for Grammar {
    fn from(g: &gbnf::Grammar) -> Grammar {
        Grammar { rules: g.rules.iter().map(|r| Rule { name: r.name.clone(), body: Expr::from(&r.body) }).collect() }
    }
}

impl From<&gbnf::GExpr> for Expr {
    fn from(e: &gbnf::GExpr) -> Expr {
        let all = |v: &[gbnf::GExpr]| v.iter().map(Expr::from).collect();
        match &e.kind {
            GKind::Alt(v) => Expr::Alt(all(v)),
            GKind::Seq(v) => Expr::Seq(all(v)),
            GKind::Literal(s) => Expr::Literal(s.clone()),
            GKind::Class { negated, ranges } => Expr::Class { negated: *negated, ranges: ranges.clone() },
            GKind::Ref(r) => Expr::Ref(r.clone()),
            GKind::Regex(r) => Expr::Regex(r.clone()),
            GKind::Any => Expr::Any,
            GKind::Repeat { inner, min, max } => Expr::Repeat { inner: Box::new(Expr::from(&**inner)), min: *min, max: *max },
        }
    }
}
