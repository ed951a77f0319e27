//! What llmgw reads from the kernel about processes, and the signals it
//! sends them.
