//! How two GPUs of a node reach each other.
