//! One module per subcommand: its flags (a clap `Args` struct) and what it does.

pub mod compare;
pub mod gpu;
pub mod inspect;
pub mod schedule;
pub mod simulate;
pub mod viz;
