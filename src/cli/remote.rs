//! `remote`: how to hand this broker's socket to an agent over SSH or in a container.

use crate::sys::config::Config;
use std::process::ExitCode;

/// Prints the forwards and mounts for `remote_socket` on the other side.
pub fn command(config: &Config, remote_socket: &std::path::Path) -> ExitCode {
    let here = config.socket_to_dial();
    let there = remote_socket.display();
    println!("# This broker's socket: {}", here.display());
    println!("# Over SSH (the agent runs on the remote host; this machine has the editor):");
    println!("ssh -R {there}:{} user@devbox", here.display());
    println!("#   then, on devbox: export PI_IDE_BROKER_SOCKET={there}");
    println!("#   (sshd needs StreamLocalBindUnlink yes to reuse the path)");
    println!("# Docker (the agent runs in a container):");
    println!(
        "docker run -v {}:{there} -e PI_IDE_BROKER_SOCKET={there} …",
        here.display()
    );
    println!("# devcontainer.json:");
    println!(
        "\"mounts\": [\"source={},target={there},type=bind\"], \"containerEnv\": {{\"PI_IDE_BROKER_SOCKET\": \"{there}\"}}",
        here.display()
    );
    println!("# A container's root is another uid: allow it with allow_uids = [0] in the config.");
    if config.remote.is_empty() {
        println!("# No [[remote]] path maps yet; add one per mounted folder, e.g.:");
        println!("#   [[remote]]\n#   name = \"box\"\n#   agent = \"/workspaces/app\"\n#   host = \"/home/me/src/app\"");
    } else {
        for r in &config.remote {
            println!(
                "# remote {:?}: {} (agent) = {} (here)",
                r.name,
                r.agent.display(),
                r.host.display()
            );
        }
        println!("# Agents say which remote they are: pi-ide-broker mcp --remote NAME, or remote=NAME on /v1/session.");
    }
    ExitCode::SUCCESS
}
