//! The broker inside WSL, facing a Windows machine: what it needs to know of that machine.
//!
//! Where its drives are mounted, which distro this is, where the Windows user's profile is, and
//! how to reach Windows' loopback.
//!
//! Read once from the environment and the files WSL writes. Each fact can be set by hand
//! (`PI_IDE_BROKER_WSL_MOUNT_ROOT`, `PI_IDE_BROKER_WINDOWS_HOME`, `PI_IDE_BROKER_WINDOWS_HOST`)
//! for a setup WSL does not describe, and for the tests, which run on plain Linux.

use crate::protocol::winpath::Wsl;
use std::net::Ipv4Addr;
use std::path::PathBuf;

/// True when this process runs inside WSL (its interop marker or `WSL_DISTRO_NAME`).
pub(crate) fn inside() -> bool {
    std::env::var_os("WSL_DISTRO_NAME").is_some()
        || std::path::Path::new("/proc/sys/fs/binfmt_misc/WSLInterop").exists()
}

/// This side's view of Windows paths: the drives' mount root (`/etc/wsl.conf`'s
/// `[automount] root`, default `/mnt`) and the distro's name. Read once.
pub(crate) fn here() -> &'static Wsl {
    static HERE: std::sync::OnceLock<Wsl> = std::sync::OnceLock::new();
    HERE.get_or_init(|| Wsl {
        mount_root: mount_root(),
        distro: std::env::var("WSL_DISTRO_NAME")
            .ok()
            .filter(|d| !d.is_empty()),
    })
}

fn mount_root() -> String {
    if let Ok(root) = std::env::var("PI_IDE_BROKER_WSL_MOUNT_ROOT") {
        return root.trim_end_matches('/').to_string();
    }
    std::fs::read_to_string("/etc/wsl.conf")
        .ok()
        .and_then(|text| automount_root(&text))
        .unwrap_or_else(|| "/mnt".into())
}

/// `root = /x/` under `[automount]` in a wsl.conf, without its trailing slash.
pub(crate) fn automount_root(conf: &str) -> Option<String> {
    let mut in_automount = false;
    for line in conf.lines().map(str::trim) {
        if line.starts_with('[') {
            in_automount = line.eq_ignore_ascii_case("[automount]");
        } else if let (true, Some((k, v))) = (in_automount, line.split_once('=')) {
            if k.trim() == "root" {
                let v = v.trim().trim_matches('"').trim_end_matches('/');
                return Some(if v.is_empty() {
                    "/".into()
                } else {
                    v.to_string()
                });
            }
        }
    }
    None
}

/// The Windows user's profile as WSL sees it (`/mnt/c/Users/me`): `PI_IDE_BROKER_WINDOWS_HOME`,
/// else `%USERPROFILE%` asked of Windows through interop (`cmd.exe`), mapped. `None` outside
/// WSL or when Windows does not answer.
pub(crate) fn windows_home() -> Option<PathBuf> {
    static HOME: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    HOME.get_or_init(ask_windows_home).clone()
}

fn ask_windows_home() -> Option<PathBuf> {
    if let Some(h) = std::env::var_os("PI_IDE_BROKER_WINDOWS_HOME").filter(|h| !h.is_empty()) {
        return Some(PathBuf::from(h));
    }
    if !inside() {
        return None;
    }
    let out = std::process::Command::new("cmd.exe")
        .args(["/d", "/c", "echo %USERPROFILE%"])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .current_dir("/")
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    here().to_linux(text.trim()).map(PathBuf::from)
}

/// Where a Windows editor's loopback port is reached from here: `PI_IDE_BROKER_WINDOWS_HOST`,
/// else first `127.0.0.1` (WSL's mirrored networking shares Windows' loopback), then the
/// default gateway (NAT mode: the Windows host), in that order.
pub(crate) fn windows_hosts() -> Vec<Ipv4Addr> {
    if let Some(h) = std::env::var("PI_IDE_BROKER_WINDOWS_HOST")
        .ok()
        .and_then(|h| h.parse().ok())
    {
        return vec![h];
    }
    let mut hosts = vec![Ipv4Addr::LOCALHOST];
    if let Some(gw) = std::fs::read_to_string("/proc/net/route")
        .ok()
        .and_then(|t| default_gateway(&t))
    {
        hosts.push(gw);
    }
    hosts
}

/// The default route's gateway in `/proc/net/route` (hex, little-endian), if any.
pub(crate) fn default_gateway(route: &str) -> Option<Ipv4Addr> {
    route.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 3 || f[1] != "00000000" {
            return None;
        }
        let raw = u32::from_str_radix(f[2], 16).ok().filter(|g| *g != 0)?;
        Some(Ipv4Addr::from(raw.to_le_bytes()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wsl_conf_moves_the_drives() {
        let conf = "[boot]\nsystemd=true\n[automount]\nenabled = true\nroot = /win/\n[network]\nroot=/nope\n";
        assert_eq!(automount_root(conf).as_deref(), Some("/win"));
        assert_eq!(automount_root("[network]\nroot = /x\n"), None);
        assert_eq!(
            automount_root("[automount]\nroot = \"/\"\n").as_deref(),
            Some("/")
        );
    }

    #[test]
    fn the_default_gateway_is_read_from_the_route_table() {
        // As WSL 2 in NAT mode shows it: default via 172.29.176.1 on eth0.
        let route =
            "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
eth0\t00B01DAC\t00000000\t0001\t0\t0\t0\t00F0FFFF\t0\t0\t0\n\
eth0\t00000000\t01B01DAC\t0003\t0\t0\t0\t00000000\t0\t0\t0\n";
        assert_eq!(default_gateway(route), Some(Ipv4Addr::new(172, 29, 176, 1)));
        assert_eq!(default_gateway("Iface\tDestination\tGateway\n"), None);
    }
}
