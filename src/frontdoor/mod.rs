//! The ways in. Every door ends in [`crate::session::run`].

pub mod compat;
pub mod native;
pub mod socket;
pub mod stdio;
