//! Rows from CSV (RFC 4180): a header line names the columns; each record
//! is a row whose values are read as `--var` reads them (JSON when the
//! cell parses as JSON, else the text), with an optional `id` column.
//! Quoted cells may hold commas, doubled quotes and line breaks.

use std::io::BufRead;

use serde_json::Value as J;

use super::rows::{skip_line, Row, RowMaker, MAX_LINE};
use crate::interp::InputDecl;

/// A record: the line it starts on, and its cells or why it has none.
type Record = (usize, Result<Vec<String>, String>);

/// Reads rows from CSV.
pub struct CsvRows<R> {
    input: R,
    /// Physical lines read so far.
    line: usize,
    header: Option<Vec<String>>,
    maker: RowMaker,
}

impl<R: BufRead> CsvRows<R> {
    /// Rows of `input` for a template that declares `declared`.
    pub fn new(input: R, declared: Vec<InputDecl>) -> CsvRows<R> {
        CsvRows { input, line: 0, header: None, maker: RowMaker::new(declared) }
    }

    /// The next record's cells and the line it starts on; `None` at the end.
    fn record(&mut self) -> Option<std::io::Result<Record>> {
        let start = self.line + 1;
        let mut cells = Vec::new();
        let mut cell = Vec::new();
        let (mut quoted, mut size, mut any) = (false, 0usize, false);
        loop {
            let mut buf = Vec::new();
            match std::io::Read::take(&mut self.input, MAX_LINE as u64 + 1).read_until(b'\n', &mut buf) {
                Ok(0) if !any => return None,
                Ok(0) => break,
                Ok(_) => {}
                Err(e) => return Some(Err(e)),
            }
            any = true;
            self.line += 1;
            size += buf.len();
            if size > MAX_LINE {
                if let Err(e) = skip_line(&mut self.input) {
                    return Some(Err(e));
                }
                return Some(Ok((start, Err(format!("the record on line {start} is longer than {} MiB", MAX_LINE >> 20)))));
            }
            let mut i = 0;
            while i < buf.len() {
                let b = buf[i];
                match (quoted, b) {
                    (true, b'"') if buf.get(i + 1) == Some(&b'"') => {
                        cell.push(b'"');
                        i += 1;
                    }
                    (true, b'"') => quoted = false,
                    (true, _) => cell.push(b),
                    (false, b'"') if cell.is_empty() => quoted = true,
                    (false, b',') => cells.push(std::mem::take(&mut cell)),
                    (false, b'\n') => {}
                    (false, b'\r') if buf.get(i + 1) == Some(&b'\n') => {}
                    (false, _) => cell.push(b),
                }
                i += 1;
            }
            if !quoted {
                break;
            }
        }
        if quoted {
            return Some(Ok((start, Err(format!("the record on line {start} has a quote that is never closed")))));
        }
        cells.push(cell);
        let text: Result<Vec<String>, String> =
            cells.into_iter().map(|c| String::from_utf8(c).map_err(|_| format!("line {start} is not UTF-8"))).collect();
        Some(Ok((start, text)))
    }

    fn next_row(&mut self) -> Option<std::io::Result<Row>> {
        loop {
            let (line, cells) = match self.record()? {
                Ok(r) => r,
                Err(e) => return Some(Err(e)),
            };
            let cells = match cells {
                Ok(c) => c,
                Err(e) => return Some(Ok(Row { line, id: J::from(line), inputs: Err(e) })),
            };
            if cells.len() == 1 && cells[0].trim().is_empty() {
                continue;
            }
            let Some(header) = &self.header else {
                self.header = Some(cells.iter().map(|c| c.trim().to_string()).collect());
                continue;
            };
            if cells.len() != header.len() {
                let error = format!("line {line} has {} cells; the header names {} columns", cells.len(), header.len());
                return Some(Ok(Row { line, id: J::from(line), inputs: Err(error) }));
            }
            let object = header.iter().cloned().zip(cells.iter().map(|c| cell_value(c))).collect();
            return Some(Ok(self.maker.row(line, object)));
        }
    }
}

/// A cell as `--var` reads a value: JSON when it parses, else the text.
fn cell_value(cell: &str) -> J {
    serde_json::from_str(cell).unwrap_or_else(|_| J::String(cell.to_string()))
}

impl<R: BufRead> Iterator for CsvRows<R> {
    type Item = std::io::Result<Row>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_row()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(text: &str) -> Vec<Row> {
        CsvRows::new(text.as_bytes(), Vec::new()).map(Result::unwrap).collect()
    }

    #[test]
    fn records_quotes_and_line_breaks() {
        let got = rows("id,text,n\r\na,\"hello, \"\"world\"\"\",3\n\nb,\"two\nlines\",x\nc,short\n\"open,1,2\n");
        assert_eq!(got.len(), 4);
        let v = |r: &Row, k: &str| r.inputs.as_ref().unwrap()[k].to_json();
        assert_eq!((got[0].line, &got[0].id), (2, &J::from("a")));
        assert_eq!(v(&got[0], "text"), J::from("hello, \"world\""));
        assert_eq!(v(&got[0], "n"), J::from(3));
        assert_eq!((got[1].line, v(&got[1], "text"), v(&got[1], "n")), (4, J::from("two\nlines"), J::from("x")));
        assert!(got[2].inputs.as_ref().unwrap_err().contains("has 2 cells"), "{:?}", got[2]);
        assert!(got[3].inputs.as_ref().unwrap_err().contains("never closed"), "{:?}", got[3]);
    }
}
