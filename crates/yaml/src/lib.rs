//! YAML files that report every mistake at once, with position and field path.
//!
//! llmgw's config and catalog files are parsed into a [`Node`] tree that keeps
//! each value's line and column, then decoded field by field with a [`Cx`]
//! that collects [`Problem`]s instead of stopping at the first one. Errors
//! print as `agent.yaml:24:5: fabrics[0].rate_gbps: expected a number, found "fast"`.
//! JSON is a subset of YAML, so request bodies decode through the same path.

mod decode;
mod node;
mod suggest;

pub use decode::{Cx, Decode, Fields, Path, Problem, Problems, format_duration, parse_duration};
pub use node::{Entry, MAX_BYTES, MAX_DEPTH, Node, Pos, SyntaxError, Value, parse};
pub use suggest::closest;

/// Parses `src` and decodes it with `decode`, naming `file` in every problem.
pub fn load<T>(
    file: &str,
    src: &str,
    decode: impl FnOnce(&Node, &mut Cx) -> Option<T>,
) -> Result<T, Problems> {
    let root = parse(src).map_err(|err| Problems {
        file: file.to_string(),
        items: vec![Problem {
            pos: err.pos,
            path: String::new(),
            message: format!("not valid YAML: {}", err.message),
        }],
    })?;
    let mut cx = Cx::new();
    let value = decode(&root, &mut cx);
    cx.finish(file, value)
}
