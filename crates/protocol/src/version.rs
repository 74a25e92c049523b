//! The version rule between the broker and a native client (the pi extension).
//!
//! The client names itself, its version and the native-door protocol revision it speaks on
//! `/v1/session` (`client`, `client_version`, `protocol`); `broker/attached` carries the
//! broker's (`broker: {version, protocol}`). When the revisions differ the broker tells the
//! session once (`broker/notice`), naming the command that updates the older side, and keeps
//! serving it: what both revisions have keeps working. Versions alone never warn.

use serde::{Deserialize, Serialize};

/// The native-door protocol revision this broker speaks. Raise it when a native client could
/// tell the difference (a `broker/*` method or notice added, changed or gone).
pub const PROTOCOL: u32 = 2;

/// What a client says about itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientInfo {
    /// Its name (`pi-ide-broker-pi` for the pi extension).
    pub name: String,
    /// Its version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The protocol revision it speaks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<u32>,
}

/// The broker's side, as `broker/attached` carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BrokerInfo {
    /// This build's version.
    pub version: &'static str,
    /// [`PROTOCOL`].
    pub protocol: u32,
}

/// This broker's [`BrokerInfo`].
pub fn broker_info() -> BrokerInfo {
    BrokerInfo {
        version: env!("CARGO_PKG_VERSION"),
        protocol: PROTOCOL,
    }
}

/// The command that updates the daemon: reinstall, then `setup` restarts the service.
const UPDATE_DAEMON: &str =
    "`cargo install --locked --git <this repository> pi-ide-broker`, then `pi-ide-broker setup`";

/// The notice for a client whose protocol revision differs from the broker's, if it does.
pub fn skew_notice(client: &ClientInfo) -> Option<String> {
    let theirs = client.protocol?;
    let who = match &client.version {
        Some(v) => format!("{} {v}", client.name),
        None => client.name.clone(),
    };
    let ours = format!(
        "the pi-ide-broker daemon {} (protocol {PROTOCOL})",
        env!("CARGO_PKG_VERSION")
    );
    match theirs.cmp(&PROTOCOL) {
        std::cmp::Ordering::Equal => None,
        std::cmp::Ordering::Greater => Some(format!(
            "{ours} is older than {who} (protocol {theirs}); update the daemon: {UPDATE_DAEMON}. Until then what both speak keeps working."
        )),
        std::cmp::Ordering::Less => Some(format!(
            "{who} (protocol {theirs}) is older than {ours}; update it: `pi-ide-broker setup` installs the extension of the daemon's build. Until then what both speak keeps working."
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(protocol: Option<u32>) -> ClientInfo {
        ClientInfo {
            name: "pi-ide-broker-pi".into(),
            version: Some("9.9.9".into()),
            protocol,
        }
    }

    #[test]
    fn only_a_different_revision_gets_a_notice_naming_the_update() {
        assert_eq!(skew_notice(&client(Some(PROTOCOL))), None);
        assert_eq!(skew_notice(&client(None)), None);
        let newer = skew_notice(&client(Some(PROTOCOL + 1))).expect("notice");
        assert!(
            newer.contains("update the daemon") && newer.contains("cargo install"),
            "{newer}"
        );
        assert!(newer.contains("pi-ide-broker-pi 9.9.9"), "{newer}");
        let older = skew_notice(&client(Some(PROTOCOL - 1))).expect("notice");
        assert!(older.contains("pi-ide-broker setup"), "{older}");
    }
}
