//! A YAML document as a tree whose every node remembers where it came from.

use std::fmt;

use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::{Marker, TScalarStyle};

/// A 1-based line and column in the source text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Pos {
    pub line: u32,
    pub col: u32,
}

impl Pos {
    fn from_marker(mark: Marker) -> Self {
        Pos {
            line: u32::try_from(mark.line()).unwrap_or(u32::MAX),
            col: u32::try_from(mark.col() + 1).unwrap_or(u32::MAX),
        }
    }
}

impl fmt::Display for Pos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.col)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub pos: Pos,
    pub value: Value,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// An empty value, `~` or `null`.
    Null,
    /// Any scalar. `quoted` distinguishes `"5"` (a string) from `5`.
    Scalar {
        text: String,
        quoted: bool,
    },
    Seq(Vec<Node>),
    Map(Vec<Entry>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub key: String,
    pub key_pos: Pos,
    pub value: Node,
}

impl Node {
    /// How a value is described in "expected X, found Y" messages.
    pub fn describe(&self) -> String {
        match &self.value {
            Value::Null => "nothing".to_string(),
            Value::Scalar { text, .. } => format!("{text:?}"),
            Value::Seq(_) => "a list".to_string(),
            Value::Map(_) => "a mapping".to_string(),
        }
    }

    pub fn is_null(&self) -> bool {
        matches!(self.value, Value::Null)
    }
}

/// A syntax error, before any field could be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{pos}: {message}")]
pub struct SyntaxError {
    pub pos: Pos,
    pub message: String,
}

/// The deepest nesting of lists and mappings a document may have. llmgw's
/// own files nest a handful of levels; the limit keeps a hostile document
/// from exhausting the stack of whatever walks the tree.
pub const MAX_DEPTH: usize = 64;

/// The largest document llmgw reads, in bytes: far above any real config or
/// catalog, far below what would hurt a peer that parses it.
pub const MAX_BYTES: usize = 4 << 20;

/// Parses the first document of `src`. An empty file is an empty mapping's
/// worth of nothing: `Value::Null` at 1:1. Refuses documents over
/// [`MAX_BYTES`], nested deeper than [`MAX_DEPTH`], or using aliases, so no
/// input can make parsing or decoding overflow the stack or blow up.
pub fn parse(src: &str) -> Result<Node, SyntaxError> {
    if src.len() > MAX_BYTES {
        return Err(SyntaxError {
            pos: Pos { line: 1, col: 1 },
            message: format!(
                "the document is {} bytes; llmgw reads at most {MAX_BYTES} bytes (4 MiB)",
                src.len()
            ),
        });
    }
    let mut builder = TreeBuilder::default();
    let mut parser = Parser::new_from_str(src);
    // Events are pulled one at a time rather than through the parser's
    // `load`, which recurses once per nesting level before any limit can act.
    loop {
        let (event, mark) = parser.next_token().map_err(|err| SyntaxError {
            pos: Pos::from_marker(*err.marker()),
            // The scanner looks ahead through flow collections and has a
            // nesting limit of its own; say it the same way.
            message: if err.info().contains("recursion limit") {
                too_deep()
            } else {
                err.info().to_string()
            },
        })?;
        if matches!(event, Event::DocumentEnd | Event::StreamEnd) {
            break;
        }
        builder.on_event(event, mark);
        if let Some(problem) = builder.unsupported.take() {
            return Err(problem);
        }
        if builder.stack.len() > MAX_DEPTH {
            return Err(SyntaxError {
                pos: Pos::from_marker(mark),
                message: too_deep(),
            });
        }
    }
    Ok(builder.root.unwrap_or(Node {
        pos: Pos { line: 1, col: 1 },
        value: Value::Null,
    }))
}

fn too_deep() -> String {
    format!("lists and mappings nest deeper than {MAX_DEPTH} levels; llmgw refuses such documents")
}

/// Containers being built, innermost last. A mapping alternates between
/// expecting a key and expecting that key's value.
enum Open {
    Seq(Node),
    Map {
        node: Node,
        pending_key: Option<(String, Pos)>,
    },
}

#[derive(Default)]
struct TreeBuilder {
    stack: Vec<Open>,
    root: Option<Node>,
    unsupported: Option<SyntaxError>,
}

impl TreeBuilder {
    fn push_finished(&mut self, node: Node) {
        match self.stack.last_mut() {
            None => {
                if self.root.is_none() {
                    self.root = Some(node);
                }
            }
            Some(Open::Seq(seq)) => {
                if let Value::Seq(items) = &mut seq.value {
                    items.push(node);
                }
            }
            Some(Open::Map {
                node: map,
                pending_key,
            }) => match pending_key.take() {
                None => {
                    let key = match &node.value {
                        Value::Scalar { text, .. } => text.clone(),
                        Value::Null => String::new(),
                        _ => {
                            self.unsupported.get_or_insert(SyntaxError {
                                pos: node.pos,
                                message: "mapping keys must be plain strings".to_string(),
                            });
                            String::new()
                        }
                    };
                    *pending_key = Some((key, node.pos));
                }
                Some((key, key_pos)) => {
                    if let Value::Map(entries) = &mut map.value {
                        entries.push(Entry {
                            key,
                            key_pos,
                            value: node,
                        });
                    }
                }
            },
        }
    }
}

impl MarkedEventReceiver for TreeBuilder {
    fn on_event(&mut self, event: Event, mark: Marker) {
        let pos = Pos::from_marker(mark);
        match event {
            Event::Scalar(text, style, _, _) => {
                let quoted = !matches!(style, TScalarStyle::Plain);
                let value =
                    if !quoted && matches!(text.as_str(), "" | "~" | "null" | "Null" | "NULL") {
                        Value::Null
                    } else {
                        Value::Scalar { text, quoted }
                    };
                self.push_finished(Node { pos, value });
            }
            Event::SequenceStart(..) => self.stack.push(Open::Seq(Node {
                pos,
                value: Value::Seq(Vec::new()),
            })),
            Event::MappingStart(..) => self.stack.push(Open::Map {
                node: Node {
                    pos,
                    value: Value::Map(Vec::new()),
                },
                pending_key: None,
            }),
            Event::SequenceEnd | Event::MappingEnd => {
                if let Some(Open::Seq(mut node) | Open::Map { mut node, .. }) = self.stack.pop() {
                    // The parser marks a block mapping where its first value
                    // starts; its first key is where a reader looks.
                    if let Value::Map(entries) = &node.value
                        && let Some(first) = entries.first()
                    {
                        node.pos = first.key_pos;
                    }
                    self.push_finished(node);
                }
            }
            Event::Alias(_) => {
                self.unsupported.get_or_insert(SyntaxError {
                    pos,
                    message:
                        "YAML aliases (*name) are not supported in llmgw files; write the value out"
                            .to_string(),
                });
            }
            Event::Nothing
            | Event::StreamStart
            | Event::StreamEnd
            | Event::DocumentStart
            | Event::DocumentEnd => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_are_one_based_and_point_at_values() {
        let doc = parse("a: 1\nb:\n  - x\n  - \"y\"\n").unwrap();
        let Value::Map(entries) = doc.value else {
            panic!("not a map")
        };
        assert_eq!(entries[0].key, "a");
        assert_eq!(entries[0].value.pos, Pos { line: 1, col: 4 });
        let Value::Seq(items) = &entries[1].value.value else {
            panic!("not a seq")
        };
        assert_eq!(items[1].pos, Pos { line: 4, col: 5 });
        assert_eq!(
            items[1].value,
            Value::Scalar {
                text: "y".into(),
                quoted: true
            }
        );
    }

    #[test]
    fn json_is_yaml() {
        let doc = parse(r#"{"name": "m", "replicas": 2}"#).unwrap();
        assert!(matches!(doc.value, Value::Map(ref e) if e.len() == 2));
    }

    #[test]
    fn syntax_errors_carry_a_position() {
        let err = parse("a: [1, 2\nb: 3\n").unwrap_err();
        assert!(err.pos.line >= 1, "{err}");
    }

    #[test]
    fn deep_nesting_is_refused_without_exhausting_the_stack() {
        // 60 KB of nested block sequences: the parser used to recurse once
        // per level and abort the process.
        let block = "- ".repeat(30_000) + "x\n";
        let err = parse(&block).unwrap_err();
        assert!(err.message.contains("deeper than 64 levels"), "{err}");
        let flow = "[".repeat(100_000);
        let err = parse(&flow).unwrap_err();
        assert!(err.message.contains("deeper than 64 levels"), "{err}");
        let json = "{\"a\":".repeat(10_000) + "1" + &"}".repeat(10_000);
        let err = parse(&json).unwrap_err();
        assert!(err.message.contains("deeper than 64 levels"), "{err}");
    }

    #[test]
    fn nesting_up_to_the_limit_is_read() {
        let doc = "[".repeat(MAX_DEPTH) + &"]".repeat(MAX_DEPTH);
        let mut node = parse(&doc).unwrap();
        let mut depth = 1;
        while let Value::Seq(mut items) = node.value {
            let Some(inner) = items.pop() else { break };
            node = inner;
            depth += 1;
        }
        assert_eq!(depth, MAX_DEPTH);
    }

    #[test]
    fn oversized_documents_are_refused_before_parsing() {
        let big = format!("a: \"{}\"\n", "x".repeat(MAX_BYTES));
        let err = parse(&big).unwrap_err();
        assert!(err.message.contains("at most"), "{err}");
        assert_eq!(err.pos, Pos { line: 1, col: 1 });
    }

    #[test]
    fn only_the_first_document_is_read() {
        let doc = parse("a: 1\n---\nb: 2\n").unwrap();
        assert!(matches!(doc.value, Value::Map(ref e) if e.len() == 1 && e[0].key == "a"));
    }

    #[test]
    fn aliases_are_refused() {
        let err = parse("a: &x 1\nb: *x\n").unwrap_err();
        assert!(err.message.contains("aliases"), "{err}");
    }
}
