//! The command-line options of each supported engine release, generated
//! from the engines' own argument parsers by `scripts/engine-options`.
