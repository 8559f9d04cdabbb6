//! Byte-offset spans, source files and line/column conversion.
//!
//! Every stage keeps byte offsets; lines and columns are computed only at the
//! edges (CLI JSON output, the language server), from a [`LineIndex`].

use std::path::PathBuf;
use std::sync::Arc;

/// A half-open byte range `start..end` in one source file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Span {
    /// First byte.
    pub start: u32,
    /// One past the last byte.
    pub end: u32,
}

impl Span {
    /// The span `start..end`.
    pub fn new(start: usize, end: usize) -> Span {
        debug_assert!(start <= end);
        Span { start: start as u32, end: end as u32 }
    }

    /// An empty span at `offset`.
    pub fn at(offset: usize) -> Span {
        Span::new(offset, offset)
    }

    /// The span covering both `self` and `other`.
    pub fn to(self, other: Span) -> Span {
        Span { start: self.start.min(other.start), end: self.end.max(other.end) }
    }

    /// The span as a `Range<usize>` for slicing.
    pub fn range(self) -> std::ops::Range<usize> {
        self.start as usize..self.end as usize
    }

    /// Length in bytes.
    pub fn len(self) -> usize {
        (self.end - self.start) as usize
    }

    /// True when the span covers no bytes.
    pub fn is_empty(self) -> bool {
        self.start == self.end
    }
}

/// Identifies one file in a [`SourceMap`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct FileId(pub u32);

/// One source file: its name as shown to users, its path if it has one, its text.
#[derive(Debug, Clone)]
pub struct SourceFile {
    /// Name shown in diagnostics (the path as given, or `std/json`).
    pub name: String,
    /// Canonical path on disk, `None` for stdlib modules and in-memory text.
    pub path: Option<PathBuf>,
    /// The text.
    pub text: Arc<str>,
    /// Line starts, for line/column conversion.
    pub lines: LineIndex,
}

impl SourceFile {
    /// A file from its display name, optional path and text.
    pub fn new(name: impl Into<String>, path: Option<PathBuf>, text: impl Into<Arc<str>>) -> Self {
        let text = text.into();
        let lines = LineIndex::new(&text);
        SourceFile { name: name.into(), path, text, lines }
    }
}

/// All files seen while checking one program, indexed by [`FileId`].
#[derive(Debug, Default, Clone)]
pub struct SourceMap {
    files: Vec<SourceFile>,
    /// The folder files named by the program (imports, schema files) must
    /// stay under; `None` when there is no folder (no file, no working directory).
    pub root: Option<PathBuf>,
}

impl SourceMap {
    /// Adds a file and returns its id.
    pub fn add(&mut self, file: SourceFile) -> FileId {
        self.files.push(file);
        FileId(self.files.len() as u32 - 1)
    }

    /// The file with this id.
    pub fn get(&self, id: FileId) -> &SourceFile {
        &self.files[id.0 as usize]
    }

    /// How many files it holds.
    pub fn len(&self) -> usize {
        self.files.len()
    }

    /// True when it holds no file.
    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    /// All files with their ids.
    pub fn iter(&self) -> impl Iterator<Item = (FileId, &SourceFile)> {
        self.files.iter().enumerate().map(|(i, f)| (FileId(i as u32), f))
    }
}

/// A 1-based line and column; the column counts Unicode scalar values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct LineCol {
    /// 1-based line.
    pub line: u32,
    /// 1-based column in characters.
    pub column: u32,
}

/// Byte offsets of line starts, for converting offsets to lines and columns.
#[derive(Debug, Clone, Default)]
pub struct LineIndex {
    starts: Vec<u32>,
}

impl LineIndex {
    /// Indexes the line starts of `text`.
    pub fn new(text: &str) -> Self {
        let mut starts = vec![0];
        starts.extend(text.match_indices('\n').map(|(i, _)| i as u32 + 1));
        LineIndex { starts }
    }

    /// 0-based line of a byte offset.
    pub fn line_of(&self, offset: usize) -> usize {
        match self.starts.binary_search(&(offset as u32)) {
            Ok(i) => i,
            Err(i) => i - 1,
        }
    }

    /// Byte offset where 0-based `line` starts.
    pub fn line_start(&self, line: usize) -> usize {
        self.starts[line.min(self.starts.len() - 1)] as usize
    }

    /// 1-based line and character column of `offset` in `text`. Offsets past
    /// the end or inside a character are clamped to a character boundary.
    pub fn line_col(&self, text: &str, offset: usize) -> LineCol {
        let offset = floor_char_boundary(text, offset);
        let line = self.line_of(offset);
        let start = self.line_start(line);
        let column = text[start..offset].chars().count();
        LineCol { line: line as u32 + 1, column: column as u32 + 1 }
    }

    /// 0-based line and UTF-16 column of `offset`, as the language server
    /// protocol counts them.
    pub fn utf16_position(&self, text: &str, offset: usize) -> (u32, u32) {
        let offset = floor_char_boundary(text, offset);
        let line = self.line_of(offset);
        let start = self.line_start(line);
        let col: usize = text[start..offset].chars().map(char::len_utf16).sum();
        (line as u32, col as u32)
    }

    /// Byte offset of a 0-based line and UTF-16 column; clamped to the line.
    pub fn offset_of_utf16(&self, text: &str, line: u32, col: u32) -> usize {
        if line as usize >= self.starts.len() {
            return text.len();
        }
        let start = self.line_start(line as usize);
        let mut units = 0u32;
        for (i, c) in text[start..].char_indices() {
            if units >= col || c == '\n' {
                return start + i;
            }
            units += c.len_utf16() as u32;
        }
        text.len()
    }
}

/// The largest char boundary at or below `offset` (clamped to `text.len()`).
pub fn floor_char_boundary(text: &str, offset: usize) -> usize {
    let mut o = offset.min(text.len());
    while !text.is_char_boundary(o) {
        o -= 1;
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_col_counts_characters_and_utf16() {
        let text = "ab\n😀x\n";
        let idx = LineIndex::new(text);
        assert_eq!(idx.line_col(text, 0), LineCol { line: 1, column: 1 });
        assert_eq!(idx.line_col(text, 3), LineCol { line: 2, column: 1 });
        // After the emoji (4 bytes): column 2 in characters, 2 in UTF-16 units.
        assert_eq!(idx.line_col(text, 7), LineCol { line: 2, column: 2 });
        assert_eq!(idx.utf16_position(text, 7), (1, 2));
        assert_eq!(idx.offset_of_utf16(text, 1, 2), 7);
        // Inside the emoji: clamped back to its start.
        assert_eq!(idx.line_col(text, 5), LineCol { line: 2, column: 1 });
    }
}
