//! Confinement of the processes a world starts, below every environment: the sandbox they
//! enter before `exec` (`confinement.rs`), made at a world's first process (`lazy.rs`), the
//! keeper that finds and kills all a command started (`process.rs`), the system calls both
//! make without the C library (`raw.rs`), the unprivileged user a root runner's processes
//! become (`unprivileged.rs`), and the runner's own open-files limit (`resources.rs`).
//! It imports nothing else of the crate.

mod confinement;
mod lazy;
pub mod process;
mod raw;
pub mod resources;
pub mod root;
mod unprivileged;

pub use confinement::{
    Confinement, ConfinementPlan, HIDDEN_BY_DEFAULT, ProcessLimits, SandboxMode, SandboxSpec, check,
};
pub use lazy::LazyConfinement;
