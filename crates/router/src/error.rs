//! Why the router could not start.

use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum RouterError {
    #[error(transparent)]
    Config(#[from] llmgw_config::ConfigError),
    #[error("{file}: cannot read the catalog: {source}")]
    CatalogRead {
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{file}: invalid catalog:\n{message}")]
    CatalogInvalid { file: PathBuf, message: String },
    #[error("api key `{name}`: cannot read {file}: {source}")]
    KeyFile {
        name: String,
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("api key `{name}`: {file} is empty")]
    EmptyKey { name: String, file: PathBuf },
    #[error("control_plane_token_file: cannot read {file}: {source}")]
    ControlPlaneTokenFile {
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("control_plane_token_file: {file} is empty")]
    ControlPlaneEmptyToken { file: PathBuf },
    #[error("control_plane_ca: {0}")]
    ControlPlaneCa(String),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("balancing.tokenizers: model `{model}`: {source}")]
    Tokenizer {
        model: String,
        #[source]
        source: llmgw_tokenizer::TokenizerError,
    },
    #[error("cannot start the async runtime: {0}")]
    Runtime(#[source] std::io::Error),
}
