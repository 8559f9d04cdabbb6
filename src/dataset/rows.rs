//! The rows of a dataset run: input lines read into rows (a bad line is a
//! row whose error is known before any model work), and the records of an
//! earlier run read back to resume it.

use std::collections::HashSet;
use std::io::{BufRead, Seek, Write};

use indexmap::IndexMap;
use serde_json::Value as J;

use crate::interp::value::Value;
use crate::interp::InputDecl;

/// Longest input line read (bytes): a longer one is that row's error, and
/// memory stays bounded whatever the file holds.
pub const MAX_LINE: usize = 64 << 20;

/// One input row.
#[derive(Debug, Clone)]
pub struct Row {
    /// 1-based line number in the input.
    pub line: usize,
    /// The row's `id`, else its line number; `null` for a duplicate id.
    pub id: J,
    /// The input values, or why the line is not a row.
    pub inputs: Result<IndexMap<String, Value>, String>,
}

impl Row {
    /// The key resume matches records by.
    pub fn key(&self) -> RowKey {
        RowKey::of(&self.id, self.line)
    }
}

/// What identifies a row across runs: its id, or (ids being unusable, as
/// for a duplicate) its line.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RowKey {
    /// The id, as canonical JSON text.
    Id(String),
    /// The line of a row without a usable id.
    Line(usize),
}

impl RowKey {
    fn of(id: &J, line: usize) -> RowKey {
        if id.is_null() {
            RowKey::Line(line)
        } else {
            RowKey::Id(id.to_string())
        }
    }
}

/// Reads rows from JSON lines: each an object of input values with an
/// optional `id` (a string or a number; the line number when absent).
/// Blank lines are skipped.
pub struct JsonlRows<R> {
    input: R,
    line: usize,
    maker: RowMaker,
}

/// Turns an object of values into a row: its id (checked, unique), its
/// inputs.
pub(super) struct RowMaker {
    seen: HashSet<String>,
    /// Input names the template declares (an `id` among them is an input too).
    declared: Vec<InputDecl>,
}

impl RowMaker {
    pub(super) fn new(declared: Vec<InputDecl>) -> RowMaker {
        RowMaker { seen: HashSet::new(), declared }
    }

    /// The row of line `line` holding `object`.
    pub(super) fn row(&mut self, line: usize, object: serde_json::Map<String, J>) -> Row {
        let id_is_input = self.declared.iter().any(|d| d.name == "id");
        let id = match object.get("id") {
            None => J::from(line),
            Some(v @ (J::String(_) | J::Number(_))) => v.clone(),
            Some(other) => {
                let error = format!("line {line}: `id` must be a string or a number, not `{other}`");
                return Row { line, id: J::from(line), inputs: Err(error) };
            }
        };
        if !self.seen.insert(id.to_string()) {
            return Row { line, id: J::Null, inputs: Err(format!("line {line}: the id {id} was used by an earlier row")) };
        }
        let mut inputs = IndexMap::new();
        for (k, v) in object {
            if k != "id" || id_is_input {
                inputs.insert(k, Value::from_json(&v));
            }
        }
        Row { line, id, inputs: Ok(inputs) }
    }
}

impl<R: BufRead> JsonlRows<R> {
    /// Rows of `input` for a template that declares `declared`.
    pub fn new(input: R, declared: Vec<InputDecl>) -> JsonlRows<R> {
        JsonlRows { input, line: 0, maker: RowMaker::new(declared) }
    }

    /// The next line's row; `Err` when the input cannot be read.
    fn next_row(&mut self) -> Option<std::io::Result<Row>> {
        loop {
            let mut buf = Vec::new();
            let n = match std::io::Read::take(&mut self.input, MAX_LINE as u64 + 1).read_until(b'\n', &mut buf) {
                Ok(n) => n,
                Err(e) => return Some(Err(e)),
            };
            if n == 0 {
                return None;
            }
            self.line += 1;
            let line = self.line;
            if buf.len() > MAX_LINE {
                // Skip the rest of the overlong line.
                let skipped = skip_line(&mut self.input);
                if let Err(e) = skipped {
                    return Some(Err(e));
                }
                let error = format!("line {line} is longer than {} MiB", MAX_LINE >> 20);
                return Some(Ok(Row { line, id: J::from(line), inputs: Err(error) }));
            }
            let text = String::from_utf8_lossy(&buf);
            if text.trim().is_empty() {
                continue;
            }
            return Some(Ok(self.parse(line, text.trim())));
        }
    }

    fn parse(&mut self, line: usize, text: &str) -> Row {
        match serde_json::from_str::<J>(text) {
            Ok(J::Object(o)) => self.maker.row(line, o),
            Ok(_) => Row { line, id: J::from(line), inputs: Err(format!("line {line} is not a JSON object of input values")) },
            Err(e) => Row { line, id: J::from(line), inputs: Err(format!("line {line} is not JSON: {e}")) },
        }
    }
}

impl<R: BufRead> Iterator for JsonlRows<R> {
    type Item = std::io::Result<Row>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_row()
    }
}

pub(super) fn skip_line(r: &mut impl BufRead) -> std::io::Result<()> {
    loop {
        let buf = r.fill_buf()?;
        if buf.is_empty() {
            return Ok(());
        }
        if let Some(i) = buf.iter().position(|&b| b == b'\n') {
            r.consume(i + 1);
            return Ok(());
        }
        let n = buf.len();
        r.consume(n);
    }
}

/// Checks a row's values against the template's inputs (before any model
/// work): every name must be declared, every input without a default given.
pub fn check_inputs(values: &IndexMap<String, Value>, declared: &[InputDecl]) -> Result<(), String> {
    if let Some((_, message)) = crate::interp::undeclared_input(values.keys(), declared) {
        return Err(message);
    }
    if let Some(d) = declared.iter().find(|d| !d.has_default && !values.contains_key(&d.name)) {
        return Err(format!("the input `{}` was not given", d.name));
    }
    Ok(())
}

/// The rows an earlier run already recorded in `file`, by key. A last line
/// cut short (the run was killed while writing it) is removed from the
/// file, so that every line stays one whole record.
pub fn recorded(file: &mut std::fs::File) -> std::io::Result<HashSet<RowKey>> {
    file.rewind()?;
    let mut reader = std::io::BufReader::new(&mut *file);
    let mut keys = HashSet::new();
    let mut good_end = 0u64;
    let mut at = 0u64;
    loop {
        let mut buf = Vec::new();
        let n = reader.read_until(b'\n', &mut buf)?;
        if n == 0 {
            break;
        }
        at += n as u64;
        let whole = buf.last() == Some(&b'\n');
        match serde_json::from_slice::<J>(&buf) {
            Ok(J::Object(o)) if whole => {
                let line = o.get("line").and_then(J::as_u64).unwrap_or(0) as usize;
                keys.insert(RowKey::of(o.get("id").unwrap_or(&J::Null), line));
                good_end = at;
            }
            // A blank line is harmless.
            _ if whole && buf.iter().all(u8::is_ascii_whitespace) => good_end = at,
            _ if !whole => break,
            _ => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "a line in the middle is not a record: not an output of `lmt run --inputs`",
                ))
            }
        }
    }
    drop(reader);
    if good_end < at {
        file.set_len(good_end)?;
    }
    file.seek(std::io::SeekFrom::End(0))?;
    file.flush()?;
    Ok(keys)
}
