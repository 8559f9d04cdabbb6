//! The abstract syntax tree of a template, with byte spans on every node.
//!
//! Built by [`crate::syntax::parse`]; read by the checker and the compiler.
//! Parts that failed to parse are kept as [`ExprKind::Error`] (already
//! reported), so later stages can skip them without reporting again.

use crate::span::Span;
use crate::syntax::gbnf;

/// A parsed template file.
#[derive(Debug, Clone, Default)]
pub struct Template {
    /// The top-level nodes, in order.
    pub body: Vec<Node>,
}

/// A name with the span where it is written.
#[derive(Debug, Clone, PartialEq)]
pub struct Ident {
    /// The name.
    pub name: String,
    /// Where it is written.
    pub span: Span,
}

/// Where a `gen`, `select`, `capture` or `set` stores its value: `name` or
/// `name[]` (append to a list).
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    /// The variable.
    pub name: Ident,
    /// True for `name[]`.
    pub append: bool,
}

/// One `name=value` option of `gen` or `select`.
#[derive(Debug, Clone)]
pub struct GenOption {
    /// The option's name.
    pub name: Ident,
    /// Its value.
    pub value: Expr,
}

/// A parameter of `def` or `input`, with an optional default.
#[derive(Debug, Clone)]
pub struct Param {
    /// The name.
    pub name: Ident,
    /// The default value, if any.
    pub default: Option<Expr>,
}

/// Which role a role block opens.
#[derive(Debug, Clone)]
pub enum RoleName {
    /// `{% system %}`.
    System,
    /// `{% user %}`.
    User,
    /// `{% assistant %}`.
    Assistant,
    /// `{% role EXPR %}`.
    Expr(Expr),
}

/// Longest role name.
pub const MAX_ROLE_NAME: usize = 32;

/// Whether `name` may name a chat role: a plain word (an ASCII letter, then
/// letters, digits, `_` or `-`; at most [`MAX_ROLE_NAME`]). Role names go
/// into the chat template's own text, so anything else could forge markup
/// such as `<|im_end|>` there.
pub fn is_role_name(name: &str) -> bool {
    let mut chars = name.chars();
    name.len() <= MAX_ROLE_NAME
        && chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// A node of the template body.
#[derive(Debug, Clone)]
pub enum Node {
    /// Literal prompt text, already trimmed by `-` markers.
    Text {
        /// The text.
        value: String,
        /// Where the kept text lies.
        span: Span,
    },
    /// `{{ expr }}`: insert a value as plain text.
    Emit {
        /// The value.
        expr: Expr,
        /// The whole tag.
        span: Span,
    },
    /// `{% gen … %}`.
    Gen(Gen),
    /// `{% select … %}` with branches, or `{% select … in EXPR %}`.
    Select(Select),
    /// A role block.
    Role(Block<RoleName>),
    /// `{% capture name %}…{% end %}`.
    Capture(Block<Target>),
    /// `{% hidden %}…{% end %}`.
    Hidden(Block<()>),
    /// `{% set target = value %}`.
    Set {
        /// Where the value goes.
        target: Target,
        /// The value.
        value: Expr,
        /// The whole tag.
        span: Span,
    },
    /// `{% if %}…{% elif %}…{% else %}…{% end %}`.
    If(If),
    /// `{% for a, b in xs %}…{% else %}…{% end %}`.
    For(For),
    /// `{% def name(params) %}…{% end %}`.
    Def(Def),
    /// `{% import "path" as alias %}`.
    Import(Import),
    /// `{% grammar name %}GBNF{% end %}`.
    Grammar(GrammarBlock),
    /// `{% input a, b=default %}`: variables the template expects from outside.
    Input {
        /// The declared inputs.
        params: Vec<Param>,
        /// The whole tag.
        span: Span,
    },
}

/// A block: its head (what the opening tag says), its body, and spans.
#[derive(Debug, Clone)]
pub struct Block<H> {
    /// What the opening tag says.
    pub head: H,
    /// The nodes inside.
    pub body: Vec<Node>,
    /// The opening tag.
    pub open: Span,
    /// From the opening tag to the end of the closing tag.
    pub span: Span,
}

/// `{% gen target options %}`.
#[derive(Debug, Clone)]
pub struct Gen {
    /// Where the generated value goes (optional).
    pub target: Option<Target>,
    /// The options, in the order written.
    pub options: Vec<GenOption>,
    /// The tag.
    pub span: Span,
}

/// The options a select chooses among.
#[derive(Debug, Clone)]
pub enum Choices {
    /// Branches separated by `{% or %}`, each a template.
    Branches(Vec<Branch>),
    /// `in EXPR`: a list of strings.
    List(Expr),
}

/// One `{% or %}`-separated branch of a select.
#[derive(Debug, Clone)]
pub struct Branch {
    /// The branch's template.
    pub body: Vec<Node>,
    /// From the tag before the branch to the tag after it.
    pub span: Span,
}

/// `{% select … %}`.
#[derive(Debug, Clone)]
pub struct Select {
    /// Where the chosen value goes (optional).
    pub target: Option<Target>,
    /// Options such as `score`.
    pub options: Vec<GenOption>,
    /// What is chosen among.
    pub choices: Choices,
    /// The opening tag.
    pub open: Span,
    /// The whole select, up to its `{% end %}` when it has branches.
    pub span: Span,
}

/// `{% if %}` with its `elif`s and `else`.
#[derive(Debug, Clone)]
pub struct If {
    /// `(condition, body)` for the `if` and each `elif`.
    pub branches: Vec<(Expr, Vec<Node>)>,
    /// The `else` body.
    pub else_body: Option<Vec<Node>>,
    /// The opening tag.
    pub open: Span,
    /// The whole block.
    pub span: Span,
}

/// `{% for vars in iter %}`.
#[derive(Debug, Clone)]
pub struct For {
    /// Loop variables (two or more unpack each item).
    pub vars: Vec<Ident>,
    /// What is iterated.
    pub iter: Expr,
    /// The loop body.
    pub body: Vec<Node>,
    /// Runs when `iter` is empty.
    pub else_body: Option<Vec<Node>>,
    /// The opening tag.
    pub open: Span,
    /// The whole block.
    pub span: Span,
}

/// `{% def name(params) %}`.
#[derive(Debug, Clone)]
pub struct Def {
    /// The function's name.
    pub name: Ident,
    /// Its parameters.
    pub params: Vec<Param>,
    /// Its body, run where it is called.
    pub body: Vec<Node>,
    /// The opening tag.
    pub open: Span,
    /// The whole block.
    pub span: Span,
}

/// `{% import "path" as alias %}`.
#[derive(Debug, Clone)]
pub struct Import {
    /// The path as written (`std/json`, `./lib.lmt`).
    pub path: String,
    /// Span of the path string literal.
    pub path_span: Span,
    /// The name the module is bound to.
    pub alias: Ident,
    /// The tag.
    pub span: Span,
}

/// `{% grammar name %}…{% end %}`.
#[derive(Debug, Clone)]
pub struct GrammarBlock {
    /// The grammar's name.
    pub name: Ident,
    /// The parsed GBNF (rules that failed to parse are left out).
    pub grammar: gbnf::Grammar,
    /// The GBNF source span.
    pub body: Span,
    /// The opening tag.
    pub open: Span,
    /// The whole block.
    pub span: Span,
}

/// An expression with its span.
#[derive(Debug, Clone)]
pub struct Expr {
    /// What it is.
    pub kind: ExprKind,
    /// Where it is written.
    pub span: Span,
}

/// One argument of a call or filter.
#[derive(Debug, Clone)]
pub struct Arg {
    /// The keyword, for `name=value`.
    pub name: Option<Ident>,
    /// The value.
    pub value: Expr,
}

/// Unary operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnaryOp {
    /// `not`
    Not,
    /// `-`
    Neg,
    /// `+`
    Pos,
}

/// Binary operators, loosest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinaryOp {
    /// `or` (short-circuit)
    Or,
    /// `and` (short-circuit)
    And,
    /// `==`
    Eq,
    /// `!=`
    Ne,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
    /// `in`
    In,
    /// `not in`
    NotIn,
    /// `~` (string concatenation)
    Concat,
    /// `+`
    Add,
    /// `-`
    Sub,
    /// `*`
    Mul,
    /// `/`
    Div,
    /// `//`
    FloorDiv,
    /// `%`
    Mod,
    /// `**`
    Pow,
}

impl BinaryOp {
    /// The operator as written.
    pub fn symbol(self) -> &'static str {
        use BinaryOp::*;
        match self {
            Or => "or",
            And => "and",
            Eq => "==",
            Ne => "!=",
            Lt => "<",
            Le => "<=",
            Gt => ">",
            Ge => ">=",
            In => "in",
            NotIn => "not in",
            Concat => "~",
            Add => "+",
            Sub => "-",
            Mul => "*",
            Div => "/",
            FloorDiv => "//",
            Mod => "%",
            Pow => "**",
        }
    }
}

/// The kinds of expression.
#[derive(Debug, Clone)]
pub enum ExprKind {
    /// A string literal (escapes resolved).
    Str(String),
    /// An integer literal.
    Int(i64),
    /// A float literal.
    Float(f64),
    /// `true` / `false`.
    Bool(bool),
    /// `none`.
    None,
    /// `[a, b]`.
    List(Vec<Expr>),
    /// `{k: v}`.
    Map(Vec<(Expr, Expr)>),
    /// A variable.
    Name(String),
    /// `value.name`.
    Attr(Box<Expr>, Ident),
    /// `value[index]`.
    Index(Box<Expr>, Box<Expr>),
    /// `value[start:stop:step]`.
    Slice {
        /// The sliced value.
        value: Box<Expr>,
        /// Start, if given.
        start: Option<Box<Expr>>,
        /// Stop, if given.
        stop: Option<Box<Expr>>,
        /// Step, if given.
        step: Option<Box<Expr>>,
    },
    /// `func(args)`.
    Call(Box<Expr>, Vec<Arg>),
    /// `value | name(args)`.
    Filter(Box<Expr>, Ident, Vec<Arg>),
    /// `value is [not] name(args)`.
    Test {
        /// The tested value.
        value: Box<Expr>,
        /// The test's name.
        name: Ident,
        /// The test's arguments.
        args: Vec<Arg>,
        /// True for `is not`.
        negated: bool,
    },
    /// A unary operation.
    Unary(UnaryOp, Box<Expr>),
    /// A binary operation.
    Binary(BinaryOp, Box<Expr>, Box<Expr>),
    /// `then if cond else otherwise`.
    Cond {
        /// The condition.
        cond: Box<Expr>,
        /// Value when true.
        then: Box<Expr>,
        /// Value when false.
        otherwise: Box<Expr>,
    },
    /// Did not parse; already reported.
    Error,
}

impl Expr {
    /// The string value, if this is a string literal.
    pub fn as_str(&self) -> Option<&str> {
        match &self.kind {
            ExprKind::Str(s) => Some(s),
            _ => None,
        }
    }
}

impl Node {
    /// The template bodies nested directly in this node (branches, arms,
    /// loop and block bodies), in source order.
    pub fn bodies(&self) -> Vec<&[Node]> {
        match self {
            Node::Select(s) => match &s.choices {
                Choices::Branches(bs) => bs.iter().map(|b| b.body.as_slice()).collect(),
                Choices::List(_) => Vec::new(),
            },
            Node::Role(b) => vec![&b.body],
            Node::Capture(b) => vec![&b.body],
            Node::Hidden(b) => vec![&b.body],
            Node::If(i) => i.branches.iter().map(|(_, b)| b.as_slice()).chain(i.else_body.as_deref()).collect(),
            Node::For(f) => std::iter::once(f.body.as_slice()).chain(f.else_body.as_deref()).collect(),
            Node::Def(d) => vec![&d.body],
            _ => Vec::new(),
        }
    }

    /// The span of the whole node.
    pub fn span(&self) -> Span {
        match self {
            Node::Text { span, .. } | Node::Emit { span, .. } | Node::Set { span, .. } | Node::Input { span, .. } => *span,
            Node::Gen(g) => g.span,
            Node::Select(s) => s.span,
            Node::Role(b) => b.span,
            Node::Capture(b) => b.span,
            Node::Hidden(b) => b.span,
            Node::If(i) => i.span,
            Node::For(f) => f.span,
            Node::Def(d) => d.span,
            Node::Import(i) => i.span,
            Node::Grammar(g) => g.span,
        }
    }
}

/// A constant value: what a literal expression folds to.
#[derive(Debug, Clone, PartialEq)]
pub enum Const {
    /// `none`.
    None,
    /// `true` / `false`.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// A string.
    Str(String),
    /// A list of constants.
    List(Vec<Const>),
    /// A map with string keys, in the order written.
    Map(Vec<(String, Const)>),
}

impl Const {
    /// A word for the type, for messages: `string`, `integer`, …
    pub fn type_name(&self) -> &'static str {
        match self {
            Const::None => "none",
            Const::Bool(_) => "boolean",
            Const::Int(_) => "integer",
            Const::Float(_) => "float",
            Const::Str(_) => "string",
            Const::List(_) => "list",
            Const::Map(_) => "map",
        }
    }

    /// The value as JSON (maps keep their order).
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value as J;
        match self {
            Const::None => J::Null,
            Const::Bool(b) => J::Bool(*b),
            Const::Int(n) => J::from(*n),
            Const::Float(f) => serde_json::Number::from_f64(*f).map(J::Number).unwrap_or(J::Null),
            Const::Str(s) => J::String(s.clone()),
            Const::List(l) => J::Array(l.iter().map(Const::to_json).collect()),
            Const::Map(m) => J::Object(m.iter().map(|(k, v)| (k.clone(), v.to_json())).collect()),
        }
    }
}

impl Expr {
    /// Folds a literal expression (literals, lists, maps with string keys,
    /// negated numbers) to a constant; `None` for anything else.
    pub fn to_const(&self) -> Option<Const> {
        Some(match &self.kind {
            ExprKind::Str(s) => Const::Str(s.clone()),
            ExprKind::Int(n) => Const::Int(*n),
            ExprKind::Float(f) => Const::Float(*f),
            ExprKind::Bool(b) => Const::Bool(*b),
            ExprKind::None => Const::None,
            ExprKind::List(items) => Const::List(items.iter().map(Expr::to_const).collect::<Option<_>>()?),
            ExprKind::Map(kv) => Const::Map(
                kv.iter()
                    .map(|(k, v)| Some((k.as_str()?.to_string(), v.to_const()?)))
                    .collect::<Option<_>>()?,
            ),
            ExprKind::Unary(UnaryOp::Neg, v) => match v.to_const()? {
                Const::Int(n) => Const::Int(n.checked_neg()?),
                Const::Float(f) => Const::Float(-f),
                _ => return None,
            },
            _ => return None,
        })
    }
}
