//! The built-in filters, `is` tests and functions: names, arities and docs.
//! One table serves the checker (arity, unknown names), the interpreter and
//! the language server (hover, completion).

/// A built-in callable: how many positional arguments it takes (not
/// counting the piped value of a filter or test) and which keywords.
#[derive(Debug, Clone, Copy)]
pub struct Builtin {
    /// Its name.
    pub name: &'static str,
    /// Fewest positional arguments.
    pub min_args: usize,
    /// Most positional arguments.
    pub max_args: usize,
    /// Parameter names, positional order; keywords must be among them.
    pub params: &'static [&'static str],
    /// One line of documentation.
    pub doc: &'static str,
}

const fn b(name: &'static str, min_args: usize, max_args: usize, params: &'static [&'static str], doc: &'static str) -> Builtin {
    Builtin { name, min_args, max_args, params, doc }
}

/// Filters: `value | name(args)`.
pub const FILTERS: &[Builtin] = &[
    b("len", 0, 0, &[], "Length of a string (in characters), list or map."),
    b("upper", 0, 0, &[], "The string in upper case."),
    b("lower", 0, 0, &[], "The string in lower case."),
    b("capitalize", 0, 0, &[], "First character upper case, the rest lower case."),
    b("title", 0, 0, &[], "Each word capitalised."),
    b("trim", 0, 1, &["chars"], "The string without leading and trailing white space (or `chars`)."),
    b("int", 0, 1, &["default"], "Converts to an integer (`default` when it cannot)."),
    b("float", 0, 1, &["default"], "Converts to a float (`default` when it cannot)."),
    b("string", 0, 0, &[], "Converts to a string."),
    b("join", 0, 1, &["sep"], "Joins a list into a string with `sep` between items."),
    b("split", 0, 2, &["sep", "maxsplit"], "Splits a string on `sep` (white space by default)."),
    b("replace", 2, 3, &["old", "new", "count"], "Replaces `old` with `new` (at most `count` times)."),
    b("first", 0, 0, &[], "The first item of a list or character of a string."),
    b("last", 0, 0, &[], "The last item of a list or character of a string."),
    b("default", 1, 2, &["value", "boolean"], "`value` when undefined (or, with `boolean=true`, when false-like)."),
    b("round", 0, 1, &["precision"], "Rounds a number to `precision` decimal places (0 by default)."),
    b("abs", 0, 0, &[], "Absolute value."),
    b("tojson", 0, 1, &["indent"], "The value as JSON text."),
    b("fromjson", 0, 0, &[], "Parses JSON text into a value."),
    b("list", 0, 0, &[], "Converts to a list (of characters, for a string)."),
    b("sort", 0, 1, &["reverse"], "The list sorted."),
    b("reverse", 0, 0, &[], "The list or string reversed."),
    b("unique", 0, 0, &[], "The list without repeated items, first occurrences kept."),
    b("sum", 0, 0, &[], "Sum of a list of numbers."),
    b("min", 0, 0, &[], "Smallest item of a list."),
    b("max", 0, 0, &[], "Largest item of a list."),
    b("items", 0, 0, &[], "A map's `[key, value]` pairs, for `{% for k, v in m | items %}`."),
    b("keys", 0, 0, &[], "A map's keys."),
    b("values", 0, 0, &[], "A map's values."),
];

/// Tests: `value is name(args)`.
pub const TESTS: &[Builtin] = &[
    b("defined", 0, 0, &[], "The name is defined."),
    b("undefined", 0, 0, &[], "The name is not defined."),
    b("none", 0, 0, &[], "The value is `none`."),
    b("string", 0, 0, &[], "The value is a string."),
    b("number", 0, 0, &[], "The value is an integer or a float."),
    b("integer", 0, 0, &[], "The value is an integer."),
    b("float", 0, 0, &[], "The value is a float."),
    b("boolean", 0, 0, &[], "The value is `true` or `false`."),
    b("list", 0, 0, &[], "The value is a list."),
    b("mapping", 0, 0, &[], "The value is a map."),
    b("even", 0, 0, &[], "The integer is even."),
    b("odd", 0, 0, &[], "The integer is odd."),
    b("divisibleby", 1, 1, &["num"], "The integer is divisible by `num`."),
];

/// Functions that are not filters.
pub const FUNCTIONS: &[Builtin] = &[
    b("range", 1, 3, &["start", "stop", "step"], "`range(stop)` or `range(start, stop[, step])`: a list of integers."),
    b(
        "usage",
        0,
        0,
        &[],
        "The run's token counts so far, as a map: `prompt_tokens`, `generated_tokens`, `forced_tokens`, `sequence_tokens`, `forward_passes`, `forward_tokens`, `reused_tokens`, `rewound_tokens`, `scored_tokens`.",
    ),
];

/// The filter with this name.
pub fn filter(name: &str) -> Option<&'static Builtin> {
    FILTERS.iter().find(|f| f.name == name)
}

/// The test with this name.
pub fn test(name: &str) -> Option<&'static Builtin> {
    TESTS.iter().find(|f| f.name == name)
}

/// A built-in callable as a function, `name(args)`: `range`, or any filter
/// with its value as the first argument (`len(x)` is `x | len`). Returns
/// the builtin and how many leading arguments the call adds.
pub fn function(name: &str) -> Option<(&'static Builtin, usize)> {
    FUNCTIONS.iter().find(|f| f.name == name).map(|f| (f, 0)).or_else(|| filter(name).map(|f| (f, 1)))
}

/// Names reserved for the language: not assignable.
pub const RESERVED: &[&str] = &["loop"];

/// Whether `name` may not be assigned: a reserved word or a built-in
/// function (`range`, `usage`), which an assignment would hide.
pub fn is_reserved(name: &str) -> bool {
    RESERVED.contains(&name) || FUNCTIONS.iter().any(|f| f.name == name)
}
