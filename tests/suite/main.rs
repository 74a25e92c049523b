//! Every integration suite in one test binary: the crate and its dependencies are linked once
//! instead of once per suite (13 links on a 2-core machine). Run one suite with
//! `cargo test --test suite <module>::`, e.g. `cargo test --test suite stdio::`.

// The suite drives Linux processes (namespaces, uids, Debian programs, wine itself): it runs on
// Unix. The Windows build is tested by its own unit tests under wine and by `windows::`.
#![cfg(unix)]

mod common;

mod acp;
mod acp_nvim;
mod acp_nvim_faults;
mod acp_pi;
mod attacks;
mod bridge;
mod broker_core;
mod claudecode_nvim;
mod cli;
mod codex;
mod compat;
mod compat_claude;
mod conformance;
mod copilot;
mod copilot_chat;
mod crash;
mod doctor;
mod editor_quirks;
mod fakes;
mod faults;
mod frames_in_flight;
mod gemini;
mod gemini_cli;
mod hostile;
mod identity;
mod lockdirs;
mod npm_install;
mod opencode;
mod pi_extension;
mod pi_package;
mod pi_web;
mod pty;
mod readme;
mod remote;
mod service;
mod sessions;
mod setup;
mod stdio;
mod toy_door;
mod trust;
mod upgrade;
mod version;
mod vscode;
mod windows;
mod wsl;
