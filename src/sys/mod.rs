//! What every layer stands on: config, logging, allocator, the lock helper, secrets, OS facts.
//!
//! Configuration and paths, logging, the allocator, the one lock helper, secrets, and what the
//! OS says of processes and ports. Uses only `protocol` (the config's editor families and
//! `[[remote]]` path maps).

pub mod allocator;
pub mod config;
pub mod logging;
pub mod secret;
pub mod sync;
pub mod time;
