//! What every layer stands on: config, logging, allocator, the lock helper, secrets, WSL facts.
//!
//! Configuration and paths, logging, the allocator, the one lock helper, secrets, and the
//! facts of a WSL distro facing Windows. Uses `protocol` (the config's editor families,
//! `[[remote]]` path maps, Windows paths) and `platform` (who we are, process facts).

pub mod config;
pub mod logging;
pub mod secret;
pub mod sync;
pub mod time;
pub mod wsl;
