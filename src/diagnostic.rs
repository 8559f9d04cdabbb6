//! Diagnostics as data: a code, a severity, a message, labelled spans and a
//! help line. Stages produce them; only the edges (the CLI, the language
//! server) render them.

use crate::span::{FileId, SourceMap, Span};

/// How serious a diagnostic is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// The template cannot run.
    Error,
    /// The template runs but probably not as meant.
    Warning,
}

/// A span in a file with a short message shown beside it.
#[derive(Clone, Debug, PartialEq)]
pub struct Label {
    /// The file the span is in.
    pub file: FileId,
    /// Where.
    pub span: Span,
    /// What is there (may be empty).
    pub message: String,
}

/// One problem found in a template.
#[derive(Clone, Debug, PartialEq)]
pub struct Diagnostic {
    /// The stable code (see [`Code`]).
    pub code: Code,
    /// Error or warning.
    pub severity: Severity,
    /// What is wrong, in one sentence.
    pub message: String,
    /// The file of the primary span.
    pub file: FileId,
    /// The primary span: where the problem is.
    pub span: Span,
    /// Text shown at the primary span.
    pub label: String,
    /// Related places (where a block was opened, where a name is defined).
    pub secondary: Vec<Label>,
    /// How to fix it, when that can be said.
    pub help: Option<String>,
}

impl Diagnostic {
    /// A diagnostic of `code` at `span`, with the code's default severity.
    pub fn new(code: Code, file: FileId, span: Span, message: impl Into<String>) -> Self {
        Diagnostic {
            code,
            severity: code.severity(),
            message: message.into(),
            file,
            span,
            label: String::new(),
            secondary: Vec::new(),
            help: None,
        }
    }

    /// Sets the text shown at the primary span.
    pub fn with_label(mut self, label: impl Into<String>) -> Self {
        self.label = label.into();
        self
    }

    /// Adds a secondary span in the same file.
    pub fn with_secondary(mut self, span: Span, message: impl Into<String>) -> Self {
        self.secondary.push(Label { file: self.file, span, message: message.into() });
        self
    }

    /// Sets the help line.
    pub fn with_help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }

    /// True for errors (as opposed to warnings).
    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }

    /// True when the input simply ends too early (an open block, tag, comment
    /// or string at the end of the text): a REPL reads another line instead
    /// of reporting it.
    pub fn is_incomplete_input(&self, text_len: usize) -> bool {
        match self.code {
            Code::UnclosedBlock | Code::UnclosedRaw | Code::UnterminatedComment => true,
            Code::UnterminatedTag => self.span.end as usize >= text_len,
            _ => false,
        }
    }
}

macro_rules! codes {
    ($($variant:ident = $code:literal, $name:literal, $sev:ident, $summary:literal;)*) => {
        /// Every diagnostic code lmt can emit. The code is stable; the
        /// language reference lists them all.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Code { $(#[doc = $summary] $variant,)* }

        impl Code {
            /// All codes, in order.
            pub const ALL: &'static [Code] = &[$(Code::$variant,)*];

            /// The code as printed, e.g. `E0201`.
            pub fn as_str(self) -> &'static str {
                match self { $(Code::$variant => $code,)* }
            }

            /// A short kebab-case name, e.g. `unclosed-block`.
            pub fn name(self) -> &'static str {
                match self { $(Code::$variant => $name,)* }
            }

            /// The default severity.
            pub fn severity(self) -> Severity {
                match self { $(Code::$variant => Severity::$sev,)* }
            }

            /// One line saying what the code means.
            pub fn summary(self) -> &'static str {
                match self { $(Code::$variant => $summary,)* }
            }

            /// The code with this printed form.
            pub fn parse(s: &str) -> Option<Code> {
                Code::ALL.iter().copied().find(|c| c.as_str() == s)
            }
        }
    };
}

codes! {
    // Tags and tokens.
    UnterminatedTag = "E0101", "unterminated-tag", Error, "A `{{` or `{%` tag is not closed before the next tag or the end of the file.";
    UnterminatedComment = "E0102", "unterminated-comment", Error, "A `{#` comment is never closed with `#}`.";
    UnterminatedString = "E0103", "unterminated-string", Error, "A string literal does not close on its line.";
    Syntax = "E0104", "syntax", Error, "The inside of a tag does not parse.";
    UnknownStatement = "E0105", "unknown-statement", Error, "A `{% %}` tag starts with a word that is not a statement.";
    EmptyTag = "E0106", "empty-tag", Error, "A tag has nothing inside it.";
    InvalidEscape = "E0107", "invalid-escape", Error, "A string escape such as `\\u{…}` or `\\x..` is malformed.";
    InvalidNumber = "E0108", "invalid-number", Error, "A number literal is out of range.";
    TooDeep = "E0109", "too-deep", Error, "Blocks, expressions or grammar groups nest deeper than the limit (128).";
    // Blocks.
    UnclosedBlock = "E0201", "unclosed-block", Error, "A block is opened but the file ends before its `{% end %}`.";
    StrayEnd = "E0202", "stray-end", Error, "An `{% end %}` has no open block to close.";
    MismatchedEnd = "E0203", "mismatched-end", Error, "A named `{% end NAME %}` closes a block of another kind.";
    OrOutsideSelect = "E0204", "or-outside-select", Error, "`{% or %}` appears outside a `select` block (or inside a block nested in it).";
    MisplacedElse = "E0205", "misplaced-else", Error, "`elif` or `else` outside an `if` (or `else` outside a `for`), or after the `else`.";
    UnclosedRaw = "E0206", "unclosed-raw", Error, "A `{% raw %}` block is never closed with `{% endraw %}`.";
    NestedRole = "E0207", "nested-role", Error, "A role block is opened inside another role block.";
    NotTopLevel = "E0208", "not-top-level", Error, "`def`, `grammar`, `import` and `input` are only allowed at the top level of a file.";
    InvalidRoleName = "E0209", "invalid-role-name", Error, "A role name that is not a plain word (a letter, then letters, digits, `_` or `-`; at most 32): it could forge chat-template markup.";
    // Options.
    UnknownOption = "E0301", "unknown-option", Error, "A `gen` or `select` option that does not exist.";
    OptionType = "E0302", "option-type", Error, "An option value of the wrong type or out of range.";
    DuplicateOption = "E0303", "duplicate-option", Error, "The same option is given twice.";
    ConflictingOptions = "E0304", "conflicting-options", Error, "Options that cannot be combined, such as `regex` with `json`.";
    // Regexes, grammars, schemas.
    InvalidRegex = "E0401", "invalid-regex", Error, "A regex does not compile.";
    GrammarSyntax = "E0402", "grammar-syntax", Error, "A `{% grammar %}` body is not valid GBNF.";
    UndefinedRule = "E0403", "undefined-rule", Error, "A grammar refers to a rule it does not define.";
    UnusedRule = "W0404", "unused-rule", Warning, "A grammar rule is never reached from the start rule.";
    InvalidSchema = "E0405", "invalid-schema", Error, "A JSON Schema literal is not valid JSON Schema.";
    NoStartRule = "E0406", "no-start-rule", Error, "A grammar has neither a `root` rule nor a rule named like the block.";
    DuplicateRule = "E0407", "duplicate-rule", Error, "A grammar defines the same rule twice.";
    NotAGrammar = "E0408", "not-a-grammar", Error, "`grammar=` names something that is not a grammar, or a rule it does not have.";
    SchemaFile = "E0409", "schema-file", Error, "A JSON Schema file named by `json=` cannot be read or is not JSON.";
    UnknownSchemaKeyword = "W0410", "unknown-schema-keyword", Warning, "A JSON Schema keyword that lmt does not know (often a typo).";
    UnsupportedConstraint = "E0411", "unsupported-constraint", Error, "A constraint the grammar engine cannot enforce: an unsupported JSON Schema keyword, a regex feature automata lack, or a size past the engine's limits.";
    OpenObject = "W0412", "open-object", Warning, "A JSON Schema object takes any other key (`additionalProperties: true`) with no `maxProperties`: generation may not end.";
    // Names and calls.
    UnknownName = "E0501", "unknown-name", Error, "A name is used but never defined or declared with `input`.";
    MaybeUndefined = "W0502", "maybe-undefined", Warning, "A name is defined on some paths only (one branch of an `if`, a loop body that may not run).";
    UsedBeforeDefined = "E0503", "used-before-defined", Error, "A name is used before the place that defines it.";
    WrongArguments = "E0504", "wrong-arguments", Error, "A `def`, filter or function is called with the wrong arguments.";
    UnknownFilter = "E0505", "unknown-filter", Error, "A filter that does not exist.";
    UnknownTest = "E0506", "unknown-test", Error, "An `is` test that does not exist.";
    DuplicateDefinition = "E0507", "duplicate-definition", Error, "A `def`, grammar, input or parameter is defined twice.";
    UnknownAttribute = "E0508", "unknown-attribute", Error, "An imported module has no such definition.";
    ReservedName = "E0509", "reserved-name", Error, "Assigning to a name that is reserved (`loop`, built-in functions).";
    // Imports.
    ImportNotFound = "E0601", "import-not-found", Error, "An imported file or stdlib module does not exist.";
    ImportCycle = "E0602", "import-cycle", Error, "Modules import each other in a cycle.";
    ImportedSideEffect = "E0603", "imported-side-effect", Error, "An imported module generates or opens roles at its top level.";
    // Select.
    SingleOption = "W0701", "single-option", Warning, "A `select` with one option always picks it.";
    DuplicateChoice = "W0702", "duplicate-choice", Warning, "A `select` lists the same option twice.";
    EmptyChoices = "E0703", "empty-choices", Error, "A `select … in [...]` has no options.";
    GreedyBranches = "W0704", "greedy-branches", Warning, "`score=\"greedy\"` on a select whose branches are not all plain text: it is scored `\"full\"`.";
    // Running.
    Runtime = "E0801", "runtime", Error, "A value error while running: a value of the wrong type, an undefined value, a failed filter, test or call.";
    MissingInput = "E0802", "missing-input", Error, "An input the template declares with `{% input %}` was not given.";
    OptionValue = "E0803", "option-value", Error, "A `gen` or `select` option computed at run time has the wrong type or is out of range.";
    ConstraintFailed = "E0804", "constraint-failed", Error, "A constraint the engine refuses at run time, or one no token of the model can continue.";
    UnfinishedValue = "E0805", "unfinished-value", Error, "`max_tokens` ran out before a `regex`, `grammar` or `json` value matched (`partial=true` keeps it).";
    ContextFull = "E0806", "context-full", Error, "The text does not fit the model's context.";
    RunLimit = "E0807", "run-limit", Error, "A bound on values or work: string size, list items, `range`, call depth, `select … in` options.";
    RunFile = "E0808", "run-file", Error, "A file the template names at run time cannot be read or parsed.";
    ModelFailed = "E0809", "model-failed", Error, "The model, its tokenizer or its chat template failed while running.";
    Internal = "E0810", "internal", Error, "A fault of lmt itself: please report it.";
    // Remote engines.
    EngineLacks = "E0901", "engine-lacks", Error, "The remote engine cannot do what this construct needs (the model's logits at every token, server-side constraints).";
    SelectByGeneration = "W0902", "select-by-generation", Warning, "On a remote engine without prompt log-probs, a `select` is chosen by generation constrained to its options, not by scoring each option in full.";
}

/// Sorts diagnostics by file and position so output is stable.
pub fn sort(diags: &mut [Diagnostic]) {
    diags.sort_by_key(|a| (a.file, a.span.start, a.span.end, a.code));
}

/// A diagnostic flattened for machine output: the JSON shape of `lmt check --format json`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct JsonDiagnostic {
    /// Display name of the file.
    pub file: String,
    /// Code such as `E0201`.
    pub code: &'static str,
    /// `error` or `warning`.
    pub severity: Severity,
    /// The message.
    pub message: String,
    /// 1-based start line.
    pub line: u32,
    /// 1-based start column, in characters.
    pub column: u32,
    /// 1-based end line.
    pub end_line: u32,
    /// 1-based end column (exclusive), in characters.
    pub end_column: u32,
    /// How to fix it.
    pub help: Option<String>,
    /// The code's kebab-case name.
    pub name: &'static str,
    /// Byte offsets of the primary span.
    pub offset: u32,
    /// End byte offset of the primary span.
    pub end_offset: u32,
}

impl JsonDiagnostic {
    /// Flattens `d`, converting its span with the file's line index.
    pub fn new(d: &Diagnostic, sources: &SourceMap) -> Self {
        let f = sources.get(d.file);
        let start = f.lines.line_col(&f.text, d.span.start as usize);
        let end = f.lines.line_col(&f.text, d.span.end as usize);
        JsonDiagnostic {
            file: f.name.clone(),
            code: d.code.as_str(),
            severity: d.severity,
            message: d.message.clone(),
            line: start.line,
            column: start.column,
            end_line: end.line,
            end_column: end.column,
            help: d.help.clone(),
            name: d.code.name(),
            offset: d.span.start,
            end_offset: d.span.end,
        }
    }
}

/// `word` with its indefinite article, for messages: "an integer", "a string".
pub fn with_article(word: &str) -> String {
    let article = if word.starts_with(['a', 'e', 'i', 'o', 'u']) { "an" } else { "a" };
    format!("{article} {word}")
}

/// Suggests the candidate closest to `word` by edit distance, if close enough.
pub fn suggest<'c>(word: &str, candidates: impl IntoIterator<Item = &'c str>) -> Option<&'c str> {
    let len = word.chars().count();
    let max = (len / 3).max(1);
    candidates
        .into_iter()
        .filter(|c| *c != word)
        .map(|c| (edit_distance(word, c), c))
        // One-letter names are one edit from every other one-letter name.
        .filter(|(d, _)| *d <= max && *d < len)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + (ca != cb) as usize;
            cur.push(sub.min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}
