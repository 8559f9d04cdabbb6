//! The intermediate representation the interpreter runs: per module, a flat
//! list of stack-machine instructions with jumps (as in minijinja), a
//! parallel span table so runtime errors point at source, and side tables
//! (constants, names, option sets, functions, grammars).
//!
//! Why flat: the interpreter's whole state is then a program counter, a value
//! stack and a few frames, which is cheap to clone — program-level sampling
//! and beam search fork it.

mod compile;
pub mod disasm;

pub use compile::compile;

use crate::span::{FileId, Span};
use crate::syntax::ast::{BinaryOp, Const, UnaryOp};
use crate::syntax::gbnf;

/// Index into a module's constant table.
pub type ConstId = u32;
/// Index into a module's name table.
pub type Sym = u32;
/// Index into a module's instruction list.
pub type Pc = u32;

/// A whole program: the entry module and every module it imports.
#[derive(Debug, Clone)]
pub struct Program {
    /// Modules, indexed like the workspace's files.
    pub modules: Vec<CodeModule>,
    /// The module that runs first.
    pub entry: usize,
}

/// The compiled code of one file.
#[derive(Debug, Clone, Default)]
pub struct CodeModule {
    /// Its file.
    pub file: FileId,
    /// Display name.
    pub name: String,
    /// Instructions; the last is [`Instr::Halt`].
    pub code: Vec<Instr>,
    /// Source span of each instruction.
    pub spans: Vec<Span>,
    /// Constants.
    pub consts: Vec<Const>,
    /// Names (variables, attributes, filters).
    pub names: Vec<String>,
    /// Option names of each `gen` / `select`, in the order their values are pushed.
    pub option_sets: Vec<Vec<Sym>>,
    /// Keyword-argument names of calls, in the order their values are pushed.
    pub kwarg_sets: Vec<Vec<Sym>>,
    /// Branch entry points of each branching select.
    pub branch_tables: Vec<Vec<Pc>>,
    /// `def`s.
    pub functions: Vec<Function>,
    /// `{% grammar %}` blocks.
    pub grammars: Vec<GrammarDef>,
    /// Module index of each `Import` instruction's target.
    pub imports: Vec<usize>,
}

/// A compiled `def`.
#[derive(Debug, Clone)]
pub struct Function {
    /// Its name.
    pub name: Sym,
    /// Parameter names.
    pub params: Vec<Sym>,
    /// How many trailing parameters have defaults; their values are popped
    /// by [`Instr::DefineFunction`].
    pub defaults: u32,
    /// First instruction of the body (ends with [`Instr::Return`]).
    pub entry: Pc,
}

/// A grammar block.
#[derive(Debug, Clone)]
pub struct GrammarDef {
    /// Its name.
    pub name: String,
    /// The rules.
    pub grammar: gbnf::Grammar,
    /// The rule generation starts at by default.
    pub start: Option<String>,
}

/// Where a generated, selected or captured value is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Store {
    /// The variable.
    pub name: Sym,
    /// Append to a list instead of assigning.
    pub append: bool,
}

/// One instruction. Operands are indices into the module's tables.
#[derive(Debug, Clone, PartialEq)]
pub enum Instr {
    /// Emit template text (a string constant) into the prompt.
    Text(ConstId),
    /// Pop a value and emit it as plain text (never special tokens).
    Emit,
    /// Push a constant.
    Const(ConstId),
    /// Push a variable's value (error if undefined).
    Load(Sym),
    /// Push a variable's value, or undefined (for `is defined` and `default`).
    LoadMaybe(Sym),
    /// Pop into a variable.
    Store(Store),
    /// Pop an object, push its attribute.
    Attr(Sym),
    /// Pop index and object, push the item (negative indexes count from the end).
    Index,
    /// Pop the present bounds (bit 0 start, 1 stop, 2 step) and the object, push the slice.
    Slice(u8),
    /// Pop n values, push a list.
    List(u32),
    /// Pop n key/value pairs, push a map.
    Map(u32),
    /// Pop one, push the result.
    Unary(UnaryOp),
    /// Pop right then left, push the result.
    Binary(BinaryOp),
    /// Pop keyword values (kwarg set), positional arguments and the callee; call it.
    Call {
        /// Positional arguments.
        args: u32,
        /// Keyword-name set, or `u32::MAX` for none.
        kwargs: u32,
    },
    /// Pop arguments and the value, push the filter's result.
    Filter {
        /// The filter.
        name: Sym,
        /// Positional arguments.
        args: u32,
        /// Keyword-name set, or `u32::MAX`.
        kwargs: u32,
    },
    /// Pop arguments and the value, push the test's boolean.
    Test {
        /// The test.
        name: Sym,
        /// Positional arguments.
        args: u32,
        /// `is not`.
        negated: bool,
    },
    /// Jump.
    Jump(Pc),
    /// Pop; jump when false.
    JumpIfFalse(Pc),
    /// If the top is false jump (keeping it), else pop (`and`).
    JumpIfFalseOrPop(Pc),
    /// If the top is true jump (keeping it), else pop (`or`).
    JumpIfTrueOrPop(Pc),
    /// Pop an iterable and start a loop over it (provides `loop`); the
    /// loop variables, listed, get their values from before it back when
    /// it ends (they exist only inside it).
    PushLoop(Vec<Sym>),
    /// Push the next item, or end the loop by jumping.
    Iterate(Pc),
    /// Pop an item and push its `n` parts (unpacking when n > 1; the item
    /// itself when n = 1); `Store`s follow, last variable first.
    Unpack(u32),
    /// Leave the loop; jump when it ran at least once (skipping `else`).
    PopLoop(Pc),
    /// Generate into the prompt with the options in option set `opts` (values
    /// on the stack), storing the value.
    Gen {
        /// Where the value goes.
        target: Option<Store>,
        /// Option set.
        opts: u32,
    },
    /// Choose among the strings of a list (on the stack below the options).
    SelectIn {
        /// Where the value goes.
        target: Option<Store>,
        /// Option set.
        opts: u32,
    },
    /// Choose a branch of branch table `branches` and jump to it; the branch
    /// ends by jumping to the matching [`Instr::SelectEnd`].
    SelectBegin {
        /// Option set.
        opts: u32,
        /// Branch table.
        branches: u32,
    },
    /// Store what the chosen branch emitted.
    SelectEnd {
        /// Where the value goes.
        target: Option<Store>,
    },
    /// Pop a role name and open that role.
    RoleBegin,
    /// Close the role.
    RoleEnd,
    /// Start capturing emitted text.
    CaptureBegin,
    /// Store the captured text.
    CaptureEnd(Store),
    /// Start a hidden section.
    HiddenBegin,
    /// Remove the hidden section's text from the model state, keeping captures.
    HiddenEnd,
    /// Bind a function (popping its default values).
    DefineFunction(u32),
    /// Return from a function.
    Return,
    /// Bind a grammar.
    DefineGrammar(u32),
    /// Run an imported module (its index in `imports`) and bind it to a name.
    Import {
        /// Index into `imports`.
        module: u32,
        /// The alias.
        alias: Sym,
    },
    /// Bind an input variable given from outside; error when not given.
    Input(Sym),
    /// Bind an input given from outside and jump; else fall through to its default.
    InputOr {
        /// The input.
        name: Sym,
        /// Where to continue when it was given.
        skip: Pc,
    },
    /// End of the module.
    Halt,
}

impl CodeModule {
    /// The branches of branch table `table` (a `{% select %}…{% or %}…`):
    /// each one's leading template text, how many `Text` instructions that
    /// spans, and whether the text is all of it; and the pc of the
    /// [`Instr::SelectEnd`] they jump to.
    pub fn select_branches(&self, table: u32) -> (Vec<(String, usize, bool)>, usize) {
        let mut branches = Vec::new();
        let mut end = 0;
        for &e in &self.branch_tables[table as usize] {
            let (mut text, mut pc) = (String::new(), e as usize);
            while let Some(Instr::Text(c)) = self.code.get(pc) {
                if let Const::Str(s) = &self.consts[*c as usize] {
                    text.push_str(s);
                }
                pc += 1;
            }
            let literal = matches!(self.code.get(pc), Some(Instr::Jump(to)) if matches!(self.code.get(*to as usize), Some(Instr::SelectEnd { .. })));
            if let Some(Instr::Jump(to)) = self.code.get(pc) {
                end = *to as usize;
            }
            branches.push((text, pc - e as usize, literal));
        }
        (branches, end)
    }
}
