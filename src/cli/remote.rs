//! `remote`: how to hand an agent elsewhere its `[[remote]]`'s own socket (SSH, containers).
//!
//! Each `[[remote]]` name has a socket of its own that carries an agent's rights only
//! (`frontdoor::rights`): what this prints. The main socket is never printed for another
//! host or a container: through it the owner follows and steers every pi session.

use crate::sys::config::Config;
use std::path::Path;
use std::process::ExitCode;

/// Where the agent's side finds the socket: `ssh` the path an `ssh -R` forward makes on the
/// other host; `mount` the dir a container mounts the socket's dir at.
pub(super) struct There<'a> {
    /// The forwarded socket's path on the remote host.
    pub ssh: &'a Path,
    /// The mount point of the socket's dir in a container.
    pub mount: &'a Path,
}

/// Prints, for `only` (or every remote), its socket and the forward or mount that hands it
/// to the other side.
pub(super) fn command(
    config: &Config,
    config_path: Option<&Path>,
    only: Option<&str>,
    there: There<'_>,
) -> ExitCode {
    if cfg!(windows) {
        eprintln!(
            "`[[remote]]` sockets (for containers and ssh) are not available on Windows: their path maps \
             are POSIX paths. For an agent in WSL, run the broker in WSL: it reaches the Windows \
             editors itself (docs/windows.md)."
        );
        return ExitCode::FAILURE;
    }
    let file = config_path.map_or_else(
        || "the config file".to_string(),
        |p| p.display().to_string(),
    );
    let main = config.socket_to_dial();
    // A socket in a dir that is not the user's is not theirs to hand out (issue 61).
    if let Err(e) = crate::platform::local::trusted_path(&main) {
        eprintln!("error: will not print sockets of {}: {e}", main.display());
        return ExitCode::FAILURE;
    }
    let names: Vec<String> = config
        .remote_names()
        .into_iter()
        .filter(|n| only.is_none_or(|o| o == n))
        .collect();
    if names.is_empty() {
        return no_remote(&file, only);
    }
    for name in &names {
        print_remote(config, &main, name, &there);
        println!();
    }
    println!(
        "# A container whose processes run as another uid (a rootful container's root is uid 0)"
    );
    println!("# needs allow_uids = [that uid]; it still gets an agent's rights only.");
    println!(
        "# Never hand out the main socket ({}): through it the owner follows and steers every pi session.",
        main.display()
    );
    ExitCode::SUCCESS
}

/// What a user without the `[[remote]]` asked for is told (exit status 2).
fn no_remote(file: &str, only: Option<&str>) -> ExitCode {
    match only {
        Some(name) => eprintln!(
            "pi-ide-broker remote: no [[remote]] named {name:?} in {file}; add one (below) and restart the broker"
        ),
        None => eprintln!(
            "pi-ide-broker remote: no [[remote]] in {file}; add one per folder the agent sees, then restart the broker:"
        ),
    }
    eprintln!("  [[remote]]\n  name = \"box\"\n  agent = \"/workspaces/app\"   # the folder as the agent sees it\n  host = \"/home/me/src/app\"    # the same folder here");
    eprintln!("Each remote gets a socket of its own, with an agent's rights only.");
    ExitCode::from(2)
}

/// One remote's socket and the lines that hand it over.
fn print_remote(config: &Config, main: &Path, name: &str, there: &There<'_>) {
    let sock = Config::remote_socket(main, name);
    let dir = sock.parent().unwrap_or(Path::new("/"));
    println!("# [[remote]] {name:?}");
    for r in config.remote.iter().filter(|r| r.name == name) {
        println!(
            "#   {} (the agent's) = {} (here)",
            r.agent.display(),
            r.host.display()
        );
    }
    println!(
        "# Its socket, with an agent's rights only (its own sessions, on the editor of its own folder):"
    );
    println!("#   {}", sock.display());
    if !sock.exists() {
        println!("#   (not there yet: the broker makes it when it starts; restart it after adding a remote)");
    }
    println!("# Over SSH (the agent runs on devbox, the editor here):");
    println!(
        "ssh -R {}:{} user@devbox",
        there.ssh.display(),
        sock.display()
    );
    println!(
        "#   then, on devbox: export PI_IDE_BROKER_SOCKET={}   (sshd: StreamLocalBindUnlink yes)",
        there.ssh.display()
    );
    let inside = there.mount.join("sock");
    println!("# Docker (mount the socket's dir: it outlives a broker restart, the socket file does not):");
    println!(
        "docker run -v {}:{} -e PI_IDE_BROKER_SOCKET={} …",
        dir.display(),
        there.mount.display(),
        inside.display()
    );
    println!("# devcontainer.json:");
    println!(
        "\"mounts\": [\"source={},target={},type=bind\"], \"containerEnv\": {{\"PI_IDE_BROKER_SOCKET\": \"{}\"}}",
        dir.display(),
        there.mount.display(),
        inside.display()
    );
}
