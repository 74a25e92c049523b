//! Helpers shared by the suite, one module per concern: the daemon under test (`broker`),
//! skips and turn-taking (`skips`), held ports (`ports`), the real programs the suite drives
//! (`pi`, `pi_web`, `vscode`, `gemini`, `process`, `git_serve`; `tui` for a terminal program in a
//! pty) and the model APIs they talk
//! to (`scripted_http`, with its dialects `fake_model` and `fake_gemini`).
#![allow(dead_code)]

pub mod broker;
pub mod fake_anthropic;
pub mod fake_gemini;
pub mod fake_model;
pub mod gemini;
pub mod git_serve;
pub mod nvim;
pub mod nvim_editor;
pub mod nvim_plugins;
pub mod pi;
pub mod pi_web;
pub mod ports;
pub mod process;
pub mod scripted_http;
pub mod skips;
pub mod tui;
pub mod vscode;

pub use broker::{compat_entry, editor_by_id, editor_by_port, test_config, TestBroker};
pub use ports::{closed_port, hold_closed};
pub use skips::{cannot_run, machine_heavy};

#[allow(unused_imports)]
pub use pi_ide_broker::testkit::{
    agent::Agent, fake_editor, fake_editor::FakeEditor, fake_editor::Options, WAIT,
};
