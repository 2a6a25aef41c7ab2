//! `runner`: runs LLM agents through episodes in environments, in batches, and reports how
//! well they did. See `ARCHITECTURE.md` for the map of this crate.

pub mod agent;
pub mod allocator;
pub mod batch;
pub mod budget;
pub mod cli;
pub mod config;
pub mod domain;
pub mod environment;
pub mod gateway;
pub mod image;
pub mod log;
pub mod model;
pub mod report;
pub mod scoring;
pub mod serve;
pub mod suite;
pub mod view;

// The two crates of the workspace, under the names the rest of the code uses.
pub use runner_contract as contract;
pub use runner_sandbox as sandbox;
