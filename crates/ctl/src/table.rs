//! Aligned tables for terminal output; status words are coloured when
//! stdout is a terminal.

use std::sync::atomic::{AtomicBool, Ordering};

static COLOUR: AtomicBool = AtomicBool::new(false);

pub fn set_colour(on: bool) {
    COLOUR.store(on, Ordering::Relaxed);
}

/// ANSI colour for a status word: green when healthy, yellow on the way,
/// red when something is wrong.
fn paint(cell: &str, padded: String) -> String {
    let code = match cell {
        "ready" | "leader" | "voter" => "32",
        "placed" | "starting" | "loading" | "draining" | "stopping" | "candidate" | "cordoned"
        | "learner" => "33",
        "unreachable" | "lost" | "failed" | "disconnected" => "31",
        _ => return padded,
    };
    format!("\x1b[{code}m{padded}\x1b[0m")
}

pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: &[&str]) -> Self {
        Self {
            header: header.iter().map(|h| (*h).to_owned()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let columns = self.header.len();
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate().take(columns) {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
        let line = |cells: &[String]| {
            let padded: Vec<String> = cells
                .iter()
                .enumerate()
                .map(|(i, cell)| {
                    let padded = format!("{cell:<width$}", width = widths[i]);
                    if COLOUR.load(Ordering::Relaxed) {
                        paint(cell, padded)
                    } else {
                        padded
                    }
                })
                .collect();
            padded.join("  ").trim_end().to_owned()
        };
        let mut out = line(&self.header);
        out.push('\n');
        for row in &self.rows {
            out.push_str(&line(row));
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_aligned_to_the_widest_cell() {
        let mut table = Table::new(&["ID", "ROLE"]);
        table.row(vec!["1".into(), "leader".into()]);
        table.row(vec!["12".into(), "follower".into()]);
        assert_eq!(table.render(), "ID  ROLE\n1   leader\n12  follower\n");
    }
}
