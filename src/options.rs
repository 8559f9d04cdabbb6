//! The `gen` and `select` options: one table of names, kinds, typed
//! defaults and docs, and one reading of a value against it. The checker
//! reads literal values with [`parse_value`] (and adds what only it checks:
//! regexes, schemas, grammar names); the interpreter reads run-time values
//! with the same function into its typed options; the language server and
//! the REPL complete and document from the same table.

use crate::diagnostic::with_article;
use crate::syntax::ast::Const;

/// Every option, `gen`'s and `select`'s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Opt {
    /// `max_tokens`.
    MaxTokens,
    /// `stop`.
    Stop,
    /// `stop_regex`.
    StopRegex,
    /// `regex`.
    Regex,
    /// `grammar`.
    Grammar,
    /// `json`.
    Json,
    /// `json_open`.
    JsonOpen,
    /// `bias`.
    Bias,
    /// `temperature`.
    Temperature,
    /// `top_p`.
    TopP,
    /// `top_k`.
    TopK,
    /// `min_p`.
    MinP,
    /// `seed`.
    Seed,
    /// `heal`.
    Heal,
    /// `partial`.
    Partial,
    /// `score`.
    Score,
}

/// What kind of value an option takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptKind {
    /// Integer ≥ 1.
    PositiveInt,
    /// Integer ≥ 0.
    NonNegativeInt,
    /// Number ≥ 0.
    NonNegativeNumber,
    /// Number in (0, 1].
    Probability,
    /// Number in [0, 1].
    UnitInterval,
    /// A boolean.
    Bool,
    /// A non-empty string or a non-empty list of them.
    Strings,
    /// A regex.
    Regex,
    /// A regex or a list of regexes.
    Regexes,
    /// A grammar name (`{% grammar NAME %}`), optionally `.rule`.
    Grammar,
    /// A JSON Schema: a map, `true`, or a path to a schema file.
    Schema,
    /// A map from regex to logit offset.
    Bias,
    /// A [`ScoreMode`].
    Score,
}

/// How a `select` compares its options.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ScoreMode {
    /// Total log-probability of each option.
    #[default]
    Full,
    /// Mean log-probability per token.
    Mean,
    /// Token-by-token decoding constrained to the options (literal options
    /// only).
    Greedy,
}

impl ScoreMode {
    /// Every mode.
    pub const ALL: [ScoreMode; 3] = [ScoreMode::Full, ScoreMode::Mean, ScoreMode::Greedy];

    /// The name written in templates.
    pub fn as_str(self) -> &'static str {
        match self {
            ScoreMode::Full => "full",
            ScoreMode::Mean => "mean",
            ScoreMode::Greedy => "greedy",
        }
    }
}

/// An option's default.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum OptDefault {
    /// Not set: no constraint, no stop, no bias.
    Unset,
    /// An integer.
    Int(u64),
    /// A number.
    Number(f64),
    /// A boolean.
    Bool(bool),
    /// A score mode.
    Score(ScoreMode),
    /// Taken from the run (`lmt run` flag named here).
    Run(&'static str),
}

impl OptDefault {
    /// The default as a value of its option (`Default` where the run decides
    /// or nothing is set).
    pub fn value(self) -> OptValue {
        match self {
            OptDefault::Int(n) => OptValue::Int(n),
            OptDefault::Number(x) => OptValue::Number(x),
            OptDefault::Bool(b) => OptValue::Bool(b),
            OptDefault::Score(m) => OptValue::Score(m),
            OptDefault::Unset | OptDefault::Run(_) => OptValue::Default,
        }
    }

    /// The default as users read it.
    pub fn display(self) -> String {
        match self {
            OptDefault::Unset => "none".into(),
            OptDefault::Int(n) => n.to_string(),
            OptDefault::Number(x) => x.to_string(),
            OptDefault::Bool(b) => b.to_string(),
            OptDefault::Score(s) => format!("{:?}", s.as_str()),
            OptDefault::Run(flag) => format!("the run's `{flag}`"),
        }
    }
}

/// One option of `gen` or `select`.
#[derive(Debug, Clone, Copy)]
pub struct OptionSpec {
    /// Which option.
    pub opt: Opt,
    /// The option's name.
    pub name: &'static str,
    /// Its kind of value.
    pub kind: OptKind,
    /// The type as shown to users.
    pub ty: &'static str,
    /// The default.
    pub default: OptDefault,
    /// One line of documentation.
    pub doc: &'static str,
}

const fn o(opt: Opt, name: &'static str, kind: OptKind, ty: &'static str, default: OptDefault, doc: &'static str) -> OptionSpec {
    OptionSpec { opt, name, kind, ty, default, doc }
}

use OptDefault as D;

/// The options of `{% gen %}`.
pub const GEN_OPTIONS: &[OptionSpec] = &[
    o(Opt::MaxTokens, "max_tokens", OptKind::PositiveInt, "integer ≥ 1", D::Int(256), "Most tokens to generate."),
    o(Opt::Stop, "stop", OptKind::Strings, "string or list of strings", D::Unset, "Stop at any of these strings; the stop text is cut from the value."),
    o(Opt::StopRegex, "stop_regex", OptKind::Regexes, "regex or list of regexes", D::Unset, "Stop where one of these regexes matches; the match is cut from the value."),
    o(Opt::Regex, "regex", OptKind::Regex, "regex", D::Unset, "The value must match this regex in full."),
    o(Opt::Grammar, "grammar", OptKind::Grammar, "grammar name", D::Unset, "The value must match this grammar (`{% grammar NAME %}`, optionally `NAME.rule`)."),
    o(Opt::Json, "json", OptKind::Schema, "JSON Schema map, or path to a schema file", D::Unset, "The value must be JSON valid against this schema; an object that lists its properties takes no other key unless the schema says so (see `json_open`)."),
    o(Opt::JsonOpen, "json_open", OptKind::Bool, "boolean", D::Bool(false), "With `json`: JSON Schema's validation semantics, where an object takes keys it does not list unless `additionalProperties` is false."),
    o(Opt::Bias, "bias", OptKind::Bias, "map of regex to number", D::Unset, "Adds the number to the logits of tokens that keep the regex matching (a soft constraint)."),
    o(Opt::Temperature, "temperature", OptKind::NonNegativeNumber, "number ≥ 0", D::Run("--temperature"), "Sampling temperature; 0 (the run's default) picks the most likely token."),
    o(Opt::TopP, "top_p", OptKind::Probability, "number in (0, 1]", D::Number(1.0), "Nucleus sampling: sample from the smallest set of tokens with this much probability (1: off)."),
    o(Opt::TopK, "top_k", OptKind::NonNegativeInt, "integer ≥ 0", D::Int(0), "Sample from the k most likely tokens (0: off)."),
    o(Opt::MinP, "min_p", OptKind::UnitInterval, "number in [0, 1]", D::Number(0.0), "Drop tokens less likely than min_p times the most likely one (0: off)."),
    o(Opt::Seed, "seed", OptKind::NonNegativeInt, "integer ≥ 0", D::Run("--seed"), "Seed for this generation's sampler."),
    o(Opt::Heal, "heal", OptKind::Bool, "boolean", D::Bool(true), "Token healing: re-generate the last prompt token so the value can start mid-token."),
    o(Opt::Partial, "partial", OptKind::Bool, "boolean", D::Bool(false), "With `regex`, `grammar` or `json`: keep a value that `max_tokens` cut short of matching (its `finish_reason` is `max_tokens`) instead of stopping the run with an error."),
];

/// The options of `{% select %}`.
pub const SELECT_OPTIONS: &[OptionSpec] = &[
    o(Opt::Score, "score", OptKind::Score, "\"full\", \"mean\" or \"greedy\"", D::Score(ScoreMode::Full), "How options are compared: total log-probability, per-token mean, or token-by-token constrained decoding (literal options only)."),
    o(Opt::Temperature, "temperature", OptKind::NonNegativeNumber, "number ≥ 0", D::Number(0.0), "Sample the choice from the scores at this temperature; 0 picks the best."),
    o(Opt::Seed, "seed", OptKind::NonNegativeInt, "integer ≥ 0", D::Run("--seed"), "Seed for sampling the choice."),
];

/// Names people write for options that are called something else here.
pub const ALIASES: &[(&str, &str)] = &[
    ("max_new_tokens", "max_tokens"),
    ("max_length", "max_tokens"),
    ("n_predict", "max_tokens"),
    ("stops", "stop"),
    ("until", "stop"),
    ("stop_sequences", "stop"),
    ("pattern", "regex"),
    ("schema", "json"),
    ("json_schema", "json"),
    ("temp", "temperature"),
    ("logit_bias", "bias"),
    ("token_healing", "heal"),
];

/// The options of `select` (true) or `gen` (false).
pub fn table(select: bool) -> &'static [OptionSpec] {
    if select {
        SELECT_OPTIONS
    } else {
        GEN_OPTIONS
    }
}

/// The option called `name` in `table`.
pub fn find(table: &'static [OptionSpec], name: &str) -> Option<&'static OptionSpec> {
    table.iter().find(|s| s.name == name)
}

/// The white space `json=` allows between JSON tokens, and `lmt match
/// --json-schema` with it: llama.cpp's, the layouts models learnt JSON in.
/// (With none allowed, SmolLM2 wrote `{"order_id":"1234…` until
/// `max_tokens` where pretty-printed output closed.)
pub const JSON_WHITESPACE: crate::engine::Whitespace = crate::engine::Whitespace::Pretty;

/// The options that constrain a value; a `gen` takes at most one.
pub const CONSTRAINTS: [Opt; 3] = [Opt::Regex, Opt::Grammar, Opt::Json];

/// A value read against its option's kind.
#[derive(Debug, Clone, PartialEq)]
pub enum OptValue {
    /// `none`: the option's default.
    Default,
    /// An integer option.
    Int(u64),
    /// A number option.
    Number(f64),
    /// A boolean option.
    Bool(bool),
    /// Strings (`stop`), regexes (`stop_regex`), or one regex (`regex`).
    Strings(Vec<String>),
    /// A JSON Schema, inline or by path.
    Schema(SchemaArg),
    /// Regexes and their logit offsets.
    Bias(Vec<(String, f64)>),
    /// A score mode.
    Score(ScoreMode),
}

/// How `json=` gives its schema.
#[derive(Debug, Clone, PartialEq)]
pub enum SchemaArg {
    /// Inline: `true` or a map.
    Inline(serde_json::Value),
    /// A schema file's path, as written.
    File(String),
}

/// Why a value does not fit its option: a message, and help where there is
/// more to say.
#[derive(Debug, Clone, PartialEq)]
pub struct OptionError {
    /// What is wrong.
    pub message: String,
    /// How to fix it.
    pub help: Option<String>,
    /// The entry of a map or list at fault, when one is (its index).
    pub entry: Option<usize>,
}

impl OptionError {
    fn new(message: String, help: Option<&str>) -> OptionError {
        OptionError { message, help: help.map(str::to_string), entry: None }
    }
}

impl std::fmt::Display for OptionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// A literal as messages describe it: "the integer 0", "a list".
pub fn describe(c: &Const) -> String {
    match c {
        Const::Str(s) => format!("the string {s:?}"),
        Const::Int(n) => format!("the integer {n}"),
        Const::Float(f) => format!("the number {f}"),
        Const::Bool(b) => format!("`{b}`"),
        Const::None => "`none`".into(),
        Const::List(_) => "a list".into(),
        Const::Map(_) => "a map".into(),
    }
}

/// Reads `c` as a value of `spec`'s option. `none` is the default. A
/// grammar is not a literal: the checker and the interpreter read
/// `grammar=` themselves.
pub fn parse_value(spec: &OptionSpec, c: &Const) -> Result<OptValue, OptionError> {
    if matches!(c, Const::None) {
        return Ok(OptValue::Default);
    }
    let wrong = || OptionError::new(format!("`{}` takes {}, not {}", spec.name, with_article(spec.ty), describe(c)), None);
    let number = match c {
        Const::Int(n) => Some(*n as f64),
        Const::Float(f) if f.is_finite() => Some(*f),
        _ => None,
    };
    let in_range = |ok: fn(f64) -> bool| number.filter(|&x| ok(x)).map(OptValue::Number).ok_or_else(wrong);
    let string = |c: &Const| match c {
        Const::Str(s) => Some(s.clone()),
        _ => None,
    };
    match spec.kind {
        OptKind::PositiveInt => match c {
            Const::Int(n) if *n >= 1 => Ok(OptValue::Int(*n as u64)),
            _ => Err(wrong()),
        },
        OptKind::NonNegativeInt => match c {
            Const::Int(n) if *n >= 0 => Ok(OptValue::Int(*n as u64)),
            _ => Err(wrong()),
        },
        OptKind::NonNegativeNumber => in_range(|x| x >= 0.0),
        OptKind::Probability => in_range(|x| x > 0.0 && x <= 1.0),
        OptKind::UnitInterval => in_range(|x| (0.0..=1.0).contains(&x)),
        OptKind::Bool => match c {
            Const::Bool(b) => Ok(OptValue::Bool(*b)),
            _ => Err(wrong()),
        },
        OptKind::Score => ScoreMode::ALL
            .into_iter()
            .find(|m| matches!(c, Const::Str(s) if s == m.as_str()))
            .map(OptValue::Score)
            .ok_or_else(wrong),
        OptKind::Strings => {
            let items: Vec<String> = match c {
                Const::Str(s) => vec![s.clone()],
                Const::List(l) => l.iter().map(string).collect::<Option<_>>().ok_or_else(wrong)?,
                _ => return Err(wrong()),
            };
            if items.is_empty() {
                return Err(OptionError::new(
                    format!("`{}` is an empty list", spec.name),
                    Some("give the strings to stop at, or leave the option out"),
                ));
            }
            if items.iter().any(String::is_empty) {
                let (what, help) = match c {
                    Const::Str(_) => ("be the empty string", "every string ends with the empty string: give the text to stop at"),
                    _ => ("hold the empty string", "every string ends with the empty string: remove `\"\"` from the list"),
                };
                return Err(OptionError::new(format!("`{}` cannot {what}", spec.name), Some(help)));
            }
            Ok(OptValue::Strings(items))
        }
        OptKind::Regex => string(c).map(|s| OptValue::Strings(vec![s])).ok_or_else(wrong),
        OptKind::Regexes => match c {
            Const::Str(s) => Ok(OptValue::Strings(vec![s.clone()])),
            Const::List(l) if !l.is_empty() => l.iter().map(string).collect::<Option<_>>().map(OptValue::Strings).ok_or_else(wrong),
            _ => Err(wrong()),
        },
        OptKind::Bias => {
            let Const::Map(entries) = c else { return Err(wrong()) };
            let mut pairs = Vec::with_capacity(entries.len());
            for (i, (k, v)) in entries.iter().enumerate() {
                match v {
                    Const::Int(n) => pairs.push((k.clone(), *n as f64)),
                    Const::Float(f) if f.is_finite() => pairs.push((k.clone(), *f)),
                    _ => {
                        let help = Some("write `bias={\"regex\": -2.5}`: negative discourages, positive encourages");
                        let e = OptionError::new(format!("a bias must be a number, not {}", describe(v)), help);
                        return Err(OptionError { entry: Some(i), ..e });
                    }
                }
            }
            Ok(OptValue::Bias(pairs))
        }
        OptKind::Schema => match c {
            Const::Bool(true) | Const::Map(_) => Ok(OptValue::Schema(SchemaArg::Inline(c.to_json()))),
            Const::Str(path) => Ok(OptValue::Schema(SchemaArg::File(path.clone()))),
            _ => Err(wrong()),
        },
        OptKind::Grammar => Err(OptionError::new(
            format!("`{}` must name a `{{% grammar %}}` block, not {}", spec.name, describe(c)),
            Some("write `grammar=NAME` or `grammar=NAME.rule`"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(select: bool, name: &str, c: Const) -> Result<OptValue, OptionError> {
        parse_value(find(table(select), name).unwrap(), &c)
    }

    #[test]
    fn kinds_take_their_values_and_refuse_others() {
        assert_eq!(read(false, "max_tokens", Const::Int(3)), Ok(OptValue::Int(3)));
        assert!(read(false, "max_tokens", Const::Int(0)).is_err());
        assert!(read(false, "top_p", Const::Float(0.0)).is_err());
        assert_eq!(read(false, "top_p", Const::Int(1)), Ok(OptValue::Number(1.0)));
        assert!(read(false, "temperature", Const::Float(f64::NAN)).is_err());
        assert_eq!(read(true, "score", Const::Str("mean".into())), Ok(OptValue::Score(ScoreMode::Mean)));
        assert_eq!(read(false, "stop", Const::None), Ok(OptValue::Default));
        let e = read(false, "stop", Const::List(vec![Const::Str("a".into()), Const::Str(String::new())])).unwrap_err();
        assert_eq!(e.message, "`stop` cannot hold the empty string");
        let e = read(false, "min_p", Const::Str("x".into())).unwrap_err();
        assert_eq!(e.message, "`min_p` takes a number in [0, 1], not the string \"x\"");
    }

    #[test]
    fn every_default_fits_its_kind() {
        for spec in GEN_OPTIONS.iter().chain(SELECT_OPTIONS) {
            let c = match spec.default {
                OptDefault::Int(n) => Const::Int(n as i64),
                OptDefault::Number(x) => Const::Float(x),
                OptDefault::Bool(b) => Const::Bool(b),
                OptDefault::Score(s) => Const::Str(s.as_str().into()),
                OptDefault::Unset | OptDefault::Run(_) => continue,
            };
            assert!(parse_value(spec, &c).is_ok(), "{}'s default {:?}", spec.name, spec.default);
        }
    }
}
